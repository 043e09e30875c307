//! The reconciler as a process (its library entry point run in a child process with the hidden
//! `Memory` platform): a changed credentials Secret or CA ConfigMap, or SIGTERM, lets in-flight
//! work finish and exits 0; `/metrics` serves the documented series with bounded labels (the
//! node name only as the capacity gauges' `node` label).
//!
//! The child is this test binary re-executed to run only `reconciler_process_entry`, which calls
//! `cloudnet_reconciler::process::run_process` exactly as `main` does: a dependency's binary is not
//! built for this package's tests, and a nested `cargo build` would wait on the build lock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::support::*;
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::controlplane::Supervised;
use cloudnet_reconciler::cloud::memory::provider_id;
use cloudnet_reconciler::process as app;
use cloudnet_reconciler::process::Flags;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeSpec, Secret};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ARGS_ENV: &str = "CLOUDNET_RECONCILER_TEST_ARGS";
const SECRET: &str = "cloud-credentials";
const CONFIG: &str = "kube-cloud-config";
/// Long enough to act while a call is surely in flight.
const LATENCY_MS: u64 = 1500;

#[test]
#[ignore = "entry point of the reconciler processes the other tests start"]
fn reconciler_process_entry() {
    let Ok(args) = std::env::var(ARGS_ENV) else {
        return;
    };
    let argv = std::iter::once("cloudnet-reconciler".to_owned())
        .chain(args.split('\u{1f}').map(str::to_owned));
    let flags = Flags::from_args(argv).unwrap();
    app::init_logs(flags.log_format);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(app::run_process(flags)).unwrap();
}

/// This test binary re-executed to run the reconciler with `args` (its flags, program name
/// left out) through `reconciler_process_entry`.
pub(crate) fn entry_command(args: &[String]) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            cloudnet_e2e::test_name(module_path!(), "reconciler_process_entry").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .env(ARGS_ENV, args.join("\u{1f}"));
    command
}

struct Reconciler {
    process: Supervised,
    metrics: String,
}

impl Reconciler {
    fn start(cp: &ControlPlane, name: &'static str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let metrics = format!("127.0.0.1:{port}");
        let args = [
            format!("-kubeconfig={}", cp.kubeconfig_path().display()),
            format!("-secret-name={SECRET}"),
            format!("-config-name={CONFIG}"),
            "-platform-type=Memory".into(),
            "--controller-namespace=default".into(),
            "--leader-elect-lease-duration=8".into(),
            "--leader-elect-renew-deadline=4".into(),
            "--leader-elect-retry-period=2".into(),
            "--drift-period=0".into(),
            format!("--memory-latency-ms={LATENCY_MS}"),
            format!("--metrics-bind-address={metrics}"),
        ];
        let mut command = entry_command(&args);
        command.env("RUST_LOG", "info,kube_runtime=debug");
        let log = cp.dir().join(format!("{name}.log"));
        let process = Supervised::spawn(name, command, &log).unwrap();
        Self { process, metrics }
    }

    /// Changes the watched data (`change(n)` for n = 0, 1, ...) every 500 ms until the process
    /// exits: its watch may not have listed the object yet when the first change lands, and a
    /// change before the first sight is no change to it.
    async fn change_until_exit<F, Fut>(&mut self, mut change: F) -> ExitStatus
    where
        F: FnMut(usize) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0.. {
            change(i).await;
            if let Ok(status) = self.process.wait_exit(Duration::from_millis(500)).await {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "reconciler did not exit\n{}",
                self.process.log_tail(40)
            );
        }
        unreachable!("the loop only ends by returning or panicking")
    }

    /// The `/metrics` body, or `None` while the endpoint is not up.
    async fn scrape(&self) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(&self.metrics).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.0 200").then(|| body.to_owned())
    }
}

/// A private control plane with the Secret, the ConfigMap and a Node backed by a memory VM.
async fn cluster(node: &str) -> (ControlPlane, Client) {
    let (cp, client) = control_plane().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "aws_access_key_id".to_owned(),
            ByteString(b"first".to_vec()),
        )])),
        ..Secret::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let configmap = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "ca-bundle.pem".to_owned(),
            "one".to_owned(),
        )])),
        ..ConfigMap::default()
    };
    configmaps
        .create(&PostParams::default(), &configmap)
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let n = Node {
        metadata: ObjectMeta {
            name: Some(node.into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id(node)),
            ..NodeSpec::default()
        }),
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &n).await.unwrap();
    (cp, client)
}

/// Creates object `ip` on `node` and waits until its attach is in flight (Pending written).
async fn attach_in_flight(client: &Client, ip: &str, node: &str) {
    create(client, ip, node).await;
    wait_until(Duration::from_secs(60), &format!("{ip} pending"), || {
        let client = client.clone();
        async move {
            condition(&client, ip)
                .await
                .is_some_and(|(_, r, _, _)| r == "CloudResponsePending")
        }
    })
    .await;
}

async fn assert_assigned_now(client: &Client, ip: &str, node: &str) {
    let (status, reason, _, status_node) = condition(client, ip).await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str(), status_node.as_str()),
        ("True", "CloudResponseSuccess", node),
        "the in-flight attach of {ip} did not finish before the exit"
    );
}

/// Every label is one of the documented bounded ones, with a value from a small vocabulary.
fn assert_bounded_labels(body: &str) {
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((_, labels)) = line.split_once('{') else {
            continue;
        };
        let labels = labels.split_once('}').unwrap().0;
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap();
            let value = value.trim_matches('"');
            match key {
                "le" => assert!(value == "+Inf" || value.parse::<f64>().is_ok(), "{line}"),
                "provider" | "operation" | "kind" | "outcome" | "state" | "family" => assert!(
                    !value.is_empty() && value.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                    "unbounded label value in {line}"
                ),
                // The Assigned condition's reasons, upstream's CamelCase strings.
                "reason" => assert!(
                    [
                        "CloudResponseSuccess",
                        "CloudResponsePending",
                        "CloudResponseError",
                        "None",
                        "Other"
                    ]
                    .contains(&value),
                    "unbounded label value in {line}"
                ),
                // Bounded by the cluster's size; a node name, never an IP or object name.
                "node" => assert!(value.parse::<std::net::IpAddr>().is_err(), "{line}"),
                _ => panic!("undocumented label {key} in {line}"),
            }
        }
    }
}

#[tokio::test]
async fn changed_credentials_drain_in_flight_work_and_exit_zero_and_metrics_are_served() {
    let (cp, client) = cluster("proc-a").await;
    let mut reconciler = Reconciler::start(&cp, "reconciler-credentials");

    create(&client, "10.7.0.1", "proc-a").await;
    wait_assigned(&client, "10.7.0.1", "proc-a").await;
    // Every documented series is exposed (`cloudnet_cloud_call_errors_total` appears with its
    // first failed call: a labelled family without children has nothing to show).
    let documented = [
        ("cloudnet_reconcile_duration_seconds", "histogram"),
        ("cloudnet_cloud_call_duration_seconds", "histogram"),
        ("cloudnet_cloud_call_ips", "counter"),
        ("cloudnet_cloud_call_batch_ips", "histogram"),
        ("cloudnet_cloud_reads", "counter"),
        ("cloudnet_api_writes", "counter"),
        ("cloudnet_node_annotation_writes", "counter"),
        ("cloudnet_events", "counter"),
        ("cloudnet_queue_depth", "gauge"),
        ("cloudnet_ips", "gauge"),
        ("cloudnet_drift_repaired", "counter"),
        ("cloudnet_node_egress_ips_capacity", "gauge"),
        ("cloudnet_node_egress_ips_used", "gauge"),
        ("cloudnet_ips_by_reason", "gauge"),
        ("cloudnet_oldest_not_assigned_age_seconds", "gauge"),
    ];
    let samples = [
        r#"cloudnet_cloud_call_duration_seconds_count{provider="memory",operation="apply"} 1"#,
        r#"cloudnet_cloud_call_ips_total{provider="memory",operation="attach"} 1"#,
        r#"cloudnet_cloud_call_batch_ips_count{provider="memory"} 1"#,
        r#"cloudnet_cloud_reads_total{provider="memory"} 1"#,
        r#"cloudnet_reconcile_duration_seconds_count{outcome="success"}"#,
        r#"cloudnet_ips{state="assigned"} 1"#,
        "cloudnet_api_writes_total ",
        "cloudnet_node_annotation_writes_total ",
        "cloudnet_events_total ",
    ];
    let mut body = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !samples.iter().all(|s| body.contains(s)) {
        assert!(Instant::now() < deadline, "metrics incomplete:\n{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        body = reconciler.scrape().await.unwrap_or_default();
    }
    for (family, kind) in documented {
        assert!(
            body.contains(&format!("# TYPE {family} {kind}")),
            "{family} missing:\n{body}"
        );
    }
    assert_bounded_labels(&body);
    // The node is named only as the capacity gauges' `node` label; the object never.
    assert!(!body.contains("10.7.0.1"));
    assert!(
        body.lines()
            .filter(|l| l.contains("proc-a"))
            .all(|l| l.contains(r#"node="proc-a""#)),
        "{body}"
    );

    // The Secret's data changes while an attach is in flight.
    attach_in_flight(&client, "10.7.0.2", "proc-a").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let status = reconciler
        .change_until_exit(|i| {
            let secrets = secrets.clone();
            async move {
                let value = ByteString(format!("rotated-{i}").into_bytes());
                let rotated = json!({ "data": { "aws_access_key_id": value } });
                secrets
                    .patch(SECRET, &PatchParams::default(), &Patch::Merge(&rotated))
                    .await
                    .unwrap();
            }
        })
        .await;
    assert!(
        status.success(),
        "{status}\n{}",
        reconciler.process.log_tail(40)
    );
    assert_assigned_now(&client, "10.7.0.2", "proc-a").await;

    // A new process; the CA ConfigMap changes while an attach is in flight.
    let mut reconciler = Reconciler::start(&cp, "reconciler-configmap");
    attach_in_flight(&client, "10.7.0.3", "proc-a").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let status = reconciler
        .change_until_exit(|i| {
            let configmaps = configmaps.clone();
            async move {
                let rotated = json!({ "data": { "ca-bundle.pem": format!("rotated-{i}") } });
                configmaps
                    .patch(CONFIG, &PatchParams::default(), &Patch::Merge(&rotated))
                    .await
                    .unwrap();
            }
        })
        .await;
    assert!(
        status.success(),
        "{status}\n{}",
        reconciler.process.log_tail(40)
    );
    assert_assigned_now(&client, "10.7.0.3", "proc-a").await;
}

#[tokio::test]
async fn sigterm_drains_in_flight_work_and_exits_zero() {
    let (cp, client) = cluster("proc-b").await;
    let mut reconciler = Reconciler::start(&cp, "reconciler-sigterm");
    attach_in_flight(&client, "10.8.0.1", "proc-b").await;
    reconciler.process.terminate().unwrap();
    let status = reconciler
        .process
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        status.success(),
        "{status}\n{}",
        reconciler.process.log_tail(40)
    );
    assert_assigned_now(&client, "10.8.0.1", "proc-b").await;
}
