//! The decisions of leader election over plain data, as client-go makes them: when a standby may
//! take the Lease, and whether a leader still holds it. No clock is read here: callers pass how
//! long they have seen the Lease unchanged, by their own clock.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use thiserror::Error;

/// Annotation on the Lease naming the process that holds it, as [`Process::encode`] writes it.
/// Upstream's client-go ignores it (it reads only the spec and keeps the rest of the object).
pub(crate) const PROCESS_ANNOTATION: &str = "cloudnet.io/leader-process";

/// Leader election timings (client-go's `LeaseDuration`, `RenewDeadline`, `RetryPeriod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How long a standby waits, from when it first sees the Lease unchanged, before it takes it.
    pub(crate) lease: Duration,
    /// How long the leader acts after the last renewal it saw succeed (counted from when it sent
    /// that renewal). Shorter than `lease`: the difference absorbs clock rate differences and the
    /// time a last request takes to reach the cloud.
    pub(crate) renew_deadline: Duration,
    /// How often the leader renews and a standby looks at the Lease.
    pub(crate) retry: Duration,
}

/// The timings cannot give the guarantee leader election exists for.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum TimingsError {
    /// A leader could still act after a standby took the Lease.
    #[error(
        "the renew deadline ({renew_deadline:?}) must be shorter than the lease duration \
         ({lease:?}), or a leader that cannot renew would still act after another replica took over"
    )]
    DeadlineNotBeforeExpiry {
        /// The lease duration.
        lease: Duration,
        /// The renew deadline.
        renew_deadline: Duration,
    },
    /// A leader would not get to retry a failed renewal before its deadline.
    #[error(
        "the retry period ({retry:?}) must be above zero and below the renew deadline \
         ({renew_deadline:?}) divided by 1.2 (client-go's jitter factor)"
    )]
    Retry {
        /// The retry period.
        retry: Duration,
        /// The renew deadline.
        renew_deadline: Duration,
    },
}

impl Timings {
    /// Checked timings, with client-go's constraints.
    pub fn new(
        lease: Duration,
        renew_deadline: Duration,
        retry: Duration,
    ) -> Result<Self, TimingsError> {
        if renew_deadline >= lease {
            return Err(TimingsError::DeadlineNotBeforeExpiry {
                lease,
                renew_deadline,
            });
        }
        if retry.is_zero() || retry.mul_f64(1.2) >= renew_deadline {
            return Err(TimingsError::Retry {
                retry,
                renew_deadline,
            });
        }
        Ok(Self {
            lease,
            renew_deadline,
            retry,
        })
    }

    /// `spec.leaseDurationSeconds` for a Lease this replica holds (at least 1).
    pub(crate) fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease.as_secs())
            .unwrap_or(i32::MAX)
            .max(1)
    }
}

/// One process of a replica, as recorded on the Lease it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Process {
    /// Where it runs: the host's boot and the network namespace, which the containers of one pod
    /// share. Empty when unknown; an empty site never matches.
    pub(crate) site: String,
    /// Random, different for every process.
    pub(crate) nonce: String,
}

impl Process {
    /// The annotation value, `<site>/<nonce>`.
    pub(crate) fn encode(&self) -> String {
        format!("{}/{}", self.site, self.nonce)
    }

    /// Parses an annotation value written by [`Self::encode`].
    pub(crate) fn decode(value: &str) -> Option<Self> {
        let (site, nonce) = value.rsplit_once('/')?;
        (!nonce.is_empty()).then(|| Self {
            site: site.to_owned(),
            nonce: nonce.to_owned(),
        })
    }

    /// Whether `other` ran in the same pod (same boot, same network namespace).
    fn same_site(&self, other: &Self) -> bool {
        !self.site.is_empty() && self.site == other.site
    }
}

/// This replica: the identity it holds the Lease under, and this process of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// `spec.holderIdentity` when this replica leads: the pod name.
    pub(crate) identity: String,
    /// This process. Its site is set only while the process holds its site's lock, so no other
    /// live process of this identity shares the site.
    pub(crate) process: Process,
}

/// What election reads from the Lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Record {
    /// `spec.holderIdentity`; empty when nobody holds the Lease (released, or never held).
    pub(crate) holder: String,
    /// `spec.leaseDurationSeconds` as the holder wrote it.
    pub(crate) duration_seconds: i32,
    /// `spec.leaseTransitions`.
    pub(crate) transitions: i32,
    /// The holder's process, when a process of ours wrote the Lease.
    pub(crate) process: Option<Process>,
}

impl Record {
    /// The record of `lease`.
    pub(crate) fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.unwrap_or_default(),
            duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            transitions: spec.lease_transitions.unwrap_or(0),
            process: lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PROCESS_ANNOTATION))
                .and_then(|v| Process::decode(v)),
        }
    }

    /// Whether `me` holds the Lease: this identity, and this very process.
    pub(crate) fn held_by(&self, me: &Candidate) -> bool {
        self.holder == me.identity && self.process.as_ref() == Some(&me.process)
    }
}

/// What a standby does after reading the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Write itself in as holder, with this `leaseTransitions`.
    Take {
        /// The value to write.
        transitions: i32,
    },
    /// Someone holds it: look again after the retry period.
    Wait,
}

/// Whether a standby `me` that has seen `record` unchanged for `unchanged_for` may take it.
///
/// As client-go: a free Lease (no holder) is taken at once; a held one only once it has been seen
/// unchanged for its `leaseDurationSeconds` by this replica's clock, never by the timestamps in it
/// (the clocks of two machines need not agree). Every renewal changes the record, so a live
/// leader's Lease never expires. Beyond client-go: a Lease held under this identity by an earlier
/// process of the same pod is taken at once, because the caller holds the site's lock and so that
/// process is gone (a container restarted by the kubelet resumes without waiting for expiry).
pub(crate) fn standby(record: &Record, me: &Candidate, unchanged_for: Duration) -> Verdict {
    let next = record.transitions.saturating_add(1);
    if record.holder.is_empty() {
        return Verdict::Take { transitions: next };
    }
    let ours = record.holder == me.identity
        && record
            .process
            .as_ref()
            .is_some_and(|p| p == &me.process || p.same_site(&me.process));
    if ours {
        return Verdict::Take {
            transitions: record.transitions,
        };
    }
    let lease = Duration::from_secs(u64::try_from(record.duration_seconds).unwrap_or(0));
    if unchanged_for >= lease {
        Verdict::Take { transitions: next }
    } else {
        Verdict::Wait
    }
}

/// What a replica has seen of something, and since when by its own clock: the start of a wait
/// that every change restarts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Observed<T, I> {
    /// The value seen.
    pub(crate) seen: T,
    /// When it was first seen.
    pub(crate) since: I,
}

impl<T: PartialEq, I> Observed<T, I> {
    /// `previous`, if it saw the same value, or else `seen` as of `now`.
    pub(crate) fn update(previous: Option<Self>, seen: T, now: I) -> Self {
        match previous {
            Some(previous) if previous.seen == seen => previous,
            _ => Self { seen, since: now },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeMap;

    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;

    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn process(site: &str, nonce: &str) -> Process {
        Process {
            site: site.into(),
            nonce: nonce.into(),
        }
    }

    fn me() -> Candidate {
        Candidate {
            identity: "pod-a".into(),
            process: process("boot:net", "n2"),
        }
    }

    fn record(holder: &str, process: Option<Process>) -> Record {
        Record {
            holder: holder.into(),
            duration_seconds: 15,
            transitions: 3,
            process,
        }
    }

    #[test]
    fn standby_verdicts() {
        use Verdict::{Take, Wait};
        let cases = [
            (
                "free lease: at once",
                record("", None),
                0,
                Take { transitions: 4 },
            ),
            ("other holder, fresh", record("pod-b", None), 14, Wait),
            (
                "other holder, unchanged for the lease",
                record("pod-b", None),
                15,
                Take { transitions: 4 },
            ),
            (
                "other holder claiming our site: its identity differs",
                record("pod-b", Some(process("boot:net", "n1"))),
                0,
                Wait,
            ),
            (
                "our identity, earlier process of this pod: at once, same holder",
                record("pod-a", Some(process("boot:net", "n1"))),
                0,
                Take { transitions: 3 },
            ),
            (
                "our own write whose answer was lost",
                record("pod-a", Some(process("boot:net", "n2"))),
                0,
                Take { transitions: 3 },
            ),
            (
                "our identity on another host (a twin): wait for expiry",
                record("pod-a", Some(process("other:net", "n1"))),
                14,
                Wait,
            ),
            (
                "our identity, written by an upstream replica or an unknown process",
                record("pod-a", None),
                14,
                Wait,
            ),
            (
                "our identity on another host, expired",
                record("pod-a", Some(process("other:net", "n1"))),
                15,
                Take { transitions: 4 },
            ),
        ];
        for (what, record, unchanged, expected) in cases {
            assert_eq!(standby(&record, &me(), unchanged * S), expected, "{what}");
        }
    }

    #[test]
    fn an_unknown_site_never_matches() {
        let me = Candidate {
            identity: "pod-a".into(),
            process: process("", "n2"),
        };
        let held = record("pod-a", Some(process("", "n1")));
        assert_eq!(standby(&held, &me, 14 * S), Verdict::Wait);
    }

    #[test]
    fn a_zero_or_negative_duration_is_expired_at_once() {
        let mut released_by_hand = record("pod-b", None);
        released_by_hand.duration_seconds = 0;
        assert_eq!(
            standby(&released_by_hand, &me(), Duration::ZERO),
            Verdict::Take { transitions: 4 }
        );
        released_by_hand.duration_seconds = -5;
        assert_eq!(
            standby(&released_by_hand, &me(), Duration::ZERO),
            Verdict::Take { transitions: 4 }
        );
    }

    #[test]
    fn a_leader_holds_the_lease_only_as_this_very_process() {
        let me = me();
        assert!(record("pod-a", Some(me.process.clone())).held_by(&me));
        assert!(!record("pod-a", Some(process("boot:net", "n1"))).held_by(&me));
        assert!(!record("pod-b", Some(me.process.clone())).held_by(&me));
        assert!(!record("", None).held_by(&me));
    }

    #[test]
    fn the_record_is_read_from_spec_and_annotation() {
        let lease = Lease {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    PROCESS_ANNOTATION.to_owned(),
                    "b0-1:net:[4026532281]/00ff".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("pod-a".into()),
                lease_duration_seconds: Some(15),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            }),
        };
        assert_eq!(
            Record::of(&lease),
            Record {
                holder: "pod-a".into(),
                duration_seconds: 15,
                transitions: 2,
                process: Some(process("b0-1:net:[4026532281]", "00ff")),
            }
        );
        assert_eq!(Record::of(&Lease::default()), Record::default());
    }

    #[test]
    fn process_annotation_round_trips_and_rejects_garbage() {
        let p = process("boot:net", "abc");
        assert_eq!(Process::decode(&p.encode()), Some(p));
        assert_eq!(Process::decode("/abc"), Some(process("", "abc")));
        assert_eq!(Process::decode("no-separator"), None);
        assert_eq!(Process::decode("site/"), None);
    }

    #[test]
    fn observation_restarts_only_on_change() {
        let first = Observed::update(None, "r1", 10);
        let same = Observed::update(Some(first), "r1", 20);
        assert_eq!(same.since, 10);
        let changed = Observed::update(Some(same), "r2", 30);
        assert_eq!((changed.seen, changed.since), ("r2", 30));
    }

    #[test]
    fn timings_keep_a_margin_before_expiry_and_room_to_retry() {
        assert!(Timings::new(15 * S, 10 * S, 2 * S).is_ok());
        assert!(matches!(
            Timings::new(10 * S, 10 * S, 2 * S),
            Err(TimingsError::DeadlineNotBeforeExpiry { .. })
        ));
        assert!(matches!(
            Timings::new(15 * S, 10 * S, Duration::ZERO),
            Err(TimingsError::Retry { .. })
        ));
        assert!(matches!(
            Timings::new(15 * S, 10 * S, 9 * S),
            Err(TimingsError::Retry { .. })
        ));
        assert_eq!(
            Timings::new(15 * S, 10 * S, 2 * S).unwrap().lease_seconds(),
            15
        );
    }
}
