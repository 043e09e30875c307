//! Metrics of the egress gateway front end (docs/gateways.md): each gateway's active node and
//! eligible nodes, its failovers and how long they took, and each node agent's heartbeat age.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of a gateway's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GatewayLabels {
    gateway: String,
}

/// Labels of a gateway's active node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActiveLabels {
    gateway: String,
    node: String,
}

/// Labels of a node agent's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

/// The gateway front end's metrics.
#[derive(Debug)]
pub(crate) struct GatewayMetrics {
    active: Family<ActiveLabels, Gauge>,
    eligible: Family<GatewayLabels, Gauge>,
    failovers: Family<GatewayLabels, Counter>,
    failover_seconds: Histogram,
    heartbeat_age: Family<NodeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self {
            active: Family::default(),
            eligible: Family::default(),
            failovers: Family::default(),
            // From a quarter second to a minute: the target is within 5 s of the last heartbeat.
            failover_seconds: Histogram::new([
                0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 20.0, 60.0,
            ]),
            heartbeat_age: Family::default(),
        }
    }
}

impl GatewayMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "egress_gateway_active",
            "1 for each egress gateway's active node",
            self.active.clone(),
        );
        registry.register(
            "egress_gateway_eligible_nodes",
            "Nodes each egress gateway's nodeSelector picks that are healthy with a fresh agent heartbeat (0 fires CloudnetEgressGatewayNoEligibleNode)",
            self.eligible.clone(),
        );
        registry.register(
            "egress_gateway_failovers",
            "Times an egress gateway's active node changed because the old one was no longer eligible",
            self.failovers.clone(),
        );
        registry.register(
            "egress_gateway_failover_seconds",
            "From the old active node's last agent heartbeat (or its loss of eligibility) to the gateway Ready on the new one",
            self.failover_seconds.clone(),
        );
        registry.register(
            "node_agent_heartbeat_age_seconds",
            "Age of each node agent's last heartbeat, as the leader saw it renewed",
            self.heartbeat_age.clone(),
        );
    }

    /// `gateway` is active on `node` (`None`: on none), no longer on `before`.
    pub(crate) fn set_active(&self, gateway: &str, before: Option<&str>, node: Option<&str>) {
        if let Some(before) = before.filter(|b| Some(*b) != node) {
            self.active.remove(&ActiveLabels {
                gateway: gateway.to_owned(),
                node: before.to_owned(),
            });
        }
        if let Some(node) = node {
            self.active
                .get_or_create(&ActiveLabels {
                    gateway: gateway.to_owned(),
                    node: node.to_owned(),
                })
                .set(1);
        }
    }

    /// How many nodes are eligible for `gateway`.
    pub(crate) fn set_eligible(&self, gateway: &str, count: usize) {
        self.eligible
            .get_or_create(&GatewayLabels {
                gateway: gateway.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// `gateway` is gone: its series go.
    pub(crate) fn forget(&self, gateway: &str, active: Option<&str>) {
        let labels = GatewayLabels {
            gateway: gateway.to_owned(),
        };
        self.eligible.remove(&labels);
        self.failovers.remove(&labels);
        self.set_active(gateway, active, None);
    }

    /// `gateway` failed over.
    pub(crate) fn failed_over(&self, gateway: &str) {
        self.failovers
            .get_or_create(&GatewayLabels {
                gateway: gateway.to_owned(),
            })
            .inc();
    }

    /// A failover took `took`.
    pub(crate) fn failover_took(&self, took: Duration) {
        self.failover_seconds.observe(took.as_secs_f64());
    }

    /// The heartbeat ages now; nodes without a Lease lose their series.
    pub(crate) fn set_heartbeats<'a>(&self, ages: impl IntoIterator<Item = (&'a str, Duration)>) {
        self.heartbeat_age.clear();
        for (node, age) in ages {
            self.heartbeat_age
                .get_or_create(&NodeLabels {
                    node: node.to_owned(),
                })
                .set(age.as_secs_f64());
        }
    }
}
