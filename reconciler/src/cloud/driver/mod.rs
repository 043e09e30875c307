//! The one cloud driver: the optimistic read / precheck / write / retry loop every provider's
//! change goes through, the retried read, backoff with jitter, de-duplication and "gone is
//! success". These are the riskiest rules of the project, so they live once; a provider only
//! says how to read its interface, describe it, precheck a change and write it
//! ([`Interface`]), and how its cloud's errors map onto [`CloudError`].
//!
//! The rules, for every cloud:
//! - a change is de-duplicated before anything is sent;
//! - a change starts from the state remembered from our last answer when the engine's view is
//!   current (no read), else from a read;
//! - a conflict (stale etag, fingerprint or revision) re-reads at once and tries again;
//! - a throttled or transient failure waits (the cloud's `Retry-After` when it sent one, else
//!   exponential backoff with jitter), re-reads (the failed call may still have happened) and
//!   tries again, within the retry policy's attempts;
//! - a refusal (permanent, or not found) of a change computed from a remembered state is re-read
//!   once before it is believed: the memory may be what the cloud refused;
//! - a VM or interface that is gone holds none of the IPs: a change that only removes is then a
//!   success with no view;
//! - an addition the interface already holds is done only when it is ours ([`Change::ours`]);
//!   any other, the node's own addresses ([`NodeEgress::primary`]) to add or to remove, refuse
//!   the change before any write ([`foreign`]), after a fresh read like any refusal.

mod batch;
mod cache;

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};

pub use batch::Answers;
pub use cache::Memo;

/// How long a subnet's ranges are reused: every attach batch needs them, and a cloud can add to
/// them later (an IPv6 CIDR on an AWS or Azure subnet, a secondary range on a GCP subnetwork), which
/// the node annotation should show without a restart.
pub const SUBNET_TTL: Duration = Duration::from_secs(300);

use super::pace::TokenBucket;
use super::{Change, CloudError, ErrorKind, NodeEgress};

/// How hard a provider retries one read or one change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// First backoff after a throttled or transient failure.
    pub min_delay: Duration,
    /// Backoff cap.
    pub max_delay: Duration,
    /// Attempts per read or change, the first included.
    pub max_attempts: usize,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_attempts: 8,
        }
    }
}

impl Retry {
    /// Delays doubling from `min_delay` up to `max_delay`, for `max_attempts` attempts.
    pub const fn new(min_delay: Duration, max_delay: Duration, max_attempts: usize) -> Self {
        Self {
            min_delay,
            max_delay,
            max_attempts,
        }
    }

    /// The waits between attempts: exponential, capped, with jitter so that nodes failing
    /// together do not retry together.
    pub fn backoff(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.max_attempts.saturating_sub(1))
            .with_jitter()
            .build()
    }
}

/// Whether `error` is worth trying again soon.
pub fn is_transient(error: &CloudError) -> bool {
    matches!(
        error.kind,
        ErrorKind::Throttled | ErrorKind::Retryable | ErrorKind::Conflict
    )
}

/// How long to wait before the next attempt after `error`, or `None` when it is not retried or
/// the attempts are spent. A conflict is retried at once: the state moved, the cloud is fine.
fn next_wait(error: &CloudError, backoff: &mut impl Iterator<Item = Duration>) -> Option<Duration> {
    if !is_transient(error) {
        return None;
    }
    let delay = backoff.next()?;
    Some(match error.kind {
        ErrorKind::Conflict => Duration::ZERO,
        _ => error.retry_after.unwrap_or(delay),
    })
}

/// A conflict the attempts could not resolve reaches the engine as a transient failure.
fn settled(error: CloudError) -> CloudError {
    if error.kind == ErrorKind::Conflict {
        CloudError {
            kind: ErrorKind::Retryable,
            ..error
        }
    } else {
        error
    }
}

/// One read, retried while throttled or failing transiently; `what` names it in logs.
pub async fn read<T, F, Fut>(retry: &Retry, what: &str, mut call: F) -> Result<T, CloudError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CloudError>>,
{
    let mut backoff = retry.backoff();
    loop {
        let error = match call().await {
            Ok(answer) => return Ok(answer),
            Err(e) => e,
        };
        let Some(delay) = next_wait(&error, &mut backoff) else {
            return Err(settled(error));
        };
        tracing::debug!(what, %error, ?delay, "retrying a cloud read");
        tokio::time::sleep(delay).await;
    }
}

/// `call` once `bucket` lets it start; a throttled answer empties the bucket, so that every
/// caller of the API slows down, not only this one.
pub async fn paced<T>(
    bucket: &TokenBucket,
    call: impl Future<Output = Result<T, CloudError>>,
) -> Result<T, CloudError> {
    bucket.acquire().await;
    let result = call.await;
    if let Err(e) = &result
        && e.kind == ErrorKind::Throttled
    {
        bucket.drain();
    }
    result
}

/// `ips` without repeats, in their first order.
pub fn dedup(ips: &[IpAddr]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(ips.len());
    for ip in ips {
        if !out.contains(ip) {
            out.push(*ip);
        }
    }
    out
}

/// What of `change` is still to be done on an interface that looks like `view`.
pub fn outstanding(view: &NodeEgress, change: &Change) -> Change {
    Change::new(
        change
            .add
            .iter()
            .copied()
            .filter(|ip| !view.holds(*ip))
            .collect(),
        change
            .remove
            .iter()
            .copied()
            .filter(|ip| view.holds(*ip))
            .collect(),
    )
}

/// Refuses `change` on an interface that looks like `view` when it would take over an address
/// this controller did not attach (an addition already there and not [`Change::ours`]), take
/// the node's own address as an egress IP, or detach the node's own address. The message names
/// the first such address and the interface.
pub fn foreign(view: &NodeEgress, change: &Change) -> Result<(), CloudError> {
    let iface = &view.interface;
    if let Some(ip) = change.remove.iter().find(|ip| view.primary.contains(ip)) {
        return Err(CloudError::foreign(format!(
            "{ip} is the node's own address on interface {iface}; it is never detached"
        )));
    }
    if let Some(ip) = change.add.iter().find(|ip| view.primary.contains(ip)) {
        return Err(CloudError::foreign(format!(
            "{ip} is the node's own address on interface {iface}; it cannot be an egress IP"
        )));
    }
    if let Some(ip) = change
        .add
        .iter()
        .find(|ip| view.holds(**ip) && !change.ours.contains(ip))
    {
        return Err(CloudError::foreign(format!(
            "{ip} is already on interface {iface} and this controller did not attach it \
             (another controller or tool did); it is left alone, neither taken over nor detached"
        )));
    }
    Ok(())
}

/// What a write did.
#[derive(Clone, Debug)]
pub enum Written<S> {
    /// Nothing needed sending: the state as it was.
    Unchanged,
    /// The cloud took the change: the state afterwards.
    Changed(S),
}

/// One VM's interface in one cloud, as the driver needs it. A provider implements it on a
/// handle naming the VM for one change.
#[async_trait]
pub trait Interface: Send + Sync {
    /// The cloud's own state of the interface (a NIC with its etag, a port with its revision),
    /// which a write starts from.
    type State: Send + Sync;

    /// Reads the interface now; `last` is the state a failed write started from, if any (a
    /// provider may read only what can have changed since).
    async fn read(&self, last: Option<&Self::State>) -> Result<Self::State, CloudError>;

    /// The engine's view of `state`.
    async fn describe(&self, state: &Self::State) -> Result<NodeEgress, CloudError>;

    /// Refuses, before any call, what the cloud would refuse of `todo` (the part of the change
    /// not yet in effect on `view`).
    fn precheck(
        &self,
        state: &Self::State,
        view: &NodeEgress,
        todo: &Change,
    ) -> Result<(), CloudError> {
        let _ = (state, view, todo);
        Ok(())
    }

    /// Sends `change` (de-duplicated) over `state`, in as few calls as the API allows, not
    /// retrying: the driver does.
    async fn write(
        &self,
        state: &Self::State,
        change: &Change,
    ) -> Result<Written<Self::State>, CloudError>;

    /// The remembered state is spent: a write failed and may or may not have happened.
    fn forget(&self) {}
}

/// [`apply`], for a provider that answers with the view alone.
pub async fn change<I: Interface>(
    iface: &I,
    node: &str,
    retry: &Retry,
    change: &Change,
    remembered: Option<I::State>,
) -> Result<Option<NodeEgress>, CloudError> {
    let done = apply(iface, node, retry, change, remembered).await?;
    Ok(done.map(|(_, view)| view))
}

/// Applies `change` to `iface` (`node`'s, named in logs), starting from `remembered` (the state
/// from our last answer, when the engine's view is current) or from a read. `Ok(None)` when the
/// VM or its interface is gone and the change only removes.
pub async fn apply<I: Interface>(
    iface: &I,
    node: &str,
    retry: &Retry,
    change: &Change,
    remembered: Option<I::State>,
) -> Result<Option<(I::State, NodeEgress)>, CloudError> {
    let mut change = Change {
        add: dedup(&change.add),
        remove: dedup(&change.remove),
        ours: change.ours.clone(),
        read_lately: change.read_lately,
    };
    let only_removes = change.add.is_empty();
    let gone = |error: &CloudError| {
        tracing::info!(
            node,
            reason = %error,
            "VM or its interface gone: its IPs count as detached"
        );
    };
    // A read that finds the VM or its interface gone ends a change that only removes.
    let read = async |last: Option<&I::State>| match iface.read(last).await {
        Ok(state) => Ok(Some(state)),
        Err(e) if e.kind == ErrorKind::NotFound && only_removes => {
            gone(&e);
            Ok(None)
        }
        Err(e) => Err(settled(e)),
    };
    let (mut state, mut fresh) = match remembered {
        Some(state) => (state, false),
        None => match read(None).await? {
            Some(state) => (state, true),
            None => return Ok(None),
        },
    };
    let mut backoff = retry.backoff();
    loop {
        let view = iface.describe(&state).await.map_err(settled)?;
        let todo = outstanding(&view, &change);
        let checked = foreign(&view, &change).and_then(|()| iface.precheck(&state, &view, &todo));
        let attempt = match checked {
            Ok(()) => {
                // Sent: whatever it added may be on the interface now, by our hand, however
                // the call ended, and is ours when the next attempt finds it there.
                let sent = iface.write(&state, &change).await;
                if sent.is_err() {
                    change.ours.clone_from(&change.add);
                }
                sent
            }
            Err(e) => Err(e),
        };
        let error = match attempt {
            Ok(Written::Unchanged) => return Ok(Some((state, view))),
            Ok(Written::Changed(after)) => {
                let view = iface.describe(&after).await.map_err(settled)?;
                return Ok(Some((after, view)));
            }
            Err(e) => e,
        };
        iface.forget();
        match error.kind {
            ErrorKind::NotFound if only_removes => {
                gone(&error);
                return Ok(None);
            }
            // A refusal of a change computed from a remembered state may be the memory's fault.
            ErrorKind::Permanent | ErrorKind::NotFound | ErrorKind::Foreign if !fresh => {
                tracing::debug!(node, %error, "refused from a remembered state; reading again");
            }
            _ => {
                let Some(delay) = next_wait(&error, &mut backoff) else {
                    return Err(settled(error));
                };
                tracing::debug!(node, %error, ?delay, "change failed; reading again before retrying");
                tokio::time::sleep(delay).await;
            }
        }
        state = match read(Some(&state)).await? {
            Some(state) => state,
            None => return Ok(None),
        };
        fresh = true;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::time::Instant;

    use super::*;

    /// A cloud of one interface guarded by a version, whose next writes fail as scripted.
    #[derive(Default)]
    struct Toy {
        /// The interface: its version and addresses.
        interface: Mutex<(u64, Vec<IpAddr>)>,
        /// Whether the VM is gone.
        gone: bool,
        /// Failures of the next writes, in order.
        failures: Mutex<VecDeque<CloudError>>,
        reads: AtomicUsize,
        /// The changes the cloud was sent, as sent.
        sent: Mutex<Vec<Change>>,
    }

    #[async_trait]
    impl Interface for Toy {
        type State = (u64, Vec<IpAddr>);

        async fn read(&self, _: Option<&Self::State>) -> Result<Self::State, CloudError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            if self.gone {
                return Err(CloudError::not_found("no such VM"));
            }
            Ok(self.interface.lock().unwrap().clone())
        }

        async fn describe(&self, state: &Self::State) -> Result<NodeEgress, CloudError> {
            Ok(NodeEgress {
                addresses: state.1.clone(),
                ..NodeEgress::default()
            })
        }

        fn precheck(
            &self,
            _: &Self::State,
            _: &NodeEgress,
            todo: &Change,
        ) -> Result<(), CloudError> {
            match todo.add.iter().find(|ip| ip.is_ipv6()) {
                Some(ip) => Err(CloudError::permanent(format!("{ip}: no IPv6 here"))),
                None => Ok(()),
            }
        }

        async fn write(
            &self,
            state: &Self::State,
            change: &Change,
        ) -> Result<Written<Self::State>, CloudError> {
            if change.is_empty() {
                return Ok(Written::Unchanged);
            }
            self.sent.lock().unwrap().push(change.clone());
            if let Some(error) = self.failures.lock().unwrap().pop_front() {
                return Err(error);
            }
            let mut interface = self.interface.lock().unwrap();
            if interface.0 != state.0 {
                return Err(CloudError::conflict("stale version (412)"));
            }
            interface.0 += 1;
            interface.1.retain(|ip| !change.remove.contains(ip));
            interface
                .1
                .extend(change.add.iter().filter(|ip| !state.1.contains(ip)));
            Ok(Written::Changed(interface.clone()))
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn add(ips: &[IpAddr]) -> Change {
        Change::new(ips.to_vec(), Vec::new())
    }

    fn toy(failures: impl IntoIterator<Item = CloudError>) -> Toy {
        Toy {
            failures: Mutex::new(failures.into_iter().collect()),
            ..Toy::default()
        }
    }

    const RETRY: Retry = Retry {
        min_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
        max_attempts: 4,
    };

    #[tokio::test(start_paused = true)]
    async fn a_conflict_rereads_and_succeeds_without_waiting() {
        let cloud = toy([]);
        // Someone else changed the interface since we remembered it.
        let remembered = cloud.interface.lock().unwrap().clone();
        cloud.interface.lock().unwrap().0 = 7;
        let started = Instant::now();
        let (_, view) = apply(&cloud, "toy", &RETRY, &add(&[ip(5)]), Some(remembered))
            .await
            .unwrap()
            .unwrap();
        assert!(view.holds(ip(5)));
        assert_eq!(
            cloud.sent.lock().unwrap().len(),
            2,
            "the stale write, then one more"
        );
        assert_eq!(cloud.reads.load(Ordering::SeqCst), 1);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_with_growing_jittered_waits_then_given_up() {
        let cloud = toy([CloudError::retryable("503"), CloudError::retryable("503")]);
        let started = Instant::now();
        apply(&cloud, "toy", &RETRY, &add(&[ip(5)]), None)
            .await
            .unwrap()
            .unwrap();
        // Two waits: 100 ms then 200 ms, each with up to 100% jitter added.
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited <= Duration::from_millis(600), "{waited:?}");
        assert_eq!(
            cloud.reads.load(Ordering::SeqCst),
            3,
            "read before each retry"
        );

        let failing = toy(std::iter::repeat_n(CloudError::retryable("503"), 10));
        let error = apply(&failing, "toy", &RETRY, &add(&[ip(5)]), None)
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Retryable);
        assert_eq!(failing.sent.lock().unwrap().len(), RETRY.max_attempts);
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_answer_waits_as_long_as_the_cloud_asked() {
        let wait = Duration::from_secs(30);
        let cloud = toy([CloudError::throttled("429").with_retry_after(Some(wait))]);
        let started = Instant::now();
        apply(&cloud, "toy", &RETRY, &add(&[ip(5)]), None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(started.elapsed(), wait);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_believed_only_after_a_fresh_read() {
        // From a remembered state: read again, and the retry succeeds.
        let cloud = toy([CloudError::permanent("InvalidParameterValue")]);
        let remembered = cloud.interface.lock().unwrap().clone();
        apply(&cloud, "toy", &RETRY, &add(&[ip(5)]), Some(remembered))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(cloud.reads.load(Ordering::SeqCst), 1);
        // Refused again after a fresh read: believed, no further write.
        let cloud = toy(std::iter::repeat_n(CloudError::permanent("in use"), 3));
        let remembered = cloud.interface.lock().unwrap().clone();
        let error = apply(&cloud, "toy", &RETRY, &add(&[ip(5)]), Some(remembered))
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Permanent);
        assert_eq!(cloud.sent.lock().unwrap().len(), 2);
        // A precheck refusal from a fresh read is believed at once, with nothing sent.
        let cloud = toy([]);
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let error = apply(&cloud, "toy", &RETRY, &add(&[v6]), None)
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Permanent);
        assert!(cloud.sent.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_gone_vm_holds_none_of_the_ips_but_takes_none_either() {
        let cloud = Toy {
            gone: true,
            ..Toy::default()
        };
        let remove = Change::new(Vec::new(), vec![ip(5)]);
        assert_eq!(
            apply(&cloud, "toy", &RETRY, &remove, None).await.unwrap(),
            None
        );
        let error = apply(&cloud, "toy", &RETRY, &add(&[ip(5)]), None)
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::NotFound);
        // Gone between our read and our write.
        let cloud = toy([CloudError::not_found("interface deleted")]);
        cloud.interface.lock().unwrap().1.push(ip(5));
        assert_eq!(
            apply(&cloud, "toy", &RETRY, &remove, None).await.unwrap(),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_is_sent_once_per_ip_and_only_what_is_missing_is_checked() {
        let cloud = toy([]);
        let change = Change::new(vec![ip(5), ip(6), ip(5)], vec![ip(9), ip(9)]);
        apply(&cloud, "toy", &RETRY, &change, None)
            .await
            .unwrap()
            .unwrap();
        let sent = cloud.sent.lock().unwrap().clone();
        assert_eq!(sent, vec![Change::new(vec![ip(5), ip(6)], vec![ip(9)])]);
        assert_eq!(dedup(&[ip(1), ip(2), ip(1)]), vec![ip(1), ip(2)]);
    }

    #[test]
    fn an_address_on_the_interface_is_done_only_when_ours_and_the_nodes_own_never_moves() {
        let view = NodeEgress {
            interface: "eni-1".into(),
            addresses: vec![ip(1), ip(5)],
            primary: vec![ip(1)],
            ..NodeEgress::default()
        };
        let theirs = add(&[ip(5)]);
        let error = foreign(&view, &theirs).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Foreign);
        assert!(error.message.contains("did not attach it"), "{error}");
        assert_eq!(foreign(&view, &theirs.with_ours(vec![ip(5)])), Ok(()));
        assert_eq!(foreign(&view, &add(&[ip(6)])), Ok(()));
        let own = [
            Change::new(Vec::new(), vec![ip(1)]),
            add(&[ip(1)]).with_ours(vec![ip(1)]),
        ];
        for change in own {
            let error = foreign(&view, &change).unwrap_err();
            assert!(error.message.contains("node's own address"), "{error}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_foreign_address_is_refused_after_a_fresh_read_and_nothing_is_sent() {
        let cloud = toy([]);
        // Another writer put 5 on the interface; our memory of it already shows that.
        cloud.interface.lock().unwrap().1.push(ip(5));
        let remembered = cloud.interface.lock().unwrap().clone();
        let error = apply(
            &cloud,
            "toy",
            &RETRY,
            &add(&[ip(5), ip(6)]),
            Some(remembered),
        )
        .await
        .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Foreign);
        assert_eq!(
            cloud.reads.load(Ordering::SeqCst),
            1,
            "read before believed"
        );
        assert!(cloud.sent.lock().unwrap().is_empty());
        let ours = add(&[ip(5), ip(6)]).with_ours(vec![ip(5)]);
        let (_, view) = apply(&cloud, "toy", &RETRY, &ours, None)
            .await
            .unwrap()
            .unwrap();
        assert!(view.holds(ip(6)));
        assert_eq!(*cloud.sent.lock().unwrap(), [ours]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unresolved_conflict_reaches_the_engine_as_retryable() {
        let cloud = toy(std::iter::repeat_n(CloudError::conflict("412"), 10));
        let error = apply(&cloud, "toy", &RETRY, &add(&[ip(5)]), None)
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Retryable);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_retry_transient_failures_and_give_up_on_refusals() {
        let calls = AtomicUsize::new(0);
        let answer = read(&RETRY, "toy read", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(CloudError::throttled("429")),
                _ => Ok(1),
            }
        })
        .await;
        assert_eq!(answer, Ok(1));
        let refused: Result<u8, _> = read(&RETRY, "toy read", || async {
            Err(CloudError::permanent("403"))
        })
        .await;
        assert_eq!(refused.unwrap_err().kind, ErrorKind::Permanent);
    }
}
