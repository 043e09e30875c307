//! Per-node batching: one lane per VM, at most one mutating cloud call per lane at a time, and
//! everything that arrives for the VM while a call is in flight goes out together in the next one.
//!
//! Object reconcilers call [`Lanes::submit`] for one IP and await its own result; they never see
//! the batching. A lane with work keeps gathering while IPs for its VM keep arriving (a quiet gap
//! ends it, a bound on the oldest IP's wait caps it; an IP announced to the node is waited for,
//! and its quiet gap counts from its announcement), then waits for the provider's rate budget,
//! gathering still, and sends additions and removals together in one change; IPs that arrive
//! during a call wait for the next one. While IPs keep arriving for any VM, a call leaves a token
//! of the rate budget for every other node that received (or was announced) an IP lately: a burst
//! of objects over more VMs than the budget holds then ends in one call per VM at once, instead
//! of the budget going to the first IPs of each VM and the last calls queueing at the refill
//! rate. The burst is over once every IP announced to the lanes (an object whose writes before
//! the call are under way) has reached its lane and a quiet gap has passed. Different VMs
//! proceed in parallel up to a bound, so one slow VM does not hold up the others and a burst
//! cannot open thousands of connections to the cloud.
//!
//! A change that fails as a whole for a reason that may be one IP's fault (a permanent error, a
//! vanished VM) is split in halves and retried, down to the IP to blame, so the others still go
//! through and each IP gets its own error; providers report call-level errors only.
//!
//! Each answer updates the engine's view of the VM's interface ([`Interfaces`]), and a failure
//! drops it, so the next call or annotation reads the cloud again.
//!
//! The attachment ledger ([`Ledger`]) stays ahead of the cloud: a batch's additions are recorded
//! on the VM's page before its call (one write for the batch), and its removals are taken off
//! once the call (or the cached view) confirms them. An IP whose record cannot be written is not
//! sent; a removal whose record cannot be taken off fails, so its object retries it.
//!
//! A lane survives its provider: a call that panics or outlives the per-call deadline fails the
//! IPs of its batch with a retryable error, and the lane goes on with what is queued. Should the
//! lane's task itself end early (a bug, or [`Lanes::abort_all`]), its queued IPs fail too and the
//! next submit for the VM starts a fresh lane.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{Notify, Semaphore, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::cloud::{
    Change, CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget, Spend,
};
use crate::engine::interfaces::Interfaces;
use crate::engine::ledger::Ledger;
use crate::metrics::Metrics;

/// The longest a lane waits for one cloud call unless told otherwise ([`Lanes::with_call_deadline`]).
pub(crate) const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(120);

/// A mutation of one IP on one VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Put the IP on the VM.
    Attach,
    /// Take the IP off the VM.
    Detach,
}

impl Mutation {
    /// Bounded label value for metrics.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Attach => "attach",
            Self::Detach => "detach",
        }
    }
}

/// How long an idle lane gathers IPs before its first call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gather {
    /// Gathering ends once no IP has arrived for this long (zero: call at once).
    pub quiet: Duration,
    /// ... or once this long has passed since the first IP arrived, whatever keeps arriving.
    pub max: Duration,
}

#[cfg(test)]
impl Gather {
    /// No gathering: the first IP goes out at once.
    pub(crate) const NONE: Self = Self {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
    };
}

struct Job {
    mutation: Mutation,
    ip: IpAddr,
    arrived: Instant,
    reply: oneshot::Sender<Result<(), CloudError>>,
}

struct Lane {
    /// Which drain task owns the lane: a task cleaning up after itself must not remove a
    /// successor's lane.
    id: u64,
    target: NodeTarget,
    pending: VecDeque<Job>,
    /// When the latest IP was noticed, for the quiet gap that ends gathering.
    last_notice: Instant,
    /// Woken when the last IP announced to the node has arrived or will not come.
    wake: Arc<Notify>,
}

/// Takes the next batch from `pending`: the oldest jobs up to `max`, additions and removals
/// alike; a second job for an IP already in the batch waits for the next one, so one IP's
/// detach and re-attach keep their order.
fn take_batch<T>(pending: &mut VecDeque<T>, max: usize, ip_of: impl Fn(&T) -> IpAddr) -> Vec<T> {
    let mut batch: Vec<T> = Vec::new();
    let mut rest = VecDeque::with_capacity(pending.len());
    while let Some(job) = pending.pop_front() {
        let ip = ip_of(&job);
        let duplicate = batch.iter().any(|b| ip_of(b) == ip);
        if batch.len() < max.max(1) && !duplicate {
            batch.push(job);
        } else {
            rest.push_back(job);
        }
    }
    *pending = rest;
    batch
}

/// The change a batch asks for.
fn change_of(batch: &[Job]) -> Change {
    let mut change = Change::default();
    for job in batch {
        match job.mutation {
            Mutation::Attach => change.add.push(job.ip),
            Mutation::Detach => change.remove.push(job.ip),
        }
    }
    change
}

/// Whether `view` already shows `change` made.
fn in_effect(view: &NodeEgress, change: &Change) -> bool {
    change.add.iter().all(|ip| view.holds(*ip)) && change.remove.iter().all(|ip| !view.holds(*ip))
}

/// Whether a failed change of several IPs may be one IP's fault, and is worth splitting.
fn worth_splitting(error: &CloudError) -> bool {
    matches!(error.kind, ErrorKind::Permanent | ErrorKind::NotFound)
}

/// When IPs arrived (or were announced): the latest, and the latest for each node.
struct Arrivals {
    latest: Instant,
    by_node: HashMap<String, Instant>,
}

impl Default for Arrivals {
    fn default() -> Self {
        Self {
            latest: Instant::now(),
            by_node: HashMap::new(),
        }
    }
}

impl Arrivals {
    fn note(&mut self, node: &str, at: Instant) {
        self.latest = at;
        match self.by_node.get_mut(node) {
            Some(last) => *last = at,
            None => {
                self.by_node.insert(node.to_owned(), at);
            }
        }
    }

    /// How many nodes besides the caller's received an IP within `window`; forgets the others.
    fn other_nodes_within(&mut self, window: Duration) -> usize {
        let now = Instant::now();
        let since = now.checked_sub(window).unwrap_or(now);
        self.by_node.retain(|_, at| *at >= since);
        self.by_node.len().saturating_sub(1)
    }
}

/// IPs announced to one node and on their way.
#[derive(Clone, Copy, Debug, Default)]
struct Expected {
    /// Submitted once their object's writes are done.
    ready: usize,
    /// Attach halves of moves whose detach from another VM is not answered yet.
    later: usize,
}

/// The lanes of every VM with work in progress.
pub struct Lanes {
    cloud: Arc<dyn CloudProvider>,
    metrics: Arc<Metrics>,
    interfaces: Arc<Interfaces>,
    ledger: Arc<Ledger>,
    lanes: Mutex<HashMap<InstanceId, Lane>>,
    parallel: Arc<Semaphore>,
    /// Held by the lane whose turn it is to wait for the rate budget.
    budget_turn: tokio::sync::Mutex<()>,
    /// When IPs last arrived, per node: while they keep arriving, a call leaves rate budget for
    /// the other nodes that are receiving them.
    arrivals: Mutex<Arrivals>,
    /// IPs announced ([`Lanes::expect`]) that have not reached their lane yet.
    announced: AtomicUsize,
    /// Those IPs by node.
    expected: Mutex<HashMap<String, Expected>>,
    /// Woken when the last announced IP has reached its lane.
    all_arrived: Notify,
    gather: Gather,
    call_deadline: Duration,
    next_id: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Lanes {
    /// Lanes over `cloud`, with at most `parallel_nodes` cloud calls in flight at once, keeping
    /// `interfaces` up to date with every answer and `ledger` ahead of every call. An idle lane
    /// that receives work gathers as `gather` says before its first call.
    pub fn new(
        cloud: Arc<dyn CloudProvider>,
        metrics: Arc<Metrics>,
        interfaces: Arc<Interfaces>,
        ledger: Arc<Ledger>,
        parallel_nodes: usize,
        gather: Gather,
    ) -> Self {
        Self {
            cloud,
            metrics,
            interfaces,
            ledger,
            lanes: Mutex::new(HashMap::new()),
            parallel: Arc::new(Semaphore::new(parallel_nodes.max(1))),
            budget_turn: tokio::sync::Mutex::new(()),
            arrivals: Mutex::new(Arrivals::default()),
            announced: AtomicUsize::new(0),
            expected: Mutex::new(HashMap::new()),
            all_arrived: Notify::new(),
            gather,
            call_deadline: DEFAULT_CALL_DEADLINE,
            next_id: AtomicU64::new(0),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// Gives up on a cloud call after `deadline`: its IPs fail with a retryable error and the
    /// lane moves on. The provider's own retries all count against it.
    #[must_use]
    pub(crate) fn with_call_deadline(mut self, deadline: Duration) -> Self {
        self.call_deadline = deadline;
        self
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<InstanceId, Lane>> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn arrivals(&self) -> MutexGuard<'_, Arrivals> {
        self.arrivals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn expected(&self) -> MutexGuard<'_, HashMap<String, Expected>> {
        self.expected.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The IPs announced to `node` that are on their way.
    fn expected_for(&self, node: &str) -> Expected {
        self.expected().get(node).copied().unwrap_or_default()
    }

    /// Counts an IP announced to `node`: `ready` to be submitted, or `later`.
    fn expect_on(&self, node: &str, ready: bool) {
        let mut expected = self.expected();
        let counts = expected.entry(node.to_owned()).or_default();
        if ready {
            counts.ready += 1;
        } else {
            counts.later += 1;
        }
    }

    /// Uncounts an IP announced to `node` (it arrived, will not come, or is now ready); once
    /// none of its kind is left, wakes the node's gathering lanes.
    fn arrived_on(&self, node: &str, ready: bool) {
        let none_left = {
            let mut expected = self.expected();
            let Some(counts) = expected.get_mut(node) else {
                return;
            };
            let count = if ready {
                &mut counts.ready
            } else {
                &mut counts.later
            };
            *count = count.saturating_sub(1);
            let none_left = *count == 0;
            if counts.ready == 0 && counts.later == 0 {
                expected.remove(node);
            }
            none_left
        };
        if none_left {
            for lane in self.lanes().values() {
                if lane.target.node_name == node {
                    lane.wake.notify_one();
                }
            }
        }
    }

    /// How many IPs wait for a cloud call, over all VMs.
    pub(crate) fn queued(&self) -> usize {
        self.lanes().values().map(|l| l.pending.len()).sum()
    }

    /// Announces an IP for `node` that will be submitted once its object's writes are done: the
    /// rate budget is kept for it as for one already waiting, a burst is not over while it is
    /// on its way, and the node's lane gathers until it arrives (within the longest gathering
    /// time) and counts its quiet gap from now. Submit it with [`Lanes::submit_announced`]
    /// (dropping the announcement says it will not come).
    pub(crate) fn expect(self: &Arc<Self>, node: &str) -> Announced {
        self.announce(node, true)
    }

    /// Announces an IP for `node` that must first wait for a call on another VM (the attach
    /// half of a move, while its detach is under way) until [`Announced::ready`]: it holds rate
    /// budget and keeps the burst going as [`Lanes::expect`] does, but a lane with removals of
    /// its own to send does not wait for it, so lanes never wait for each other's IPs in a
    /// circle (moves in opposite directions).
    pub(crate) fn expect_later(self: &Arc<Self>, node: &str) -> Announced {
        self.announce(node, false)
    }

    fn announce(self: &Arc<Self>, node: &str, ready: bool) -> Announced {
        let at = Instant::now();
        self.arrivals().note(node, at);
        self.announced.fetch_add(1, Ordering::AcqRel);
        self.expect_on(node, ready);
        Announced {
            lanes: Arc::clone(self),
            node: node.into(),
            at,
            ready,
        }
    }

    /// Submits the IP `announced` said was coming: as [`Lanes::submit`], with its quiet gap
    /// counted from the announcement.
    pub(crate) async fn submit_announced(
        self: &Arc<Self>,
        announced: Announced,
        target: &NodeTarget,
        mutation: Mutation,
        ip: IpAddr,
    ) -> Result<(), CloudError> {
        let noticed = announced.at;
        let result = self.enqueue(target, mutation, ip, noticed);
        // In its lane now: the lane need no longer wait for it.
        drop(announced);
        result.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// Applies `mutation` of `ip` on `target`, batched with whatever else is queued for the VM.
    pub async fn submit(
        self: &Arc<Self>,
        target: &NodeTarget,
        mutation: Mutation,
        ip: IpAddr,
    ) -> Result<(), CloudError> {
        let result = self.enqueue(target, mutation, ip, Instant::now());
        result.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// Queues `mutation` of `ip` in `target`'s lane, starting the lane if it is idle; the
    /// receiver gets the IP's result.
    fn enqueue(
        self: &Arc<Self>,
        target: &NodeTarget,
        mutation: Mutation,
        ip: IpAddr,
        noticed: Instant,
    ) -> oneshot::Receiver<Result<(), CloudError>> {
        let (reply, result) = oneshot::channel();
        let now = Instant::now();
        self.arrivals().note(&target.node_name, now);
        let job = Job {
            mutation,
            ip,
            arrived: now,
            reply,
        };
        let start_lane = {
            let mut lanes = self.lanes();
            match lanes.get_mut(&target.instance) {
                Some(lane) => {
                    lane.pending.push_back(job);
                    lane.last_notice = lane.last_notice.max(noticed);
                    None
                }
                None => {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    lanes.insert(
                        target.instance.clone(),
                        Lane {
                            id,
                            target: target.clone(),
                            pending: VecDeque::from([job]),
                            last_notice: noticed,
                            wake: Arc::new(Notify::new()),
                        },
                    );
                    Some(id)
                }
            }
        };
        if let Some(id) = start_lane {
            let guard = LaneGuard {
                lanes: Arc::clone(self),
                instance: target.instance.clone(),
                id,
                finished: false,
            };
            let task = tokio::spawn(guard.drain());
            let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
            tasks.retain(|t| !t.is_finished());
            tasks.push(task.abort_handle());
        }
        result
    }

    /// Waits while IPs keep arriving for the lane, within the gathering bounds: until none is
    /// on its way to its node (an IP announced for later only counts while the lane has no
    /// removal to send) and none has been noticed for the quiet gap, the oldest waiting IP has
    /// waited the longest gathering time, or a full batch is waiting.
    async fn gather(&self, instance: &InstanceId, id: u64) {
        let max_batch = self.cloud.needs().max_batch;
        loop {
            let (node, removing, cap, quiet_end, wake) = {
                let lanes = self.lanes();
                let Some(lane) = lanes.get(instance).filter(|l| l.id == id) else {
                    return;
                };
                let Some(oldest) = lane.pending.front().map(|j| j.arrived) else {
                    return;
                };
                if lane.pending.len() >= max_batch {
                    return;
                }
                (
                    lane.target.node_name.clone(),
                    lane.pending.iter().any(|j| j.mutation == Mutation::Detach),
                    oldest + self.gather.max,
                    lane.last_notice + self.gather.quiet,
                    Arc::clone(&lane.wake),
                )
            };
            // An announced IP is on its way: worth waiting for, up to the cap. (A wake-up sent
            // after this read is kept by the `Notify` for the wait below.)
            let expected = self.expected_for(&node);
            let until = if expected.ready > 0 || (expected.later > 0 && !removing) {
                cap
            } else {
                quiet_end.min(cap)
            };
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = wake.notified() => {}
            }
        }
    }

    /// Drains one VM's lane until it is empty; `true` once the lane is removed.
    async fn drain(self: &Arc<Self>, instance: &InstanceId, id: u64) -> bool {
        let needs = self.cloud.needs();
        loop {
            self.gather(instance, id).await;
            // Lanes take turns at the rate budget (the gate is fair), so that each token that
            // refills releases one lane, not every waiting lane into a race that all but one
            // lose with their batches already taken. IPs arriving while the lane waits for its
            // turn and the budget join this batch.
            let turn = self.budget_turn.lock().await;
            self.write_budget().await;
            let Ok(permit) = Arc::clone(&self.parallel).acquire_owned().await else {
                return false;
            };
            let (target, batch) = {
                let mut lanes = self.lanes();
                let Some(lane) = lanes.get_mut(instance) else {
                    return true;
                };
                if lane.id != id {
                    return true;
                }
                if lane.pending.is_empty() {
                    lanes.remove(instance);
                    return true;
                }
                let batch = take_batch(&mut lane.pending, needs.max_batch, |j| j.ip);
                (lane.target.clone(), batch)
            };
            let mut run = std::pin::pin!(self.run(needs.name, &target, batch));
            // The turn ends once the call has started, and with it taken its token.
            let started = futures::poll!(run.as_mut());
            drop(turn);
            if started.is_pending() {
                run.await;
            }
            drop(permit);
        }
    }

    /// Waits for the provider's rate budget. While IPs keep arriving, a call leaves a token for
    /// every other node that received or expects one within the longest gathering time, so that
    /// when they stop each can make its last call at once; once they stop, any token will do.
    /// They have stopped when none has arrived for the longest gathering time, or, once every
    /// announced IP has reached its lane, for the quiet gap: the end of a burst then costs no
    /// more waiting than an idle lane's gathering does.
    async fn write_budget(&self) {
        let window = self.gather.max;
        loop {
            let all_arrived = self.all_arrived.notified();
            let mut all_arrived = std::pin::pin!(all_arrived);
            // Registered before the count is read, so a last arrival in between still wakes it.
            all_arrived.as_mut().enable();
            let gap = if self.announced.load(Ordering::Acquire) == 0 {
                self.gather.quiet
            } else {
                window
            };
            let (others, stopped_at) = {
                let mut arrivals = self.arrivals();
                (arrivals.other_nodes_within(window), arrivals.latest + gap)
            };
            if Instant::now() >= stopped_at {
                return self.cloud.write_budget(Spend::ANY).await;
            }
            tokio::select! {
                () = self.cloud.write_budget(Spend { others }) => {
                    // Nodes that received IPs meanwhile need their tokens too.
                    if self.arrivals().other_nodes_within(window) <= others {
                        return;
                    }
                }
                () = tokio::time::sleep_until(stopped_at) => {}
                () = all_arrived => {}
            }
        }
    }

    /// Sends `batch` as one change, splitting it where a failure may be one IP's fault; its
    /// additions are recorded in the ledger first.
    async fn run(&self, provider: &'static str, target: &NodeTarget, batch: Vec<Job>) {
        let additions = change_of(&batch).add;
        if let Err(e) = self.ledger.record(target, &additions).await {
            tracing::warn!(node = %target.node_name, error = %e, "recording the batch in the ledger failed; not calling the cloud");
            let error = CloudError::retryable(format!("{e}; the cloud was not called"));
            return deliver(batch, &Err(error));
        }
        let mut parts = vec![batch];
        while let Some(mut part) = parts.pop() {
            let change = change_of(&part);
            let known = self.interfaces.get(&target.instance);
            // An object reconciled again before the cache shows its last write (a delete's
            // queued reconcile, say) asks for what the view already shows: no call.
            if known.as_ref().is_some_and(|view| in_effect(view, &change)) {
                self.settle(target, part, &change).await;
                continue;
            }
            tracing::debug!(node = %target.node_name, add = change.add.len(), remove = change.remove.len(), "calling the cloud");
            let started = Instant::now();
            let result = self.call(provider, target, &change, known.as_ref()).await;
            self.metrics
                .cloud_call(provider, "apply", started.elapsed(), &result);
            self.metrics.cloud_batch(provider, change.len());
            self.metrics
                .cloud_ips(provider, Mutation::Attach.as_str(), change.add.len());
            self.metrics
                .cloud_ips(provider, Mutation::Detach.as_str(), change.remove.len());
            match result {
                Ok(view) => {
                    self.remember(&target.instance, view);
                    self.settle(target, part, &change).await;
                }
                Err(error) => {
                    self.interfaces.forget(&target.instance);
                    if part.len() > 1 && worth_splitting(&error) {
                        tracing::debug!(node = %target.node_name, ips = part.len(), %error, "change refused; splitting it to find the IP to blame");
                        let second = part.split_off(part.len() / 2);
                        parts.push(second);
                        parts.push(part);
                    } else {
                        deliver(part, &Err(error));
                    }
                }
            }
        }
    }

    /// Completes a change the cloud made: its removals leave the ledger (one write), then every
    /// IP gets its answer; a removal still recorded fails, so that its object retries it.
    async fn settle(&self, target: &NodeTarget, part: Vec<Job>, change: &Change) {
        let released = self.ledger.release(&target.instance, &change.remove).await;
        if let Err(e) = &released {
            tracing::warn!(node = %target.node_name, error = %e, "taking detached IPs off the ledger failed");
        }
        for job in part {
            let result = match (&released, job.mutation) {
                (Err(e), Mutation::Detach) => Err(CloudError::retryable(format!(
                    "detached, but {e}; will retry"
                ))),
                _ => Ok(()),
            };
            let _ = job.reply.send(result);
        }
    }

    fn remember(&self, instance: &InstanceId, view: Option<NodeEgress>) {
        match view {
            Some(view) => self.interfaces.put(instance, view),
            None => self.interfaces.forget(instance),
        }
    }

    /// One cloud call, bounded by the deadline; a panic or an expired deadline becomes a
    /// retryable error, since the change may or may not have been made.
    async fn call(
        &self,
        provider: &'static str,
        target: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        let call = self.cloud.apply(target, change, known);
        // Nothing the lane owns is inside the call: a panic there cannot leave it half-updated.
        let guarded = AssertUnwindSafe(call).catch_unwind();
        let node = &target.node_name;
        let operation = operation_of(change);
        match tokio::time::timeout(self.call_deadline, guarded).await {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => {
                let what = panic_message(panic.as_ref());
                tracing::error!(%node, operation, panic = what, "cloud provider panicked; failing the batch and keeping the lane");
                self.metrics.call_aborted(provider, "apply", "panic");
                Err(CloudError::retryable(format!(
                    "the {provider} provider failed unexpectedly during the {operation}; \
                     the change may or may not have been made"
                )))
            }
            Err(_) => {
                let deadline = self.call_deadline;
                tracing::warn!(%node, operation, ?deadline, "cloud call exceeded its deadline; abandoning it");
                self.metrics.call_aborted(provider, "apply", "deadline");
                Err(CloudError::retryable(format!(
                    "no answer from the cloud to the {operation} within {}s; \
                     the change may or may not have been made",
                    deadline.as_secs_f64()
                )))
            }
        }
    }

    /// Moves `ip` from `from`'s VM to `to`'s in one provider operation
    /// ([`CloudProvider::move_ips`]), bounded by the call deadline, and updates both VMs' views.
    ///
    /// It runs beside the two VMs' lanes, not in them: a move spans two VMs, and the providers
    /// with a native move guard every interface update (OpenStack's `If-Match` revision), so an
    /// overlapping lane call is retried by the provider instead of lost.
    pub(crate) async fn move_ip(
        &self,
        from: &NodeTarget,
        to: &NodeTarget,
        ip: IpAddr,
    ) -> Result<(), CloudError> {
        let provider = self.cloud.needs().name;
        let Ok(_permit) = self.parallel.acquire().await else {
            return Err(CloudError::retryable("the engine is shutting down"));
        };
        let ips = [ip];
        self.ledger
            .record(to, &ips)
            .await
            .map_err(|e| CloudError::retryable(format!("{e}; the cloud was not called")))?;
        let started = Instant::now();
        let call = AssertUnwindSafe(self.cloud.move_ips(from, to, &ips)).catch_unwind();
        let result = match tokio::time::timeout(self.call_deadline, call).await {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => {
                let what = panic_message(panic.as_ref());
                tracing::error!(from = %from.node_name, to = %to.node_name, panic = what, "cloud provider panicked during a move");
                self.metrics.call_aborted(provider, "move", "panic");
                Err(CloudError::retryable(format!(
                    "the {provider} provider failed unexpectedly during the move; the IP may \
                     be on either node"
                )))
            }
            Err(_) => {
                self.metrics.call_aborted(provider, "move", "deadline");
                Err(CloudError::retryable(format!(
                    "no answer from the cloud to the move within {}s; the IP may be on either node",
                    self.call_deadline.as_secs_f64()
                )))
            }
        };
        self.metrics
            .cloud_call(provider, "move", started.elapsed(), &result);
        self.metrics.cloud_ips(provider, "move", 1);
        match &result {
            Ok(()) => {
                let off = Change {
                    add: Vec::new(),
                    remove: vec![ip],
                };
                let on = Change {
                    add: vec![ip],
                    remove: Vec::new(),
                };
                for (target, change) in [(from, off), (to, on)] {
                    if let Some(view) = self.interfaces.get(&target.instance) {
                        self.interfaces.put(&target.instance, view.after(&change));
                    }
                }
                if let Err(e) = self.ledger.release(&from.instance, &ips).await {
                    return Err(CloudError::retryable(format!("moved, but {e}; will retry")));
                }
            }
            Err(_) => {
                self.interfaces.forget(&from.instance);
                self.interfaces.forget(&to.instance);
            }
        }
        result
    }

    /// Aborts every lane task (the controller is being torn down); their callers see an error.
    pub(crate) fn abort_all(&self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }
}

/// What a change does, in words for messages: `attach`, `detach` or `attach and detach`.
fn operation_of(change: &Change) -> &'static str {
    match (change.add.is_empty(), change.remove.is_empty()) {
        (false, true) => "attach",
        (true, false) => "detach",
        _ => "attach and detach",
    }
}

/// The text of a panic payload, when it is one (`panic!` with a message gives a `&str` or a
/// `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-text panic payload")
}

/// Owns a lane's drain task. If the task ends without removing its lane (it panicked outside a
/// cloud call, or was aborted), the lane is removed here: its queued jobs are dropped, so their
/// submitters get an error instead of waiting forever, and the next submit starts a fresh lane.
struct LaneGuard {
    lanes: Arc<Lanes>,
    instance: InstanceId,
    id: u64,
    finished: bool,
}

impl LaneGuard {
    async fn drain(mut self) {
        self.finished = self.lanes.drain(&self.instance, self.id).await;
    }
}

impl Drop for LaneGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let orphaned = {
            let mut lanes = self.lanes.lanes();
            match lanes.get(&self.instance) {
                Some(lane) if lane.id == self.id => lanes.remove(&self.instance),
                _ => None,
            }
        };
        if let Some(lane) = orphaned {
            tracing::warn!(node = %lane.target.node_name, queued = lane.pending.len(), "lane stopped early; failing its queued IPs");
        }
    }
}

fn deliver(batch: Vec<Job>, result: &Result<(), CloudError>) {
    for job in batch {
        // The caller may have been cancelled; its object will be re-read and retried.
        let _ = job.reply.send(result.clone());
    }
}

/// The error of an IP whose lane went away before answering.
fn abandoned() -> CloudError {
    CloudError::retryable("the cloud call for this IP was abandoned; it will be retried")
}

/// An IP on its way to a lane ([`Lanes::expect`]); dropping it says the IP has arrived, or will
/// not come.
pub(crate) struct Announced {
    lanes: Arc<Lanes>,
    node: Box<str>,
    at: Instant,
    /// Whether it is ready to be submitted ([`Lanes::expect_later`]).
    ready: bool,
}

impl Announced {
    /// The node the IP is announced to.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The call on another VM the IP waited for is done: it will be submitted once its
    /// object's writes are.
    pub(crate) fn ready(&mut self) {
        if !self.ready {
            self.lanes.expect_on(&self.node, true);
            self.lanes.arrived_on(&self.node, false);
            self.ready = true;
        }
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        self.lanes.arrived_on(&self.node, self.ready);
        if self.lanes.announced.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.lanes.all_arrived.notify_waiters();
        }
    }
}

/// Aborts the lanes' tasks when dropped, so a torn-down controller leaves no call running.
pub(crate) struct AbortOnDrop(pub Arc<Lanes>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::cloud::CloudProviderExt;
    use crate::cloud::memory::{FaultAction, MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};

    /// Lanes over `cloud` with a fresh interface cache.
    fn lanes_for(cloud: &MemoryCloud, gather: Gather) -> Arc<Lanes> {
        let cloud: Arc<dyn CloudProvider> = Arc::new(cloud.clone());
        let metrics = Arc::new(Metrics::default());
        let interfaces = Arc::new(Interfaces::new(Arc::clone(&cloud), Arc::clone(&metrics)));
        let ledger = Arc::new(Ledger::in_memory(Arc::clone(&metrics)));
        Arc::new(Lanes::new(cloud, metrics, interfaces, ledger, 8, gather))
    }

    fn window(ms: u64) -> Gather {
        Gather {
            quiet: Duration::from_millis(ms),
            max: Duration::from_secs(1),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn batches_take_the_oldest_jobs_of_both_kinds_up_to_the_limit_and_one_job_per_ip() {
        use Mutation::*;
        let mut pending: VecDeque<(Mutation, IpAddr)> = [
            (Detach, ip("10.0.0.1")),
            (Attach, ip("10.0.0.2")),
            (Attach, ip("10.0.0.1")),
            (Detach, ip("10.0.0.3")),
            (Detach, ip("10.0.0.4")),
        ]
        .into();
        let batch = take_batch(&mut pending, 3, |j| j.1);
        assert_eq!(
            batch,
            vec![
                (Detach, ip("10.0.0.1")),
                (Attach, ip("10.0.0.2")),
                (Detach, ip("10.0.0.3"))
            ]
        );
        let batch = take_batch(&mut pending, 10, |j| j.1);
        assert_eq!(
            batch,
            vec![(Attach, ip("10.0.0.1")), (Detach, ip("10.0.0.4"))]
        );
        assert!(pending.is_empty());
    }

    #[tokio::test]
    async fn ips_submitted_during_a_call_share_the_next_call() {
        let cloud = MemoryCloud::new(MemoryConfig {
            latency: Duration::from_millis(30),
            ..MemoryConfig::default()
        });
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 100));
        let lanes = lanes_for(&cloud, Gather::NONE);
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        let submits = (1..=20).map(|i| {
            let lanes = Arc::clone(&lanes);
            let target = target.clone();
            async move {
                lanes
                    .submit(&target, Mutation::Attach, ip(&format!("10.2.0.{i}")))
                    .await
            }
        });
        let results = futures::future::join_all(submits).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(cloud.attached_to("a").len(), 20);
        assert!(cloud.call_count(Op::Attach) <= 2, "{:?}", cloud.calls());
        assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
    }

    #[tokio::test]
    async fn a_failed_ip_fails_alone() {
        let cloud = MemoryCloud::new(MemoryConfig::default());
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 100));
        let lanes = lanes_for(&cloud, Gather::NONE);
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        let (good, bad) = tokio::join!(
            lanes.submit(&target, Mutation::Attach, ip("10.2.0.1")),
            lanes.submit(&target, Mutation::Attach, ip("192.168.0.1"))
        );
        assert!(good.is_ok());
        assert!(bad.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn ips_arriving_within_the_window_of_an_idle_lane_share_its_first_call() {
        let cloud = MemoryCloud::new(MemoryConfig {
            latency: Duration::from_millis(50),
            ..MemoryConfig::default()
        });
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 100));
        let lanes = lanes_for(&cloud, window(30));
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        // Five objects whose reconciles reach the lane 5 ms apart, as a watch delivers a burst.
        let submits = (1..=5u64).map(|i| {
            let lanes = Arc::clone(&lanes);
            let target = target.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(5 * (i - 1))).await;
                lanes
                    .submit(&target, Mutation::Attach, ip(&format!("10.2.0.{i}")))
                    .await
            }
        });
        let results = futures::future::join_all(submits).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(cloud.call_count(Op::Attach), 1, "{:?}", cloud.calls());
        assert_eq!(cloud.attached_to("a").len(), 5);
    }

    /// A cloud with VM `a` and calls taking `latency`, and lanes over it without a window.
    async fn lanes_over(latency: Duration) -> (MemoryCloud, Arc<Lanes>, NodeTarget) {
        let cloud = MemoryCloud::new(MemoryConfig {
            latency,
            ..MemoryConfig::default()
        });
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 100));
        let lanes = lanes_for(&cloud, Gather::NONE);
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        (cloud, lanes, target)
    }

    /// Submits `ip` after `delay`, giving up after an hour of (paused) time.
    async fn submit_after(
        lanes: &Arc<Lanes>,
        target: &NodeTarget,
        delay: Duration,
        mutation: Mutation,
        ip: IpAddr,
    ) -> Result<Result<(), CloudError>, tokio::time::error::Elapsed> {
        tokio::time::sleep(delay).await;
        tokio::time::timeout(
            Duration::from_secs(3600),
            lanes.submit(target, mutation, ip),
        )
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_call_fails_its_batch_and_the_lane_keeps_serving() {
        let (cloud, lanes, target) = lanes_over(Duration::from_millis(50)).await;
        cloud.inject(Op::Attach, Some("a"), Some(1), FaultAction::Panic);
        let ms = Duration::from_millis;
        // The first IP goes out alone and its call panics; two more queue up meanwhile.
        let (first, second, third) = tokio::join!(
            submit_after(&lanes, &target, ms(0), Mutation::Attach, ip("10.2.0.1")),
            submit_after(&lanes, &target, ms(10), Mutation::Attach, ip("10.2.0.2")),
            submit_after(&lanes, &target, ms(10), Mutation::Detach, ip("10.2.0.3")),
        );
        let first = first.expect("the panicked call's submitter must not wait forever");
        assert_eq!(first.map_err(|e| e.kind), Err(ErrorKind::Retryable));
        assert_eq!(second.expect("queued attach wedged"), Ok(()));
        assert_eq!(third.expect("queued detach wedged"), Ok(()));
        let next = submit_after(&lanes, &target, ms(0), Mutation::Attach, ip("10.2.0.4")).await;
        assert_eq!(next.expect("next submit wedged"), Ok(()));
        assert_eq!(
            cloud.attached_to("a"),
            [ip("10.2.0.2"), ip("10.2.0.4")].into()
        );
        assert_eq!(lanes.queued(), 0);
        assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_call_is_given_up_at_the_deadline_and_the_lane_moves_on() {
        let (cloud, lanes, target) = lanes_over(Duration::from_millis(50)).await;
        cloud.inject(Op::Attach, Some("a"), Some(1), FaultAction::Hang);
        let ms = Duration::from_millis;
        let started = tokio::time::Instant::now();
        let (hung, queued) = tokio::join!(
            submit_after(&lanes, &target, ms(0), Mutation::Attach, ip("10.2.0.1")),
            submit_after(&lanes, &target, ms(10), Mutation::Attach, ip("10.2.0.2")),
        );
        let hung = hung.expect("the hung call's submitter waited an hour");
        assert_eq!(hung.map_err(|e| e.kind), Err(ErrorKind::Retryable));
        assert!(
            started.elapsed() <= DEFAULT_CALL_DEADLINE + ms(200),
            "gave up only after {:?}",
            started.elapsed()
        );
        assert_eq!(queued.expect("queued attach wedged"), Ok(()));
        let next = submit_after(&lanes, &target, ms(0), Mutation::Attach, ip("10.2.0.3")).await;
        assert_eq!(next.expect("next submit wedged"), Ok(()));
        assert_eq!(
            cloud.attached_to("a"),
            [ip("10.2.0.2"), ip("10.2.0.3")].into()
        );
        assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
    }

    #[tokio::test(start_paused = true)]
    async fn the_ledger_records_a_batch_before_its_call_and_forgets_it_after_the_detach() {
        let (cloud, lanes, target) = lanes_over(Duration::from_millis(50)).await;
        let ips = [ip("10.2.0.1"), ip("10.2.0.2")];
        let recorded = |lanes: &Lanes| ips.map(|i| lanes.ledger.instance(i, "a"));
        let submit_all =
            |mutation| futures::future::join_all(ips.map(|i| lanes.submit(&target, mutation, i)));
        // Half-way through each call: what the ledger and the cloud show.
        let mid_call = || async {
            tokio::time::sleep(Duration::from_millis(25)).await;
            (recorded(&lanes), cloud.attached_to("a"))
        };
        let (attached, (during, on_vm)) = tokio::join!(submit_all(Mutation::Attach), mid_call());
        assert!(attached.iter().all(Result::is_ok), "{attached:?}");
        assert_eq!(
            during,
            [Some(target.instance.clone()), Some(target.instance.clone())]
        );
        assert!(on_vm.is_empty(), "the call was not in flight: {on_vm:?}");
        let (detached, (during, on_vm)) = tokio::join!(submit_all(Mutation::Detach), mid_call());
        assert!(detached.iter().all(Result::is_ok), "{detached:?}");
        assert_eq!(on_vm.len(), 2, "the call was not in flight");
        assert!(
            during.iter().all(Option::is_some),
            "released before the detach was confirmed"
        );
        assert_eq!(recorded(&lanes), [None, None]);
        assert_eq!(cloud.mutating_calls(), 2, "{:?}", cloud.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn the_call_deadline_is_configurable() {
        let (cloud, _, target) = lanes_over(Duration::ZERO).await;
        let cloud_dyn: Arc<dyn CloudProvider> = Arc::new(cloud.clone());
        let metrics = Arc::new(Metrics::default());
        let interfaces = Arc::new(Interfaces::new(
            Arc::clone(&cloud_dyn),
            Arc::clone(&metrics),
        ));
        let ledger = Arc::new(Ledger::in_memory(Arc::clone(&metrics)));
        let lanes = Arc::new(
            Lanes::new(cloud_dyn, metrics, interfaces, ledger, 8, Gather::NONE)
                .with_call_deadline(Duration::from_secs(5)),
        );
        cloud.inject(Op::Detach, None, Some(1), FaultAction::Hang);
        let started = tokio::time::Instant::now();
        let result = lanes
            .submit(&target, Mutation::Detach, ip("10.2.0.1"))
            .await;
        assert_eq!(result.map_err(|e| e.kind), Err(ErrorKind::Retryable));
        assert_eq!(started.elapsed().as_secs(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn aborted_lanes_fail_their_queued_ips_and_later_submits_start_afresh() {
        let (cloud, lanes, target) = lanes_over(Duration::from_millis(50)).await;
        let ms = Duration::from_millis;
        let abort = async {
            tokio::time::sleep(ms(20)).await;
            lanes.abort_all();
        };
        let (in_flight, queued, ()) = tokio::join!(
            submit_after(&lanes, &target, ms(0), Mutation::Attach, ip("10.2.0.1")),
            submit_after(&lanes, &target, ms(10), Mutation::Attach, ip("10.2.0.2")),
            abort,
        );
        assert!(in_flight.expect("in-flight submitter wedged").is_err());
        assert!(queued.expect("queued submitter wedged").is_err());
        let next = submit_after(&lanes, &target, ms(0), Mutation::Attach, ip("10.2.0.3")).await;
        assert_eq!(next.expect("next submit wedged"), Ok(()));
        assert_eq!(cloud.attached_to("a"), [ip("10.2.0.3")].into());
    }

    #[tokio::test(start_paused = true)]
    async fn additions_and_removals_for_one_vm_share_one_call() {
        let cloud = MemoryCloud::new(MemoryConfig::default());
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 100));
        let lanes = lanes_for(&cloud, window(30));
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        let olds: Vec<IpAddr> = (1..=5).map(|i| ip(&format!("10.2.0.{i}"))).collect();
        cloud.attach(&target, &olds).await.unwrap();
        let before = cloud.mutating_calls();
        let removals = olds
            .iter()
            .map(|old| lanes.submit(&target, Mutation::Detach, *old));
        let additions =
            (6..=10).map(|i| lanes.submit(&target, Mutation::Attach, ip(&format!("10.2.0.{i}"))));
        let (removed, added) = tokio::join!(
            futures::future::join_all(removals),
            futures::future::join_all(additions)
        );
        assert!(removed.iter().chain(&added).all(Result::is_ok));
        assert_eq!(cloud.mutating_calls() - before, 1, "{:?}", cloud.calls());
        let now: Vec<IpAddr> = (6..=10).map(|i| ip(&format!("10.2.0.{i}"))).collect();
        assert_eq!(cloud.attached_to("a"), now.into_iter().collect());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_batch_is_split_down_to_the_ip_to_blame() {
        let cloud = MemoryCloud::new(MemoryConfig::default());
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 100));
        let lanes = lanes_for(&cloud, window(30));
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        let mut ips: Vec<IpAddr> = (1..=15).map(|i| ip(&format!("10.2.0.{i}"))).collect();
        ips.insert(6, ip("192.168.0.7"));
        let results = futures::future::join_all(
            ips.iter()
                .map(|i| lanes.submit(&target, Mutation::Attach, *i)),
        )
        .await;
        for (ip, result) in ips.iter().zip(&results) {
            if ip.to_string() == "192.168.0.7" {
                let error = result.as_ref().unwrap_err();
                assert_eq!(error.kind, ErrorKind::Permanent);
                assert!(error.message.contains("192.168.0.7"), "{error}");
            } else {
                assert_eq!(result, &Ok(()), "{ip}");
            }
        }
        assert_eq!(cloud.attached_to("a").len(), 15);
        // 16 IPs, one bad: the whole, then two halves, four quarters... one failed call per
        // level (5) and one successful call per level below the top (4).
        assert!(cloud.mutating_calls() <= 9, "{:?}", cloud.calls());
    }

    /// Attaches `count` IPs arriving `every_ms` apart, checks they all land, and returns the
    /// number of IPs of each call the cloud saw.
    async fn call_sizes_of_a_trickle(
        cloud: &MemoryCloud,
        lanes: &Arc<Lanes>,
        target: &NodeTarget,
        count: u8,
        every_ms: u64,
    ) -> Vec<usize> {
        attach_round(lanes, std::slice::from_ref(target), count, every_ms).await;
        cloud.calls().iter().map(|c| c.ips.len()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_lane_gathers_while_ips_keep_arriving_up_to_its_bound() {
        let cloud = MemoryCloud::new(MemoryConfig {
            latency: Duration::from_millis(50),
            ..MemoryConfig::default()
        });
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 100));
        let lanes = lanes_for(
            &cloud,
            Gather {
                quiet: Duration::from_millis(100),
                max: Duration::from_secs(1),
            },
        );
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        // One IP every 60 ms for 1.5 s: never a quiet gap, so the bound ends the gathering.
        let sizes = call_sizes_of_a_trickle(&cloud, &lanes, &target, 25, 60).await;
        // The first call goes at the 1 s bound with the 17 IPs of 0..=960 ms; the other 8 keep
        // arriving during and after it and go out in one more call.
        assert_eq!(sizes, [17, 8]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_without_rate_budget_keeps_gathering() {
        let cloud = MemoryCloud::new(MemoryConfig {
            write_rate: crate::cloud::pace::Rate {
                burst: 1,
                per_second: 1.0,
            },
            ..MemoryConfig::default()
        });
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 100));
        let lanes = lanes_for(&cloud, Gather::NONE);
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        // The first IP spends the only token; the nine that arrive over the next 900 ms wait
        // for the refill at 1 s and go out together.
        let sizes = call_sizes_of_a_trickle(&cloud, &lanes, &target, 10, 100).await;
        assert_eq!(sizes, [1, 9]);
    }

    /// A memory cloud with `vms` VMs and a write budget of `burst` tokens refilled at `per_second`,
    /// and their targets.
    async fn metered_vms(
        vms: &[&str],
        burst: u32,
        per_second: f64,
    ) -> (MemoryCloud, Vec<NodeTarget>) {
        let cloud = MemoryCloud::new(MemoryConfig {
            write_rate: crate::cloud::pace::Rate { burst, per_second },
            ..MemoryConfig::default()
        });
        let mut targets = Vec::new();
        for (i, vm) in (1u8..).zip(vms) {
            cloud.add_vm(vm, VmSpec::ipv4(IpAddr::from([10, 1, 0, i]), 100));
            targets.push(cloud.resolve(vm, &provider_id(vm)).await.unwrap());
        }
        (cloud, targets)
    }

    /// Attaches `count` IPs, one every `every_ms`, round the `targets`; checks they all land.
    async fn attach_round(lanes: &Arc<Lanes>, targets: &[NodeTarget], count: u8, every_ms: u64) {
        let submits = (0..count).map(|i| async move {
            tokio::time::sleep(Duration::from_millis(every_ms * u64::from(i))).await;
            let target = &targets[usize::from(i) % targets.len()];
            let ip = IpAddr::from([10, 2, 0, i + 1]);
            lanes.submit(target, Mutation::Attach, ip).await
        });
        let results = futures::future::join_all(submits).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_over_more_vms_than_the_budget_keeps_tokens_for_their_last_calls() {
        let vms = ["a", "b", "c", "d", "e"];
        let (cloud, targets) = metered_vms(&vms, 5, 2.0).await;
        let lanes = lanes_for(&cloud, window(50));
        let start = Instant::now();
        // 50 IPs, one every 20 ms round the five VMs, for 980 ms: each VM's own gap (100 ms)
        // ends its gathering every time.
        attach_round(&lanes, &targets, 50, 20).await;
        // Spending a token per gathered batch would empty the bucket in 150 ms and leave the
        // five last calls to the refill, until 3.5 s. Leaving a token for each lane with work
        // makes three calls at the start, and five together once the bucket holds five again.
        assert!(cloud.mutating_calls() <= 8, "{:?}", cloud.calls());
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "done {:?} after the first IP",
            start.elapsed()
        );
        for vm in vms {
            assert_eq!(cloud.attached_to(vm).len(), 10, "{vm}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_ends_once_every_announced_ip_has_reached_its_lane() {
        let (cloud, targets) = metered_vms(&["a", "b", "c"], 2, 0.01).await;
        let lanes = lanes_for(&cloud, window(50));
        // "c" spends one of the two tokens.
        lanes
            .submit(&targets[2], Mutation::Attach, ip("10.2.0.9"))
            .await
            .unwrap();
        let start = Instant::now();
        // An IP for "b" is on its way: "a" leaves it the last token while it may come.
        let for_b = lanes.expect("b");
        let submitted = lanes.submit(&targets[0], Mutation::Attach, ip("10.2.0.1"));
        let gives_up = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(cloud.mutating_calls(), 1, "called with b's IP on its way");
            // b's object failed before its IP reached the lane: nothing more is coming.
            drop(for_b);
        };
        let (result, ()) = tokio::join!(submitted, gives_up);
        result.unwrap();
        // Once nothing is on its way, a quiet gap ends the burst, not the longest gathering time.
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "called {:?} after the IP arrived",
            start.elapsed()
        );
        assert_eq!(cloud.attached_to("a").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_waits_for_an_ip_announced_to_it_and_calls_once_it_arrives() {
        let (cloud, targets) = metered_vms(&["a"], 100, 100.0).await;
        let lanes = lanes_for(&cloud, window(100));
        let start = Instant::now();
        let coming = lanes.expect("a");
        let first = lanes.submit(&targets[0], Mutation::Attach, ip("10.2.0.1"));
        let second = async {
            // Longer than the quiet gap: without the announcement the first IP went alone.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let result = lanes
                .submit_announced(coming, &targets[0], Mutation::Attach, ip("10.2.0.2"))
                .await;
            (result, start.elapsed())
        };
        let (first, (second, arrived)) = tokio::join!(first, second);
        first.unwrap();
        second.unwrap();
        assert_eq!(cloud.mutating_calls(), 1, "{:?}", cloud.calls());
        // Announced 300 ms before it arrived: its quiet gap was over when it came.
        assert_eq!(
            start.elapsed(),
            arrived,
            "called after the announced IP arrived"
        );
    }

    /// What a move made as detach, then attach does through the lanes: the attach half is
    /// announced to `to` with the detach, ready once the detach is answered, and submitted after
    /// the object's writes (`writes_ms`).
    async fn move_through(
        lanes: &Arc<Lanes>,
        from: &NodeTarget,
        to: &NodeTarget,
        ip: IpAddr,
        writes_ms: u64,
    ) -> Instant {
        let detach = lanes.expect(&from.node_name);
        let mut attach = lanes.expect_later(&to.node_name);
        tokio::time::sleep(Duration::from_millis(writes_ms)).await;
        lanes
            .submit_announced(detach, from, Mutation::Detach, ip)
            .await
            .unwrap();
        attach.ready();
        tokio::time::sleep(Duration::from_millis(writes_ms)).await;
        let arrived = Instant::now();
        lanes
            .submit_announced(attach, to, Mutation::Attach, ip)
            .await
            .unwrap();
        arrived
    }

    #[tokio::test(start_paused = true)]
    async fn the_halves_of_moves_between_two_vms_share_one_call_per_vm_and_direction() {
        let (cloud, targets) = metered_vms(&["a", "b"], 100, 100.0).await;
        let lanes = lanes_for(&cloud, window(100));
        let ips: Vec<IpAddr> = (1..=6).map(|i| IpAddr::from([10, 2, 0, i])).collect();
        for ip in &ips {
            lanes
                .submit(&targets[0], Mutation::Attach, *ip)
                .await
                .unwrap();
        }
        let before = cloud.calls().len();
        let start = Instant::now();
        // Each object's writes take a little longer than the one before.
        let moves = (0u64..).zip(&ips).map(|(i, ip)| {
            let lanes = &lanes;
            let (from, to) = (&targets[0], &targets[1]);
            async move { move_through(lanes, from, to, *ip, 5 + 3 * i).await }
        });
        let arrivals = futures::future::join_all(moves).await;
        let calls: Vec<(Op, String, usize)> = cloud.calls()[before..]
            .iter()
            .filter(|c| c.op.is_mutation())
            .map(|c| (c.op, c.instance.clone(), c.ips.len()))
            .collect();
        let (a, b) = (targets[0].instance.0.clone(), targets[1].instance.0.clone());
        // Off "a" in one call, then onto "b" in one call: never on both.
        assert_eq!(calls, [(Op::Detach, a, 6), (Op::Attach, b, 6)]);
        assert_eq!(cloud.attached_to("b").len(), 6);
        // The attach call went out as the last attach half arrived: no quiet gap after it.
        let last = arrivals.iter().max().copied().unwrap();
        assert_eq!(start.elapsed(), last.duration_since(start));
    }

    #[tokio::test(start_paused = true)]
    async fn a_receiving_lane_waits_for_moves_whose_detach_is_still_under_way() {
        let (cloud, targets) = metered_vms(&["a", "b", "c"], 100, 100.0).await;
        let lanes = lanes_for(&cloud, window(100));
        let (x, y) = (ip("10.2.0.1"), ip("10.2.0.2"));
        lanes
            .submit(&targets[0], Mutation::Attach, x)
            .await
            .unwrap();
        lanes
            .submit(&targets[2], Mutation::Attach, y)
            .await
            .unwrap();
        let before = cloud.calls().len();
        // y's writes outlast the quiet gap: its detach from "c" is answered after x reached "b".
        tokio::join!(
            move_through(&lanes, &targets[0], &targets[1], x, 5),
            move_through(&lanes, &targets[2], &targets[1], y, 150),
        );
        let b = targets[1].instance.0.clone();
        let onto_b: Vec<usize> = cloud.calls()[before..]
            .iter()
            .filter(|c| c.op == Op::Attach && c.instance == b)
            .map(|c| c.ips.len())
            .collect();
        assert_eq!(onto_b, [2], "{:?}", cloud.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn moves_in_opposite_directions_do_not_wait_for_each_other() {
        let (cloud, targets) = metered_vms(&["a", "b"], 100, 100.0).await;
        let lanes = lanes_for(&cloud, window(100));
        let (x, y) = (ip("10.2.0.1"), ip("10.2.0.2"));
        lanes
            .submit(&targets[0], Mutation::Attach, x)
            .await
            .unwrap();
        lanes
            .submit(&targets[1], Mutation::Attach, y)
            .await
            .unwrap();
        let start = Instant::now();
        tokio::join!(
            move_through(&lanes, &targets[0], &targets[1], x, 10),
            move_through(&lanes, &targets[1], &targets[0], y, 10),
        );
        // Each detach waits for the other VM's announced attach only once that is ready: two
        // quiet gaps and the writes, far from the longest gathering time.
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(cloud.attached_to("a"), BTreeSet::from([y]));
        assert_eq!(cloud.attached_to("b"), BTreeSet::from([x]));
    }

    #[tokio::test(start_paused = true)]
    async fn lanes_that_the_budget_covers_call_at_once() {
        let vms = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let (cloud, targets) = metered_vms(&vms, 100, 1.0).await;
        let lanes = lanes_for(&cloud, window(50));
        let start = Instant::now();
        attach_round(&lanes, &targets, 20, 1).await;
        assert_eq!(cloud.mutating_calls(), 10, "{:?}", cloud.calls());
        assert!(
            start.elapsed() <= Duration::from_millis(100),
            "done {:?} after the first IP",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn calls_carry_the_last_answer_as_the_view_until_a_call_fails() {
        let (cloud, lanes, target) = lanes_over(Duration::ZERO).await;
        for i in 1..=2 {
            let ip = IpAddr::from([10, 2, 0, i]);
            lanes.submit(&target, Mutation::Attach, ip).await.unwrap();
        }
        cloud.fail_next(Op::Attach, None, 1, CloudError::retryable("reset"));
        let failed = lanes
            .submit(&target, Mutation::Attach, ip("10.2.0.3"))
            .await;
        assert!(failed.is_err());
        lanes
            .submit(&target, Mutation::Attach, ip("10.2.0.3"))
            .await
            .unwrap();
        let views: Vec<bool> = cloud.calls().iter().map(|c| c.with_view).collect();
        // Nothing cached at first; then each answer; a failure drops it.
        assert_eq!(views, [false, true, true, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_the_cached_view_already_shows_costs_no_call() {
        let (cloud, lanes, target) = lanes_over(Duration::ZERO).await;
        let ip = ip("10.2.0.1");
        lanes.submit(&target, Mutation::Attach, ip).await.unwrap();
        lanes.submit(&target, Mutation::Attach, ip).await.unwrap();
        lanes.submit(&target, Mutation::Detach, ip).await.unwrap();
        lanes.submit(&target, Mutation::Detach, ip).await.unwrap();
        assert_eq!(cloud.mutating_calls(), 2, "{:?}", cloud.calls());
        assert!(cloud.attached_to("a").is_empty());
    }
}
