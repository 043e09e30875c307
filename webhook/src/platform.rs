//! The cloud the cluster runs on, read from its Nodes' providerIDs when no flag names it, so
//! that one manifest serves every cloud and none runs with another cloud's rules by default.
//!
//! Every cloud's cloud-controller-manager writes `spec.providerID` with its own scheme, and one
//! cluster runs on one cloud. Nodes without a providerID (not yet initialised, or no cloud at
//! all) or with one of no known cloud say nothing. The cloud most Nodes name is the cluster's: one
//! foreign Node (a joined machine of another provider, a test Node) is named in a warning and does
//! not switch the cloud's rules off. On a tie the cloud already in use stays; with none in use,
//! the platform stays unknown, which skips the cloud-specific rules, as an unset flag always did.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

use cloudnet_shared::platform::Platform;

/// The providerID-named cloud of each Node, and how many Nodes name each cloud.
#[derive(Debug, Default)]
pub struct NodePlatforms {
    by_node: HashMap<String, Platform>,
    counts: HashMap<Platform, usize>,
    reported: Option<Dissent>,
}

/// Nodes whose providerIDs name another cloud than the one in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dissent {
    /// The first of them by name.
    pub node: String,
    /// The cloud it names.
    pub names: Platform,
    /// How many Nodes disagree.
    pub nodes: usize,
}

impl NodePlatforms {
    /// Node `name` now names `platform` (or none).
    pub fn set(&mut self, name: &str, platform: Option<Platform>) {
        self.remove(name);
        if let Some(platform) = platform {
            self.by_node.insert(name.to_owned(), platform);
            *self.counts.entry(platform).or_default() += 1;
        }
    }

    /// Node `name` is gone.
    pub fn remove(&mut self, name: &str) {
        if let Some(old) = self.by_node.remove(name)
            && let Some(count) = self.counts.get_mut(&old)
        {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&old);
            }
        }
    }

    /// The cloud most Nodes with a providerID name; on a tie `current` if it is one of the
    /// leaders, else none.
    pub fn agreed(&self, current: Option<Platform>) -> Option<Platform> {
        let most = self.counts.values().copied().max()?;
        let mut leaders = self
            .counts
            .iter()
            .filter(|(_, count)| **count == most)
            .map(|(platform, _)| *platform);
        match (leaders.next(), leaders.next()) {
            (Some(one), None) => Some(one),
            _ => current.filter(|c| self.counts.get(c) == Some(&most)),
        }
    }

    /// Whether the Nodes name more than one cloud.
    pub fn mixed(&self) -> bool {
        self.counts.len() > 1
    }

    /// The Nodes naming another cloud than `platform`.
    pub fn dissent(&self, platform: Platform) -> Option<Dissent> {
        let others = self.by_node.iter().filter(|(_, p)| **p != platform);
        let nodes = others.clone().count();
        let (node, names) = others.min_by(|a, b| a.0.cmp(b.0))?;
        Some(Dissent {
            node: node.clone(),
            names: *names,
            nodes,
        })
    }

    /// [`Self::dissent`] against `platform` when it differs from the one last returned, so that a
    /// warning is logged once per change and not on every Node update.
    pub fn new_dissent(&mut self, platform: Option<Platform>) -> Option<Dissent> {
        let now = platform.and_then(|p| self.dissent(p));
        if now == self.reported {
            return None;
        }
        self.reported.clone_from(&now);
        now
    }
}

/// What to log when the Nodes' cloud changes: a warning or not, and the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Logged as a warning (else as information).
    pub warning: bool,
    /// The line.
    pub text: String,
}

/// The line for the Nodes now naming `detected` (`mixed`: more than one cloud at a tie), when
/// `--platform-type` says `flag`; `None` when there is nothing worth a line.
pub fn detection_note(
    flag: Option<Platform>,
    detected: Option<Platform>,
    mixed: bool,
) -> Option<Note> {
    let note = |warning, text: String| Some(Note { warning, text });
    match (flag, detected) {
        (None, Some(nodes)) => note(
            false,
            format!("platform {nodes} read from the Nodes' providerIDs (no --platform-type)"),
        ),
        (Some(flag), Some(nodes)) if flag == nodes => note(
            false,
            format!("the Nodes' providerIDs name {nodes}, as --platform-type does"),
        ),
        (Some(flag), Some(nodes)) => note(
            true,
            format!(
                "the Nodes' providerIDs name {nodes} but --platform-type says {flag}; the flag decides"
            ),
        ),
        (None, None) if mixed => note(
            true,
            "the Nodes' providerIDs name more than one cloud, as many Nodes each; cloud-specific \
             rules are skipped until most name one or --platform-type names the cloud"
                .to_owned(),
        ),
        (None, None) => note(false, "no Node names a cloud by its providerID".to_owned()),
        (Some(_), None) => None,
    }
}

/// A platform readable without a lock on every request.
#[derive(Debug, Default)]
pub struct SharedPlatform(AtomicU8);

impl SharedPlatform {
    /// Stores `platform`; returns whether it changed.
    pub fn store(&self, platform: Option<Platform>) -> bool {
        let code = platform.map_or(0, |p| {
            Platform::ALL
                .iter()
                .position(|q| *q == p)
                .map_or(0, |i| i as u8 + 1)
        });
        self.0.swap(code, Ordering::AcqRel) != code
    }

    /// The stored platform.
    pub fn load(&self) -> Option<Platform> {
        let code = self.0.load(Ordering::Acquire);
        Platform::ALL
            .get(usize::from(code).checked_sub(1)?)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_platform_is_the_cloud_most_nodes_name_and_a_foreign_node_is_named() {
        let mut nodes = NodePlatforms::default();
        assert_eq!(nodes.agreed(None), None);
        nodes.set("a", Some(Platform::Gcp));
        nodes.set("b", None);
        assert_eq!(nodes.agreed(None), Some(Platform::Gcp));
        assert_eq!(nodes.new_dissent(Some(Platform::Gcp)), None);
        // One foreign Node beside one of the cluster's: a tie keeps the cloud in use.
        nodes.set("z-foreign", Some(Platform::Aws));
        assert_eq!(nodes.agreed(Some(Platform::Gcp)), Some(Platform::Gcp));
        assert_eq!(nodes.agreed(None), None);
        assert!(nodes.mixed());
        let dissent = Dissent {
            node: "z-foreign".into(),
            names: Platform::Aws,
            nodes: 1,
        };
        assert_eq!(nodes.new_dissent(Some(Platform::Gcp)), Some(dissent));
        assert_eq!(
            nodes.new_dissent(Some(Platform::Gcp)),
            None,
            "reported once"
        );
        // More of the cluster's own Nodes: the foreign one is outvoted, whatever came first.
        nodes.set("c", Some(Platform::Gcp));
        assert_eq!(nodes.agreed(None), Some(Platform::Gcp));
        assert_eq!(nodes.agreed(Some(Platform::Aws)), Some(Platform::Gcp));
        nodes.set("c", Some(Platform::Aws));
        assert_eq!(
            nodes.agreed(None),
            Some(Platform::Aws),
            "most Nodes now name AWS"
        );
        nodes.remove("z-foreign");
        nodes.remove("c");
        assert_eq!(nodes.agreed(None), Some(Platform::Gcp));
        assert_eq!(nodes.new_dissent(Some(Platform::Gcp)), None);
        nodes.remove("a");
        assert_eq!(nodes.agreed(Some(Platform::Gcp)), None);
    }

    #[test]
    fn the_note_names_the_flag_when_one_is_given() {
        let note = detection_note(None, Some(Platform::Gcp), false).unwrap();
        assert!(!note.warning);
        assert!(note.text.contains("(no --platform-type)"), "{note:?}");
        for detected in [Some(Platform::Aws), Some(Platform::Gcp), None] {
            let note = detection_note(Some(Platform::Aws), detected, false);
            assert!(
                note.as_ref()
                    .is_none_or(|n| !n.text.contains("no --platform-type")),
                "{note:?}"
            );
        }
        let differs = detection_note(Some(Platform::Aws), Some(Platform::Gcp), true).unwrap();
        assert!(differs.warning);
        assert!(differs.text.contains("the flag decides"), "{differs:?}");
        assert!(detection_note(None, None, true).unwrap().warning);
    }

    #[test]
    fn the_shared_platform_round_trips_every_cloud() {
        let shared = SharedPlatform::default();
        assert_eq!(shared.load(), None);
        for platform in Platform::ALL {
            assert!(shared.store(Some(platform)));
            assert_eq!(shared.load(), Some(platform));
            assert!(!shared.store(Some(platform)));
        }
        assert!(shared.store(None));
        assert_eq!(shared.load(), None);
    }
}
