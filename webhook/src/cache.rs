//! Watch caches for Nodes and CloudPrivateIPConfigs, applied event by event to one indexed
//! [`ClusterSnapshot`], so an admission decision never calls the API server.
//!
//! The snapshot itself is the store: a kube-runtime reflector `Store` would keep every full Node
//! (images, conditions, …) a second time, while the rules only need names, addresses, the egress
//! annotation and per-node object indexes.
//!
//! Deleted objects stay "managed" for [`RECENT_DELETE_WINDOW`] (rule 3): the cache stamps each
//! delete with the time it saw it and ends the grace when the window has passed.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use cloudnet_shared::{CloudPrivateIPConfig, ClusterSnapshot, NodeInfo};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};

use crate::deleted::{EXPIRE_EVERY, RECENT_DELETE_WINDOW, RecentDeletes};

/// The shared, always-current view of the cluster plus its readiness.
#[derive(Debug)]
pub struct ClusterCache {
    snapshot: RwLock<ClusterSnapshot>,
    /// Locked only while the snapshot's write lock is held, so the two never disagree.
    deletes: Mutex<RecentDeletes>,
    nodes_synced: AtomicBool,
    objects_synced: AtomicBool,
}

impl Default for ClusterCache {
    fn default() -> Self {
        Self::with_delete_window(RECENT_DELETE_WINDOW)
    }
}

impl ClusterCache {
    /// An empty, not yet synced cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty, not yet synced cache whose deleted objects stay managed for `window`.
    pub fn with_delete_window(window: Duration) -> Self {
        Self {
            snapshot: RwLock::default(),
            deletes: Mutex::new(RecentDeletes::new(window)),
            nodes_synced: AtomicBool::new(false),
            objects_synced: AtomicBool::new(false),
        }
    }

    /// A cache already holding `snapshot` and marked synced (for tests and benchmarks).
    pub fn synced(snapshot: ClusterSnapshot) -> Self {
        let cache = Self::default();
        *cache.write() = snapshot;
        cache.nodes_synced.store(true, Ordering::Release);
        cache.objects_synced.store(true, Ordering::Release);
        cache
    }

    /// Read access to the snapshot.
    pub fn read(&self) -> RwLockReadGuard<'_, ClusterSnapshot> {
        // A panic while holding the lock can only come from the snapshot's own code; its data is
        // still a valid snapshot, so keep serving rather than failing every later request.
        self.snapshot.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, ClusterSnapshot> {
        self.snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether both initial lists have been applied.
    pub fn is_ready(&self) -> bool {
        self.nodes_synced.load(Ordering::Acquire) && self.objects_synced.load(Ordering::Acquire)
    }

    /// Forgets object `name`, keeping its IP managed until the window after `now` has passed.
    fn object_deleted(&self, snapshot: &mut ClusterSnapshot, name: &str, now: Instant) {
        snapshot.remove_object(name);
        snapshot.remember_deleted(name);
        self.deletes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(name, now);
    }

    /// Ends the grace of every delete older than the window at `now`.
    pub fn expire_deletes(&self, now: Instant) {
        let mut snapshot = self.write();
        let ended = self
            .deletes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .expire(now);
        for name in ended {
            snapshot.forget_deleted(&name);
        }
    }
}

/// Runs both watches until the process stops; errors are retried with backoff inside the watcher.
pub async fn run(client: Client, cache: Arc<ClusterCache>) {
    let nodes = watcher::watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff();
    let objects = watcher::watcher(
        Api::<CloudPrivateIPConfig>::all(client),
        watcher::Config::default(),
    )
    .default_backoff();
    tokio::join!(
        apply_events(nodes, &cache, &NodeKind),
        apply_events(objects, &cache, &ObjectKind),
        expire_deletes(&cache),
    );
}

async fn expire_deletes(cache: &ClusterCache) {
    let mut ticks = tokio::time::interval(EXPIRE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        cache.expire_deletes(Instant::now());
    }
}

/// How one kind of watched object goes into the snapshot.
trait Indexed<K> {
    const KIND: &'static str;
    fn upsert(snapshot: &mut ClusterSnapshot, object: &K);
    fn remove(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str);
    fn synced(cache: &ClusterCache) -> &AtomicBool;
}

struct NodeKind;

impl Indexed<Node> for NodeKind {
    const KIND: &'static str = "Node";
    fn upsert(snapshot: &mut ClusterSnapshot, node: &Node) {
        snapshot.upsert_node(NodeInfo::from_node(node));
    }
    fn remove(_cache: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str) {
        snapshot.remove_node(name);
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.nodes_synced
    }
}

struct ObjectKind;

impl Indexed<CloudPrivateIPConfig> for ObjectKind {
    const KIND: &'static str = "CloudPrivateIPConfig";
    fn upsert(snapshot: &mut ClusterSnapshot, object: &CloudPrivateIPConfig) {
        snapshot.upsert_object(
            &object.name_any(),
            &object.spec.node,
            object.status_node().unwrap_or_default(),
        );
    }
    fn remove(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str) {
        // Also an object that vanished while the watch was down: a delete seen late.
        cache.object_deleted(snapshot, name, Instant::now());
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.objects_synced
    }
}

async fn apply_events<K, I, S>(stream: S, cache: &ClusterCache, _kind: &I)
where
    K: ResourceExt,
    I: Indexed<K>,
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    // Names seen so far, so that a re-list (after a watch expired) can drop what vanished meanwhile.
    let mut known: HashSet<String> = HashSet::new();
    let mut relisted: HashSet<String> = HashSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(object)) => {
                known.insert(object.name_any());
                I::upsert(&mut cache.write(), &object);
            }
            Ok(Event::Delete(object)) => {
                let name = object.name_any();
                known.remove(&name);
                I::remove(cache, &mut cache.write(), &name);
            }
            Ok(Event::Init) => relisted.clear(),
            Ok(Event::InitApply(object)) => {
                relisted.insert(object.name_any());
                I::upsert(&mut cache.write(), &object);
            }
            Ok(Event::InitDone) => {
                let mut snapshot = cache.write();
                for gone in known.difference(&relisted) {
                    I::remove(cache, &mut snapshot, gone);
                }
                drop(snapshot);
                known = std::mem::take(&mut relisted);
                if !I::synced(cache).swap(true, Ordering::AcqRel) {
                    tracing::info!(kind = I::KIND, count = known.len(), "watch cache synced");
                }
            }
            Err(error) => tracing::warn!(kind = I::KIND, %error, "watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use cloudnet_shared::CloudPrivateIPConfigSpec;
    use futures::stream;

    use super::*;

    fn object(name: &str, spec_node: &str, status_node: &str) -> CloudPrivateIPConfig {
        let mut object = CloudPrivateIPConfig::new(
            name,
            CloudPrivateIPConfigSpec {
                node: spec_node.into(),
            },
        );
        object.status = Some(cloudnet_shared::CloudPrivateIPConfigStatus {
            node: status_node.into(),
            conditions: Vec::new(),
        });
        object
    }

    async fn apply(cache: &ClusterCache, events: Vec<Event<CloudPrivateIPConfig>>) {
        apply_events(stream::iter(events.into_iter().map(Ok)), cache, &ObjectKind).await;
    }

    #[tokio::test]
    async fn a_deleted_objects_ip_stays_managed_until_the_window_ends() {
        let window = Duration::from_secs(600);
        let cache = ClusterCache::with_delete_window(window);
        let parked = object("10.0.0.5", "", "");
        apply(&cache, vec![Event::Apply(parked.clone())]).await;
        assert!(
            cache.read().is_managed("10.0.0.5"),
            "an object with an empty spec.node"
        );
        let seen = Instant::now();
        apply(&cache, vec![Event::Delete(parked)]).await;
        assert!(cache.read().is_managed("10.0.0.5"));
        assert_eq!(cache.read().object_count(), 0);
        cache.expire_deletes(seen);
        assert!(cache.read().is_managed("10.0.0.5"));
        cache.expire_deletes(seen + window + Duration::from_secs(1));
        assert!(!cache.read().is_managed("10.0.0.5"));
    }

    #[tokio::test]
    async fn objects_that_vanished_during_a_relist_count_as_deleted() {
        let cache = ClusterCache::with_delete_window(Duration::from_secs(600));
        apply(
            &cache,
            vec![
                Event::Init,
                Event::InitApply(object("10.0.0.5", "n1", "")),
                Event::InitApply(object("10.0.0.6", "n1", "")),
                Event::InitDone,
                Event::Init,
                Event::InitApply(object("10.0.0.6", "n2", "n1")),
                Event::InitDone,
            ],
        )
        .await;
        let snapshot = cache.read();
        assert!(snapshot.is_managed("10.0.0.5"));
        assert_eq!(snapshot.object_count(), 1);
        // The survivor occupies its target and, until detached, its source.
        for node in ["n1", "n2"] {
            assert_eq!(
                snapshot.count_occupying(node, cloudnet_shared::Bucket::Ip, ""),
                1,
                "{node}"
            );
        }
    }
}
