//! The `EgressGateway` resource (`cloudnet.io/v1alpha1`): an admin's highly available egress
//! gateway. The reconciler's leader picks one healthy node the selector matches (the *active*
//! node), keeps each egress IP as a CloudPrivateIPConfig on it, and the node agent
//! (`cloudnet-node`) on that node puts the IPs on the interface the cloud attached them to and
//! labels its node ([`active_label`]), which a plugin's policy selects (Cilium's
//! `CiliumEgressGatewayPolicy`: docs/plugins/cilium.md).
//!
//! The names both processes agree on live here: the node label, the agents' heartbeat Leases
//! and the front end's owner label value.

pub mod crd;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crd::crd;

/// API group of the resource.
pub const GROUP: &str = "cloudnet.io";
/// API version of the resource.
pub const VERSION: &str = "v1alpha1";
/// The one condition type the status carries.
pub const CONDITION_READY: &str = "Ready";
/// The value of the front-end owner label (`cloudnet.io/front-end`) on the CloudPrivateIPConfigs
/// the reconciler keeps for gateways.
pub const FRONT_END: &str = "egress-gateway";
/// The prefix of the label on a gateway's active node: `egress-gateway.cloudnet.io/<gateway>`.
pub const ACTIVE_LABEL_PREFIX: &str = "egress-gateway.cloudnet.io/";
/// The value of that label.
pub const ACTIVE_VALUE: &str = "active";
/// The prefix of each node agent's heartbeat Lease: `cloudnet-node-<node>`.
pub const LEASE_PREFIX: &str = "cloudnet-node-";
/// The longest gateway name: the name part of a label key ([`active_label`]) is at most 63.
pub const MAX_NAME_BYTES: usize = 63;
/// The most egress IPs one gateway holds.
pub const MAX_EGRESS_IPS: usize = 32;

/// The label key the active node of gateway `name` carries, with [`ACTIVE_VALUE`].
pub fn active_label(name: &str) -> String {
    format!("{ACTIVE_LABEL_PREFIX}{name}")
}

/// The gateway a label key marks the active node of, if it is such a key.
pub fn gateway_of_label(key: &str) -> Option<&str> {
    key.strip_prefix(ACTIVE_LABEL_PREFIX)
        .filter(|name| !name.is_empty())
}

/// The name of node `node`'s heartbeat Lease.
pub fn lease_name(node: &str) -> String {
    format!("{LEASE_PREFIX}{node}")
}

/// The node a heartbeat Lease's name is for, if it is one.
pub fn node_of_lease(lease: &str) -> Option<&str> {
    lease
        .strip_prefix(LEASE_PREFIX)
        .filter(|node| !node.is_empty())
}

/// Why the `Ready` condition has its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadyReason {
    /// Every egress IP is attached to the active node in the cloud and on its interface, and
    /// the node carries the label (`True`).
    Ready,
    /// An active node is chosen and its IPs are being attached or moved (`Unknown`).
    Pending,
    /// No node is eligible: none matches the selector, or every match is NotReady, cordoned,
    /// being deleted, tainted NoExecute or without a fresh agent heartbeat (`False`).
    NoEligibleNode,
    /// The nodes that are otherwise eligible have no room left for the IPs (`False`).
    CapacityReached,
    /// The cloud refused or failed an attach; the message carries its reason (`False`).
    CloudError,
}

impl ReadyReason {
    /// The reason string written to the condition.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "Ready",
            Self::Pending => "Pending",
            Self::NoEligibleNode => "NoEligibleNode",
            Self::CapacityReached => "CapacityReached",
            Self::CloudError => "CloudError",
        }
    }

    /// The condition status that goes with this reason.
    pub const fn status(self) -> &'static str {
        match self {
            Self::Ready => "True",
            Self::Pending => "Unknown",
            _ => "False",
        }
    }
}

/// Desired state: which nodes may carry which egress IPs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cloudnet.io",
    version = "v1alpha1",
    kind = "EgressGateway",
    plural = "egressgateways",
    singular = "egressgateway",
    status = "EgressGatewayStatus",
    doc = "A highly available egress gateway: the reconciler keeps its egress IPs on one healthy node the selector picks, in the cloud and on the node's interface, labels that node egress-gateway.cloudnet.io/<name>=active, and moves all of it to another node within seconds when that node fails. Written by cluster admins; status is written by the reconciler.",
    printcolumn = r#"{"name":"Egress IPs","type":"string","description":"The egress IPs","jsonPath":".spec.egressIPs"}"#,
    printcolumn = r#"{"name":"Active Node","type":"string","description":"The node that holds the egress IPs","jsonPath":".status.activeNode"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","description":"Status of the Ready condition","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Reason of the Ready condition","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct EgressGatewaySpec {
    /// nodeSelector picks the nodes that may be the gateway; an empty selector picks every node.
    #[serde(rename = "nodeSelector")]
    pub node_selector: LabelSelector,
    /// egressIPs are the addresses the gateway holds, in canonical form (IPv4 dotted decimal, IPv6 as RFC 5952 writes it), each in the subnet of the selected nodes' cloud interface.
    #[serde(rename = "egressIPs")]
    pub egress_ips: Vec<String>,
}

/// Observed state: the active node and whether the gateway works.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct EgressGatewayStatus {
    /// activeNode is the node that holds the egress IPs; empty while no node is eligible.
    #[serde(
        rename = "activeNode",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub active_node: String,
    /// conditions holds exactly one condition, of type Ready.
    #[serde(default)]
    #[schemars(schema_with = "crd::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// observedGeneration is the metadata.generation the status was written for.
    #[serde(
        rename = "observedGeneration",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub observed_generation: Option<i64>,
}

impl EgressGateway {
    /// The `Ready` condition, if the status has one.
    pub fn ready_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
    }

    /// The active node the status names, if any.
    pub fn active_node(&self) -> Option<&str> {
        self.status
            .as_ref()
            .map(|status| status.active_node.as_str())
            .filter(|node| !node.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_and_lease_names_round_trip() {
        assert_eq!(active_label("web"), "egress-gateway.cloudnet.io/web");
        assert_eq!(gateway_of_label(&active_label("web")), Some("web"));
        assert_eq!(gateway_of_label("egress-gateway.cloudnet.io/"), None);
        assert_eq!(gateway_of_label("kubernetes.io/hostname"), None);
        assert_eq!(node_of_lease(&lease_name("worker-1")), Some("worker-1"));
        assert_eq!(node_of_lease("cloud-network-config-controller-lock"), None);
    }
}
