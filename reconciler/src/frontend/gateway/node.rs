//! The part of a Node the gateway front end reads: labels (its selectors and the active
//! label), whether it may carry a gateway (Ready, schedulable, not being deleted, no
//! `NoExecute` taint) and its egress annotation (capacity). Deserialized straight from the
//! watch, as the controllers' `CachedNode` is, so image lists and other controllers'
//! annotations are never kept.

use cloudnet_shared::EGRESS_IPCONFIG_ANNOTATION;
use cloudnet_shared::gateway::ACTIVE_LABEL_PREFIX;
use kube::Resource;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};

/// A Node as the gateway front end holds it.
#[derive(Resource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[resource(inherit = "k8s_openapi::api::core::v1::Node")]
pub(crate) struct GatewayNode {
    /// Name, labels, deletion timestamp and the egress annotation (see [`slim`]).
    pub(crate) metadata: ObjectMeta,
    /// `spec.unschedulable` and `spec.taints`.
    #[serde(default)]
    pub(crate) spec: Spec,
    /// `status.conditions`.
    #[serde(default)]
    pub(crate) status: Status,
}

/// The part of a Node's spec read here.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub(crate) struct Spec {
    /// Cordoned.
    #[serde(default)]
    pub(crate) unschedulable: bool,
    /// Only the `NoExecute` ones are kept.
    #[serde(default)]
    pub(crate) taints: Vec<Taint>,
}

/// A taint's effect, all that is read of it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub(crate) struct Taint {
    /// `NoExecute`, `NoSchedule`, `PreferNoSchedule`.
    #[serde(default)]
    pub(crate) effect: String,
}

/// The part of a Node's status read here.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub(crate) struct Status {
    /// Only `Ready` is kept.
    #[serde(default)]
    pub(crate) conditions: Vec<Condition>,
}

/// A node condition's type and status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub(crate) struct Condition {
    /// `Ready`, ...
    #[serde(rename = "type", default)]
    pub(crate) type_: String,
    /// `True`, `False`, `Unknown`.
    #[serde(default)]
    pub(crate) status: String,
}

impl GatewayNode {
    /// Ready, schedulable, not being deleted, no `NoExecute` taint.
    pub(crate) fn healthy(&self) -> bool {
        self.metadata.deletion_timestamp.is_none()
            && !self.spec.unschedulable
            && self.spec.taints.is_empty()
            && self
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    }

    /// The egress annotation's value.
    pub(crate) fn egress_annotation(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(EGRESS_IPCONFIG_ANNOTATION)
            .map(String::as_str)
    }

    /// The gateways whose active label the node carries.
    pub(crate) fn active_labels(&self) -> impl Iterator<Item = &str> {
        self.metadata
            .labels
            .iter()
            .flatten()
            .filter(|(key, _)| key.starts_with(ACTIVE_LABEL_PREFIX))
            .map(|(key, _)| key.as_str())
    }
}

/// Drops what is never read: managed fields, owner references, every annotation but the
/// egress one, taints other than `NoExecute`, conditions other than `Ready`.
pub(crate) fn slim(node: &mut GatewayNode) {
    let meta = &mut node.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|key, _| key == EGRESS_IPCONFIG_ANNOTATION);
    }
    node.spec.taints.retain(|t| t.effect == "NoExecute");
    node.status.conditions.retain(|c| c.type_ == "Ready");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_node_is_healthy_only_ready_schedulable_untainted_and_not_deleting() {
        let mut node: GatewayNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "a", "annotations": {"other": "x", EGRESS_IPCONFIG_ANNOTATION: "[]"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}],
                       "images": [{"names": ["x"]}]}
        }))
        .unwrap();
        slim(&mut node);
        assert!(node.healthy(), "a NoSchedule taint does not count");
        assert_eq!(node.egress_annotation(), Some("[]"));
        assert_eq!(node.metadata.annotations.as_ref().unwrap().len(), 1);
        let mut cordoned = node.clone();
        cordoned.spec.unschedulable = true;
        assert!(!cordoned.healthy());
        let mut tainted = node.clone();
        tainted.spec.taints.push(Taint {
            effect: "NoExecute".into(),
        });
        assert!(!tainted.healthy());
        let mut not_ready = node;
        not_ready.status.conditions[0].status = "Unknown".into();
        assert!(!not_ready.healthy());
    }
}
