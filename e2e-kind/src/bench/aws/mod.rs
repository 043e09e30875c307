//! The moto benchmark (not a test): what the reconciler costs EC2. The real local control plane,
//! moto behind the fault proxy, and the reconciler as its own process with upstream's command
//! line (`-platform-type=AWS`, `-platform-api-url` at the proxy, credentials from a directory laid
//! out like the mounted Secret), as the end-to-end suite's local system runs it.
//!
//! N instances (Nodes with their providerIDs) and three phases: M objects created over the nodes
//! at API speed (64 requests in flight), K of them moved to other nodes, then all deleted. Each
//! run starts from scratch (control plane, moto, proxy and reconciler are fresh), once with EC2
//! unlimited and once with the proxy metering every action with EC2's token buckets plus a fixed
//! latency per call. Per phase: convergence time after the last request, the EC2 calls per IP
//! (counted at the proxy), IPs per mutating call, throttled answers, objects that showed an
//! `Assigned=False` condition about throttling, and the reconciler's peak RSS. Before the
//! reconciler starts, each run times the add phase's API floor on its control plane (the same
//! creates and the protocol's writes by a plain client, with and without one Event per IP), and
//! reports the add's total time from the first create against it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use aws_sdk_ec2::types::InstanceType;
use cloudnet_reconciler::cloud::aws::{AwsCredentials, ClientSettings, Secret, build_sdk_client};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec, EGRESS_IPCONFIG_ANNOTATION};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::ControlPlane;
use crate::bench::api_floor::{self, Events};
use crate::bench::{assigned_on, free_addr, peak_rss_bytes};
use crate::fakes::faultproxy::{
    BucketLimits, Dialect, FaultProxy, RouteCounts, RouteMatch, Rule, TokenBuckets,
};
use crate::fakes::moto::MotoServer;
use crate::harness::controlplane::{Supervised, cache_root};
use crate::harness::e2e::local::{NAMESPACE, create_namespace, reconciler_command};
use crate::harness::e2e::{EC2_MUTATIONS, ec2, metrics, plugin};

/// Requests the benchmark keeps in flight when it creates, moves or deletes objects, unless
/// told otherwise ([`Params::in_flight`]).
pub const IN_FLIGHT_REQUESTS: usize = 64;
/// moto's region for the run.
pub(crate) const REGION: &str = "us-east-1";
/// Large enough for the objects a node holds after the move (30 IPv4 addresses per interface).
const INSTANCE_TYPE: InstanceType = InstanceType::M54xlarge;
/// Objects take addresses from this offset of the /20 subnet on: moto hands out the instances'
/// own addresses from the bottom.
const FIRST_OBJECT_OFFSET: u32 = 1024;
/// How long the proxy must see no call before a phase's counts are read.
const QUIET: Duration = Duration::from_secs(2);
/// The longest wait for that quiet.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

pub mod startup;

/// What EC2 looks like during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every call forwarded at once.
    Unlimited,
    /// EC2's token bucket per action, and the benchmark's latency on every call.
    Limited,
}

impl Mode {
    /// The name in the table and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unlimited => "unlimited",
            Self::Limited => "buckets+latency",
        }
    }
}

/// The benchmark's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// Objects created.
    pub objects: usize,
    /// Instances and Nodes.
    pub nodes: usize,
    /// Objects moved to another node.
    pub moved: usize,
    /// Latency the proxy adds to every call in [`Mode::Limited`].
    pub latency: Duration,
    /// Longest wait for one phase to converge; the phase is reported unconverged after it.
    pub phase_timeout: Duration,
    /// The runs, in order.
    pub modes: Vec<Mode>,
    /// The reconciler's `RUST_LOG`.
    pub rust_log: String,
    /// Flags added to the reconciler's command line after upstream's (tunables under study).
    pub reconciler_args: Vec<String>,
    /// Requests kept in flight when creating, moving or deleting: fewer spread a phase's
    /// requests over a longer time, as a busier API server does.
    pub in_flight: usize,
}

impl Params {
    /// Checks what the set-up can hold.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.nodes >= 2, "at least two nodes");
        ensure!(self.objects >= 1, "at least one object");
        ensure!(self.in_flight >= 1, "at least one request in flight");
        ensure!(
            self.moved <= self.objects,
            "cannot move more objects than exist"
        );
        // The subnet is a /20: 4096 addresses, the bottom ones for the instances.
        ensure!(
            self.objects + FIRST_OBJECT_OFFSET as usize <= 4090,
            "at most {} objects",
            4090 - FIRST_OBJECT_OFFSET
        );
        ensure!(
            self.nodes < FIRST_OBJECT_OFFSET as usize - 8,
            "at most {} nodes",
            FIRST_OBJECT_OFFSET - 8
        );
        Ok(())
    }
}

/// One phase's results.
#[derive(Clone, Debug)]
pub struct PhaseResult {
    /// `add`, `move` or `delete`.
    pub name: &'static str,
    /// Objects the phase acted on.
    pub ips: usize,
    /// Creating, patching or deleting the objects.
    pub submit_seconds: f64,
    /// From the last request's answer to convergence; `None` if it did not converge in time.
    pub converge_seconds: Option<f64>,
    /// Objects in their final state at the end of the wait (of all objects, for a move).
    pub done: usize,
    /// Calls seen by the proxy during the phase (until it was quiet after convergence), per route.
    pub calls: BTreeMap<String, RouteCounts>,
    /// IPs the reconciler's own metric says its mutating calls carried.
    pub reconciler_ips_carried: f64,
    /// Writes of the attachment ledger's pages (`cloudnet_ledger_writes_total`).
    pub ledger_writes: f64,
    /// Objects that showed `Assigned=False` with a message about throttling.
    pub throttle_condition_objects: usize,
    /// The reconciler's VmHWM at the end of the phase.
    pub peak_rss_bytes: u64,
}

impl PhaseResult {
    fn sum(&self, select: impl Fn(&str) -> bool, field: impl Fn(&RouteCounts) -> u64) -> u64 {
        self.calls
            .iter()
            .filter(|(route, _)| select(route))
            .map(|(_, c)| field(c))
            .sum()
    }

    /// Mutating calls sent (forwarded or throttled).
    pub fn mutating_sent(&self) -> u64 {
        self.sum(is_mutation, RouteCounts::total)
    }

    /// Mutating calls that reached EC2.
    pub fn mutating_forwarded(&self) -> u64 {
        self.sum(is_mutation, |c| c.forwarded)
    }

    /// `Describe*` calls sent.
    pub fn reads_sent(&self) -> u64 {
        self.sum(is_read, RouteCounts::total)
    }

    /// Throttled answers on every route.
    pub fn throttled(&self) -> u64 {
        self.sum(|_| true, |c| c.throttled)
    }

    /// Calls sent (forwarded or throttled) on `route`.
    pub fn route_sent(&self, route: &str) -> u64 {
        self.sum(|r| r == route, RouteCounts::total)
    }

    /// Upstream's time for this phase ([`UPSTREAM_SECONDS`]) over this run's convergence after
    /// the last request; `None` at another set-up or unconverged.
    pub fn speedup_over_upstream(&self, params: &Params) -> Option<f64> {
        let upstream = upstream_seconds(params, self.name)?;
        self.converge_seconds.map(|s| upstream / s.max(0.001))
    }

    /// Addresses named by the forwarded mutating calls over those calls.
    pub fn ips_per_mutating_call(&self) -> Option<f64> {
        let calls = self.mutating_forwarded();
        (calls > 0).then(|| self.sum(is_mutation, |c| c.addresses) as f64 / calls as f64)
    }
}

/// The upstream controller's seconds per phase at 200 objects over 20 nodes, 40 moved, on moto
/// (its own command line, an optimised build, measured beside cloudnet on one machine: issue 44).
/// Its module is not served by the module proxy, so these figures are the reference.
pub const UPSTREAM_SECONDS: [(&str, f64); 3] = [("add", 158.9), ("move", 82.7), ("delete", 120.3)];

/// Upstream's seconds for `phase` when `params` is the set-up they were measured at.
fn upstream_seconds(params: &Params, phase: &str) -> Option<f64> {
    let same = (params.objects, params.nodes, params.moved) == (200, 20, 40);
    UPSTREAM_SECONDS
        .iter()
        .find(|(name, _)| same && *name == phase)
        .map(|(_, seconds)| *seconds)
}

/// The add phase's API floor (see [`crate::bench::api_floor`]): the creates and the protocol's writes
/// for every IP, pushed by a plain client before the reconciler starts.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddFloor {
    /// With one Event per IP, as the reconciler writes.
    pub with_events_seconds: f64,
    /// Without Events, as upstream writes.
    pub without_events_seconds: f64,
}

/// One run's results.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The EC2 it ran against.
    pub mode: Mode,
    /// The add phase's API floor on this run's control plane; `None` with `BENCH_FLOOR=0`.
    pub floor: Option<AddFloor>,
    /// Calls from the reconciler's start until every node was annotated.
    pub startup_calls: BTreeMap<String, RouteCounts>,
    /// Seconds from the reconciler's start until every node was annotated.
    pub startup_seconds: f64,
    /// The phases.
    pub phases: Vec<PhaseResult>,
}

fn is_mutation(route: &str) -> bool {
    EC2_MUTATIONS.contains(&route)
}

fn is_read(route: &str) -> bool {
    route.starts_with("Describe")
}

/// Runs every mode of `params` in turn.
pub async fn run(params: &Params) -> Result<Vec<RunResult>> {
    params.validate()?;
    let mut results = Vec::new();
    for mode in &params.modes {
        eprintln!("bench-aws: {} run", mode.name());
        results.push(run_once(params, *mode).await?);
    }
    Ok(results)
}

/// One fresh system: control plane, moto, proxy, reconciler.
async fn run_once(params: &Params, mode: Mode) -> Result<RunResult> {
    let cp = ControlPlane::start_with_crd().await?;
    let moto = MotoServer::start().await?;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await?;
    if mode == Mode::Limited {
        proxy.set_token_buckets(TokenBuckets::ec2());
        proxy.set_rule(RouteMatch::Any, Rule::PASS.with_latency(params.latency));
    }
    let client = cp.client().await?;
    create_namespace(&client, NAMESPACE).await?;

    let (network, _, node_names) = fleet(&moto, &client, params.nodes, "bench-aws").await?;

    let first = u32::from(network.ipv4.network()) + FIRST_OBJECT_OFFSET;
    let ips: Vec<String> = (0..params.objects)
        .map(|i| IpAddr::from(Ipv4Addr::from(first + i as u32)).to_string())
        .collect();
    let plan = Plan::new(params, &node_names);

    // Before the reconciler starts, which would act on the floor's objects.
    let floor = if std::env::var("BENCH_FLOOR").is_ok_and(|v| v == "0") {
        None
    } else {
        let mut floor = AddFloor::default();
        for (events, seconds) in [
            (Events::One, &mut floor.with_events_seconds),
            (Events::None, &mut floor.without_events_seconds),
        ] {
            *seconds = api_floor::add(&client, params.objects, params.nodes, events)
                .await?
                .as_secs_f64();
            api_floor::clear(&client).await?;
        }
        Some(floor)
    };

    let metrics_addr = free_addr()?;
    let mut command =
        reconciler_command(&cp, REGION, proxy.url(), metrics_addr, cp.kubeconfig_path())?;
    command.args(&params.reconciler_args);
    command.env("RUST_LOG", &params.rust_log);
    let log = cp.dir().join("bench-aws-reconciler.log");
    let started = Instant::now();
    let mut reconciler = Supervised::spawn("cloudnet-reconciler", command, &log)?;
    let metrics_url = format!("http://{metrics_addr}/metrics");
    wait_annotated(&client, &node_names, &mut reconciler, params.phase_timeout).await?;
    let startup_seconds = started.elapsed().as_secs_f64();
    settle(&proxy).await;
    let startup_calls = proxy.all_counts();

    let api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let (cache, writer) = reflector::store();
    let throttled_objects: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let seen = Arc::clone(&throttled_objects);
    let watch = reflector(writer, watcher(api.clone(), watcher::Config::default()))
        .applied_objects()
        .for_each(move |object| {
            if let Ok(object) = object
                && shows_throttling(&object)
                && let Some(name) = object.metadata.name
            {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(name);
            }
            std::future::ready(())
        });
    let watch = tokio::spawn(watch);
    cache
        .wait_until_ready()
        .await
        .context("the objects' watch")?;

    let mut phase = PhaseRun {
        proxy: &proxy,
        cache: &cache,
        throttled_objects: &throttled_objects,
        metrics_url: &metrics_url,
        reconciler: &mut reconciler,
        timeout: params.phase_timeout,
    };
    let mut phases = Vec::new();

    let add_target: HashMap<String, String> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| (ip.clone(), plan.initial(i).to_owned()))
        .collect();
    phases.push(
        phase
            .run("add", ips.len(), Final::Assigned(&add_target), || {
                stream::iter(ips.iter().enumerate()).for_each_concurrent(
                    params.in_flight,
                    |(i, ip)| {
                        let api = api.clone();
                        let object = CloudPrivateIPConfig::new(
                            ip,
                            CloudPrivateIPConfigSpec {
                                node: plan.initial(i).to_owned(),
                            },
                        );
                        async move {
                            if let Err(e) = api.create(&PostParams::default(), &object).await {
                                eprintln!("create {ip}: {e}");
                            }
                        }
                    },
                )
            })
            .await?,
    );

    let moved: Vec<(usize, &str)> = plan.moves.iter().map(|(i, n)| (*i, n.as_str())).collect();
    let mut move_target = add_target.clone();
    for (i, node) in &moved {
        move_target.insert(ips[*i].clone(), (*node).to_owned());
    }
    phases.push(
        phase
            .run("move", moved.len(), Final::Assigned(&move_target), || {
                stream::iter(moved.iter()).for_each_concurrent(params.in_flight, |(i, node)| {
                    let api = api.clone();
                    let ip = &ips[*i];
                    let patch = Patch::Merge(json!({ "spec": { "node": node } }));
                    async move {
                        if let Err(e) = api.patch(ip, &PatchParams::default(), &patch).await {
                            eprintln!("move {ip}: {e}");
                        }
                    }
                })
            })
            .await?,
    );

    phases.push(
        phase
            .run("delete", ips.len(), Final::Gone, || {
                stream::iter(ips.iter()).for_each_concurrent(params.in_flight, |ip| {
                    let api = api.clone();
                    async move {
                        if let Err(e) = api.delete(ip, &DeleteParams::default()).await {
                            eprintln!("delete {ip}: {e}");
                        }
                    }
                })
            })
            .await?,
    );
    watch.abort();

    // The reconciler's warnings (failed calls, retries) explain extra calls.
    let dir = cache_root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let kept = dir.join(format!("aws-reconciler-{}.log", mode_slug(mode)));
    if std::fs::copy(&log, &kept).is_ok() {
        eprintln!("bench-aws: reconciler log kept as {}", kept.display());
    }
    drop(reconciler);
    Ok(RunResult {
        mode,
        floor,
        startup_calls,
        startup_seconds,
        phases,
    })
}

/// An EC2 client straight to moto, for the set-up: its calls are neither metered nor counted.
fn setup_client(moto: &MotoServer) -> Result<aws_sdk_ec2::Client> {
    Ok(build_sdk_client(
        &ClientSettings {
            region: REGION.into(),
            endpoint: Some(moto.url().to_owned()),
            sts_endpoint: None,
            ca_bundle_pem: None,
            call_timeout: Duration::from_secs(300),
        },
        &AwsCredentials {
            access_key_id: Secret::new("AKIDCLOUDNETBENCH"),
            secret_access_key: Secret::new("cloudnet-bench-secret"),
            session_token: None,
        }
        .into(),
    )?)
}

/// `count` instances in a new VPC's /19 (room for 2,000 instances and 6,000 more addresses),
/// each registered as Node `<prefix>-<n>`: the instances, the network and the Nodes' names. The
/// set-up talks to moto directly.
pub(crate) async fn fleet(
    moto: &MotoServer,
    client: &Client,
    count: usize,
    prefix: &str,
) -> Result<(ec2::Network, Vec<ec2::Instance>, Vec<String>)> {
    let ec2 = setup_client(moto)?;
    let network = ec2::create_network_sized(&ec2, "10.0.0.0/16".parse()?, 19).await?;
    let mut instances = Vec::new();
    while instances.len() < count {
        // Runs of 250 bound the size of each RunInstances answer moto builds and sends.
        let batch = i32::try_from((count - instances.len()).min(250))?;
        instances.extend(ec2::run_instances(&ec2, &network, INSTANCE_TYPE, batch).await?);
    }
    ensure!(
        instances.len() == count,
        "moto ran {} instances",
        instances.len()
    );
    let names: Vec<String> = (0..count).map(|n| format!("{prefix}-{n:05}")).collect();
    create_nodes(client, &names, &instances).await?;
    Ok((network, instances, names))
}

/// Registers a Node named `names[i]` for each of `instances[i]`, as the kubelet would.
async fn create_nodes(
    client: &Client,
    names: &[String],
    instances: &[ec2::Instance],
) -> Result<()> {
    stream::iter(names.iter().zip(instances))
        .map(|(name, instance)| plugin::create_node(client, name, instance))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

fn mode_slug(mode: Mode) -> &'static str {
    match mode {
        Mode::Unlimited => "unlimited",
        Mode::Limited => "limited",
    }
}

/// Where every object lives, before and after the move.
struct Plan {
    nodes: Vec<String>,
    /// (object index, new node) for the moved objects.
    moves: Vec<(usize, String)>,
}

impl Plan {
    /// Object `i` starts on node `i % nodes`. The moved objects are those of the first nodes
    /// (the nodes "failing"), taken node by node; they go round-robin to the nodes that lose none.
    fn new(params: &Params, nodes: &[String]) -> Self {
        let n = nodes.len();
        let mut order: Vec<usize> = (0..params.objects).collect();
        order.sort_by_key(|i| (i % n, *i));
        order.truncate(params.moved);
        let sources: BTreeSet<usize> = order.iter().map(|i| i % n).collect();
        let mut receivers: Vec<usize> = (0..n).filter(|k| !sources.contains(k)).collect();
        if receivers.is_empty() {
            receivers = (0..n).collect();
        }
        let moves = order
            .iter()
            .enumerate()
            .map(|(k, i)| {
                let mut to = receivers[k % receivers.len()];
                if to == i % n {
                    to = (to + 1) % n;
                }
                (*i, nodes[to].clone())
            })
            .collect();
        Self {
            nodes: nodes.to_vec(),
            moves,
        }
    }

    fn initial(&self, i: usize) -> &str {
        &self.nodes[i % self.nodes.len()]
    }
}

/// What a phase waits for.
enum Final<'a> {
    /// Every object `Assigned=True` on the node the map names.
    Assigned(&'a HashMap<String, String>),
    /// No object left.
    Gone,
}

impl Final<'_> {
    /// Objects, of the `ips` the phase acts on, in their final state.
    fn done(&self, cache: &Store<CloudPrivateIPConfig>, ips: usize) -> usize {
        match self {
            Self::Assigned(target) => assigned_on(cache, target),
            Self::Gone => ips.saturating_sub(cache.state().len()),
        }
    }
}

/// What every phase shares.
struct PhaseRun<'a> {
    proxy: &'a FaultProxy,
    cache: &'a Store<CloudPrivateIPConfig>,
    throttled_objects: &'a Mutex<BTreeSet<String>>,
    metrics_url: &'a str,
    reconciler: &'a mut Supervised,
    timeout: Duration,
}

impl PhaseRun<'_> {
    /// Submits the phase's requests, waits for `end`, lets the proxy go quiet, and reads the
    /// counts of the phase.
    async fn run<F, Fut>(
        &mut self,
        name: &'static str,
        ips: usize,
        end: Final<'_>,
        submit: F,
    ) -> Result<PhaseResult>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = ()>,
    {
        let before = self.proxy.all_counts();
        let (carried_before, ledger_before) = self.reconciler_counts().await?;
        self.throttled_objects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let start = Instant::now();
        submit().await;
        let submitted = Instant::now();
        let deadline = submitted + self.timeout;
        // Every object must end in its final state, not only the ones the phase touched.
        let wanted = match end {
            Final::Assigned(target) => target.len(),
            Final::Gone => ips,
        };
        let mut done = end.done(self.cache, wanted);
        while done < wanted && Instant::now() < deadline {
            if let Some(status) = self.reconciler.exited() {
                bail!(
                    "the reconciler exited: {status}\n{}",
                    self.reconciler.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            done = end.done(self.cache, wanted);
        }
        let converged = (done >= wanted).then(|| submitted.elapsed().as_secs_f64());
        if converged.is_none() {
            eprintln!(
                "bench-aws: {name} did not converge within {:?}: {done}/{wanted}",
                self.timeout
            );
        }
        settle(self.proxy).await;
        let after = self.proxy.all_counts();
        let (carried_after, ledger_after) = self.reconciler_counts().await?;
        let throttle_condition_objects = self
            .throttled_objects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        Ok(PhaseResult {
            name,
            ips,
            submit_seconds: (submitted - start).as_secs_f64(),
            converge_seconds: converged,
            done,
            calls: delta(&after, &before),
            reconciler_ips_carried: carried_after - carried_before,
            ledger_writes: ledger_after - ledger_before,
            throttle_condition_objects,
            peak_rss_bytes: peak_rss_bytes(self.reconciler.pid()),
        })
    }

    /// The reconciler's `cloudnet_cloud_call_ips_total` over every operation, and its
    /// `cloudnet_ledger_writes_total`.
    async fn reconciler_counts(&self) -> Result<(f64, f64)> {
        let text = metrics::scrape(self.metrics_url).await?;
        Ok((
            metrics::sum(&text, "cloudnet_cloud_call_ips_total", &[]),
            metrics::sum(&text, "cloudnet_ledger_writes_total", &[]),
        ))
    }
}

/// Whether `object` shows `Assigned=False` for a throttled cloud call.
fn shows_throttling(object: &CloudPrivateIPConfig) -> bool {
    object.assigned_condition().is_some_and(|c| {
        let message = c.message.to_lowercase();
        c.status == "False"
            && (message.contains("throttl") || message.contains("requestlimitexceeded"))
    })
}

/// Waits until the proxy has seen no call for [`QUIET`] (at most [`SETTLE_LIMIT`]), so calls a
/// phase caused after its objects converged (reads confirming a change) are booked to it.
pub(crate) async fn settle(proxy: &FaultProxy) {
    let total = |p: &FaultProxy| p.all_counts().values().map(RouteCounts::total).sum::<u64>();
    let limit = Instant::now() + SETTLE_LIMIT;
    let mut last = total(proxy);
    let mut quiet_since = Instant::now();
    while Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = total(proxy);
        if now != last {
            last = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= QUIET {
            return;
        }
    }
}

pub(crate) fn delta(
    after: &BTreeMap<String, RouteCounts>,
    before: &BTreeMap<String, RouteCounts>,
) -> BTreeMap<String, RouteCounts> {
    after
        .iter()
        .map(|(route, a)| {
            let b = before.get(route).copied().unwrap_or_default();
            let d = RouteCounts {
                forwarded: a.forwarded - b.forwarded,
                throttled: a.throttled - b.throttled,
                server_errors: a.server_errors - b.server_errors,
                dropped: a.dropped - b.dropped,
                not_found: a.not_found - b.not_found,
                refused: a.refused - b.refused,
                unauthorized: a.unauthorized - b.unauthorized,
                addresses: a.addresses - b.addresses,
                held: a.held - b.held,
            };
            (route.clone(), d)
        })
        .filter(|(_, d)| d.total() > 0)
        .collect()
}

/// Waits until every node carries the reconciler's egress annotation: the reconciler is up,
/// leading, and has read every instance once.
pub(crate) async fn wait_annotated(
    client: &Client,
    nodes: &[String],
    reconciler: &mut Supervised,
    timeout: Duration,
) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let wanted: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = reconciler.exited() {
            bail!(
                "the reconciler exited: {status}\n{}",
                reconciler.log_tail(30)
            );
        }
        let list = api.list_metadata(&ListParams::default()).await?;
        let annotated = list
            .items
            .iter()
            .filter(|n| {
                n.metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| wanted.contains(name))
                    && n.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(EGRESS_IPCONFIG_ANNOTATION))
            })
            .count();
        if annotated == nodes.len() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{annotated}/{} nodes annotated after {timeout:?}\n{}",
            nodes.len(),
            reconciler.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The IPv4 routes that carry a phase's IPs.
const ASSIGN: &str = "AssignPrivateIpAddresses";
const UNASSIGN: &str = "UnassignPrivateIpAddresses";

fn per_ip(n: u64, ips: usize) -> f64 {
    n as f64 / ips.max(1) as f64
}

pub(crate) fn counts_json(calls: &BTreeMap<String, RouteCounts>) -> Value {
    calls
        .iter()
        .map(|(route, c)| {
            (
                route.clone(),
                json!({
                    "forwarded": c.forwarded,
                    "throttled": c.throttled,
                    "server_errors": c.server_errors,
                    "dropped": c.dropped,
                    "not_found": c.not_found,
                    "addresses": c.addresses,
                }),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The limits of the limited runs' buckets, by class and by route.
pub(crate) fn buckets_json(buckets: &TokenBuckets) -> serde_json::Value {
    let limits = |l: &BucketLimits| serde_json::json!({"capacity": l.capacity, "refill_per_second": l.refill_per_second});
    let routes: serde_json::Map<String, serde_json::Value> = buckets
        .routes
        .iter()
        .map(|(route, l)| (route.clone(), limits(l)))
        .collect();
    serde_json::json!({
        "mutating": limits(&buckets.mutating),
        "non_mutating": limits(&buckets.non_mutating),
        "routes": routes,
    })
}

/// Prints the table and writes the JSON to `$CLOUDNET_CACHE_DIR/bench/`; returns its path.
pub fn report(params: &Params, runs: &[RunResult]) -> Result<PathBuf> {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "EC2 (moto) benchmark: {} objects over {} nodes, {} moved; limited runs: EC2's token \
         buckets per action (Assign*/UnassignPrivateIpAddresses 100 + 5/s, other mutating 50 + \
         5/s, DescribeInstances/DescribeNetworkInterfaces 50 + 10/s, other Describe* 100 + 20/s) \
         and {} ms per call; load {}",
        params.objects,
        params.nodes,
        params.moved,
        params.latency.as_millis(),
        load.trim()
    );
    println!(
        "{:<16} {:<6} {:>5} {:>8} {:>10} {:>9} {:>7} {:>7} {:>7} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9}",
        "run",
        "phase",
        "ips",
        "submit s",
        "converge s",
        "upstream",
        "mut/ip",
        "asg/ip",
        "una/ip",
        "reads/ip",
        "ledger/ip",
        "ips/call",
        "throttled",
        "thr objs",
        "rss MiB"
    );
    let mut runs_json = Vec::new();
    for run in runs {
        let mut phases_json = Vec::new();
        for p in &run.phases {
            let converge = p.converge_seconds.map_or_else(
                || format!("> {}", params.phase_timeout.as_secs()),
                |s| format!("{s:.2}"),
            );
            let ips_per_call = p.ips_per_mutating_call();
            let speedup = p.speedup_over_upstream(params);
            let assign = per_ip(p.route_sent(ASSIGN), p.ips);
            let unassign = per_ip(p.route_sent(UNASSIGN), p.ips);
            let ledger = p.ledger_writes / p.ips.max(1) as f64;
            println!(
                "{:<16} {:<6} {:>5} {:>8.2} {:>10} {:>9} {:>7.2} {:>7.2} {:>7.2} {:>8.2} {:>9.2} {:>8} {:>9} {:>8} {:>9.1}",
                run.mode.name(),
                p.name,
                p.ips,
                p.submit_seconds,
                converge,
                speedup.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}x")),
                per_ip(p.mutating_sent(), p.ips),
                assign,
                unassign,
                per_ip(p.reads_sent(), p.ips),
                ledger,
                ips_per_call.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}")),
                p.throttled(),
                p.throttle_condition_objects,
                p.peak_rss_bytes as f64 / 1048576.0,
            );
            let routes: Vec<String> = p
                .calls
                .iter()
                .map(|(route, c)| {
                    let throttled = if c.throttled > 0 {
                        format!(" ({} throttled)", c.throttled)
                    } else {
                        String::new()
                    };
                    format!("{route} {:.2}/ip{throttled}", per_ip(c.total(), p.ips))
                })
                .collect();
            println!("    {}", routes.join(", "));
            let forwarded = p.mutating_forwarded();
            phases_json.push(json!({
                "phase": p.name,
                "ips": p.ips,
                "submit_seconds": p.submit_seconds,
                "converge_seconds_after_last_request": p.converge_seconds,
                "converged": p.converge_seconds.is_some(),
                "objects_done": p.done,
                "mutating_calls_sent": p.mutating_sent(),
                "mutating_calls_forwarded": forwarded,
                "mutating_calls_per_ip": per_ip(p.mutating_sent(), p.ips),
                "assign_calls_per_ip": assign,
                "unassign_calls_per_ip": unassign,
                "ledger_writes": p.ledger_writes,
                "ledger_writes_per_ip": ledger,
                "upstream_seconds": upstream_seconds(params, p.name),
                "speedup_over_upstream": speedup,
                "reads_sent": p.reads_sent(),
                "reads_per_ip": per_ip(p.reads_sent(), p.ips),
                "ips_per_mutating_call": ips_per_call,
                "ips_per_mutating_call_from_reconciler_metric":
                    (forwarded > 0).then(|| p.reconciler_ips_carried / forwarded as f64),
                "throttled_answers": p.throttled(),
                "objects_with_throttling_condition": p.throttle_condition_objects,
                "peak_rss_bytes": p.peak_rss_bytes,
                "calls_per_route": counts_json(&p.calls),
            }));
        }
        let add_total = run
            .phases
            .iter()
            .find(|p| p.name == "add")
            .and_then(|p| Some(p.submit_seconds + p.converge_seconds?));
        if let (Some(floor), Some(total)) = (run.floor, add_total) {
            println!(
                "    {} add: {total:.2} s from the first create, {:.2}x the API floor ({:.2} s: \
                 the same creates and the protocol's writes by a plain client, one Event per IP; \
                 {:.2} s without the Events)",
                run.mode.name(),
                total / floor.with_events_seconds,
                floor.with_events_seconds,
                floor.without_events_seconds,
            );
        }
        runs_json.push(json!({
            "mode": run.mode.name(),
            "add_seconds_from_first_create": add_total,
            "add_api_floor_seconds": run.floor.map(|f| f.with_events_seconds),
            "add_api_floor_without_events_seconds": run.floor.map(|f| f.without_events_seconds),
            "startup_seconds": run.startup_seconds,
            "startup_calls_per_route": counts_json(&run.startup_calls),
            "phases": phases_json,
        }));
    }
    let doc = json!({
        "objects": params.objects,
        "nodes": params.nodes,
        "moved": params.moved,
        "instance_type": INSTANCE_TYPE.as_str(),
        "limited_latency_ms": params.latency.as_millis() as u64,
        "limited_buckets": buckets_json(&TokenBuckets::ec2()),
        "phase_timeout_seconds": params.phase_timeout.as_secs(),
        "reconciler": "separate process, upstream's flags, EC2 through the fault proxy",
        "reconciler_args": params.reconciler_args,
        "requests_in_flight": params.in_flight,
        "upstream_reference": "upstream's seconds per phase at 200 objects over 20 nodes, 40 moved \
                     (issue 44); speedup = those over converge seconds after the last request",
        "counting": "calls per IP count every call the reconciler sent (forwarded or throttled); \
                     IPs per mutating call = addresses named by forwarded mutating calls / those calls",
        "runs": runs_json,
        "loadavg": load.trim(),
    });
    crate::bench::write_results(&format!("aws-{}x{}", params.objects, params.nodes), &doc)
}

/// EC2 calls per IP moved, from the proxy's counts of a benchmark's rounds.
pub(crate) struct CallsPerIp {
    /// Mutating calls (assign, unassign) per IP.
    pub(crate) mutating: f64,
    /// `Describe*` calls per IP.
    pub(crate) reads: f64,
    /// Throttled answers in all.
    pub(crate) throttled: u64,
    /// Each action's calls per IP, for the printed line.
    pub(crate) routes: String,
}

impl CallsPerIp {
    /// `calls` (by route) over `moved` IPs.
    pub(crate) fn of(calls: &BTreeMap<String, RouteCounts>, moved: f64) -> Self {
        let per_ip = |select: &dyn Fn(&str) -> bool| {
            calls
                .iter()
                .filter(|(route, _)| select(route))
                .map(|(_, c)| c.total())
                .sum::<u64>() as f64
                / moved
        };
        let routes: Vec<String> = calls
            .iter()
            .map(|(route, c)| {
                let throttled = if c.throttled > 0 {
                    format!(" ({} throttled)", c.throttled)
                } else {
                    String::new()
                };
                format!("{route} {:.3}{throttled}", c.total() as f64 / moved)
            })
            .collect();
        Self {
            mutating: per_ip(&|r| EC2_MUTATIONS.contains(&r)),
            reads: per_ip(&|r| r.starts_with("Describe")),
            throttled: calls.values().map(|c| c.throttled).sum(),
            routes: routes.join(", "),
        }
    }

    /// Prints the line the benchmarks report calls with.
    pub(crate) fn print(&self) {
        println!(
            "cloud calls per IP moved: mutating {:.3}, reads {:.3}, throttled answers {}; by \
             action: {}",
            self.mutating, self.reads, self.throttled, self.routes
        );
    }
}
