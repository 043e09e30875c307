//! Reconciler benchmark (not a test): the real local control plane, the reconciler in-process
//! with the memory cloud at 50 ms per call. Phase 1 creates N objects over M nodes at once;
//! phase 2 moves the objects of M/5 "failed" nodes to the others. Prints a table and writes JSON
//! to `$CLOUDNET_CACHE_DIR/bench/`. RSS is this process's peak: driver and reconciler together.
//!
//! Usage: `bench-reconciler [OBJECTS NODES]` (default 1000 100).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::controlplane::cache_root;
use cloudnet_reconciler::cloud::memory::{MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_reconciler::objects::EngineConfig;
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher::{self, watcher};
use serde_json::json;

const LATENCY: Duration = Duration::from_millis(50);

struct Phase {
    name: &'static str,
    ips: usize,
    seconds: f64,
    lower_bound_seconds: f64,
    mutating_calls: u64,
    nodes_touched: usize,
    api_writes: u64,
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
    let cp = ControlPlane::start_with_crd().await?;
    let client = cp.client().await?;
    let cloud = MemoryCloud::new(MemoryConfig {
        latency: LATENCY,
        record_calls: false,
        ..MemoryConfig::default()
    });
    let node_names: Vec<String> = (0..nodes).map(|i| format!("bench-{i:04}")).collect();
    let node_api: Api<Node> = Api::all(client.clone());
    for name in &node_names {
        cloud.add_vm(name, VmSpec::ipv4("10.0.0.1".parse()?, 1000));
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(provider_id(name)),
                ..NodeSpec::default()
            }),
            ..Node::default()
        };
        node_api.create(&PostParams::default(), &node).await?;
    }
    let metrics = Arc::new(Metrics::default());
    let config = EngineConfig {
        drift_period: Duration::ZERO,
        parallel_nodes: nodes,
        ..EngineConfig::default()
    };
    let engine = tokio::spawn(cloudnet_reconciler::run::run(
        client.clone(),
        Arc::new(cloud.clone()),
        config,
        Arc::clone(&metrics),
        "bench".into(),
        std::future::pending(),
    ));

    let ip = |i: usize| format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256);
    let target = |i: usize| node_names[i % nodes].clone();
    let api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let (cache, writer) = reflector::store();
    let watch = reflector(writer, watcher(api.clone(), watcher::Config::default()));
    tokio::spawn(watch.for_each(|_| std::future::ready(())));

    // Phase 1: everything at once.
    let writes_before = metrics.api_writes.get();
    let calls_before = mutating_calls(&cloud);
    let start = Instant::now();
    stream::iter(0..objects)
        .for_each_concurrent(64, |i| {
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
    wait_converged(&cache, objects).await?;
    let add = Phase {
        name: "add",
        ips: objects,
        seconds: start.elapsed().as_secs_f64(),
        lower_bound_seconds: LATENCY.as_secs_f64(),
        mutating_calls: mutating_calls(&cloud) - calls_before,
        nodes_touched: nodes,
        api_writes: metrics.api_writes.get() - writes_before,
    };

    // Phase 2: the first fifth of the nodes fail; their objects move to the others.
    let failed = (nodes / 5).max(1);
    let moved: Vec<usize> = (0..objects).filter(|i| i % nodes < failed).collect();
    let writes_before = metrics.api_writes.get();
    let calls_before = mutating_calls(&cloud);
    let start = Instant::now();
    stream::iter(moved.iter().copied())
        .for_each_concurrent(64, |i| {
            let api = api.clone();
            let node = node_names[failed + i % (nodes - failed).max(1)].clone();
            async move {
                let patch = Patch::Merge(json!({ "spec": { "node": node } }));
                if let Err(e) = api.patch(&ip(i), &PatchParams::default(), &patch).await {
                    eprintln!("move {}: {e}", ip(i));
                }
            }
        })
        .await;
    wait_converged(&cache, objects).await?;
    let movers: std::collections::BTreeSet<usize> = moved
        .iter()
        .map(|i| failed + i % (nodes - failed).max(1))
        .collect();
    let mv = Phase {
        name: "move",
        ips: moved.len(),
        seconds: start.elapsed().as_secs_f64(),
        // Detach from the failed node, then attach to the new one: two calls in sequence.
        lower_bound_seconds: 2.0 * LATENCY.as_secs_f64(),
        mutating_calls: mutating_calls(&cloud) - calls_before,
        nodes_touched: failed + movers.len(),
        api_writes: metrics.api_writes.get() - writes_before,
    };
    engine.abort();
    report(objects, nodes, &[add, mv], peak_rss_bytes())
}

fn mutating_calls(cloud: &MemoryCloud) -> u64 {
    cloud.call_count(Op::Attach) + cloud.call_count(Op::Detach) + cloud.call_count(Op::Move)
}

/// Waits on a watch cache rather than listing: polling lists of thousands of objects would load
/// the API server more than the reconciler does and distort the result.
async fn wait_converged(cache: &Store<CloudPrivateIPConfig>, objects: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let done = cache.state().iter().filter(|o| o.is_assigned()).count();
        if done == objects {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "not converged: {done}/{objects}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn report(objects: usize, nodes: usize, phases: &[Phase], rss: u64) -> anyhow::Result<()> {
    println!(
        "reconciler benchmark: {objects} objects, {nodes} nodes, {} ms per cloud call, load {}",
        LATENCY.as_millis(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "{:<6} {:>6} {:>10} {:>12} {:>8} {:>12} {:>11} {:>12}",
        "phase", "ips", "seconds", "lower bound", "ratio", "calls/ip", "calls/node", "writes/ip"
    );
    let mut rows = Vec::new();
    for p in phases {
        let ips = p.ips.max(1) as f64;
        let row = json!({
            "phase": p.name,
            "ips": p.ips,
            "seconds": p.seconds,
            "lower_bound_seconds": p.lower_bound_seconds,
            "ratio_to_lower_bound": p.seconds / p.lower_bound_seconds,
            "mutating_cloud_calls": p.mutating_calls,
            "nodes_touched": p.nodes_touched,
            "cloud_calls_per_ip": p.mutating_calls as f64 / ips,
            "api_writes": p.api_writes,
            "api_writes_per_ip": p.api_writes as f64 / ips,
        });
        println!(
            "{:<6} {:>6} {:>10.2} {:>12.2} {:>8.1} {:>12.3} {:>11.2} {:>12.2}",
            p.name,
            p.ips,
            p.seconds,
            p.lower_bound_seconds,
            p.seconds / p.lower_bound_seconds,
            p.mutating_calls as f64 / ips,
            p.mutating_calls as f64 / p.nodes_touched.max(1) as f64,
            p.api_writes as f64 / ips,
        );
        rows.push(row);
    }
    println!(
        "peak RSS (driver + reconciler in one process): {:.1} MiB",
        rss as f64 / 1048576.0
    );
    let dir = cache_root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let path = dir.join(format!("reconciler-{objects}x{nodes}-{stamp}.json"));
    let doc = json!({
        "objects": objects,
        "nodes": nodes,
        "latency_ms": LATENCY.as_millis() as u64,
        "phases": rows,
        "peak_rss_bytes": rss,
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&doc)?).context("writing results")?;
    println!("results: {}", path.display());
    Ok(())
}
