//! The fence between this process and the cloud: a cloud call may run only while this replica
//! holds the leader lease by its own clock.
//!
//! Leader election moves the fence's deadline forward with every renewal it sees succeed
//! ([`FenceKeeper::extend`]) and closes it for good when leadership ends. [`FencedCloud`] wraps the
//! provider: a call that would start at or after the deadline never reaches the provider, and a
//! call still running at the deadline is dropped, its request abandoned, and answered with an
//! error. Because the deadline comes before the lease can expire for any other replica (see
//! [`crate::leader`]), two replicas never call the cloud at once, even when the leader is cut off
//! from kube-apiserver and cannot learn that it lost.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use async_trait::async_trait;
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cloud::public_ip::{Association, PublicAddress, PublicIpError, PublicIps};
use crate::cloud::{
    Change, CloudError, CloudProvider, InstanceId, NodeEgress, NodeTarget, ProviderNeeds, Spend,
};

/// The fence was closed: the call did not start, or was abandoned.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("this replica no longer holds the leader lease")]
pub(crate) struct Closed;

/// Moves the fence's deadline; held by leader election. Dropping it closes the fence for good.
#[derive(Debug)]
pub(crate) struct FenceKeeper {
    deadline: watch::Sender<Instant>,
}

/// A view of the deadline: whether cloud calls may run now, and a way to wait for the end.
#[derive(Clone, Debug)]
pub struct Fence {
    deadline: watch::Receiver<Instant>,
}

impl FenceKeeper {
    /// A fence open until `until`, and the keeper that can extend it.
    pub fn new(until: Instant) -> (Self, Fence) {
        let (deadline, view) = watch::channel(until);
        (Self { deadline }, Fence { deadline: view })
    }

    /// Moves the deadline to `until` if that is later: a renewal whose answer comes late never
    /// shortens what an earlier one granted.
    pub(crate) fn extend(&self, until: Instant) {
        self.deadline.send_if_modified(|deadline| {
            let later = until > *deadline;
            if later {
                *deadline = until;
            }
            later
        });
    }

    /// The current deadline.
    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// A view of this fence.
    pub(crate) fn fence(&self) -> Fence {
        Fence {
            deadline: self.deadline.subscribe(),
        }
    }

    /// Closes the fence now, for good.
    pub(crate) fn close(self) {
        self.deadline.send_replace(Instant::now());
    }
}

impl Fence {
    /// Whether a cloud call may start now.
    pub(crate) fn is_open(&self) -> bool {
        // A keeper that is gone can no longer renew: closed, whatever its last deadline said.
        self.deadline.has_changed().is_ok() && Instant::now() < *self.deadline.borrow()
    }

    /// Resolves once the fence is closed (at once if it already is). Every poll compares the
    /// clock with the deadline, so a task woken for another reason after the deadline sees the
    /// fence closed even before the timer has fired.
    pub fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let probe = self.clone();
        let mut deadline = self.deadline.clone();
        let mut wait: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
            loop {
                let until = *deadline.borrow_and_update();
                if Instant::now() >= until {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    changed = deadline.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        std::future::poll_fn(move |cx| {
            if probe.is_open() {
                wait.as_mut().poll(cx)
            } else {
                Poll::Ready(())
            }
        })
    }

    /// Runs `call` if the fence is open, and drops it if the fence closes first. A call that
    /// finishes in the same instant the fence closes counts as abandoned: its result may be
    /// stale for the replica that leads now.
    pub(crate) async fn guard<F: Future>(&self, call: F) -> Result<F::Output, Closed> {
        if !self.is_open() {
            return Err(Closed);
        }
        tokio::select! {
            biased;
            () = self.closed() => Err(Closed),
            output = call => Ok(output),
        }
    }
}

/// A provider whose every call goes through a [`Fence`].
pub struct FencedCloud {
    inner: Arc<dyn CloudProvider>,
    fence: Fence,
}

impl FencedCloud {
    /// Fences `inner` with `fence`.
    pub fn new(inner: Arc<dyn CloudProvider>, fence: Fence) -> Self {
        Self { inner, fence }
    }

    async fn fenced<T>(
        &self,
        call: impl Future<Output = Result<T, CloudError>> + Send,
    ) -> Result<T, CloudError> {
        match self.fence.guard(call).await {
            Ok(result) => result,
            Err(Closed) => Err(not_called()),
        }
    }
}

/// A cloud's public addresses behind the same fence as its private IPs: no association call
/// starts, or goes on being waited for, once the lease is lost.
struct FencedPublicIps {
    inner: Arc<dyn PublicIps>,
    fence: Fence,
}

impl FencedPublicIps {
    async fn fenced<T>(
        &self,
        call: impl Future<Output = Result<T, PublicIpError>>,
    ) -> Result<T, PublicIpError> {
        match self.fence.guard(call).await {
            Ok(result) => result,
            Err(Closed) => Err(PublicIpError::Cloud(not_called())),
        }
    }
}

#[async_trait]
impl PublicIps for FencedPublicIps {
    async fn public_address(&self, id: &str) -> Result<PublicAddress, PublicIpError> {
        self.fenced(self.inner.public_address(id)).await
    }

    async fn associate(
        &self,
        address: &PublicAddress,
        interface: &str,
        private_ip: IpAddr,
    ) -> Result<Association, PublicIpError> {
        self.fenced(self.inner.associate(address, interface, private_ip))
            .await
    }

    async fn disassociate(&self, id: &str, association: &Association) -> Result<(), PublicIpError> {
        self.fenced(self.inner.disassociate(id, association)).await
    }

    fn serves(&self, address: &PublicAddress, interface: &str, private_ip: IpAddr) -> bool {
        self.inner.serves(address, interface, private_ip)
    }
}

/// The answer to a call the closed fence kept from the cloud.
fn not_called() -> CloudError {
    CloudError::retryable("not called: this replica no longer holds the leader lease")
}

#[async_trait]
impl CloudProvider for FencedCloud {
    fn needs(&self) -> ProviderNeeds {
        self.inner.needs()
    }

    fn forget_vm(&self, instance: &InstanceId) {
        // Not fenced: it makes no call.
        self.inner.forget_vm(instance);
    }

    fn public_ips(self: Arc<Self>) -> Option<Arc<dyn PublicIps>> {
        let inner = Arc::clone(&self.inner).public_ips()?;
        Some(Arc::new(FencedPublicIps {
            inner,
            fence: self.fence.clone(),
        }))
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        self.fenced(self.inner.resolve(node_name, provider_id))
            .await
    }

    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        self.fenced(self.inner.apply(node, change, known)).await
    }

    async fn write_budget(&self, spend: Spend) {
        // Not fenced: it makes no call, and a closed fence fails the call that follows.
        self.inner.write_budget(spend).await;
    }

    async fn move_ips(
        &self,
        from: &NodeTarget,
        to: &NodeTarget,
        ips: &[IpAddr],
    ) -> Result<(), CloudError> {
        self.fenced(self.inner.move_ips(from, to, ips)).await
    }

    async fn release_from_other_interfaces(
        &self,
        node: &NodeTarget,
        ip: IpAddr,
    ) -> Result<bool, CloudError> {
        self.fenced(self.inner.release_from_other_interfaces(node, ip))
            .await
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        self.fenced(self.inner.egress_config(node)).await
    }

    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        match self.fence.guard(self.inner.egress_configs(nodes)).await {
            Ok(answers) => answers,
            Err(Closed) => nodes.iter().map(|_| Err(not_called())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;
    use crate::cloud::memory::{MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};
    use crate::cloud::{CloudProviderExt, ErrorKind};

    const SECOND: Duration = Duration::from_secs(1);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A memory VM `a` behind a fence open for `open_for`; each call takes `latency`.
    async fn fenced(
        latency: Duration,
        open_for: Duration,
    ) -> (MemoryCloud, FenceKeeper, FencedCloud, NodeTarget) {
        let cloud = MemoryCloud::new(MemoryConfig {
            latency,
            ..MemoryConfig::default()
        });
        cloud.add_vm("a", VmSpec::ipv4(ip("10.0.0.1"), 10));
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        let (keeper, fence) = FenceKeeper::new(Instant::now() + open_for);
        let fenced = FencedCloud::new(Arc::new(cloud.clone()), fence);
        (cloud, keeper, fenced, target)
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_after_the_deadline_never_reaches_the_provider() {
        let (cloud, _keeper, fenced, target) = fenced(Duration::ZERO, 10 * SECOND).await;
        tokio::time::sleep(10 * SECOND).await;
        let error = fenced.attach(&target, &[ip("10.0.0.9")]).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Retryable);
        let error = fenced.egress_config(&target).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Retryable);
        assert!(cloud.calls().is_empty(), "{:?}", cloud.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_running_at_the_deadline_is_abandoned_at_the_deadline() {
        let (cloud, _keeper, fenced, target) = fenced(5 * SECOND, 2 * SECOND).await;
        let start = Instant::now();
        let error = fenced.attach(&target, &[ip("10.0.0.9")]).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Retryable);
        assert_eq!(start.elapsed(), 2 * SECOND);
        assert_eq!(cloud.call_count(Op::Attach), 1);
        // The memory cloud applies a change at the end of its latency: never, once dropped.
        tokio::time::sleep(10 * SECOND).await;
        assert!(cloud.attached_to("a").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_keep_a_long_call_running() {
        let (cloud, keeper, fenced, target) = fenced(5 * SECOND, 2 * SECOND).await;
        let renew = async {
            for _ in 0..5 {
                tokio::time::sleep(SECOND).await;
                keeper.extend(Instant::now() + 2 * SECOND);
            }
        };
        let ips = [ip("10.0.0.9")];
        let (result, ()) = tokio::join!(fenced.attach(&target, &ips), renew);
        assert!(result.unwrap().is_some());
        assert_eq!(cloud.attached_to("a"), [ip("10.0.0.9")].into());
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_never_shortens_the_fence() {
        let (keeper, fence) = FenceKeeper::new(Instant::now() + 5 * SECOND);
        keeper.extend(Instant::now() + SECOND);
        tokio::time::sleep(2 * SECOND).await;
        assert!(fence.is_open());
        assert_eq!(keeper.deadline(), Instant::now() + 3 * SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn closed_resolves_at_the_deadline_and_follows_extensions() {
        let (keeper, fence) = FenceKeeper::new(Instant::now() + 2 * SECOND);
        let start = Instant::now();
        let extend = async {
            tokio::time::sleep(SECOND).await;
            keeper.extend(Instant::now() + 3 * SECOND);
        };
        tokio::join!(fence.closed(), extend);
        assert_eq!(start.elapsed(), 4 * SECOND);
        assert!(!fence.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn closing_or_dropping_the_keeper_closes_the_fence_at_once() {
        let (keeper, fence) = FenceKeeper::new(Instant::now() + 60 * SECOND);
        let other = keeper.fence();
        keeper.close();
        assert!(!fence.is_open() && !other.is_open());
        let start = Instant::now();
        fence.closed().await;
        assert_eq!(start.elapsed(), Duration::ZERO);

        let (keeper, fence) = FenceKeeper::new(Instant::now() + 60 * SECOND);
        drop(keeper);
        assert!(!fence.is_open());
        fence.closed().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(fence.guard(async { 1 }).await, Err(Closed));
    }
}
