//! The address loop: whenever the API's picture changes, the host's addresses or links change
//! (netlink notifications), or a resync period passes, it reads the host, asks [`plan`] what to
//! do and does it: label removals handed to the labeller first, then the agent's stale addresses
//! removed, then the missing ones added; then it plans again at once, so a gateway whose IPs are
//! all on the device gets its label in the same pass.
//!
//! Repairs come from the notifications (an address someone removed is back within a netlink
//! round trip); the resync is the safety net for a notification the kernel dropped (a full
//! socket buffer loses them with `ENOBUFS`). It never waits on the Kubernetes API: the labeller
//! runs apart, so a slow or unreachable API server does not hold a repair back.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::netlink::Netlink;
use crate::plan::{LabelPatch, Plan, Snapshot, plan};

/// Rounds of one pass: adds, then the labels they allow; more means the host keeps changing
/// under the agent, and the next trigger goes on.
const ROUNDS: usize = 4;

/// The address loop.
#[derive(Debug)]
pub struct Converger {
    netlink: Netlink,
    interface: Option<String>,
    labels: watch::Sender<LabelPatch>,
    metrics: Arc<Metrics>,
    resync: Duration,
    /// The IPs last reported without a device, so that the warning is logged once per change
    /// rather than every resync.
    no_device: Vec<IpAddr>,
}

impl Converger {
    /// The loop over `netlink`'s namespace, putting every IP on the device named `interface` when
    /// given, handing label changes to `labels`, reading the host at least every `resync`.
    pub fn new(
        netlink: Netlink,
        interface: Option<String>,
        labels: watch::Sender<LabelPatch>,
        metrics: Arc<Metrics>,
        resync: Duration,
    ) -> Self {
        Self {
            netlink,
            interface,
            labels,
            metrics,
            resync,
            no_device: Vec::new(),
        }
    }

    /// Runs until `snapshots` closes. Does nothing until the first snapshot (the caches' first
    /// lists): acting on an empty picture would remove every address the agent added before a
    /// restart.
    pub async fn run(mut self, mut snapshots: watch::Receiver<Option<Arc<Snapshot>>>) {
        let mut resync = tokio::time::interval(self.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = snapshots.changed() => if changed.is_err() { return },
                () = self.netlink.changed() => {}
                _ = resync.tick() => {}
            }
            let snapshot = snapshots.borrow_and_update().clone();
            if let Some(snapshot) = snapshot {
                self.converge(&snapshot).await;
            }
        }
    }

    /// One pass over `snapshot`.
    async fn converge(&mut self, snapshot: &Snapshot) {
        for _ in 0..ROUNDS {
            let host = match self.netlink.host().await {
                Ok(host) => host,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the host's addresses");
                    return;
                }
            };
            let plan = plan(snapshot, &host, self.interface.as_deref());
            self.record(&plan);
            // Label removals first: they go out while the addresses are being removed.
            self.labels.send_if_modified(|current| {
                let changed = *current != plan.labels;
                if changed {
                    current.clone_from(&plan.labels);
                }
                changed
            });
            if !plan.changes_addresses() {
                return;
            }
            self.apply(&plan).await;
        }
    }

    async fn apply(&self, plan: &Plan) {
        for address in &plan.remove {
            let outcome = self.netlink.remove(address).await;
            match &outcome {
                Ok(()) => {
                    tracing::info!(ip = %address.ip, ifindex = address.index, "removed an egress IP this node no longer holds")
                }
                Err(e) => {
                    tracing::warn!(ip = %address.ip, ifindex = address.index, error = %e, "cannot remove an egress IP")
                }
            }
            self.metrics.address_operation("remove", outcome.is_ok());
        }
        for add in &plan.add {
            let outcome = self.netlink.add(add).await;
            match &outcome {
                Ok(()) => {
                    tracing::info!(ip = %add.ip, ifindex = add.index, "added an egress IP this node holds")
                }
                Err(e) => {
                    tracing::warn!(ip = %add.ip, ifindex = add.index, error = %e, "cannot add an egress IP")
                }
            }
            self.metrics.address_operation("add", outcome.is_ok());
        }
    }

    fn record(&mut self, plan: &Plan) {
        if self.no_device != plan.no_device {
            self.no_device.clone_from(&plan.no_device);
            for ip in &plan.no_device {
                tracing::warn!(%ip, "no device for an egress IP this node holds: no link has an address in the subnet the node's egress-ipconfig annotation gives for it (set --interface to name one)");
            }
        }
        self.metrics.set_addresses(plan.held, plan.no_device.len());
        self.metrics.set_gateways(plan.gateways);
    }
}
