//! The node agents' heartbeats as the leader sees them. A Lease's `renewTime` comes from the
//! agent's clock, so it is believed once, at first sight (how old it was then); after that a
//! heartbeat is the moment this process saw `renewTime` change, on its own monotonic clock,
//! so clock skew between nodes and this process cannot make a dead agent look alive.

use std::collections::HashMap;
use std::time::Duration;

use cloudnet_shared::gateway::node_of_lease;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::time::Instant;

/// The last heartbeat seen of each node's agent.
#[derive(Debug)]
pub(crate) struct Heartbeats {
    timeout: Duration,
    seen: HashMap<String, (Option<Timestamp>, Instant)>,
}

impl Heartbeats {
    /// Heartbeats older than `timeout` are stale.
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            seen: HashMap::new(),
        }
    }

    /// Takes in the Leases as they are now (`now` on this clock, `wall` on the wall clock);
    /// forgets the nodes whose Lease is gone.
    pub(crate) fn observe<'a>(
        &mut self,
        leases: impl IntoIterator<Item = &'a Lease>,
        now: Instant,
        wall: Timestamp,
    ) {
        let mut seen = HashMap::with_capacity(self.seen.len());
        for lease in leases {
            let name = lease.name_any();
            let Some(node) = node_of_lease(&name) else {
                continue;
            };
            let renewed = lease
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0);
            let at = match self.seen.remove(node) {
                Some((before, at)) if before == renewed => at,
                Some(_) => now,
                // First sight: as old as its renewTime says, no younger than now.
                None => {
                    let age = renewed
                        .and_then(|t| wall.duration_since(t).try_into().ok())
                        .unwrap_or(self.timeout);
                    now.checked_sub(age).unwrap_or(now)
                }
            };
            seen.insert(node.to_owned(), (renewed, at));
        }
        self.seen = seen;
    }

    /// When `node`'s agent was last heard from, if ever.
    pub(crate) fn last(&self, node: &str) -> Option<Instant> {
        self.seen.get(node).map(|(_, at)| *at)
    }

    /// Whether `node`'s agent was heard from within the timeout.
    pub(crate) fn fresh(&self, node: &str, now: Instant) -> bool {
        self.last(node)
            .is_some_and(|at| now.duration_since(at) < self.timeout)
    }

    /// When the first heartbeat that is fresh now turns stale: the next time a choice may change
    /// with no event.
    pub(crate) fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.seen
            .values()
            .map(|(_, at)| *at + self.timeout)
            .filter(|expiry| *expiry > now)
            .min()
    }

    /// Each node's heartbeat age, for the metrics.
    pub(crate) fn ages(&self, now: Instant) -> impl Iterator<Item = (&str, Duration)> {
        self.seen
            .iter()
            .map(move |(node, (_, at))| (node.as_str(), now.duration_since(*at)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;

    fn lease(node: &str, renewed: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(format!("cloudnet-node-{node}")),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_is_when_renew_time_changed_on_this_clock_and_first_sight_trusts_its_age() {
        let timeout = Duration::from_secs(3);
        let mut beats = Heartbeats::new(timeout);
        let wall: Timestamp = "2026-11-29T10:00:10Z".parse().unwrap();
        let old: Timestamp = "2026-11-29T10:00:00Z".parse().unwrap();
        let now = Instant::now() + Duration::from_secs(60);
        beats.observe([&lease("a", wall), &lease("b", old)], now, wall);
        assert!(beats.fresh("a", now));
        assert!(!beats.fresh("b", now), "ten seconds old at first sight");
        assert!(!beats.fresh("c", now), "never heard from");

        // The wall clock no longer matters: an unchanged renewTime ages on this clock.
        let later = now + timeout;
        beats.observe([&lease("a", wall), &lease("b", old)], later, old);
        assert!(!beats.fresh("a", later));
        let renewed: Timestamp = "2026-11-29T09:00:00Z".parse().unwrap();
        beats.observe([&lease("a", renewed)], later, wall);
        assert!(
            beats.fresh("a", later),
            "changed, however skewed the agent's clock"
        );
        assert_eq!(beats.last("b"), None, "its Lease is gone");
        assert_eq!(beats.next_expiry(later), Some(later + timeout));
    }
}
