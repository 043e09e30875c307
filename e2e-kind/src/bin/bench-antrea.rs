//! Antrea failover benchmark (not a test): see `cloudnet_e2e::bench::antrea` for what it
//! measures and how.
//!
//! Usage: `bench-antrea [EGRESSES ROUNDS]` (default 50 4: 50 Egresses failing over at once, four
//! times). Environment: `BENCH_LATENCY_MS` (latency per EC2 call during the rounds, default
//! 100), `BENCH_TIMEOUT_SECS` (the set-up's and each round's longest wait, default 300),
//! `BENCH_RUST_LOG` (the reconciler's log filter, default `warn`), `BENCH_RECONCILER_ARGS`
//! (flags added to the reconciler's command line, split at whitespace),
//! `CLOUDNET_RECONCILER_BIN` (default: `cloudnet-reconciler` beside this binary),
//! `CLOUDNET_MOTO_VENV`, `CLOUDNET_CONTROLPLANE_BIN`. Prints a table and writes JSON to
//! `$CLOUDNET_CACHE_DIR/bench/antrea-<EGRESSES>-<unix seconds>.json`.

use anyhow::bail;
use cloudnet_e2e::bench::Shipped;
use cloudnet_e2e::bench::antrea::{self, Params};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = cloudnet_e2e::bench::count_args()?;
    let (egresses, rounds) = match args.as_slice() {
        [] => (50, 4),
        [e, r] => (*e, *r),
        _ => bail!("usage: bench-antrea [EGRESSES ROUNDS]"),
    };
    let params = Params {
        egresses,
        rounds,
        shipped: Shipped::from_env()?,
    };
    let outcome = antrea::run(&params).await?;
    antrea::report(&params, &outcome)?;
    Ok(())
}
