//! The webhook load benchmark: a control plane with 1,000 annotated nodes and 10,000 objects, the
//! release-built webhook as its own process, and a keep-alive TLS load from this process; then
//! the slow-client bursts ([`slow::BURSTS`]) with a valid review timed every 100 ms meanwhile.

pub mod load;
pub mod slow;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cloudnet_shared::{Capacity, CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use futures::{StreamExt, TryStreamExt};
use hyper::body::Bytes;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::ControlPlane;
use crate::bench::free_addr;
use crate::harness::controlplane::{Supervised, cache_root};
use crate::harness::webhook::{SecretDir, create_node, egress_annotation, serving_cert, test_ca};
use load::{ClientStats, Connection};

/// The webhook histogram's smallest bucket: server-side quantiles below it read as "≤ 100 µs".
pub const FIRST_BUCKET_SECONDS: f64 = 0.000_1;

/// Benchmark parameters.
#[derive(Clone, Debug)]
pub struct Options {
    /// Nodes created.
    pub nodes: usize,
    /// Objects created per node.
    pub objects_per_node: usize,
    /// Measured load per endpoint.
    pub duration: Duration,
    /// Warm-up before each measurement.
    pub warmup: Duration,
    /// Keep-alive connections.
    pub connections: usize,
    /// The release-built webhook binary.
    pub webhook_bin: PathBuf,
}

/// How long each slow-client burst holds.
const SLOW_HOLD: Duration = Duration::from_secs(10);

/// What the probe saw during one slow-client burst.
#[derive(Clone, Debug)]
pub struct SlowResult {
    /// The burst.
    pub burst: slow::Burst,
    /// The probe's reviews.
    pub probes: slow::ProbeStats,
    /// What the slow clients did.
    pub clients: slow::BurstStats,
}

/// One endpoint's results.
#[derive(Clone, Debug)]
pub struct EndpointResult {
    /// `validate` or `mutate`.
    pub endpoint: &'static str,
    /// What the client saw.
    pub client: ClientStats,
    /// Server-side percentiles from the webhook's histogram, seconds.
    pub server_p50: f64,
    /// 99th percentile, seconds.
    pub server_p99: f64,
    /// 99.9th percentile, seconds.
    pub server_p999: f64,
}

/// Runs the benchmark and returns its JSON report.
pub async fn run(options: &Options) -> Result<Value> {
    let load_before = loadavg();
    eprintln!("load average before: {load_before}; starting the control plane");
    let cp = ControlPlane::start_with_crd().await?;
    let client = cp.client().await?;
    let started = Instant::now();
    create_fixtures(&client, options).await?;
    eprintln!(
        "created {} nodes and {} objects in {:.1}s",
        options.nodes,
        options.nodes * options.objects_per_node,
        started.elapsed().as_secs_f64()
    );

    let ca = test_ca("bench-ca")?;
    let secret = SecretDir::create(&cp.dir().join("webhook-tls"), &serving_cert(&ca)?)?;
    let addr = free_addr()?;
    let mut command = Command::new(&options.webhook_bin);
    command
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args([
            "--listen-address",
            &addr.to_string(),
            "--platform-type",
            "AWS",
        ])
        .arg("--tls-cert-file")
        .arg(secret.cert_path())
        .arg("--tls-key-file")
        .arg(secret.key_path())
        .args(["--log-format", "json"])
        .env("RUST_LOG", "warn");
    let mut webhook =
        Supervised::spawn("cloudnet-webhook", command, &cp.dir().join("webhook.log"))?;
    let tls = load::client_config(ca.cert_pem())?;
    let synced_in = wait_ready(&mut webhook, addr, Arc::clone(&tls)).await?;
    let pid = webhook.pid();
    let rss_synced = proc_status_kib(pid, "VmRSS:")?;
    eprintln!("webhook ready (caches synced) after {synced_in:.1}s, RSS {rss_synced} KiB");

    let mut results = Vec::new();
    for (endpoint, path, bodies) in [
        ("validate", "/validate", validate_bodies(options)),
        ("mutate", "/mutate", mutate_bodies(options)),
    ] {
        let bodies = Arc::new(bodies);
        load::drive(
            addr,
            Arc::clone(&tls),
            path,
            Arc::clone(&bodies),
            options.connections,
            options.warmup,
        )
        .await?;
        let before = load::histogram(&scrape(addr, Arc::clone(&tls)).await?, endpoint);
        let load_during = loadavg();
        let client = load::drive(
            addr,
            Arc::clone(&tls),
            path,
            bodies,
            options.connections,
            options.duration,
        )
        .await?;
        let after = load::histogram(&scrape(addr, Arc::clone(&tls)).await?, endpoint);
        eprintln!(
            "{endpoint}: {:.0} req/s, load average {load_during}",
            client.throughput
        );
        results.push(EndpointResult {
            endpoint,
            client,
            server_p50: load::quantile(&before, &after, 0.50)?,
            server_p99: load::quantile(&before, &after, 0.99)?,
            server_p999: load::quantile(&before, &after, 0.999)?,
        });
    }
    let peak_rss = proc_status_kib(pid, "VmHWM:")?;
    let mut slow_results = Vec::new();
    for burst in slow::BURSTS {
        let name = "10.100.0.199";
        let probe = review("CREATE", name, object(name, "bench-0"), Value::Null);
        let load_during = loadavg();
        let (probes, clients) = slow::measure(addr, &tls, burst, probe, SLOW_HOLD).await?;
        eprintln!(
            "slow {:?} clients: {} reviews answered, slowest {:?}, load average {load_during}",
            burst.protocol,
            probes.latencies.len(),
            probes.max()
        );
        slow_results.push(SlowResult {
            burst,
            probes,
            clients,
        });
    }
    let load_after = loadavg();
    print_table(&results, peak_rss, &load_before, &load_after);
    print_slow_table(&slow_results);
    Ok(json!({
        "benchmark": "webhook",
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs(),
        "machine": {"cpus": std::thread::available_parallelism().map(usize::from).unwrap_or(0),
                    "load_average_before": load_before, "load_average_after": load_after,
                    "note": "the load generator runs on the same cores as the webhook"},
        "setup": {"nodes": options.nodes, "objects": options.nodes * options.objects_per_node,
                  "connections": options.connections, "duration_seconds": options.duration.as_secs_f64(),
                  "protocol": "HTTP/1.1 keep-alive over TLS 1.3", "platform": "AWS"},
        "webhook": {"rss_after_sync_kib": rss_synced, "peak_rss_kib": peak_rss, "cache_sync_seconds": synced_in},
        "results": results.iter().map(|r| json!({
            "endpoint": r.endpoint,
            "requests": r.client.requests, "errors": r.client.errors,
            "throughput_per_second": r.client.throughput,
            "server_latency_seconds": {"p50": r.server_p50, "p99": r.server_p99, "p999": r.server_p999,
                "resolution_note": "from the webhook histogram; values at or below 0.0001 mean <= 100 us (first bucket)"},
            "client_latency_microseconds": {"p50": r.client.p50_us, "p99": r.client.p99_us, "p999": r.client.p999_us},
        })).collect::<Vec<_>>(),
        "slow_clients": slow_results.iter().map(|r| json!({
            "protocol": format!("{:?}", r.burst.protocol),
            "clients": r.burst.peers * r.burst.connections_per_peer * r.burst.streams_per_connection,
            "source_addresses": r.burst.peers,
            "body_declared_bytes": r.burst.declared, "body_sent_bytes": r.burst.sent,
            "hold_seconds": SLOW_HOLD.as_secs_f64(),
            "slow_requests": r.clients.requests, "slow_connections": r.clients.connections,
            "reviews_answered": r.probes.latencies.len(), "reviews_failed": r.probes.failures.len(),
            "review_latency_seconds": {"p50": r.probes.quantile(0.5).as_secs_f64(),
                "p99": r.probes.quantile(0.99).as_secs_f64(), "max": r.probes.max().as_secs_f64(),
                "note": "a valid review every 100 ms on a new TLS connection from the burst's first moment, handshake included"},
        })).collect::<Vec<_>>(),
    }))
}

/// Writes `report` under `$CLOUDNET_CACHE_DIR/bench/` and returns the path.
pub fn save(report: &Value) -> Result<PathBuf> {
    let dir = cache_root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("webhook-{}.json", report["unix_time"]));
    std::fs::write(&path, serde_json::to_vec_pretty(report)?)?;
    Ok(path)
}

/// The subnet octets of node `i`: it owns `10.<a>.<b>.0/24` and has the address `.5`.
fn octets(i: usize) -> (usize, usize) {
    (100 + i / 250, i % 250)
}

async fn create_fixtures(client: &Client, options: &Options) -> Result<()> {
    let capacity = Capacity {
        ipv4: Some(100),
        ipv6: Some(0),
        ip: None,
    };
    futures::stream::iter(0..options.nodes)
        .map(|i| async move {
            let (a, b) = octets(i);
            let annotation = egress_annotation(Some(&format!("10.{a}.{b}.0/24")), None, capacity)?;
            create_node(
                client,
                &format!("bench-{i}"),
                &[&format!("10.{a}.{b}.5")],
                Some(&annotation),
            )
            .await
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    let api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    futures::stream::iter(
        (0..options.nodes).flat_map(|i| (0..options.objects_per_node).map(move |k| (i, k))),
    )
    .map(|(i, k)| {
        let api = api.clone();
        async move {
            let (a, b) = octets(i);
            let object = CloudPrivateIPConfig {
                metadata: ObjectMeta {
                    name: Some(format!("10.{a}.{b}.{}", 10 + k)),
                    ..Default::default()
                },
                spec: CloudPrivateIPConfigSpec {
                    node: format!("bench-{i}"),
                },
                status: None,
            };
            api.create(&PostParams::default(), &object)
                .await
                .map(drop)
                .context("creating an object")
        }
    })
    .buffer_unordered(32)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(())
}

fn object(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "cloud.network.openshift.io/v1",
        "kind": "CloudPrivateIPConfig",
        "metadata": {
            "name": name,
            "uid": "0b0c5a7e-5d55-4b8e-9a53-3f0f7d0c2a11",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "ovnkube-cluster-manager", "operation": "Update",
                "apiVersion": "cloud.network.openshift.io/v1", "time": "2026-01-01T00:00:00Z",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}, "f:node": {}}}}],
        },
        "spec": {"node": node},
    })
}

fn review(operation: &str, name: &str, new: Value, old: Value) -> Bytes {
    Bytes::from(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3f9a0a4e-8a43-4b47-9a8c-6a1c1c9c2b7d",
            "kind": {"group": "cloud.network.openshift.io", "version": "v1", "kind": "CloudPrivateIPConfig"},
            "resource": {"group": "cloud.network.openshift.io", "version": "v1", "resource": "cloudprivateipconfigs"},
            "requestKind": {"group": "cloud.network.openshift.io", "version": "v1", "kind": "CloudPrivateIPConfig"},
            "requestResource": {"group": "cloud.network.openshift.io", "version": "v1", "resource": "cloudprivateipconfigs"},
            "name": name,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:openshift-ovn-kubernetes:ovn-kubernetes-controller",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": new,
            "oldObject": old,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }
    }).to_string())
}

/// A mix of what kube-apiserver sends: mostly valid creates, metadata-only updates, and denials.
fn validate_bodies(options: &Options) -> Vec<Bytes> {
    (0..2000)
        .map(|n| {
            let i = (n * 7) % options.nodes;
            let (a, b) = octets(i);
            let node = format!("bench-{i}");
            let (op, name) = match n % 20 {
                0..=11 => ("CREATE", format!("10.{a}.{b}.{}", 100 + n % 100)),
                12..=14 => ("UPDATE", format!("10.{a}.{b}.10")),
                15..=16 => ("CREATE", format!("10.{a}.{b}.5")),
                17..=18 => ("CREATE", format!("10.{a}.{b}.1")),
                _ => ("CREATE", format!("010.{a}.{b}.30")),
            };
            let new = object(&name, &node);
            let old = if op == "UPDATE" {
                new.clone()
            } else {
                Value::Null
            };
            review(op, &name, new, old)
        })
        .collect()
}

/// Creates with canonical IPv4 names (no patch) and raw IPv6 names (renamed).
fn mutate_bodies(options: &Options) -> Vec<Bytes> {
    (0..2000)
        .map(|n| {
            let i = (n * 7) % options.nodes;
            let (a, b) = octets(i);
            let name = if n % 5 == 0 {
                format!("fd00:{a:x}:{b:x}::{:x}", 100 + n % 100)
            } else {
                format!("10.{a}.{b}.{}", 100 + n % 100)
            };
            review(
                "CREATE",
                &name,
                object(&name, &format!("bench-{i}")),
                Value::Null,
            )
        })
        .collect()
}

/// Polls `/readyz` until the webhook's caches have synced; returns the seconds it took.
async fn wait_ready(
    webhook: &mut Supervised,
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> Result<f64> {
    let started = Instant::now();
    loop {
        if let Some(status) = webhook.exited() {
            bail!("the webhook exited ({status}): {}", webhook.log_tail(20));
        }
        if let Ok(mut connection) = Connection::open(addr, Arc::clone(&tls)).await
            && let Ok((200, _)) = connection.request("GET", "/readyz", Bytes::new()).await
        {
            return Ok(started.elapsed().as_secs_f64());
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!(
                "the webhook was not ready within 120 s: {}",
                webhook.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn print_slow_table(results: &[SlowResult]) {
    println!();
    println!(
        "{:<14} {:>8} {:>10} {:>9} {:>7} {:>10} {:>10} {:>10}",
        "slow clients", "clients", "requests", "reviews", "failed", "p50", "p99", "max"
    );
    for r in results {
        let ms = |d: Duration| format!("{:.0}ms", d.as_secs_f64() * 1e3);
        println!(
            "{:<14} {:>8} {:>10} {:>9} {:>7} {:>10} {:>10} {:>10}",
            format!("{:?}", r.burst.protocol),
            r.burst.peers * r.burst.connections_per_peer * r.burst.streams_per_connection,
            r.clients.requests,
            r.probes.latencies.len(),
            r.probes.failures.len(),
            ms(r.probes.quantile(0.5)),
            ms(r.probes.quantile(0.99)),
            ms(r.probes.max()),
        );
    }
}

async fn scrape(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> Result<String> {
    let mut connection = Connection::open(addr, tls).await?;
    let (status, body) = connection.request("GET", "/metrics", Bytes::new()).await?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn print_table(results: &[EndpointResult], peak_rss_kib: u64, before: &str, after: &str) {
    println!();
    println!(
        "{:<9} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "endpoint",
        "req/s",
        "errors",
        "srv p50",
        "srv p99",
        "srv p999",
        "cli p50",
        "cli p99",
        "cli p999"
    );
    for r in results {
        // Below the first bucket (100 µs) the histogram cannot say more than "at most 100 µs".
        let us = |s: f64| {
            if s <= crate::bench::webhook::FIRST_BUCKET_SECONDS {
                "≤100µs".to_owned()
            } else {
                format!("{:.0}µs", s * 1e6)
            }
        };
        println!(
            "{:<9} {:>10.0} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            r.endpoint,
            r.client.throughput,
            r.client.errors,
            us(r.server_p50),
            us(r.server_p99),
            us(r.server_p999),
            format!("{}µs", r.client.p50_us),
            format!("{}µs", r.client.p99_us),
            format!("{}µs", r.client.p999_us),
        );
    }
    println!(
        "peak RSS of the webhook: {:.1} MB",
        peak_rss_kib as f64 / 1024.0
    );
    println!(
        "load average before/after: {before} / {after} (load generator shares the {} cores)",
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(0)
    );
}
