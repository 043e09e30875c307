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

/// A change to a published rate: the burst, the sustained rate, or both (`per_second` 0: no
/// limit).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RateOverride {
    /// Tokens the bucket holds when full, instead of the published burst.
    pub burst: Option<u32>,
    /// Tokens added per second, instead of the published rate.
    pub per_second: Option<f64>,
}

impl RateOverride {
    /// `published`, changed as this override says.
    pub fn over(&self, published: Rate) -> Rate {
        Rate {
            burst: self.burst.unwrap_or(published.burst),
            per_second: self.per_second.unwrap_or(published.per_second),
        }
    }
}

/// How a provider paces itself: the cloud's published rate for each API, changed per class
/// (reads, mutating calls) by the operator's flags.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pacing {
    /// Applied to every read API's published rate.
    pub read: RateOverride,
    /// Applied to every mutating API's published rate.
    pub write: RateOverride,
}

impl Pacing {
    /// The cloud's published rates, unchanged.
    pub const PUBLISHED: Self = Self {
        read: RateOverride {
            burst: None,
            per_second: None,
        },
        write: RateOverride {
            burst: None,
            per_second: None,
        },
    };

    /// No client-side limit at all.
    pub const UNLIMITED: Self = Self {
        read: RateOverride {
            burst: None,
            per_second: Some(0.0),
        },
        write: RateOverride {
            burst: None,
            per_second: Some(0.0),
        },
    };

    /// The rate of an API published at `published`; `mutating` picks the class.
    pub fn rate(&self, mutating: bool, published: Rate) -> Rate {
        if mutating {
            self.write.over(published)
        } else {
            self.read.over(published)
        }
    }
}

/// When a call may spend a token: once the bucket also holds one for each of `others` calls
/// waiting to follow it (or is full), so that a call never takes a token those need; the
/// `claimed` tokens of calls let through before do not count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spend {
    /// Calls waiting to follow this one.
    pub others: usize,
    /// Calls let through before this one whose tokens may not be taken yet: a call takes its
    /// token only once it reaches the cloud (after the ledger's write and the provider's read),
    /// so until then the bucket still shows it. Counting a call whose token is taken already
    /// only makes this one wait for it.
    pub claimed: usize,
}

impl Spend {
    /// Any token will do.
    pub const ANY: Self = Self {
        others: 0,
        claimed: 0,
    };
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

    /// Takes a token if there is one to spend as `spend` says; otherwise says how long until
    /// there will be.
    fn try_take(&self, take: bool, spend: Spend) -> Result<(), Duration> {
        if !self.rate.is_limited() {
            return Ok(());
        }
        let mut level = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let refilled = now.duration_since(level.at).as_secs_f64() * self.rate.per_second;
        level.tokens = (level.tokens + refilled).min(self.capacity());
        level.at = now;
        let wanted = u32::try_from(spend.others.saturating_add(1)).unwrap_or(u32::MAX);
        let claimed = f64::from(u32::try_from(spend.claimed).unwrap_or(u32::MAX));
        let needed = f64::from(wanted).min(self.capacity()) + claimed;
        if level.tokens >= needed {
            if take {
                level.tokens -= 1.0;
            }
            Ok(())
        } else {
            let missing = needed - level.tokens;
            // Whole milliseconds, rounded up (the timer's resolution): a wait rounded down to
            // the nanosecond ends a hair short of the token, and the next one is zero, which on
            // a paused clock never ends.
            let millis = (missing / self.rate.per_second * 1000.0).ceil();
            Err(Duration::from_secs_f64(millis / 1000.0))
        }
    }

    /// Waits for a token and takes it.
    pub async fn acquire(&self) {
        while let Err(wait) = self.try_take(true, Spend::ANY) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits until a call may spend a token as `spend` says, without taking it.
    pub async fn until_available(&self, spend: Spend) {
        while let Err(wait) = self.try_take(false, spend) {
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
        b.until_available(Spend::ANY).await;
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        b.until_available(Spend::ANY).await;
        b.acquire().await;
        assert_eq!(start.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_leaves_a_token_for_each_call_behind_it_or_waits_for_a_full_bucket() {
        let b = bucket(10, 5.0);
        let start = Instant::now();
        for _ in 0..6 {
            b.acquire().await;
        }
        b.until_available(Spend {
            others: 3,
            claimed: 0,
        })
        .await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "four tokens left: this call and three"
        );
        b.until_available(Spend {
            others: 4,
            claimed: 0,
        })
        .await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(200),
            "one token to refill"
        );
        b.until_available(Spend {
            others: 50,
            claimed: 0,
        })
        .await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(1200),
            "more than the burst: full"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_with_the_token_there() {
        // A third of a second is no whole number of nanoseconds.
        let b = bucket(1, 3.0);
        b.acquire().await;
        let Err(wait) = b.try_take(false, Spend::ANY) else {
            panic!("the bucket should be empty");
        };
        tokio::time::advance(wait).await;
        assert_eq!(b.try_take(false, Spend::ANY), Ok(()));
    }

    #[test]
    fn overrides_change_only_what_they_name_and_only_their_class() {
        let published = Rate {
            burst: 100,
            per_second: 5.0,
        };
        let pacing = Pacing {
            read: RateOverride::default(),
            write: RateOverride {
                burst: Some(10),
                per_second: None,
            },
        };
        assert_eq!(pacing.rate(false, published), published);
        assert_eq!(
            pacing.rate(true, published),
            Rate {
                burst: 10,
                per_second: 5.0
            }
        );
        assert!(!Pacing::UNLIMITED.rate(true, published).is_limited());
        assert_eq!(Pacing::PUBLISHED.rate(true, published), published);
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
