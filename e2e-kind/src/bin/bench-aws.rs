//! EC2 (moto) benchmark (not a test): see `cloudnet_e2e::bench::aws` for what it measures.
//!
//! Usage: `bench-aws [OBJECTS NODES MOVED]` (default 1000 100 200; also `BENCH_OBJECTS`,
//! `BENCH_NODES`, `BENCH_MOVED`). Environment: `BENCH_LATENCY_MS` (the limited runs' latency per
//! call, default 100), `BENCH_MODES` (`unlimited,limited` by default; either alone),
//! `BENCH_PHASE_TIMEOUT_SECS` (default 900), `BENCH_FLOOR=0` (skip the add phase's API floor), `BENCH_RUST_LOG` (the reconciler's log filter,
//! default `warn`), `BENCH_RECONCILER_ARGS` (flags added to the reconciler's command line,
//! split at whitespace, e.g. `--batch-max-wait-ms=3000`), `BENCH_IN_FLIGHT` (requests kept in
//! flight when creating, moving and deleting, default 64; fewer spread each phase's requests
//! out), `CLOUDNET_RECONCILER_BIN` (default: `cloudnet-reconciler` beside this
//! binary), `CLOUDNET_MOTO_VENV`, `CLOUDNET_CONTROLPLANE_BIN`.

use std::time::Duration;

use anyhow::bail;
use cloudnet_e2e::bench::aws::{self, Mode, Params};
use cloudnet_e2e::bench::env_or;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = cloudnet_e2e::bench::count_args()?;
    let (objects, nodes, moved) = match args.as_slice() {
        [] => (
            env_or("BENCH_OBJECTS", 1000)?,
            env_or("BENCH_NODES", 100)?,
            env_or("BENCH_MOVED", 200)?,
        ),
        [o, n, m] => (*o, *n, *m),
        _ => bail!("usage: bench-aws [OBJECTS NODES MOVED]"),
    };
    let modes = std::env::var("BENCH_MODES")
        .unwrap_or_else(|_| "unlimited,limited".into())
        .split(',')
        .map(|m| match m.trim() {
            "unlimited" => Ok(Mode::Unlimited),
            "limited" => Ok(Mode::Limited),
            other => bail!("unknown mode {other:?} in BENCH_MODES (unlimited, limited)"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let params = Params {
        objects,
        nodes,
        moved,
        latency: Duration::from_millis(env_or("BENCH_LATENCY_MS", 100)?),
        phase_timeout: Duration::from_secs(env_or("BENCH_PHASE_TIMEOUT_SECS", 900)?),
        modes,
        rust_log: std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        reconciler_args: cloudnet_e2e::bench::reconciler_args(),
        in_flight: env_or("BENCH_IN_FLIGHT", aws::IN_FLIGHT_REQUESTS)?,
    };
    let runs = aws::run(&params).await?;
    aws::report(&params, &runs)?;
    Ok(())
}
