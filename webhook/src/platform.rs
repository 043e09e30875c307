//! The cloud the cluster runs on, read from its Nodes' providerIDs when no flag names it, so
//! that one manifest serves every cloud and none runs with another cloud's rules by default.
//!
//! Every cloud's cloud-controller-manager writes `spec.providerID` with its own scheme, and one
//! cluster runs on one cloud. Nodes without a providerID (not yet initialised, or no cloud at
//! all) say nothing; nodes naming two clouds leave the platform unknown, which skips the
//! cloud-specific rules, as an unset flag always did.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

use cloudnet_shared::platform::Platform;

/// The providerID-named cloud of each Node, and the one cloud they agree on.
#[derive(Debug, Default)]
pub struct NodePlatforms {
    by_node: HashMap<String, Platform>,
    counts: HashMap<Platform, usize>,
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

    /// The cloud every Node with a providerID names, if exactly one.
    pub fn agreed(&self) -> Option<Platform> {
        let mut clouds = self.counts.keys();
        match (clouds.next(), clouds.next()) {
            (Some(one), None) => Some(*one),
            _ => None,
        }
    }

    /// Whether the Nodes name more than one cloud.
    pub fn mixed(&self) -> bool {
        self.counts.len() > 1
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
    fn the_platform_is_the_one_cloud_the_nodes_agree_on() {
        let mut nodes = NodePlatforms::default();
        assert_eq!(nodes.agreed(), None);
        nodes.set("a", Some(Platform::Gcp));
        nodes.set("b", None);
        assert_eq!(nodes.agreed(), Some(Platform::Gcp));
        nodes.set("c", Some(Platform::Aws));
        assert_eq!(nodes.agreed(), None);
        assert!(nodes.mixed());
        nodes.set("c", Some(Platform::Gcp));
        assert_eq!(nodes.agreed(), Some(Platform::Gcp));
        nodes.remove("a");
        nodes.remove("c");
        assert_eq!(nodes.agreed(), None);
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
