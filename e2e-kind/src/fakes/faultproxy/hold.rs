//! The "late call" fault: requests on the held routes wait at the proxy until the test lets them
//! go, then go on to the cloud, whether or not their client is still waiting (a request delayed in
//! the network lands at the cloud after its sender gave up on it). That is how a call sent by a
//! leader before it lost its lease is made to land after a new term has acted.

use tokio::sync::oneshot;

use super::rules::RouteMatch;

/// The held routes and the requests waiting on them.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    /// Each held route, and the text its requests' bodies must carry to be held (`None`: any).
    matchers: Vec<(RouteMatch, Option<String>)>,
    waiting: Vec<oneshot::Sender<()>>,
}

impl Holds {
    /// Holds the requests `matcher` selects from now on.
    pub(crate) fn hold(&mut self, matcher: RouteMatch) {
        self.hold_where(matcher, None);
    }

    /// Holds the requests `matcher` selects whose body carries `text` (ASCII case ignored, as
    /// ARM's ids are compared), or every one of them when `text` is `None`.
    pub(crate) fn hold_where(&mut self, matcher: RouteMatch, text: Option<&str>) {
        let entry = (matcher, text.map(str::to_ascii_lowercase));
        if !self.matchers.contains(&entry) {
            self.matchers.push(entry);
        }
    }

    /// If the request on `route` with `body` is held: the signal that lets it go on.
    pub(crate) fn wait(&mut self, route: &str, body: &[u8]) -> Option<oneshot::Receiver<()>> {
        let lower = || String::from_utf8_lossy(body).to_ascii_lowercase();
        let held = self.matchers.iter().any(|(m, text)| {
            m.matches(route)
                && text
                    .as_ref()
                    .is_none_or(|text| lower().contains(text.as_str()))
        });
        if !held {
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
        let mut held = holds.wait("AssignPrivateIpAddresses", b"").unwrap();
        assert!(holds.wait("DescribeInstances", b"").is_none());
        assert_eq!(holds.waiting(), 1);
        assert!(held.try_recv().is_err(), "still held");
        assert_eq!(holds.release(), 1);
        assert!(held.try_recv().is_ok());
        assert!(
            holds.wait("AssignPrivateIpAddresses", b"").is_none(),
            "no longer held"
        );
    }

    #[test]
    fn a_hold_on_a_text_takes_only_the_bodies_carrying_it() {
        let mut holds = Holds::default();
        holds.hold_where(RouteMatch::prefix("PUT /nic"), Some("/publicIPAddresses/P"));
        assert!(
            holds
                .wait("PUT /nic", br#"{"id":"/publicipaddresses/p"}"#)
                .is_some()
        );
        assert!(holds.wait("PUT /nic", br#"{"id":"/other"}"#).is_none());
        assert!(holds.wait("GET /nic", br#"/publicIPAddresses/P"#).is_none());
        assert_eq!(holds.waiting(), 1);
        assert_eq!(holds.release(), 1);
        assert!(holds.wait("PUT /nic", br#"/publicIPAddresses/P"#).is_none());
    }
}
