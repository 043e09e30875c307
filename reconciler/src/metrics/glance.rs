//! The objects at a glance, computed when Prometheus scrapes: how many objects carry each
//! `Assigned` reason, and how long the oldest IP requested on a node has waited to be Assigned
//! there. The counts scan the leader's object cache at scrape time (10,000 cached objects cost
//! well under a millisecond, and the cache adds no copy of its own); the waiting times follow the
//! object watch, event by event, because no field of an object says since when it has waited:
//! a retry moves the condition's `lastTransitionTime` (Error, then Pending again) without the IP
//! having been Assigned in between. A standby has no cache and exports neither.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cloudnet_shared::{AssignedReason, CloudPrivateIPConfig};
use futures::FutureExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::Event;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// The `reason` label of an object without an `Assigned` condition (not yet looked at).
pub(crate) const NO_CONDITION: &str = "None";
/// The `reason` label of a condition whose reason no version of the reconciler writes.
pub(crate) const OTHER_REASON: &str = "Other";

const REASONS: [&str; 5] = [
    AssignedReason::CloudResponseSuccess.as_str(),
    AssignedReason::CloudResponsePending.as_str(),
    AssignedReason::CloudResponseError.as_str(),
    NO_CONDITION,
    OTHER_REASON,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The bounded `reason` label of an object.
pub(crate) fn reason_of(obj: &CloudPrivateIPConfig) -> &'static str {
    match obj.assigned_condition() {
        None => NO_CONDITION,
        Some(c) => REASONS
            .iter()
            .find(|r| **r == c.reason)
            .copied()
            .unwrap_or(OTHER_REASON),
    }
}

/// Since when `obj` has waited to be Assigned on its node, as far as the object itself tells, or
/// `None` when it is not waiting: Assigned, requested nowhere, or being deleted.
///
/// A failed or pending condition dates the wait; a fresh object, its creation; an object still
/// Assigned elsewhere (a move not yet picked up) begins waiting `now`.
pub(crate) fn waiting_since(obj: &CloudPrivateIPConfig, now: Timestamp) -> Option<Timestamp> {
    if obj.spec.node.is_empty() || obj.metadata.deletion_timestamp.is_some() || obj.is_assigned() {
        return None;
    }
    let since = match obj.assigned_condition() {
        Some(c) if c.status != "True" => c.last_transition_time.0,
        Some(_) => now,
        None => obj
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0),
    };
    Some(since.min(now))
}

/// The objects waiting to be Assigned and since when, kept across events: a wait that goes on
/// through Error and Pending again keeps its first date.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    since: HashMap<String, Timestamp>,
    /// A relist in progress: what it has listed as waiting so far.
    relist: Option<HashMap<String, Timestamp>>,
}

impl Waiting {
    /// Follows one event of the object watch.
    pub(crate) fn apply(&mut self, event: &Event<CloudPrivateIPConfig>, now: Timestamp) {
        match event {
            Event::Apply(obj) => {
                let name = obj.name_any();
                match waiting_since(obj, now) {
                    Some(t) => {
                        self.since.entry(name).or_insert(t);
                    }
                    None => {
                        self.since.remove(&name);
                    }
                }
            }
            Event::Delete(obj) => {
                self.since.remove(&obj.name_any());
            }
            Event::Init => self.relist = Some(HashMap::new()),
            Event::InitApply(obj) => {
                if let Some(t) = waiting_since(obj, now) {
                    let name = obj.name_any();
                    // Still waiting since before the relist: the earlier date stands.
                    let t = self.since.get(&name).map_or(t, |known| t.min(*known));
                    self.relist.get_or_insert_with(HashMap::new).insert(name, t);
                }
            }
            Event::InitDone => self.since = self.relist.take().unwrap_or_default(),
        }
    }

    /// The earliest date any waiting object has waited since.
    pub(crate) fn oldest(&self) -> Option<Timestamp> {
        self.since.values().min().copied()
    }
}

#[derive(Debug, Default)]
struct State {
    /// The leader's object cache; `None` on a standby.
    cache: Option<Store<CloudPrivateIPConfig>>,
    waiting: Waiting,
}

/// The scrape-time collector of `cloudnet_ips_by_reason` and
/// `cloudnet_oldest_not_assigned_age_seconds`.
#[derive(Debug, Default)]
pub(crate) struct ObjectGlance {
    state: Mutex<State>,
}

impl ObjectGlance {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a leadership term over `cache`, whose watch feeds [`Self::apply`].
    pub(crate) fn begin_term(&self, cache: Store<CloudPrivateIPConfig>) {
        *self.lock() = State {
            cache: Some(cache),
            waiting: Waiting::default(),
        };
    }

    /// Ends the term: a standby exports neither metric.
    pub(crate) fn end_term(&self) {
        *self.lock() = State::default();
    }

    /// Follows one event of the object watch.
    pub(crate) fn apply(&self, event: &Event<CloudPrivateIPConfig>) {
        self.lock().waiting.apply(event, Timestamp::now());
    }
}

impl Collector for ObjectGlance {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let (cache, oldest) = {
            let state = self.lock();
            (state.cache.clone(), state.waiting.oldest())
        };
        // Before the first list the cache is empty, and zeros would read as "all is well".
        let synced = |c: &Store<CloudPrivateIPConfig>| {
            matches!(c.wait_until_ready().now_or_never(), Some(Ok(())))
        };
        let Some(cache) = cache.filter(synced) else {
            return Ok(());
        };
        let reasons = Family::<ReasonLabels, Gauge>::default();
        for reason in REASONS {
            reasons.get_or_create(&ReasonLabels { reason }).set(0);
        }
        for obj in cache.state() {
            reasons
                .get_or_create(&ReasonLabels {
                    reason: reason_of(&obj),
                })
                .inc();
        }
        reasons.encode(encoder.encode_descriptor(
            "ips_by_reason",
            "CloudPrivateIPConfig objects by the reason of their Assigned condition (None: no condition yet)",
            None,
            reasons.metric_type(),
        )?)?;
        let age = Gauge::<f64, AtomicU64>::default();
        let now = Timestamp::now();
        age.set(oldest.map_or(0.0, |t| now.duration_since(t).as_secs_f64().max(0.0)));
        age.encode(encoder.encode_descriptor(
            "oldest_not_assigned_age_seconds",
            "How long the oldest IP requested on a node has waited to be Assigned there (0: none waits)",
            None,
            age.metric_type(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use cloudnet_shared::{
        CONDITION_ASSIGNED, CloudPrivateIPConfigSpec, CloudPrivateIPConfigStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn object(
        name: &str,
        spec: &str,
        status: Option<(&str, AssignedReason, i64)>,
    ) -> CloudPrivateIPConfig {
        let mut obj = CloudPrivateIPConfig::new(
            name,
            CloudPrivateIPConfigSpec {
                node: spec.to_owned(),
            },
        );
        obj.metadata.creation_timestamp = Some(Time(at(5)));
        obj.status = status.map(|(node, reason, since)| CloudPrivateIPConfigStatus {
            node: node.to_owned(),
            conditions: vec![Condition {
                type_: CONDITION_ASSIGNED.to_owned(),
                status: reason.status().to_owned(),
                reason: reason.as_str().to_owned(),
                message: String::new(),
                observed_generation: None,
                last_transition_time: Time(at(since)),
            }],
        });
        obj
    }

    use AssignedReason::{CloudResponseError, CloudResponsePending, CloudResponseSuccess};

    #[test]
    fn waiting_is_dated_by_the_objects_own_evidence() {
        let now = at(100);
        let cases = [
            (object("a", "n1", None), Some(at(5))),
            (
                object("a", "n1", Some(("n1", CloudResponseError, 40))),
                Some(at(40)),
            ),
            (
                object("a", "n1", Some(("n1", CloudResponsePending, 50))),
                Some(at(50)),
            ),
            (
                object("a", "n1", Some(("n1", CloudResponseSuccess, 60))),
                None,
            ),
            // A move not yet picked up: Assigned, but on another node.
            (
                object("a", "n2", Some(("n1", CloudResponseSuccess, 60))),
                Some(now),
            ),
            // Requested nowhere: nothing to wait for.
            (object("a", "", Some(("n1", CloudResponseError, 40))), None),
            // A clock behind the apiserver's never yields a negative age.
            (
                object("a", "n1", Some(("n1", CloudResponseError, 400))),
                Some(now),
            ),
        ];
        for (i, (obj, want)) in cases.into_iter().enumerate() {
            assert_eq!(waiting_since(&obj, now), want, "case {i}");
        }
        let mut deleting = object("a", "n1", None);
        deleting.metadata.deletion_timestamp = Some(Time(at(7)));
        assert_eq!(waiting_since(&deleting, now), None);
    }

    #[test]
    fn a_retry_keeps_the_first_date_and_assignment_ends_the_wait() {
        let mut w = Waiting::default();
        w.apply(
            &Event::Apply(object("a", "n1", Some(("n1", CloudResponseError, 10)))),
            at(11),
        );
        w.apply(&Event::Apply(object("b", "n1", None)), at(20));
        assert_eq!(w.oldest(), Some(at(5)), "b was created at 5");
        w.apply(&Event::Delete(object("b", "n1", None)), at(21));
        // The retry writes Pending: its transition time moves, the wait does not.
        w.apply(
            &Event::Apply(object("a", "n1", Some(("n1", CloudResponsePending, 30)))),
            at(30),
        );
        assert_eq!(w.oldest(), Some(at(10)));
        w.apply(
            &Event::Apply(object("a", "n1", Some(("n1", CloudResponseSuccess, 35)))),
            at(35),
        );
        assert_eq!(w.oldest(), None);
    }

    #[test]
    fn a_relist_keeps_known_waits_and_drops_what_it_no_longer_lists() {
        let mut w = Waiting::default();
        w.apply(
            &Event::Apply(object("a", "n1", Some(("n1", CloudResponseError, 10)))),
            at(11),
        );
        w.apply(
            &Event::Apply(object("b", "n1", Some(("n1", CloudResponseError, 12)))),
            at(12),
        );
        w.apply(&Event::Init, at(50));
        w.apply(
            &Event::InitApply(object("a", "n1", Some(("n1", CloudResponsePending, 45)))),
            at(50),
        );
        assert_eq!(
            w.oldest(),
            Some(at(10)),
            "the old view stands until the relist ends"
        );
        w.apply(&Event::InitDone, at(51));
        assert_eq!(w.oldest(), Some(at(10)));
        assert_eq!(w.since.len(), 1, "b was not listed again");
    }

    #[test]
    fn a_leader_counts_reasons_and_ages_the_oldest_wait_once_its_cache_is_listed() {
        let (reader, mut writer) = kube::runtime::reflector::store();
        let glance = std::sync::Arc::new(ObjectGlance::default());
        let mut registry = prometheus_client::registry::Registry::default();
        registry
            .sub_registry_with_prefix("cloudnet")
            .register_collector(Box::new(std::sync::Arc::clone(&glance)));
        let text = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        glance.begin_term(reader);
        let events = [
            Event::Init,
            Event::InitApply(object("a", "n1", Some(("n1", CloudResponseError, 10)))),
            Event::InitApply(object("b", "n1", Some(("n1", CloudResponseSuccess, 10)))),
            Event::InitApply(object("c", "n2", Some(("n1", CloudResponseSuccess, 10)))),
        ];
        for event in &events {
            writer.apply_watcher_event(event);
            glance.apply(event);
        }
        assert!(!text().contains("cloudnet_ips_by_reason"), "not listed yet");
        writer.apply_watcher_event(&Event::InitDone);
        glance.apply(&Event::InitDone);
        let out = text();
        for line in [
            r#"cloudnet_ips_by_reason{reason="CloudResponseSuccess"} 2"#,
            r#"cloudnet_ips_by_reason{reason="CloudResponseError"} 1"#,
            r#"cloudnet_ips_by_reason{reason="CloudResponsePending"} 0"#,
            r#"cloudnet_ips_by_reason{reason="None"} 0"#,
        ] {
            assert!(out.contains(line), "{line} in {out}");
        }
        let age: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("cloudnet_oldest_not_assigned_age_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        // a has waited since 10 s after the epoch.
        assert!(age > 1.0e9, "{age}");
        glance.end_term();
        assert!(!text().contains("cloudnet_"), "a standby exports neither");
    }

    #[test]
    fn reasons_are_bounded() {
        let mut odd = object("a", "n1", Some(("n1", CloudResponseError, 1)));
        odd.status.as_mut().unwrap().conditions[0].reason = "SomethingElse".into();
        assert_eq!(reason_of(&odd), OTHER_REASON);
        assert_eq!(reason_of(&object("a", "n1", None)), NO_CONDITION);
        assert_eq!(
            reason_of(&object("a", "n1", Some(("n1", CloudResponsePending, 1)))),
            "CloudResponsePending"
        );
    }
}
