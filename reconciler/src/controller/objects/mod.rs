//! The `CloudPrivateIPConfig` controller: reads an object, asks [`crate::controller::plan`] for the next step,
//! performs it (status write, metadata write or a cloud call through the node's lane), and repeats
//! until the object is converged or a step fails.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use cloudnet_shared::platform::{bucket_for, key_mismatch};
use cloudnet_shared::rules::{Claim, check_address_index, check_claim, occupies};
use cloudnet_shared::{
    AssignedReason, CloudPrivateIPConfig, EGRESS_IPCONFIG_ANNOTATION, EgressState, FINALIZER,
    NodeInfo, decode_name,
};
use futures::FutureExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use thiserror::Error;
use tokio::sync::Semaphore;

use crate::cloud::{CloudError, CloudProvider, ErrorKind, NodeTarget};
use crate::controller::events::Events;
use crate::controller::nodes::CACHE_WAIT;
use crate::controller::plan::{
    AfterDetach, Assigned, DetachFrom, ObjectState, SourceNode, Step, detach_from, next_step,
};
use crate::controller::status::upstream::{
    ADD_FAILED, ADDED, ADDING, DELETE_FAILED, DELETED, DELETING, MOVE_FAILED, MOVED, MOVING,
};
use crate::controller::status::{next_status, upstream_first};
use crate::engine::interfaces::Interfaces;
use crate::engine::lanes::{Lanes, Mutation};
use crate::engine::ledger::Ledger;
use crate::metrics::{Metrics, OutcomeLabels};
use crate::retries::Retries;

/// Retries of the detach of an IP whose object vanished mid-attach (no later reconcile will).
const ORPHAN_DETACH_RETRIES: usize = 8;

/// The shortest retry after the cloud refused a change as such (an address in use elsewhere, no
/// room): retrying soon would only spend the account's request budget (capped by the backoff cap).
pub const PERMANENT_RETRY_FLOOR: Duration = Duration::from_secs(30);

/// Why a reconcile stopped short; the object is retried with backoff.
#[derive(Debug, Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The cloud call failed (already reported in the condition).
    #[error("cloud: {0}")]
    Cloud(#[from] CloudError),
    /// The object cannot be acted on yet (node missing, no capacity, bad name); reported in the
    /// condition.
    #[error("{0}")]
    Blocked(String),
    /// The node cache stopped before it synced (the controller is shutting down).
    #[error("node cache closed before it synced")]
    CacheClosed,
}

/// Tunables of the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// First retry delay of a failing object.
    pub backoff_base: Duration,
    /// Longest retry delay; failing objects keep being retried at this period.
    pub backoff_cap: Duration,
    /// How often attached IPs are compared with the cloud (zero: never).
    pub drift_period: Duration,
    /// Most cloud calls in flight at once, over all nodes.
    pub parallel_nodes: usize,
    /// Most objects reconciled at once.
    pub concurrency: u16,
    /// An idle node's lane gathers IPs until none has arrived for this long...
    pub coalesce_window: Duration,
    /// ... or until this long after the first, whichever comes first.
    pub max_gather: Duration,
    /// The longest one cloud call may hold its node's lane, the provider's own retries included;
    /// after it the call's IPs fail with a retryable error and the lane moves on.
    pub call_deadline: Duration,
    /// Most object writes and Events awaiting the API server at once. Reconciles beyond it wait
    /// before building their request, which costs far less memory than a request queued in the
    /// client.
    pub api_requests: usize,
    /// The namespace of the attachment ledger's ConfigMaps: the controller's own
    /// (`CONTROLLER_NAMESPACE`, where the Lease is).
    pub namespace: String,
    /// How long a ledger entry no object claims is left alone before the orphan sweep detaches
    /// its IP: long enough for the object watch to show every write that claims one.
    pub orphan_grace: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(60),
            drift_period: Duration::from_secs(300),
            parallel_nodes: 64,
            concurrency: 1024,
            coalesce_window: Duration::from_millis(100),
            max_gather: Duration::from_secs(1),
            call_deadline: crate::engine::lanes::DEFAULT_CALL_DEADLINE,
            api_requests: 32,
            namespace: "default".to_owned(),
            orphan_grace: Duration::from_secs(120),
        }
    }
}

/// Everything a reconcile needs.
pub struct Context {
    /// The objects' API.
    pub api: Api<CloudPrivateIPConfig>,
    /// The cloud.
    pub cloud: Arc<dyn CloudProvider>,
    /// Per-node batching of cloud calls.
    pub lanes: Arc<Lanes>,
    /// Node cache.
    pub nodes: Store<Node>,
    /// Object cache.
    pub objects: Store<CloudPrivateIPConfig>,
    /// The object cache's objects by node.
    pub by_node: Arc<NodeIndex>,
    /// Where each IP may be attached, as recorded before every attach call.
    pub ledger: Arc<Ledger>,
    /// The cached view of each VM's interface.
    pub interfaces: Arc<Interfaces>,
    /// Publishes Kubernetes Events.
    pub events: Events,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Tunables.
    pub config: EngineConfig,
    /// Objects a drift check found missing from their node.
    pub drifted: Mutex<HashSet<String>>,
    /// The newest version of each object we wrote, for as long as the cache lags behind it.
    written: Arc<Written>,
    retries: Retries,
    /// See [`EngineConfig::api_requests`].
    api_slots: Semaphore,
}

/// The newest version of each object we wrote, for as long as the cache lags behind it: acting
/// on a cached status older than our own last write would repeat a cloud call.
#[derive(Debug, Default)]
pub struct Written {
    inner: Mutex<HashMap<String, Arc<CloudPrivateIPConfig>>>,
}

impl Written {
    /// Follows one event of the object watch, after the cache's writer: forgets each object the
    /// cache has caught up with, so that converged objects are not held twice. Returns whether
    /// the event's object is no newer than the last one our writes returned: the reconcile that
    /// wrote it has seen it (every write of ours is guarded by the version it read), so it needs
    /// no reconcile of its own.
    pub fn apply(&self, event: &kube::runtime::watcher::Event<CloudPrivateIPConfig>) -> bool {
        use kube::runtime::watcher::Event;
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

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<CloudPrivateIPConfig>>> {
        lock(&self.inner)
    }
}

/// Which objects name each node, in their spec or their status: the node annotation and the
/// capacity check read one node's objects without scanning the whole cache, which at 10,000
/// objects made every reconcile cost a pass over all of them. Fed from the object watch, beside
/// the cache's own writer.
#[derive(Debug, Default)]
pub struct NodeIndex {
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
    pub fn apply(
        &self,
        event: &kube::runtime::watcher::Event<CloudPrivateIPConfig>,
    ) -> Vec<String> {
        use kube::runtime::watcher::Event;
        let mut state = lock(&self.inner);
        match event {
            Event::Apply(obj) => {
                let nodes = crate::controller::nodes::nodes_of(obj);
                state.insert(obj.name_any(), nodes.clone());
                nodes
            }
            Event::Delete(obj) => {
                state.remove(&obj.name_any());
                crate::controller::nodes::nodes_of(obj)
            }
            Event::Init => {
                state.relist = Some(Vec::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                let nodes = crate::controller::nodes::nodes_of(obj);
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
    pub fn objects_on(
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

impl Context {
    /// A context over the given pieces.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        api: Api<CloudPrivateIPConfig>,
        cloud: Arc<dyn CloudProvider>,
        lanes: Arc<Lanes>,
        nodes: Store<Node>,
        objects: Store<CloudPrivateIPConfig>,
        by_node: Arc<NodeIndex>,
        ledger: Arc<Ledger>,
        interfaces: Arc<Interfaces>,
        written: Arc<Written>,
        events: Events,
        metrics: Arc<Metrics>,
        config: EngineConfig,
    ) -> Self {
        let retries = Retries::new(config.backoff_base, config.backoff_cap);
        let api_slots = Semaphore::new(config.api_requests.max(1));
        Self {
            api,
            cloud,
            lanes,
            nodes,
            objects,
            by_node,
            ledger,
            interfaces,
            events,
            metrics,
            config,
            drifted: Mutex::default(),
            written,
            retries,
            api_slots,
        }
    }

    /// The newer of the cached object and the last one we wrote: the cache may lag our writes,
    /// and acting on a stale status would repeat a cloud call.
    pub(crate) fn freshest(&self, cached: Arc<CloudPrivateIPConfig>) -> Arc<CloudPrivateIPConfig> {
        let mut written = self.written.lock();
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

    /// Keeps the object a write returned until the cache catches up with it.
    fn remember(&self, mut obj: CloudPrivateIPConfig) -> Arc<CloudPrivateIPConfig> {
        self.metrics.api_writes.inc();
        // Never read, and most of a written object's size (the cache drops them too).
        obj.metadata.managed_fields = None;
        let obj = Arc::new(obj);
        self.written.lock().insert(obj.name_any(), Arc::clone(&obj));
        obj
    }

    fn forget(&self, name: &str) {
        self.written.lock().remove(name);
        self.retries.reset(name);
        lock(&self.drifted).remove(name);
    }

    /// Runs the API request `request` makes once one of the API slots is free. The request is
    /// built only then, and boxed: kube's request futures are kilobytes, and a reconcile's
    /// future is as large as its largest await.
    async fn with_api_slot<F, Fut>(&self, request: F) -> Fut::Output
    where
        F: FnOnce() -> Fut,
        Fut: Future,
    {
        // An error only if the semaphore were closed, which it never is.
        let _slot = self.api_slots.acquire().await;
        Box::pin(request()).await
    }

    async fn event(&self, obj: &CloudPrivateIPConfig, warning: bool, reason: &str, note: String) {
        self.with_api_slot(|| async move {
            self.events
                .publish(&obj.object_ref(&()), warning, reason, note)
                .await;
        })
        .await;
    }

    async fn write_status(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
        reason: AssignedReason,
        message: &str,
    ) -> Result<Arc<CloudPrivateIPConfig>, Error> {
        let Some(status) = next_status(
            obj.status.as_ref(),
            node,
            reason,
            message,
            obj.metadata.generation,
            Timestamp::now(),
        ) else {
            return Ok(Arc::clone(obj));
        };
        tracing::debug!(object = %obj.name_any(), node, reason = reason.as_str(), "writing status");
        // Guarded by the resourceVersion the decision was made on: a write still in flight from
        // a process that has since died, or from a deposed leader, must fail rather than land
        // after a newer status and point status.node away from where the IP really is.
        let patch = json!({
            "metadata": { "resourceVersion": obj.resource_version() },
            "status": status,
        });
        let written = self
            .with_api_slot(|| async move {
                let (name, params) = (obj.name_any(), PatchParams::default());
                self.api
                    .patch_status(&name, &params, &Patch::Merge(&patch))
                    .await
            })
            .await?;
        Ok(self.remember(written))
    }

    /// Puts the finalizer on the object, guarded by its resourceVersion so a concurrent change is
    /// never overwritten.
    async fn ensure_finalizer(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
    ) -> Result<Arc<CloudPrivateIPConfig>, Error> {
        if obj.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Arc::clone(obj));
        }
        tracing::debug!(object = %obj.name_any(), "adding the finalizer");
        let mut finalizers = obj.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        let patch = json!({ "metadata": {
            "resourceVersion": obj.resource_version(),
            "finalizers": finalizers,
        }});
        let written = self
            .with_api_slot(|| async move {
                let (name, params) = (obj.name_any(), PatchParams::default());
                self.api.patch(&name, &params, &Patch::Merge(&patch)).await
            })
            .await?;
        Ok(self.remember(written))
    }

    async fn release_finalizer(&self, obj: &CloudPrivateIPConfig) -> Result<(), Error> {
        tracing::debug!(
            object = %obj.name_any(),
            resource_version = obj.resource_version().unwrap_or_default(),
            "releasing the finalizer"
        );
        let finalizers: Vec<&String> = obj
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .collect();
        let patch = json!({ "metadata": {
            "resourceVersion": obj.resource_version(),
            "finalizers": finalizers,
        }});
        let released = self
            .with_api_slot(|| async move {
                let (name, params) = (obj.name_any(), PatchParams::default());
                self.api.patch(&name, &params, &Patch::Merge(&patch)).await
            })
            .await;
        match released {
            Ok(_) => {
                self.metrics.api_writes.inc();
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The VM to detach `ip` from: the one the ledger records for `node`; else, for an IP
    /// attached without a record (by the upstream controller), the Node's current VM if its
    /// cached interface view shows the IP there. `None` when nothing is attached there, with the
    /// reason for the Event.
    async fn detach_target(
        &self,
        ip: IpAddr,
        node: &str,
    ) -> Result<Result<NodeTarget, String>, Error> {
        let cached = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node));
        let synced = matches!(self.nodes.wait_until_ready().now_or_never(), Some(Ok(())));
        let source = match &cached {
            _ if !synced => SourceNode::NotSynced,
            None => SourceNode::Absent,
            Some(n) => match n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
                Some(provider_id) if !provider_id.is_empty() => SourceNode::Present { provider_id },
                _ => SourceNode::NoProviderId,
            },
        };
        let gone = matches!(source, SourceNode::Absent);
        match detach_from(node, self.ledger.instance(ip, node), source) {
            DetachFrom::Recorded(instance) => Ok(Ok(NodeTarget {
                node_name: node.to_owned(),
                provider_id: String::new(),
                instance,
                internal_ips: Default::default(),
            })),
            DetachFrom::Node(provider_id) => {
                let target = crate::controller::nodes::resolve(
                    self.cloud.as_ref(),
                    node,
                    cached.as_deref(),
                    &provider_id,
                )
                .await?;
                if self.interfaces.get_or_read(&target).await?.holds(ip) {
                    Ok(Ok(target))
                } else {
                    Ok(Err(format!(
                        "the attachment ledger shows nothing attached to node {node} and its VM \
                         does not hold {ip}: nothing to detach"
                    )))
                }
            }
            DetachFrom::NothingRecorded => {
                let why = if gone { "is gone" } else { "has no providerID" };
                Ok(Err(format!(
                    "the attachment ledger shows nothing attached to node {node}, which {why}: \
                     nothing to detach; if another controller attached {ip} there, it may \
                     remain on that node's VM"
                )))
            }
            DetachFrom::Wait(message) => Err(Error::Blocked(message)),
        }
    }

    /// Re-checks the admission rules that read the node's annotation (SPEC §3 rules 4 and 5)
    /// from the node cache before any cloud call: admission can race, can be bypassed, or may
    /// have seen the node before it was annotated. Without a readable annotation there is
    /// nothing to check against and the cloud's own answer decides.
    ///
    /// Capacity blocks only the IPs over the limit: the occupants of the node's bucket are
    /// ranked by [`Claim`] (attached first, then oldest, then by name), so the same IPs win
    /// whichever object is reconciled first.
    fn check_capacity(&self, name: &str, ip: IpAddr, node: &Node) -> Result<(), String> {
        let info = NodeInfo::from_node(node);
        let EgressState::Present(config) = &info.egress else {
            tracing::debug!(object = name, node = %info.name, "node not annotated; attaching without the subnet and capacity checks");
            return Ok(());
        };
        let platform = self.cloud.needs().platform;
        if let Some(platform) = platform {
            check_address_index(ip, &info.name, &config.ifaddr, platform).map_err(|d| d.message)?;
        }
        if let Some(mismatch) = key_mismatch(platform, &config.capacity) {
            tracing::warn!(
                object = name,
                node = %info.name,
                platform = mismatch.platform.as_str(),
                annotation_keys = mismatch.keys_label(),
                "node annotation {EGRESS_IPCONFIG_ANNOTATION}: {mismatch}"
            );
        }
        let bucket = bucket_for(platform, ip, &config.capacity);
        let objects = self.by_node.objects_on(&self.objects, &info.name);
        let mut me = Claim::newcomer(name);
        let mut others = Vec::new();
        for object in &objects {
            let claim = Claim::of(object, &info.name);
            if claim.name == name {
                me = claim;
            } else if decode_name(claim.name)
                .is_ok_and(|other| bucket_for(platform, other, &config.capacity) == bucket)
            {
                others.push(claim);
            }
        }
        check_claim(ip, &info.name, &config.capacity, bucket, &me, others).map_err(|d| d.message)
    }

    /// Runs steps on `obj` until it is converged or a step fails.
    async fn converge(&self, mut obj: Arc<CloudPrivateIPConfig>) -> Result<(), Error> {
        let name = obj.name_any();
        let ip = match decode_name(&name) {
            Ok(ip) => ip,
            Err(e) => {
                let message =
                    format!("the object name is not an IP this controller can attach: {e}");
                let node = obj.spec.node.clone();
                self.write_status(&obj, &node, AssignedReason::CloudResponseError, &message)
                    .await?;
                return Err(Error::Blocked(message));
            }
        };
        let mut conflicts = 0;
        loop {
            let result = self.step(&name, ip, &obj).await;
            match result {
                Ok(Some(next)) => obj = next,
                Ok(None) => return Ok(()),
                Err(Error::Kube(kube::Error::Api(s))) if s.is_conflict() && conflicts < 5 => {
                    conflicts += 1;
                    obj = match self.with_api_slot(|| self.api.get_opt(&name)).await? {
                        Some(fresh) => Arc::new(fresh),
                        None => return Ok(()),
                    };
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Performs one step; `None` when the object is converged or gone.
    async fn step(
        &self,
        name: &str,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let drifted = lock(&self.drifted).contains(name);
        let condition = obj.assigned_condition().map(|c| c.status.as_str());
        let status_node = obj.status_node().unwrap_or_default().to_owned();
        let recorded = !status_node.is_empty() && self.ledger.instance(ip, &status_node).is_some();
        let state = ObjectState {
            recorded,
            deleting: obj.meta().deletion_timestamp.is_some(),
            has_finalizer: obj.finalizers().iter().any(|f| f == FINALIZER),
            spec_node: &obj.spec.node,
            status_node: &status_node,
            assigned: Assigned::from_status(condition),
            drifted,
            native_move: self.cloud.needs().native_move,
        };
        let next = next_step(&state);
        tracing::debug!(
            object = name,
            resource_version = obj.resource_version().unwrap_or_default(),
            deleting = state.deleting,
            has_finalizer = state.has_finalizer,
            status_node = state.status_node,
            step = ?next,
            "step"
        );
        match next {
            Step::Idle => Ok(None),
            Step::AddFinalizer => Ok(Some(self.ensure_finalizer(obj).await?)),
            // A rare path: boxed so every reconcile does not carry its state.
            Step::Adopt { node } => Box::pin(self.adopt(name, ip, obj, &node)).await,
            Step::ReleaseFinalizer => {
                self.release_finalizer(obj).await?;
                self.forget(name);
                Ok(None)
            }
            Step::Detach { node, then } => self.detach(ip, obj, &node, then).await,
            Step::Attach { node } => self.attach(name, ip, obj, &node).await,
            Step::Move { from, to } => Box::pin(self.move_ip(name, ip, obj, &from, &to)).await,
        }
    }

    /// Moves the IP from `from` to `to` in one provider operation that never leaves it on both.
    ///
    /// The status names `to` (Pending) and the ledger records `to`'s VM before the call, so a
    /// crash mid-move resumes as an attach to `to`, which the provider completes as a move (it
    /// takes the IP off the VM whose reservation it adopts first). Without a VM to move from (the
    /// Node gone with no record, or not yet known) it falls back to detach, then attach.
    async fn move_ip(
        &self,
        name: &str,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        from: &str,
        to: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let source = match self.detach_target(ip, from).await {
            Ok(Ok(source)) => source,
            _ => {
                return self
                    .detach(ip, obj, from, AfterDetach::ClearStatusNode)
                    .await;
            }
        };
        let target = match self.attach_target(name, ip, to).await {
            Ok(target) => target,
            Err(message) => {
                // The IP stays where it is, and the status keeps saying so.
                self.write_status(obj, from, AssignedReason::CloudResponseError, &message)
                    .await?;
                self.event(obj, true, "MoveBlocked", message.clone()).await;
                return Err(Error::Blocked(message));
            }
        };
        let obj = self.ensure_finalizer(obj).await?;
        let message = upstream_first(
            MOVING,
            format_args!("moving {ip} from node {from} to node {to}"),
        );
        let obj = self
            .write_status(&obj, to, AssignedReason::CloudResponsePending, &message)
            .await?;
        if let Err(e) = self.lanes.move_ip(&source, &target, ip).await {
            let message = upstream_first(
                MOVE_FAILED,
                format_args!("moving {ip} from node {from} to node {to} failed: {e}"),
            );
            let reason = AssignedReason::CloudResponseError;
            let Some(obj) = self
                .write_after_attach(&obj, &target, ip, reason, &message)
                .await?
            else {
                return Ok(None);
            };
            self.event(&obj, true, "MoveFailed", message).await;
            return Err(e.into());
        }
        let message = upstream_first(
            MOVED,
            format_args!("{ip} moved from node {from} to node {to}"),
        );
        let reason = AssignedReason::CloudResponseSuccess;
        let Some(obj) = self
            .write_after_attach(&obj, &target, ip, reason, &message)
            .await?
        else {
            return Ok(None);
        };
        self.event(&obj, false, "Moved", message).await;
        Ok(Some(obj))
    }

    async fn detach(
        &self,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
        then: AfterDetach,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let announced = self.lanes.expect(node);
        // A moving IP goes on to its new node once detached: announced there too, so that node's
        // lane keeps rate budget for it and gathers it with the others.
        let spec_node = &obj.spec.node;
        let moving = matches!(then, AfterDetach::ClearStatusNode)
            && !spec_node.is_empty()
            && spec_node != node;
        let _next = moving.then(|| self.lanes.expect(spec_node));
        // Upstream's texts: a detach on the way to another node is part of a move.
        let (pending, done, failed) = if moving {
            (MOVING, MOVING, MOVE_FAILED)
        } else {
            (DELETING, DELETED, DELETE_FAILED)
        };
        let target = match self.detach_target(ip, node).await {
            Ok(Ok(t)) => t,
            Ok(Err(why)) => return self.skip_detach(ip, obj, node, then, why).await,
            Err(e) => {
                let message =
                    upstream_first(failed, format_args!("detaching {ip} from node {node}: {e}"));
                self.write_status(obj, node, AssignedReason::CloudResponseError, &message)
                    .await?;
                return Err(e);
            }
        };
        let message = upstream_first(pending, format_args!("detaching {ip} from node {node}"));
        let obj = self
            .write_status(obj, node, AssignedReason::CloudResponsePending, &message)
            .await?;
        drop(announced);
        if let Err(e) = self.lanes.submit(&target, Mutation::Detach, ip).await {
            let message = upstream_first(
                failed,
                format_args!("detaching {ip} from node {node} failed: {e}"),
            );
            self.write_status(&obj, node, AssignedReason::CloudResponseError, &message)
                .await?;
            self.event(&obj, true, "DetachFailed", message).await;
            return Err(e.into());
        }
        let message = upstream_first(done, format_args!("{ip} detached from node {node}"));
        self.event(&obj, false, "Detached", message.clone()).await;
        self.after_detach(&obj, then, &message).await
    }

    /// Completes a detach from a node where nothing is attached (`why` says how that is known):
    /// no cloud call, an Event saying why, then what follows a detach.
    async fn skip_detach(
        &self,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
        then: AfterDetach,
        why: String,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        tracing::info!(object = %obj.name_any(), %node, reason = %why, "nothing to detach");
        self.event(obj, true, "DetachSkipped", why).await;
        let message = upstream_first(
            DELETED,
            format_args!("{ip} was not attached to node {node}: nothing to detach"),
        );
        self.after_detach(obj, then, &message).await
    }

    /// Records in the ledger an IP assigned to `node` without a record, once the node's current
    /// VM shows it on its interface (the cached view: one read per VM at most, never one per
    /// IP). The lane records it with the other IPs of the VM in one ledger write and, the view
    /// already showing the IP, makes no call. An IP the view does not show is attached again,
    /// as a drift check would have it.
    async fn adopt(
        &self,
        name: &str,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let cached = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node));
        let provider_id = cached
            .as_ref()
            .and_then(|n| n.spec.as_ref()?.provider_id.clone())
            .unwrap_or_default();
        if provider_id.is_empty() {
            let message = format!(
                "cannot adopt {ip}: node {node} is gone or has no providerID, so its VM is \
                 unknown; the IP is not recorded in the attachment ledger"
            );
            self.event(obj, true, "AdoptionBlocked", message.clone())
                .await;
            return Err(Error::Blocked(message));
        }
        let target = crate::controller::nodes::resolve(
            self.cloud.as_ref(),
            node,
            cached.as_deref(),
            &provider_id,
        )
        .await?;
        if !self.interfaces.get_or_read(&target).await?.holds(ip) {
            // Upstream may have put it on another interface of the same VM (the VM is the
            // Node's, so this stays within nodes' VMs): off there first, or the re-attach to the
            // primary would leave it on two interfaces.
            if self
                .cloud
                .release_from_other_interfaces(&target, ip)
                .await?
            {
                let note = format!(
                    "{ip} was found on a secondary interface of node {node}'s VM {} and \
                     unassigned there; attaching it to the primary interface",
                    target.instance
                );
                self.event(obj, true, "MovedToPrimaryInterface", note).await;
            }
            tracing::warn!(object = name, %node, "assigned without a ledger record and missing from the node's primary interface; attaching again");
            lock(&self.drifted).insert(name.to_owned());
            return Ok(Some(Arc::clone(obj)));
        }
        self.lanes.submit(&target, Mutation::Attach, ip).await?;
        tracing::info!(object = name, %node, instance = %target.instance, "adopted: recorded in the attachment ledger");
        let note = format!(
            "{ip} was assigned to node {node} without a record (by another controller, or \
             before the ledger existed): recorded in the attachment ledger on VM {}",
            target.instance
        );
        self.event(obj, false, "Adopted", note).await;
        Ok(Some(Arc::clone(obj)))
    }

    /// What follows a detach: the finalizer goes, or `status.node` is cleared with `message`.
    async fn after_detach(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
        then: AfterDetach,
        message: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        match then {
            AfterDetach::ReleaseFinalizer => {
                self.release_finalizer(obj).await?;
                self.forget(&obj.name_any());
                Ok(None)
            }
            AfterDetach::ClearStatusNode => {
                let obj = self
                    .write_status(obj, "", AssignedReason::CloudResponseSuccess, message)
                    .await?;
                Ok(Some(obj))
            }
        }
    }

    /// Attaches the IP to `node`; `None` when the object vanished meanwhile (its IP is then
    /// detached again, see [`Self::release_orphan`]).
    async fn attach(
        &self,
        name: &str,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let announced = self.lanes.expect(node);
        let target = match self.attach_target(name, ip, node).await {
            Ok(target) => target,
            Err(message) => {
                self.write_status(obj, node, AssignedReason::CloudResponseError, &message)
                    .await?;
                self.event(obj, true, "AttachBlocked", message.clone())
                    .await;
                return Err(Error::Blocked(message));
            }
        };
        let obj = self.ensure_finalizer(obj).await?;
        // The second half of a move made as detach, then attach: the detach left upstream's
        // move text in the condition (or a failed attach retried), and the move's texts go on
        // to its end.
        let moving = obj
            .assigned_condition()
            .is_some_and(|c| c.message.starts_with(MOVING) || c.message.starts_with(MOVE_FAILED));
        let (pending, done, failed) = if moving {
            (MOVING, MOVED, MOVE_FAILED)
        } else {
            (ADDING, ADDED, ADD_FAILED)
        };
        let message = upstream_first(pending, format_args!("attaching {ip} to node {node}"));
        let obj = self
            .write_status(&obj, node, AssignedReason::CloudResponsePending, &message)
            .await?;
        drop(announced);
        if let Err(e) = self.lanes.submit(&target, Mutation::Attach, ip).await {
            let message = upstream_first(
                failed,
                format_args!("attaching {ip} to node {node} failed: {e}"),
            );
            // A failed call may still have attached the IP (a timeout, say).
            let reason = AssignedReason::CloudResponseError;
            let Some(obj) = self
                .write_after_attach(&obj, &target, ip, reason, &message)
                .await?
            else {
                return Ok(None);
            };
            self.event(&obj, true, "AttachFailed", message).await;
            return Err(e.into());
        }
        if lock(&self.drifted).remove(name) {
            self.metrics.drift_repaired.inc();
            self.event(
                &obj,
                true,
                "DriftRepaired",
                format!("{ip} was missing from node {node} and was attached again"),
            )
            .await;
        }
        let message = upstream_first(done, format_args!("{ip} attached to node {node}"));
        let reason = AssignedReason::CloudResponseSuccess;
        let Some(obj) = self
            .write_after_attach(&obj, &target, ip, reason, &message)
            .await?
        else {
            return Ok(None);
        };
        self.event(&obj, false, "Attached", message).await;
        Ok(Some(obj))
    }

    /// Writes the outcome of an attach call; `None` when the object has vanished meanwhile, in
    /// which case the IP has been detached again.
    async fn write_after_attach(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
        target: &NodeTarget,
        ip: IpAddr,
        reason: AssignedReason,
        message: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        match self
            .write_status(obj, &target.node_name, reason, message)
            .await
        {
            Ok(written) => Ok(Some(written)),
            Err(e) if is_gone(&e) => {
                // A rare path: boxed so every attach does not carry its state.
                Box::pin(self.release_orphan(obj, target, ip)).await;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Detaches the IP of an object that vanished while its IP was being attached.
    ///
    /// kube-apiserver can complete a delete that raced with the write adding our finalizer
    /// (kubernetes/kubernetes#77988): both succeed and the object is gone at once, so the
    /// finalizer never brings the object back to us. Nothing claims the IP any more; it is
    /// detached here, with retries, because no later reconcile will see the object. (Should an
    /// object of the same name be created meanwhile, its own reconcile attaches the IP again and
    /// the drift check repairs any overlap.)
    async fn release_orphan(&self, obj: &CloudPrivateIPConfig, target: &NodeTarget, ip: IpAddr) {
        let name = obj.name_any();
        let node = &target.node_name;
        tracing::warn!(object = %name, %node, %ip, "object deleted while its IP was being attached; detaching the IP");
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(self.config.backoff_base)
            .with_max_delay(self.config.backoff_cap)
            .with_max_times(ORPHAN_DETACH_RETRIES)
            .with_jitter()
            .build();
        let outcome = loop {
            match self.lanes.submit(target, Mutation::Detach, ip).await {
                Ok(()) => break Ok(()),
                Err(e) => match delays.next() {
                    Some(delay) => {
                        tracing::warn!(object = %name, %node, %ip, error = %e, retry_in = ?delay, "detaching the IP of a deleted object failed");
                        tokio::time::sleep(delay).await;
                    }
                    None => break Err(e),
                },
            }
        };
        self.forget(&name);
        match outcome {
            Ok(()) => {
                let note = format!(
                    "{ip} detached from node {node}: the object was deleted while the IP was being attached"
                );
                self.event(obj, true, "OrphanDetached", note).await;
            }
            Err(e) => {
                let note = format!(
                    "{ip} is still attached to node {node} and no object claims it: detaching it failed: {e}; remove it by hand"
                );
                tracing::error!(object = %name, %node, %ip, error = %e, "giving up detaching the IP of a deleted object");
                self.event(obj, true, "OrphanDetachFailed", note).await;
            }
        }
    }

    /// The VM for `node`, after checking the node exists and the IP fits it (subnet, reserved
    /// index, capacity); the error is the condition message.
    async fn attach_target(
        &self,
        name: &str,
        ip: IpAddr,
        node: &str,
    ) -> Result<NodeTarget, String> {
        let Some(n) = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node))
        else {
            return Err(format!(
                "cannot attach {ip}: node {node} does not exist; will retry when it appears"
            ));
        };
        self.check_capacity(name, ip, &n)?;
        let provider_id = n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        crate::controller::nodes::resolve(self.cloud.as_ref(), node, Some(&n), &provider_id)
            .await
            .map_err(|e| format!("cannot attach {ip} to node {node}: {e}"))
    }
}

/// Whether a write failed because the object no longer exists.
fn is_gone(error: &Error) -> bool {
    matches!(error, Error::Kube(kube::Error::Api(s)) if s.is_not_found())
}

/// The controller's reconcile function.
pub async fn reconcile(obj: Arc<CloudPrivateIPConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Before the node cache's first list, every node looks missing: an object reconciled then
    // would be marked failed for a node that exists. Wait briefly (bounded, as the node
    // controller does), else come back.
    match tokio::time::timeout(CACHE_WAIT, ctx.nodes.wait_until_ready()).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return Err(Error::CacheClosed),
        Err(_) => return Ok(Action::requeue(CACHE_WAIT)),
    }
    let started = Instant::now();
    let obj = ctx.freshest(obj);
    let span =
        tracing::info_span!("reconcile", object = %obj.name_any(), spec_node = %obj.spec.node);
    let result = tracing::Instrument::instrument(ctx.converge(obj.clone()), span).await;
    let outcome = if result.is_ok() { "success" } else { "error" };
    ctx.metrics
        .reconcile_seconds
        .get_or_create(&OutcomeLabels {
            outcome: outcome.to_owned(),
        })
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .queue_depth
        .set(i64::try_from(ctx.lanes.queued()).unwrap_or(i64::MAX));
    result?;
    ctx.retries.reset(&obj.name_any());
    Ok(Action::await_change())
}

/// Retries a failed object with per-object exponential backoff, capped, never giving up.
pub fn error_policy(obj: Arc<CloudPrivateIPConfig>, error: &Error, ctx: Arc<Context>) -> Action {
    let floor = match error {
        Error::Cloud(e) if e.kind == ErrorKind::Permanent => PERMANENT_RETRY_FLOOR,
        _ => Duration::ZERO,
    };
    let delay = ctx.retries.next_delay_from(&obj.name_any(), floor);
    tracing::warn!(object = %obj.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
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

    /// The size of the future a function returns, without calling it.
    fn future_size<A, B, F, Fut>(_: F) -> usize
    where
        F: Fn(A, B) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    #[test]
    fn a_waiting_reconcile_stays_small() {
        // Up to `--concurrent-reconciles` (1024) reconciles wait at once, and each holds a future
        // as large as its largest await: with kube's request futures inline it was 5.6 KB.
        let size = future_size(reconcile);
        assert!(size <= 2048, "a reconcile future takes {size} bytes");
    }
}
