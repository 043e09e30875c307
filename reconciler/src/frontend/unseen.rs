//! The front end's own writes that its cache has not shown yet. A plan made before the watch
//! delivers a write would make it again: a second retarget, a create that meets its own object,
//! a second delete. Each is harmless but an API call, and a failover plans many times while its
//! burst arrives, so the plan reads its objects as they are once every write it made shows.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::plan::Existing;

/// How long a write may stay unseen before the cache is trusted again: a watch that lags this
/// much is resynchronising, and its list is the truth.
const FORGET_AFTER: Duration = Duration::from_secs(5);

/// What one of our writes left an object as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum After {
    /// Created, as the answer showed it.
    Created(Existing),
    /// Retargeted (or found ours), as the answer showed it.
    Changed(Existing),
    /// Deleted: gone or being deleted, either way nothing to plan for until the cache shows it
    /// (`deleting` is set).
    Deleted(Existing),
}

/// Writes done and not yet shown by the cache, by object name.
#[derive(Default)]
pub(crate) struct Unseen {
    writes: HashMap<String, (After, Instant)>,
}

impl Unseen {
    /// Remembers that object `name` was written to `after`.
    pub(crate) fn wrote(&mut self, name: String, after: After) {
        self.writes.insert(name, (after, Instant::now()));
    }

    /// `cached` (the front end's objects as the cache shows them) with every write it has not
    /// shown yet applied; forgets the writes it shows, and the old ones.
    pub(crate) fn overlay(&mut self, cached: &mut BTreeMap<String, Existing>) {
        let now = Instant::now();
        self.writes.retain(|name, (after, at)| {
            if now.duration_since(*at) >= FORGET_AFTER {
                return false;
            }
            let shown = cached.get(name);
            match (after, shown) {
                // Another object under the name now (or ours recreated): the cache is newer.
                (After::Created(ours) | After::Changed(ours), Some(shown))
                    if shown.uid != ours.uid =>
                {
                    false
                }
                (After::Created(ours) | After::Changed(ours), Some(shown)) => {
                    if shown.node == ours.node || shown.deleting {
                        false
                    } else {
                        cached.insert(name.clone(), ours.clone());
                        true
                    }
                }
                (After::Created(ours), None) => {
                    cached.insert(name.clone(), ours.clone());
                    true
                }
                // Changed, then gone: the cache is newer.
                (After::Changed(_), None) => false,
                (After::Deleted(ours), Some(shown)) if !shown.deleting && shown.uid == ours.uid => {
                    cached.insert(name.clone(), ours.clone());
                    true
                }
                (After::Deleted(_), _) => false,
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(node: &str, uid: &str, deleting: bool) -> Existing {
        Existing {
            node: node.into(),
            owner: Some("antrea".into()),
            deleting,
            uid: uid.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retarget_shows_until_the_cache_has_it_then_is_forgotten() {
        let mut unseen = Unseen::default();
        unseen.wrote("10.0.0.5".into(), After::Changed(ours("b", "u1", false)));
        let mut cached = BTreeMap::from([("10.0.0.5".to_owned(), ours("a", "u1", false))]);
        unseen.overlay(&mut cached);
        assert_eq!(
            cached["10.0.0.5"].node, "b",
            "the write shows before the watch has it"
        );

        let mut cached = BTreeMap::from([("10.0.0.5".to_owned(), ours("b", "u1", false))]);
        unseen.overlay(&mut cached);
        assert!(unseen.writes.is_empty(), "seen, so forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn a_create_shows_until_seen_and_another_uid_wins() {
        let mut unseen = Unseen::default();
        unseen.wrote("10.0.0.5".into(), After::Created(ours("b", "u1", false)));
        let mut cached = BTreeMap::new();
        unseen.overlay(&mut cached);
        assert_eq!(cached.get("10.0.0.5"), Some(&ours("b", "u1", false)));

        let mut cached = BTreeMap::from([("10.0.0.5".to_owned(), ours("c", "u2", false))]);
        unseen.overlay(&mut cached);
        assert_eq!(
            cached["10.0.0.5"].node, "c",
            "an object made anew is the cache's"
        );
        assert!(unseen.writes.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_delete_shows_as_deleting_until_seen() {
        let mut unseen = Unseen::default();
        unseen.wrote("10.0.0.5".into(), After::Deleted(ours("a", "u1", true)));
        unseen.wrote("10.0.0.6".into(), After::Deleted(ours("a", "u2", true)));
        let mut cached = BTreeMap::from([
            ("10.0.0.5".to_owned(), ours("a", "u1", false)),
            ("10.0.0.6".to_owned(), ours("a", "u3", false)),
        ]);
        unseen.overlay(&mut cached);
        assert!(cached["10.0.0.5"].deleting);
        assert!(
            !cached["10.0.0.6"].deleting,
            "made anew under the name: the cache's"
        );

        let mut cached = BTreeMap::from([("10.0.0.5".to_owned(), ours("a", "u1", true))]);
        unseen.overlay(&mut cached);
        assert!(unseen.writes.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_cache_never_shows_is_forgotten_in_time() {
        let mut unseen = Unseen::default();
        unseen.wrote("10.0.0.5".into(), After::Changed(ours("b", "u1", false)));
        tokio::time::advance(FORGET_AFTER).await;
        let mut cached = BTreeMap::from([("10.0.0.5".to_owned(), ours("a", "u1", false))]);
        unseen.overlay(&mut cached);
        assert_eq!(cached["10.0.0.5"].node, "a");
        assert!(unseen.writes.is_empty());
    }
}
