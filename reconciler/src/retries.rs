//! Per-key failure counting for the controllers' error policies.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::plan::backoff;

/// Consecutive failures per key, turned into a capped exponential delay that never gives up.
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
    pub fn next_delay(&self, key: &str) -> Duration {
        let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        let attempt = attempts.entry(key.to_owned()).or_insert(0);
        let delay = backoff(*attempt, self.base, self.cap);
        *attempt = attempt.saturating_add(1);
        delay
    }

    /// Forgets `key`'s failures, after a success or once the key is gone.
    pub fn reset(&self, key: &str) {
        self.attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_per_key_and_restart_after_a_reset() {
        let retries = Retries::new(Duration::from_millis(100), Duration::from_millis(350));
        let delays: Vec<_> = (0..4).map(|_| retries.next_delay("a")).collect();
        assert_eq!(
            delays,
            [100, 200, 350, 350].map(Duration::from_millis).to_vec()
        );
        assert_eq!(retries.next_delay("b"), Duration::from_millis(100));
        retries.reset("a");
        assert_eq!(retries.next_delay("a"), Duration::from_millis(100));
    }
}
