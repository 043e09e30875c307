//! Client-side pacing: a token bucket per cloud API (or API class), so the reconciler spends the
//! account's request budget at the rate the cloud refills it instead of provoking throttling.
//!
//! Hand-rolled on `tokio::time` rather than taken from a rate-limiting crate: the bucket must
//! follow tokio's clock, which tests pause and advance, and must be drained when the cloud says
//! it throttled us; both are a few lines here and awkward through a crate's own clock.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A sustained rate and the burst allowed on top of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// Tokens the bucket holds when full: calls that may go out at once after a quiet spell.
    pub burst: u32,
    /// Tokens added per second: the sustained call rate. Zero or less: no limit.
    pub per_second: f64,
}

impl Rate {
    /// No limit at all.
    pub const UNLIMITED: Self = Self {
        burst: 0,
        per_second: 0.0,
    };

    /// Whether this rate limits anything.
    pub fn is_limited(&self) -> bool {
        self.per_second > 0.0 && self.per_second.is_finite()
    }
}

/// The pace of a cloud's two API classes: reads (describe/get) and mutating calls. Where the
/// cloud meters each API separately (EC2), each API gets its own bucket of its class's rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pacing {
    /// Rate of each read API.
    pub read: Rate,
    /// Rate of each mutating API.
    pub write: Rate,
}

impl Pacing {
    /// No limit on either class.
    pub const UNLIMITED: Self = Self {
        read: Rate::UNLIMITED,
        write: Rate::UNLIMITED,
    };

    /// `self`, with each class's rate replaced where `read` or `write` is given.
    #[must_use]
    pub fn overridden(self, read: Option<Rate>, write: Option<Rate>) -> Self {
        Self {
            read: read.unwrap_or(self.read),
            write: write.unwrap_or(self.write),
        }
    }
}

/// One token bucket on tokio's clock. Starts full.
#[derive(Debug)]
pub struct TokenBucket {
    rate: Rate,
    state: Mutex<Level>,
}

#[derive(Debug)]
struct Level {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket for `rate`.
    pub fn new(rate: Rate) -> Self {
        Self {
            rate,
            state: Mutex::new(Level {
                tokens: f64::from(rate.burst.max(1)),
                at: Instant::now(),
            }),
        }
    }

    /// The bucket's rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    fn capacity(&self) -> f64 {
        f64::from(self.rate.burst.max(1))
    }

    /// Takes a token if one is there; otherwise says how long until one will be.
    fn try_take(&self, take: bool) -> Result<(), Duration> {
        if !self.rate.is_limited() {
            return Ok(());
        }
        let mut level = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let refilled = now.duration_since(level.at).as_secs_f64() * self.rate.per_second;
        level.tokens = (level.tokens + refilled).min(self.capacity());
        level.at = now;
        if level.tokens >= 1.0 {
            if take {
                level.tokens -= 1.0;
            }
            Ok(())
        } else {
            let missing = 1.0 - level.tokens;
            Err(Duration::from_secs_f64(missing / self.rate.per_second))
        }
    }

    /// Waits for a token and takes it.
    pub async fn acquire(&self) {
        while let Err(wait) = self.try_take(true) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits until a token is there, without taking it.
    pub async fn until_available(&self) {
        while let Err(wait) = self.try_take(false) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Empties the bucket: the cloud throttled us, so its own bucket is empty whatever ours says
    /// (another client of the account spends the same budget).
    pub fn drain(&self) {
        let mut level = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        level.tokens = 0.0;
        level.at = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(burst: u32, per_second: f64) -> TokenBucket {
        TokenBucket::new(Rate { burst, per_second })
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_bucket_lets_the_burst_through_then_paces_at_the_refill_rate() {
        let b = bucket(5, 2.0);
        let start = Instant::now();
        for _ in 0..5 {
            b.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        for _ in 0..4 {
            b.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn refill_stops_at_the_burst() {
        let b = bucket(3, 10.0);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = Instant::now();
        for _ in 0..4 {
            b.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn draining_makes_the_next_call_wait_for_a_refill_and_waiting_takes_nothing() {
        let b = bucket(50, 5.0);
        b.drain();
        let start = Instant::now();
        b.until_available().await;
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        b.until_available().await;
        b.acquire().await;
        assert_eq!(start.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_rate_never_waits() {
        let b = TokenBucket::new(Rate::UNLIMITED);
        b.drain();
        let start = Instant::now();
        for _ in 0..1000 {
            b.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
