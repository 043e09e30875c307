//! Metrics of public addresses that follow egress IPs (docs/public-ips.md).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::OutcomeLabels;

/// What each association call ended as.
const OUTCOMES: [&str; 3] = ["associated", "disassociated", "failed"];

/// `cloudnet_public_ip_associations_total` and `cloudnet_public_ips_unassociated`.
#[derive(Debug, Default)]
pub(crate) struct PublicIpMetrics {
    /// Association calls by outcome (`associated`, `disassociated`, `failed`).
    associations: Family<OutcomeLabels, Counter>,
    /// Bindings whose `Associated` condition is not `True`.
    unassociated: Gauge,
}

impl PublicIpMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "public_ip_associations",
            "Calls that associated a public address with an egress IP, undid one, or failed",
            self.associations.clone(),
        );
        registry.register(
            "public_ips_unassociated",
            "EgressPublicIP bindings whose public address is not associated with their egress IP",
            self.unassociated.clone(),
        );
    }

    /// Starts every outcome at 0, so that the first failure shows as an increase.
    pub(crate) fn zero(&self) {
        for outcome in OUTCOMES {
            self.count(outcome, 0);
        }
    }

    fn count(&self, outcome: &str, by: u64) {
        self.associations
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc_by(by);
    }

    /// One public address associated.
    pub(crate) fn associated(&self) {
        self.count(OUTCOMES[0], 1);
    }

    /// One association undone.
    pub(crate) fn disassociated(&self) {
        self.count(OUTCOMES[1], 1);
    }

    /// One call failed.
    pub(crate) fn failed(&self) {
        self.count(OUTCOMES[2], 1);
    }

    /// How many bindings are not associated now.
    pub(crate) fn set_unassociated(&self, bindings: usize) {
        self.unassociated
            .set(i64::try_from(bindings).unwrap_or(i64::MAX));
    }
}
