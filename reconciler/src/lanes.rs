//! Per-node batching: one lane per VM, at most one mutating cloud call per lane at a time, and
//! everything that arrives for the VM while a call is in flight goes out together in the next one.
//!
//! Object reconcilers call [`Lanes::submit`] for one IP and await its own result; they never see
//! the batching. Different VMs proceed in parallel up to a bound, so one slow VM does not hold up
//! the others and a burst cannot open thousands of connections to the cloud.
//!
//! A lane survives its provider: a call that panics or outlives the per-call deadline fails the
//! IPs of its batch with a retryable error, and the lane goes on with what is queued. Should the
//! lane's task itself end early (a bug, or [`Lanes::abort_all`]), its queued IPs fail too and the
//! next submit for the VM starts a fresh lane.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::AbortHandle;

use crate::cloud::{BatchOutcome, CloudError, CloudProvider, InstanceId, NodeTarget};
use crate::metrics::Metrics;

/// The longest a lane waits for one cloud call unless told otherwise ([`Lanes::with_call_deadline`]).
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(120);

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
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Attach => "attach",
            Self::Detach => "detach",
        }
    }
}

struct Job {
    mutation: Mutation,
    ip: IpAddr,
    reply: oneshot::Sender<Result<(), CloudError>>,
}

struct Lane {
    /// Which drain task owns the lane: a task cleaning up after itself must not remove a
    /// successor's lane.
    id: u64,
    target: NodeTarget,
    pending: VecDeque<Job>,
}

/// Takes the next batch from `pending`: the oldest job's kind, and every pending job of that
/// kind up to `max` (first come, first served; one IP appears once).
fn take_batch<T>(
    pending: &mut VecDeque<T>,
    max: usize,
    kind: impl Fn(&T) -> (Mutation, IpAddr),
) -> Vec<T> {
    let Some(first) = pending.front() else {
        return Vec::new();
    };
    let (wanted, _) = kind(first);
    let mut batch: Vec<T> = Vec::new();
    let mut rest = VecDeque::with_capacity(pending.len());
    while let Some(job) = pending.pop_front() {
        let (mutation, ip) = kind(&job);
        let duplicate = batch.iter().any(|b| kind(b).1 == ip);
        if mutation == wanted && batch.len() < max.max(1) && !duplicate {
            batch.push(job);
        } else {
            rest.push_back(job);
        }
    }
    *pending = rest;
    batch
}

/// The lanes of every VM with work in progress.
pub struct Lanes {
    cloud: Arc<dyn CloudProvider>,
    metrics: Arc<Metrics>,
    lanes: Mutex<HashMap<InstanceId, Lane>>,
    parallel: Arc<Semaphore>,
    window: Duration,
    call_deadline: Duration,
    next_id: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Lanes {
    /// Lanes over `cloud`, with at most `parallel_nodes` cloud calls in flight at once. An idle
    /// lane that receives work waits `coalesce_window` before its first call, so IPs created
    /// together (but reconciled a few milliseconds apart) share that call.
    pub fn new(
        cloud: Arc<dyn CloudProvider>,
        metrics: Arc<Metrics>,
        parallel_nodes: usize,
        coalesce_window: Duration,
    ) -> Self {
        Self {
            cloud,
            metrics,
            lanes: Mutex::new(HashMap::new()),
            parallel: Arc::new(Semaphore::new(parallel_nodes.max(1))),
            window: coalesce_window,
            call_deadline: DEFAULT_CALL_DEADLINE,
            next_id: AtomicU64::new(0),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// Gives up on a cloud call after `deadline`: its IPs fail with a retryable error and the
    /// lane moves on. The provider's own retries and confirmation polls all count against it.
    #[must_use]
    pub fn with_call_deadline(mut self, deadline: Duration) -> Self {
        self.call_deadline = deadline;
        self
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<InstanceId, Lane>> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many IPs wait for a cloud call, over all VMs.
    pub fn queued(&self) -> usize {
        self.lanes().values().map(|l| l.pending.len()).sum()
    }

    /// Applies `mutation` of `ip` on `target`, batched with whatever else is queued for the VM.
    pub async fn submit(
        self: &Arc<Self>,
        target: &NodeTarget,
        mutation: Mutation,
        ip: IpAddr,
    ) -> Result<(), CloudError> {
        let (reply, result) = oneshot::channel();
        let job = Job {
            mutation,
            ip,
            reply,
        };
        let start_lane = {
            let mut lanes = self.lanes();
            match lanes.get_mut(&target.instance) {
                Some(lane) => {
                    lane.pending.push_back(job);
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
            let handle = tokio::spawn(guard.drain());
            let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
            tasks.retain(|t| !t.is_finished());
            tasks.push(handle.abort_handle());
        }
        result
            .await
            .unwrap_or_else(|_| Err(CloudError::retryable("the cloud call was abandoned")))
    }

    /// Runs the lane `id` of `instance` until nothing is pending, one call at a time; `true`
    /// once it removed its lane from the map itself.
    async fn drain(&self, instance: &InstanceId, id: u64) -> bool {
        let needs = self.cloud.needs();
        // Only the lane's first call waits: later batches already gather during the call before.
        if !self.window.is_zero() {
            tokio::time::sleep(self.window).await;
        }
        loop {
            // Let reconcilers woken by the same burst of events queue up before the first call.
            tokio::task::yield_now().await;
            let Ok(permit) = Arc::clone(&self.parallel).acquire_owned().await else {
                return false;
            };
            let (target, batch) = {
                let mut lanes = self.lanes();
                let Some(lane) = lanes.get_mut(instance).filter(|l| l.id == id) else {
                    return true;
                };
                let batch = take_batch(&mut lane.pending, needs.max_batch, |j: &Job| {
                    (j.mutation, j.ip)
                });
                if batch.is_empty() {
                    // Removed under the lock, so a concurrent submit starts a fresh lane.
                    lanes.remove(instance);
                    return true;
                }
                (lane.target.clone(), batch)
            };
            let Some(mutation) = batch.first().map(|j| j.mutation) else {
                continue;
            };
            let ips: Vec<IpAddr> = batch.iter().map(|j| j.ip).collect();
            let started = Instant::now();
            let result = self.call(needs.name, mutation, &target, &ips).await;
            drop(permit);
            self.metrics
                .cloud_call(needs.name, mutation.as_str(), started.elapsed(), &result);
            self.metrics
                .cloud_ips(needs.name, mutation.as_str(), ips.len());
            deliver(batch, result);
        }
    }

    /// One cloud call, bounded by the deadline; a panic or an expired deadline becomes a
    /// retryable error, since the change may or may not have been made.
    async fn call(
        &self,
        provider: &'static str,
        mutation: Mutation,
        target: &NodeTarget,
        ips: &[IpAddr],
    ) -> Result<BatchOutcome, CloudError> {
        let call = async {
            match mutation {
                Mutation::Attach => self.cloud.attach(target, ips).await,
                Mutation::Detach => self.cloud.detach(target, ips).await,
            }
        };
        // Nothing the lane owns is inside the call: a panic there cannot leave it half-updated.
        let guarded = AssertUnwindSafe(call).catch_unwind();
        let node = &target.node_name;
        let operation = mutation.as_str();
        match tokio::time::timeout(self.call_deadline, guarded).await {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => {
                let what = panic_message(panic.as_ref());
                tracing::error!(%node, operation, panic = what, "cloud provider panicked; failing the batch and keeping the lane");
                self.metrics.call_aborted(provider, operation, "panic");
                Err(CloudError::retryable(format!(
                    "the {provider} provider failed unexpectedly during the {operation}; \
                     the change may or may not have been made"
                )))
            }
            Err(_) => {
                let deadline = self.call_deadline;
                tracing::warn!(%node, operation, ?deadline, "cloud call exceeded its deadline; abandoning it");
                self.metrics.call_aborted(provider, operation, "deadline");
                Err(CloudError::retryable(format!(
                    "no answer from the cloud to the {operation} within {}s; \
                     the change may or may not have been made",
                    deadline.as_secs_f64()
                )))
            }
        }
    }

    /// Aborts every lane task (the controller is being torn down); their callers see an error.
    pub fn abort_all(&self) {
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

fn deliver(batch: Vec<Job>, result: Result<BatchOutcome, CloudError>) {
    for job in batch {
        let own = match &result {
            Ok(outcome) => outcome.error_for(job.ip).cloned().map_or(Ok(()), Err),
            Err(e) => Err(e.clone()),
        };
        // The caller may have been cancelled; its object will be re-read and retried.
        let _ = job.reply.send(own);
    }
}

/// Aborts the lanes' tasks when dropped, so a torn-down controller leaves no call running.
pub struct AbortOnDrop(pub Arc<Lanes>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::ErrorKind;
    use crate::cloud::memory::{FaultAction, MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn batches_take_the_oldest_kind_up_to_the_limit() {
        use Mutation::*;
        let mut pending: VecDeque<(Mutation, IpAddr)> = [
            (Detach, ip("10.0.0.1")),
            (Attach, ip("10.0.0.2")),
            (Detach, ip("10.0.0.3")),
            (Detach, ip("10.0.0.4")),
            (Detach, ip("10.0.0.1")),
        ]
        .into();
        let batch = take_batch(&mut pending, 2, |j| *j);
        assert_eq!(
            batch,
            vec![(Detach, ip("10.0.0.1")), (Detach, ip("10.0.0.3"))]
        );
        let batch = take_batch(&mut pending, 10, |j| *j);
        assert_eq!(batch, vec![(Attach, ip("10.0.0.2"))]);
        let batch = take_batch(&mut pending, 10, |j| *j);
        assert_eq!(
            batch,
            vec![(Detach, ip("10.0.0.4")), (Detach, ip("10.0.0.1"))]
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
        let lanes = Arc::new(Lanes::new(
            Arc::new(cloud.clone()),
            Arc::new(Metrics::default()),
            8,
            Duration::ZERO,
        ));
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
        let lanes = Arc::new(Lanes::new(
            Arc::new(cloud.clone()),
            Arc::new(Metrics::default()),
            8,
            Duration::ZERO,
        ));
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
        let lanes = Arc::new(Lanes::new(
            Arc::new(cloud.clone()),
            Arc::new(Metrics::default()),
            8,
            Duration::from_millis(30),
        ));
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
        let lanes = Arc::new(Lanes::new(
            Arc::new(cloud.clone()),
            Arc::new(Metrics::default()),
            8,
            Duration::ZERO,
        ));
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
    async fn the_call_deadline_is_configurable() {
        let (cloud, _, target) = lanes_over(Duration::ZERO).await;
        let lanes = Arc::new(
            Lanes::new(
                Arc::new(cloud.clone()),
                Arc::new(Metrics::default()),
                8,
                Duration::ZERO,
            )
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
}
