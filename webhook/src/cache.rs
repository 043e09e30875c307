//! Watch caches for Nodes and CloudPrivateIPConfigs, applied event by event to one indexed
//! [`ClusterSnapshot`], so an admission decision never calls the API server.
//!
//! The snapshot itself is the store: a kube-runtime reflector `Store` would keep every full Node
//! (images, conditions, …) a second time, while the rules only need names, addresses, the egress
//! annotation and per-node object indexes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cloudnet_shared::{CloudPrivateIPConfig, ClusterSnapshot, NodeInfo};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};

/// The shared, always-current view of the cluster plus its readiness.
#[derive(Debug, Default)]
pub struct ClusterCache {
    snapshot: RwLock<ClusterSnapshot>,
    nodes_synced: AtomicBool,
    objects_synced: AtomicBool,
}

impl ClusterCache {
    /// An empty, not yet synced cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache already holding `snapshot` and marked synced (for tests and benchmarks).
    pub fn synced(snapshot: ClusterSnapshot) -> Self {
        Self {
            snapshot: RwLock::new(snapshot),
            nodes_synced: AtomicBool::new(true),
            objects_synced: AtomicBool::new(true),
        }
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
    );
}

/// How one kind of watched object goes into the snapshot.
trait Indexed<K> {
    const KIND: &'static str;
    fn upsert(snapshot: &mut ClusterSnapshot, object: &K);
    fn remove(snapshot: &mut ClusterSnapshot, name: &str);
    fn synced(cache: &ClusterCache) -> &AtomicBool;
}

struct NodeKind;

impl Indexed<Node> for NodeKind {
    const KIND: &'static str = "Node";
    fn upsert(snapshot: &mut ClusterSnapshot, node: &Node) {
        snapshot.upsert_node(NodeInfo::from_node(node));
    }
    fn remove(snapshot: &mut ClusterSnapshot, name: &str) {
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
        snapshot.upsert_object(&object.name_any(), &object.spec.node);
    }
    fn remove(snapshot: &mut ClusterSnapshot, name: &str) {
        snapshot.remove_object(name);
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
                I::remove(&mut cache.write(), &name);
            }
            Ok(Event::Init) => relisted.clear(),
            Ok(Event::InitApply(object)) => {
                relisted.insert(object.name_any());
                I::upsert(&mut cache.write(), &object);
            }
            Ok(Event::InitDone) => {
                let mut snapshot = cache.write();
                for gone in known.difference(&relisted) {
                    I::remove(&mut snapshot, gone);
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
