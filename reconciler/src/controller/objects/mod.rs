//! The `CloudPrivateIPConfig` controller: reads an object, asks [`crate::controller::plan`] for
//! the next step, performs it (status write, metadata write or a cloud call through the node's
//! lane), and repeats until the object is converged or a step fails. A step that hands an IP to
//! its lane ends the reconcile; the lane's answer ([`parked`]) reconciles the object again, and
//! that reconcile writes what the call came to. Each transition has its file: [`attach`] (add),
//! [`detach`] (delete), [`native_move`] (move), [`adopt`], and [`writes`] (the status, finalizer
//! and Event writes they share).

mod adopt;
mod attach;
mod detach;
mod native_move;
mod parked;
mod writes;

pub(crate) use parked::{Orphan, Parked};

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cloudnet_shared::{AssignedReason, CloudPrivateIPConfig, FINALIZER, decode_name};
use futures::StreamExt;
use futures::channel::mpsc;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use thiserror::Error;
use tokio::sync::Semaphore;

use crate::cloud::{CloudError, CloudProvider, ErrorKind};
use crate::controller::cached_node::CachedNode;
use crate::controller::nodes::{self, CACHE_WAIT};
use crate::controller::plan::{Assigned, ObjectState, Step, next_step};
use crate::controller::retries::Retries;
use crate::engine::interfaces::Interfaces;
use crate::engine::lanes::{Announced, Lanes};
use crate::engine::ledger::Ledger;
use crate::events::Events;
use crate::index::{NodeIndex, Written};
use crate::metrics::{Metrics, OutcomeLabels};
use parked::{Call, Taken};

/// The shortest retry after the cloud refused a change as such (an address in use elsewhere, no
/// room): retrying soon would only spend the account's request budget (capped by the backoff cap).
pub(crate) const PERMANENT_RETRY_FLOOR: Duration = Duration::from_secs(30);

/// Why a reconcile stopped short; the object is retried with backoff.
#[derive(Debug, Error)]
pub(crate) enum Error {
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
    /// The leadership fence the ledger's writes pass (`None`: always open).
    pub fence: Option<crate::engine::fence::Fence>,
    /// How long a leader may take to load the attachment ledger before it gives up its term.
    pub ledger_deadline: Duration,
    /// How old a read of an interface may be and still count as the interface as it is now, on
    /// a cloud with no etag ([`crate::cloud::READ_LATELY`]).
    pub read_lately: Duration,
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
            fence: None,
            ledger_deadline: Duration::from_secs(60),
            read_lately: crate::cloud::READ_LATELY,
        }
    }
}

/// Everything a reconcile needs.
pub(crate) struct Context {
    /// The objects' API.
    pub(crate) api: Api<CloudPrivateIPConfig>,
    /// The cloud.
    pub(crate) cloud: Arc<dyn CloudProvider>,
    /// Per-node batching of cloud calls.
    pub(crate) lanes: Arc<Lanes>,
    /// Node cache.
    pub(crate) nodes: Store<CachedNode>,
    /// Object cache.
    pub(crate) objects: Store<CloudPrivateIPConfig>,
    /// The object cache's objects by node.
    pub(crate) by_node: Arc<NodeIndex>,
    /// Where each IP may be attached, as recorded before every attach call.
    pub(crate) ledger: Arc<Ledger>,
    /// The cached view of each VM's interface.
    pub(crate) interfaces: Arc<Interfaces>,
    /// Publishes Kubernetes Events.
    pub(crate) events: Events,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Tunables.
    pub(crate) config: EngineConfig,
    /// Objects a drift check found missing from their node.
    pub(crate) drifted: Mutex<HashSet<String>>,
    /// The newest version of each object we wrote, for as long as the cache lags behind it.
    written: Arc<Written>,
    /// Failures per object, for its backoff.
    pub(crate) retries: Retries,
    /// The objects whose IP waits in a lane after their reconcile ended, and the answers.
    pub(crate) parked: Arc<Parked>,
    /// See [`EngineConfig::api_requests`].
    api_slots: Semaphore,
}

impl Context {
    /// A context over the given pieces.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        api: Api<CloudPrivateIPConfig>,
        cloud: Arc<dyn CloudProvider>,
        lanes: Arc<Lanes>,
        nodes: Store<CachedNode>,
        objects: Store<CloudPrivateIPConfig>,
        by_node: Arc<NodeIndex>,
        ledger: Arc<Ledger>,
        interfaces: Arc<Interfaces>,
        written: Arc<Written>,
        parked: Arc<Parked>,
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
            parked,
            api_slots,
        }
    }

    /// The newer of the cached object and the last one we wrote: the cache may lag our writes,
    /// and acting on a stale status would repeat a cloud call.
    pub(crate) fn freshest(&self, cached: Arc<CloudPrivateIPConfig>) -> Arc<CloudPrivateIPConfig> {
        self.written.freshest(cached)
    }

    /// Forgets the interface views of VMs whose Node is gone and that nothing refers to any
    /// more (see [`nodes::forget_views_of_gone_nodes`]).
    pub(crate) fn forget_gone_vms(&self) {
        let named = |node: &str| !self.by_node.objects_on(&self.objects, node).is_empty();
        nodes::forget_views_of_gone_nodes(&self.interfaces, &self.nodes, &self.ledger, named);
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
        // A move's attach half, announced to its node while the detach half was under way.
        let mut next_half = None;
        loop {
            let result = self.step(&name, ip, &obj, &mut next_half).await;
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
        next_half: &mut Option<Announced>,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        match self.parked.take(name) {
            Taken::Nothing => {}
            // Its answer reconciles the object again.
            Taken::Waiting => return Ok(None),
            Taken::Landed(call, answer) => {
                return match call {
                    Call::Attach { target, moving } => {
                        self.finish_attach(name, ip, obj, (target, moving), answer)
                            .await
                    }
                    Call::Detach { node, then, next } => {
                        let call = (node.as_str(), then, next);
                        self.finish_detach(ip, obj, call, answer, next_half).await
                    }
                };
            }
        }
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
            Step::Attach { node } => self.attach(name, ip, obj, &node, next_half.take()).await,
            Step::Move { from, to } => Box::pin(self.move_ip(name, ip, obj, &from, &to)).await,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The controller's reconcile function.
pub(crate) async fn reconcile(
    obj: Arc<CloudPrivateIPConfig>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
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
    // An object whose IP waits in its lane has not converged: its backoff goes on.
    if !ctx.parked.holds(&obj.name_any()) {
        ctx.retries.reset(&obj.name_any());
    }
    Ok(Action::await_change())
}

/// Detaches again the IPs attached for objects deleted while their IP waited in its lane
/// ([`Parked::deleted`]), as a waiting reconcile would have once its write found no object.
pub(crate) async fn release_orphans(ctx: Arc<Context>, orphans: mpsc::UnboundedReceiver<Orphan>) {
    orphans
        .for_each_concurrent(None, |orphan| {
            let ctx = Arc::clone(&ctx);
            async move {
                let Ok(ip) = decode_name(&orphan.object.name_any()) else {
                    return;
                };
                ctx.release_orphan(&orphan.object, &orphan.target, ip).await;
            }
        })
        .await;
}

impl Context {
    /// Once no reconcile starts any more (a shutdown): waits for the answers of the IPs still in
    /// their lanes and writes what each came to, as their reconciles would have.
    pub(crate) async fn drain_parked(&self) {
        while !self.parked.is_empty() {
            self.parked.all_answered().await;
            for name in self.parked.answered() {
                let Some(cached) = self.objects.get(&ObjectRef::new(&name)) else {
                    // Deleted meanwhile and not shown yet: the orphan sweep has its record.
                    let _ = self.parked.take(&name);
                    continue;
                };
                let obj = self.freshest(cached);
                let Ok(ip) = decode_name(&name) else {
                    let _ = self.parked.take(&name);
                    continue;
                };
                if let Err(e) = self.step(&name, ip, &obj, &mut None).await {
                    tracing::warn!(object = %name, error = %e, "writing the outcome of a cloud call while shutting down failed");
                }
            }
        }
    }
}

/// Retries a failed object with per-object exponential backoff, capped, never giving up.
pub(crate) fn error_policy(
    obj: Arc<CloudPrivateIPConfig>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let floor = match error {
        Error::Cloud(e) if matches!(e.kind, ErrorKind::Permanent | ErrorKind::Foreign) => {
            PERMANENT_RETRY_FLOOR
        }
        _ => Duration::ZERO,
    };
    let delay = ctx.retries.next_delay_from(&obj.name_any(), floor);
    tracing::warn!(object = %obj.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future a function returns, without calling it.
    fn future_size<A, B, F, Fut>(_: F) -> usize
    where
        F: Fn(A, B) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    #[test]
    fn a_waiting_reconcile_stays_small() {
        // Up to `--concurrent-reconciles` reconciles wait for an API slot at once, and each holds
        // a future as large as its largest await: with kube's request futures inline it was
        // 5.6 KB.
        let size = future_size(reconcile);
        assert!(size <= 2048, "a reconcile future takes {size} bytes");
    }
}
