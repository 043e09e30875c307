//! Scale benchmark (not a test): see `cloudnet_e2e::bench::scale` for what it measures.
//!
//! Environment: `BENCH_PARTS` (`memory,moto,webhook` by default; any of them), `BENCH_MEMORY`
//! (`NODES OBJECTS`, default `5000 20000`), `BENCH_MEMORY_LATENCY_MS` (the memory cloud's latency
//! per call, default 50), `BENCH_MOTO` (`NODES OBJECTS`, default `1000 5000`),
//! `BENCH_LATENCY_MS` (the EC2 proxy's latency per call on top of EC2's token buckets, default
//! 100), `BENCH_RECONCILER_ARGS` (flags added to the moto part's reconcilers, e.g.
//! `--concurrent-reconciles 8192`), `BENCH_WEBHOOK_OBJECTS` (default 20000, over 5,000 nodes), `BENCH_DURATION_SECS` (the
//! webhook's load per endpoint, default 20), `BENCH_TIMEOUT_SECS` (the longest wait for any one
//! step, default 900), `CLOUDNET_RECONCILER_BIN` (built with the `aws` and `memory-cloud`
//! features), `CLOUDNET_WEBHOOK_BIN`, `CLOUDNET_MOTO_VENV`, `CLOUDNET_CONTROLPLANE_BIN`.

use std::time::Duration;

use anyhow::{Context, bail};
use cloudnet_e2e::bench::scale::{self, Row, memory, moto};
use cloudnet_e2e::bench::{env_or, webhook};
use cloudnet_e2e::harness::binaries;

/// `NAME="A B"` as two numbers, or the defaults.
fn pair(name: &str, default: (usize, usize)) -> anyhow::Result<(usize, usize)> {
    let Ok(value) = std::env::var(name) else {
        return Ok(default);
    };
    let numbers: Vec<usize> = value
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{name}={value:?}"))?;
    match numbers.as_slice() {
        [a, b] => Ok((*a, *b)),
        _ => bail!("{name}={value:?}: want \"NODES OBJECTS\""),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let parts = std::env::var("BENCH_PARTS").unwrap_or_else(|_| "memory,moto,webhook".into());
    let timeout = Duration::from_secs(env_or("BENCH_TIMEOUT_SECS", 900)?);
    let mut results: Vec<(String, Vec<Row>, serde_json::Value)> = Vec::new();
    for part in parts.split(',').map(str::trim) {
        let (name, (rows, details)) = match part {
            "memory" => {
                let (nodes, objects) = pair("BENCH_MEMORY", (5000, 20000))?;
                let params = memory::Params {
                    nodes,
                    objects,
                    latency: Duration::from_millis(env_or("BENCH_MEMORY_LATENCY_MS", 50)?),
                    reconciler_bin: binaries::reconciler()?,
                    timeout,
                };
                (
                    format!("memory cloud, {nodes} nodes, then {objects} objects"),
                    memory::run(&params).await?,
                )
            }
            "moto" => {
                let (nodes, objects) = pair("BENCH_MOTO", (1000, 5000))?;
                let params = moto::Params {
                    nodes,
                    objects,
                    latency: Duration::from_millis(env_or("BENCH_LATENCY_MS", 100)?),
                    timeout,
                };
                (
                    format!("moto with EC2's token buckets, {nodes} nodes / {objects} objects"),
                    moto::run(&params).await?,
                )
            }
            "webhook" => {
                let objects: usize = env_or("BENCH_WEBHOOK_OBJECTS", 20_000)?;
                let nodes = 5_000.min(objects.max(1));
                let options = webhook::Options {
                    nodes,
                    objects_per_node: objects.div_ceil(nodes),
                    duration: Duration::from_secs(env_or("BENCH_DURATION_SECS", 20)?),
                    warmup: Duration::from_secs(3),
                    connections: 8,
                    webhook_bin: binaries::webhook()?,
                };
                let report = webhook::run(&options).await?;
                let path = webhook::save(&report)?;
                let p99 = |endpoint: &str| {
                    report["results"]
                        .as_array()
                        .and_then(|r| r.iter().find(|e| e["endpoint"] == endpoint))
                        .and_then(|e| e["server_latency_seconds"]["p99"].as_f64())
                        .unwrap_or(f64::NAN)
                };
                let rss = report["webhook"]["peak_rss_kib"]
                    .as_f64()
                    .unwrap_or(f64::NAN);
                let held = options.nodes * options.objects_per_node;
                let rows = vec![
                    Row::new("/validate server p99", p99("validate") * 1000.0, "ms").target("< 1"),
                    Row::new("/mutate server p99", p99("mutate") * 1000.0, "ms").target("< 1"),
                    Row::new("webhook peak RSS (VmHWM)", rss / 1024.0, "MiB"),
                ];
                (
                    format!("webhook, {held} objects over {nodes} nodes in its caches"),
                    (rows, serde_json::json!({ "report": path })),
                )
            }
            other => bail!("unknown part {other:?} in BENCH_PARTS (memory, moto, webhook)"),
        };
        scale::print(&name, &rows);
        results.push((name, rows, details));
    }
    println!();
    for (name, rows, _) in &results {
        scale::print(name, rows);
    }
    let path = scale::save(&results)?;
    println!("\nresults: {}", path.display());
    Ok(())
}
