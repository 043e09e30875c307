//! The "late call" fault: requests on the held routes wait at the proxy until the test lets them
//! go, then go on to the cloud, whether or not their client is still waiting (a request delayed in
//! the network lands at the cloud after its sender gave up on it). That is how a call sent by a
//! leader before it lost its lease is made to land after a new term has acted.

use tokio::sync::oneshot;

use super::rules::RouteMatch;

/// The held routes and the requests waiting on them.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    matchers: Vec<RouteMatch>,
    waiting: Vec<oneshot::Sender<()>>,
}

impl Holds {
    /// Holds the requests `matcher` selects from now on.
    pub(crate) fn hold(&mut self, matcher: RouteMatch) {
        if !self.matchers.contains(&matcher) {
            self.matchers.push(matcher);
        }
    }

    /// If `route` is held: the signal that lets this request go on.
    pub(crate) fn wait(&mut self, route: &str) -> Option<oneshot::Receiver<()>> {
        if !self.matchers.iter().any(|m| m.matches(route)) {
            return None;
        }
        let (go, wait) = oneshot::channel();
        self.waiting.push(go);
        Some(wait)
    }

    /// Stops holding and lets every waiting request go on; returns how many there were.
    pub(crate) fn release(&mut self) -> usize {
        self.matchers.clear();
        let waiting = std::mem::take(&mut self.waiting);
        let count = waiting.len();
        for go in waiting {
            let _ = go.send(());
        }
        count
    }

    /// Stops holding and drops every waiting request unsent (the proxy is going away).
    pub(crate) fn abandon(&mut self) {
        self.matchers.clear();
        self.waiting.clear();
    }

    /// How many requests are waiting now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_routes_wait_until_released_and_others_pass() {
        let mut holds = Holds::default();
        holds.hold(RouteMatch::exact("AssignPrivateIpAddresses"));
        let mut held = holds.wait("AssignPrivateIpAddresses").unwrap();
        assert!(holds.wait("DescribeInstances").is_none());
        assert_eq!(holds.waiting(), 1);
        assert!(held.try_recv().is_err(), "still held");
        assert_eq!(holds.release(), 1);
        assert!(held.try_recv().is_ok());
        assert!(
            holds.wait("AssignPrivateIpAddresses").is_none(),
            "no longer held"
        );
    }
}
