//! Leader election on upstream's Lease, with client-go's semantics and its guarantee: a leader
//! that cannot renew stops acting before the Lease can expire for anyone else.
//!
//! - Standbys read the Lease every retry period and take it once they have seen it unchanged for
//!   its `leaseDurationSeconds` by their own clock ([`record::standby`]). Every write is a replace
//!   carrying the resourceVersion it was decided on, so of two replicas racing for the Lease one
//!   gets a conflict and goes back to waiting.
//! - The leader renews every retry period. Each renewal it sees succeed opens the [`Fence`] until
//!   the instant it sent that renewal plus the renew deadline, by its own monotonic clock. A
//!   standby's wait starts no earlier than that instant (it starts when the standby reads the
//!   renewed Lease), so the fence closes `lease - renew_deadline` before any standby may take
//!   over, whatever the timestamps in the Lease say and wherever the leader is cut off.
//! - A clean exit hands the Lease back as client-go's `ReleaseOnCancel` does (holder cleared,
//!   `leaseDurationSeconds: 1`), after closing the fence; standbys watch the Lease between reads,
//!   so one takes over within a round trip.
//! - The identity is the pod name. A process of the same pod restarted while its Lease is still
//!   held takes it back at once: see [`site`] for why that is safe.
//!
//! The fields are upstream's (holderIdentity, leaseDurationSeconds, acquireTime, renewTime,
//! leaseTransitions), so an upstream replica stays passive while we lead and vice versa.

pub mod record;
pub(crate) mod site;

use std::collections::BTreeMap;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::engine::fence::{Fence, FenceKeeper};
use record::{Candidate, Observed, PROCESS_ANNOTATION, Process, Record, Timings, Verdict};
use site::SiteLock;

/// Upstream's Lease name: holding it keeps an upstream replica passive during a migration.
pub const LEASE_NAME: &str = "cloud-network-config-controller-lock";

/// The identity to hold the Lease under: the pod name (`POD_NAME` from the downward API, else the
/// host name, which Kubernetes sets to the pod name), else `fallback`. Stable across restarts of
/// the pod's container, so a restarted process recognises its own Lease.
pub(crate) fn identity(pod_name: Option<&str>, hostname: Option<&str>, fallback: &str) -> String {
    [pod_name, hostname]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|name| !name.is_empty())
        .unwrap_or(fallback)
        .to_owned()
}

/// Campaigns for the Lease.
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    timings: Timings,
    scope: String,
}

impl Elector {
    /// An elector for [`LEASE_NAME`] in `namespace` of the cluster at `cluster_url`.
    pub fn new(
        client: Client,
        cluster_url: &str,
        namespace: &str,
        identity: String,
        timings: Timings,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            scope: format!("{cluster_url}/{namespace}/{LEASE_NAME}/{identity}"),
            identity,
            timings,
        }
    }

    /// Returns once this process holds the Lease. API errors are logged and retried, as a
    /// standby has nothing better to do.
    pub async fn campaign(self) -> Leadership {
        let lock = SiteLock::acquire(&self.scope).await;
        let me = Candidate {
            identity: self.identity.clone(),
            process: Process {
                site: lock.site().to_owned(),
                nonce: format!("{:016x}", rand::random::<u64>()),
            },
        };
        let mut observed = None;
        let mut waiting_for = None;
        let mut failing = None;
        // Between reads, a watch of the Lease cuts the wait short when it is released, so a
        // clean exit hands over in a round trip rather than up to a retry period. It is optional:
        // OpenShift's network operator grants no watch on Leases, and then the reads alone decide.
        let mut watching = true;
        let fields = format!("metadata.name={LEASE_NAME}");
        let changes = watcher(self.api.clone(), watcher::Config::default().fields(&fields))
            .default_backoff()
            .applied_objects()
            .fuse();
        let mut changes = std::pin::pin!(changes);
        loop {
            let attempt = tokio::time::timeout(
                self.timings.renew_deadline,
                self.try_acquire(&me, &mut observed),
            );
            match attempt.await {
                Ok(Ok(Acquire::Held { lease, sent })) => {
                    let record = Record::of(&lease);
                    tracing::info!(
                        identity = %me.identity,
                        lease = LEASE_NAME,
                        transitions = record.transitions,
                        "became leader"
                    );
                    return Leadership::start(self, me, *lease, sent, lock);
                }
                Ok(Ok(Acquire::Waiting(holder))) => {
                    failing = None;
                    if waiting_for.as_ref() != Some(&holder) {
                        tracing::info!(%holder, lease = LEASE_NAME, "standing by: the lease is held");
                        waiting_for = Some(holder);
                    }
                }
                Ok(Ok(Acquire::Lost)) => failing = None,
                // Once per cause: an apiserver outage would otherwise log every retry period.
                Ok(Err(e)) => failing = report(failing, e.to_string()),
                Err(_) => failing = report(failing, "timed out".to_owned()),
            }
            tokio::select! {
                () = tokio::time::sleep(self.timings.retry) => {}
                () = released(&mut changes, &mut watching) => {}
            }
        }
    }

    async fn try_acquire(
        &self,
        me: &Candidate,
        observed: &mut Option<ElectionObserved>,
    ) -> Result<Acquire, kube::Error> {
        let Some(current) = self.api.get_opt(LEASE_NAME).await? else {
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            write_holder(&mut lease, me, &self.timings, Some(0));
            let sent = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(lease) => Ok(Acquire::Held {
                    lease: Box::new(lease),
                    sent,
                }),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Acquire::Lost),
                Err(e) => Err(e),
            };
        };
        let now = Instant::now();
        let previous = observed.take();
        let seen = election_fields(&current);
        let since = Observed::update(previous, seen, now);
        let unchanged_for = now.saturating_duration_since(since.since);
        *observed = Some(since);
        let record = Record::of(&current);
        match record::standby(&record, me, unchanged_for) {
            Verdict::Wait => Ok(Acquire::Waiting(record.holder)),
            Verdict::Take { transitions } => {
                let mut lease = current;
                write_holder(&mut lease, me, &self.timings, Some(transitions));
                let sent = Instant::now();
                match self
                    .api
                    .replace(LEASE_NAME, &PostParams::default(), &lease)
                    .await
                {
                    Ok(lease) => Ok(Acquire::Held {
                        lease: Box::new(lease),
                        sent,
                    }),
                    Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Acquire::Lost),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

/// Logs a failed read of the Lease as a warning when its cause differs from the previous one's,
/// and returns the cause to compare the next failure with.
fn report(previous: Option<String>, error: String) -> Option<String> {
    if previous.as_ref() == Some(&error) {
        tracing::debug!(%error, lease = LEASE_NAME, "reading the lease failed again");
    } else {
        tracing::warn!(%error, lease = LEASE_NAME, "reading the lease failed; retrying");
    }
    Some(error)
}

/// Resolves when `changes` shows the Lease with no holder. A watch refused as forbidden is
/// never polled again (`watching` turns false), with one log line.
async fn released<S>(changes: &mut std::pin::Pin<&mut S>, watching: &mut bool)
where
    S: Stream<Item = Result<Lease, watcher::Error>>,
{
    while *watching && let Some(change) = changes.next().await {
        match change {
            Ok(lease) if Record::of(&lease).holder.is_empty() => return,
            Ok(_) => {}
            Err(e) if forbidden(&e) => {
                tracing::info!(
                    lease = LEASE_NAME,
                    error = %e,
                    "the lease cannot be watched (forbidden): a released lease is seen at the \
                     next read, within one retry period"
                );
                *watching = false;
            }
            Err(_) => {}
        }
    }
    std::future::pending().await
}

/// Whether the watcher failed because the ServiceAccount may not list or watch.
fn forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.is_forbidden(),
        watcher::Error::WatchError(s) => s.is_forbidden(),
        _ => false,
    }
}

/// The Lease's election fields, and since when a standby has seen them unchanged.
type ElectionObserved = Observed<(Option<LeaseSpec>, Option<String>), Instant>;

enum Acquire {
    /// This process holds the Lease since the write sent at `sent`.
    Held { lease: Box<Lease>, sent: Instant },
    /// The Lease is held, by this identity.
    Waiting(String),
    /// Another replica wrote first.
    Lost,
}

/// What two reads of the Lease are compared on: the spec (client-go compares the record) and the
/// holder's process. Other writes (labels, the resourceVersion) do not restart a standby's wait.
fn election_fields(lease: &Lease) -> (Option<LeaseSpec>, Option<String>) {
    let process = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROCESS_ANNOTATION))
        .cloned();
    (lease.spec.clone(), process)
}

/// Writes `me` into `lease` as holder now. `transitions` is `Some` for an acquisition (which also
/// sets acquireTime), `None` for a renewal.
fn write_holder(lease: &mut Lease, me: &Candidate, timings: &Timings, transitions: Option<i32>) {
    let now = MicroTime(Timestamp::now());
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(me.identity.clone());
    spec.lease_duration_seconds = Some(timings.lease_seconds());
    spec.renew_time = Some(now.clone());
    if let Some(transitions) = transitions {
        spec.acquire_time = Some(now);
        spec.lease_transitions = Some(transitions);
    }
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(PROCESS_ANNOTATION.to_owned(), me.process.encode());
}

/// Writes the Lease free, as client-go's release does: no holder, `leaseDurationSeconds: 1`,
/// acquire and renew times now, transitions kept.
fn write_released(lease: &mut Lease) {
    let now = MicroTime(Timestamp::now());
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(String::new());
    spec.lease_duration_seconds = Some(1);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    if let Some(annotations) = lease.metadata.annotations.as_mut() {
        annotations.remove(PROCESS_ANNOTATION);
    }
}

/// This process leads: the renewals run in a task of their own until [`Self::release`] or until
/// the fence closes (a renewal missed the deadline, or another replica holds the Lease).
pub struct Leadership {
    fence: Fence,
    release: Option<oneshot::Sender<()>>,
    renewals: JoinHandle<()>,
    timings: Timings,
    // Held while this process lives: see [`site`].
    _lock: SiteLock,
}

impl Leadership {
    fn start(elector: Elector, me: Candidate, lease: Lease, sent: Instant, lock: SiteLock) -> Self {
        let timings = elector.timings;
        let (keeper, fence) = FenceKeeper::new(sent + timings.renew_deadline);
        let (release, released) = oneshot::channel();
        let holding = Holding {
            api: elector.api,
            me,
            timings,
            lease,
        };
        let renewals = tokio::spawn(holding.renew(keeper, sent, released));
        Self {
            fence,
            release: Some(release),
            renewals,
            timings,
            _lock: lock,
        }
    }

    /// The fence cloud calls must pass: open while this process leads by its own clock.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Stops renewing, closes the fence, and hands the Lease back so a standby takes over at
    /// once. Bounded by the renew deadline; a failure only means the standby waits for
    /// expiry.
    pub(crate) async fn release(mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
        let renewals = &mut self.renewals;
        if tokio::time::timeout(self.timings.renew_deadline, renewals)
            .await
            .is_err()
        {
            tracing::warn!(lease = LEASE_NAME, "releasing the lease timed out");
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.renewals.abort();
    }
}

/// The renewing side: the Lease as this process last wrote it.
struct Holding {
    api: Api<Lease>,
    me: Candidate,
    timings: Timings,
    lease: Lease,
}

impl Holding {
    async fn renew(
        mut self,
        keeper: FenceKeeper,
        acquired: Instant,
        mut released: oneshot::Receiver<()>,
    ) {
        let fence = keeper.fence();
        let mut next = acquired + self.timings.retry;
        loop {
            let step = tokio::select! {
                biased;
                Ok(()) = &mut released => Step::Release,
                () = fence.closed() => Step::Expired,
                step = self.step(&keeper, &mut next) => step,
            };
            match step {
                Step::Continue => {}
                Step::Release => {
                    keeper.close();
                    self.release().await;
                    return;
                }
                Step::Expired => {
                    tracing::warn!(
                        lease = LEASE_NAME,
                        renew_deadline = ?self.timings.renew_deadline,
                        "no renewal succeeded within the renew deadline: stepping down"
                    );
                    return;
                }
                Step::Taken(holder) => {
                    keeper.close();
                    tracing::warn!(%holder, lease = LEASE_NAME, "another replica holds the lease: stepping down");
                    return;
                }
            }
        }
    }

    /// Waits for the next renewal time, renews, and moves the fence on success.
    async fn step(&mut self, keeper: &FenceKeeper, next: &mut Instant) -> Step {
        tokio::time::sleep_until(*next).await;
        let sent = Instant::now();
        *next = sent + self.timings.retry;
        // Past the deadline this process no longer leads, whatever the answer says.
        match tokio::time::timeout_at(keeper.deadline(), self.renew_once()).await {
            Ok(Ok(Renewed::Yes)) => keeper.extend(sent + self.timings.renew_deadline),
            Ok(Ok(Renewed::No)) | Err(_) => {}
            Ok(Ok(Renewed::TakenBy(holder))) => return Step::Taken(holder),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, lease = LEASE_NAME, "renewing the lease failed");
            }
        }
        Step::Continue
    }

    /// One renewal: a replace carrying the resourceVersion of our last write. A conflict means
    /// someone else wrote; if the Lease is still this process's (our own write whose answer was
    /// lost, or a change of labels) the renewal is sent again on the new version.
    async fn renew_once(&mut self) -> Result<Renewed, kube::Error> {
        for _ in 0..2 {
            let mut lease = self.lease.clone();
            write_holder(&mut lease, &self.me, &self.timings, None);
            match self
                .api
                .replace(LEASE_NAME, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => {
                    self.lease = written;
                    return Ok(Renewed::Yes);
                }
                Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => {}
                Err(e) => return Err(e),
            }
            match self.api.get_opt(LEASE_NAME).await? {
                Some(current) if Record::of(&current).held_by(&self.me) => self.lease = current,
                Some(current) => return Ok(Renewed::TakenBy(Record::of(&current).holder)),
                None => return Ok(Renewed::TakenBy("nobody (the lease was deleted)".into())),
            }
        }
        Ok(Renewed::No)
    }

    /// Writes the Lease free if it is still this process's.
    async fn release(&mut self) {
        for _ in 0..2 {
            let mut lease = self.lease.clone();
            write_released(&mut lease);
            match self
                .api
                .replace(LEASE_NAME, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => {
                    tracing::info!(lease = LEASE_NAME, "released the lease");
                    return;
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => {}
                Err(e) => {
                    tracing::warn!(error = %e, lease = LEASE_NAME, "releasing the lease failed");
                    return;
                }
            }
            match self.api.get_opt(LEASE_NAME).await {
                Ok(Some(current)) if Record::of(&current).held_by(&self.me) => self.lease = current,
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(error = %e, lease = LEASE_NAME, "releasing the lease failed");
                    return;
                }
            }
        }
    }
}

enum Step {
    Continue,
    Release,
    Expired,
    Taken(String),
}

enum Renewed {
    Yes,
    /// Two conflicts in a row while the Lease stayed ours: try again next period.
    No,
    TakenBy(String),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_identity_is_the_pod_name_without_suffix() {
        let cases = [
            (Some("cncc-7d9f-abcde"), Some("host"), "cncc-7d9f-abcde"),
            (None, Some("cncc-7d9f-abcde"), "cncc-7d9f-abcde"),
            (Some(" "), Some("cncc-7d9f-abcde"), "cncc-7d9f-abcde"),
            (None, None, "cloud-network-config-controller"),
            (Some(""), Some(""), "cloud-network-config-controller"),
        ];
        for (pod, host, expected) in cases {
            assert_eq!(
                identity(pod, host, "cloud-network-config-controller"),
                expected,
                "{pod:?} {host:?}"
            );
        }
    }

    fn me() -> Candidate {
        Candidate {
            identity: "pod-a".into(),
            process: Process {
                site: "boot:net".into(),
                nonce: "n1".into(),
            },
        }
    }

    #[test]
    fn an_acquisition_writes_upstreams_fields_and_keeps_the_rest() {
        let timings = Timings::new(
            std::time::Duration::from_secs(15),
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs(2),
        )
        .unwrap();
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.into()),
                resource_version: Some("41".into()),
                labels: Some(BTreeMap::from([("keep".to_owned(), "me".to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("upstream-pod".into()),
                lease_duration_seconds: Some(137),
                lease_transitions: Some(4),
                strategy: Some("OldestEmulationVersion".into()),
                ..LeaseSpec::default()
            }),
        };
        write_holder(&mut lease, &me(), &timings, Some(5));
        let spec = lease.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("pod-a"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(5));
        assert!(spec.acquire_time.is_some() && spec.renew_time == spec.acquire_time);
        assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
        assert_eq!(lease.metadata.resource_version.as_deref(), Some("41"));
        assert!(Record::of(&lease).held_by(&me()));

        let acquired = spec.acquire_time;
        write_holder(&mut lease, &me(), &timings, None);
        assert_eq!(lease.spec.as_ref().unwrap().acquire_time, acquired);
        assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(5));

        write_released(&mut lease);
        let spec = lease.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(5));
        assert_eq!(Record::of(&lease).process, None);
        assert_eq!(lease.metadata.labels.unwrap()["keep"], "me");
    }

    #[tokio::test]
    async fn a_forbidden_watch_is_not_polled_again() {
        let forbidden = || {
            let status =
                kube::core::Status::failure("leases is forbidden", "Forbidden").with_code(403);
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(
                status.boxed(),
            )))
        };
        let polled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = polled.clone();
        let changes = futures::stream::repeat_with(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            forbidden()
        });
        let mut changes = std::pin::pin!(changes);
        let mut watching = true;
        for _ in 0..3 {
            let waited = tokio::time::timeout(
                std::time::Duration::from_millis(20),
                released(&mut changes, &mut watching),
            );
            assert!(
                waited.await.is_err(),
                "a forbidden watch reported a release"
            );
        }
        assert!(!watching);
        assert_eq!(polled.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
