//! Whether the watch caches are current: a cache whose watch keeps failing, or that cannot reach
//! kube-apiserver at all, is stale, and a stale cache must not decide admissions.
//!
//! Two signals, because each misses a case the other sees. A watch that is refused or reset
//! reports errors at once, and the watcher retries with backoff; each error is noted here and any
//! event clears it. A watch cut by a partition (packets dropped, nothing refused) reports nothing
//! until its read times out, minutes later; a cheap request to kube-apiserver every few seconds,
//! with a short timeout, sees that. Either failing for longer than the bound makes the webhook not
//! ready (`/readyz` 503, and the cache-reading endpoints answer 503 so that `failurePolicy`
//! decides), and both recovering makes it ready again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a watch may fail, or kube-apiserver stay unreachable, before the caches count as
/// stale. Long enough to ride out a watch's routine reconnect and one lost probe; short enough
/// that a partitioned replica leaves the Service well inside the first minute.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// The watches whose failures are tracked: Nodes, CloudPrivateIPConfigs, EgressRouters, NADs,
/// the ledger's ConfigMaps, EgressPublicIPs, opted-in Antrea ExternalIPPools, EgressGateways.
const WATCHES: usize = 8;

/// The failing signals and since when each has failed. Read on every cache-reading review, so
/// kept in atomics (no lock on the admission path): each moment is stored as nanoseconds after
/// `epoch`, plus one, with 0 meaning "none".
#[derive(Debug)]
pub struct Freshness {
    stale_after: Duration,
    epoch: Instant,
    /// Since when each watch has failed without an event in between, by watch.
    watches: [AtomicU64; WATCHES],
    /// When kube-apiserver last answered a probe; none while nothing probes (tests, benchmarks).
    reached: AtomicU64,
}

impl Freshness {
    /// Fresh, with `stale_after` as the bound.
    pub fn new(stale_after: Duration) -> Self {
        Self {
            stale_after,
            epoch: Instant::now(),
            watches: Default::default(),
            reached: AtomicU64::new(NONE),
        }
    }

    /// The bound.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// Watch `index` failed at `now`; the first failure of a run starts its clock.
    pub fn watch_failed(&self, index: usize, now: Instant) {
        if let Some(since) = self.watches.get(index) {
            // Only an unset clock is started; a failing one keeps its start.
            let _ =
                since.compare_exchange(NONE, self.stamp(now), Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Watch `index` delivered an event: whatever failed before has recovered.
    pub fn watch_ok(&self, index: usize) {
        if let Some(since) = self.watches.get(index) {
            since.store(NONE, Ordering::Release);
        }
    }

    /// kube-apiserver answered at `now`.
    pub fn reached(&self, now: Instant) {
        self.reached.store(self.stamp(now), Ordering::Release);
    }

    /// Why the caches are stale at `now` (watches `of` considered), or `None` when they are not.
    pub fn stale(&self, now: Instant, of: &[usize]) -> Option<&'static str> {
        let longer = |at: &AtomicU64| {
            self.moment(at.load(Ordering::Acquire))
                .is_some_and(|at| now.saturating_duration_since(at) > self.stale_after)
        };
        if longer(&self.reached) {
            return Some("watch caches stale: kube-apiserver unreachable");
        }
        of.iter()
            .filter_map(|index| self.watches.get(*index))
            .any(longer)
            .then_some("watch caches stale: a watch keeps failing")
    }

    fn stamp(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1
    }

    fn moment(&self, stamp: u64) -> Option<Instant> {
        let nanos = stamp.checked_sub(1)?;
        Some(self.epoch + Duration::from_nanos(nanos))
    }
}

/// A stored moment meaning "none".
const NONE: u64 = 0;

/// Asks kube-apiserver for its version every third of the bound, each ask bounded by the same,
/// and notes every answer; runs until the process stops.
pub async fn probe(client: kube::Client, freshness: &Freshness) {
    let every = freshness.stale_after() / 3;
    // The clock starts now: the first probes get the whole bound.
    freshness.reached(Instant::now());
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match tokio::time::timeout(every, client.apiserver_version()).await {
            Ok(Ok(_)) => freshness.reached(Instant::now()),
            Ok(Err(error)) => tracing::debug!(%error, "kube-apiserver probe failed"),
            Err(_) => tracing::debug!("kube-apiserver probe timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_failing_longer_than_the_bound_is_stale_until_an_event() {
        let bound = Duration::from_secs(30);
        let fresh = Freshness::new(bound);
        let start = Instant::now();
        fresh.reached(start);
        assert_eq!(fresh.stale(start, &[0, 1]), None);
        fresh.watch_failed(1, start);
        // Later failures do not restart the clock.
        fresh.watch_failed(1, start + Duration::from_secs(20));
        fresh.reached(start + Duration::from_secs(31));
        assert_eq!(fresh.stale(start + Duration::from_secs(29), &[0, 1]), None);
        let later = start + Duration::from_secs(31);
        assert_eq!(
            fresh.stale(later, &[0, 1]),
            Some("watch caches stale: a watch keeps failing")
        );
        assert_eq!(
            fresh.stale(later, &[0, 2]),
            None,
            "only the watches asked about"
        );
        fresh.watch_ok(1);
        assert_eq!(fresh.stale(later, &[0, 1]), None);
    }

    #[test]
    fn an_unreachable_apiserver_is_stale_after_the_bound() {
        let fresh = Freshness::new(Duration::from_secs(30));
        let start = Instant::now();
        assert_eq!(
            fresh.stale(start + Duration::from_secs(3600), &[]),
            None,
            "nothing probes yet"
        );
        fresh.reached(start);
        assert_eq!(fresh.stale(start + Duration::from_secs(30), &[]), None);
        assert_eq!(
            fresh.stale(start + Duration::from_secs(31), &[]),
            Some("watch caches stale: kube-apiserver unreachable")
        );
        fresh.reached(start + Duration::from_secs(40));
        assert_eq!(fresh.stale(start + Duration::from_secs(41), &[]), None);
    }
}
