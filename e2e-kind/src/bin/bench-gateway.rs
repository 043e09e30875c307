//! Egress gateway failover benchmark (not a test): see `cloudnet_e2e::bench::gateway` for what
//! it measures and how. Needs root: each node's agent runs in a network namespace of its own.
//!
//! Usage: `bench-gateway [GATEWAYS ROUNDS]` (default 20 4: 20 gateways failing over at once, four
//! times). Environment: `BENCH_NODES` (gateway nodes, default 3), `BENCH_LATENCY_MS` (latency
//! per EC2 call during the rounds, default 100), `BENCH_TIMEOUT_SECS` (the set-up's and each
//! round's longest wait, default 300), `BENCH_RUST_LOG` (the reconciler's log filter, default
//! `warn`), `BENCH_RECONCILER_ARGS` (flags added to the reconciler's command line, split at
//! whitespace), `CLOUDNET_RECONCILER_BIN` (default: `cloudnet-reconciler` beside this binary),
//! `CLOUDNET_MOTO_VENV`, `CLOUDNET_CONTROLPLANE_BIN`. Prints a table and writes JSON to
//! `$CLOUDNET_CACHE_DIR/bench/gateway-<GATEWAYS>-<unix seconds>.json`.

use anyhow::bail;
use cloudnet_e2e::bench::gateway::{self, Params};
use cloudnet_e2e::bench::{Shipped, env_or};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = cloudnet_e2e::bench::count_args()?;
    let (gateways, rounds) = match args.as_slice() {
        [] => (20, 4),
        [g, r] => (*g, *r),
        _ => bail!("usage: bench-gateway [GATEWAYS ROUNDS]"),
    };
    let params = Params {
        gateways,
        nodes: env_or("BENCH_NODES", 3)?,
        rounds,
        shipped: Shipped::from_env()?,
    };
    let outcome = gateway::run(&params).await?;
    gateway::report(&params, &outcome)?;
    Ok(())
}
