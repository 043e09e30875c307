//! The reconciler's cloud engine (per-VM lanes) over the GCP provider, against the GCE fake
//! behind the fault proxy: attach N IPs over M VMs at once, move some, delete all, and count
//! the GCE calls of each phase. Used by `tests/providers/gcp_batching.rs` (which asserts the call counts)
//! and by the `bench-gcp` binary (which reports them with the times; never asserted).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use cloudnet_reconciler::cloud::gcp::{GcpProvider, GcpSettings, RetryPolicy};
use cloudnet_reconciler::cloud::pace::{Pacing, Spend};
use cloudnet_reconciler::cloud::{
    Change, CloudError, CloudProvider, NodeEgress, NodeTarget, ProviderNeeds,
};
use cloudnet_reconciler::engine::Interfaces;
use cloudnet_reconciler::engine::Ledger;
use cloudnet_reconciler::engine::{Gather, Lanes, Mutation};
use cloudnet_reconciler::metrics::Metrics;
use futures::future::join_all;
use ipnet::Ipv4Net;

use crate::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule};
use crate::fakes::gce::{self, GceFake, InstanceSpec, PROJECT, REGION, SubnetSpec, ZONE};

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// IPs (objects).
    pub objects: usize,
    /// VMs (nodes); IP `i` goes on VM `i % nodes`.
    pub nodes: usize,
    /// IPs moved to the next VM in the second phase.
    pub moved: usize,
    /// Latency the proxy adds to every call.
    pub latency: Duration,
    /// Probability of a 429 `rateLimitExceeded` on every call.
    pub throttle: f64,
    /// How long the fake's operations take to be DONE.
    pub operation_delay: Duration,
}

/// GCE calls of one phase, at the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseCalls {
    /// IPs the phase changed.
    pub ips: u64,
    /// Changes the engine handed the provider (one per (VM, batch) pair).
    pub batches: u64,
    /// `updateNetworkInterface` calls that reached the fake.
    pub patches: u64,
    /// `updateNetworkInterface` calls throttled or failed by the proxy.
    pub patches_injected: u64,
    /// `instances.get` calls (forwarded).
    pub reads: u64,
    /// `zoneOperations.get` calls (forwarded): polls until the operation is DONE.
    pub op_polls: u64,
    /// `subnetworks.get` calls (forwarded).
    pub subnet_reads: u64,
    /// Every call the proxy saw, injected answers included.
    pub total: u64,
    /// Wall time from the first submit to the last answer.
    pub millis: u64,
}

/// The whole run.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Attach `objects` IPs.
    pub attach: PhaseCalls,
    /// Move `moved` IPs (detach, then attach elsewhere).
    pub moves: PhaseCalls,
    /// Detach every IP.
    pub delete: PhaseCalls,
    /// Schema departures the fake recorded (must be none).
    pub violations: Vec<String>,
}

impl PhaseCalls {
    /// The counts as JSON, with calls per IP.
    pub fn to_json(&self) -> serde_json::Value {
        let per_ip = |n: u64| {
            if self.ips == 0 {
                0.0
            } else {
                n as f64 / self.ips as f64
            }
        };
        serde_json::json!({
            "ips": self.ips, "batches": self.batches, "patches": self.patches,
            "patches_injected": self.patches_injected, "reads": self.reads, "op_polls": self.op_polls,
            "subnet_reads": self.subnet_reads, "total_calls": self.total, "millis": self.millis,
            "patches_per_ip": per_ip(self.patches), "calls_per_ip": per_ip(self.total),
        })
    }
}

/// Counts the engine's changes on their way to the provider.
struct Counting {
    inner: Arc<GcpProvider>,
    applies: AtomicU64,
}

#[async_trait]
impl CloudProvider for Counting {
    fn needs(&self) -> ProviderNeeds {
        self.inner.needs()
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        self.inner.resolve(node_name, provider_id).await
    }

    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        self.applies.fetch_add(1, Ordering::Relaxed);
        self.inner.apply(node, change, known).await
    }

    async fn write_budget(&self, spend: Spend) {
        self.inner.write_budget(spend).await;
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        self.inner.egress_config(node).await
    }

    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        self.inner.egress_configs(nodes).await
    }
}

/// Runs the three phases and returns their counts.
pub async fn run(params: Params) -> Result<Outcome> {
    if params.nodes == 0 || params.objects > 60_000 {
        bail!("need at least one node and at most 60,000 objects");
    }
    let fake = GceFake::start().await?;
    fake.set_operation_delay(params.operation_delay);
    let subnet = SubnetSpec {
        project: gce::HOST_PROJECT.into(),
        region: REGION.into(),
        name: "bench".into(),
        primary: Ipv4Net::new(Ipv4Addr::new(10, 1, 0, 0), 16)?,
        secondary: Vec::new(),
        ipv6: None,
    };
    fake.add_subnet(subnet.clone());
    let key = (subnet.project, subnet.region, subnet.name);
    for n in 0..params.nodes {
        let ip = u32::from(Ipv4Addr::new(10, 1, 255, 0)) - u32::try_from(n)? - 3;
        fake.add_instance(InstanceSpec {
            project: PROJECT.into(),
            zone: ZONE.into(),
            name: format!("vm-{n}"),
            subnet: key.clone(),
            network_ip: Ipv4Addr::from(ip),
        })?;
    }
    let proxy = FaultProxy::builder(fake.url(), Dialect::Gce)
        .start()
        .await?;
    proxy.reseed(11);
    proxy.set_rule(
        RouteMatch::prefix(""),
        Rule::PASS
            .with_latency(params.latency)
            .with_throttle(params.throttle),
    );
    let secrets = tempfile_dir()?;
    gce::write_service_account(&secrets)?;
    let mut settings = GcpSettings::new(proxy.url());
    settings.retry = RetryPolicy {
        min_delay: Duration::from_millis(50),
        max_delay: Duration::from_secs(1),
        max_attempts: 20,
        ..RetryPolicy::default()
    };
    settings.pacing = Pacing::UNLIMITED;
    let provider = Arc::new(GcpProvider::from_secret_dir(&settings, &secrets).await?);
    let counting = Arc::new(Counting {
        inner: provider,
        applies: AtomicU64::new(0),
    });
    let cloud: Arc<dyn CloudProvider> = counting.clone();
    let metrics = Arc::new(Metrics::default());
    let interfaces = Arc::new(Interfaces::new(Arc::clone(&cloud), Arc::clone(&metrics)));
    let gather = Gather {
        quiet: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };
    // The lanes alone are measured here: the ledger stays in memory.
    let ledger = Arc::new(Ledger::in_memory(Arc::clone(&metrics)));
    let lanes = Arc::new(Lanes::new(cloud, metrics, interfaces, ledger, 64, gather));
    let mut targets = Vec::with_capacity(params.nodes);
    for n in 0..params.nodes {
        let name = format!("vm-{n}");
        targets.push(
            counting
                .resolve(&name, &format!("gce://{PROJECT}/{ZONE}/{name}"))
                .await?,
        );
    }
    let ip_of = |i: usize| -> IpAddr {
        let base = u32::from(Ipv4Addr::new(10, 1, 0, 10));
        IpAddr::V4(Ipv4Addr::from(base + u32::try_from(i).unwrap_or(0)))
    };
    let node_of = |i: usize| i % params.nodes;

    let phase = |jobs: Vec<(usize, Mutation, IpAddr)>| {
        let lanes = Arc::clone(&lanes);
        let targets = targets.clone();
        async move {
            let results = join_all(jobs.into_iter().map(|(n, m, ip)| {
                let lanes = Arc::clone(&lanes);
                let target = targets[n].clone();
                async move { submit_until_done(&lanes, &target, m, ip).await }
            }))
            .await;
            results.into_iter().collect::<Result<Vec<()>>>().map(drop)
        }
    };

    let mut outcome = Outcome::default();
    let attach: Vec<_> = (0..params.objects)
        .map(|i| (node_of(i), Mutation::Attach, ip_of(i)))
        .collect();
    outcome.attach = measure(&proxy, &counting, params.objects, phase(attach)).await?;

    let moved = params.moved.min(params.objects);
    let started = Instant::now();
    let before = counting.applies.load(Ordering::Relaxed);
    proxy.reset_counts();
    let detach: Vec<_> = (0..moved)
        .map(|i| (node_of(i), Mutation::Detach, ip_of(i)))
        .collect();
    phase(detach).await?;
    let reattach: Vec<_> = (0..moved)
        .map(|i| ((node_of(i) + 1) % params.nodes, Mutation::Attach, ip_of(i)))
        .collect();
    phase(reattach).await?;
    outcome.moves = calls(
        &proxy,
        moved,
        counting.applies.load(Ordering::Relaxed) - before,
        started,
    );

    let delete: Vec<_> = (0..params.objects)
        .map(|i| {
            let n = if i < moved {
                (node_of(i) + 1) % params.nodes
            } else {
                node_of(i)
            };
            (n, Mutation::Detach, ip_of(i))
        })
        .collect();
    outcome.delete = measure(&proxy, &counting, params.objects, phase(delete)).await?;
    for n in 0..params.nodes {
        let left = fake.aliases(PROJECT, ZONE, &format!("vm-{n}"));
        if !left.is_empty() {
            bail!("vm-{n} still holds {left:?} after the delete phase");
        }
    }
    outcome.violations = fake.violations();
    let _ = std::fs::remove_dir_all(&secrets);
    Ok(outcome)
}

/// Submits until the engine reports success (the engine's callers retry too), bounded.
async fn submit_until_done(
    lanes: &Arc<Lanes>,
    target: &NodeTarget,
    mutation: Mutation,
    ip: IpAddr,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match lanes.submit(target, mutation, ip).await {
            Ok(()) => return Ok(()),
            Err(e)
                if Instant::now() < deadline
                    && e.kind != cloudnet_reconciler::cloud::ErrorKind::Permanent =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("{mutation:?} {ip} on {}", target.node_name));
            }
        }
    }
}

async fn measure(
    proxy: &FaultProxy,
    counting: &Counting,
    ips: usize,
    work: impl Future<Output = Result<()>>,
) -> Result<PhaseCalls> {
    proxy.reset_counts();
    let before = counting.applies.load(Ordering::Relaxed);
    let started = Instant::now();
    work.await?;
    Ok(calls(
        proxy,
        ips,
        counting.applies.load(Ordering::Relaxed) - before,
        started,
    ))
}

fn calls(proxy: &FaultProxy, ips: usize, batches: u64, started: Instant) -> PhaseCalls {
    let patch = proxy.counts("instances.updateNetworkInterface");
    PhaseCalls {
        ips: u64::try_from(ips).unwrap_or(u64::MAX),
        batches,
        patches: patch.forwarded,
        patches_injected: patch.injected(),
        reads: proxy.counts("instances.get").forwarded,
        op_polls: proxy.counts("zoneOperations.get").forwarded,
        subnet_reads: proxy.counts("subnetworks.get").forwarded,
        total: proxy.all_counts().values().map(|c| c.total()).sum(),
        millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "cloudnet-gcp-bench-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
