//! What the proxy does to a request: rules keyed by route, and the seeded draw that picks a fault.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Which requests a [`Rule`] applies to. The most specific match wins: an exact route, then the
/// longest prefix, then [`RouteMatch::Any`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteMatch {
    /// Every request.
    Any,
    /// Routes equal to this one (`AssignPrivateIpAddresses`, `PATCH /compute/v1/...`).
    Exact(String),
    /// Routes starting with this (`Describe`, `GET /compute/v1/projects/p/zones/`).
    Prefix(String),
}

impl RouteMatch {
    /// Matches exactly `route`.
    pub fn exact(route: impl Into<String>) -> Self {
        Self::Exact(route.into())
    }

    /// Matches every route starting with `prefix`.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        Self::Prefix(prefix.into())
    }

    /// Whether this matches `route` at all.
    pub(crate) fn matches(&self, route: &str) -> bool {
        self.specificity(route).is_some()
    }

    /// How well this matches `route`: `None` if not at all, larger is more specific.
    fn specificity(&self, route: &str) -> Option<usize> {
        match self {
            Self::Any => Some(0),
            Self::Prefix(p) if route.starts_with(p.as_str()) => Some(1 + p.len()),
            Self::Exact(e) if e == route => Some(usize::MAX),
            _ => None,
        }
    }
}

/// Faults injected into the requests a rule matches. Probabilities are independent slices of one
/// draw per request, so they must sum to at most 1.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rule {
    /// Added before the request is answered or forwarded (also before injected answers, as a
    /// busy cloud is slow to refuse too).
    pub latency: Duration,
    /// Probability of a throttling answer (EC2: 503 `RequestLimitExceeded`; REST: 429).
    pub throttle: f64,
    /// Probability of a 500 answer.
    pub server_error: f64,
    /// Probability that the connection is closed without an answer.
    pub drop: f64,
}

impl Rule {
    /// No faults: forward everything at once.
    pub const PASS: Self = Self {
        latency: Duration::ZERO,
        throttle: 0.0,
        server_error: 0.0,
        drop: 0.0,
    };

    /// This rule with `latency` added to every request.
    pub fn with_latency(self, latency: Duration) -> Self {
        Self { latency, ..self }
    }

    /// This rule throttling with probability `p`.
    pub fn with_throttle(self, p: f64) -> Self {
        Self {
            throttle: p,
            ..self
        }
    }

    /// This rule answering 500 with probability `p`.
    pub fn with_server_error(self, p: f64) -> Self {
        Self {
            server_error: p,
            ..self
        }
    }

    /// This rule dropping the connection with probability `p`.
    pub fn with_drop(self, p: f64) -> Self {
        Self { drop: p, ..self }
    }
}

/// What happens to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Sent to the upstream and its answer returned.
    Forward,
    /// Answered with a throttling error.
    Throttle,
    /// Answered with a 500.
    ServerError,
    /// Connection closed without an answer.
    Drop,
}

/// The rule set and the random source, behind one lock in the proxy.
#[derive(Debug)]
pub(crate) struct Rules {
    rules: BTreeMap<RouteMatch, Rule>,
    rng: StdRng,
}

impl Rules {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            rules: BTreeMap::new(),
            rng: StdRng::seed_from_u64(seed),
        }
    }

    pub(crate) fn set(&mut self, matcher: RouteMatch, rule: Rule) {
        self.rules.insert(matcher, rule);
    }

    pub(crate) fn clear(&mut self) {
        self.rules.clear();
    }

    pub(crate) fn reseed(&mut self, seed: u64) {
        self.rng = StdRng::seed_from_u64(seed);
    }

    /// The rule for `route` (no faults when none matches).
    pub(crate) fn rule_for(&self, route: &str) -> Rule {
        self.rules
            .iter()
            .filter_map(|(m, r)| m.specificity(route).map(|s| (s, *r)))
            .max_by_key(|(s, _)| *s)
            .map_or(Rule::PASS, |(_, r)| r)
    }

    /// Draws the fate of one request under `rule`.
    pub(crate) fn draw(&mut self, rule: &Rule) -> Fate {
        if rule.drop + rule.throttle + rule.server_error <= 0.0 {
            return Fate::Forward;
        }
        let x: f64 = self.rng.random();
        if x < rule.drop {
            Fate::Drop
        } else if x < rule.drop + rule.throttle {
            Fate::Throttle
        } else if x < rule.drop + rule.throttle + rule.server_error {
            Fate::ServerError
        } else {
            Fate::Forward
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_specific_rule_wins() {
        let mut rules = Rules::new(1);
        let any = Rule::PASS.with_latency(Duration::from_millis(1));
        let describe = Rule::PASS.with_latency(Duration::from_millis(2));
        let describe_ni = Rule::PASS.with_latency(Duration::from_millis(3));
        let exact = Rule::PASS.with_latency(Duration::from_millis(4));
        rules.set(RouteMatch::Any, any);
        rules.set(RouteMatch::prefix("Describe"), describe);
        rules.set(RouteMatch::prefix("DescribeNetwork"), describe_ni);
        rules.set(RouteMatch::exact("DescribeNetworkInterfaces"), exact);
        assert_eq!(rules.rule_for("AssignIpv6Addresses"), any);
        assert_eq!(rules.rule_for("DescribeSubnets"), describe);
        assert_eq!(
            rules.rule_for("DescribeNetworkInterfacePermissions"),
            describe_ni
        );
        assert_eq!(rules.rule_for("DescribeNetworkInterfaces"), exact);
        rules.clear();
        assert_eq!(rules.rule_for("DescribeSubnets"), Rule::PASS);
    }

    #[test]
    fn draws_follow_the_probabilities_and_the_seed() {
        let rule = Rule::PASS
            .with_throttle(0.2)
            .with_drop(0.1)
            .with_server_error(0.1);
        let draw_all = |seed| {
            let mut rules = Rules::new(seed);
            (0..10_000).map(|_| rules.draw(&rule)).collect::<Vec<_>>()
        };
        let fates = draw_all(7);
        assert_eq!(fates, draw_all(7), "same seed, same fates");
        let share = |f| fates.iter().filter(|x| **x == f).count() as f64 / 10_000.0;
        assert!((share(Fate::Throttle) - 0.2).abs() < 0.03);
        assert!((share(Fate::Drop) - 0.1).abs() < 0.03);
        assert!((share(Fate::ServerError) - 0.1).abs() < 0.03);
        assert!((share(Fate::Forward) - 0.6).abs() < 0.03);
    }

    #[test]
    fn pass_rule_always_forwards() {
        let mut rules = Rules::new(3);
        assert!((0..1000).all(|_| rules.draw(&Rule::PASS) == Fate::Forward));
    }
}
