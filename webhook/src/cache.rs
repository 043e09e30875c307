//! Watch caches for Nodes and CloudPrivateIPConfigs, and for the egress routers' addresses
//! (EgressRouters and egress-router NetworkAttachmentDefinitions), applied event by event to one
//! indexed [`ClusterSnapshot`], so an admission decision never calls the API server.
//!
//! The EgressPublicIP watch (the bindings' uniqueness) gates only its own endpoint, like the
//! egress-router watches; its CRD is installed apart (manifests/public-ips).
//!
//! Antrea's ExternalIPPools are watched the same way (their CRD is Antrea's, so it may be absent),
//! selected on the server by the opt-in label: only opted-in pools are cached, name and ranges
//! only, for the Egress endpoint. The pool endpoint reads the Nodes, whose labels the snapshot
//! keeps for a pool's nodeSelector (labels only, not the rest of the metadata).
//!
//! EgressGateways are watched the same way (their CRD is installed apart, manifests/gateways),
//! name and egress IPs only: their endpoint waits for that watch and for Antrea's pools (a
//! gateway's IP must lie in no opted-in pool), and a CloudPrivateIPConfig create is checked
//! against the gateways' IPs once the watch has listed. The CloudPrivateIPConfig watch notes
//! which objects the reconciler keeps for a gateway (front-end label and source annotation).
//!
//! The two egress-router watches do not gate readiness: their CRDs may be absent from a cluster,
//! and the CloudPrivateIPConfig endpoints must not wait for them. A list answered with 404 (no
//! such resource) counts as synced and empty, since no such object can exist then; the watcher
//! keeps retrying with backoff (at most about 30 s apart), so a CRD installed later is picked up.
//!
//! The snapshot itself is the store: a kube-runtime reflector `Store` would keep every full Node
//! (images, conditions, …) a second time, while the rules only need names, addresses, the egress
//! annotation and per-node object indexes.
//!
//! Deleted objects stay "managed" for [`RECENT_DELETE_WINDOW`] (rule 3): the cache stamps each
//! delete with the time it saw it and ends the grace when the window has passed. The
//! reconciler's attachment ledger, watched too, makes that knowledge survive a restart: an IP
//! it shows attached or released lately is managed (`ledger.rs`). That watch gates readiness
//! like the Node and object watches, except that a 403 (no Role for the webhook in the ledger's
//! namespace) counts as synced and empty: the webhook then decides from its own memory alone.
//!
//! Every kind is watched untyped and read object by object: a typed watch fails its whole list
//! on one object it cannot decode (stored under a looser or older CRD schema) and retries it
//! forever, which would keep the webhook unready. A CloudPrivateIPConfig is indexed from its
//! name and whatever `spec.node`/`status.node` hold; a Node that does not decode is logged and
//! left out, as if absent.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use cloudnet_shared::antrea::{ExternalIPPool, OPT_IN_LABEL, OPT_IN_VALUE};
use cloudnet_shared::egress::{
    EGRESS_ROUTER_GROUP, EGRESS_ROUTER_KIND, EgressRouterSpec, NAD_GROUP, NAD_KIND, RouterRef,
};
use cloudnet_shared::gateway::EgressGateway;
use cloudnet_shared::ledger::{LABEL as LEDGER_LABEL, LABEL_VALUE as LEDGER_LABEL_VALUE};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::public_ip::EgressPublicIP;
use cloudnet_shared::rules::egress_router::spec_addresses;
use cloudnet_shared::rules::egress_router_cni::{config_addresses, router_owner};
use cloudnet_shared::rules::gateway::{SOURCE_ANNOTATION, gateway_of_object};
use cloudnet_shared::{CloudPrivateIPConfig, ClusterSnapshot, FRONT_END_LABEL, NodeInfo};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};

use crate::deleted::{EXPIRE_EVERY, RECENT_DELETE_WINDOW, RecentDeletes};
use crate::freshness::{self, Freshness, STALE_AFTER};
use crate::ledger::LedgerNames;
use crate::platform::{NodePlatforms, SharedPlatform, detection_note};

/// The shared, always-current view of the cluster plus its readiness.
#[derive(Debug)]
pub struct ClusterCache {
    snapshot: RwLock<ClusterSnapshot>,
    /// Locked only while the snapshot's write lock is held, so the two never disagree.
    deletes: Mutex<RecentDeletes>,
    /// What the ledger pages say; locked only while the snapshot's write lock is held.
    ledger: Mutex<LedgerNames>,
    nodes_synced: AtomicBool,
    ledger_synced: AtomicBool,
    objects_synced: AtomicBool,
    routers_synced: AtomicBool,
    nads_synced: AtomicBool,
    public_ips_synced: AtomicBool,
    antrea_pools_synced: AtomicBool,
    gateways_synced: AtomicBool,
    freshness: Freshness,
    /// The cloud of each Node's providerID; locked only while the snapshot's write lock is held.
    node_platforms: Mutex<NodePlatforms>,
    platform: SharedPlatform,
    /// The cloud `--platform-type` names, which decides over the Nodes (said in the logs).
    platform_flag: Option<Platform>,
}

/// The watches, as [`Freshness`] numbers them.
const NODES: usize = 0;
const OBJECTS: usize = 1;
const ROUTERS: usize = 2;
const NADS: usize = 3;
const LEDGER: usize = 4;
const PUBLIC_IPS: usize = 5;
const ANTREA_POOLS: usize = 6;
const GATEWAYS: usize = 7;

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
        Self::with_bounds(window, STALE_AFTER)
    }

    /// An empty, not yet synced cache: deleted objects stay managed for `window`, and the caches
    /// count as stale once a watch or kube-apiserver has failed for `stale_after`.
    pub fn with_bounds(window: Duration, stale_after: Duration) -> Self {
        Self {
            snapshot: RwLock::default(),
            deletes: Mutex::new(RecentDeletes::new(window)),
            ledger: Mutex::default(),
            nodes_synced: AtomicBool::new(false),
            ledger_synced: AtomicBool::new(false),
            objects_synced: AtomicBool::new(false),
            routers_synced: AtomicBool::new(false),
            nads_synced: AtomicBool::new(false),
            public_ips_synced: AtomicBool::new(false),
            antrea_pools_synced: AtomicBool::new(false),
            gateways_synced: AtomicBool::new(false),
            freshness: Freshness::new(stale_after),
            node_platforms: Mutex::default(),
            platform: SharedPlatform::default(),
            platform_flag: None,
        }
    }

    /// The cache, told that `--platform-type` names `flag`, so its log lines about the Nodes'
    /// cloud say that the flag decides.
    #[must_use]
    pub fn with_platform_flag(mut self, flag: Option<Platform>) -> Self {
        self.platform_flag = flag;
        self
    }

    /// A cache already holding `snapshot` and marked synced (for tests and benchmarks).
    pub fn synced(snapshot: ClusterSnapshot) -> Self {
        let cache = Self::default();
        *cache.write() = snapshot;
        cache.nodes_synced.store(true, Ordering::Release);
        cache.objects_synced.store(true, Ordering::Release);
        cache.routers_synced.store(true, Ordering::Release);
        cache.nads_synced.store(true, Ordering::Release);
        cache.ledger_synced.store(true, Ordering::Release);
        cache.public_ips_synced.store(true, Ordering::Release);
        cache.antrea_pools_synced.store(true, Ordering::Release);
        cache.gateways_synced.store(true, Ordering::Release);
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

    /// Whether both initial lists have been applied and the caches are current.
    pub fn is_ready(&self) -> bool {
        self.not_ready().is_none()
    }

    /// Why the Node, CloudPrivateIPConfig and ledger caches cannot decide admissions now, if
    /// they cannot.
    pub fn not_ready(&self) -> Option<&'static str> {
        if !(self.nodes_synced.load(Ordering::Acquire)
            && self.objects_synced.load(Ordering::Acquire)
            && self.ledger_synced.load(Ordering::Acquire))
        {
            return Some("watch caches not synced yet");
        }
        self.freshness
            .stale(Instant::now(), &[NODES, OBJECTS, LEDGER])
    }

    /// Whether the egress-router watches (EgressRouters, NetworkAttachmentDefinitions) have
    /// completed their initial list, or found their CRD absent, and are current.
    pub fn routers_ready(&self) -> bool {
        self.routers_synced.load(Ordering::Acquire)
            && self.nads_synced.load(Ordering::Acquire)
            && self
                .freshness
                .stale(Instant::now(), &[ROUTERS, NADS])
                .is_none()
    }

    /// Whether the EgressPublicIP watch has completed its initial list, or found its CRD absent,
    /// and is current.
    pub fn public_ips_ready(&self) -> bool {
        self.public_ips_synced.load(Ordering::Acquire)
            && self
                .freshness
                .stale(Instant::now(), &[PUBLIC_IPS])
                .is_none()
    }

    /// Whether the watch of opted-in Antrea ExternalIPPools has completed its initial list, or
    /// found Antrea's CRD absent, and is current.
    pub fn antrea_pools_ready(&self) -> bool {
        self.antrea_pools_synced.load(Ordering::Acquire)
            && self
                .freshness
                .stale(Instant::now(), &[ANTREA_POOLS])
                .is_none()
    }

    /// Whether the EgressGateway watch has completed its initial list, or found its CRD absent,
    /// and is current.
    pub fn gateways_ready(&self) -> bool {
        self.gateways_synced.load(Ordering::Acquire)
            && self.freshness.stale(Instant::now(), &[GATEWAYS]).is_none()
    }

    /// The cloud most Nodes' providerIDs name (see `platform.rs`).
    pub fn platform(&self) -> Option<Platform> {
        self.platform.load()
    }

    /// Node `name` now names `platform` by its providerID (or none, or it is gone).
    fn node_platform(&self, name: &str, platform: Option<Platform>) {
        let mut nodes = self
            .node_platforms
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        nodes.set(name, platform);
        let detected = nodes.agreed(self.platform.load());
        if self.platform.store(detected)
            && let Some(note) = detection_note(self.platform_flag, detected, nodes.mixed())
        {
            let platform = detected.map(Platform::as_str);
            if note.warning {
                tracing::warn!(platform, "{}", note.text);
            } else {
                tracing::info!(platform, "{}", note.text);
            }
        }
        if let Some(dissent) = nodes.new_dissent(self.platform_flag.or(detected)) {
            tracing::warn!(
                node = %dissent.node,
                names = dissent.names.as_str(),
                disagreeing = dissent.nodes,
                "Node {} names {} by its providerID, unlike the cloud in use; its addresses are \
                 checked by the rules of the cloud in use",
                dissent.node,
                dissent.names
            );
        }
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

    /// Ends the grace of every delete older than the window at `now`, and of every ledger
    /// released record whose window has passed at `unix_now` (seconds).
    pub fn expire_deletes(&self, now: Instant, unix_now: u64) {
        let mut snapshot = self.write();
        let ended = self
            .deletes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .expire(now);
        for name in ended {
            snapshot.forget_deleted(&name);
        }
        self.ledger_names().expire(&mut snapshot, unix_now);
    }

    fn ledger_names(&self) -> std::sync::MutexGuard<'_, LedgerNames> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The EgressRouter resource, watched untyped: only `spec.addresses` is read.
pub fn egress_router_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(EGRESS_ROUTER_GROUP, "v1", EGRESS_ROUTER_KIND),
        "egressrouters",
    )
}

/// The NetworkAttachmentDefinition resource, watched untyped: only `spec.config` is read.
pub fn nad_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(NAD_GROUP, "v1", NAD_KIND),
        "network-attachment-definitions",
    )
}

/// The EgressPublicIP resource, watched untyped: only `spec` is read.
pub fn public_ip_resource() -> ApiResource {
    ApiResource::erase::<EgressPublicIP>(&())
}

/// Antrea's ExternalIPPool resource, watched untyped and only for the opted-in pools (selected
/// on the server by their label): only the name and `spec.ipRanges` are kept.
pub fn antrea_pool_resource() -> ApiResource {
    ApiResource::erase::<ExternalIPPool>(&())
}

/// The EgressGateway resource, watched untyped: only the name and `spec.egressIPs` are kept.
pub fn gateway_resource() -> ApiResource {
    ApiResource::erase::<EgressGateway>(&())
}

/// Runs every watch until the process stops; errors are retried with backoff inside the watcher:
/// at most a few seconds apart for the watches every review reads, kube-rs's default (up to 30 s)
/// for the optional CRDs, which may never be installed.
/// The ledger's pages are read in `ledger_namespace`.
pub async fn run(client: Client, cache: Arc<ClusterCache>, ledger_namespace: &str) {
    let nodes = watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<Node>(&())),
        watcher::Config::default(),
    )
    .backoff(cloudnet_kubeclient::watch_backoff());
    let objects = watcher::watcher(
        Api::<DynamicObject>::all_with(
            client.clone(),
            &ApiResource::erase::<CloudPrivateIPConfig>(&()),
        ),
        watcher::Config::default(),
    )
    .backoff(cloudnet_kubeclient::watch_backoff());
    let routers = watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), &egress_router_resource()),
        watcher::Config::default(),
    )
    .default_backoff();
    let nads = watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), &nad_resource()),
        watcher::Config::default(),
    )
    .default_backoff();
    let ledger = watcher::watcher(
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            ledger_namespace,
            &ApiResource::erase::<ConfigMap>(&()),
        ),
        watcher::Config::default().labels(&format!("{LEDGER_LABEL}={LEDGER_LABEL_VALUE}")),
    )
    .backoff(cloudnet_kubeclient::watch_backoff());
    let public_ips = watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), &public_ip_resource()),
        watcher::Config::default(),
    )
    .default_backoff();
    let antrea_pools = watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), &antrea_pool_resource()),
        watcher::Config::default().labels(&format!("{OPT_IN_LABEL}={OPT_IN_VALUE}")),
    )
    .default_backoff();
    let gateways = watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), &gateway_resource()),
        watcher::Config::default(),
    )
    .default_backoff();
    tokio::join!(
        apply_events(gateways, &cache, &GatewayKind),
        apply_events(antrea_pools, &cache, &AntreaPoolKind),
        apply_events(public_ips, &cache, &PublicIpKind),
        apply_events(nodes, &cache, &NodeKind),
        apply_events(objects, &cache, &ObjectKind),
        apply_events(routers, &cache, &RouterKind),
        apply_events(nads, &cache, &NadKind),
        apply_events(ledger, &cache, &LedgerKind),
        expire_deletes(&cache),
        freshness::probe(client, &cache.freshness),
    );
}

async fn expire_deletes(cache: &ClusterCache) {
    let mut ticks = tokio::time::interval(EXPIRE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        cache.expire_deletes(Instant::now(), unix_now());
    }
}

/// The wall clock in Unix seconds, as the ledger's released records carry it.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How one kind of watched object goes into the snapshot.
trait Indexed<K: ResourceExt> {
    const KIND: &'static str;
    /// Whether a 404 on the list means "no such objects" (an optional CRD that is absent).
    const OPTIONAL: bool = false;
    /// The answers that mean the kind cannot be read here at all, for an optional kind.
    const ABSENT_CODES: &'static [u16] = &[404];
    /// The one line logged when an optional kind turns out absent.
    const ABSENT: &'static str =
        "resource not served (CRD absent): counted as synced with no objects; retrying";
    /// The object's key in the watch's bookkeeping: its name, or namespace/name.
    fn key(object: &K) -> String {
        object.name_any()
    }
    /// The watch's number in [`Freshness`].
    const INDEX: usize;
    fn upsert(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &K);
    fn remove(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str);
    fn synced(cache: &ClusterCache) -> &AtomicBool;
}

struct NodeKind;

impl Indexed<DynamicObject> for NodeKind {
    const KIND: &'static str = "Node";
    const INDEX: usize = NODES;
    fn upsert(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &DynamicObject) {
        let name = object.name_any();
        match object.clone().try_parse::<Node>() {
            Ok(node) => {
                let cloud = node
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.provider_id.as_deref())
                    .and_then(Platform::from_provider_id);
                cache.node_platform(&name, cloud);
                snapshot.upsert_node(NodeInfo::from_node(&node));
                snapshot.set_node_labels(&name, node.metadata.labels.unwrap_or_default());
            }
            Err(error) => {
                tracing::warn!(kind = Self::KIND, %name, %error, "object cannot be decoded; left out");
                cache.node_platform(&name, None);
                snapshot.remove_node(&name);
            }
        }
    }
    fn remove(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str) {
        cache.node_platform(name, None);
        snapshot.remove_node(name);
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.nodes_synced
    }
}

struct ObjectKind;

impl Indexed<DynamicObject> for ObjectKind {
    const KIND: &'static str = "CloudPrivateIPConfig";
    const INDEX: usize = OBJECTS;
    fn upsert(_cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &DynamicObject) {
        let name = object.name_any();
        let (spec_node, spec_ok) = node_field(object, "spec");
        let (status_node, status_ok) = node_field(object, "status");
        if !(spec_ok && status_ok) {
            // Its name is still an egress IP the cluster manages (rule 3), so it stays indexed.
            tracing::warn!(kind = Self::KIND, %name, "object cannot be decoded; indexed by name");
        }
        snapshot.upsert_object(&name, spec_node, status_node);
        let gateway = gateway_of_object(
            object.labels().get(FRONT_END_LABEL).map(String::as_str),
            object
                .annotations()
                .get(SOURCE_ANNOTATION)
                .map(String::as_str),
        );
        snapshot.set_object_gateway(&name, gateway);
    }
    fn remove(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str) {
        // Also an object that vanished while the watch was down: a delete seen late.
        cache.object_deleted(snapshot, name, Instant::now());
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.objects_synced
    }
}

struct RouterKind;

impl Indexed<DynamicObject> for RouterKind {
    const KIND: &'static str = EGRESS_ROUTER_KIND;
    const INDEX: usize = ROUTERS;
    const OPTIONAL: bool = true;
    fn key(object: &DynamicObject) -> String {
        namespaced_key(object)
    }
    fn upsert(_cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &DynamicObject) {
        let this = RouterRef::egress_router(
            object.namespace().as_deref().unwrap_or_default(),
            &object.name_any(),
        );
        let spec: EgressRouterSpec = object
            .data
            .get("spec")
            .and_then(|spec| serde_json::from_value(spec.clone()).ok())
            .unwrap_or_default();
        snapshot
            .routers_mut()
            .upsert(this.clone(), this, spec_addresses(&spec));
    }
    fn remove(_: &ClusterCache, snapshot: &mut ClusterSnapshot, key: &str) {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        snapshot
            .routers_mut()
            .remove(&RouterRef::egress_router(namespace, name));
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.routers_synced
    }
}

struct LedgerKind;

impl Indexed<DynamicObject> for LedgerKind {
    const KIND: &'static str = "attachment ledger ConfigMap";
    const INDEX: usize = LEDGER;
    const OPTIONAL: bool = true;
    const ABSENT_CODES: &'static [u16] = &[403, 404];
    const ABSENT: &'static str = "the attachment ledger cannot be read (no Role for the webhook in \
        --ledger-namespace, manifests/webhook/rbac.yaml): the IPs of objects deleted before this \
        process started count as managed only through their Node annotations; retrying";
    fn upsert(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &DynamicObject) {
        cache
            .ledger_names()
            .upsert(snapshot, &object.name_any(), object, unix_now());
    }
    fn remove(cache: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str) {
        cache.ledger_names().remove(snapshot, name);
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.ledger_synced
    }
}

struct PublicIpKind;

impl Indexed<DynamicObject> for PublicIpKind {
    const KIND: &'static str = "EgressPublicIP";
    const INDEX: usize = PUBLIC_IPS;
    const OPTIONAL: bool = true;
    fn upsert(_cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &DynamicObject) {
        let name = object.name_any();
        match crate::public_ip::spec(&name, object) {
            Ok(spec) => snapshot.public_ips_mut().upsert(&name, &spec),
            Err(error) => {
                tracing::warn!(kind = Self::KIND, %name, %error, "object cannot be decoded; left out");
                snapshot.public_ips_mut().remove(&name);
            }
        }
    }
    fn remove(_: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str) {
        snapshot.public_ips_mut().remove(name);
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.public_ips_synced
    }
}

struct AntreaPoolKind;

impl Indexed<DynamicObject> for AntreaPoolKind {
    const KIND: &'static str = "ExternalIPPool";
    const INDEX: usize = ANTREA_POOLS;
    const OPTIONAL: bool = true;
    fn upsert(_cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &DynamicObject) {
        let name = object.name_any();
        match crate::antrea::pool(object) {
            Ok(pool) => snapshot.upsert_antrea_pool(&pool),
            Err(error) => {
                tracing::warn!(kind = Self::KIND, %name, %error, "object cannot be decoded; left out");
                snapshot.remove_antrea_pool(&name);
            }
        }
    }
    fn remove(_: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str) {
        snapshot.remove_antrea_pool(name);
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.antrea_pools_synced
    }
}

struct GatewayKind;

impl Indexed<DynamicObject> for GatewayKind {
    const KIND: &'static str = "EgressGateway";
    const INDEX: usize = GATEWAYS;
    const OPTIONAL: bool = true;
    fn upsert(_cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &DynamicObject) {
        let name = object.name_any();
        match crate::gateway::egress_ips(object) {
            Ok(ips) => snapshot
                .gateways_mut()
                .upsert(&name, ips.iter().map(String::as_str)),
            Err(error) => {
                // The CRD's schema makes this a list of strings; a gateway stored otherwise
                // claims nothing the reconciler could attach either.
                tracing::warn!(kind = Self::KIND, %name, %error, "object cannot be decoded; left out");
                snapshot.gateways_mut().remove(&name);
            }
        }
    }
    fn remove(_: &ClusterCache, snapshot: &mut ClusterSnapshot, name: &str) {
        snapshot.gateways_mut().remove(name);
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.gateways_synced
    }
}

struct NadKind;

impl Indexed<DynamicObject> for NadKind {
    const KIND: &'static str = NAD_KIND;
    const INDEX: usize = NADS;
    const OPTIONAL: bool = true;
    fn key(object: &DynamicObject) -> String {
        namespaced_key(object)
    }
    fn upsert(_cache: &ClusterCache, snapshot: &mut ClusterSnapshot, object: &DynamicObject) {
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let this = RouterRef::nad(&namespace, &name);
        // Only egress-router configs carry addresses; every other one indexes nothing.
        let ips = object
            .data
            .get("spec")
            .and_then(|spec| spec.get("config"))
            .and_then(serde_json::Value::as_str)
            .map(config_addresses)
            .unwrap_or_default();
        let owner = router_owner(&namespace, &name, object.owner_references());
        snapshot.routers_mut().upsert(this, owner, ips);
    }
    fn remove(_: &ClusterCache, snapshot: &mut ClusterSnapshot, key: &str) {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        snapshot
            .routers_mut()
            .remove(&RouterRef::nad(namespace, name));
    }
    fn synced(cache: &ClusterCache) -> &AtomicBool {
        &cache.nads_synced
    }
}

/// `object.<field>.node` as a string (empty when absent), and whether `<field>` was well-formed:
/// absent, or an object whose `node` is absent or a string.
fn node_field<'a>(object: &'a DynamicObject, field: &str) -> (&'a str, bool) {
    match object.data.get(field) {
        None | Some(serde_json::Value::Null) => ("", true),
        Some(serde_json::Value::Object(map)) => match map.get("node") {
            None | Some(serde_json::Value::Null) => ("", true),
            Some(serde_json::Value::String(node)) => (node, true),
            Some(_) => ("", false),
        },
        Some(_) => ("", false),
    }
}

fn namespaced_key(object: &DynamicObject) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Whether a watch error says the resource cannot be read here at all: answered with one of
/// `codes` (404: its CRD is not installed; 403: no permission).
fn resource_absent(error: &watcher::Error, codes: &[u16]) -> bool {
    matches!(
        error,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
            | watcher::Error::WatchStartFailed(kube::Error::Api(status))
            if codes.contains(&status.code)
    )
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
        match &event {
            Ok(_) => cache.freshness.watch_ok(I::INDEX),
            Err(error) if I::OPTIONAL && resource_absent(error, I::ABSENT_CODES) => {
                cache.freshness.watch_ok(I::INDEX);
            }
            Err(_) => cache.freshness.watch_failed(I::INDEX, Instant::now()),
        }
        match event {
            Ok(Event::Apply(object)) => {
                known.insert(I::key(&object));
                I::upsert(cache, &mut cache.write(), &object);
            }
            Ok(Event::Delete(object)) => {
                let name = I::key(&object);
                known.remove(&name);
                I::remove(cache, &mut cache.write(), &name);
            }
            Ok(Event::Init) => relisted.clear(),
            Ok(Event::InitApply(object)) => {
                relisted.insert(I::key(&object));
                I::upsert(cache, &mut cache.write(), &object);
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
            Err(error) if I::OPTIONAL && resource_absent(&error, I::ABSENT_CODES) => {
                // No CRD, no objects: whatever was indexed went with it. The retries of an
                // absent CRD find nothing to drop and leave the snapshot's lock alone.
                if !known.is_empty() {
                    let mut snapshot = cache.write();
                    for gone in known.drain() {
                        I::remove(cache, &mut snapshot, &gone);
                    }
                }
                if !I::synced(cache).swap(true, Ordering::AcqRel) {
                    tracing::info!(kind = I::KIND, "{}", I::ABSENT);
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

    /// The object as the untyped watch sees it.
    fn untyped(object: CloudPrivateIPConfig) -> DynamicObject {
        serde_json::from_value(serde_json::to_value(object).unwrap()).unwrap()
    }

    async fn apply(cache: &ClusterCache, events: Vec<Event<CloudPrivateIPConfig>>) {
        let events = events.into_iter().map(|event| {
            Ok(match event {
                Event::Apply(o) => Event::Apply(untyped(o)),
                Event::Delete(o) => Event::Delete(untyped(o)),
                Event::Init => Event::Init,
                Event::InitApply(o) => Event::InitApply(untyped(o)),
                Event::InitDone => Event::InitDone,
            })
        });
        apply_events(stream::iter(events), cache, &ObjectKind).await;
    }

    #[tokio::test]
    async fn objects_the_type_cannot_decode_are_indexed_by_name_and_the_cache_syncs() {
        let cache = ClusterCache::new();
        let raw = |name: &str, spec: serde_json::Value, status: serde_json::Value| {
            let object: DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "cloud.network.openshift.io/v1",
                "kind": "CloudPrivateIPConfig",
                "metadata": { "name": name },
                "spec": spec,
                "status": status,
            }))
            .unwrap();
            Ok(Event::InitApply(object))
        };
        let events = vec![
            Ok(Event::Init),
            raw(
                "10.0.0.1",
                serde_json::json!({ "node": 1 }),
                serde_json::Value::Null,
            ),
            raw(
                "10.0.0.2",
                serde_json::json!("n1"),
                serde_json::json!({ "node": "n2" }),
            ),
            raw(
                "10.0.0.3",
                serde_json::json!({ "node": "n3" }),
                serde_json::json!([]),
            ),
            Ok(Event::InitDone),
        ];
        apply_events(stream::iter(events), &cache, &ObjectKind).await;
        assert!(cache.objects_synced.load(Ordering::Acquire));
        let snapshot = cache.read();
        for name in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
            assert!(snapshot.has_object(name), "{name}");
        }
        assert_eq!(snapshot.object_node("10.0.0.3"), Some("n3"));
        assert_eq!(
            snapshot.count_occupying("n2", cloudnet_shared::platform::Bucket::Ip, ""),
            1
        );
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
        cache.expire_deletes(seen, 0);
        assert!(cache.read().is_managed("10.0.0.5"));
        cache.expire_deletes(seen + window + Duration::from_secs(1), 0);
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

    fn dynamic(
        resource: &ApiResource,
        namespace: &str,
        name: &str,
        data: serde_json::Value,
    ) -> DynamicObject {
        let mut object = DynamicObject::new(name, resource).within(namespace);
        object.data = data;
        object
    }

    fn not_found() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure(
                "the server could not find the requested resource",
                "NotFound",
            )
            .with_code(404),
        )))
    }

    #[tokio::test]
    async fn an_absent_crd_counts_as_synced_and_empty() {
        let cache = ClusterCache::with_delete_window(Duration::from_secs(600));
        let r1 = dynamic(
            &egress_router_resource(),
            "egress",
            "r1",
            serde_json::json!({"spec": {"addresses": [{"ip": "192.168.3.10/24"}]}}),
        );
        let events: Vec<Result<Event<DynamicObject>, watcher::Error>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(r1)),
            Ok(Event::InitDone),
        ];
        // The CRD is deleted later (its objects with it): the re-list answers 404.
        let (tx, rx) = futures::channel::mpsc::unbounded();
        for event in events {
            tx.unbounded_send(event).unwrap();
        }
        let feed = async {
            tokio::task::yield_now().await;
            assert_eq!(cache.read().routers().len(), 1);
            tx.unbounded_send(Err(not_found())).unwrap();
            drop(tx);
        };
        tokio::join!(apply_events(rx, &cache, &RouterKind), feed);
        assert!(cache.read().routers().is_empty());

        let fresh = ClusterCache::new();
        assert!(!fresh.routers_ready());
        apply_events(stream::iter(vec![Err(not_found())]), &fresh, &RouterKind).await;
        apply_events(stream::iter(vec![Err(not_found())]), &fresh, &NadKind).await;
        assert!(fresh.routers_ready());
        assert!(
            !fresh.is_ready(),
            "readiness still waits for nodes and objects"
        );
        // A 404 on a required kind is an error to retry, never "synced".
        apply_events(stream::iter(vec![Err(not_found())]), &fresh, &ObjectKind).await;
        assert!(!fresh.objects_synced.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn bindings_are_indexed_and_an_absent_crd_readies_only_their_endpoint() {
        let binding = |name: &str, private_ip: &str| {
            dynamic(
                &public_ip_resource(),
                "",
                name,
                serde_json::json!({"spec": {"privateIP": private_ip, "publicIP": "eipalloc-0a1b2c3d"}}),
            )
        };
        let cache = ClusterCache::new();
        assert!(!cache.public_ips_ready());
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(binding("b1", "10.0.0.5"))),
            Ok(Event::InitApply(binding("b2", "10.0.0.6"))),
            Ok(Event::InitDone),
            Ok(Event::Delete(binding("b2", "10.0.0.6"))),
        ];
        apply_events(stream::iter(events), &cache, &PublicIpKind).await;
        assert!(cache.public_ips_ready());
        assert!(!cache.is_ready(), "the other watches still gate the rest");
        assert_eq!(cache.read().public_ips().len(), 1);
        assert_eq!(
            cache
                .read()
                .public_ips()
                .other_with_private("10.0.0.5", "new")
                .map(str::to_owned),
            Some("b1".to_owned())
        );

        let fresh = ClusterCache::new();
        apply_events(stream::iter(vec![Err(status(403))]), &fresh, &PublicIpKind).await;
        assert!(
            !fresh.public_ips_ready(),
            "no permission to read bindings is no proof there are none"
        );
        apply_events(stream::iter(vec![Err(not_found())]), &fresh, &PublicIpKind).await;
        assert!(fresh.public_ips_ready());
    }

    #[tokio::test]
    async fn gateways_claims_and_their_objects_are_indexed_and_an_absent_crd_readies_their_endpoint()
     {
        let gateway = |name: &str, ips: serde_json::Value| {
            dynamic(
                &gateway_resource(),
                "",
                name,
                serde_json::json!({"spec": {"nodeSelector": {}, "egressIPs": ips}}),
            )
        };
        let cache = ClusterCache::new();
        assert!(!cache.gateways_ready());
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(gateway(
                "web",
                serde_json::json!(["10.0.0.5"]),
            ))),
            Ok(Event::InitApply(gateway(
                "db",
                serde_json::json!(["10.0.0.6"]),
            ))),
            Ok(Event::InitDone),
            Ok(Event::Delete(gateway(
                "db",
                serde_json::json!(["10.0.0.6"]),
            ))),
            // A gateway stored with an unreadable list claims nothing.
            Ok(Event::Apply(gateway("odd", serde_json::json!("10.0.0.7")))),
        ];
        apply_events(stream::iter(events), &cache, &GatewayKind).await;
        assert!(cache.gateways_ready());
        assert!(!cache.is_ready(), "the other watches still gate the rest");
        let ip = |text: &str| text.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(
            cache.read().gateways().claiming(ip("10.0.0.5")),
            Some("web")
        );
        assert_eq!(cache.read().gateways().claiming(ip("10.0.0.6")), None);
        assert_eq!(cache.read().gateways().len(), 1);

        // The reconciler's object for a gateway is told by its label and source together.
        let mut kept = untyped(object("10.0.0.5", "n1", "n1"));
        kept.metadata.labels =
            Some([(FRONT_END_LABEL.to_owned(), "egress-gateway".to_owned())].into());
        kept.metadata.annotations =
            Some([(SOURCE_ANNOTATION.to_owned(), "EgressGateway/web".to_owned())].into());
        let mut plugins = untyped(object("10.0.0.8", "n1", "n1"));
        plugins.metadata.annotations =
            Some([(SOURCE_ANNOTATION.to_owned(), "EgressGateway/web".to_owned())].into());
        let events = vec![Ok(Event::Apply(kept.clone())), Ok(Event::Apply(plugins))];
        apply_events(stream::iter(events), &cache, &ObjectKind).await;
        assert_eq!(cache.read().object_gateway("10.0.0.5"), Some("web"));
        assert_eq!(cache.read().object_gateway("10.0.0.8"), None);
        // Losing the label (or the object) forgets it.
        kept.metadata.labels = None;
        apply_events(
            stream::iter(vec![Ok(Event::Apply(kept))]),
            &cache,
            &ObjectKind,
        )
        .await;
        assert_eq!(cache.read().object_gateway("10.0.0.5"), None);

        let fresh = ClusterCache::new();
        apply_events(stream::iter(vec![Err(status(403))]), &fresh, &GatewayKind).await;
        assert!(
            !fresh.gateways_ready(),
            "no permission to read gateways is no proof there are none"
        );
        apply_events(stream::iter(vec![Err(not_found())]), &fresh, &GatewayKind).await;
        assert!(fresh.gateways_ready());
    }

    fn status(code: u16) -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Forbidden").with_code(code),
        )))
    }

    #[tokio::test]
    async fn readiness_waits_for_the_ledger_and_a_forbidden_ledger_counts_as_synced() {
        let objects = || stream::iter(vec![Ok(Event::Init), Ok(Event::InitDone)]);
        let cache = ClusterCache::new();
        apply_events(objects(), &cache, &NodeKind).await;
        apply_events(objects(), &cache, &ObjectKind).await;
        assert_eq!(cache.not_ready(), Some("watch caches not synced yet"));
        // Another error is retried, never "synced".
        apply_events(stream::iter(vec![Err(status(500))]), &cache, &LedgerKind).await;
        assert!(!cache.is_ready());
        apply_events(stream::iter(vec![Err(status(403))]), &cache, &LedgerKind).await;
        assert!(
            cache.is_ready(),
            "no Role: per-process memory only, still ready"
        );

        let cache = ClusterCache::new();
        apply_events(objects(), &cache, &NodeKind).await;
        apply_events(objects(), &cache, &ObjectKind).await;
        let mut page = dynamic(
            &ApiResource::erase::<ConfigMap>(&()),
            "cloudnet-system",
            "cloudnet-ledger-0",
            serde_json::json!({ "data": { "10.0.0.5": "n1" } }),
        );
        page.metadata.annotations = Some(
            [(
                cloudnet_shared::ledger::RELEASED_ANNOTATION.into(),
                format!("{{\"10.0.0.6\":{}}}", unix_now()),
            )]
            .into(),
        );
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(page)),
            Ok(Event::InitDone),
        ];
        apply_events(stream::iter(events), &cache, &LedgerKind).await;
        assert!(cache.is_ready());
        for name in ["10.0.0.5", "10.0.0.6"] {
            assert!(cache.read().is_managed(name), "{name}");
        }
        let window = cloudnet_shared::ledger::RECENT_RELEASE_WINDOW.as_secs();
        cache.expire_deletes(Instant::now(), unix_now() + window);
        assert!(
            !cache.read().is_managed("10.0.0.6"),
            "its window has passed"
        );
        assert!(cache.read().is_managed("10.0.0.5"));
    }

    #[tokio::test]
    async fn nads_are_indexed_by_namespace_and_name_with_their_owner() {
        let cache = ClusterCache::new();
        let config = r#"{"type":"egress-router","ip":{"addresses":["192.168.3.10/24"]}}"#;
        let mut owned = dynamic(
            &nad_resource(),
            "a",
            "n",
            serde_json::json!({"spec": {"config": config}}),
        );
        owned.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "network.operator.openshift.io/v1".into(),
                kind: "EgressRouter".into(),
                name: "r1".into(),
                uid: "u".into(),
                controller: Some(true),
                block_owner_deletion: None,
            },
        ]);
        let same_name = dynamic(
            &nad_resource(),
            "b",
            "n",
            serde_json::json!({"spec": {"config": config}}),
        );
        let unrelated = dynamic(
            &nad_resource(),
            "b",
            "m",
            serde_json::json!({"spec": {"config": "{\"type\":\"bridge\"}"}}),
        );
        let events = vec![
            Ok(Event::Apply(owned)),
            Ok(Event::Apply(same_name.clone())),
            Ok(Event::Apply(unrelated)),
        ];
        apply_events(stream::iter(events), &cache, &NadKind).await;
        let ip = "192.168.3.10".parse().unwrap();
        assert_eq!(
            cache
                .read()
                .routers()
                .other_owner(ip, &RouterRef::nad("b", "n")),
            Some(&RouterRef::egress_router("a", "r1"))
        );
        apply_events(
            stream::iter(vec![Ok(Event::Delete(same_name))]),
            &cache,
            &NadKind,
        )
        .await;
        assert_eq!(
            cache.read().routers().len(),
            1,
            "only egress-router configs are indexed, by namespace"
        );
        assert_eq!(
            cache
                .read()
                .routers()
                .other_owner(ip, &RouterRef::egress_router("a", "r1")),
            None
        );
    }
}
