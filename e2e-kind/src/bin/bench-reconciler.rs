//! Reconciler benchmark (not a test): the real local control plane and the reconciler built with
//! the `benchmark` profile as its own process (`--platform-type=Memory`, 50 ms per cloud call).
//! Phase "add" creates N objects over M nodes at once; phase "move" moves the objects of M/5
//! "failed" nodes to the others. Object creation (or the move patches) runs with 64 requests in
//! flight and is timed on its own; convergence is timed from the moment every object exists
//! (every patch is acknowledged) until every object is `Assigned=True` on its spec node.
//!
//! Three references: the cloud-only lower bound (per-node serialisation and latency: one call per
//! node for an add, a detach then an attach for a move); that bound plus the writes SPEC §2.3
//! puts in sequence around the calls at the idle write round trip; and the API floor, the same
//! writes for every IP pushed through the same control plane by a plain client before the
//! reconciler starts, against which the total from the first request is compared. Cloud calls,
//! object writes and Events come from the reconciler's `/metrics`; peak RSS is the reconciler
//! process's own `VmHWM`. Prints a table and writes JSON to `$CLOUDNET_CACHE_DIR/bench/`.
//!
//! Usage: `bench-reconciler [OBJECTS NODES]` (default 1000 100). Environment:
//! `CLOUDNET_RECONCILER_BIN` (default `$CARGO_TARGET_DIR/benchmark/cloudnet-reconciler`),
//! `BENCH_COALESCE_MS` (the reconciler's `--coalesce-window-ms`, default 30),
//! `BENCH_CONCURRENT_RECONCILES` (its `--concurrent-reconciles`), `BENCH_FLOOR=0` (skip the API floor),
//! `BENCH_START_AFTER_CREATE=1` (start the reconciler only once every object exists),
//! `BENCH_RUST_LOG` (the reconciler's log filter; its log is kept as `bench/reconciler-last.log`).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::bench::{api_floor, assigned_on, create_memory_nodes, peak_rss_bytes};
use cloudnet_e2e::harness::controlplane::{Supervised, cache_root};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher::{self, watcher};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LATENCY: Duration = Duration::from_millis(50);
const IN_FLIGHT_REQUESTS: usize = 64;

struct Phase {
    name: &'static str,
    ips: usize,
    /// Creating the objects (or patching them), before convergence is timed.
    submit_seconds: f64,
    /// From the moment every object exists to all `Assigned=True`.
    converge_seconds: f64,
    lower_bound_seconds: f64,
    /// The lower bound plus the API writes the protocol puts in sequence around the calls.
    floor_seconds: f64,
    /// The same writes for every IP (and the create or move patch itself) pushed through this
    /// control plane by a plain client with nothing else running, plus the cloud bound: the
    /// fastest any controller bound to SPEC §2.3 could finish here, timed from the first request.
    api_floor_seconds: f64,
    mutating_calls: f64,
    nodes_touched: usize,
    api_writes: f64,
    ledger_writes: f64,
    events: f64,
}

/// Sequential API writes around the cloud calls that SPEC §2.3 demands of an add: the finalizer,
/// Pending and the attachment ledger's page (one per VM and batch) before the call; Success
/// after it.
const ADD_SEQUENTIAL_WRITES: f64 = 4.0;
/// A move: Pending on the old node, then (after the detach) the old page's release, status.node
/// cleared, Pending on the new node and the new page's record, then (after the attach) Success.
const MOVE_SEQUENTIAL_WRITES: f64 = 6.0;

/// The reconciler's counters that the benchmark reads.
#[derive(Clone, Copy, Default)]
struct Counters {
    mutating_calls: f64,
    api_writes: f64,
    ledger_writes: f64,
    events: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (objects, nodes) = match args.as_slice() {
        [o, n] => (*o, *n),
        _ => (1000, 100),
    };
    let coalesce_ms: u64 = std::env::var("BENCH_COALESCE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let cp = ControlPlane::start_with_crd().await?;
    let client = cp.client().await?;
    let node_names: Vec<String> = (0..nodes).map(|i| format!("bench-{i:04}")).collect();
    create_memory_nodes(&client, &node_names, IN_FLIGHT_REQUESTS).await?;

    let round_trip = write_round_trip(&client).await?;
    // BENCH_FLOOR=0 skips the API floor (a quicker run; its ratios are then not reported).
    let (floor_add, floor_moved) = if std::env::var("BENCH_FLOOR").is_ok_and(|v| v == "0") {
        (Duration::ZERO, Duration::ZERO)
    } else {
        let add = api_floor::add(&client, objects, nodes, api_floor::Events::One).await?;
        let moved = api_floor::moved(&client, objects, nodes).await?;
        api_floor::clear(&client).await?;
        (add, moved)
    };

    // With BENCH_START_AFTER_CREATE=1 the reconciler starts once every object exists (a restart
    // or failover over a full cluster); convergence then includes its start and cache sync.
    let start_after = std::env::var("BENCH_START_AFTER_CREATE").is_ok_and(|v| v == "1");
    let mut running = None;
    if !start_after {
        running = Some(start_and_wait(&cp, coalesce_ms).await?);
    }

    let ip = |i: usize| format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256);
    let target = |i: usize| node_names[i % nodes].clone();
    let api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let (cache, writer) = reflector::store();
    let watch = reflector(writer, watcher(api.clone(), watcher::Config::default()));
    tokio::spawn(watch.for_each(|_| std::future::ready(())));

    // Phase 1: everything at once.
    let before = match &running {
        Some((_, address, _)) => counters(address).await?,
        None => Counters::default(),
    };
    let start = Instant::now();
    stream::iter(0..objects)
        .for_each_concurrent(IN_FLIGHT_REQUESTS, |i| {
            let api = api.clone();
            let obj =
                CloudPrivateIPConfig::new(&ip(i), CloudPrivateIPConfigSpec { node: target(i) });
            async move {
                if let Err(e) = api.create(&PostParams::default(), &obj).await {
                    eprintln!("create {}: {e}", ip(i));
                }
            }
        })
        .await;
    let mut submitted = Instant::now();
    let (reconciler, metrics_address) = match running {
        Some((process, address, _)) => (process, address),
        None => {
            let r = start_and_wait(&cp, coalesce_ms).await?;
            // Convergence is timed from the process start, which the metrics wait included.
            submitted = r.2;
            (r.0, r.1)
        }
    };
    wait_converged(&cache, objects, &|i| target(i), &ip).await?;
    let converged = Instant::now();
    let after = settled_counters(&metrics_address).await?;
    let add = Phase {
        name: "add",
        ips: objects,
        submit_seconds: (submitted - start).as_secs_f64(),
        converge_seconds: (converged - submitted).as_secs_f64(),
        // Every node's IPs fit one call, and nodes run in parallel: one call's latency.
        lower_bound_seconds: LATENCY.as_secs_f64(),
        floor_seconds: LATENCY.as_secs_f64() + ADD_SEQUENTIAL_WRITES * round_trip.as_secs_f64(),
        api_floor_seconds: floor_add.as_secs_f64() + LATENCY.as_secs_f64(),
        mutating_calls: after.mutating_calls - before.mutating_calls,
        nodes_touched: nodes.min(objects),
        api_writes: after.api_writes - before.api_writes,
        ledger_writes: after.ledger_writes - before.ledger_writes,
        events: after.events - before.events,
    };

    // Phase 2: the first fifth of the nodes fail; their objects move to the others.
    let failed = (nodes / 5).max(1);
    let new_home = |i: usize| {
        if i % nodes < failed {
            node_names[failed + i % (nodes - failed).max(1)].clone()
        } else {
            target(i)
        }
    };
    let moved: Vec<usize> = (0..objects).filter(|i| i % nodes < failed).collect();
    let before = counters(&metrics_address).await?;
    let start = Instant::now();
    stream::iter(moved.iter().copied())
        .for_each_concurrent(IN_FLIGHT_REQUESTS, |i| {
            let api = api.clone();
            let node = new_home(i);
            async move {
                let patch = Patch::Merge(json!({ "spec": { "node": node } }));
                if let Err(e) = api.patch(&ip(i), &PatchParams::default(), &patch).await {
                    eprintln!("move {}: {e}", ip(i));
                }
            }
        })
        .await;
    let submitted = Instant::now();
    wait_converged(&cache, objects, &new_home, &ip).await?;
    let converged = Instant::now();
    let after = settled_counters(&metrics_address).await?;
    let receivers: std::collections::BTreeSet<String> =
        moved.iter().map(|i| new_home(*i)).collect();
    let mv = Phase {
        name: "move",
        ips: moved.len(),
        submit_seconds: (submitted - start).as_secs_f64(),
        converge_seconds: (converged - submitted).as_secs_f64(),
        // Detach from the failed node, then attach to the new one: two calls in sequence.
        lower_bound_seconds: 2.0 * LATENCY.as_secs_f64(),
        floor_seconds: 2.0 * LATENCY.as_secs_f64()
            + MOVE_SEQUENTIAL_WRITES * round_trip.as_secs_f64(),
        api_floor_seconds: floor_moved.as_secs_f64() + 2.0 * LATENCY.as_secs_f64(),
        mutating_calls: after.mutating_calls - before.mutating_calls,
        nodes_touched: failed + receivers.len(),
        api_writes: after.api_writes - before.api_writes,
        ledger_writes: after.ledger_writes - before.ledger_writes,
        events: after.events - before.events,
    };
    let rss = peak_rss_bytes(reconciler.pid());
    drop(reconciler);
    // The reconciler's warnings (failed reconciles, retries) explain extra writes and calls.
    let log = cache_root().join("bench/reconciler-last.log");
    std::fs::create_dir_all(cache_root().join("bench"))?;
    std::fs::copy(cp.dir().join("bench-reconciler.log"), &log)?;
    println!("reconciler log: {}", log.display());
    report(
        objects,
        nodes,
        coalesce_ms,
        start_after,
        round_trip,
        &[add, mv],
        rss,
    )
}

async fn start_and_wait(
    cp: &ControlPlane,
    coalesce_ms: u64,
) -> anyhow::Result<(Supervised, String, Instant)> {
    let started = Instant::now();
    let (mut reconciler, address) = start_reconciler(cp, coalesce_ms)?;
    wait_metrics(&address, &mut reconciler).await?;
    Ok((reconciler, address, started))
}

fn reconciler_bin() -> PathBuf {
    match std::env::var_os("CLOUDNET_RECONCILER_BIN") {
        Some(path) => PathBuf::from(path),
        None => {
            PathBuf::from(std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into()))
                .join("benchmark/cloudnet-reconciler")
        }
    }
}

fn start_reconciler(cp: &ControlPlane, coalesce_ms: u64) -> anyhow::Result<(Supervised, String)> {
    let bin = reconciler_bin();
    anyhow::ensure!(
        bin.exists(),
        "{} not found: cargo build --release -p cloudnet-reconciler",
        bin.display()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let address = format!("127.0.0.1:{port}");
    let mut command = Command::new(bin);
    command.args([
        format!("--kubeconfig={}", cp.kubeconfig_path().display()),
        "--secret-name=bench".into(),
        "--platform-type=Memory".into(),
        "--controller-namespace=default".into(),
        "--drift-period=0".into(),
        format!("--memory-latency-ms={}", LATENCY.as_millis()),
        format!("--coalesce-window-ms={coalesce_ms}"),
        format!("--metrics-bind-address={address}"),
        "--log-format=json".into(),
    ]);
    if let Ok(n) = std::env::var("BENCH_CONCURRENT_RECONCILES") {
        command.arg(format!("--concurrent-reconciles={n}"));
    }
    command.env(
        "RUST_LOG",
        std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
    );
    let log = cp.dir().join("bench-reconciler.log");
    Ok((
        Supervised::spawn("cloudnet-reconciler", command, &log)?,
        address,
    ))
}

async fn scrape(address: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (_, body) = response
        .split_once("\r\n\r\n")
        .context("malformed metrics response")?;
    Ok(body.to_owned())
}

async fn wait_metrics(address: &str, reconciler: &mut Supervised) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while scrape(address).await.is_err() {
        anyhow::ensure!(
            reconciler.exited().is_none(),
            "reconciler exited\n{}",
            reconciler.log_tail(20)
        );
        anyhow::ensure!(Instant::now() < deadline, "no /metrics on {address}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Sums the samples of lines starting with `prefix`.
fn sum(body: &str, prefix: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn counters(address: &str) -> anyhow::Result<Counters> {
    let body = scrape(address).await?;
    Ok(Counters {
        // Every cloud call but the reads (`egress_config`, `egress_configs`).
        mutating_calls: sum(&body, "cloudnet_cloud_call_duration_seconds_count{")
            - sum(
                &body,
                r#"cloudnet_cloud_call_duration_seconds_count{provider="memory",operation="egress_config"#,
            ),
        api_writes: sum(&body, "cloudnet_api_writes_total"),
        ledger_writes: sum(&body, "cloudnet_ledger_writes_total"),
        events: sum(&body, "cloudnet_events_total"),
    })
}

/// The counters once they stop moving: Events are published after the status write that the
/// convergence wait sees, so reading at once would book some of them to the next phase.
async fn settled_counters(address: &str) -> anyhow::Result<Counters> {
    let mut last = counters(address).await?;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = counters(address).await?;
        if now.events == last.events && now.api_writes == last.api_writes {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// Median round trip of a small write on the idle control plane: the unit of the protocol's
/// sequential writes in the floor.
async fn write_round_trip(client: &kube::Client) -> anyhow::Result<Duration> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("bench-write-round-trip".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &cm).await?;
    let mut samples = Vec::new();
    for i in 0..31 {
        let patch = Patch::Merge(json!({ "data": { "n": i.to_string() } }));
        let started = Instant::now();
        api.patch("bench-write-round-trip", &PatchParams::default(), &patch)
            .await?;
        samples.push(started.elapsed());
    }
    samples.sort();
    Ok(samples[samples.len() / 2])
}

/// Waits on a watch cache rather than listing: polling lists of thousands of objects would load
/// the API server more than the reconciler does and distort the result.
async fn wait_converged(
    cache: &Store<CloudPrivateIPConfig>,
    objects: usize,
    node_of: &dyn Fn(usize) -> String,
    ip: &dyn Fn(usize) -> String,
) -> anyhow::Result<()> {
    let wanted: std::collections::HashMap<String, String> =
        (0..objects).map(|i| (ip(i), node_of(i))).collect();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let done = assigned_on(cache, &wanted);
        if done == objects {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "not converged: {done}/{objects}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn report(
    objects: usize,
    nodes: usize,
    coalesce_ms: u64,
    start_after: bool,
    round_trip: Duration,
    phases: &[Phase],
    rss: u64,
) -> anyhow::Result<()> {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "reconciler benchmark: {objects} objects, {nodes} nodes, {} ms per cloud call, coalescing window {coalesce_ms} ms, reconciler started {}, load {}",
        LATENCY.as_millis(),
        if start_after {
            "after the objects exist (add converge time includes its start)"
        } else {
            "before the objects are created"
        },
        load.trim()
    );
    println!(
        "median API write round trip on the idle control plane: {:.1} ms",
        round_trip.as_secs_f64() * 1000.0
    );
    println!(
        "{:<6} {:>6} {:>9} {:>11} {:>8} {:>6} {:>8} {:>6} {:>8} {:>11} {:>6} {:>9} {:>10} {:>10} {:>10}",
        "phase",
        "ips",
        "submit s",
        "converge s",
        "bound s",
        "ratio",
        "floor s",
        "ratio",
        "total s",
        "api floor s",
        "ratio",
        "calls/ip",
        "calls/node",
        "writes/ip",
        "events/ip"
    );
    let mut rows = Vec::new();
    for p in phases {
        let ips = p.ips.max(1) as f64;
        let ratio = p.converge_seconds / p.lower_bound_seconds;
        let floor_ratio = p.converge_seconds / p.floor_seconds;
        let total = p.submit_seconds + p.converge_seconds;
        let api_ratio = total / p.api_floor_seconds;
        rows.push(json!({
            "phase": p.name,
            "ips": p.ips,
            "submit_seconds": p.submit_seconds,
            "converge_seconds_after_submit": p.converge_seconds,
            "lower_bound_seconds": p.lower_bound_seconds,
            "ratio_to_lower_bound": ratio,
            "floor_seconds": p.floor_seconds,
            "total_seconds_from_first_request": total,
            "api_floor_seconds": p.api_floor_seconds,
            "ratio_of_total_to_api_floor": api_ratio,
            "ratio_to_floor": floor_ratio,
            "events": p.events,
            "events_per_ip": p.events / ips,
            "mutating_cloud_calls": p.mutating_calls,
            "nodes_touched": p.nodes_touched,
            "cloud_calls_per_ip": p.mutating_calls / ips,
            "api_writes": p.api_writes,
            "api_writes_per_ip": p.api_writes / ips,
            "ledger_writes": p.ledger_writes,
            "ledger_writes_per_ip": p.ledger_writes / ips,
        }));
        println!(
            "{:<6} {:>6} {:>9.2} {:>11.3} {:>8.3} {:>6.1} {:>8.3} {:>6.1} {:>8.2} {:>11.2} {:>6.2} {:>9.3} {:>10.2} {:>10.2} {:>10.2}",
            p.name,
            p.ips,
            p.submit_seconds,
            p.converge_seconds,
            p.lower_bound_seconds,
            ratio,
            p.floor_seconds,
            floor_ratio,
            total,
            p.api_floor_seconds,
            api_ratio,
            p.mutating_calls / ips,
            p.mutating_calls / p.nodes_touched.max(1) as f64,
            p.api_writes / ips,
            p.events / ips,
        );
    }
    for p in phases {
        println!(
            "{}: attachment ledger writes {} ({:.3} per IP, besides the object writes)",
            p.name,
            p.ledger_writes,
            p.ledger_writes / p.ips.max(1) as f64
        );
    }
    println!(
        "peak RSS of the reconciler process (VmHWM): {:.1} MiB",
        rss as f64 / 1048576.0
    );
    let dir = cache_root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let mode = if start_after { "-start-after" } else { "" };
    let path = dir.join(format!("reconciler-{objects}x{nodes}{mode}-{stamp}.json"));
    let doc = json!({
        "objects": objects,
        "nodes": nodes,
        "latency_ms": LATENCY.as_millis() as u64,
        "coalesce_window_ms": coalesce_ms,
        "reconciler_started_after_create": start_after,
        "api_write_round_trip_seconds": round_trip.as_secs_f64(),
        "reconciler": "separate release-built process, --platform-type=Memory",
        "phases": rows,
        "peak_rss_bytes": rss,
        "loadavg": load.trim(),
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&doc)?).context("writing results")?;
    println!("results: {}", path.display());
    Ok(())
}
