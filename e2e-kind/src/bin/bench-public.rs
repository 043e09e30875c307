//! Public-address follow-time benchmark (not a test): how long after a move's patch an
//! EgressPublicIP's Elastic IP is associated on the new node, and how long after the private
//! IP's attach there (the target: within 1 s), how long after the patch the binding stops
//! saying `Associated` on the old node (the target: within 1 s, drift checks off), with the
//! calls each move costs.
//!
//! The reconciler runs in process (the dev build), its AWS provider paced at EC2's published
//! rates, against moto behind the fault proxy with EC2's token buckets and `BENCH_LATENCY_MS`
//! per call. BINDINGS egress IPs, each bound to a marked Elastic IP, are moved ROUNDS times
//! between two nodes, all at once; the object's `Assigned` and the binding's `Associated` on the
//! new node are polled every 10 ms through the API (so each time is ±10 ms and a list's latency).
//!
//! Usage: `bench-public [BINDINGS ROUNDS]` (default 8 5; an m5.large ENI takes 9 egress IPs); `BENCH_LATENCY_MS` (default 100),
//! `CLOUDNET_MOTO_VENV`, `CLOUDNET_CONTROLPLANE_BIN`. Prints a table and writes JSON to
//! `$CLOUDNET_CACHE_DIR/bench/public-<unix seconds>.json`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::bench::{env_or, quantile, write_results};
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule, TokenBuckets};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::e2e::ec2::{moto_instances, moto_settings};
use cloudnet_e2e::harness::e2e::{plugin, public_ips};
use cloudnet_reconciler::cloud::aws::AwsProvider;
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::controller::EngineConfig;
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::public_ip::{EgressPublicIP, EgressPublicIPSpec};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const NODES: [&str; 2] = ["bench-a", "bench-b"];
const POLL: Duration = Duration::from_millis(10);
/// The first egress IP's offset in the subnet (clear of the instances' own addresses).
const FIRST_HOST: u32 = 40;
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);
/// The calls a move may make, counted at the proxy.
const PUBLIC_CALLS: [&str; 3] = [
    "DescribeAddresses",
    "AssociateAddress",
    "DisassociateAddress",
];
const PRIVATE_CALLS: [&str; 2] = ["AssignPrivateIpAddresses", "UnassignPrivateIpAddresses"];

/// One binding's move, in seconds since its round started: its patch, the binding first seen
/// no longer `Associated` on the old node, the private IP seen Assigned on the new node, the
/// public address seen associated there.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    patched: f64,
    left: f64,
    assigned: f64,
    associated: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = cloudnet_e2e::bench::count_args()?;
    let (bindings, rounds) = match args.as_slice() {
        [] => (8, 5),
        [b, r] => (*b, *r),
        _ => bail!("usage: bench-public [BINDINGS ROUNDS]"),
    };
    let latency = Duration::from_millis(env_or("BENCH_LATENCY_MS", 100)?);
    // The in-process reconciler's log, on stderr; RUST_LOG picks the level.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();

    let cp = ControlPlane::start_with_crd().await?;
    let client = cp.client().await?;
    public_ips::install_crd(&client).await?;
    let moto = MotoServer::start().await?;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await?;
    let region = "us-east-1";
    let (ec2, network, instances) = moto_instances(moto.url(), region, 2).await?;
    for (name, instance) in NODES.iter().zip(&instances) {
        plugin::create_node(&client, name, instance).await?;
    }
    let first = u32::from(network.ipv4.network()) + FIRST_HOST;
    let ips: Vec<String> = (0..bindings)
        .map(|i| IpAddr::V4(Ipv4Addr::from(first + i as u32)).to_string())
        .collect();

    let mut provider_settings = moto_settings(proxy.url(), region);
    provider_settings.pacing = Pacing::PUBLISHED;
    let provider = AwsProvider::new(&provider_settings)?;
    let config = EngineConfig {
        drift_period: Duration::ZERO,
        ..EngineConfig::default()
    };
    let _reconciler = tokio::spawn(cloudnet_reconciler::controller::run(
        client.clone(),
        Arc::new(provider),
        config,
        Arc::new(Metrics::default()),
        "bench".into(),
        std::future::pending(),
    ));

    let objects: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let binds: Api<EgressPublicIP> = Api::all(client.clone());
    for ip in &ips {
        let object = CloudPrivateIPConfig::new(
            ip,
            CloudPrivateIPConfigSpec {
                node: NODES[0].into(),
            },
        );
        objects.create(&PostParams::default(), &object).await?;
        let (public, _) = public_ips::allocate(&ec2, true).await?;
        let binding = EgressPublicIP::new(
            &format!("bench-{}", ip.replace('.', "-")),
            EgressPublicIPSpec {
                private_ip: ip.clone(),
                public_ip: public,
            },
        );
        binds.create(&PostParams::default(), &binding).await?;
    }
    let start = Instant::now();
    wait_round(&objects, &binds, None, NODES[0], start).await?;
    eprintln!(
        "bench-public: {bindings} bindings associated on {}",
        NODES[0]
    );

    // EC2's buckets and latency from now on: the set-up is not what is measured.
    proxy.set_token_buckets(TokenBuckets::ec2());
    proxy.set_rule(RouteMatch::Any, Rule::PASS.with_latency(latency));
    let mut samples = Vec::new();
    let mut calls: BTreeMap<&str, u64> = BTreeMap::new();
    for round in 0..rounds {
        let (from, to) = (NODES[round % 2], NODES[(round + 1) % 2]);
        proxy.reset_counts();
        let start = Instant::now();
        let mut patched = BTreeMap::new();
        for ip in &ips {
            objects
                .patch(
                    ip,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"node": to}})),
                )
                .await?;
            patched.insert(ip.clone(), start.elapsed().as_secs_f64());
        }
        let mut round_samples = wait_round(&objects, &binds, Some(from), to, start).await?;
        for (ip, sample) in &mut round_samples {
            sample.patched = patched.get(ip).copied().unwrap_or_default();
        }
        let round_samples: Vec<Sample> = round_samples.into_values().collect();
        for route in PUBLIC_CALLS.into_iter().chain(PRIVATE_CALLS) {
            *calls.entry(route).or_default() += proxy.counts(route).total();
        }
        eprintln!("bench-public: round {round} to {to}: {round_samples:?}");
        samples.extend(round_samples);
    }
    report(bindings, rounds, latency, &samples, &calls)
}

/// Waits until every object is Assigned on `node` and every binding Associated there; by IP,
/// the seconds since `start` at which each was first seen so, and at which each binding was
/// first seen no longer Associated on `from`.
async fn wait_round(
    objects: &Api<CloudPrivateIPConfig>,
    binds: &Api<EgressPublicIP>,
    from: Option<&str>,
    node: &str,
    start: Instant,
) -> anyhow::Result<BTreeMap<String, Sample>> {
    let mut assigned: BTreeMap<String, f64> = BTreeMap::new();
    let mut associated: BTreeMap<String, f64> = BTreeMap::new();
    let mut left: BTreeMap<String, f64> = BTreeMap::new();
    loop {
        let now = start.elapsed().as_secs_f64();
        for o in objects.list(&ListParams::default()).await? {
            if o.is_assigned() && o.spec.node == node {
                assigned.entry(o.name_any()).or_insert(now);
            }
        }
        let listed = binds.list(&ListParams::default()).await?;
        for b in &listed {
            let on = |node: &str| b.status.as_ref().is_some_and(|s| s.node == node);
            let ok = b.associated_condition().is_some_and(|c| c.status == "True");
            if !(ok && from.is_some_and(on)) {
                left.entry(b.spec.private_ip.clone()).or_insert(now);
            }
            if on(node) && ok {
                associated.entry(b.spec.private_ip.clone()).or_insert(now);
            }
        }
        if associated.len() == listed.items.len() && assigned.len() >= associated.len() {
            return Ok(associated
                .iter()
                .map(|(ip, at)| {
                    let sample = Sample {
                        patched: 0.0,
                        left: left.get(ip).copied().unwrap_or(*at),
                        assigned: assigned.get(ip).copied().unwrap_or(*at),
                        associated: *at,
                    };
                    (ip.clone(), sample)
                })
                .collect());
        }
        if start.elapsed() > ROUND_TIMEOUT {
            let waiting: Vec<String> = listed
                .iter()
                .filter(|b| !associated.contains_key(&b.spec.private_ip))
                .map(|b| format!("{}: {:?}", b.name_any(), b.status))
                .collect();
            bail!(
                "after {ROUND_TIMEOUT:?}: {} of {} associated on {node}; waiting: {waiting:?}",
                associated.len(),
                listed.items.len()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

fn report(
    bindings: usize,
    rounds: usize,
    latency: Duration,
    samples: &[Sample],
    calls: &BTreeMap<&str, u64>,
) -> anyhow::Result<()> {
    let moves = (bindings * rounds).max(1) as f64;
    let mut follow: Vec<f64> = samples.iter().map(|s| s.associated - s.patched).collect();
    let mut after: Vec<f64> = samples.iter().map(|s| s.associated - s.assigned).collect();
    let mut left: Vec<f64> = samples.iter().map(|s| s.left - s.patched).collect();
    let stats = |v: &mut [f64]| json!({"p50": quantile(v, 0.5), "p90": quantile(v, 0.9), "max": quantile(v, 1.0)});
    let (follow, after, left) = (stats(&mut follow), stats(&mut after), stats(&mut left));
    let per_move: BTreeMap<&str, f64> =
        calls.iter().map(|(k, v)| (*k, *v as f64 / moves)).collect();
    println!(
        "Public address follow time: {bindings} bindings moved {rounds} times between two nodes, \
         EC2's token buckets and {} ms per call (moto)",
        latency.as_millis()
    );
    println!("| measure | p50 s | p90 s | max s |");
    println!("|---|---|---|---|");
    for (name, s) in [
        ("patch → no longer Associated on the old node", &left),
        ("patch → associated on the new node", &follow),
        ("private attach → associated", &after),
    ] {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} |",
            s["p50"].as_f64().unwrap_or(f64::NAN),
            s["p90"].as_f64().unwrap_or(f64::NAN),
            s["max"].as_f64().unwrap_or(f64::NAN)
        );
    }
    println!("calls per move (one binding moved): {per_move:?}");
    let doc = json!({
        "bindings": bindings, "rounds": rounds, "latency_ms": latency.as_millis() as u64,
        "buckets": "ec2", "follow_seconds": follow, "after_attach_seconds": after,
        "left_seconds": left,
        "calls_per_move": per_move,
        "samples": samples
            .iter()
            .map(|s| json!({"patched": s.patched, "left": s.left, "assigned": s.assigned, "associated": s.associated}))
            .collect::<Vec<_>>(),
    });
    write_results("public", &doc)?;
    Ok(())
}
