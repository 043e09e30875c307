//! Prometheus metrics of the reconciler. Label values are bounded: provider, operation, outcome,
//! error kind, state, reason, family, node (bounded by the cluster's size) — never an IP or an
//! object name.

pub(crate) mod front_end;
pub(crate) mod gateway;
pub(crate) mod glance;
pub(crate) mod public;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cloudnet_shared::Bucket;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::capacity::Room;
use crate::cloud::{CloudError, ErrorKind};
use glance::ObjectGlance;

/// Labels of a cloud call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CallLabels {
    /// Provider name (`aws`, `memory`, ...).
    pub(crate) provider: String,
    /// `attach`, `detach`, `egress_config`, `attached`, ...
    pub(crate) operation: String,
}

/// Labels naming only the provider.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProviderLabels {
    /// Provider name (`aws`, `memory`, ...).
    pub(crate) provider: String,
}

/// Labels of a failed cloud call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    /// Provider name.
    pub(crate) provider: String,
    /// The operation.
    pub(crate) operation: String,
    /// The error kind (`throttled`, `retryable`, ...).
    pub(crate) kind: String,
}

/// Labels of a cloud call the engine stopped waiting for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AbortLabels {
    /// Provider name.
    pub(crate) provider: String,
    /// The operation.
    pub(crate) operation: String,
    /// `panic` (the provider panicked) or `deadline` (no answer in time).
    pub(crate) reason: String,
}

/// Labels of a reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    /// `success` or `error`.
    pub(crate) outcome: String,
}

/// Labels of the IP-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabels {
    /// `assigned`, `pending`, `error` or `unassigned`.
    pub(crate) state: String,
}

/// Labels of a node's egress IP room.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NodeFamilyLabels {
    /// The node's name.
    pub(crate) node: String,
    /// The capacity bucket: `ipv4`, `ipv6`, or `ip` (both families under one limit).
    pub(crate) family: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn batch_histogram() -> Histogram {
    // 1 to 128 IPs.
    Histogram::new(exponential_buckets(1.0, 2.0, 8))
}

fn latency_histogram() -> Histogram {
    // 1 ms to ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The reconciler's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// `cloudnet_reconcile_duration_seconds`.
    pub(crate) reconcile_seconds: HistogramFamily<OutcomeLabels>,
    /// `cloudnet_cloud_call_duration_seconds`.
    pub(crate) cloud_call_seconds: HistogramFamily<CallLabels>,
    /// `cloudnet_cloud_call_errors_total`.
    pub(crate) cloud_call_errors: Family<ErrorLabels, Counter>,
    /// `cloudnet_cloud_call_aborted_total`: mutating calls that panicked or outlived the deadline.
    pub(crate) cloud_call_aborted: Family<AbortLabels, Counter>,
    /// `cloudnet_cloud_call_ips_total`: IPs carried by mutating calls, by kind (`attach`,
    /// `detach`); mutating calls per IP = the call count / this.
    pub(crate) cloud_call_ips: Family<CallLabels, Counter>,
    /// `cloudnet_cloud_call_batch_ips`: IPs per mutating call.
    pub(crate) cloud_call_batch: Family<ProviderLabels, Histogram, fn() -> Histogram>,
    /// `cloudnet_cloud_reads_total`: reads of a VM's interface (the engine's cache misses, drift).
    pub(crate) cloud_reads: Family<ProviderLabels, Counter>,
    /// `cloudnet_api_writes_total`: writes of `CloudPrivateIPConfig` objects (metadata and status).
    pub(crate) api_writes: Counter,
    /// `cloudnet_node_annotation_writes_total`: writes of the nodes' egress-ipconfig annotation.
    pub(crate) node_annotation_writes: Counter,
    /// `cloudnet_events_total`: Kubernetes Events published.
    pub(crate) events: Counter,
    /// `cloudnet_queue_depth`: IPs waiting for a cloud call.
    pub(crate) queue_depth: Gauge,
    /// `cloudnet_ips`: objects by state.
    pub(crate) ips: Family<StateLabels, Gauge>,
    /// `cloudnet_drift_repaired_total`: IPs found missing from their node and re-attached.
    pub(crate) drift_repaired: Counter,
    /// `cloudnet_ledger_writes_total`: writes of the attachment ledger's pages (ConfigMaps).
    pub(crate) ledger_writes: Counter,
    /// `cloudnet_ledger_released_dropped_total`: released records dropped, oldest first, from a
    /// ledger page at its cap (`RELEASED_CAP`) before their window ended.
    pub(crate) ledger_released_dropped: Counter,
    /// `cloudnet_orphans_released_total`: ledger entries no object claimed, released by the
    /// orphan sweep, by outcome (`detached`, `failed`).
    pub(crate) orphans_released: Family<OutcomeLabels, Counter>,
    /// `cloudnet_leader`: 1 while this process holds the Lease and may call the cloud.
    pub(crate) leader: Gauge,
    /// `cloudnet_leader_lost_total`: terms that ended with the Lease lost (not released), after
    /// which the process stood by and campaigned again.
    pub(crate) leader_lost: Counter,
    /// `cloudnet_node_egress_ips_capacity`: what each node's annotation offers egress IPs, by
    /// family; set by the node controller as it computes the annotation.
    pub(crate) node_capacity: Family<NodeFamilyLabels, Gauge>,
    /// `cloudnet_node_egress_ips_used`: egress IPs naming each node, by family.
    pub(crate) node_used: Family<NodeFamilyLabels, Gauge>,
    /// The families exported per node, so that a node's series go with it (a boxed slice: a
    /// one-entry `BTreeSet` is a 200-byte node, a megabyte at 5,000 nodes).
    node_buckets: Mutex<BTreeMap<String, Box<[&'static str]>>>,
    /// `cloudnet_ips_by_reason` and `cloudnet_oldest_not_assigned_age_seconds`, computed at scrape.
    pub(crate) glance: Arc<ObjectGlance>,
    /// Public addresses that follow egress IPs.
    pub(crate) public: public::PublicIpMetrics,
    /// The plugin front ends' writes and clashes.
    pub(crate) front_end: front_end::FrontEndMetrics,
    /// The egress gateways' active nodes, failovers and heartbeats.
    pub(crate) gateway: gateway::GatewayMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconcile_seconds: Family::new_with_constructor(latency_histogram),
            cloud_call_seconds: Family::new_with_constructor(latency_histogram),
            cloud_call_errors: Family::default(),
            cloud_call_aborted: Family::default(),
            cloud_call_ips: Family::default(),
            cloud_call_batch: Family::new_with_constructor(batch_histogram),
            cloud_reads: Family::default(),
            api_writes: Counter::default(),
            node_annotation_writes: Counter::default(),
            events: Counter::default(),
            queue_depth: Gauge::default(),
            ips: Family::default(),
            drift_repaired: Counter::default(),
            ledger_writes: Counter::default(),
            ledger_released_dropped: Counter::default(),
            orphans_released: Family::default(),
            leader: Gauge::default(),
            leader_lost: Counter::default(),
            node_capacity: Family::default(),
            node_used: Family::default(),
            node_buckets: Mutex::default(),
            glance: Arc::default(),
            public: public::PublicIpMetrics::default(),
            front_end: front_end::FrontEndMetrics::default(),
            gateway: gateway::GatewayMetrics::default(),
        }
    }
}

impl Metrics {
    /// Every metric in the text exposition format, as `/metrics` serves them (for tests and
    /// tools that run the reconciler in process).
    pub fn exposition(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// Registers every metric under the `cloudnet` prefix.
    pub(crate) fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("cloudnet");
        r.register(
            "reconcile_duration_seconds",
            "Time to reconcile one object",
            self.reconcile_seconds.clone(),
        );
        r.register(
            "cloud_call_duration_seconds",
            "Latency of cloud calls by provider and operation",
            self.cloud_call_seconds.clone(),
        );
        r.register(
            "cloud_call_errors",
            "Failed cloud calls by provider, operation and error kind",
            self.cloud_call_errors.clone(),
        );
        r.register(
            "cloud_call_aborted",
            "Mutating cloud calls given up because the provider panicked or the deadline passed",
            self.cloud_call_aborted.clone(),
        );
        r.register(
            "cloud_call_ips",
            "IPs carried by mutating cloud calls",
            self.cloud_call_ips.clone(),
        );
        r.register(
            "cloud_call_batch_ips",
            "IPs carried by each mutating cloud call",
            self.cloud_call_batch.clone(),
        );
        r.register(
            "cloud_reads",
            "Reads of a VM's interface from the cloud (the engine's cache misses and drift checks)",
            self.cloud_reads.clone(),
        );
        r.register(
            "api_writes",
            "Writes of CloudPrivateIPConfig objects (metadata and status)",
            self.api_writes.clone(),
        );
        r.register(
            "node_annotation_writes",
            "Writes of the nodes' egress-ipconfig annotation",
            self.node_annotation_writes.clone(),
        );
        r.register("events", "Kubernetes Events published", self.events.clone());
        r.register(
            "queue_depth",
            "IPs waiting for a cloud call",
            self.queue_depth.clone(),
        );
        r.register(
            "ips",
            "CloudPrivateIPConfig objects by state",
            self.ips.clone(),
        );
        r.register(
            "drift_repaired",
            "IPs found missing from their node and attached again",
            self.drift_repaired.clone(),
        );
        r.register(
            "ledger_writes",
            "Writes of the attachment ledger's ConfigMaps",
            self.ledger_writes.clone(),
        );
        r.register(
            "ledger_released_dropped",
            "Released records dropped, oldest first, from a ledger page at its cap",
            self.ledger_released_dropped.clone(),
        );
        r.register(
            "orphans_released",
            "Ledger entries no object claimed, released by the orphan sweep, by outcome",
            self.orphans_released.clone(),
        );
        r.register(
            "leader",
            "1 while this process holds the lease and may call the cloud",
            self.leader.clone(),
        );
        r.register(
            "leader_lost",
            "Times this process lost the lease (not released) and stood by to campaign again",
            self.leader_lost.clone(),
        );
        r.register(
            "node_egress_ips_capacity",
            "Egress IPs each node's annotation offers, by family (the cloud's limit less the addresses no object manages)",
            self.node_capacity.clone(),
        );
        r.register(
            "node_egress_ips_used",
            "Egress IPs of the objects naming each node (spec or status), by family",
            self.node_used.clone(),
        );
        self.public.register(r);
        self.front_end.register(r);
        self.gateway.register(r);
        r.register_collector(Box::new(Arc::clone(&self.glance)));
    }

    /// Records how full `node`'s buckets are; a bucket no longer limited loses its series.
    #[cfg(test)]
    pub(crate) fn set_node_room(&self, node: &str, rooms: &[Room]) {
        self.set_node_room_if(node, rooms, || true);
    }

    /// As [`Self::set_node_room`], only if `exists` says the Node still does, asked under the
    /// lock [`Self::retain_nodes`] takes: a reconcile that computed the room before its Node
    /// was deleted then either sets the series before the deletion's `retain_nodes` drops
    /// them, or sees the Node gone, and never sets them after.
    pub(crate) fn set_node_room_if(&self, node: &str, rooms: &[Room], exists: impl Fn() -> bool) {
        let mut buckets = self
            .node_buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !exists() {
            return;
        }
        let now: Box<[&'static str]> = rooms.iter().map(|r| r.bucket.as_str()).collect();
        let before = match buckets.get_mut(node) {
            Some(families) => std::mem::replace(families, now.clone()),
            None => {
                buckets.insert(node.to_owned(), now.clone());
                Box::default()
            }
        };
        for family in before.iter().filter(|f| !now.contains(f)) {
            self.remove_node_series(node, family);
        }
        for room in rooms {
            let labels = node_labels(node, room.bucket);
            self.node_capacity.get_or_create(&labels).set(room.capacity);
            self.node_used.get_or_create(&labels).set(room.used);
        }
    }

    /// Drops the series of every node `keep` refuses (deleted nodes).
    pub(crate) fn retain_nodes(&self, keep: impl Fn(&str) -> bool) {
        let mut buckets = self
            .node_buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        buckets.retain(|node, families| {
            let kept = keep(node);
            if !kept {
                for family in families.iter().copied() {
                    self.remove_node_series(node, family);
                }
            }
            kept
        });
    }

    fn remove_node_series(&self, node: &str, family: &'static str) {
        let labels = NodeFamilyLabels {
            node: node.to_owned(),
            family,
        };
        self.node_capacity.remove(&labels);
        self.node_used.remove(&labels);
    }

    /// Forgets what only the leader knows (per-node room, the objects at a glance): a standby
    /// exports none of it, rather than the values of its last term.
    pub(crate) fn end_term(&self) {
        self.retain_nodes(|_| false);
        self.glance.end_term();
    }

    /// Records one mutating cloud call and its outcome.
    pub(crate) fn cloud_call<T>(
        &self,
        provider: &str,
        operation: &str,
        elapsed: Duration,
        result: &Result<T, CloudError>,
    ) {
        let labels = CallLabels {
            provider: provider.to_owned(),
            operation: operation.to_owned(),
        };
        self.cloud_call_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if let Err(e) = result {
            self.cloud_error(provider, operation, e);
        }
    }

    /// Starts every `cloudnet_cloud_call_errors_total` series of `provider` at 0: a series that
    /// first appears at 1 shows no increase to `rate()`, so the first failures would escape the
    /// alert and the dashboard.
    pub(crate) fn zero_cloud_errors(&self, provider: &str) {
        for operation in COUNTED_OPERATIONS {
            for kind in ERROR_KINDS {
                self.cloud_call_errors
                    .get_or_create(&ErrorLabels {
                        provider: provider.to_owned(),
                        operation: operation.to_owned(),
                        kind: kind.as_str().to_owned(),
                    })
                    .inc_by(0);
            }
        }
    }

    /// Counts a failed cloud call.
    pub(crate) fn cloud_error(&self, provider: &str, operation: &str, error: &CloudError) {
        self.cloud_call_errors
            .get_or_create(&ErrorLabels {
                provider: provider.to_owned(),
                operation: operation.to_owned(),
                kind: error.kind.as_str().to_owned(),
            })
            .inc();
    }

    /// Counts a mutating call the engine gave up on: the provider panicked or the deadline passed.
    pub(crate) fn call_aborted(&self, provider: &str, operation: &str, reason: &str) {
        self.cloud_call_aborted
            .get_or_create(&AbortLabels {
                provider: provider.to_owned(),
                operation: operation.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Records the size of one mutating call's batch.
    pub(crate) fn cloud_batch(&self, provider: &str, ips: usize) {
        self.cloud_call_batch
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .observe(ips as f64);
    }

    /// Counts one read of a VM's interface.
    pub(crate) fn cloud_read(&self, provider: &str) {
        self.cloud_reads
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .inc();
    }

    /// Counts `n` IPs carried by a mutating call.
    pub(crate) fn cloud_ips(&self, provider: &str, operation: &str, n: usize) {
        self.cloud_call_ips
            .get_or_create(&CallLabels {
                provider: provider.to_owned(),
                operation: operation.to_owned(),
            })
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }
}

/// The operations whose failures the engine counts (`cloud_call`'s and `cloud_error`'s callers).
pub(crate) const COUNTED_OPERATIONS: [&str; 3] = ["apply", "move", "egress_config"];

/// Every error kind, for [`Metrics::zero_cloud_errors`].
const ERROR_KINDS: [ErrorKind; 6] = [
    ErrorKind::Throttled,
    ErrorKind::Retryable,
    ErrorKind::Permanent,
    ErrorKind::NotFound,
    ErrorKind::Unsupported,
    ErrorKind::Foreign,
];

/// Fails to compile when a kind is added and not listed in [`ERROR_KINDS`] above.
const fn _every_kind_listed(kind: ErrorKind) {
    match kind {
        ErrorKind::Throttled
        | ErrorKind::Retryable
        | ErrorKind::Permanent
        | ErrorKind::NotFound
        | ErrorKind::Unsupported
        | ErrorKind::Foreign => {}
        // The cloud driver resolves conflicts or reports them as retryable: never counted.
        ErrorKind::Conflict => {}
    }
}

fn node_labels(node: &str, bucket: Bucket) -> NodeFamilyLabels {
    NodeFamilyLabels {
        node: node.to_owned(),
        family: bucket.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(metrics: &Metrics) -> String {
        metrics.exposition()
    }

    fn room(bucket: Bucket, capacity: i64, used: i64) -> Room {
        Room {
            bucket,
            capacity,
            used,
        }
    }

    #[test]
    fn a_room_computed_for_a_node_deleted_meanwhile_sets_no_series() {
        let metrics = Metrics::default();
        metrics.set_node_room("a", &[room(Bucket::Ipv4, 10, 9)]);
        // The Node's deletion: the cache drops it, then its series go.
        metrics.retain_nodes(|n| n != "a");
        // A reconcile that started before the deletion finishes after it.
        metrics.set_node_room_if("a", &[room(Bucket::Ipv4, 10, 9)], || false);
        let text = exposition(&metrics);
        assert!(!text.contains(r#"node="a""#), "{text}");
    }

    #[test]
    fn node_room_follows_the_node_and_its_buckets() {
        let metrics = Metrics::default();
        metrics.set_node_room("a", &[room(Bucket::Ipv4, 10, 9), room(Bucket::Ipv6, 5, 0)]);
        metrics.set_node_room("b", &[room(Bucket::Ip, 3, 1)]);
        let text = exposition(&metrics);
        assert!(text.contains(r#"cloudnet_node_egress_ips_capacity{node="a",family="ipv4"} 10"#));
        assert!(text.contains(r#"cloudnet_node_egress_ips_used{node="a",family="ipv4"} 9"#));
        assert!(text.contains(r#"cloudnet_node_egress_ips_used{node="b",family="ip"} 1"#));
        // a's IPv6 limit is gone; b is deleted.
        metrics.set_node_room("a", &[room(Bucket::Ipv4, 10, 10)]);
        metrics.retain_nodes(|n| n != "b");
        let text = exposition(&metrics);
        assert!(text.contains(r#"cloudnet_node_egress_ips_used{node="a",family="ipv4"} 10"#));
        assert!(!text.contains(r#"family="ipv6""#), "{text}");
        assert!(!text.contains(r#"node="b""#), "{text}");
        metrics.end_term();
        assert!(!exposition(&metrics).contains("cloudnet_node_egress_ips"));
    }

    #[test]
    fn cloud_errors_start_at_zero_for_every_operation_and_kind() {
        let metrics = Metrics::default();
        metrics.zero_cloud_errors("aws");
        let text = exposition(&metrics);
        let series = text
            .lines()
            .filter(|l| l.starts_with("cloudnet_cloud_call_errors_total{"))
            .collect::<Vec<_>>();
        assert_eq!(series.len(), 18, "{text}");
        assert!(series.iter().all(|l| l.ends_with(" 0")), "{text}");
        assert!(text.contains(
            r#"cloudnet_cloud_call_errors_total{provider="aws",operation="apply",kind="throttled"} 0"#
        ));
    }

    #[test]
    fn a_standby_exports_no_glance() {
        let text = exposition(&Metrics::default());
        assert!(!text.contains("cloudnet_ips_by_reason"), "{text}");
        assert!(
            !text.contains("cloudnet_oldest_not_assigned_age_seconds"),
            "{text}"
        );
    }
}
