//! Azure provider benchmark on the ARM fake (not a test): ARM calls per IP and time to converge
//! for attaching, moving and detaching egress IPs on many VMs, batched as the engine batches
//! (one change per VM carrying everything pending, at most the provider's `max_batch` IPs) and,
//! for comparison, one change per IP as upstream does.
//!
//! Usage: `bench-azure [IPS VMS]` (default 512 16). Environment: `BENCH_LATENCY_MS` (latency the
//! fault proxy adds to every ARM call, default 20), `BENCH_OPERATION_MS` (how long a NIC update
//! stays InProgress, default 200), `BENCH_JSON` (write the results there as JSON).
//! The engine is not in the loop: this measures the provider's cost per change shape.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cloudnet_e2e::bench::env_or;
use cloudnet_e2e::fakes::arm::{ArmConfig, ArmFake, VmIds};
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule};
use cloudnet_reconciler::cloud::aws::Secret;
use cloudnet_reconciler::cloud::azure::{
    AzureAuth, AzureCredentials, AzureProvider, AzureSettings, Environment, RetryPolicy,
};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{Change, CloudProvider, NodeTarget};
use futures::future::try_join_all;

const SUB: &str = "00000000-0000-0000-0000-0000000000be";

/// One measured phase.
struct Phase {
    name: String,
    ips: usize,
    seconds: f64,
    calls: BTreeMap<String, u64>,
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

struct Bench {
    fake: ArmFake,
    _proxy: FaultProxy,
    provider: AzureProvider,
    nodes: Vec<(VmIds, NodeTarget)>,
}

async fn setup(vms: usize, latency: Duration, operation: Duration) -> anyhow::Result<Bench> {
    let fake = ArmFake::start(ArmConfig {
        operation_time: operation,
        retry_after: None,
        ..ArmConfig::default()
    })
    .await?;
    let subnet = fake.add_subnet(SUB, "net", "vnet", "workers", &["10.8.0.0/16"])?;
    let proxy = FaultProxy::builder(fake.url(), Dialect::Arm)
        .start()
        .await?;
    proxy.set_rule(RouteMatch::Any, Rule::PASS.with_latency(latency));
    let settings = AzureSettings {
        environment: Environment {
            // Tokens are the fake's, for its own URL; Resource Manager is behind the proxy.
            token_audience: fake.url().to_owned(),
            ..Environment::at(proxy.url(), fake.url())?
        },
        credentials: AzureCredentials {
            client_id: "bench".into(),
            tenant_id: "bench".into(),
            auth: AzureAuth::ClientSecret(Secret::new("bench")),
            subscription_id: None,
            resource_group: None,
        },
        retry: RetryPolicy {
            poll_interval: Duration::from_millis(50),
            ..RetryPolicy::default()
        },
        call_timeout: Duration::from_secs(20),
        pacing: Pacing::PUBLISHED,
    };
    let provider = AzureProvider::new(&settings)?;
    let mut nodes = Vec::new();
    for i in 0..vms {
        let name = format!("worker-{i}");
        let primary = IpAddr::V4(Ipv4Addr::new(10, 8, 0, 10 + u8::try_from(i % 200)?));
        let ids = fake.add_vm(SUB, "cluster", &name, &subnet, primary);
        let node = provider
            .resolve(&name, &ids.provider_id)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        nodes.push((ids, node));
    }
    Ok(Bench {
        fake,
        _proxy: proxy,
        provider,
        nodes,
    })
}

fn address(i: usize) -> anyhow::Result<IpAddr> {
    let i = u32::try_from(i)?;
    Ok(IpAddr::V4(Ipv4Addr::from(0x0a08_1000 + i)))
}

/// Runs `changes` (per VM index, a list of changes applied in order) concurrently across VMs,
/// serially per VM, as the engine's lanes do.
async fn run(
    bench: &Bench,
    name: &str,
    ips: usize,
    changes: Vec<Vec<Change>>,
) -> anyhow::Result<Phase> {
    let before = bench.fake.counts();
    let start = Instant::now();
    let lanes = changes.into_iter().enumerate().map(|(vm, list)| {
        let node = &bench.nodes[vm].1;
        let provider = &bench.provider;
        async move {
            let mut view = None;
            for change in list {
                view = provider
                    .apply(node, &change, view.as_ref())
                    .await
                    .map_err(|e| anyhow::anyhow!("{}: {e}", node.node_name))?;
            }
            anyhow::Ok(())
        }
    });
    try_join_all(lanes).await?;
    Ok(Phase {
        name: name.into(),
        ips,
        seconds: start.elapsed().as_secs_f64(),
        calls: diff(&bench.fake.counts(), &before),
    })
}

fn batched(per_vm: &[Vec<IpAddr>], max: usize, attach: bool) -> Vec<Vec<Change>> {
    per_vm
        .iter()
        .map(|ips| {
            ips.chunks(max)
                .map(|chunk| {
                    if attach {
                        Change::new(chunk.to_vec(), vec![])
                    } else {
                        Change::new(vec![], chunk.to_vec())
                    }
                })
                .collect()
        })
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = cloudnet_e2e::bench::count_args()?;
    let (ips, vms) = match args.as_slice() {
        [] => (512, 16),
        [i, v] => (*i, *v),
        _ => bail!("usage: bench-azure [IPS VMS]"),
    };
    if vms == 0 || ips / vms > 255 {
        bail!("between 1 VM and 255 IPs per VM");
    }
    let latency = Duration::from_millis(env_or("BENCH_LATENCY_MS", 20)?);
    let operation = Duration::from_millis(env_or("BENCH_OPERATION_MS", 200)?);
    let mut phases = Vec::new();

    // Batched, as the engine drives the provider.
    let bench = setup(vms, latency, operation).await?;
    let max = bench.provider.needs().max_batch;
    let mut per_vm: Vec<Vec<IpAddr>> = vec![Vec::new(); vms];
    for i in 0..ips {
        per_vm[i % vms].push(address(i)?);
    }
    phases.push(run(&bench, "attach (batched)", ips, batched(&per_vm, max, true)).await?);
    // Move half of each VM's IPs to the next VM: one change removes, the other adds.
    let mut moves: Vec<Vec<Change>> = vec![Vec::new(); vms];
    let mut moved = 0;
    for vm in 0..vms {
        let half: Vec<IpAddr> = per_vm[vm]
            .iter()
            .copied()
            .take(per_vm[vm].len() / 2)
            .collect();
        moved += half.len();
        moves[vm].push(Change::new(vec![], half));
    }
    phases.push(run(&bench, "move: detach half (batched)", moved, moves).await?);
    let mut adds: Vec<Vec<Change>> = vec![Vec::new(); vms];
    for vm in 0..vms {
        let half: Vec<IpAddr> = per_vm[vm]
            .iter()
            .copied()
            .take(per_vm[vm].len() / 2)
            .collect();
        adds[(vm + 1) % vms].push(Change::new(half, vec![]));
    }
    phases.push(run(&bench, "move: attach half elsewhere (batched)", moved, adds).await?);
    drop(bench);

    // One change per IP, as upstream drives Azure.
    let bench = setup(vms, latency, operation).await?;
    phases.push(
        run(
            &bench,
            "attach (one IP per change)",
            ips,
            batched(&per_vm, 1, true),
        )
        .await?,
    );
    phases.push(
        run(
            &bench,
            "detach (one IP per change)",
            ips,
            batched(&per_vm, 1, false),
        )
        .await?,
    );

    println!(
        "bench-azure: {ips} IPs on {vms} VMs, {} ms latency per ARM call, {} ms per NIC operation",
        latency.as_millis(),
        operation.as_millis()
    );
    println!(
        "{:<40} {:>6} {:>9} {:>8} {:>10} {:>9}  calls",
        "phase", "ips", "seconds", "PUTs", "calls/IP", "IPs/s"
    );
    let mut json = Vec::new();
    for p in &phases {
        let puts = p.calls.get("PUT nic").copied().unwrap_or(0);
        let total: u64 = p
            .calls
            .iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "PUT nic" | "GET nic" | "GET vm" | "GET subnet" | "GET operation" | "GET vnet"
                )
            })
            .map(|(_, v)| *v)
            .sum();
        let per_ip = total as f64 / p.ips.max(1) as f64;
        let rate = p.ips as f64 / p.seconds.max(1e-9);
        println!(
            "{:<40} {:>6} {:>9.2} {:>8} {:>10.3} {:>9.1}  {:?}",
            p.name, p.ips, p.seconds, puts, per_ip, rate, p.calls
        );
        json.push(serde_json::json!({
            "phase": p.name, "ips": p.ips, "seconds": p.seconds, "puts": puts,
            "arm_calls": total, "calls_per_ip": per_ip, "ips_per_second": rate, "calls": p.calls,
        }));
    }
    if let Ok(path) = std::env::var("BENCH_JSON") {
        let doc = serde_json::json!({
            "ips": ips, "vms": vms, "latency_ms": latency.as_millis() as u64,
            "operation_ms": operation.as_millis() as u64, "phases": json,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}
