//! cloudnet-node, the node agent of cloudnet's egress gateways (docs/node-agent.md): on the node
//! a gateway's `status.activeNode` names, it puts the gateway's egress IPs that the cloud has
//! attached to this VM on the interface of their subnet, marked as its own, and labels the node
//! `egress-gateway.cloudnet.io/<gateway>=active` once they are there; everywhere else it removes
//! what it added and the label. Every node's agent renews a heartbeat Lease the reconciler's
//! leader reads to pick healthy gateway nodes.
//!
//! The decision is [`plan`], pure; [`netlink`] and [`kube`] are the edges; [`converge`] is the
//! loop between them.

pub mod converge;
pub mod endpoint;
pub mod flags;
pub mod kube;
pub mod metrics;
pub mod netlink;
pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::converge::Converger;
use crate::endpoint::Health;
use crate::kube::heartbeat::Heartbeat;
use crate::metrics::Metrics;
use crate::netlink::Netlink;

/// What the agent runs with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This node's name.
    pub node: String,
    /// Namespace of the heartbeat Lease.
    pub lease_namespace: String,
    /// Time between heartbeats, and between resyncs of the host's addresses.
    pub heartbeat_interval: Duration,
    /// `leaseDurationSeconds` of the heartbeat Lease.
    pub lease_duration_seconds: i32,
    /// The device every egress IP goes on, instead of the one of its subnet.
    pub interface: Option<String>,
}

/// Runs the agent until `shutdown`: the heartbeat, the watches, the labeller and the address
/// loop over `netlink`'s namespace. Returning leaves every address and label in place: a rolling
/// update of the DaemonSet must not cut a gateway's traffic, and the next agent converges from
/// the API.
pub async fn run(
    client: ::kube::Client,
    netlink: Netlink,
    settings: Settings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let (snapshots_tx, snapshots) = watch::channel(None);
    let (labels_tx, labels) = watch::channel(Default::default());
    let mut tasks = tokio::task::JoinSet::new();
    let heartbeat = Heartbeat {
        node: settings.node.clone(),
        namespace: settings.lease_namespace.clone(),
        interval: settings.heartbeat_interval,
        lease_duration_seconds: settings.lease_duration_seconds,
    };
    tasks.spawn(heartbeat.run(client.clone(), Arc::clone(&metrics)));
    tasks.spawn(kube::watches::run(
        client.clone(),
        settings.node.clone(),
        snapshots_tx,
        health,
    ));
    tasks.spawn(kube::labels::run(
        client,
        settings.node.clone(),
        labels,
        settings.heartbeat_interval,
        Arc::clone(&metrics),
    ));
    let converger = Converger::new(
        netlink,
        settings.interface.clone(),
        labels_tx,
        metrics,
        settings.heartbeat_interval,
    );
    tasks.spawn(converger.run(snapshots));
    tracing::info!(node = %settings.node, "running");
    let outcome = tokio::select! {
        () = shutdown => {
            tracing::info!("stopping; addresses and labels stay as they are");
            Ok(())
        }
        Some(ended) = tasks.join_next() => Err(match ended {
            Ok(()) => RunError::TaskEnded(String::from("a loop returned")),
            Err(e) => RunError::TaskEnded(e.to_string()),
        }),
    };
    tasks.shutdown().await;
    outcome
}

/// The agent stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// One of its loops ended (they run for the process's life) or panicked.
    #[error("a loop of the agent ended: {0}")]
    TaskEnded(String),
}
