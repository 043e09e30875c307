//! The part of a Node the reconciler reads, as its caches hold it.
//!
//! The caches hold every Node of the cluster. A `k8s_openapi` `Node` is about 1.5 kB before any
//! field is set (its status types sit inline), and a real one carries labels, other controllers'
//! annotations (OVN-Kubernetes writes several kB a node), image lists and conditions. This
//! projection (kube's `Resource` derive, inheriting the Node's kind) is deserialized straight from
//! the watch, so the rest is never kept.

use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, InternalIps, NodeInfo};
use k8s_openapi::api::core::v1::{NodeAddress, Taint};
use kube::Resource;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The taint the cloud node manager keeps on a node until it has set the providerID.
pub(crate) const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// A Node as the reconciler's caches hold it: its metadata, providerID, taints and addresses.
#[derive(Resource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[resource(inherit = "k8s_openapi::api::core::v1::Node")]
pub struct CachedNode {
    /// The Node's metadata (see [`slim`] for what is kept of it).
    pub metadata: ObjectMeta,
    /// The egress annotation's value, which [`slim`] takes out of `metadata.annotations`: a map
    /// of one entry costs about 540 bytes a node (a B-tree node of eleven slots).
    #[serde(skip)]
    pub egress_annotation: Option<String>,
    /// `spec.providerID` and `spec.taints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CachedNodeSpec>,
    /// `status.addresses`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CachedNodeStatus>,
}

/// The part of a Node's spec the reconciler reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct CachedNodeSpec {
    /// `spec.providerID`: the VM behind the node.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// `spec.taints`: the cloud node manager's uninitialized taint says there is no VM yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<Taint>>,
}

/// The part of a Node's status the reconciler reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct CachedNodeStatus {
    /// `status.addresses`: the node's own addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<NodeAddress>>,
}

impl CachedNode {
    /// `spec.providerID`, if set.
    pub fn provider_id(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.provider_id.as_deref())
    }

    /// `status.addresses`.
    pub fn addresses(&self) -> &[NodeAddress] {
        self.status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or_default()
    }

    /// Whether the cloud node manager still has the node uninitialized.
    pub fn is_uninitialized(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED_TAINT))
    }

    /// The node's first `InternalIP` of each family.
    pub fn internal_ips(&self) -> InternalIps {
        InternalIps::among(self.addresses())
    }

    /// The egress annotation's value, as [`slim`] moved it out of the metadata's map (every
    /// cache of Nodes applies `slim`).
    pub fn egress_annotation(&self) -> Option<&str> {
        self.egress_annotation.as_deref()
    }

    /// What the admission rules read of the node.
    pub fn info(&self) -> NodeInfo {
        NodeInfo::from_parts(
            self.metadata.name.as_deref().unwrap_or_default(),
            self.egress_annotation(),
            self.addresses(),
        )
    }
}

/// Drops from a cached Node's metadata and taints what the reconciler never reads: managed
/// fields, labels, owner references, every annotation (the egress one moves to
/// [`CachedNode::egress_annotation`]), every taint but the uninitialized one.
pub fn slim(node: &mut CachedNode) {
    let meta = &mut node.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    node.egress_annotation = meta
        .annotations
        .take()
        .and_then(|mut all| all.remove(EGRESS_IPCONFIG_ANNOTATION));
    if let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        taints.retain(|t| t.key == UNINITIALIZED_TAINT);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use kube::ResourceExt;
    use serde_json::json;

    use super::*;

    /// A Node as a real cluster's API server returns it, with everything the cache drops.
    fn real_node() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "worker-a",
                "uid": "0b8a6c8e-0000-4000-8000-000000000001",
                "resourceVersion": "4711",
                "labels": {"kubernetes.io/hostname": "worker-a"},
                "annotations": {
                    EGRESS_IPCONFIG_ANNOTATION: "[]",
                    "k8s.ovn.org/node-subnets": "x".repeat(4096),
                },
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {
                "providerID": "aws:///us-east-1a/i-0abc",
                "podCIDR": "10.128.0.0/23",
                "taints": [
                    {"key": UNINITIALIZED_TAINT, "effect": "NoSchedule"},
                    {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
                ],
            },
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "10.0.0.5"},
                    {"type": "Hostname", "address": "worker-a"},
                    {"type": "InternalIP", "address": "10.0.0.9"},
                ],
                "images": [{"names": ["quay.io/example/big@sha256:0"], "sizeBytes": 1_073_741_824}],
                "nodeInfo": {"kubeletVersion": "v1.36.0"},
            },
        })
    }

    #[test]
    fn a_cached_node_reads_as_the_full_node_does() {
        let full: Node = serde_json::from_value(real_node()).unwrap();
        let mut cached: CachedNode = serde_json::from_value(real_node()).unwrap();
        slim(&mut cached);

        assert_eq!(cached.name_any(), "worker-a");
        assert_eq!(cached.provider_id(), Some("aws:///us-east-1a/i-0abc"));
        assert!(cached.is_uninitialized());
        assert_eq!(cached.internal_ips(), InternalIps::of(&full));
        assert_eq!(cached.info(), NodeInfo::from_node(&full));
        assert_eq!(cached.egress_annotation(), Some("[]"));
        assert!(cached.metadata.annotations.is_none());
        assert!(cached.metadata.labels.is_none());
        assert!(cached.metadata.managed_fields.is_none());
        assert_eq!(cached.spec.and_then(|s| s.taints).map(|t| t.len()), Some(1));
        assert_eq!(cached.metadata.resource_version.as_deref(), Some("4711"));
    }

    #[test]
    fn its_api_is_the_nodes() {
        assert_eq!(CachedNode::kind(&()), "Node");
        assert_eq!(CachedNode::api_version(&()), "v1");
        assert_eq!(CachedNode::plural(&()), "nodes");
        assert_eq!(CachedNode::url_path(&(), None), "/api/v1/nodes");
    }
}
