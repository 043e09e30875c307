//! The admission webhook enforces every rule of SPEC §3 through the real kube-apiserver.
//!
//! One private control plane per test binary (webhook configurations are cluster-wide), with the
//! webhook running in-process on 127.0.0.1 and registered by URL with the generated caBundle.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::webhook::{
    SecretDir, create_node, egress_annotation, register_webhooks, serving_cert, test_ca,
};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::{Capacity, CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use cloudnet_webhook::Settings;
use cloudnet_webhook::tls::CertPaths;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::egress::dry_run;

const WAIT: Duration = Duration::from_secs(60);

struct Harness {
    cp: &'static ControlPlane,
}

/// Starts (once per binary) a control plane, the webhook on its own runtime, the node fixtures,
/// and registers the webhook; returns when a request is demonstrably reviewed by it.
fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let cp: &'static ControlPlane =
                    Box::leak(Box::new(ControlPlane::start_with_crd().await.unwrap()));
                let client = cp.client().await.unwrap();
                let ca = test_ca("webhook-test-ca").unwrap();
                let certs =
                    SecretDir::create(&cp.dir().join("webhook-tls"), &serving_cert(&ca).unwrap())
                        .unwrap();
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let settings = Settings {
                    platform: Some(Platform::Aws),
                    cert_paths: CertPaths {
                        cert: certs.cert_path(),
                        key: certs.key_path(),
                    },
                    cert_reload_interval: Duration::from_secs(1),
                    cache_stale_after: cloudnet_webhook::freshness::STALE_AFTER,
                    ledger_namespace: "cloudnet-system".into(),
                };
                tokio::spawn(cloudnet_webhook::run(
                    listener,
                    client.clone(),
                    settings,
                    std::future::pending(),
                ));
                fixtures(&client).await;
                register_webhooks(&client, "cloudnet-webhook-test", addr, ca.cert_pem())
                    .await
                    .unwrap();
                wait_until_reviewed(&client).await;
                tx.send(Harness { cp }).unwrap();
                std::future::pending::<()>().await;
            });
        });
        rx.recv_timeout(Duration::from_secs(300))
            .expect("harness starts")
    })
}

/// Nodes every test reads, never changes.
async fn fixtures(client: &Client) {
    let per_family = |ipv4, ipv6| Capacity {
        ipv4: Some(ipv4),
        ipv6: Some(ipv6),
        ip: None,
    };
    let roomy = egress_annotation(
        Some("10.0.128.0/24"),
        Some("fc00:f853:ccd:e793::/64"),
        per_family(50, 50),
    )
    .unwrap();
    create_node(
        client,
        "wh-roomy",
        &["10.0.128.5", "fc00:f853:ccd:e793::5"],
        Some(&roomy),
    )
    .await
    .unwrap();
    let small = egress_annotation(Some("10.0.129.0/24"), None, per_family(1, 0)).unwrap();
    create_node(client, "wh-small", &["10.0.129.5"], Some(&small))
        .await
        .unwrap();
    create_node(client, "wh-bare", &["10.0.131.5"], None)
        .await
        .unwrap();
}

/// The apiserver picks webhook configurations up asynchronously: poll a dry-run create that only
/// the webhook refuses (the CRD's `format: ipv4` accepts leading zeros) until it is refused. The
/// webhook learns the fixture Nodes through its watch, which may lag its first list: then poll
/// the address of the last one created until it is refused for that node by name (the watch
/// delivers in order, so every fixture is known then).
async fn wait_until_reviewed(client: &Client) {
    let api = Api::<CloudPrivateIPConfig>::all(client.clone());
    for (name, expected) in [
        ("010.0.128.99", ["name_encoding", "name_encoding"]),
        ("10.0.131.5", ["node_ip", "wh-bare"]),
    ] {
        let deadline = Instant::now() + WAIT;
        loop {
            let result = api.create(&dry_run(), &object(name, "wh-roomy")).await;
            if let Err(kube::Error::Api(status)) = &result
                && expected.iter().all(|e| status.message.contains(e))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the webhook never refused {name} for {expected:?}: {result:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn object(name: &str, node: &str) -> CloudPrivateIPConfig {
    CloudPrivateIPConfig {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CloudPrivateIPConfigSpec { node: node.into() },
        status: None,
    }
}

async fn client() -> Client {
    let harness = tokio::task::spawn_blocking(harness).await.unwrap();
    harness.cp.client().await.unwrap()
}

async fn objects() -> Api<CloudPrivateIPConfig> {
    Api::all(client().await)
}

/// The denial message of a refused request; panics when it was not refused by the webhook.
fn denial<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains("denied the request"),
                "not a webhook denial: {status:?}"
            );
            status.message.to_string()
        }
        other => panic!("expected a webhook denial, got {other:?}"),
    }
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            message.contains(part),
            "{message:?} does not mention {part:?}"
        );
    }
}

#[tokio::test]
async fn valid_create_is_admitted() {
    let api = objects().await;
    let created = api
        .create(&PostParams::default(), &object("10.0.128.30", "wh-roomy"))
        .await
        .unwrap();
    assert_eq!(created.spec.node, "wh-roomy");
}

#[tokio::test]
async fn leading_zero_ipv4_name_is_refused_with_the_name_to_use() {
    let message = denial(
        objects()
            .await
            .create(&PostParams::default(), &object("010.0.128.31", "wh-roomy"))
            .await,
    );
    assert_mentions(
        &message,
        &["name_encoding", "\"010.0.128.31\"", "use \"10.0.128.31\""],
    );
}

#[tokio::test]
async fn unknown_target_node_is_refused() {
    let message = denial(
        objects()
            .await
            .create(&PostParams::default(), &object("10.0.128.32", "wh-nowhere"))
            .await,
    );
    assert_mentions(&message, &["target_node", "10.0.128.32", "wh-nowhere"]);
}

#[tokio::test]
async fn a_nodes_own_ip_is_refused() {
    let message = denial(
        objects()
            .await
            .create(&PostParams::default(), &object("10.0.129.5", "wh-roomy"))
            .await,
    );
    assert_mentions(&message, &["node_ip", "10.0.129.5", "wh-small"]);
}

#[tokio::test]
async fn reserved_and_out_of_subnet_addresses_are_refused() {
    let api = objects().await;
    let reserved = denial(
        api.create(&PostParams::default(), &object("10.0.128.1", "wh-roomy"))
            .await,
    );
    assert_mentions(&reserved, &["address_index", "10.0.128.1", "wh-roomy"]);
    let outside = denial(
        api.create(&PostParams::default(), &object("10.0.200.7", "wh-roomy"))
            .await,
    );
    assert_mentions(&outside, &["address_index", "10.0.200.7", "10.0.128.0/24"]);
}

#[tokio::test]
async fn a_full_node_refuses_one_more() {
    let api = objects().await;
    api.create(&PostParams::default(), &object("10.0.129.10", "wh-small"))
        .await
        .unwrap();
    // The webhook learns of the first object through its watch; until then it would admit.
    let deadline = Instant::now() + WAIT;
    let message = loop {
        let result = api
            .create(&dry_run(), &object("10.0.129.11", "wh-small"))
            .await;
        if result.is_err() || Instant::now() > deadline {
            break denial(result);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_mentions(&message, &["capacity", "10.0.129.11", "wh-small"]);
    let message = denial(
        api.create(&PostParams::default(), &object("10.0.129.11", "wh-small"))
            .await,
    );
    assert_mentions(&message, &["capacity", "wh-small"]);
}

#[tokio::test]
async fn moving_to_an_unknown_node_is_refused_on_update() {
    let api = objects().await;
    api.create(&PostParams::default(), &object("10.0.128.40", "wh-roomy"))
        .await
        .unwrap();
    let message = denial(
        api.patch(
            "10.0.128.40",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": "wh-nowhere"}})),
        )
        .await,
    );
    assert_mentions(&message, &["target_node", "10.0.128.40", "wh-nowhere"]);
}

#[tokio::test]
async fn dry_run_requests_are_reviewed_too() {
    let api = objects().await;
    let dry = dry_run();
    let message = denial(api.create(&dry, &object("10.0.128.2", "wh-roomy")).await);
    assert_mentions(&message, &["address_index", "10.0.128.2"]);
    api.create(&dry, &object("10.0.128.41", "wh-roomy"))
        .await
        .unwrap();
    assert!(
        api.get_opt("10.0.128.41").await.unwrap().is_none(),
        "a dry run must not persist"
    );
}

#[tokio::test]
async fn finalizer_removal_and_delete_pass_for_an_object_that_became_invalid() {
    let client = client().await;
    let api = Api::<CloudPrivateIPConfig>::all(client.clone());
    create_node(&client, "wh-doomed", &["10.0.128.6"], None)
        .await
        .unwrap();
    let mut held = object("10.0.128.50", "wh-doomed");
    held.metadata.finalizers = Some(vec!["cloudnet.test/hold".into()]);
    create_retrying(&api, &held).await;
    Api::<Node>::all(client.clone())
        .delete("wh-doomed", &DeleteParams::default())
        .await
        .unwrap();
    // Wait until the webhook has seen the node go: the same object would now be refused.
    let deadline = Instant::now() + WAIT;
    loop {
        let result = api
            .create(&dry_run(), &object("10.0.128.51", "wh-doomed"))
            .await;
        if result.is_err() {
            assert_mentions(&denial(result), &["target_node", "wh-doomed"]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook never noticed the node's deletion"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    api.delete("10.0.128.50", &DeleteParams::default())
        .await
        .unwrap();
    api.patch(
        "10.0.128.50",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("10.0.128.50").await.unwrap().is_none());
}

/// Creates a valid object; the webhook may not yet have seen a node created a moment ago.
async fn create_retrying(api: &Api<CloudPrivateIPConfig>, object: &CloudPrivateIPConfig) {
    let deadline = Instant::now() + WAIT;
    loop {
        match api.create(&PostParams::default(), object).await {
            Ok(_) => return,
            Err(e) if Instant::now() < deadline && e.to_string().contains("target_node") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("create failed: {e}"),
        }
    }
}

#[tokio::test]
async fn empty_spec_node_is_admitted_with_a_warning() {
    let harness = tokio::task::spawn_blocking(harness).await.unwrap();
    let output = harness
        .cp
        .kubectl()
        .args(["create", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(
                br#"{"apiVersion":"cloud.network.openshift.io/v1","kind":"CloudPrivateIPConfig","metadata":{"name":"10.0.128.60"},"spec":{"node":""}}"#,
            )?;
            child.wait_with_output()
        })
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kubectl failed: {stderr}");
    assert!(
        stderr.contains("Warning:") && stderr.contains("empty spec.node"),
        "no warning in {stderr:?}"
    );
}

#[tokio::test]
async fn raw_ipv6_names_are_renamed_to_the_canonical_name_on_create() {
    let api = objects().await;
    let created = api
        .create(
            &PostParams::default(),
            &object("fc00:f853:ccd:e793::54", "wh-roomy"),
        )
        .await
        .unwrap();
    assert_eq!(
        created.metadata.name.as_deref(),
        Some("fc00.f853.0ccd.e793.0000.0000.0000.0054")
    );
    let created = api
        .create(
            &PostParams::default(),
            &object("FC00.F853.ccd.e793.0.0.0.55", "wh-roomy"),
        )
        .await
        .unwrap();
    assert_eq!(
        created.metadata.name.as_deref(),
        Some("fc00.f853.0ccd.e793.0000.0000.0000.0055")
    );
    // A second spelling of the same IP lands on the same name, so the name still locks the IP.
    match api
        .create(
            &PostParams::default(),
            &object("fc00:f853:0ccd:e793:0:0:0:54", "wh-roomy"),
        )
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
}

#[tokio::test]
async fn renamed_ipv6_objects_are_still_validated() {
    let message = denial(
        objects()
            .await
            .create(
                &PostParams::default(),
                &object("fc00:f853:ccd:e793::5", "wh-roomy"),
            )
            .await,
    );
    assert_mentions(&message, &["node_ip", "fc00:f853:ccd:e793::5", "wh-roomy"]);
}

/// Writes `addresses` as the node's InternalIPs, as the cloud node manager does.
async fn list_addresses(client: &Client, node: &str, addresses: &[&str]) {
    let addresses: Vec<_> = addresses
        .iter()
        .map(|a| json!({"type": "InternalIP", "address": a}))
        .collect();
    Api::<Node>::all(client.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"addresses": addresses}})),
        )
        .await
        .unwrap();
}

/// Polls a dry-run create of `name` on `node` until `accept` holds for its result (the
/// webhook's caches catch up through watches); returns that result.
async fn dry_run_until(
    api: &Api<CloudPrivateIPConfig>,
    name: &str,
    node: &str,
    what: &str,
    accept: impl Fn(&Result<CloudPrivateIPConfig, kube::Error>) -> bool,
) -> Result<CloudPrivateIPConfig, kube::Error> {
    let dry = dry_run();
    let deadline = Instant::now() + WAIT;
    loop {
        let result = api.create(&dry, &object(name, node)).await;
        if accept(&result) {
            return result;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn refused_by(result: &Result<CloudPrivateIPConfig, kube::Error>, rule: &str) -> bool {
    matches!(result, Err(kube::Error::Api(s)) if s.message.contains(rule))
}

/// cloud-provider-aws lists every private IP of the ENI in status.addresses, egress IPs
/// included, and refreshes the list only every few minutes: moving, parking and re-creating an
/// egress IP must pass while its node still lists it, and a genuine node IP is still refused.
#[tokio::test]
async fn egress_ips_their_node_lists_can_be_moved_parked_and_recreated() {
    let client = client().await;
    let api = Api::<CloudPrivateIPConfig>::all(client.clone());
    let room = |ipv4| Capacity {
        ipv4: Some(ipv4),
        ipv6: Some(0),
        ip: None,
    };
    let roomy = egress_annotation(Some("10.0.132.0/24"), None, room(10)).unwrap();
    let single = egress_annotation(Some("10.0.132.0/24"), None, room(1)).unwrap();
    create_node(&client, "wh-eni-a", &["10.0.132.5"], Some(&roomy))
        .await
        .unwrap();
    create_node(&client, "wh-eni-b", &["10.0.132.6"], Some(&roomy))
        .await
        .unwrap();
    create_node(&client, "wh-eni-c", &["10.0.132.7"], Some(&single))
        .await
        .unwrap();
    // Created before their nodes list them, as in a cluster: attached first, listed later.
    create_retrying(&api, &object("10.0.132.30", "wh-eni-a")).await;
    create_retrying(&api, &object("10.0.132.31", "wh-eni-c")).await;
    list_addresses(
        &client,
        "wh-eni-a",
        &["10.0.132.5", "10.0.132.30", "10.0.132.32"],
    )
    .await;
    list_addresses(&client, "wh-eni-c", &["10.0.132.7", "10.0.132.31"]).await;
    // 10.0.132.32 is listed and managed by no object: the webhook refusing it shows that it
    // has seen the new addresses.
    let result = dry_run_until(
        &api,
        "10.0.132.32",
        "wh-eni-b",
        "node addresses seen",
        |r| refused_by(r, "node_ip"),
    )
    .await;
    assert_mentions(&denial(result), &["node_ip", "10.0.132.32", "wh-eni-a"]);

    // Move, park, and move back, while wh-eni-a lists the IP.
    for target in ["wh-eni-b", "", "wh-eni-a"] {
        api.patch(
            "10.0.132.30",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": target}})),
        )
        .await
        .unwrap_or_else(|e| panic!("moving 10.0.132.30 to {target:?}: {e}"));
    }

    // Delete, and once the webhook has seen the delete (wh-eni-c has room again), re-create
    // while wh-eni-c still lists the IP.
    api.delete("10.0.132.31", &DeleteParams::default())
        .await
        .unwrap();
    dry_run_until(
        &api,
        "10.0.132.33",
        "wh-eni-c",
        "the delete seen",
        Result::is_ok,
    )
    .await
    .unwrap();
    api.create(&PostParams::default(), &object("10.0.132.31", "wh-eni-c"))
        .await
        .unwrap();

    // A genuine node IP, and a listed address no object manages, are still refused.
    for (ip, owner) in [
        ("10.0.132.5", "wh-eni-a"),
        ("10.0.132.32", "wh-eni-a"),
        ("10.0.132.6", "wh-eni-b"),
    ] {
        for target in ["wh-eni-b", ""] {
            let message = denial(
                api.create(&PostParams::default(), &object(ip, target))
                    .await,
            );
            assert_mentions(&message, &["node_ip", ip, owner]);
        }
    }
}

/// With --platform-type=AWS a node annotated with only the shared "ip" key (another cloud's
/// keys) is still limited by it, instead of reading as unlimited.
#[tokio::test]
async fn another_clouds_capacity_key_still_limits_the_node() {
    let client = client().await;
    let api = Api::<CloudPrivateIPConfig>::all(client.clone());
    let shared_key = egress_annotation(
        Some("10.0.133.0/24"),
        None,
        Capacity {
            ipv4: None,
            ipv6: None,
            ip: Some(1),
        },
    )
    .unwrap();
    create_node(&client, "wh-ip-keyed", &["10.0.133.5"], Some(&shared_key))
        .await
        .unwrap();
    create_retrying(&api, &object("10.0.133.10", "wh-ip-keyed")).await;
    let result = dry_run_until(
        &api,
        "10.0.133.11",
        "wh-ip-keyed",
        "a capacity denial",
        |r| r.is_err(),
    )
    .await;
    assert_mentions(
        &denial(result),
        &[
            "capacity",
            "10.0.133.11",
            "wh-ip-keyed",
            "1 of its 1",
            "capacity \"ip\"",
        ],
    );
}
