//! Per-node batching: one lane per VM, at most one mutating cloud call per lane at a time, and
//! everything that arrives for the VM while a call is in flight goes out together in the next one.
//!
//! Object reconcilers call [`Lanes::submit`] for one IP and await its own result; they never see
//! the batching. A lane with work keeps gathering while IPs keep arriving (a quiet gap ends it, a
//! bound on the oldest IP's wait caps it; an IP announced to the node is waited for, and its quiet
//! gap counts from its announcement), then waits for the provider's rate budget, gathering still,
//! and sends additions and removals together in one change; IPs that arrive during a call wait for
//! the next one. The quiet gap is the burst's, not the VM's: a burst spread over N VMs reaches each
//! at an Nth of its rate, so a gap counted from the VM's own last IP ended its gathering between
//! two of its IPs while the burst went on (200 deletes over 20 VMs took a call per two IPs). While
//! IPs keep arriving for any VM, a call leaves a token of the rate budget for every other node that
//! received (or was announced) an IP lately: a burst of objects over more VMs than the budget holds
//! then ends in one call per VM at once, instead of the budget going to the first IPs of each VM
//! and the last calls queueing at the refill rate; a call let through keeps its token claimed until
//! it ends, since it takes the token only once it reaches the cloud ([`claims`]). The burst is over
//! once every IP announced to the lanes (an object whose writes before the call are under way) has
//! reached its lane and a quiet gap has passed. Different VMs proceed in parallel up to a bound, so
//! one slow VM does not hold up the others and a burst cannot open thousands of connections to the
//! cloud.
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

use crate::cloud::driver::foreign;
use crate::cloud::{
    Change, CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget, Spend,
};
use crate::engine::interfaces::Interfaces;
use crate::engine::ledger::Ledger;
use crate::metrics::Metrics;

mod arrivals;
mod batch;
mod claims;

pub(crate) use arrivals::Announced;
use arrivals::{Arrivals, Expected};
pub(crate) use batch::Reply;
use batch::{
    Job, abandoned, change_of, deliver, in_effect, one, operation_of, take_batch, worth_splitting,
};
use claims::Claims;

/// The longest a lane waits for one cloud call unless told otherwise ([`Lanes::with_call_deadline`]).
pub(crate) const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(120);

/// A mutation of one IP on one VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Put the IP on the VM. Found there already, it is done only if the ledger recorded it on
    /// this VM before (a call of ours whose answer was lost); else it is foreign
    /// ([`crate::cloud::ErrorKind::Foreign`]).
    Attach,
    /// Record as ours an IP an earlier controller assigned to the VM (adoption), putting it on
    /// if it is missing.
    Adopt,
    /// Take the IP off the VM.
    Detach,
}

impl Mutation {
    /// Bounded label value for metrics.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Attach => "attach",
            Self::Adopt => "adopt",
            Self::Detach => "detach",
        }
    }
}

/// How long an idle lane gathers IPs before its first call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gather {
    /// Gathering ends once no IP has arrived at any lane for this long (zero: call at once).
    pub quiet: Duration,
    /// ... or once this long has passed since the first IP arrived, whatever keeps arriving.
    pub max: Duration,
}

impl Gather {
    /// No gathering: the first IP (or read) goes out at once.
    pub(crate) const NONE: Self = Self {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
    };
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
    /// Calls let through the rate gate and not finished.
    claims: Claims,
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
            claims: Claims::default(),
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
    /// time) and counts its quiet gap from now. Submit it with [`Lanes::submit_then`]
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
        self.arrivals().note(node, at, at);
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
    #[cfg(test)]
    pub(crate) async fn submit_announced(
        self: &Arc<Self>,
        announced: Announced,
        target: &NodeTarget,
        mutation: Mutation,
        ip: IpAddr,
    ) -> Result<(), CloudError> {
        let (sender, result) = oneshot::channel();
        // The submitter may have been cancelled; its object will be re-read and retried.
        let reply = move |answer| drop(sender.send(answer));
        self.submit_then(announced, target, mutation, ip, reply);
        result.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// Submits the IP `announced` said was coming and returns at once: `answer` gets its
    /// result once its call is done (or abandoned). A reconcile need not wait for its IP's call
    /// this way, and frees its slot for another object meanwhile.
    pub(crate) fn submit_then(
        self: &Arc<Self>,
        announced: Announced,
        target: &NodeTarget,
        mutation: Mutation,
        ip: IpAddr,
        answer: impl FnOnce(Result<(), CloudError>) + Send + 'static,
    ) {
        let noticed = announced.at;
        self.enqueue(target, mutation, ip, noticed, Reply::to(answer));
        // In its lane now: the lane need no longer wait for it.
        drop(announced);
    }

    /// Applies `mutation` of `ip` on `target`, batched with whatever else is queued for the VM.
    pub async fn submit(
        self: &Arc<Self>,
        target: &NodeTarget,
        mutation: Mutation,
        ip: IpAddr,
    ) -> Result<(), CloudError> {
        let (sender, result) = oneshot::channel();
        // The submitter may have been cancelled; its object will be re-read and retried.
        let reply = Reply::to(move |answer| drop(sender.send(answer)));
        self.enqueue(target, mutation, ip, Instant::now(), reply);
        result.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// Queues `mutation` of `ip` in `target`'s lane, starting the lane if it is idle; `reply`
    /// gets the IP's result.
    fn enqueue(
        self: &Arc<Self>,
        target: &NodeTarget,
        mutation: Mutation,
        ip: IpAddr,
        noticed: Instant,
        reply: Reply,
    ) {
        let now = Instant::now();
        self.arrivals().note(&target.node_name, now, noticed);
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
    }

    /// Waits while IPs keep arriving, within the gathering bounds: until none is on its way to
    /// the lane's node (an IP announced for later only counts while the lane has no removal to
    /// send) and none has been noticed on any node for the quiet gap, the oldest waiting IP has
    /// waited the longest gathering time, or a full batch is waiting.
    async fn gather(&self, instance: &InstanceId, id: u64) {
        let max_batch = self.cloud.needs().max_batch;
        loop {
            let burst = self.arrivals().noticed;
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
                    lane.last_notice.max(burst) + self.gather.quiet,
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
            let _claim = self.claims.claim();
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
            let released = self.claims.released();
            let mut released = std::pin::pin!(released);
            released.as_mut().enable();
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
            let claimed = self.claims.count();
            tokio::select! {
                () = self.cloud.write_budget(Spend { others, claimed }) => {
                    // Nodes that received IPs meanwhile need their tokens too.
                    if self.arrivals().other_nodes_within(window) <= others {
                        return;
                    }
                }
                () = tokio::time::sleep_until(stopped_at) => {}
                () = all_arrived => {}
                // A claimed call ended: its token is taken, or will not be.
                () = released => {}
            }
        }
    }

    /// Sends `batch` as one change, splitting it where a failure may be one IP's fault; its
    /// additions are recorded in the ledger first.
    ///
    /// Nothing cloudnet did not attach is taken over or detached: an addition the VM's view
    /// already shows is done only if it is ours (recorded on this VM before this batch, or
    /// adopted), and the node's own addresses are neither added nor removed. The cached view
    /// refuses those at once, with no call and no record; a view the cloud has changed since
    /// is the provider's to refuse ([`crate::cloud::driver::foreign`]), and the record this
    /// batch wrote for a refused IP is taken back.
    async fn run(&self, provider: &'static str, target: &NodeTarget, batch: Vec<Job>) {
        let instance = &target.instance;
        let ours: Vec<IpAddr> = batch
            .iter()
            .filter(|j| match j.mutation {
                Mutation::Adopt => true,
                Mutation::Attach => self.ledger.records(j.ip, instance),
                Mutation::Detach => false,
            })
            .map(|j| j.ip)
            .collect();
        let (refused, batch): (Vec<(Job, CloudError)>, Vec<Job>) = {
            let known = self.interfaces.get(instance);
            let mut refused = Vec::new();
            let mut rest = Vec::with_capacity(batch.len());
            for job in batch {
                match known.as_ref().map(|view| foreign(view, &one(&job, &ours))) {
                    Some(Err(e)) => refused.push((job, e)),
                    _ => rest.push(job),
                }
            }
            (refused, rest)
        };
        if !refused.is_empty() {
            self.refuse(target, refused).await;
        }
        if batch.is_empty() {
            return;
        }
        let additions = change_of(&batch).add;
        if let Err(e) = self.ledger.record(target, &additions).await {
            tracing::warn!(node = %target.node_name, error = %e, "recording the batch in the ledger failed; not calling the cloud");
            let error = CloudError::retryable(format!("{e}; the cloud was not called"));
            return deliver(batch, &Err(error));
        }
        let mut parts = vec![batch];
        while let Some(mut part) = parts.pop() {
            let mine = change_of(&part).add;
            let mine = ours
                .iter()
                .copied()
                .filter(|ip| mine.contains(ip))
                .collect();
            let change = change_of(&part)
                .with_ours(mine)
                .with_read_lately(self.interfaces.read_lately(&target.instance));
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
                    self.remember(target, view);
                    self.settle(target, part, &change).await;
                }
                Err(error) => {
                    self.interfaces.forget(&target.instance);
                    if part.len() > 1 && worth_splitting(&error) {
                        tracing::debug!(node = %target.node_name, ips = part.len(), %error, "change refused; splitting it to find the IP to blame");
                        let second = part.split_off(part.len() / 2);
                        parts.push(second);
                        parts.push(part);
                    } else if error.kind == ErrorKind::Foreign {
                        let refused = part.into_iter().map(|j| (j, error.clone())).collect();
                        self.refuse(target, refused).await;
                    } else {
                        deliver(part, &Err(error));
                    }
                }
            }
        }
    }

    /// Answers IPs refused as foreign (or as the node's own), none of which any call of ours
    /// put on the VM: a ledger record of one that is not ours (this batch's, or an earlier
    /// version's that took the address over) is taken back without a released record, so that
    /// neither a later detach nor the orphan sweep acts on it.
    async fn refuse(&self, target: &NodeTarget, refused: Vec<(Job, CloudError)>) {
        let ips: Vec<IpAddr> = refused.iter().map(|(j, _)| j.ip).collect();
        if let Err(e) = self.ledger.unrecord(&target.instance, &ips).await {
            tracing::warn!(node = %target.node_name, error = %e, "taking foreign addresses off the ledger failed");
        }
        for (job, error) in refused {
            tracing::info!(node = %target.node_name, ip = %job.ip, %error, "refused: not this controller's address");
            job.reply.send(Err(error));
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
            job.reply.send(result);
        }
    }

    fn remember(&self, target: &NodeTarget, view: Option<NodeEgress>) {
        match view {
            Some(view) => self.interfaces.put(target, view),
            None => self.interfaces.forget(&target.instance),
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
        // The new VM must not hold the IP already unless it is ours there (an IP found there is
        // another controller's, which the move would take over): the provider moves it as ours.
        let ours = if self.ledger.records(ip, &to.instance) {
            vec![ip]
        } else {
            Vec::new()
        };
        let view = self.interfaces.get_or_read(to).await?;
        foreign(&view, &Change::new(vec![ip], Vec::new()).with_ours(ours))?;
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
                let off = Change::new(Vec::new(), vec![ip]);
                let on = Change::new(vec![ip], Vec::new());
                for (target, change) in [(from, off), (to, on)] {
                    if let Some(view) = self.interfaces.get(&target.instance) {
                        self.interfaces.put(target, view.after(&change));
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

/// Aborts the lanes' tasks when dropped, so a torn-down controller leaves no call running.
pub(crate) struct AbortOnDrop(pub Arc<Lanes>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort_all();
    }
}

#[cfg(test)]
mod tests;
