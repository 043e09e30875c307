//! GCP benchmark (not a test): the engine's lanes over the GCP provider against the GCE fake
//! behind the fault proxy (see `cloudnet_e2e::bench::gcp`), once unlimited and once with latency
//! and throttling. Prints a table and writes JSON to `$CLOUDNET_CACHE_DIR/bench/`.
//!
//! Usage: `bench-gcp [OBJECTS NODES MOVED]` (default 1000 100 200). Environment:
//! `BENCH_LATENCY_MS` (limited run, default 100), `BENCH_THROTTLE` (limited run's probability of
//! a 429, default 0.2), `BENCH_OPERATION_MS` (operation delay, default 100).

use std::time::Duration;

use anyhow::bail;
use cloudnet_e2e::bench::env_or;
use cloudnet_e2e::bench::gcp::{Params, PhaseCalls, run};

fn row(mode: &str, phase: &str, c: &PhaseCalls) {
    let per_ip = |n: u64| n as f64 / c.ips.max(1) as f64;
    println!(
        "{mode:<10} {phase:<7} {:>6} {:>8} {:>8} {:>9.3} {:>7} {:>7} {:>8} {:>9.3} {:>9}",
        c.ips,
        c.batches,
        c.patches,
        per_ip(c.patches),
        c.reads,
        c.op_polls,
        c.total,
        per_ip(c.total),
        c.millis
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = cloudnet_e2e::bench::count_args()?;
    let (objects, nodes, moved) = match args.as_slice() {
        [] => (1000, 100, 200),
        [o, n, m] => (*o, *n, *m),
        _ => bail!("usage: bench-gcp [OBJECTS NODES MOVED]"),
    };
    let operation_delay = Duration::from_millis(env_or("BENCH_OPERATION_MS", 100)?);
    let modes = [
        ("unlimited", Duration::ZERO, 0.0),
        (
            "limited",
            Duration::from_millis(env_or("BENCH_LATENCY_MS", 100)?),
            env_or("BENCH_THROTTLE", 0.2)?,
        ),
    ];
    println!(
        "{:<10} {:<7} {:>6} {:>8} {:>8} {:>9} {:>7} {:>7} {:>8} {:>9} {:>9}",
        "mode",
        "phase",
        "ips",
        "batches",
        "patches",
        "patch/ip",
        "gets",
        "polls",
        "calls",
        "calls/ip",
        "ms"
    );
    let mut runs = Vec::new();
    for (mode, latency, throttle) in modes {
        let outcome = run(Params {
            objects,
            nodes,
            moved,
            latency,
            throttle,
            operation_delay,
        })
        .await?;
        row(mode, "attach", &outcome.attach);
        row(mode, "move", &outcome.moves);
        row(mode, "delete", &outcome.delete);
        if !outcome.violations.is_empty() {
            bail!("schema violations: {:?}", outcome.violations);
        }
        runs.push(serde_json::json!({
            "mode": mode, "latency_ms": latency.as_millis() as u64, "throttle": throttle,
            "attach": outcome.attach.to_json(), "move": outcome.moves.to_json(),
            "delete": outcome.delete.to_json(),
        }));
    }
    let dir = cloudnet_e2e::harness::controlplane::cache_root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!(
        "gcp-{}.json",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
    ));
    let doc = serde_json::json!({"objects": objects, "nodes": nodes, "moved": moved,
        "operation_delay_ms": operation_delay.as_millis() as u64, "runs": runs});
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("results: {}", path.display());
    Ok(())
}
