//! What the controllers know beside kube's object cache, fed from the same object watch: which
//! objects name each node ([`NodeIndex`]), and the objects our own writes returned that the cache
//! has not shown yet ([`Written`]). Both are read by the object and node controllers; neither
//! depends on them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cloudnet_shared::CloudPrivateIPConfig;
use cloudnet_shared::rules::occupies;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

/// The newest version of each object we wrote, for as long as the cache lags behind it: acting
/// on a cached status older than our own last write would repeat a cloud call.
#[derive(Debug, Default)]
pub(crate) struct Written {
    inner: Mutex<HashMap<String, Arc<CloudPrivateIPConfig>>>,
    /// A relist in progress: the names it has listed so far.
    relist: Mutex<Option<HashSet<String>>>,
}

impl Written {
    /// Follows one event of the object watch, after the cache's writer: forgets each object the
    /// cache has caught up with, so that converged objects are not held twice. Returns whether
    /// the event's object is no newer than the last one our writes returned: the reconcile that
    /// wrote it has seen it (every write of ours is guarded by the version it read), so it needs
    /// no reconcile of its own.
    pub(crate) fn apply(
        &self,
        event: &kube::runtime::watcher::Event<CloudPrivateIPConfig>,
    ) -> bool {
        use kube::runtime::watcher::Event;
        match event {
            Event::Init => *lock(&self.relist) = Some(HashSet::new()),
            Event::InitApply(obj) => {
                if let Some(listed) = lock(&self.relist).as_mut() {
                    listed.insert(obj.name_any());
                }
            }
            // An object the relist did not list was deleted while the watch was down: no
            // event of it will ever come.
            Event::InitDone => {
                if let Some(listed) = lock(&self.relist).take() {
                    lock(&self.inner).retain(|name, _| listed.contains(name));
                }
            }
            Event::Apply(_) | Event::Delete(_) => {}
        }
        let (Event::Apply(obj) | Event::InitApply(obj) | Event::Delete(obj)) = event else {
            return false;
        };
        let mut written = lock(&self.inner);
        let name = obj.name_any();
        let Some(ours) = written.get(&name).map(|o| resource_version(o)) else {
            return false;
        };
        let (deleted, theirs) = (matches!(event, Event::Delete(_)), resource_version(obj));
        if deleted || ours <= theirs {
            written.remove(&name);
        }
        !deleted && theirs <= ours
    }

    /// The newer of the cached object and the last one we wrote: the cache may lag our writes,
    /// and acting on a stale status would repeat a cloud call.
    pub(crate) fn freshest(&self, cached: Arc<CloudPrivateIPConfig>) -> Arc<CloudPrivateIPConfig> {
        let mut written = self.lock();
        let name = cached.name_any();
        match written.get(&name) {
            Some(ours) if resource_version(ours) > resource_version(&cached) => Arc::clone(ours),
            Some(_) => {
                written.remove(&name);
                cached
            }
            None => cached,
        }
    }

    /// Keeps `obj`, which one of our writes returned, until the cache catches up with it.
    pub(crate) fn remember(&self, obj: &Arc<CloudPrivateIPConfig>) {
        self.lock().insert(obj.name_any(), Arc::clone(obj));
    }

    /// Forgets the object `name`, which is gone.
    pub(crate) fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<CloudPrivateIPConfig>>> {
        lock(&self.inner)
    }
}

/// Which objects name each node, in their spec or their status: the node annotation and the
/// capacity check read one node's objects without scanning the whole cache, which at 10,000
/// objects made every reconcile cost a pass over all of them. Fed from the object watch, beside
/// the cache's own writer.
#[derive(Debug, Default)]
pub(crate) struct NodeIndex {
    inner: Mutex<IndexState>,
}

#[derive(Debug, Default)]
struct IndexState {
    /// Object name to the nodes it names.
    nodes_of: HashMap<String, Vec<String>>,
    /// Node name to the objects naming it.
    on_node: HashMap<String, HashSet<String>>,
    /// A relist in progress: what it has listed so far, replacing everything once it is done.
    relist: Option<Vec<(String, Vec<String>)>>,
}

impl IndexState {
    fn remove(&mut self, name: &str) {
        for node in self.nodes_of.remove(name).unwrap_or_default() {
            if let Some(names) = self.on_node.get_mut(&node) {
                names.remove(name);
                if names.is_empty() {
                    self.on_node.remove(&node);
                }
            }
        }
    }

    fn insert(&mut self, name: String, nodes: Vec<String>) {
        self.remove(&name);
        for node in &nodes {
            self.on_node
                .entry(node.clone())
                .or_default()
                .insert(name.clone());
        }
        self.nodes_of.insert(name, nodes);
    }
}

impl NodeIndex {
    /// Follows one event of the object watch; returns the nodes the event's object names (none
    /// for the start and end of a relist), whose annotation the event may change.
    pub(crate) fn apply(
        &self,
        event: &kube::runtime::watcher::Event<CloudPrivateIPConfig>,
    ) -> Vec<String> {
        use kube::runtime::watcher::Event;
        let mut state = lock(&self.inner);
        match event {
            Event::Apply(obj) => {
                let nodes = nodes_of(obj);
                state.insert(obj.name_any(), nodes.clone());
                nodes
            }
            Event::Delete(obj) => {
                state.remove(&obj.name_any());
                nodes_of(obj)
            }
            Event::Init => {
                state.relist = Some(Vec::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                let nodes = nodes_of(obj);
                let entry = (obj.name_any(), nodes.clone());
                state.relist.get_or_insert_with(Vec::new).push(entry);
                nodes
            }
            Event::InitDone => {
                let listed = state.relist.take().unwrap_or_default();
                state.nodes_of.clear();
                state.on_node.clear();
                for (name, nodes) in listed {
                    state.insert(name, nodes);
                }
                Vec::new()
            }
        }
    }

    /// The cached objects that name `node` in their spec or status.
    pub(crate) fn objects_on(
        &self,
        cache: &Store<CloudPrivateIPConfig>,
        node: &str,
    ) -> Vec<Arc<CloudPrivateIPConfig>> {
        let names: Vec<String> = lock(&self.inner)
            .on_node
            .get(node)
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|name| cache.get(&kube::runtime::reflector::ObjectRef::new(name)))
            // The cache is the authority: the index may be a step ahead or behind it.
            .filter(|o| occupies(&o.spec.node, o.status_node().unwrap_or_default(), node))
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn resource_version(obj: &CloudPrivateIPConfig) -> u64 {
    obj.resource_version()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

/// The node names an object concerns: its spec.node and status.node.
pub(crate) fn nodes_of(obj: &CloudPrivateIPConfig) -> Vec<String> {
    let mut names = vec![obj.spec.node.clone()];
    if let Some(s) = obj.status_node() {
        names.push(s.to_owned());
    }
    names.retain(|n| !n.is_empty());
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use cloudnet_shared::CloudPrivateIPConfigSpec;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher::Event;

    use super::*;

    fn object(name: &str, node: &str) -> CloudPrivateIPConfig {
        CloudPrivateIPConfig::new(name, CloudPrivateIPConfigSpec { node: node.into() })
    }

    fn feed(
        writer: &mut Writer<CloudPrivateIPConfig>,
        index: &NodeIndex,
        event: Event<CloudPrivateIPConfig>,
    ) -> Vec<String> {
        writer.apply_watcher_event(&event);
        index.apply(&event)
    }

    fn names_on(index: &NodeIndex, cache: &Store<CloudPrivateIPConfig>, node: &str) -> Vec<String> {
        let mut names: Vec<String> = index
            .objects_on(cache, node)
            .iter()
            .map(|o| o.name_any())
            .collect();
        names.sort();
        names
    }

    fn at_version(name: &str, version: &str) -> CloudPrivateIPConfig {
        let mut obj = object(name, "n1");
        obj.metadata.resource_version = Some(version.into());
        obj
    }

    #[test]
    fn written_objects_are_forgotten_once_the_cache_catches_up_or_they_are_deleted() {
        let written = Written::default();
        for name in ["a", "b"] {
            written
                .lock()
                .insert(name.into(), Arc::new(at_version(name, "5")));
        }
        assert!(
            written.apply(&Event::Apply(at_version("a", "4"))),
            "older than ours"
        );
        assert!(written.lock().contains_key("a"), "the cache still lags");
        assert!(
            written.apply(&Event::Apply(at_version("a", "5"))),
            "our own write"
        );
        assert!(!written.lock().contains_key("a"));
        assert!(
            !written.apply(&Event::Apply(at_version("a", "6"))),
            "someone else's"
        );
        assert!(!written.apply(&Event::Delete(at_version("b", "3"))));
        assert!(written.lock().is_empty());
    }

    #[test]
    fn a_written_object_a_relist_does_not_list_is_forgotten() {
        // Deleted while the watch was down: neither its update nor its deletion is ever seen.
        let written = Written::default();
        written.remember(&Arc::new(at_version("a", "5")));
        written.remember(&Arc::new(at_version("b", "5")));
        written.apply(&Event::Init);
        written.apply(&Event::InitApply(at_version("b", "4")));
        written.apply(&Event::InitDone);
        assert_eq!(
            written.lock().keys().collect::<Vec<_>>(),
            ["b"],
            "b is listed, and the cache still lags our write"
        );
    }

    #[test]
    fn the_node_index_follows_moves_deletes_and_relists() {
        let (cache, mut writer) = reflector::store();
        let index = NodeIndex::default();
        for (name, node) in [("a", "n1"), ("b", "n1"), ("c", "n2")] {
            feed(&mut writer, &index, Event::Apply(object(name, node)));
        }
        assert_eq!(names_on(&index, &cache, "n1"), ["a", "b"]);
        let moved = feed(&mut writer, &index, Event::Apply(object("a", "n2")));
        assert_eq!(moved, ["n2"], "the nodes the event's object names");
        let deleted = feed(&mut writer, &index, Event::Delete(object("b", "n1")));
        assert_eq!(deleted, ["n1"]);
        assert!(names_on(&index, &cache, "n1").is_empty());
        assert_eq!(names_on(&index, &cache, "n2"), ["a", "c"]);
        assert!(feed(&mut writer, &index, Event::Init).is_empty());
        let listed = feed(&mut writer, &index, Event::InitApply(object("c", "n3")));
        assert_eq!(listed, ["n3"]);
        // Until the relist is done, both the cache and the index show the old state.
        assert_eq!(names_on(&index, &cache, "n2"), ["a", "c"]);
        assert!(feed(&mut writer, &index, Event::InitDone).is_empty());
        assert!(names_on(&index, &cache, "n2").is_empty());
        assert_eq!(names_on(&index, &cache, "n3"), ["c"]);
    }
}
