//! The engine's view of each VM's primary interface: what the cloud last said about it, kept up
//! to date by the answers of our own calls, so that neither the node annotation nor the next
//! mutation has to read the cloud again.
//!
//! A view is read from the cloud only when there is none: a new VM (a Node appeared or changed
//! its providerID), after a failed call (which drops the view, since the call may or may not
//! have changed the interface), on the drift period ([`Interfaces::refresh_all`]), and, on a
//! cloud with no etag, ahead of an IP moving to the VM ([`Interfaces::read_ahead`]). Concurrent
//! askers of a missing view share one read, and the reads of different VMs are gathered into
//! list calls ([`crate::engine::reads`]). A view is dropped once nothing refers to its VM any more
//! (its Node gone: [`crate::controller::nodes::forget_views_of_gone_nodes`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::cloud::{CloudError, CloudProvider, InstanceId, NodeEgress, NodeTarget, READ_LATELY};
use crate::engine::lanes::Gather;
use crate::engine::reads::Reads;
use crate::metrics::Metrics;

#[derive(Debug, Default)]
struct Entry {
    view: Arc<OnceCell<NodeEgress>>,
    /// Bumped by every change of the view, so a read that raced with one can tell.
    version: u64,
    /// The node the VM was last seen as (for the drift period's annotation refresh).
    node: String,
    /// When the read the view came from was asked for, before any gathering: no later than it
    /// was sent (a call's answer keeps it: that view is the read's, with our change made).
    read_at: Option<Instant>,
    /// When the last read ahead of this VM began ([`Interfaces::read_ahead`]).
    read_ahead: Option<Instant>,
}

/// Cached interface views, by VM.
pub struct Interfaces {
    reads: Reads,
    entries: Mutex<HashMap<InstanceId, Entry>>,
    /// How old a read may be and still count as the interface as it is now.
    read_lately: Duration,
}

impl Interfaces {
    /// An empty cache over `cloud`, whose reads share a call with those queued at the same
    /// moment (no gathering window: see [`Self::with_gather`]).
    pub fn new(cloud: Arc<dyn CloudProvider>, metrics: Arc<Metrics>) -> Self {
        Self {
            reads: Reads::new(cloud, metrics, Gather::NONE),
            entries: Mutex::default(),
            read_lately: READ_LATELY,
        }
    }

    /// The same cache over `cloud`, whose reads gather for as long as `gather` says before a
    /// list call (a provider that reads one VM at a time never waits).
    #[must_use]
    pub fn with_gather(mut self, gather: Gather) -> Self {
        self.reads = self.reads.gathering(gather);
        self
    }

    /// The same cache, a read counting as the interface as it is now for `read_lately`
    /// ([`READ_LATELY`] unless told).
    #[must_use]
    pub fn with_read_lately(mut self, read_lately: Duration) -> Self {
        self.read_lately = read_lately;
        self
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<InstanceId, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached view of `instance`, if there is one.
    pub(crate) fn get(&self, instance: &InstanceId) -> Option<NodeEgress> {
        self.entries()
            .get(instance)
            .and_then(|e| e.view.get().cloned())
    }

    /// The view of `target`'s VM: the cached one, else one read (shared with concurrent askers).
    pub(crate) async fn get_or_read(&self, target: &NodeTarget) -> Result<NodeEgress, CloudError> {
        let cell = {
            let mut entries = self.entries();
            let entry = entries.entry(target.instance.clone()).or_default();
            entry.node.clone_from(&target.node_name);
            Arc::clone(&entry.view)
        };
        cell.get_or_try_init(|| self.reads.read(target))
            .await
            .cloned()
    }

    /// Reads every VM of `targets` again, in as few calls as the cloud allows, and caches each
    /// answer, unless a call changed that interface while the read was under way (then the
    /// call's answer is newer, and that VM's answer is `Ok(None)`). One answer per target, in
    /// order.
    pub(crate) async fn refresh_all(
        &self,
        targets: &[NodeTarget],
    ) -> Vec<Result<Option<NodeEgress>, CloudError>> {
        let before: Vec<Option<u64>> = {
            let entries = self.entries();
            targets
                .iter()
                .map(|t| entries.get(&t.instance).map(|e| e.version))
                .collect()
        };
        let sent = Instant::now();
        let answers = self.reads.read_all(targets).await;
        let mut entries = self.entries();
        targets
            .iter()
            .zip(before)
            .zip(answers)
            .map(|((target, before), answer)| {
                let view = answer?;
                let current = entries.get(&target.instance).map(|e| e.version);
                if before != current {
                    return Ok(None);
                }
                let entry = entries.entry(target.instance.clone()).or_default();
                entry.version += 1;
                entry.view = Arc::new(OnceCell::new_with(Some(view.clone())));
                entry.node.clone_from(&target.node_name);
                entry.read_at = Some(sent);
                Ok(Some(view))
            })
            .collect()
    }

    /// Whether the cached view of `instance` came from a read sent lately
    /// ([`Self::with_read_lately`]): to a cloud with no etag, the interface as it is now.
    pub(crate) fn read_lately(&self, instance: &InstanceId) -> bool {
        self.entries()
            .get(instance)
            .and_then(|e| e.read_at)
            .is_some_and(|at| at.elapsed() < self.read_lately)
    }

    /// Reads `target`'s VM again now, for a change expected soon (an IP on its way to it) that
    /// would otherwise read it in its own call, after the IP left the old VM; nothing when it
    /// was read, or a read ahead of it began, within half of [`Self::with_read_lately`]'s time
    /// (the IPs of one burst share one read).
    pub(crate) async fn read_ahead(&self, target: &NodeTarget) {
        {
            let now = Instant::now();
            let lately = |at: Option<Instant>| at.is_some_and(|at| now - at < self.read_lately / 2);
            let mut entries = self.entries();
            let entry = entries.entry(target.instance.clone()).or_default();
            if lately(entry.read_at) || lately(entry.read_ahead) {
                return;
            }
            entry.read_ahead = Some(now);
        }
        if let Some(Err(e)) = self.refresh_all(std::slice::from_ref(target)).await.pop() {
            tracing::debug!(node = %target.node_name, error = %e, "reading ahead of a move failed; its change reads the VM itself");
        }
    }

    /// Caches `view` as the interface of `target`'s VM now (the answer of a call that changed
    /// it). A view cached anew (after a failed call dropped the last one) is known as
    /// `target`'s node: without a node the drift check would compare it with no object.
    pub(crate) fn put(&self, target: &NodeTarget, view: NodeEgress) {
        let mut entries = self.entries();
        let entry = entries.entry(target.instance.clone()).or_default();
        entry.version += 1;
        entry.view = Arc::new(OnceCell::new_with(Some(view)));
        if entry.node.is_empty() {
            entry.node.clone_from(&target.node_name);
        }
    }

    /// The view of `target`'s VM to decide by when the cached one may be stale: the cached view
    /// if `believed` accepts it, else one fresh read's answer (or the answer of a change that
    /// landed meanwhile, which is newer still). Without a cached view the VM is read (shared
    /// with concurrent askers). A cached view is our last answer and can predate another
    /// controller's or tool's change (or its undoing): every conclusion that acts against what
    /// the view shows (re-attach an IP found missing, refuse an IP found foreign) is drawn only
    /// from a fresh read, and one home for that rule keeps its callers from drifting apart.
    pub(crate) async fn confirmed(
        &self,
        target: &NodeTarget,
        believed: impl Fn(&NodeEgress) -> bool,
    ) -> Result<NodeEgress, CloudError> {
        // Judged, then dropped: a view kept across a read would be part of every attach's future.
        let cached = match self.get(&target.instance) {
            Some(view) if believed(&view) => return Ok(view),
            view => view.is_some(),
        };
        if !cached {
            return self.get_or_read(target).await;
        }
        // A rare path: boxed so that every attach's future does not carry its state.
        match Box::pin(self.refresh_all(std::slice::from_ref(target)))
            .await
            .pop()
        {
            Some(Ok(Some(view))) => return Ok(view),
            Some(Err(e)) => return Err(e),
            // A change landed (or a failure dropped the view) while reading: the newer state.
            Some(Ok(None)) | None => {}
        }
        self.get_or_read(target).await
    }

    /// Drops the view of `instance`: a call failed, or the VM is gone. (A read under way then
    /// finds the entry gone or new, and its answer is not kept.)
    pub(crate) fn forget(&self, instance: &InstanceId) {
        self.entries().remove(instance);
    }

    /// Drops the view of every VM `keep` refuses, given the VM and the node it was last seen
    /// as: views of VMs nothing will ask about again would otherwise stay, and be read every
    /// drift period, for the life of the process.
    pub(crate) fn retain(&self, keep: impl Fn(&InstanceId, &str) -> bool) {
        let mut dropped = Vec::new();
        self.entries().retain(|instance, e| {
            let kept = keep(instance, &e.node);
            if !kept {
                dropped.push(instance.clone());
            }
            kept
        });
        // Outside the lock: the provider takes its own.
        for instance in &dropped {
            self.reads.cloud().forget_vm(instance);
        }
    }

    /// How many VMs have an entry (a view, or a read of one under way).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }

    /// Every VM with a cached view, with the node it was last seen as.
    pub(crate) fn known(&self) -> Vec<NodeTarget> {
        self.entries()
            .iter()
            .filter(|(_, e)| e.view.initialized())
            .map(|(instance, e)| NodeTarget {
                node_name: e.node.clone(),
                provider_id: String::new(),
                instance: instance.clone(),
                internal_ips: Default::default(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use std::time::Duration;

    use futures::future::join_all;
    use tokio::time::Instant;

    use super::*;
    use crate::cloud::ErrorKind;
    use crate::cloud::memory::{MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};
    use crate::metrics::{ErrorLabels, ProviderLabels};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    async fn setup() -> (MemoryCloud, Interfaces, NodeTarget) {
        let cloud = MemoryCloud::new(MemoryConfig::default());
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 10));
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        let interfaces = Interfaces::new(Arc::new(cloud.clone()), Arc::default());
        (cloud, interfaces, target)
    }

    #[tokio::test]
    async fn concurrent_askers_share_one_read_and_later_ones_read_nothing() {
        let (cloud, interfaces, target) = setup().await;
        let (a, b) = tokio::join!(
            interfaces.get_or_read(&target),
            interfaces.get_or_read(&target)
        );
        assert_eq!(a.unwrap(), b.unwrap());
        interfaces.get_or_read(&target).await.unwrap();
        assert_eq!(cloud.call_count(Op::EgressConfig), 1);
    }

    #[tokio::test]
    async fn a_forgotten_view_is_read_again_and_a_put_one_is_not() {
        let (cloud, interfaces, target) = setup().await;
        let view = interfaces.get_or_read(&target).await.unwrap();
        interfaces.forget(&target.instance);
        assert_eq!(interfaces.get(&target.instance), None);
        interfaces.get_or_read(&target).await.unwrap();
        assert_eq!(cloud.call_count(Op::EgressConfig), 2);
        let mut changed = view.clone();
        changed.addresses.push(ip("10.1.0.9"));
        interfaces.put(&target, changed.clone());
        assert_eq!(interfaces.get_or_read(&target).await.unwrap(), changed);
        assert_eq!(cloud.call_count(Op::EgressConfig), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_ahead_is_current_for_a_while_and_shared_by_a_burst() {
        let (cloud, interfaces, target) = setup().await;
        let view = interfaces.get_or_read(&target).await.unwrap();
        assert!(
            !interfaces.read_lately(&target.instance),
            "a view read when first asked for may be used for hours: not current"
        );
        let reads = cloud.call_count(Op::EgressConfig);
        // The IPs of one burst moving to the VM: one read.
        tokio::join!(
            interfaces.read_ahead(&target),
            interfaces.read_ahead(&target)
        );
        interfaces.read_ahead(&target).await;
        assert_eq!(cloud.call_count(Op::EgressConfig), reads + 1);
        assert!(interfaces.read_lately(&target.instance));
        // A call's answer is that read's view with our change made: still as current.
        let mut changed = view.clone();
        changed.addresses.push(ip("10.1.0.9"));
        interfaces.put(&target, changed);
        assert!(interfaces.read_lately(&target.instance));
        tokio::time::advance(READ_LATELY).await;
        assert!(!interfaces.read_lately(&target.instance));
        // A later move reads again.
        interfaces.read_ahead(&target).await;
        assert_eq!(cloud.call_count(Op::EgressConfig), reads + 2);
        assert!(interfaces.read_lately(&target.instance));
        // A failed call drops the view, and what it knew of the read.
        interfaces.forget(&target.instance);
        interfaces.put(&target, view);
        assert!(!interfaces.read_lately(&target.instance));
    }

    #[tokio::test]
    async fn a_view_cached_anew_by_a_call_is_known_as_its_node() {
        let (_cloud, interfaces, target) = setup().await;
        let view = interfaces.get_or_read(&target).await.unwrap();
        // A failed call drops the view; the next call's answer caches it again.
        interfaces.forget(&target.instance);
        interfaces.put(&target, view);
        let known = interfaces.known();
        assert_eq!(known.len(), 1);
        assert_eq!(
            known[0].node_name, "a",
            "the drift check compares a view with the objects of the node it names"
        );
    }

    #[tokio::test]
    async fn a_cached_view_is_believed_when_accepted_and_read_again_when_not() {
        let (cloud, interfaces, target) = setup().await;
        let theirs = ip("10.1.0.9");
        // No view yet: one read, whatever the judgement.
        let view = interfaces.confirmed(&target, |_| false).await.unwrap();
        assert!(!view.holds(theirs));
        assert_eq!(cloud.call_count(Op::EgressConfig), 1);
        interfaces.confirmed(&target, |_| true).await.unwrap();
        assert_eq!(cloud.call_count(Op::EgressConfig), 1, "accepted: no read");
        // Another tool assigns the address after our last read: only a fresh read shows it.
        cloud.add_out_of_band("a", theirs);
        let view = interfaces
            .confirmed(&target, |v| v.holds(theirs))
            .await
            .unwrap();
        assert!(view.holds(theirs));
        assert_eq!(cloud.call_count(Op::EgressConfig), 2);
        assert_eq!(
            interfaces.get(&target.instance),
            Some(view),
            "and is cached"
        );
        // A failed fresh read is no confirmation.
        cloud.fail_next(
            Op::EgressConfig,
            None,
            1,
            CloudError::throttled("RequestLimitExceeded"),
        );
        let refused = interfaces.confirmed(&target, |_| false).await;
        assert_eq!(refused.unwrap_err().kind, ErrorKind::Throttled);
    }

    #[tokio::test]
    async fn a_refresh_always_reads_and_names_the_node() {
        let (cloud, interfaces, target) = setup().await;
        interfaces.get_or_read(&target).await.unwrap();
        let fresh = interfaces.refresh_all(std::slice::from_ref(&target)).await;
        assert!(matches!(fresh[..], [Ok(Some(_))]), "{fresh:?}");
        assert_eq!(cloud.call_count(Op::EgressConfig), 2);
        let known = interfaces.known();
        assert_eq!(known.len(), 1);
        assert_eq!(known[0].node_name, "a");
    }

    /// A memory cloud of `n` VMs (`vm0`, `vm1`, ...) read at most `max_read_batch` at a time,
    /// each call taking `latency`; the cache over it gathers as `gather` says.
    async fn vms(
        n: usize,
        max_read_batch: usize,
        latency: Duration,
        gather: Gather,
    ) -> (MemoryCloud, Interfaces, Vec<NodeTarget>, Arc<Metrics>) {
        let cloud = MemoryCloud::new(MemoryConfig {
            max_read_batch,
            latency,
            ..MemoryConfig::default()
        });
        let mut targets = Vec::new();
        for i in 0..n {
            let name = format!("vm{i}");
            cloud.add_vm(
                &name,
                VmSpec::ipv4(ip(&format!("10.1.{}.{}", i / 200, i % 200 + 1)), 10),
            );
            targets.push(cloud.resolve(&name, &provider_id(&name)).await.unwrap());
        }
        let metrics = Arc::new(Metrics::default());
        let interfaces =
            Interfaces::new(Arc::new(cloud.clone()), Arc::clone(&metrics)).with_gather(gather);
        (cloud, interfaces, targets, metrics)
    }

    const WINDOW: Gather = Gather {
        quiet: Duration::from_millis(50),
        max: Duration::from_secs(1),
    };

    #[tokio::test(start_paused = true)]
    async fn vms_asked_at_once_are_read_in_as_few_calls_as_the_cloud_allows() {
        let (cloud, interfaces, targets, _) = vms(25, 10, Duration::ZERO, WINDOW).await;
        let answers = join_all(targets.iter().map(|t| interfaces.get_or_read(t))).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(
            cloud.call_count(Op::EgressConfigs),
            3,
            "{:?}",
            cloud.calls()
        );
        assert_eq!(cloud.call_count(Op::EgressConfig), 25);
        // Each VM's own view, and none is read again.
        assert_eq!(answers[7].as_ref().unwrap().primary, [ip("10.1.0.8")]);
        join_all(targets.iter().map(|t| interfaces.get_or_read(t))).await;
        assert_eq!(cloud.call_count(Op::EgressConfigs), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_arriving_within_the_quiet_gap_share_a_call_up_to_the_bound() {
        let (cloud, interfaces, targets, _) = vms(40, 1000, Duration::ZERO, WINDOW).await;
        let start = Instant::now();
        // One ask every 30 ms: never a quiet gap of 50 ms, so the 1 s bound ends the first call.
        let asks = targets.iter().enumerate().map(|(i, t)| {
            let interfaces = &interfaces;
            async move {
                tokio::time::sleep(Duration::from_millis(30) * u32::try_from(i).unwrap()).await;
                interfaces.get_or_read(t).await.unwrap();
                Instant::now()
            }
        });
        let done = join_all(asks).await;
        assert_eq!(done[0] - start, Duration::from_secs(1));
        let calls: Vec<usize> = cloud
            .calls()
            .iter()
            .map(|c| c.instance.split(',').count())
            .collect();
        // The first 34 asks (0 to 990 ms) at the bound; the last 6 after their quiet gap.
        assert_eq!(calls, [34, 6]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cloud_that_reads_one_vm_at_a_time_is_read_at_once() {
        let (cloud, interfaces, targets, _) = vms(3, 1, Duration::ZERO, WINDOW).await;
        let start = Instant::now();
        join_all(targets.iter().map(|t| interfaces.get_or_read(t))).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "no gathering window");
        assert_eq!(cloud.call_count(Op::EgressConfigs), 0);
        assert_eq!(cloud.call_count(Op::EgressConfig), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_of_every_known_vm_costs_as_few_calls_as_the_cloud_allows() {
        let (cloud, interfaces, targets, _) = vms(25, 10, Duration::ZERO, WINDOW).await;
        join_all(targets.iter().map(|t| interfaces.get_or_read(t))).await;
        let known = interfaces.known();
        assert_eq!(known.len(), 25);
        let fresh = interfaces.refresh_all(&known).await;
        assert!(fresh.iter().all(|f| matches!(f, Ok(Some(_)))), "{fresh:?}");
        assert_eq!(cloud.call_count(Op::EgressConfigs), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_vm_missing_from_the_answer_fails_alone_and_is_counted() {
        let (cloud, interfaces, mut targets, metrics) = vms(5, 1000, Duration::ZERO, WINDOW).await;
        targets.insert(
            2,
            NodeTarget::new("ghost", &provider_id("ghost"), "ghost".into()),
        );
        let answers = join_all(targets.iter().map(|t| interfaces.get_or_read(t))).await;
        assert_eq!(cloud.call_count(Op::EgressConfigs), 1);
        for (target, answer) in targets.iter().zip(&answers) {
            match target.node_name.as_str() {
                "ghost" => assert_eq!(answer.as_ref().unwrap_err().kind, ErrorKind::NotFound),
                _ => assert!(answer.is_ok(), "{answer:?}"),
            }
        }
        let reads = metrics.cloud_reads.get_or_create(&ProviderLabels {
            provider: "memory".into(),
        });
        assert_eq!(reads.get(), 6, "one read per VM");
        let not_found = metrics.cloud_call_errors.get_or_create(&ErrorLabels {
            provider: "memory".into(),
            operation: "egress_config".into(),
            kind: "not_found".into(),
        });
        assert_eq!(
            not_found.get(),
            1,
            "the operator sees the one VM that failed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_fails_each_of_its_vms_and_the_next_ask_reads_again() {
        let (cloud, interfaces, targets, _) = vms(4, 1000, Duration::ZERO, WINDOW).await;
        cloud.fail_next(
            Op::EgressConfigs,
            None,
            1,
            CloudError::throttled("RequestLimitExceeded"),
        );
        let answers = join_all(targets.iter().map(|t| interfaces.get_or_read(t))).await;
        assert!(
            answers
                .iter()
                .all(|a| a.as_ref().is_err_and(|e| e.kind == ErrorKind::Throttled)),
            "{answers:?}"
        );
        let answers = join_all(targets.iter().map(|t| interfaces.get_or_read(t))).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(cloud.call_count(Op::EgressConfigs), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_during_a_gathered_refresh_wins_over_the_read() {
        let (cloud, interfaces, targets, _) = vms(3, 1000, Duration::from_secs(1), WINDOW).await;
        join_all(targets.iter().map(|t| interfaces.get_or_read(t))).await;
        let mut changed = interfaces.get(&targets[1].instance).unwrap();
        changed.addresses.push(ip("10.1.0.99"));
        let change = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            interfaces.put(&targets[1], changed.clone());
        };
        let (fresh, ()) = tokio::join!(interfaces.refresh_all(&targets), change);
        assert!(matches!(fresh[0], Ok(Some(_))), "{fresh:?}");
        assert!(
            matches!(fresh[1], Ok(None)),
            "the call's answer is newer: {fresh:?}"
        );
        assert!(matches!(fresh[2], Ok(Some(_))), "{fresh:?}");
        assert_eq!(interfaces.get(&targets[1].instance), Some(changed));
        assert_eq!(cloud.call_count(Op::EgressConfigs), 2);
    }
}
