//! Load benchmark of the admission webhook (not a test): see `cloudnet_e2e::bench::webhook`.
//!
//! Environment: `BENCH_DURATION_SECS` (default 20), `BENCH_CONNECTIONS` (default 8),
//! `CLOUDNET_WEBHOOK_BIN` (default: `cloudnet-webhook` beside this binary).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use cloudnet_e2e::bench::webhook::{self, Options};

fn env_or(name: &str, default: u64) -> Result<u64> {
    std::env::var(name).map_or(Ok(default), |v| {
        v.parse().with_context(|| format!("{name}={v}"))
    })
}

fn main() -> Result<()> {
    let webhook_bin = match std::env::var_os("CLOUDNET_WEBHOOK_BIN") {
        Some(path) => PathBuf::from(path),
        // `make bench-webhook` builds both binaries into the same profile directory.
        None => std::env::current_exe()?
            .parent()
            .context("the benchmark binary has no directory")?
            .join("cloudnet-webhook"),
    };
    let options = Options {
        nodes: 1_000,
        objects_per_node: 10,
        duration: Duration::from_secs(env_or("BENCH_DURATION_SECS", 20)?),
        warmup: Duration::from_secs(3),
        connections: usize::try_from(env_or("BENCH_CONNECTIONS", 8)?)?,
        webhook_bin,
    };
    // One worker thread: the webhook gets the other core of the 2-core machine.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let report = runtime.block_on(webhook::run(&options))?;
    let path = webhook::save(&report)?;
    println!("results: {}", path.display());
    Ok(())
}
