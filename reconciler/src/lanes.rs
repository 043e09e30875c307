//! Per-node batching: one lane per VM, at most one mutating cloud call per lane at a time, and
//! everything that arrives for the VM while a call is in flight goes out together in the next one.
//!
//! Object reconcilers call [`Lanes::submit`] for one IP and await its own result; they never see
//! the batching. Different VMs proceed in parallel up to a bound, so one slow VM does not hold up
//! the others and a burst cannot open thousands of connections to the cloud.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, oneshot};
use tokio::task::AbortHandle;

use crate::cloud::{BatchOutcome, CloudError, CloudProvider, InstanceId, NodeTarget};
use crate::metrics::Metrics;

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
            tasks: Mutex::new(Vec::new()),
        }
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
                    false
                }
                None => {
                    lanes.insert(
                        target.instance.clone(),
                        Lane {
                            target: target.clone(),
                            pending: VecDeque::from([job]),
                        },
                    );
                    true
                }
            }
        };
        if start_lane {
            let me = Arc::clone(self);
            let instance = target.instance.clone();
            let handle = tokio::spawn(async move { me.drain(instance).await });
            let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
            tasks.retain(|t| !t.is_finished());
            tasks.push(handle.abort_handle());
        }
        result
            .await
            .unwrap_or_else(|_| Err(CloudError::retryable("the cloud call was abandoned")))
    }

    /// Runs the lane of `instance` until nothing is pending, one call at a time.
    async fn drain(self: Arc<Self>, instance: InstanceId) {
        let needs = self.cloud.needs();
        // Only the lane's first call waits: later batches already gather during the call before.
        if !self.window.is_zero() {
            tokio::time::sleep(self.window).await;
        }
        loop {
            // Let reconcilers woken by the same burst of events queue up before the first call.
            tokio::task::yield_now().await;
            let Ok(permit) = Arc::clone(&self.parallel).acquire_owned().await else {
                return;
            };
            let (target, batch) = {
                let mut lanes = self.lanes();
                let Some(lane) = lanes.get_mut(&instance) else {
                    return;
                };
                let batch = take_batch(&mut lane.pending, needs.max_batch, |j: &Job| {
                    (j.mutation, j.ip)
                });
                if batch.is_empty() {
                    // Removed under the lock, so a concurrent submit starts a fresh lane.
                    lanes.remove(&instance);
                    return;
                }
                (lane.target.clone(), batch)
            };
            let Some(mutation) = batch.first().map(|j| j.mutation) else {
                continue;
            };
            let ips: Vec<IpAddr> = batch.iter().map(|j| j.ip).collect();
            let started = Instant::now();
            let result = match mutation {
                Mutation::Attach => self.cloud.attach(&target, &ips).await,
                Mutation::Detach => self.cloud.detach(&target, &ips).await,
            };
            drop(permit);
            self.metrics
                .cloud_call(needs.name, mutation.as_str(), started.elapsed(), &result);
            self.metrics
                .cloud_ips(needs.name, mutation.as_str(), ips.len());
            deliver(batch, result);
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
    use crate::cloud::memory::{MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};

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
}
