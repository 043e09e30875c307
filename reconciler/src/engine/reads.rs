//! Reads of VMs' interfaces, gathered across VMs: every read the engine needs (a VM with no
//! view, the drift period's refresh) joins one queue, and the queue goes out in as few
//! [`CloudProvider::egress_configs`] calls as the provider's [`ProviderNeeds::max_read_batch`]
//! allows. At start-up or after a leader change every node asks for its VM at once: a thousand
//! nodes are then one or two list calls, not a thousand reads at the provider's pace.
//!
//! Gathering works like the lanes' ([`crate::engine::lanes`]): once a read is queued, the queue
//! keeps gathering until no read has arrived for the quiet gap, the oldest has waited the bound,
//! or a full call is waiting; reads that arrive while calls are under way wait for the next
//! round. A provider that reads one VM at a time (`max_read_batch` 1) gains nothing from
//! waiting: each read then goes out at once, on its own.
//!
//! Each VM gets its own answer: a VM missing from a list answer fails alone, and a call that
//! fails as a whole fails each of its VMs with the call's error (the asker retries as it would
//! any failed read).
//!
//! [`ProviderNeeds::max_read_batch`]: crate::cloud::ProviderNeeds::max_read_batch

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::{FutureExt, StreamExt};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::cloud::{CloudError, CloudProvider, InstanceId, NodeEgress, NodeTarget};
use crate::engine::lanes::Gather;
use crate::metrics::Metrics;

/// How many list calls of one round run at once (a round larger than one call's worth of VMs).
const CALLS_IN_FLIGHT: usize = 4;

/// One VM's answer.
type Answer = Result<NodeEgress, CloudError>;

/// A read waiting in the queue.
struct Asked {
    target: NodeTarget,
    arrived: Instant,
    reply: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Asked>,
    /// When the latest read arrived, for the quiet gap that ends gathering.
    last_arrival: Option<Instant>,
    /// The task sending the queue's calls, while there is one.
    task: Option<AbortHandle>,
}

struct Inner {
    cloud: Arc<dyn CloudProvider>,
    metrics: Arc<Metrics>,
    gather: Gather,
    queue: Mutex<Queue>,
}

/// The engine's reads of VMs' interfaces, gathered into list calls.
pub(crate) struct Reads {
    inner: Arc<Inner>,
}

impl Reads {
    /// Reads over `cloud`, gathering as `gather` says.
    pub(crate) fn new(
        cloud: Arc<dyn CloudProvider>,
        metrics: Arc<Metrics>,
        gather: Gather,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                cloud,
                metrics,
                gather,
                queue: Mutex::default(),
            }),
        }
    }

    /// The cloud the reads go to.
    pub(crate) fn cloud(&self) -> &Arc<dyn CloudProvider> {
        &self.inner.cloud
    }

    /// The same reads, gathering as `gather` says.
    pub(crate) fn gathering(self, gather: Gather) -> Self {
        Self::new(
            Arc::clone(&self.inner.cloud),
            Arc::clone(&self.inner.metrics),
            gather,
        )
    }

    /// Reads `target`'s VM, in a call shared with the other reads gathered meanwhile.
    pub(crate) async fn read(&self, target: &NodeTarget) -> Answer {
        let mut answers = self.read_all(std::slice::from_ref(target)).await;
        answers.pop().unwrap_or_else(|| Err(abandoned()))
    }

    /// Reads every VM of `targets` (one answer each, in order), in as few calls as the provider
    /// allows, shared with the other reads gathered meanwhile.
    pub(crate) async fn read_all(&self, targets: &[NodeTarget]) -> Vec<Answer> {
        if self.inner.cloud.needs().max_read_batch <= 1 {
            // Nothing to gather for: each read goes out at once, as many at a time as the
            // provider's default allows.
            return self.inner.call(targets).await;
        }
        let replies = self.enqueue(targets);
        futures::future::join_all(
            replies
                .into_iter()
                .map(|reply| async { reply.await.unwrap_or_else(|_| Err(abandoned())) }),
        )
        .await
    }

    fn enqueue(&self, targets: &[NodeTarget]) -> Vec<oneshot::Receiver<Answer>> {
        let now = Instant::now();
        let mut queue = self.inner.queue();
        let replies = targets
            .iter()
            .map(|target| {
                let (reply, answer) = oneshot::channel();
                queue.pending.push(Asked {
                    target: target.clone(),
                    arrived: now,
                    reply,
                });
                answer
            })
            .collect();
        queue.last_arrival = Some(now);
        if queue.task.is_none() {
            let sender = Sender {
                inner: Arc::clone(&self.inner),
                finished: false,
            };
            queue.task = Some(tokio::spawn(sender.run()).abort_handle());
        }
        replies
    }
}

impl Drop for Reads {
    fn drop(&mut self) {
        // No read of a torn-down engine keeps running.
        if let Some(task) = self.inner.queue().task.take() {
            task.abort();
        }
    }
}

impl Inner {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits while reads keep arriving, within the gathering bounds, then takes the queue;
    /// `None` once it is empty (the task then ends, and the next read starts a new one).
    async fn next_round(&self) -> Option<Vec<Asked>> {
        let max = self.cloud.needs().max_read_batch;
        loop {
            let until = {
                let mut queue = self.queue();
                let oldest = queue.pending.first().map(|a| a.arrived)?;
                let last = queue.last_arrival.unwrap_or(oldest);
                let until = (last + self.gather.quiet).min(oldest + self.gather.max);
                if queue.pending.len() >= max || Instant::now() >= until {
                    return Some(std::mem::take(&mut queue.pending));
                }
                until
            };
            tokio::time::sleep_until(until).await;
        }
    }

    /// Sends one round: each VM once, in calls of at most `max_read_batch` VMs, and answers
    /// every asker of each VM.
    async fn send(&self, round: Vec<Asked>) {
        let mut askers: HashMap<InstanceId, Vec<oneshot::Sender<Answer>>> = HashMap::new();
        let mut targets = Vec::new();
        for asked in round {
            let waiting = askers.entry(asked.target.instance.clone()).or_default();
            if waiting.is_empty() {
                targets.push(asked.target);
            }
            waiting.push(asked.reply);
        }
        let answers = self.call(&targets).await;
        for (target, answer) in targets.iter().zip(answers) {
            for reply in askers.remove(&target.instance).into_iter().flatten() {
                // The asker may have been cancelled; it reads again when asked again.
                let _ = reply.send(answer.clone());
            }
        }
    }

    /// Reads `targets` in calls of at most `max_read_batch` VMs, a few calls at a time; counts
    /// each call, each VM read and each VM's failure.
    async fn call(&self, targets: &[NodeTarget]) -> Vec<Answer> {
        let needs = self.cloud.needs();
        let size = needs.max_read_batch.max(1);
        let calls: Vec<_> = targets
            .chunks(size)
            .map(|chunk| self.call_once(needs.name, chunk))
            .collect();
        let answers: Vec<Vec<Answer>> = futures::stream::iter(calls)
            .buffered(if size == 1 {
                crate::cloud::PER_VM_READS
            } else {
                CALLS_IN_FLIGHT
            })
            .collect()
            .await;
        answers.into_iter().flatten().collect()
    }

    /// One read call: `egress_config` for a provider that reads one VM at a time, else one
    /// `egress_configs` call, whatever the number of VMs (so that each counts as one list call).
    async fn call_once(&self, provider: &'static str, chunk: &[NodeTarget]) -> Vec<Answer> {
        let started = Instant::now();
        let (operation, answers) = match chunk {
            [one] if self.cloud.needs().max_read_batch <= 1 => (
                "egress_config",
                AssertUnwindSafe(self.cloud.egress_config(one))
                    .catch_unwind()
                    .await
                    .map(|answer| vec![answer]),
            ),
            _ => (
                "egress_configs",
                AssertUnwindSafe(self.cloud.egress_configs(chunk))
                    .catch_unwind()
                    .await,
            ),
        };
        let mut answers = answers.unwrap_or_else(|_| {
            tracing::error!(
                provider,
                vms = chunk.len(),
                "a cloud read panicked; failing its VMs"
            );
            Vec::new()
        });
        // A provider that answers fewer VMs than asked leaves the rest unread.
        answers.resize_with(chunk.len(), || {
            Err(CloudError::retryable(
                "the cloud gave no answer for this VM",
            ))
        });
        self.metrics.cloud_call(
            provider,
            operation,
            started.elapsed(),
            &Ok::<(), CloudError>(()),
        );
        for (target, answer) in chunk.iter().zip(&answers) {
            self.metrics.cloud_read(provider);
            if let Err(e) = answer {
                tracing::debug!(node = %target.node_name, instance = %target.instance, error = %e, "cloud read failed");
                self.metrics.cloud_error(provider, "egress_config", e);
            }
        }
        answers
    }
}

/// The answer to a read whose round was dropped (the engine is being torn down).
fn abandoned() -> CloudError {
    CloudError::retryable("the cloud read for this VM was abandoned; it will be retried")
}

/// Owns the queue's sending task. Should the task end before the queue is empty (it was
/// aborted), the queue's reads are dropped, so their askers get an error instead of waiting
/// forever, and the next read starts a new task.
struct Sender {
    inner: Arc<Inner>,
    finished: bool,
}

impl Sender {
    async fn run(mut self) {
        loop {
            let Some(round) = self.inner.next_round().await else {
                let mut queue = self.inner.queue();
                // Checked again under the lock: a read queued since keeps the task going.
                if queue.pending.is_empty() {
                    queue.task = None;
                    self.finished = true;
                    return;
                }
                continue;
            };
            self.inner.send(round).await;
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if !self.finished {
            let mut queue = self.inner.queue();
            queue.pending.clear();
            queue.task = None;
        }
    }
}
