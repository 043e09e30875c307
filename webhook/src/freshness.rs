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

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a watch may fail, or kube-apiserver stay unreachable, before the caches count as
/// stale. Long enough to ride out a watch's routine reconnect and one lost probe; short enough
/// that a partitioned replica leaves the Service well inside the first minute.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// The failing signals and since when each has failed.
#[derive(Debug)]
pub struct Freshness {
    stale_after: Duration,
    /// Since when each watch has failed without an event in between, by watch.
    watches: Mutex<[Option<Instant>; WATCHES]>,
    /// When kube-apiserver last answered a probe; `None` while nothing probes (tests, benchmarks).
    reached: Mutex<Option<Instant>>,
}

/// The watches whose failures are tracked: Nodes, CloudPrivateIPConfigs, EgressRouters, NADs.
pub const WATCHES: usize = 4;

impl Freshness {
    /// Fresh, with `stale_after` as the bound.
    pub fn new(stale_after: Duration) -> Self {
        Self {
            stale_after,
            watches: Mutex::new([None; WATCHES]),
            reached: Mutex::new(None),
        }
    }

    /// The bound.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// Watch `index` failed at `now`; the first failure of a run starts its clock.
    pub fn watch_failed(&self, index: usize, now: Instant) {
        if let Some(since) = self.lock_watches().get_mut(index) {
            since.get_or_insert(now);
        }
    }

    /// Watch `index` delivered an event: whatever failed before has recovered.
    pub fn watch_ok(&self, index: usize) {
        if let Some(since) = self.lock_watches().get_mut(index) {
            *since = None;
        }
    }

    /// kube-apiserver answered at `now`.
    pub fn reached(&self, now: Instant) {
        *self.reached.lock().unwrap_or_else(PoisonError::into_inner) = Some(now);
    }

    /// Why the caches are stale at `now` (watches `of` considered), or `None` when they are not.
    pub fn stale(&self, now: Instant, of: &[usize]) -> Option<&'static str> {
        let reached = *self.reached.lock().unwrap_or_else(PoisonError::into_inner);
        if reached.is_some_and(|at| now.saturating_duration_since(at) > self.stale_after) {
            return Some("watch caches stale: kube-apiserver unreachable");
        }
        let watches = self.lock_watches();
        of.iter()
            .filter_map(|index| watches.get(*index).copied().flatten())
            .any(|since| now.saturating_duration_since(since) > self.stale_after)
            .then_some("watch caches stale: a watch keeps failing")
    }

    fn lock_watches(&self) -> std::sync::MutexGuard<'_, [Option<Instant>; WATCHES]> {
        self.watches.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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
