//! The egress gateway failover benchmark (not a test): how long after a gateway node's agent
//! last renewed its heartbeat the gateways it carried are active on another node, their IPs
//! attached to that node's ENI and on its interface, and the active label moved, with many
//! gateways failing over at once; and what that costs EC2.
//!
//! The real local control plane with the EgressGateway CRD; moto behind the fault proxy with
//! EC2's token buckets and a fixed latency per call; the reconciler as shipped (its own process,
//! upstream's command line plus `--front-end=egress-gateway`, the default 3 s heartbeat
//! timeout); and the real node agent (`cloudnet-node`, its library) for each node, in a network
//! namespace of the node's own whose `eth0` has the node's address in its subnet
//! (`harness::node_host`; needs root). Every gateway selects every node, so all of them are
//! active on the first node by name; each round the active node's agent stops (as when its VM is
//! powered off: no more heartbeats), every gateway fails over to the first other node by name, and the
//! stopped agent starts again once they have (it must then take the addresses off its interface:
//! checked before the next round, which stops the new active node's agent).
//!
//! What is timed, per gateway and round, from the stopped agent's last heartbeat (its Lease's
//! `renewTime`, the wall clock): the gateway's `status.activeNode` naming the new node (as this
//! benchmark's watch sees it), EC2's successful answer to the `AssignPrivateIpAddresses` putting
//! its IP on the new node's ENI (as the proxy saw it come back), the active label on the new node
//! and off the old one (as the watch sees them). The failover is the last of these: the agent
//! labels its node only once the IP is on its interface, which is checked at the round's end.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use cloudnet_node::Settings;
use cloudnet_shared::gateway::{EgressGateway, gateway_of_label};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::ControlPlane;
use crate::bench::antrea::wait_in_cloud;
use crate::bench::aws::{
    CallsPerIp, REGION, buckets_json, counts_json, delta, fleet, settle, wait_annotated,
};
use crate::bench::{
    Shipped, free_addr, keep_reconciler_log, loadavg, peak_rss_bytes, print_quantiles,
    quantiles_json, write_results,
};
use crate::fakes::faultproxy::{Dialect, FaultProxy, RouteCounts, RouteMatch, Rule, TokenBuckets};
use crate::fakes::moto::MotoServer;
use crate::harness::controlplane::Supervised;
use crate::harness::e2e::gateway;
use crate::harness::e2e::local::{NAMESPACE, create_namespace, reconciler_command};
use crate::harness::node_host::NodeHost;

/// The call that puts an IP on an interface.
const ASSIGN: &str = "AssignPrivateIpAddresses";
/// The gateways' addresses start this far into the subnet: moto hands out the instances' own
/// addresses from the bottom.
const IP_OFFSET: u32 = 1024;
/// The most gateways a run takes: every one is on the same node, whose ENI (m5.4xlarge) takes 29
/// secondary IPv4 addresses.
pub const MAX_GATEWAYS: usize = 29;
/// The label every gateway selects.
const SELECTED: (&str, &str) = ("bench.cloudnet.io/gateway", "true");
/// How often the proxy's answers and the watches' records are looked at.
const POLL: Duration = Duration::from_millis(10);
/// The failover target of the issue: 5 s from the last heartbeat.
const TARGET: f64 = 5.0;

/// The benchmark's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// Gateways (one egress IP each) failing over at once.
    pub gateways: usize,
    /// Gateway nodes: a round's failover goes to the first by name of the others.
    pub nodes: usize,
    /// Failovers of all of them.
    pub rounds: usize,
    /// The latency, waits, log filter and flags of the reconciler's run.
    pub shipped: Shipped,
}

/// One gateway's failover, in seconds from the stopped agent's last heartbeat.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// The round.
    pub round: usize,
    /// `status.activeNode` named the new node.
    pub chosen: f64,
    /// EC2 answered the assignment on the new node's ENI.
    pub in_cloud: f64,
    /// The active label was on the new node.
    pub labelled: f64,
    /// The active label was off the old node.
    pub unlabelled: f64,
}

impl Sample {
    /// The failover: everything done.
    pub fn failover(&self) -> f64 {
        self.chosen
            .max(self.in_cloud)
            .max(self.labelled)
            .max(self.unlabelled)
    }
}

/// A run's results.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Every gateway's failover of every round.
    pub samples: Vec<Sample>,
    /// Calls the reconciler sent during the rounds (until the proxy was quiet after each).
    pub calls: BTreeMap<String, RouteCounts>,
    /// The reconciler's VmHWM at the end.
    pub peak_rss_bytes: u64,
    /// `/proc/loadavg` before and after the rounds.
    pub load: (String, String),
}

/// What the watches saw, each with the wall-clock time it was seen.
#[derive(Default)]
struct Seen {
    /// Each gateway's active node, every change.
    active: Vec<(SystemTime, String, String)>,
    /// Each node's active labels (gateway names), every change.
    labels: Vec<(SystemTime, String, Vec<String>)>,
}

type Shared = Arc<Mutex<Seen>>;

fn lock(seen: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the benchmark.
pub async fn run(params: &Params) -> Result<Outcome> {
    ensure!(
        (1..=MAX_GATEWAYS).contains(&params.gateways),
        "1 to {MAX_GATEWAYS} gateways"
    );
    ensure!(params.nodes >= 2, "at least two gateway nodes");
    ensure!(params.rounds >= 1, "at least one round");
    let cp = ControlPlane::start_with_crd().await?;
    let client = cp.client().await?;
    create_namespace(&client, NAMESPACE).await?;
    gateway::install_crd(&client).await?;
    let moto = MotoServer::start().await?;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .record([ASSIGN])
        .start()
        .await?;
    let (network, instances, nodes) = fleet(&moto, &client, params.nodes, "bench-gw").await?;
    for node in &nodes {
        gateway::gateway_node(&client, node, SELECTED).await?;
    }

    let metrics_addr = free_addr()?;
    let mut command =
        reconciler_command(&cp, REGION, proxy.url(), metrics_addr, cp.kubeconfig_path())?;
    command
        .arg("--front-end=egress-gateway")
        .args(&params.shipped.reconciler_args);
    command.env("RUST_LOG", &params.shipped.rust_log);
    let log = cp.dir().join("bench-gateway-reconciler.log");
    let mut reconciler = Supervised::spawn("cloudnet-reconciler", command, &log)?;
    wait_annotated(&client, &nodes, &mut reconciler, params.shipped.timeout).await?;

    let mut hosts = Vec::new();
    for (node, instance) in nodes.iter().zip(&instances) {
        let settings = Settings {
            node: node.clone(),
            lease_namespace: NAMESPACE.into(),
            heartbeat_interval: Duration::from_secs(1),
            lease_duration_seconds: 3,
            interface: None,
        };
        hosts.push(
            NodeHost::start(
                client.clone(),
                settings,
                instance.primary_ipv4,
                network.ipv4.prefix_len(),
            )
            .await?,
        );
    }

    let base = u32::from(network.ipv4.network()) + IP_OFFSET;
    let ips: Vec<IpAddr> = (0..params.gateways)
        .map(|i| IpAddr::from(Ipv4Addr::from(base + i as u32)))
        .collect();
    let names: Vec<String> = (0..params.gateways).map(gateway_name).collect();
    for (name, ip) in names.iter().zip(&ips) {
        gateway::create(&client, name, SELECTED, &[*ip]).await?;
    }

    let seen: Shared = Arc::default();
    let watches = [
        tokio::spawn(watch_gateways(client.clone(), Arc::clone(&seen))),
        tokio::spawn(watch_labels(client.clone(), Arc::clone(&seen))),
    ];

    // Set-up: every gateway on the first node by name, its IP on that node's interface.
    let mut active = 0;
    wait_converged(
        &seen,
        &names,
        &nodes,
        active,
        None,
        &mut reconciler,
        params.shipped.timeout,
    )
    .await?;
    wait_held(&hosts, active, &ips, params.shipped.timeout).await?;
    eprintln!(
        "bench-gateway: {} gateways active on {}, their IPs on its interface",
        names.len(),
        nodes[active]
    );

    // EC2's buckets and latency from now on: the set-up is not what is measured.
    proxy.set_token_buckets(TokenBuckets::ec2());
    proxy.set_rule(
        RouteMatch::Any,
        Rule::PASS.with_latency(params.shipped.latency),
    );
    settle(&proxy).await;
    let load_before = loadavg();
    let before = proxy.all_counts();
    let mut samples = Vec::new();
    // The proxy's answers carry `Instant`s: one pair of clocks converts them to the wall clock.
    let (instant0, wall0) = (Instant::now(), SystemTime::now());
    let wall = |at: Instant| wall0 + at.saturating_duration_since(instant0);
    for round in 0..params.rounds {
        // The first node by name but the one going: the others are all alive.
        let next = usize::from(active == 0);
        let answered = proxy.answered(0).len();
        hosts[active].stop_agent().await?;
        let last = gateway::last_heartbeat(&client, NAMESPACE, &nodes[active]).await?;
        let in_cloud = wait_in_cloud(
            &proxy,
            answered,
            &ips.iter().map(IpAddr::to_string).collect::<Vec<_>>(),
            &vec![instances[next].eni.as_str(); ips.len()],
            Instant::now(),
            params.shipped.timeout,
        )
        .await
        .with_context(|| format!("round {round}\n{}", reconciler.log_tail(30)))?;
        wait_converged(
            &seen,
            &names,
            &nodes,
            next,
            Some(active),
            &mut reconciler,
            params.shipped.timeout,
        )
        .await
        .with_context(|| format!("round {round}"))?;
        wait_held(&hosts, next, &ips, params.shipped.timeout).await?;
        {
            let seen = lock(&seen);
            for (i, name) in names.iter().enumerate() {
                let since = |at: SystemTime| {
                    at.duration_since(last)
                        .map_or(f64::NAN, |d| d.as_secs_f64())
                };
                let first = |found: Option<SystemTime>| found.map_or(f64::NAN, since);
                samples.push(Sample {
                    round,
                    chosen: first(first_active(&seen, name, &nodes[next], last)),
                    in_cloud: since(wall(in_cloud[i])),
                    labelled: first(first_labels(&seen, &nodes[next], last, |l| {
                        l.contains(name)
                    })),
                    unlabelled: first(first_labels(&seen, &nodes[active], last, |l| {
                        !l.contains(name)
                    })),
                });
            }
        }
        settle(&proxy).await;
        let worst = samples[samples.len() - names.len()..]
            .iter()
            .map(Sample::failover)
            .fold(0.0, f64::max);
        eprintln!(
            "bench-gateway: round {round}: {} gateways failed over from {} to {}, the last {worst:.3} \
             s after its last heartbeat",
            names.len(),
            nodes[active],
            nodes[next]
        );
        // The old node's agent comes back: it must take the addresses off its interface and not
        // take the gateways back.
        hosts[active].start_agent()?;
        wait_released(&hosts[active], &ips, params.shipped.timeout).await?;
        active = next;
    }
    for watch in watches {
        watch.abort();
    }
    let calls = delta(&proxy.all_counts(), &before);
    let outcome = Outcome {
        samples,
        calls,
        peak_rss_bytes: peak_rss_bytes(reconciler.pid()),
        load: (load_before, loadavg()),
    };
    keep_reconciler_log(&log, "gateway")?;
    Ok(outcome)
}

fn gateway_name(i: usize) -> String {
    format!("bench-{i:02}")
}

/// Records every change of a gateway's active node.
async fn watch_gateways(client: Client, seen: Shared) {
    watcher(
        Api::<EgressGateway>::all(client),
        watcher::Config::default(),
    )
    .applied_objects()
    .for_each(|gateway| {
        if let Ok(gateway) = gateway {
            let node = gateway.active_node().unwrap_or_default().to_owned();
            lock(&seen)
                .active
                .push((SystemTime::now(), gateway.name_any(), node));
        }
        std::future::ready(())
    })
    .await;
}

/// Records every node's active labels on every change.
async fn watch_labels(client: Client, seen: Shared) {
    watcher(
        Api::<PartialObjectMeta<Node>>::all(client),
        watcher::Config::default(),
    )
    .applied_objects()
    .for_each(|node| {
        if let Ok(node) = node {
            let labels: Vec<String> = node
                .labels()
                .keys()
                .filter_map(|k| gateway_of_label(k))
                .map(str::to_owned)
                .collect();
            lock(&seen)
                .labels
                .push((SystemTime::now(), node.name_any(), labels));
        }
        std::future::ready(())
    })
    .await;
}

/// When `gateway` was first seen active on `node` at or after `since`.
fn first_active(seen: &Seen, gateway: &str, node: &str, since: SystemTime) -> Option<SystemTime> {
    seen.active
        .iter()
        .find(|(at, g, n)| *at >= since && g == gateway && n == node)
        .map(|(at, ..)| *at)
}

/// When `node`'s labels were first seen to satisfy `holds` at or after `since`.
fn first_labels(
    seen: &Seen,
    node: &str,
    since: SystemTime,
    holds: impl Fn(&[String]) -> bool,
) -> Option<SystemTime> {
    seen.labels
        .iter()
        .find(|(at, n, labels)| *at >= since && n == node && holds(labels))
        .map(|(at, ..)| *at)
}

/// Waits until the watches last saw every gateway active on `nodes[to]`, labelled there, and
/// (when given) unlabelled on `nodes[from]`.
async fn wait_converged(
    seen: &Shared,
    names: &[String],
    nodes: &[String],
    to: usize,
    from: Option<usize>,
    reconciler: &mut Supervised,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = reconciler.exited() {
            bail!(
                "the reconciler exited: {status}\n{}",
                reconciler.log_tail(30)
            );
        }
        let (active, labelled, cleared) = {
            let seen = lock(seen);
            let mut latest_active: HashMap<&str, &str> = HashMap::new();
            for (_, g, n) in &seen.active {
                latest_active.insert(g, n);
            }
            let mut latest_labels: HashMap<&str, &[String]> = HashMap::new();
            for (_, n, l) in &seen.labels {
                latest_labels.insert(n, l);
            }
            let labels_of = |node: &str| latest_labels.get(node).copied().unwrap_or_default();
            let active = names
                .iter()
                .filter(|g| latest_active.get(g.as_str()) == Some(&nodes[to].as_str()))
                .count();
            let labelled = names
                .iter()
                .filter(|g| labels_of(&nodes[to]).contains(g))
                .count();
            let cleared =
                from.is_none_or(|from| names.iter().all(|g| !labels_of(&nodes[from]).contains(g)));
            (active, labelled, cleared)
        };
        if active == names.len() && labelled == names.len() && cleared {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "after {timeout:?}: {active}/{} gateways active on {}, {labelled} labelled there, \
             old node's labels cleared: {cleared}\n{}",
            names.len(),
            nodes[to],
            reconciler.log_tail(30)
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until every one of `ips` is on `hosts[on]`'s interface as the agent adds them.
async fn wait_held(hosts: &[NodeHost], on: usize, ips: &[IpAddr], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let held = hosts[on].holding(ips).await?;
        if held == ips.len() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "after {timeout:?}: {held}/{} IPs on {}'s interface",
            ips.len(),
            hosts[on].node()
        );
        tokio::time::sleep(POLL * 5).await;
    }
}

/// Waits until none of `ips` is on `host`'s interface: its agent, back after a failover, took
/// them off.
async fn wait_released(host: &NodeHost, ips: &[IpAddr], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let addresses = host.addresses().await?;
        let left = ips
            .iter()
            .filter(|ip| addresses.iter().any(|a| a.ip == **ip))
            .count();
        if left == 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "after {timeout:?}: {left} gateway IPs still on {}'s interface after its agent came \
             back",
            host.node()
        );
        tokio::time::sleep(POLL * 5).await;
    }
}

/// Prints the table and writes the JSON to `$CLOUDNET_CACHE_DIR/bench/`; returns its path.
pub fn report(params: &Params, outcome: &Outcome) -> Result<PathBuf> {
    let moved = outcome.samples.len().max(1) as f64;
    let column = |f: fn(&Sample) -> f64| -> Vec<f64> { outcome.samples.iter().map(f).collect() };
    let rows = [
        (
            "last heartbeat → gateway failed over (all below)",
            quantiles_json(&column(Sample::failover)),
        ),
        (
            "last heartbeat → status.activeNode names the new node",
            quantiles_json(&column(|s| s.chosen)),
        ),
        (
            "last heartbeat → IP on the new node's ENI (EC2's answer)",
            quantiles_json(&column(|s| s.in_cloud)),
        ),
        (
            "last heartbeat → active label on the new node (IP on its interface)",
            quantiles_json(&column(|s| s.labelled)),
        ),
        (
            "last heartbeat → active label off the old node",
            quantiles_json(&column(|s| s.unlabelled)),
        ),
    ];
    let p99 = rows[0].1["p99"].as_f64().unwrap_or(f64::NAN);
    let calls = CallsPerIp::of(&outcome.calls, moved);
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "Egress gateway failover: {} gateways (one IP each) failing over at once, {} rounds, {} \
         gateway nodes; heartbeats every 1 s, timeout 3 s; EC2's token buckets and {} ms per call \
         (moto); load {} before, {} after; {cores} cores",
        params.gateways,
        params.rounds,
        params.nodes,
        params.shipped.latency.as_millis(),
        outcome.load.0,
        outcome.load.1,
    );
    print_quantiles(&rows);
    println!(
        "target: p99 within {TARGET:.0} s of the last heartbeat: {}",
        if p99 <= TARGET { "met" } else { "NOT met" }
    );
    calls.print();
    println!(
        "reconciler peak RSS {:.1} MiB",
        outcome.peak_rss_bytes as f64 / 1048576.0
    );
    let doc = json!({
        "gateways": params.gateways,
        "nodes": params.nodes,
        "rounds": params.rounds,
        "latency_ms": params.shipped.latency.as_millis() as u64,
        "buckets": buckets_json(&TokenBuckets::ec2()),
        "heartbeat": {"interval_seconds": 1, "timeout_seconds": 3},
        "reconciler": "separate process, upstream's flags and --front-end=egress-gateway, EC2 through the fault proxy",
        "agents": "cloudnet-node's library, one per node in a network namespace of its own",
        "reconciler_args": params.shipped.reconciler_args,
        "timing": "from the stopped agent's last Lease renewTime to the last of: status.activeNode \
                   naming the new node, EC2's answer assigning the IP to the new node's ENI, the \
                   active label on the new node (the agent's, after the IP is on its interface) \
                   and off the old one",
        "failover_seconds": rows[0].1,
        "chosen_seconds": rows[1].1,
        "in_cloud_seconds": rows[2].1,
        "labelled_seconds": rows[3].1,
        "unlabelled_seconds": rows[4].1,
        "target_seconds": TARGET,
        "target_met": p99 <= TARGET,
        "calls_per_ip": {"mutating": calls.mutating, "reads": calls.reads},
        "throttled_answers": calls.throttled,
        "calls_per_route": counts_json(&outcome.calls),
        "peak_rss_bytes": outcome.peak_rss_bytes,
        "loadavg_before": outcome.load.0,
        "loadavg_after": outcome.load.1,
        "cores": cores,
        "samples": outcome.samples.iter().map(|s| json!({
            "round": s.round, "chosen": s.chosen, "in_cloud": s.in_cloud,
            "labelled": s.labelled, "unlabelled": s.unlabelled,
        })).collect::<Vec<_>>(),
    });
    write_results(&format!("gateway-{}", params.gateways), &doc)
}
