//! The node annotation controller (SPEC §2.4): writes each node's subnet and egress capacity as
//! `cloud.network.openshift.io/egress-ipconfig`, only when the value changes.

use std::collections::HashSet;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_shared::annotation::encode;
use cloudnet_shared::{CloudPrivateIPConfig, EGRESS_IPCONFIG_ANNOTATION, InternalIps, decode_name};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use serde_json::json;
use thiserror::Error;

use crate::capacity::{egress_config, room};
use crate::cloud::{CloudError, CloudProvider, NodeTarget};
use crate::controller::retries::Retries;
use crate::engine::interfaces::Interfaces;
use crate::index::NodeIndex;
use crate::metrics::Metrics;

/// The taint the cloud node manager keeps on a node until it has set the providerID.
pub(crate) const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

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
    pub(crate) api: Api<Node>,
    /// The cloud (for resolving providerIDs; reads go through `interfaces`).
    pub(crate) cloud: Arc<dyn CloudProvider>,
    /// The engine's view of every VM's interface.
    pub(crate) interfaces: Arc<Interfaces>,
    /// Node cache.
    pub(crate) nodes: Store<Node>,
    /// Object cache (for the managed IPs of a node).
    pub(crate) objects: Store<CloudPrivateIPConfig>,
    /// The object cache's objects by node.
    pub(crate) by_node: Arc<NodeIndex>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    retries: Retries,
}

impl Context {
    /// A context over the given pieces.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        api: Api<Node>,
        cloud: Arc<dyn CloudProvider>,
        interfaces: Arc<Interfaces>,
        nodes: Store<Node>,
        objects: Store<CloudPrivateIPConfig>,
        by_node: Arc<NodeIndex>,
        metrics: Arc<Metrics>,
        backoff: (Duration, Duration),
    ) -> Self {
        Self {
            api,
            cloud,
            interfaces,
            nodes,
            objects,
            by_node,
            metrics,
            retries: Retries::new(backoff.0, backoff.1),
        }
    }
}

/// Whether the cloud node manager still has `node` uninitialized.
pub(crate) fn is_uninitialized(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED_TAINT))
}

/// Resolves node `name`'s VM from `provider_id` (its `spec.providerID`), with the first
/// InternalIPs of `node` (the cached Node, when there is one), by which a provider with several
/// interfaces per VM picks the one (OpenStack).
pub(crate) async fn resolve(
    cloud: &dyn CloudProvider,
    name: &str,
    node: Option<&Node>,
    provider_id: &str,
) -> Result<NodeTarget, CloudError> {
    let mut target = cloud.resolve(name, provider_id).await?;
    target.internal_ips = node.map(InternalIps::of).unwrap_or_default();
    Ok(target)
}

/// What about a Node can change its annotation: a status heartbeat must not cost a cloud call.
/// The first InternalIPs count (OpenStack's interface follows them); the addresses after them
/// do not (AWS lists every egress IP there).
pub(crate) fn relevant_fields(node: &Node) -> Option<u64> {
    let mut h = DefaultHasher::new();
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.provider_id.as_deref()).hash(&mut h);
    is_uninitialized(node).hash(&mut h);
    InternalIps::of(node).hash(&mut h);
    node.annotations()
        .get(EGRESS_IPCONFIG_ANNOTATION)
        .hash(&mut h);
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
pub(crate) async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, Error> {
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
    let provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .unwrap_or_default();
    // The Node may be deleted while this reconcile reads its VM: its series must not outlive
    // it (the watch drops them when the deletion arrives, after the cache does).
    let exists = || ctx.nodes.get(&ObjectRef::new(&name)).is_some();
    if is_uninitialized(&node) || provider_id.is_empty() {
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
    if node.annotations().get(EGRESS_IPCONFIG_ANNOTATION) != Some(&value) {
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

/// Retries a node with capped exponential backoff.
pub(crate) fn error_policy(node: Arc<Node>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.retries.next_delay(&node.name_any());
    tracing::warn!(node = %node.name_any(), %error, retry_in = ?delay, "node annotation failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus, Taint};

    use super::*;

    fn node(provider_id: &str, taint: Option<&str>) -> Node {
        Node {
            spec: Some(NodeSpec {
                provider_id: Some(provider_id.into()),
                taints: taint.map(|k| {
                    vec![Taint {
                        key: k.into(),
                        effect: "NoSchedule".into(),
                        ..Taint::default()
                    }]
                }),
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn uninitialized_taint_is_detected() {
        assert!(is_uninitialized(&node("p", Some(UNINITIALIZED_TAINT))));
        assert!(!is_uninitialized(&node("p", Some("other"))));
        assert!(!is_uninitialized(&node("p", None)));
    }

    fn with_addresses(mut node: Node, addresses: &[&str]) -> Node {
        let addresses = addresses
            .iter()
            .map(|a| NodeAddress {
                type_: "InternalIP".into(),
                address: (*a).into(),
            })
            .collect();
        node.status = Some(NodeStatus {
            addresses: Some(addresses),
            ..NodeStatus::default()
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
