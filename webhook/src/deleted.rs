//! The names of recently deleted objects, with the time the webhook saw each delete.
//!
//! Rule 3 treats the IP of an object deleted lately as still managed, because the nodes keep
//! listing a detached IP in `status.addresses` for a while. The snapshot holds only the set of
//! names; the times live here, at the edge, so the shared core stays free of clocks.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How long a deleted object's IP stays managed: as long as the ledger's released records last
/// (one constant, `cloudnet_shared::ledger`, says why).
pub use cloudnet_shared::ledger::RECENT_RELEASE_WINDOW as RECENT_DELETE_WINDOW;

/// How often expired names are dropped: well inside the window, and cheap.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(15);

/// Deleted names in the order they were deleted.
#[derive(Debug)]
pub struct RecentDeletes {
    window: Duration,
    /// (when, name), oldest first; a name deleted twice appears twice.
    log: VecDeque<(Instant, String)>,
    /// The newest delete of each name, so an older entry expiring does not end a newer grace.
    newest: HashMap<String, Instant>,
}

impl RecentDeletes {
    /// An empty log whose entries last `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            log: VecDeque::new(),
            newest: HashMap::new(),
        }
    }

    /// Records that `name` was deleted at `now`.
    pub fn record(&mut self, name: &str, now: Instant) {
        self.log.push_back((now, name.to_owned()));
        self.newest.insert(name.to_owned(), now);
    }

    /// Drops the entries older than the window at `now`; returns the names whose grace ended.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let mut ended = Vec::new();
        while let Some((at, _)) = self.log.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            let Some((at, name)) = self.log.pop_front() else {
                break;
            };
            if self.newest.get(&name) == Some(&at) {
                self.newest.remove(&name);
                ended.push(name);
            }
        }
        ended
    }

    /// Number of names still in their grace.
    pub fn len(&self) -> usize {
        self.newest.len()
    }

    /// Whether no name is in its grace.
    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(600);

    #[test]
    fn names_expire_after_the_window_and_not_before() {
        let t0 = Instant::now();
        let mut deletes = RecentDeletes::new(WINDOW);
        deletes.record("10.0.0.5", t0);
        deletes.record("10.0.0.6", t0 + Duration::from_secs(60));
        assert!(
            deletes
                .expire(t0 + WINDOW - Duration::from_secs(1))
                .is_empty()
        );
        assert_eq!(deletes.expire(t0 + WINDOW), ["10.0.0.5"]);
        assert_eq!(deletes.len(), 1);
        assert!(
            deletes
                .expire(t0 + WINDOW + Duration::from_secs(59))
                .is_empty()
        );
        assert_eq!(
            deletes.expire(t0 + WINDOW + Duration::from_secs(60)),
            ["10.0.0.6"]
        );
        assert!(deletes.is_empty());
    }

    #[test]
    fn a_second_delete_of_the_same_name_restarts_its_grace() {
        let t0 = Instant::now();
        let mut deletes = RecentDeletes::new(WINDOW);
        deletes.record("10.0.0.5", t0);
        deletes.record("10.0.0.5", t0 + Duration::from_secs(300));
        assert!(deletes.expire(t0 + WINDOW).is_empty());
        assert_eq!(deletes.len(), 1);
        assert_eq!(
            deletes.expire(t0 + WINDOW + Duration::from_secs(300)),
            ["10.0.0.5"]
        );
    }
}
