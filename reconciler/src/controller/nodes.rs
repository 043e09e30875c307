//! The node annotation controller (SPEC §2.4): writes each node's subnet and egress capacity as
//! `cloud.network.openshift.io/egress-ipconfig`, only when the value changes.

use std::collections::HashSet;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use cloudnet_shared::annotation::encode;
use cloudnet_shared::{CloudPrivateIPConfig, EGRESS_IPCONFIG_ANNOTATION, decode_name};
use futures::FutureExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use thiserror::Error;

use crate::capacity::{egress_config, room};
use crate::cloud::{CloudError, CloudProvider, InstanceId, NodeTarget};
use crate::controller::cached_node::CachedNode;
use crate::controller::retries::Retries;
use crate::engine::interfaces::Interfaces;
use crate::engine::ledger::Ledger;
use crate::index::NodeIndex;
use crate::metrics::Metrics;

/// Why a node could not be annotated; retried with backoff.
#[derive(Debug, Error)]
pub(crate) enum Error {
    /// The Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The cloud failed.
    #[error("cloud: {0}")]
    Cloud(#[from] CloudError),
    /// A cache stopped before it synced.
    #[error("cache closed before it synced")]
    CacheClosed,
}

/// What the annotation controller needs.
pub(crate) struct Context {
    /// The Node API.
    pub(crate) api: Api<CachedNode>,
    /// The cloud (for resolving providerIDs; reads go through `interfaces`).
    pub(crate) cloud: Arc<dyn CloudProvider>,
    /// The engine's view of every VM's interface.
    pub(crate) interfaces: Arc<Interfaces>,
    /// Node cache.
    pub(crate) nodes: Store<CachedNode>,
    /// Object cache (for the managed IPs of a node).
    pub(crate) objects: Store<CloudPrivateIPConfig>,
    /// The object cache's objects by node.
    pub(crate) by_node: Arc<NodeIndex>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Failures per node, for its backoff; shared with the Node watch, which forgets the
    /// Nodes that go ([`forget_gone_nodes`]).
    retries: Arc<Retries>,
}

impl Context {
    /// A context over the given pieces.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        api: Api<CachedNode>,
        cloud: Arc<dyn CloudProvider>,
        interfaces: Arc<Interfaces>,
        nodes: Store<CachedNode>,
        objects: Store<CloudPrivateIPConfig>,
        by_node: Arc<NodeIndex>,
        metrics: Arc<Metrics>,
        retries: Arc<Retries>,
    ) -> Self {
        Self {
            api,
            cloud,
            interfaces,
            nodes,
            objects,
            by_node,
            metrics,
            retries,
        }
    }
}

/// Resolves node `name`'s VM from `provider_id` (its `spec.providerID`), with the first
/// InternalIPs of `node` (the cached Node, when there is one), by which a provider with several
/// interfaces per VM picks the one (OpenStack).
pub(crate) async fn resolve(
    cloud: &dyn CloudProvider,
    name: &str,
    node: Option<&CachedNode>,
    provider_id: &str,
) -> Result<NodeTarget, CloudError> {
    let mut target = cloud.resolve(name, provider_id).await?;
    target.internal_ips = node.map(CachedNode::internal_ips).unwrap_or_default();
    Ok(target)
}

/// What about a Node can change its annotation: a status heartbeat must not cost a cloud call.
/// The first InternalIPs count (OpenStack's interface follows them); the addresses after them
/// do not (AWS lists every egress IP there).
pub(crate) fn relevant_fields(node: &CachedNode) -> Option<u64> {
    let mut h = DefaultHasher::new();
    node.provider_id().hash(&mut h);
    node.is_uninitialized().hash(&mut h);
    node.internal_ips().hash(&mut h);
    node.egress_annotation().hash(&mut h);
    Some(h.finish())
}

fn managed_ips(ctx: &Context, node: &str) -> HashSet<IpAddr> {
    ctx.by_node
        .objects_on(&ctx.objects, node)
        .iter()
        .filter_map(|o| decode_name(&o.name_any()).ok())
        .collect()
}

/// How long a reconcile waits for the caches' first list before retrying.
pub(crate) const CACHE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Annotates one node, from the engine's view of its VM's interface: the cloud is read only when
/// there is none (a new node or providerID, after a failed call); object events, our own status
/// writes included, cost no cloud call.
pub(crate) async fn reconcile(node: Arc<CachedNode>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Capacity subtracts only unmanaged addresses, so it is wrong until every object is known.
    // A reconcile that starts waiting before the object cache's first list completes was seen
    // to never wake up (and then to hold a graceful shutdown forever): wait briefly, else retry.
    let caches = async {
        ctx.objects.wait_until_ready().await?;
        ctx.nodes.wait_until_ready().await
    };
    match tokio::time::timeout(CACHE_WAIT, caches).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return Err(Error::CacheClosed),
        Err(_) => return Ok(Action::requeue(CACHE_WAIT)),
    }
    let name = node.name_any();
    let provider_id = node.provider_id().unwrap_or_default().to_owned();
    // The Node may be deleted while this reconcile reads its VM: its series must not outlive
    // it (the watch drops them when the deletion arrives, after the cache does).
    let exists = || ctx.nodes.get(&ObjectRef::new(&name)).is_some();
    if node.is_uninitialized() || provider_id.is_empty() {
        // No VM to measure: no room to report either.
        ctx.metrics.set_node_room_if(&name, &[], exists);
        return Ok(Action::await_change());
    }
    let target = resolve(ctx.cloud.as_ref(), &name, Some(&node), &provider_id).await?;
    let egress = ctx.interfaces.get_or_read(&target).await?;
    let managed = managed_ips(&ctx, &name);
    let platform = ctx.cloud.needs().platform;
    let config = egress_config(&egress, &managed, platform);
    ctx.metrics
        .set_node_room_if(&name, &room(&config, &managed, platform), exists);
    let value = encode(&[config]);
    if node.egress_annotation() != Some(value.as_str()) {
        let patch = json!({ "metadata": { "annotations": { EGRESS_IPCONFIG_ANNOTATION: value } } });
        ctx.api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        ctx.metrics.node_annotation_writes.inc();
        tracing::info!(node = %name, annotation = %value, "node annotated");
    }
    ctx.retries.reset(&name);
    Ok(Action::await_change())
}

/// Retries a node with capped exponential backoff, unless it is gone: a failure counted after
/// the Node's deletion would be kept for the life of the process.
pub(crate) fn error_policy(node: Arc<CachedNode>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = node.name_any();
    let exists = || ctx.nodes.get(&ObjectRef::new(&name)).is_some();
    let Some(delay) = ctx.retries.next_delay_if(&name, exists) else {
        tracing::debug!(node = %name, %error, "node annotation failed; the node is gone");
        return Action::await_change();
    };
    tracing::warn!(node = %name, %error, retry_in = ?delay, "node annotation failed");
    Action::requeue(delay)
}

/// Forgets what the node controller keeps of Nodes that are gone, their capacity series and
/// retry counts, following the Node watch after the cache's writer: a deleted Node's at once,
/// and, once a relist is done, those of every Node it did not list (it may have missed a
/// deletion).
pub(crate) fn forget_gone_nodes(
    event: &watcher::Event<CachedNode>,
    nodes: &Store<CachedNode>,
    metrics: &Metrics,
    retries: &Retries,
) {
    match event {
        watcher::Event::Delete(node) => {
            let gone = node.name_any();
            metrics.retain_nodes(|name| name != gone);
            retries.retain(|name| name != gone);
        }
        watcher::Event::InitDone => {
            let exists = |name: &str| nodes.get(&ObjectRef::new(name)).is_some();
            metrics.retain_nodes(exists);
            retries.retain(exists);
        }
        _ => {}
    }
}

/// Forgets the interface views of VMs whose Node is gone once nothing refers to them: no
/// object names the node (`named`), and the ledger neither records an IP on the VM (the drift
/// check and a detach read it) nor released one from it lately (the sweep watches such a VM
/// for a late attach). A view is only a cache, read again when asked for; one that nothing
/// asks for would otherwise be kept, and read every drift period, for the life of the process.
/// Nothing is forgotten before the Node cache has listed every Node.
pub(crate) fn forget_views_of_gone_nodes(
    interfaces: &Interfaces,
    nodes: &Store<CachedNode>,
    ledger: &Ledger,
    named: impl Fn(&str) -> bool,
) {
    if !matches!(nodes.wait_until_ready().now_or_never(), Some(Ok(()))) {
        return;
    }
    let gone = |node: &str| {
        node.is_empty() || (nodes.get(&ObjectRef::new(node)).is_none() && !named(node))
    };
    let in_ledger: HashSet<InstanceId> = ledger
        .entries()
        .into_iter()
        .map(|(_, placement)| placement.instance.clone())
        .chain(ledger.recently_released().into_iter().map(|(_, i, _)| i))
        .collect();
    interfaces.retain(|instance, node| !gone(node) || in_ledger.contains(instance));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{NodeAddress, Taint};
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::{self, store::Writer};

    use super::*;
    use crate::cloud::memory::{MemoryCloud, MemoryConfig, VmSpec, provider_id};
    use crate::controller::cached_node::{CachedNodeSpec, CachedNodeStatus, UNINITIALIZED_TAINT};

    fn named(name: &str) -> CachedNode {
        CachedNode {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..CachedNode::default()
        }
    }

    /// The Node cache after a list of `names`.
    fn listed(names: &[&str]) -> (Store<CachedNode>, Writer<CachedNode>) {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for name in names {
            writer.apply_watcher_event(&watcher::Event::InitApply(named(name)));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        (store, writer)
    }

    #[test]
    fn the_retry_counts_of_a_deleted_node_and_of_one_a_relist_misses_are_forgotten() {
        let (store, mut writer) = listed(&["a", "b", "c"]);
        let metrics = Metrics::default();
        let retries = Retries::new(Duration::from_millis(100), Duration::from_secs(1));
        let mut feed = |event: watcher::Event<CachedNode>| {
            writer.apply_watcher_event(&event);
            forget_gone_nodes(&event, &store, &metrics, &retries);
        };
        for name in ["a", "b", "c"] {
            retries.next_delay(name);
        }
        feed(watcher::Event::Delete(named("b")));
        assert_eq!(retries.len(), 2);
        // c's deletion happened while the watch was down: the relist does not list it.
        feed(watcher::Event::Init);
        feed(watcher::Event::InitApply(named("a")));
        feed(watcher::Event::InitDone);
        assert_eq!(retries.len(), 1);
    }

    #[tokio::test]
    async fn the_view_of_a_vm_whose_node_is_gone_is_forgotten_once_nothing_refers_to_it() {
        let cloud = MemoryCloud::new(MemoryConfig::default());
        let interfaces = Interfaces::new(Arc::new(cloud.clone()), Arc::default());
        let mut targets = Vec::new();
        for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
            cloud.add_vm(
                name,
                VmSpec::ipv4(format!("10.1.0.{}", i + 1).parse().unwrap(), 10),
            );
            let target = cloud.resolve(name, &provider_id(name)).await.unwrap();
            interfaces.get_or_read(&target).await.unwrap();
            targets.push(target);
        }
        // A VM whose read failed (gone before its Node) has an entry, and no view.
        let ghost = NodeTarget::new("ghost", &provider_id("ghost"), "ghost".into());
        interfaces.get_or_read(&ghost).await.unwrap_err();
        let ledger = Ledger::in_memory(Arc::default());
        let ip: IpAddr = "10.1.0.99".parse().unwrap();
        ledger.record(&targets[2], &[ip]).await.unwrap();
        let nodes = |views: &Interfaces| {
            let mut nodes: Vec<String> = views.known().into_iter().map(|t| t.node_name).collect();
            nodes.sort();
            nodes
        };
        // Before the Node cache has listed, every Node looks gone: nothing is forgotten.
        let (unlisted, _writer) = reflector::store();
        forget_views_of_gone_nodes(&interfaces, &unlisted, &ledger, |_| false);
        assert_eq!(interfaces.len(), 5);
        // Only a's Node is left; an object still names b; the ledger records an IP on c's VM.
        let (store, _writer) = listed(&["a"]);
        forget_views_of_gone_nodes(&interfaces, &store, &ledger, |node| node == "b");
        assert_eq!(nodes(&interfaces), ["a", "b", "c"]);
        assert_eq!(interfaces.len(), 3, "the failed read's entry goes too");
        // The provider forgets what it keeps of the same VMs (a NIC, a port), and no other.
        let mut forgotten = cloud.forgotten();
        forgotten.sort();
        let mut expected = vec![targets[3].instance.clone(), ghost.instance.clone()];
        expected.sort();
        assert_eq!(forgotten, expected);
        // b's object goes; c's IP is detached, its release recent (the sweep still watches c).
        ledger.release(&targets[2].instance, &[ip]).await.unwrap();
        forget_views_of_gone_nodes(&interfaces, &store, &ledger, |_| false);
        assert_eq!(nodes(&interfaces), ["a", "c"]);
        assert_eq!(interfaces.len(), 2);
    }

    fn node(provider_id: &str, taint: Option<&str>) -> CachedNode {
        CachedNode {
            spec: Some(CachedNodeSpec {
                provider_id: Some(provider_id.into()),
                taints: taint.map(|k| {
                    vec![Taint {
                        key: k.into(),
                        effect: "NoSchedule".into(),
                        ..Taint::default()
                    }]
                }),
            }),
            ..CachedNode::default()
        }
    }

    #[test]
    fn uninitialized_taint_is_detected() {
        assert!(node("p", Some(UNINITIALIZED_TAINT)).is_uninitialized());
        assert!(!node("p", Some("other")).is_uninitialized());
        assert!(!node("p", None).is_uninitialized());
    }

    fn with_addresses(mut node: CachedNode, addresses: &[&str]) -> CachedNode {
        let addresses = addresses
            .iter()
            .map(|a| NodeAddress {
                type_: "InternalIP".into(),
                address: (*a).into(),
            })
            .collect();
        node.status = Some(CachedNodeStatus {
            addresses: Some(addresses),
        });
        node
    }

    #[test]
    fn relevant_fields_ignore_status_but_see_provider_id_and_taints() {
        let base = node("p", None);
        let mut heartbeat = base.clone();
        heartbeat.status = Some(Default::default());
        assert_eq!(relevant_fields(&base), relevant_fields(&heartbeat));
        let addressed = with_addresses(base.clone(), &["10.0.0.5"]);
        assert_ne!(
            relevant_fields(&base),
            relevant_fields(&addressed),
            "the first InternalIP appearing counts"
        );
        assert_eq!(
            relevant_fields(&addressed),
            relevant_fields(&with_addresses(base.clone(), &["10.0.0.5", "10.0.0.9"])),
            "an address after the first (an egress IP AWS lists) does not"
        );
        assert_ne!(relevant_fields(&base), relevant_fields(&node("q", None)));
        assert_ne!(
            relevant_fields(&base),
            relevant_fields(&node("p", Some(UNINITIALIZED_TAINT)))
        );
    }
}
