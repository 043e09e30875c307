//! A reconciler started over many EC2 instances with their Nodes: what a start or a leader
//! change costs. A fresh control plane, moto behind the fault proxy (metering EC2's token
//! buckets when asked), N instances in one reservation with their Nodes, then the reconciler as
//! its own process with upstream's command line; measured: the time from its leadership
//! (`cloudnet_leader 1`) to every node annotated, and the EC2 calls the proxy saw meanwhile.
//! The system is handed back running, for a caller that goes on (the reconciler tier's read
//! test, a scale benchmark).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use kube::Client;

use super::{REGION, fleet, wait_annotated};
use crate::ControlPlane;
use crate::bench::{free_addr, wait_leading};
use crate::fakes::faultproxy::{Dialect, FaultProxy, RouteCounts, TokenBuckets};
use crate::fakes::moto::MotoServer;
use crate::harness::controlplane::Supervised;
use crate::harness::e2e::ec2;
use crate::harness::e2e::local::{NAMESPACE, create_namespace, reconciler_command};

/// What to start.
#[derive(Clone, Debug)]
pub struct StartupParams {
    /// Instances, each with its Node.
    pub nodes: usize,
    /// Whether the proxy meters every EC2 action with EC2's token buckets.
    pub ec2_buckets: bool,
    /// Flags added to the reconciler's command line.
    pub reconciler_args: Vec<String>,
    /// The longest wait for leadership, and then for every node annotated.
    pub timeout: Duration,
}

/// The running system and what its start cost.
pub struct Started {
    /// The control plane.
    pub cp: ControlPlane,
    /// A client of it.
    pub client: Client,
    /// EC2.
    pub moto: MotoServer,
    /// The proxy every call of the reconciler goes through, counting them.
    pub proxy: FaultProxy,
    /// The reconciler process.
    pub reconciler: Supervised,
    /// Its metrics endpoint.
    pub metrics_url: String,
    /// The instances, in the order of `nodes`.
    pub instances: Vec<ec2::Instance>,
    /// The Nodes' names.
    pub nodes: Vec<String>,
    /// From the process's start to its leadership.
    pub to_leadership: Duration,
    /// From its leadership to every node annotated.
    pub to_annotated: Duration,
    /// The calls the proxy saw until every node was annotated, per EC2 action.
    pub calls: BTreeMap<String, RouteCounts>,
}

impl Started {
    /// `DescribeInstances` calls sent until every node was annotated (throttled ones included).
    pub fn describe_instances(&self) -> u64 {
        self.calls
            .get("DescribeInstances")
            .map_or(0, RouteCounts::total)
    }
}

/// Starts the system of `params` and waits until every node is annotated.
pub async fn start(params: &StartupParams) -> Result<Started> {
    let cp = ControlPlane::start_with_crd().await?;
    let moto = MotoServer::start().await?;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await?;
    if params.ec2_buckets {
        proxy.set_token_buckets(TokenBuckets::ec2());
    }
    let client = cp.client().await?;
    create_namespace(&client, NAMESPACE).await?;

    let (_, instances, nodes) = fleet(&moto, &client, params.nodes, "startup").await?;

    let metrics_addr = free_addr()?;
    let mut command =
        reconciler_command(&cp, REGION, proxy.url(), metrics_addr, cp.kubeconfig_path())?;
    command.args(&params.reconciler_args);
    command.env("RUST_LOG", "info");
    let log = cp.dir().join("startup-reconciler.log");
    let spawned = Instant::now();
    let mut reconciler = Supervised::spawn("cloudnet-reconciler", command, &log)?;
    let metrics_url = format!("http://{metrics_addr}/metrics");
    let led = wait_leading(&metrics_url, &mut reconciler, params.timeout).await?;
    wait_annotated(&client, &nodes, &mut reconciler, params.timeout).await?;
    let annotated = Instant::now();
    let calls = proxy.all_counts();
    Ok(Started {
        to_leadership: led - spawned,
        to_annotated: annotated - led,
        calls,
        cp,
        client,
        moto,
        proxy,
        reconciler,
        metrics_url,
        instances,
        nodes,
    })
}

/// One line per run for a report: nodes, mode, times and reads.
pub fn summary(params: &StartupParams, started: &Started) -> String {
    let mode = if params.ec2_buckets {
        "EC2 buckets"
    } else {
        "unlimited"
    };
    format!(
        "{} nodes ({mode}): leadership {:.2} s after start, every node annotated {:.2} s after \
         leadership, {} DescribeInstances calls",
        params.nodes,
        started.to_leadership.as_secs_f64(),
        started.to_annotated.as_secs_f64(),
        started.describe_instances()
    )
}
