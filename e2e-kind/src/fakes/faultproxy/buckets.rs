//! Token-bucket throttling as EC2 meters its API: every action draws from a bucket of its own,
//! sized by the action's class, and a call finding its bucket empty is refused.
//!
//! EC2's published defaults ("Request throttling for the Amazon EC2 API",
//! <https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html>): non-mutating
//! actions (`Describe*`, `List*`, `Search*`, `Get*`) have a bucket of 100 tokens refilled at 20 per
//! second, mutating actions 50 tokens refilled at 5 per second; some actions have their own
//! ([`TokenBuckets::ec2`] lists those the reconciler calls). The arithmetic ([`TokenBucket`])
//! takes the time as an argument, so its tests need no clock.

use std::collections::BTreeMap;
use std::time::Instant;

/// The size and refill rate of one bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketLimits {
    /// Tokens a full bucket holds: the largest burst.
    pub capacity: f64,
    /// Tokens added per second, up to `capacity`.
    pub refill_per_second: f64,
}

impl BucketLimits {
    /// EC2's non-mutating actions: 100 tokens, 20 per second.
    pub const EC2_NON_MUTATING: Self = Self {
        capacity: 100.0,
        refill_per_second: 20.0,
    };
    /// EC2's mutating actions: 50 tokens, 5 per second.
    pub const EC2_MUTATING: Self = Self {
        capacity: 50.0,
        refill_per_second: 5.0,
    };
}

/// Which bucket size applies to a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionClass {
    /// Reads: EC2's `Describe*`, `List*`, `Search*`, `Get*`; a REST `GET` or `HEAD`.
    NonMutating,
    /// Everything else.
    Mutating,
}

impl ActionClass {
    /// The class of `route` as the proxy names routes (the EC2 action, or `METHOD /path`).
    pub fn of(route: &str) -> Self {
        const READS: [&str; 6] = ["Describe", "List", "Search", "Get", "GET ", "HEAD "];
        if READS.iter().any(|p| route.starts_with(p)) {
            Self::NonMutating
        } else {
            Self::Mutating
        }
    }
}

/// How the proxy meters calls in token-bucket mode: one bucket per route, sized by its class
/// unless the route has limits of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBuckets {
    /// Limits of the non-mutating routes.
    pub non_mutating: BucketLimits,
    /// Limits of the mutating routes.
    pub mutating: BucketLimits,
    /// Limits of single routes, overriding their class.
    pub routes: BTreeMap<String, BucketLimits>,
}

impl TokenBuckets {
    /// EC2's published defaults for both classes, and the actions the reconciler calls that
    /// EC2 meters apart: `Assign…`/`UnassignPrivateIpAddresses` (uncategorized actions, 100 at 5
    /// per second) and `DescribeInstances`/`DescribeNetworkInterfaces` without a filter or
    /// pagination (50 at 10 per second).
    pub fn ec2() -> Self {
        let own = BucketLimits {
            capacity: 100.0,
            refill_per_second: 5.0,
        };
        let unfiltered = BucketLimits {
            capacity: 50.0,
            refill_per_second: 10.0,
        };
        Self {
            non_mutating: BucketLimits::EC2_NON_MUTATING,
            mutating: BucketLimits::EC2_MUTATING,
            routes: BTreeMap::new(),
        }
        .with_route("AssignPrivateIpAddresses", own)
        .with_route("AssignIpv6Addresses", own)
        .with_route("UnassignPrivateIpAddresses", own)
        .with_route("DescribeInstances", unfiltered)
        .with_route("DescribeNetworkInterfaces", unfiltered)
    }

    /// These buckets with `limits` for the `class` routes.
    pub fn with_class(mut self, class: ActionClass, limits: BucketLimits) -> Self {
        match class {
            ActionClass::NonMutating => self.non_mutating = limits,
            ActionClass::Mutating => self.mutating = limits,
        }
        self
    }

    /// These buckets with `limits` for `route` alone.
    pub fn with_route(mut self, route: impl Into<String>, limits: BucketLimits) -> Self {
        self.routes.insert(route.into(), limits);
        self
    }

    /// The limits of `route`'s bucket.
    pub fn limits_for(&self, route: &str) -> BucketLimits {
        match self.routes.get(route) {
            Some(limits) => *limits,
            None => match ActionClass::of(route) {
                ActionClass::NonMutating => self.non_mutating,
                ActionClass::Mutating => self.mutating,
            },
        }
    }
}

/// One bucket's state. Starts full, as EC2's do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenBucket {
    limits: BucketLimits,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(limits: BucketLimits, now: Instant) -> Self {
        Self {
            limits,
            tokens: limits.capacity,
            updated: now,
        }
    }

    /// Takes one token at `now`: false (and nothing taken) when fewer than one is left.
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// The tokens left at `now`.
    pub fn tokens(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    fn refill(&mut self, now: Instant) {
        // A time before the last update (callers racing for the lock) adds nothing.
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens =
            (self.tokens + elapsed * self.limits.refill_per_second).min(self.limits.capacity);
        self.updated = self.updated.max(now);
    }
}

/// The buckets in force and their state per route, behind one lock in the proxy.
#[derive(Debug)]
pub(crate) struct Meter {
    config: TokenBuckets,
    buckets: BTreeMap<String, TokenBucket>,
}

impl Meter {
    pub(crate) fn new(config: TokenBuckets) -> Self {
        Self {
            config,
            buckets: BTreeMap::new(),
        }
    }

    /// Takes a token from `route`'s bucket (made full on first use); false if it is empty.
    pub(crate) fn admit(&mut self, route: &str, now: Instant) -> bool {
        let limits = self.config.limits_for(route);
        self.buckets
            .entry(route.to_owned())
            .or_insert_with(|| TokenBucket::new(limits, now))
            .try_take(now)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const LIMITS: BucketLimits = BucketLimits {
        capacity: 50.0,
        refill_per_second: 5.0,
    };

    fn taken(bucket: &mut TokenBucket, calls: usize, now: Instant) -> usize {
        (0..calls).filter(|_| bucket.try_take(now)).count()
    }

    #[test]
    fn a_full_bucket_allows_one_burst_of_its_capacity() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(LIMITS, t0);
        assert_eq!(taken(&mut bucket, 80, t0), 50);
        assert!(!bucket.try_take(t0), "empty until time passes");
    }

    #[test]
    fn an_empty_bucket_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(LIMITS, t0);
        assert_eq!(taken(&mut bucket, 50, t0), 50);
        // 5 per second: nothing after 100 ms, one after 200 ms, ten after two seconds.
        assert!(!bucket.try_take(t0 + Duration::from_millis(100)));
        assert!(bucket.try_take(t0 + Duration::from_millis(200)));
        assert!(!bucket.try_take(t0 + Duration::from_millis(200)));
        let later = t0 + Duration::from_millis(2200);
        assert_eq!(taken(&mut bucket, 20, later), 10);
    }

    #[test]
    fn refill_stops_at_the_capacity() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(LIMITS, t0);
        assert_eq!(taken(&mut bucket, 10, t0), 10);
        let much_later = t0 + Duration::from_secs(3600);
        assert_eq!(bucket.tokens(much_later), 50.0);
        assert_eq!(taken(&mut bucket, 80, much_later), 50);
    }

    #[test]
    fn a_time_before_the_last_update_adds_no_tokens() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let mut bucket = TokenBucket::new(LIMITS, t0);
        assert_eq!(taken(&mut bucket, 50, t1), 50);
        assert!(!bucket.try_take(t0));
        assert!(bucket.try_take(t1 + Duration::from_millis(200)));
    }

    #[test]
    fn routes_take_their_class_limits_unless_set_alone() {
        let buckets = TokenBuckets::ec2().with_route("DescribeInstances", LIMITS);
        let own = BucketLimits {
            capacity: 100.0,
            refill_per_second: 5.0,
        };
        let unfiltered = BucketLimits {
            capacity: 50.0,
            refill_per_second: 10.0,
        };
        let cases = [
            ("DescribeNetworkInterfaces", unfiltered),
            ("DescribeSubnets", BucketLimits::EC2_NON_MUTATING),
            ("GetConsoleOutput", BucketLimits::EC2_NON_MUTATING),
            ("AssignPrivateIpAddresses", own),
            ("AssignIpv6Addresses", own),
            ("UnassignPrivateIpAddresses", own),
            ("UnassignIpv6Addresses", BucketLimits::EC2_MUTATING),
            ("DescribeInstances", LIMITS),
            ("GET /compute/v1/x", BucketLimits::EC2_NON_MUTATING),
            ("PATCH /compute/v1/x", BucketLimits::EC2_MUTATING),
        ];
        for (route, limits) in cases {
            assert_eq!(buckets.limits_for(route), limits, "{route}");
        }
        let reads = BucketLimits {
            capacity: 1.0,
            refill_per_second: 1.0,
        };
        let buckets = buckets.with_class(ActionClass::NonMutating, reads);
        assert_eq!(buckets.limits_for("DescribeSubnets"), reads);
        assert_eq!(buckets.limits_for("DescribeInstances"), LIMITS);
    }

    #[test]
    fn each_route_draws_from_its_own_bucket() {
        let t0 = Instant::now();
        let mut meter = Meter::new(TokenBuckets::ec2());
        let admitted =
            |meter: &mut Meter, route| (0..60).filter(|_| meter.admit(route, t0)).count();
        assert_eq!(admitted(&mut meter, "UnassignIpv6Addresses"), 50);
        assert_eq!(admitted(&mut meter, "CreateTags"), 50);
        assert_eq!(admitted(&mut meter, "AssignPrivateIpAddresses"), 60);
        assert_eq!(admitted(&mut meter, "DescribeInstances"), 50);
        assert_eq!(admitted(&mut meter, "DescribeSubnets"), 60);
    }
}
