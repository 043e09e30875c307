//! Prometheus metrics: requests by endpoint, outcome and rule, a latency histogram per endpoint,
//! reviews that met a node annotation written for another cloud, and whether the caches are current.

use std::fmt;

use cloudnet_shared::platform::KeyMismatch;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Latency buckets in seconds, 100µs to 10s. Dense below 1 ms so a sub-millisecond p99 is
/// readable from the histogram alone.
pub const LATENCY_BUCKETS: [f64; 22] = [
    0.000_1, 0.000_15, 0.000_2, 0.000_25, 0.000_3, 0.000_4, 0.000_5, 0.000_75, 0.001, 0.002_5,
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// The admission endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `/validate`.
    Validate,
    /// `/mutate`.
    Mutate,
    /// `/validate-egressrouter`.
    ValidateEgressRouter,
    /// `/validate-nad`.
    ValidateNad,
    /// `/validate-egresspublicip`.
    ValidatePublicIp,
    /// `/validate-antrea-externalippool`.
    ValidateAntreaPool,
    /// `/validate-antrea-egress`.
    ValidateAntreaEgress,
    /// `/validate-egressgateway`.
    ValidateGateway,
}

impl Endpoint {
    /// The metric label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Validate => "validate",
            Self::Mutate => "mutate",
            Self::ValidateEgressRouter => "validate_egressrouter",
            Self::ValidateNad => "validate_nad",
            Self::ValidatePublicIp => "validate_egresspublicip",
            Self::ValidateAntreaPool => "validate_antrea_externalippool",
            Self::ValidateAntreaEgress => "validate_antrea_egress",
            Self::ValidateGateway => "validate_egressgateway",
        }
    }
}

/// What became of one admission request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Allowed without changes.
    Allowed,
    /// Allowed with a JSON patch.
    Patched,
    /// Denied by a rule.
    Denied,
    /// Refused with an HTTP 4xx: the body was no AdmissionReview at all.
    Rejected,
    /// Answered 503: the caches the review needs are not synced yet, or stale.
    Unavailable,
}

impl Outcome {
    /// The metric label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Patched => "patched",
            Self::Denied => "denied",
            Self::Rejected => "rejected",
            Self::Unavailable => "unavailable",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    outcome: &'static str,
    /// The denying rule, or empty when none denied.
    rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MismatchLabels {
    /// `--platform-type`: one of four.
    platform: &'static str,
    /// The keys found instead: `ip` or `ipv4_ipv6`.
    annotation_keys: &'static str,
}

type HistogramFamily = Family<EndpointLabels, Histogram, fn() -> Histogram>;

/// The webhook's metrics and the registry they are exposed from.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: HistogramFamily,
    mismatches: Family<MismatchLabels, Counter>,
    certificate_expiry: Gauge,
    caches_ready: Gauge,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let duration: HistogramFamily =
            Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS));
        registry.register(
            "cloudnet_webhook_requests",
            "Admission requests by endpoint, outcome and denying rule",
            requests.clone(),
        );
        registry.register(
            "cloudnet_webhook_request_duration_seconds",
            "Time to answer an admission request, from the body being read to the response built",
            duration.clone(),
        );
        let mismatches = Family::<MismatchLabels, Counter>::default();
        registry.register(
            "cloudnet_webhook_platform_mismatches",
            "Reviews whose target node's annotation carries another cloud's capacity keys than --platform-type (counted with the annotation's own keys)",
            mismatches.clone(),
        );
        let certificate_expiry = Gauge::default();
        registry.register(
            "cloudnet_webhook_certificate_expiry_timestamp_seconds",
            "Unix time at which the served certificate expires (its notAfter)",
            certificate_expiry.clone(),
        );
        let caches_ready = Gauge::default();
        registry.register(
            "cloudnet_webhook_caches_ready",
            "1 while the Node and CloudPrivateIPConfig caches are synced and current (what /readyz answers), else 0",
            caches_ready.clone(),
        );
        Self {
            registry,
            requests,
            duration,
            mismatches,
            certificate_expiry,
            caches_ready,
        }
    }

    /// Records the served certificate's notAfter (Unix seconds).
    pub fn set_certificate_expiry(&self, not_after: i64) {
        self.certificate_expiry.set(not_after);
    }

    /// Records whether the caches can decide admissions now.
    pub fn set_caches_ready(&self, ready: bool) {
        self.caches_ready.set(i64::from(ready));
    }

    /// Counts one answered request.
    pub fn record(&self, endpoint: Endpoint, outcome: Outcome, rule: Option<&'static str>) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.as_str(),
                outcome: outcome.as_str(),
                rule: rule.unwrap_or(""),
            })
            .inc();
    }

    /// Records how long one request took.
    pub fn observe_duration(&self, endpoint: Endpoint, seconds: f64) {
        self.duration
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.as_str(),
            })
            .observe(seconds);
    }

    /// Counts one review that found another cloud's capacity keys on its target node.
    pub fn record_mismatch(&self, mismatch: KeyMismatch) {
        self.mismatches
            .get_or_create(&MismatchLabels {
                platform: mismatch.platform.as_str(),
                annotation_keys: mismatch.keys_label(),
            })
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
