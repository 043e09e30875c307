//! The scale benchmark (not a test; `make bench-scale`): how the reconciler and the webhook hold
//! up at thousands of nodes and tens of thousands of objects, and how fast a new leader serves.
//!
//! Three parts, each on its own fresh system:
//! - [`memory`]: 5,000 Nodes on the real local control plane, the reconciler (benchmark profile)
//!   over the in-memory cloud started over them: time from leadership to every node annotated and
//!   the reads it took; then 20,000 objects created at API speed: time to every one assigned,
//!   mutating calls per IP, and the reconciler's peak RSS.
//! - [`moto`]: 1,000 instances with their Nodes on moto behind the fault proxy metering EC2's
//!   token buckets: time from leadership to every node annotated and the calls it took, 5,000
//!   objects added, then a leader change (a standby waits, the leader gets SIGTERM) and a
//!   failover move issued the moment the standby leads: its convergence time and the calls of
//!   the takeover. The memory cloud cannot show a leader change (its state lives in the process).
//! - `webhook`: the webhook load benchmark ([`crate::bench::webhook`]) with 20,000 objects in
//!   its caches: its RSS and server-side p99.
//!
//! Each part prints its rows as it ends (measure, value, target, and "before": the value at the
//! default sizes on 2026-11-27, before reads were batched across VMs and moves gathered per node);
//! the whole report lands as JSON in `$CLOUDNET_CACHE_DIR/bench/`.

pub mod memory;
pub mod moto;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use cloudnet_shared::{CloudPrivateIPConfig, EGRESS_IPCONFIG_ANNOTATION};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use serde_json::{Value, json};

use crate::bench::assigned_on;
use crate::harness::controlplane::{Supervised, cache_root};
use crate::harness::e2e::metrics;

/// One measured number of a part.
#[derive(Clone, Debug)]
pub struct Row {
    /// What was measured.
    pub measure: String,
    /// The value, in `unit`.
    pub value: f64,
    /// Its unit (`s`, `MiB`, `calls`, `ms`).
    pub unit: &'static str,
    /// The target, as text (`<= 10`), if it sets one.
    pub target: Option<&'static str>,
    /// The same measure before the scale work, where one was taken (see docs/benchmarks.md).
    pub before: Option<&'static str>,
}

impl Row {
    /// A row without target or earlier value.
    pub fn new(measure: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Self {
            measure: measure.into(),
            value,
            unit,
            target: None,
            before: None,
        }
    }

    /// This row with the target.
    pub fn target(mut self, target: &'static str) -> Self {
        self.target = Some(target);
        self
    }

    /// This row with the value measured before the scale work.
    pub fn before(mut self, before: &'static str) -> Self {
        self.before = Some(before);
        self
    }

    fn json(&self) -> Value {
        json!({
            "measure": self.measure, "value": self.value, "unit": self.unit,
            "target": self.target, "before": self.before,
        })
    }
}

/// Prints `rows` of `part` as a table.
pub fn print(part: &str, rows: &[Row]) {
    println!("\n{part}");
    println!(
        "  {:<58} {:>12} {:<6} {:>10} {:>14}",
        "measure", "value", "unit", "target", "before"
    );
    for row in rows {
        println!(
            "  {:<58} {:>12.3} {:<6} {:>10} {:>14}",
            row.measure,
            row.value,
            row.unit,
            row.target.unwrap_or("-"),
            row.before.unwrap_or("-")
        );
    }
}

/// Writes every part's rows (and its details) under `$CLOUDNET_CACHE_DIR/bench/`.
pub fn save(parts: &[(String, Vec<Row>, Value)]) -> Result<PathBuf> {
    let dir = cache_root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let path = dir.join(format!("scale-{stamp}.json"));
    let doc = json!({
        "benchmark": "scale",
        "unix_time": stamp,
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "parts": parts.iter().map(|(name, rows, details)| json!({
            "part": name,
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "details": details,
        })).collect::<Vec<_>>(),
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&doc)?).context("writing results")?;
    Ok(path)
}

/// Waits until the process serving `metrics_url` answers there (a standby serves `/metrics` too).
pub async fn wait_serving(
    metrics_url: &str,
    process: &mut Supervised,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while metrics::scrape(metrics_url).await.is_err() {
        if let Some(status) = process.exited() {
            bail!("the process exited: {status}\n{}", process.log_tail(30));
        }
        ensure!(
            Instant::now() < deadline,
            "{metrics_url} silent for {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Waits until `done` holds on the caches, checking every 20 ms, and returns when it did.
pub async fn wait_until(
    what: &str,
    reconciler: &mut Supervised,
    timeout: Duration,
    mut done: impl FnMut() -> (usize, usize),
) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let (have, want) = done();
        if have >= want {
            return Ok(Instant::now());
        }
        if let Some(status) = reconciler.exited() {
            bail!(
                "the reconciler exited: {status}\n{}",
                reconciler.log_tail(30)
            );
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: {have}/{want} after {timeout:?}\n{}",
            reconciler.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Nodes in `cache` with the reconciler's egress annotation, out of `want`.
pub fn annotated(cache: &Store<Node>, want: usize) -> (usize, usize) {
    let have = cache
        .state()
        .iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(EGRESS_IPCONFIG_ANNOTATION))
        })
        .count();
    (have, want)
}

/// Objects in `cache` whose status names the node `homes` names for them (the reconciler writes
/// it with `CloudResponsePending` just before it hands the IP to that node's lane), out of all.
pub fn handed_over(
    cache: &Store<CloudPrivateIPConfig>,
    homes: &HashMap<String, String>,
) -> (usize, usize) {
    let have = cache
        .state()
        .iter()
        .filter(|o| {
            let status_node = o.status.as_ref().map(|s| s.node.as_str());
            o.metadata
                .name
                .as_ref()
                .and_then(|n| homes.get(n))
                .is_some_and(|node| status_node == Some(node.as_str()))
        })
        .count();
    (have, homes.len())
}

/// Objects in `cache` assigned on the node `homes` names for them, out of all of them.
pub fn assigned(
    cache: &Store<CloudPrivateIPConfig>,
    homes: &HashMap<String, String>,
) -> (usize, usize) {
    (assigned_on(cache, homes), homes.len())
}

/// The reconciler's cloud calls so far, from its `/metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CloudCalls {
    /// VMs read (`cloudnet_cloud_reads_total`).
    pub vms_read: f64,
    /// Read calls (`egress_configs`, or `egress_config` for a one-VM-a-call provider).
    pub read_calls: f64,
    /// Mutating calls (`apply`, `move`).
    pub mutating: f64,
}

/// Reads [`CloudCalls`] from the reconciler at `metrics_url`.
pub async fn cloud_calls(metrics_url: &str) -> Result<CloudCalls> {
    let text = metrics::scrape(metrics_url).await?;
    let calls = |operations: &[&str]| -> f64 {
        operations
            .iter()
            .map(|op| {
                let label = format!("operation=\"{op}\"");
                metrics::sum(
                    &text,
                    "cloudnet_cloud_call_duration_seconds_count",
                    &[&label],
                )
            })
            .sum()
    };
    Ok(CloudCalls {
        vms_read: metrics::sum(&text, "cloudnet_cloud_reads_total", &[]),
        read_calls: calls(&["egress_configs", "egress_config"]),
        mutating: calls(&["apply", "move"]),
    })
}

/// Bytes as MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}
