//! Metrics of the plugin front ends (docs/plugins/): what each wrote, and the IPs it wants that
//! another owner's object holds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of a front end's writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    /// The front end (`antrea`).
    front_end: &'static str,
    /// `create`, `retarget` or `delete`.
    step: &'static str,
    /// `success` or `error`.
    outcome: &'static str,
}

/// Labels of a front end's gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FrontEndLabels {
    /// The front end.
    front_end: &'static str,
}

/// `cloudnet_front_end_writes_total` and `cloudnet_front_end_clashes`.
#[derive(Debug, Default)]
pub(crate) struct FrontEndMetrics {
    writes: Family<WriteLabels, Counter>,
    clashes: Family<FrontEndLabels, Gauge>,
}

impl FrontEndMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "front_end_writes",
            "CloudPrivateIPConfig writes of the plugin front ends, by front end, step and outcome",
            self.writes.clone(),
        );
        registry.register(
            "front_end_clashes",
            "IPs a front end wants whose CloudPrivateIPConfig another owner holds (left alone), as of its last plan",
            self.clashes.clone(),
        );
    }

    /// One write of `front_end` (`step`: create, retarget, delete) ended `ok` or not.
    pub(crate) fn wrote(&self, front_end: &'static str, step: &'static str, ok: bool) {
        self.writes
            .get_or_create(&WriteLabels {
                front_end,
                step,
                outcome: if ok { "success" } else { "error" },
            })
            .inc();
    }

    /// How many wanted IPs of `front_end` another owner's object holds now.
    pub(crate) fn set_clashes(&self, front_end: &'static str, clashes: usize) {
        self.clashes
            .get_or_create(&FrontEndLabels { front_end })
            .set(i64::try_from(clashes).unwrap_or(i64::MAX));
    }
}
