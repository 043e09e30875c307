//! The Antrea failover benchmark (not a test): how long after Antrea moves an Egress IP to
//! another node the cloud has it on that node's interface, with many Egresses failing over at
//! once, and what that costs EC2.
//!
//! The real local control plane with Antrea's two CRDs, moto behind the fault proxy with EC2's
//! token buckets and a fixed latency per call, and the reconciler as shipped (its own process,
//! upstream's command line plus `--front-end antrea`). One opted-in ExternalIPPool and EGRESSES
//! Egresses, each allocated by antrea-controller and held by an agent as the harness plays them
//! (`crate::harness::e2e::antrea`), spread over one side's nodes; each round every Egress fails
//! over to the other side's nodes at once (the new holder's agent PUTs the status naming itself),
//! and the next round back.
//!
//! What is timed, per Egress IP and round: from `status.egressNode` changed to the moment EC2
//! answered with success the `AssignPrivateIpAddresses` that put the IP on the new node's ENI, as
//! the fault proxy sees that answer come back (`FaultProxy::answered`): moto has changed the
//! interface when it answers, so that instant is when the cloud shows the IP there, to the
//! proxy's clock and without polling. The status changed when kube-apiserver committed the
//! agent's PUT, between the PUT being sent and its answer: the headline starts at the sending (an
//! upper bound of the failover); the start of the agent's write (its GET before the PUT) and the
//! PUT's answer are reported too.
//! The calls per IP are every call the reconciler sent during the rounds (forwarded or
//! throttled, counted at the proxy) over the IPs moved.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use cloudnet_shared::CloudPrivateIPConfig;
use futures::StreamExt;
use futures::future::try_join_all;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::ControlPlane;
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
use crate::harness::e2e::antrea;
use crate::harness::e2e::local::{NAMESPACE, create_namespace, reconciler_command};

/// The call that puts an IP on an interface.
const ASSIGN: &str = "AssignPrivateIpAddresses";
/// The pool's addresses start this far into the subnet: moto hands out the instances' own
/// addresses from the bottom.
const POOL_OFFSET: u32 = 1024;
/// The pool's prefix length: room for [`MAX_EGRESSES`].
const POOL_PREFIX: u8 = 24;
/// Egresses one node holds at most (an m5.4xlarge ENI takes 29 secondary IPv4 addresses).
const PER_NODE: usize = 25;
/// The most Egresses a run takes (the pool's size, less its network and broadcast addresses).
pub const MAX_EGRESSES: usize = 250;
/// The pool's name.
const POOL: &str = "bench-antrea";
/// How often the proxy's answers and the objects are looked at.
const POLL: Duration = Duration::from_millis(10);

/// The benchmark's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// Egresses failing over at once.
    pub egresses: usize,
    /// Failovers of all of them, alternating between the two sides.
    pub rounds: usize,
    /// The latency, waits, log filter and flags of the reconciler's run.
    pub shipped: Shipped,
}

impl Params {
    /// Nodes on each side: enough for [`PER_NODE`] Egresses each.
    fn per_side(&self) -> usize {
        self.egresses.div_ceil(PER_NODE).max(1)
    }

    /// The node holding Egress `i` on `side` (0 or 1).
    fn node(&self, side: usize, i: usize) -> usize {
        side * self.per_side() + i % self.per_side()
    }
}

/// One IP's failover, in seconds from the start of its agent's status write.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// The round.
    pub round: usize,
    /// When the agent's PUT of the status was sent (after its GET).
    pub put_sent: f64,
    /// When the agent's status write (GET and PUT) was answered.
    pub written: f64,
    /// When the front end's write naming the new node reached this benchmark's watch of the
    /// CloudPrivateIPConfigs.
    pub planned: f64,
    /// When EC2 answered the assignment on the new node's ENI.
    pub in_cloud: f64,
}

/// A run's results.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Every IP's failover of every round.
    pub samples: Vec<Sample>,
    /// Calls the reconciler sent during the rounds (until the proxy was quiet after each).
    pub calls: BTreeMap<String, RouteCounts>,
    /// The reconciler's VmHWM at the end.
    pub peak_rss_bytes: u64,
    /// `/proc/loadavg` before and after the rounds.
    pub load: (String, String),
}

/// Runs the benchmark.
pub async fn run(params: &Params) -> Result<Outcome> {
    ensure!(
        (1..=MAX_EGRESSES).contains(&params.egresses),
        "1 to {MAX_EGRESSES} Egresses"
    );
    ensure!(params.rounds >= 1, "at least one round");
    let cp = ControlPlane::start_with_crd().await?;
    let client = cp.client().await?;
    create_namespace(&client, NAMESPACE).await?;
    antrea::install_crds(&client).await?;
    let moto = MotoServer::start().await?;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .record([ASSIGN])
        .start()
        .await?;
    let (network, instances, nodes) =
        fleet(&moto, &client, 2 * params.per_side(), "bench-antrea").await?;

    let pool = u32::from(network.ipv4.network()) + POOL_OFFSET;
    antrea::create_pool(
        &client,
        POOL,
        &format!("{}/{POOL_PREFIX}", Ipv4Addr::from(pool)),
        true,
    )
    .await?;
    let ips: Vec<String> = (0..params.egresses)
        .map(|i| IpAddr::from(Ipv4Addr::from(pool + 1 + i as u32)).to_string())
        .collect();

    let metrics_addr = free_addr()?;
    let mut command =
        reconciler_command(&cp, REGION, proxy.url(), metrics_addr, cp.kubeconfig_path())?;
    command
        .arg("--front-end=antrea")
        .args(&params.shipped.reconciler_args);
    command.env("RUST_LOG", &params.shipped.rust_log);
    let log = cp.dir().join("bench-antrea-reconciler.log");
    let mut reconciler = Supervised::spawn("cloudnet-reconciler", command, &log)?;
    wait_annotated(&client, &nodes, &mut reconciler, params.shipped.timeout).await?;

    // Set-up: Antrea allocates every IP and elects a node on side 0 for each.
    for (i, ip) in ips.iter().enumerate() {
        let name = egress_name(i);
        antrea::egress_held_on(&client, &name, POOL, ip, &nodes[params.node(0, i)]).await?;
    }
    let homes: HashMap<String, String> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| (ip.clone(), nodes[params.node(0, i)].clone()))
        .collect();
    wait_assigned(&client, &homes, &mut reconciler, params.shipped.timeout).await?;
    eprintln!(
        "bench-antrea: {} Egress IPs attached on {} nodes",
        ips.len(),
        params.per_side()
    );

    // When each CloudPrivateIPConfig was first seen naming a node, by (name, node), this round.
    let named: Arc<Mutex<HashMap<(String, String), Instant>>> = Arc::default();
    let watch = {
        let named = Arc::clone(&named);
        watcher(
            Api::<CloudPrivateIPConfig>::all(client.clone()),
            watcher::Config::default(),
        )
        .applied_objects()
        .for_each(move |object| {
            if let Ok(object) = object {
                named
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry((object.name_any(), object.spec.node.clone()))
                    .or_insert_with(Instant::now);
            }
            std::future::ready(())
        })
    };
    let watch = tokio::spawn(watch);

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
    for round in 0..params.rounds {
        let side = (round + 1) % 2;
        let targets: Vec<(usize, &str)> = (0..ips.len())
            .map(|i| (params.node(side, i), nodes[params.node(side, i)].as_str()))
            .collect();
        let seen = proxy.answered(0).len();
        named.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let started = Instant::now();
        // Every agent at once, as when a node goes: each new holder writes its own name.
        let writes = targets
            .iter()
            .zip(&ips)
            .enumerate()
            .map(|(i, ((_, node), ip))| {
                let client = client.clone();
                async move {
                    let sent = Instant::now();
                    let put = antrea::agent_writes(&client, &egress_name(i), node, ip).await?;
                    anyhow::Ok((sent, put, Instant::now()))
                }
            });
        let written = try_join_all(writes).await?;
        let enis: Vec<&str> = targets
            .iter()
            .map(|(n, _)| instances[*n].eni.as_str())
            .collect();
        let in_cloud = wait_in_cloud(&proxy, seen, &ips, &enis, started, params.shipped.timeout)
            .await
            .with_context(|| format!("round {round}\n{}", reconciler.log_tail(30)))?;
        let homes: HashMap<String, String> = ips
            .iter()
            .zip(&targets)
            .map(|(ip, (_, node))| (ip.clone(), (*node).to_owned()))
            .collect();
        wait_assigned(&client, &homes, &mut reconciler, params.shipped.timeout).await?;
        settle(&proxy).await;
        let planned = named.lock().unwrap_or_else(PoisonError::into_inner).clone();
        for (i, ((sent, put, answered), at)) in written.iter().zip(&in_cloud).enumerate() {
            let key = (ips[i].clone(), targets[i].1.to_owned());
            samples.push(Sample {
                round,
                put_sent: put.duration_since(*sent).as_secs_f64(),
                written: answered.duration_since(*sent).as_secs_f64(),
                planned: planned
                    .get(&key)
                    .map_or(f64::NAN, |t| t.duration_since(*sent).as_secs_f64()),
                in_cloud: at.duration_since(*sent).as_secs_f64(),
            });
        }
        eprintln!(
            "bench-antrea: round {round}: {} IPs on their new nodes' ENIs, the last {:.3} s after \
             the first status write",
            ips.len(),
            in_cloud
                .iter()
                .map(|at| at.duration_since(started).as_secs_f64())
                .fold(0.0, f64::max)
        );
    }
    watch.abort();
    let calls = delta(&proxy.all_counts(), &before);
    let outcome = Outcome {
        samples,
        calls,
        peak_rss_bytes: peak_rss_bytes(reconciler.pid()),
        load: (load_before, loadavg()),
    };
    keep_reconciler_log(&log, "antrea")?;
    Ok(outcome)
}

fn egress_name(i: usize) -> String {
    format!("bench-{i:03}")
}

/// For each of `ips`, when EC2 first answered with success an assignment of it to `enis[i]`
/// among the proxy's answers from the `seen`th on.
pub(crate) async fn wait_in_cloud(
    proxy: &FaultProxy,
    seen: usize,
    ips: &[String],
    enis: &[&str],
    started: Instant,
    timeout: Duration,
) -> Result<Vec<Instant>> {
    let mut found: Vec<Option<Instant>> = vec![None; ips.len()];
    let wanted: HashMap<(&str, &str), usize> = ips
        .iter()
        .zip(enis)
        .enumerate()
        .map(|(i, (ip, eni))| ((ip.as_str(), *eni), i))
        .collect();
    let mut read = seen;
    loop {
        let answered = proxy.answered(read);
        read += answered.len();
        for answer in &answered {
            let Some(eni) = answer.call.param("NetworkInterfaceId") else {
                continue;
            };
            for (key, ip) in &answer.call.params {
                if key.starts_with("PrivateIpAddress.")
                    && let Some(&i) = wanted.get(&(ip.as_str(), eni))
                {
                    found[i].get_or_insert(answer.at);
                }
            }
        }
        if found.iter().all(Option::is_some) {
            return Ok(found.into_iter().flatten().collect());
        }
        if started.elapsed() > timeout {
            let missing: Vec<&str> = ips
                .iter()
                .zip(&found)
                .filter(|(_, at)| at.is_none())
                .map(|(ip, _)| ip.as_str())
                .collect();
            bail!("after {timeout:?} not yet on their new interfaces: {missing:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until every CloudPrivateIPConfig `homes` names is `Assigned=True` on its node.
async fn wait_assigned(
    client: &Client,
    homes: &HashMap<String, String>,
    reconciler: &mut Supervised,
    timeout: Duration,
) -> Result<()> {
    let api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = reconciler.exited() {
            bail!(
                "the reconciler exited: {status}\n{}",
                reconciler.log_tail(30)
            );
        }
        let done = api
            .list(&ListParams::default())
            .await?
            .iter()
            .filter(|o| {
                o.is_assigned() && homes.get(&o.name_any()).is_some_and(|n| *n == o.spec.node)
            })
            .count();
        if done == homes.len() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{done}/{} CloudPrivateIPConfigs assigned on their nodes after {timeout:?}\n{}",
            homes.len(),
            reconciler.log_tail(30)
        );
        tokio::time::sleep(POLL * 10).await;
    }
}

/// Prints the table and writes the JSON to `$CLOUDNET_CACHE_DIR/bench/`; returns its path.
pub fn report(params: &Params, outcome: &Outcome) -> Result<PathBuf> {
    let moved = outcome.samples.len().max(1) as f64;
    let in_cloud: Vec<f64> = outcome.samples.iter().map(|s| s.in_cloud).collect();
    let after_change: Vec<f64> = outcome
        .samples
        .iter()
        .map(|s| s.in_cloud - s.put_sent)
        .collect();
    let after_put: Vec<f64> = outcome
        .samples
        .iter()
        .map(|s| s.in_cloud - s.written)
        .collect();
    let write: Vec<f64> = outcome.samples.iter().map(|s| s.written).collect();
    let planned: Vec<f64> = outcome.samples.iter().map(|s| s.planned).collect();
    let after_plan: Vec<f64> = outcome
        .samples
        .iter()
        .map(|s| s.in_cloud - s.planned)
        .collect();
    let rows = [
        (
            "status changed (its PUT sent) → IP on the new node's ENI",
            quantiles_json(&after_change),
        ),
        (
            "status write started (GET, PUT) → IP on the new node's ENI",
            quantiles_json(&in_cloud),
        ),
        (
            "status write answered → IP on the new node's ENI",
            quantiles_json(&after_put),
        ),
        (
            "the status write itself (GET + PUT)",
            quantiles_json(&write),
        ),
        (
            "status write started → the front end's CloudPrivateIPConfig write seen",
            quantiles_json(&planned),
        ),
        (
            "that write seen → IP on the new node's ENI",
            quantiles_json(&after_plan),
        ),
    ];
    let target = 1.0 + params.shipped.latency.as_secs_f64();
    let p99 = rows[0].1["p99"].as_f64().unwrap_or(f64::NAN);
    let calls = CallsPerIp::of(&outcome.calls, moved);
    println!(
        "Antrea failover: {} Egresses failing over at once, {} rounds, {} nodes a side; EC2's \
         token buckets and {} ms per call (moto); load {} before, {} after; {} cores",
        params.egresses,
        params.rounds,
        params.per_side(),
        params.shipped.latency.as_millis(),
        outcome.load.0,
        outcome.load.1,
        std::thread::available_parallelism().map_or(0, usize::from),
    );
    print_quantiles(&rows);
    println!(
        "target: p99 within 1 s plus one cloud call ({target:.3} s): {}",
        if p99 <= target { "met" } else { "NOT met" }
    );
    calls.print();
    println!(
        "reconciler peak RSS {:.1} MiB",
        outcome.peak_rss_bytes as f64 / 1048576.0
    );
    let doc = json!({
        "egresses": params.egresses,
        "rounds": params.rounds,
        "nodes_per_side": params.per_side(),
        "latency_ms": params.shipped.latency.as_millis() as u64,
        "buckets": buckets_json(&TokenBuckets::ec2()),
        "reconciler": "separate process, upstream's flags and --front-end=antrea, EC2 through the fault proxy",
        "reconciler_args": params.shipped.reconciler_args,
        "timing": "from status.egressNode changed (the agent's PUT of /status sent, an upper \
                   bound: the change is committed between its sending and its answer) to EC2's \
                   successful answer to the AssignPrivateIpAddresses naming the IP and the new \
                   node's ENI, as the fault proxy saw it come back",
        "failover_seconds": rows[0].1,
        "from_write_start_seconds": rows[1].1,
        "after_status_write_seconds": rows[2].1,
        "status_write_seconds": rows[3].1,
        "front_end_write_seen_seconds": rows[4].1,
        "front_end_write_seen_to_cloud_seconds": rows[5].1,
        "target_seconds": target,
        "target_met": p99 <= target,
        "calls_per_ip": {"mutating": calls.mutating, "reads": calls.reads},
        "throttled_answers": calls.throttled,
        "calls_per_route": counts_json(&outcome.calls),
        "peak_rss_bytes": outcome.peak_rss_bytes,
        "loadavg_before": outcome.load.0,
        "loadavg_after": outcome.load.1,
        "cores": std::thread::available_parallelism().map_or(0, usize::from),
        "samples": outcome.samples.iter().map(|s| json!({
            "round": s.round, "put_sent": s.put_sent, "written": s.written, "planned": s.planned, "in_cloud": s.in_cloud,
        })).collect::<Vec<_>>(),
    });
    write_results(&format!("antrea-{}", params.egresses), &doc)
}
