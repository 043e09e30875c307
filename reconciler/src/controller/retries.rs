//! Per-key failure counting for the controllers' error policies.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::controller::plan::backoff;

/// Consecutive failures per key, turned into a capped exponential delay that never gives up,
/// with ±20% jitter so that keys failing together do not retry together.
#[derive(Debug)]
pub struct Retries {
    base: Duration,
    cap: Duration,
    attempts: Mutex<HashMap<String, u32>>,
}

impl Retries {
    /// Delays doubling from `base`, capped at `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            attempts: Mutex::default(),
        }
    }

    /// Records one more failure of `key` and returns how long to wait before retrying it.
    #[cfg(test)]
    pub(crate) fn next_delay(&self, key: &str) -> Duration {
        self.next_delay_from(key, Duration::ZERO)
    }

    /// As [`Self::next_delay`], but never less than `floor` (itself capped): for failures that
    /// retrying soon will not cure.
    pub fn next_delay_from(&self, key: &str, floor: Duration) -> Duration {
        self.count(&mut self.attempts(), key, floor)
    }

    /// As [`Self::next_delay`], but counts nothing, and returns `None`, once `exists` says the
    /// key is gone. `exists` is asked under the lock [`Self::retain`] takes: a failure racing
    /// the key's deletion is either counted before the deletion's `retain` drops it, or sees
    /// the key gone, and is never counted after.
    pub fn next_delay_if(&self, key: &str, exists: impl Fn() -> bool) -> Option<Duration> {
        let mut attempts = self.attempts();
        if !exists() {
            attempts.remove(key);
            return None;
        }
        Some(self.count(&mut attempts, key, Duration::ZERO))
    }

    fn count(&self, attempts: &mut HashMap<String, u32>, key: &str, floor: Duration) -> Duration {
        let attempt = attempts.entry(key.to_owned()).or_insert(0);
        let delay = backoff(*attempt, self.base, self.cap).max(floor.min(self.cap));
        *attempt = attempt.saturating_add(1);
        delay.mul_f64(rand::random_range(0.8..=1.2))
    }

    fn attempts(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.attempts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets `key`'s failures, after a success or once the key is gone.
    pub fn reset(&self, key: &str) {
        self.attempts().remove(key);
    }

    /// Forgets the failures of every key `keep` refuses: keys gone without a last success (an
    /// object forced out, a Node deleted) would otherwise stay for the life of the process.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.attempts().retain(|key, _| keep(key));
    }

    /// How many keys have failures counted.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.attempts().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `delay` is `ms` milliseconds give or take the jitter.
    fn around(delay: Duration, ms: u64) -> bool {
        let ms = ms as f64 / 1000.0;
        (ms * 0.8..=ms * 1.2).contains(&delay.as_secs_f64())
    }

    #[test]
    fn delays_grow_per_key_with_jitter_and_restart_after_a_reset() {
        let retries = Retries::new(Duration::from_millis(100), Duration::from_millis(350));
        let delays: Vec<_> = (0..4).map(|_| retries.next_delay("a")).collect();
        for (delay, ms) in delays.iter().zip([100, 200, 350, 350]) {
            assert!(around(*delay, ms), "{delays:?}");
        }
        assert!(around(retries.next_delay("b"), 100));
        retries.reset("a");
        assert!(around(retries.next_delay("a"), 100));
    }

    #[test]
    fn keys_gone_without_a_success_are_forgotten() {
        let retries = Retries::new(Duration::from_millis(100), Duration::from_secs(1));
        for key in ["a", "b", "c"] {
            retries.next_delay(key);
        }
        retries.retain(|key| key == "b");
        assert_eq!(retries.len(), 1);
        retries.retain(|_| false);
        assert_eq!(retries.len(), 0);
    }

    #[test]
    fn a_failure_of_a_key_that_is_gone_is_not_counted() {
        let retries = Retries::new(Duration::from_millis(100), Duration::from_secs(1));
        assert!(around(retries.next_delay_if("a", || true).unwrap(), 100));
        assert!(around(retries.next_delay_if("a", || true).unwrap(), 200));
        assert_eq!(retries.next_delay_if("a", || false), None);
        assert_eq!(retries.len(), 0, "and its earlier failures are forgotten");
    }

    #[test]
    fn jitter_spreads_keys_that_fail_together() {
        let retries = Retries::new(Duration::from_secs(1), Duration::from_secs(60));
        let delays: std::collections::HashSet<Duration> = (0..20)
            .map(|i| retries.next_delay(&format!("k{i}")))
            .collect();
        assert!(delays.len() > 1, "{delays:?}");
    }

    #[test]
    fn a_floor_makes_the_first_retry_slow_but_never_beyond_the_cap() {
        let retries = Retries::new(Duration::from_millis(100), Duration::from_secs(60));
        assert!(around(
            retries.next_delay_from("a", Duration::from_secs(30)),
            30_000
        ));
        let capped = Retries::new(Duration::from_millis(100), Duration::from_secs(2));
        assert!(around(
            capped.next_delay_from("a", Duration::from_secs(30)),
            2_000
        ));
    }
}
