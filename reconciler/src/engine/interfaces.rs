//! The engine's view of each VM's primary interface: what the cloud last said about it, kept up
//! to date by the answers of our own calls, so that neither the node annotation nor the next
//! mutation has to read the cloud again.
//!
//! A view is read from the cloud only when there is none: a new VM (a Node appeared or changed
//! its providerID), after a failed call (which drops the view, since the call may or may not
//! have changed the interface), and on the drift period ([`Interfaces::refresh`]). Concurrent
//! askers of a missing view share one read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::OnceCell;

use crate::cloud::{CloudError, CloudProvider, InstanceId, NodeEgress, NodeTarget};
use crate::metrics::Metrics;

#[derive(Debug, Default)]
struct Entry {
    view: Arc<OnceCell<NodeEgress>>,
    /// Bumped by every change of the view, so a read that raced with one can tell.
    version: u64,
    /// The node the VM was last seen as (for the drift period's annotation refresh).
    node: String,
}

/// Cached interface views, by VM.
pub struct Interfaces {
    cloud: Arc<dyn CloudProvider>,
    metrics: Arc<Metrics>,
    entries: Mutex<HashMap<InstanceId, Entry>>,
}

impl Interfaces {
    /// An empty cache over `cloud`.
    pub fn new(cloud: Arc<dyn CloudProvider>, metrics: Arc<Metrics>) -> Self {
        Self {
            cloud,
            metrics,
            entries: Mutex::default(),
        }
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
        cell.get_or_try_init(|| self.read(target)).await.cloned()
    }

    /// Reads `target`'s VM again and caches the answer, unless a call changed the interface while
    /// the read was under way (then the call's answer is newer, and `None` is returned).
    pub(crate) async fn refresh(
        &self,
        target: &NodeTarget,
    ) -> Result<Option<NodeEgress>, CloudError> {
        let before = self.entries().get(&target.instance).map(|e| e.version);
        let view = self.read(target).await?;
        let mut entries = self.entries();
        let current = entries.get(&target.instance).map(|e| e.version);
        if before != current {
            return Ok(None);
        }
        let entry = entries.entry(target.instance.clone()).or_default();
        entry.version += 1;
        entry.view = Arc::new(OnceCell::new_with(Some(view.clone())));
        entry.node.clone_from(&target.node_name);
        Ok(Some(view))
    }

    async fn read(&self, target: &NodeTarget) -> Result<NodeEgress, CloudError> {
        let provider = self.cloud.needs().name;
        self.metrics.cloud_read(provider);
        self.cloud
            .egress_config(target)
            .await
            .inspect_err(|e| self.metrics.cloud_error(provider, "egress_config", e))
    }

    /// Caches `view` as `instance`'s interface now (the answer of a call that changed it).
    pub(crate) fn put(&self, instance: &InstanceId, view: NodeEgress) {
        let mut entries = self.entries();
        let entry = entries.entry(instance.clone()).or_default();
        entry.version += 1;
        entry.view = Arc::new(OnceCell::new_with(Some(view)));
    }

    /// Drops the view of `instance`: a call failed, or the VM is gone. (A read under way then
    /// finds the entry gone or new, and its answer is not kept.)
    pub(crate) fn forget(&self, instance: &InstanceId) {
        self.entries().remove(instance);
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

    use super::*;
    use crate::cloud::memory::{MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};

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
        interfaces.put(&target.instance, changed.clone());
        assert_eq!(interfaces.get_or_read(&target).await.unwrap(), changed);
        assert_eq!(cloud.call_count(Op::EgressConfig), 2);
    }

    #[tokio::test]
    async fn a_refresh_always_reads_and_names_the_node() {
        let (cloud, interfaces, target) = setup().await;
        interfaces.get_or_read(&target).await.unwrap();
        let fresh = interfaces.refresh(&target).await.unwrap();
        assert!(fresh.is_some());
        assert_eq!(cloud.call_count(Op::EgressConfig), 2);
        let known = interfaces.known();
        assert_eq!(known.len(), 1);
        assert_eq!(known[0].node_name, "a");
    }
}
