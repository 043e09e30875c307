//! Prometheus metrics of the reconciler. Label values are bounded: provider, operation, outcome,
//! error kind, state — never an IP or an object name.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::cloud::CloudError;

/// Labels of a cloud call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// Provider name (`aws`, `memory`, ...).
    pub provider: String,
    /// `attach`, `detach`, `egress_config`, `attached`, ...
    pub operation: String,
}

/// Labels naming only the provider.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    /// Provider name (`aws`, `memory`, ...).
    pub provider: String,
}

/// Labels of a failed cloud call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Provider name.
    pub provider: String,
    /// The operation.
    pub operation: String,
    /// The error kind (`throttled`, `retryable`, ...).
    pub kind: String,
}

/// Labels of a cloud call the engine stopped waiting for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AbortLabels {
    /// Provider name.
    pub provider: String,
    /// The operation.
    pub operation: String,
    /// `panic` (the provider panicked) or `deadline` (no answer in time).
    pub reason: String,
}

/// Labels of a reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `success` or `error`.
    pub outcome: String,
}

/// Labels of the IP-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `assigned`, `pending`, `error` or `unassigned`.
    pub state: String,
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
    pub reconcile_seconds: HistogramFamily<OutcomeLabels>,
    /// `cloudnet_cloud_call_duration_seconds`.
    pub cloud_call_seconds: HistogramFamily<CallLabels>,
    /// `cloudnet_cloud_call_errors_total`.
    pub cloud_call_errors: Family<ErrorLabels, Counter>,
    /// `cloudnet_cloud_call_aborted_total`: mutating calls that panicked or outlived the deadline.
    pub cloud_call_aborted: Family<AbortLabels, Counter>,
    /// `cloudnet_cloud_call_ips_total`: IPs carried by mutating calls, by kind (`attach`,
    /// `detach`); mutating calls per IP = the call count / this.
    pub cloud_call_ips: Family<CallLabels, Counter>,
    /// `cloudnet_cloud_call_batch_ips`: IPs per mutating call.
    pub cloud_call_batch: Family<ProviderLabels, Histogram, fn() -> Histogram>,
    /// `cloudnet_cloud_reads_total`: reads of a VM's interface (the engine's cache misses, drift).
    pub cloud_reads: Family<ProviderLabels, Counter>,
    /// `cloudnet_api_writes_total`: writes of `CloudPrivateIPConfig` objects (metadata and status).
    pub api_writes: Counter,
    /// `cloudnet_node_annotation_writes_total`: writes of the nodes' egress-ipconfig annotation.
    pub node_annotation_writes: Counter,
    /// `cloudnet_events_total`: Kubernetes Events published.
    pub events: Counter,
    /// `cloudnet_queue_depth`: IPs waiting for a cloud call.
    pub queue_depth: Gauge,
    /// `cloudnet_ips`: objects by state.
    pub ips: Family<StateLabels, Gauge>,
    /// `cloudnet_drift_repaired_total`: IPs found missing from their node and re-attached.
    pub drift_repaired: Counter,
    /// `cloudnet_ledger_writes_total`: writes of the attachment ledger's pages (ConfigMaps).
    pub ledger_writes: Counter,
    /// `cloudnet_orphans_released_total`: ledger entries no object claimed, released by the
    /// orphan sweep, by outcome (`detached`, `failed`).
    pub orphans_released: Family<OutcomeLabels, Counter>,
    /// `cloudnet_leader`: 1 while this process holds the Lease and may call the cloud.
    pub leader: Gauge,
    /// `cloudnet_leader_lost_total`: terms that ended with the Lease lost (not released), after
    /// which the process stood by and campaigned again.
    pub leader_lost: Counter,
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
            orphans_released: Family::default(),
            leader: Gauge::default(),
            leader_lost: Counter::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric under the `cloudnet` prefix.
    pub fn register(&self, registry: &mut Registry) {
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
    }

    /// Records one mutating cloud call and its outcome.
    pub fn cloud_call<T>(
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

    /// Counts a failed cloud call.
    pub fn cloud_error(&self, provider: &str, operation: &str, error: &CloudError) {
        self.cloud_call_errors
            .get_or_create(&ErrorLabels {
                provider: provider.to_owned(),
                operation: operation.to_owned(),
                kind: error.kind.as_str().to_owned(),
            })
            .inc();
    }

    /// Counts a mutating call the engine gave up on: the provider panicked or the deadline passed.
    pub fn call_aborted(&self, provider: &str, operation: &str, reason: &str) {
        self.cloud_call_aborted
            .get_or_create(&AbortLabels {
                provider: provider.to_owned(),
                operation: operation.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Records the size of one mutating call's batch.
    pub fn cloud_batch(&self, provider: &str, ips: usize) {
        self.cloud_call_batch
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .observe(ips as f64);
    }

    /// Counts one read of a VM's interface.
    pub fn cloud_read(&self, provider: &str) {
        self.cloud_reads
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .inc();
    }

    /// Counts `n` IPs carried by a mutating call.
    pub fn cloud_ips(&self, provider: &str, operation: &str, n: usize) {
        self.cloud_call_ips
            .get_or_create(&CallLabels {
                provider: provider.to_owned(),
                operation: operation.to_owned(),
            })
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }
}
