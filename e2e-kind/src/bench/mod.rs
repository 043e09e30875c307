//! The benchmarks' drivers (not tests; `make bench-*`): the API floor, EC2 through moto, the GCP
//! engine, the webhook's load, and the scale benchmark; plus the few probes they share.

#[cfg(feature = "aws")]
pub mod antrea;
pub mod api_floor;
#[cfg(feature = "aws")]
pub mod aws;
#[cfg(feature = "aws")]
pub mod gateway;
#[cfg(all(feature = "aws", feature = "gcp"))]
pub mod gcp;
#[cfg(feature = "aws")]
pub mod scale;
pub mod webhook;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use cloudnet_shared::CloudPrivateIPConfig;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client};

#[cfg(feature = "aws")]
use crate::harness::controlplane::Supervised;
#[cfg(feature = "aws")]
use crate::harness::e2e::metrics;

/// The memory cloud's providerID form (`cloud::memory::PROVIDER_ID_PREFIX` in the reconciler,
/// written out so the drivers build without the reconciler crate and its cloud SDKs).
pub const MEMORY_PROVIDER_ID_PREFIX: &str = "memory:///";

/// Creates a Node for each of `names` with the memory cloud's providerID, `in_flight` at a time.
pub async fn create_memory_nodes(
    client: &Client,
    names: &[String],
    in_flight: usize,
) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    stream::iter(names)
        .map(|name| {
            let api = api.clone();
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(NodeSpec {
                    provider_id: Some(format!("{MEMORY_PROVIDER_ID_PREFIX}{name}")),
                    ..NodeSpec::default()
                }),
                ..Node::default()
            };
            async move { api.create(&PostParams::default(), &node).await }
        })
        .buffer_unordered(in_flight)
        .try_collect::<Vec<_>>()
        .await
        .context("creating the Nodes")?;
    Ok(())
}

/// The benchmark's command-line arguments, each a count; the first that is not names itself.
pub fn count_args() -> anyhow::Result<Vec<usize>> {
    std::env::args()
        .skip(1)
        .map(|a| {
            a.parse::<usize>()
                .with_context(|| format!("argument {a:?}"))
        })
        .collect()
}

/// The number in environment variable `name`, or `default` when it is unset.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .ok()
            .with_context(|| format!("{name}={value:?} is not a number")),
        Err(_) => Ok(default),
    }
}

/// What a benchmark of the shipped reconciler reads from its environment, beside its own
/// counts: `BENCH_LATENCY_MS` (default 100), `BENCH_TIMEOUT_SECS` (300), `BENCH_RUST_LOG`
/// (`warn`) and `BENCH_RECONCILER_ARGS` (split at whitespace).
#[derive(Clone, Debug)]
pub struct Shipped {
    /// Latency the proxy adds to every call during the rounds.
    pub latency: Duration,
    /// Longest wait for the set-up and for each round.
    pub timeout: Duration,
    /// The reconciler's `RUST_LOG`.
    pub rust_log: String,
    /// Flags added to the reconciler's command line.
    pub reconciler_args: Vec<String>,
}

impl Shipped {
    /// The settings from the environment, or their defaults.
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            latency: Duration::from_millis(env_or("BENCH_LATENCY_MS", 100)?),
            timeout: Duration::from_secs(env_or("BENCH_TIMEOUT_SECS", 300)?),
            rust_log: std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            reconciler_args: reconciler_args(),
        })
    }
}

/// `BENCH_RECONCILER_ARGS`, split at whitespace: flags added to the reconciler's command line.
pub fn reconciler_args() -> Vec<String> {
    std::env::var("BENCH_RECONCILER_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The value at quantile `q` (0 to 1, nearest rank) of `values`, which it sorts; NaN if empty.
pub fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64 - 1.0) * q).round() as usize;
    values.get(rank).copied().unwrap_or(f64::NAN)
}

/// p50, p90, p99 and max of `values` (seconds), as the benchmarks' JSON carries them.
pub fn quantiles_json(values: &[f64]) -> serde_json::Value {
    let mut v = values.to_vec();
    serde_json::json!({
        "p50": quantile(&mut v, 0.5),
        "p90": quantile(&mut v, 0.9),
        "p99": quantile(&mut v, 0.99),
        "max": quantile(&mut v, 1.0),
        "count": v.len(),
    })
}

/// Writes `doc` as `$CLOUDNET_CACHE_DIR/bench/<stem>-<unix seconds>.json` and prints its path.
pub fn write_results(stem: &str, doc: &serde_json::Value) -> anyhow::Result<std::path::PathBuf> {
    let dir = crate::harness::controlplane::cache_root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let path = dir.join(format!("{stem}-{stamp}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(doc)?).context("writing results")?;
    println!("results: {}", path.display());
    Ok(path)
}

/// Objects in `cache` that are `Assigned=True` on the node `homes` names for them.
pub fn assigned_on(cache: &Store<CloudPrivateIPConfig>, homes: &HashMap<String, String>) -> usize {
    cache
        .state()
        .iter()
        .filter(|o| {
            o.is_assigned()
                && o.metadata
                    .name
                    .as_ref()
                    .and_then(|n| homes.get(n))
                    .is_some_and(|node| *node == o.spec.node)
        })
        .count()
}

/// A free 127.0.0.1 port: bound, read, released for a child process to bind.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The peak resident set of process `pid` (`VmHWM`), 0 if unreadable.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Waits until the reconciler serving `metrics_url` reports `cloudnet_leader 1`, and returns when
/// it first did (polled every 20 ms: the leadership instant is known to that much).
#[cfg(feature = "aws")]
pub async fn wait_leading(
    metrics_url: &str,
    reconciler: &mut Supervised,
    timeout: std::time::Duration,
) -> anyhow::Result<std::time::Instant> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = reconciler.exited() {
            anyhow::bail!(
                "the reconciler exited: {status}\n{}",
                reconciler.log_tail(30)
            );
        }
        if let Ok(text) = metrics::scrape(metrics_url).await
            && metrics::sum(&text, "cloudnet_leader", &[]) >= 1.0
        {
            return Ok(std::time::Instant::now());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no leadership within {timeout:?}\n{}",
            reconciler.log_tail(30)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `/proc/loadavg`, trimmed (empty where there is none): the machine's load a result ran under.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Prints `rows` (a measure's name and its [`quantiles_json`]) as a Markdown table of seconds.
pub fn print_quantiles(rows: &[(&str, serde_json::Value)]) {
    println!("| measure | p50 s | p90 s | p99 s | max s |");
    println!("|---|---|---|---|---|");
    for (name, q) in rows {
        let f = |k: &str| q[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.3} |",
            f("p50"),
            f("p90"),
            f("p99"),
            f("max")
        );
    }
}

/// Keeps a copy of a benchmark's reconciler log as `<stem>-reconciler-last.log` under
/// `$CLOUDNET_CACHE_DIR/bench/` (the control plane's directory, where it was written, goes).
#[cfg(feature = "aws")]
pub fn keep_reconciler_log(log: &std::path::Path, stem: &str) -> anyhow::Result<()> {
    let dir = crate::harness::controlplane::cache_root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let kept = dir.join(format!("{stem}-reconciler-last.log"));
    if std::fs::copy(log, &kept).is_ok() {
        eprintln!("bench-{stem}: reconciler log kept as {}", kept.display());
    }
    Ok(())
}
