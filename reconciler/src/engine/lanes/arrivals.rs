//! What the lanes know of IPs on their way: when IPs last arrived per node (for the rate
//! budget's share), the IPs announced to a node before their objects' writes are done, and the
//! handle that says an announced IP has arrived.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::Lanes;

/// When IPs arrived (or were announced): the latest, and the latest for each node; and when the
/// latest IP was noticed on any node, counting an announced IP from its announcement.
pub(super) struct Arrivals {
    pub(super) latest: Instant,
    pub(super) by_node: HashMap<String, Instant>,
    pub(super) noticed: Instant,
}

impl Default for Arrivals {
    fn default() -> Self {
        let now = Instant::now();
        Self {
            latest: now,
            by_node: HashMap::new(),
            noticed: now,
        }
    }
}

impl Arrivals {
    /// An IP arrived (or was announced) for `node` at `at`, noticed at `noticed` (its
    /// announcement, or `at`): the burst goes on.
    pub(super) fn note(&mut self, node: &str, at: Instant, noticed: Instant) {
        self.latest = at;
        self.noticed = self.noticed.max(noticed);
        match self.by_node.get_mut(node) {
            Some(last) => *last = at,
            None => {
                self.by_node.insert(node.to_owned(), at);
            }
        }
    }

    /// How many nodes besides the caller's received an IP within `window`; forgets the others.
    pub(super) fn other_nodes_within(&mut self, window: Duration) -> usize {
        let now = Instant::now();
        let since = now.checked_sub(window).unwrap_or(now);
        self.by_node.retain(|_, at| *at >= since);
        self.by_node.len().saturating_sub(1)
    }
}

/// IPs announced to one node and on their way.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Expected {
    /// Submitted once their object's writes are done.
    pub(super) ready: usize,
    /// Attach halves of moves whose detach from another VM is not answered yet.
    pub(super) later: usize,
}

/// An IP on its way to a lane ([`Lanes::expect`]); dropping it says the IP has arrived, or will
/// not come.
pub(crate) struct Announced {
    pub(super) lanes: Arc<Lanes>,
    pub(super) node: Box<str>,
    pub(super) at: Instant,
    /// Whether it is ready to be submitted ([`Lanes::expect_later`]).
    pub(super) ready: bool,
}

impl Announced {
    /// The node the IP is announced to.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The call on another VM the IP waited for is done: it will be submitted once its
    /// object's writes are.
    pub(crate) fn ready(&mut self) {
        if !self.ready {
            self.lanes.expect_on(&self.node, true);
            self.lanes.arrived_on(&self.node, false);
            self.ready = true;
        }
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        self.lanes.arrived_on(&self.node, self.ready);
        if self.lanes.announced.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.lanes.all_arrived.notify_waiters();
        }
    }
}
