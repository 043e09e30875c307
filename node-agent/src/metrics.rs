//! The agent's Prometheus metrics. Label values are bounded (operation, outcome, state), never an
//! IP or a gateway's name.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of an outcome alone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    /// `success` or `error`.
    outcome: &'static str,
}

/// Labels of an address change.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    /// `add` or `remove`.
    operation: &'static str,
    /// `success` or `error`.
    outcome: &'static str,
}

/// Labels of the egress-IP gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    /// `held` (on a device) or `no_device`.
    state: &'static str,
}

const fn outcome(ok: bool) -> &'static str {
    if ok { "success" } else { "error" }
}

/// Every metric of the agent.
#[derive(Debug, Default)]
pub struct Metrics {
    heartbeats: Family<OutcomeLabels, Counter>,
    last_heartbeat: Gauge<f64, AtomicU64>,
    address_operations: Family<OperationLabels, Counter>,
    egress_ips: Family<StateLabels, Gauge>,
    gateways: Gauge,
    label_patches: Family<OutcomeLabels, Counter>,
}

impl Metrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> std::sync::Arc<Self> {
        let metrics = Self::default();
        registry.register(
            "cloudnet_node_heartbeats",
            "Renewals of this node's heartbeat Lease, by outcome",
            metrics.heartbeats.clone(),
        );
        registry.register(
            "cloudnet_node_heartbeat_last_success_timestamp_seconds",
            "When this node's heartbeat Lease was last renewed (Unix time); the leader counts the node unhealthy once it is older than its timeout",
            metrics.last_heartbeat.clone(),
        );
        registry.register(
            "cloudnet_node_address_operations",
            "Egress IPs added to or removed from this node's interfaces, by operation and outcome",
            metrics.address_operations.clone(),
        );
        registry.register(
            "cloudnet_node_egress_ips",
            "Egress IPs this node holds: on a device (held), or with no device found for them (no_device: the node's egress-ipconfig subnet matches no link; see --interface)",
            metrics.egress_ips.clone(),
        );
        registry.register(
            "cloudnet_node_gateways",
            "Egress gateways this node holds (active here with at least one IP attached here)",
            metrics.gateways.clone(),
        );
        registry.register(
            "cloudnet_node_label_patches",
            "Patches of this node's egress-gateway labels, by outcome",
            metrics.label_patches.clone(),
        );
        std::sync::Arc::new(metrics)
    }

    /// Records a heartbeat renewal; `at` is the Unix time of a successful one.
    pub fn heartbeat(&self, at: Option<f64>) {
        self.heartbeats
            .get_or_create(&OutcomeLabels {
                outcome: outcome(at.is_some()),
            })
            .inc();
        if let Some(at) = at {
            self.last_heartbeat.set(at);
        }
    }

    /// Records an address added or removed.
    pub fn address_operation(&self, operation: &'static str, ok: bool) {
        self.address_operations
            .get_or_create(&OperationLabels {
                operation,
                outcome: outcome(ok),
            })
            .inc();
    }

    /// Sets the egress-IP gauge.
    pub fn set_addresses(&self, held: usize, no_device: usize) {
        let gauge = |state, n: usize| {
            self.egress_ips
                .get_or_create(&StateLabels { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        gauge("held", held);
        gauge("no_device", no_device);
    }

    /// Sets the held-gateway gauge.
    pub fn set_gateways(&self, n: usize) {
        self.gateways.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Records a label patch.
    pub fn label_patch(&self, ok: bool) {
        self.label_patches
            .get_or_create(&OutcomeLabels {
                outcome: outcome(ok),
            })
            .inc();
    }
}
