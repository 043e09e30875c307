//! The `CloudPrivateIPConfig` resource, wire-compatible with OpenShift's `cloud.network.openshift.io/v1`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of the resource.
pub const GROUP: &str = "cloud.network.openshift.io";
/// API version of the resource.
pub const VERSION: &str = "v1";
/// Finalizer that keeps an object until its IP is detached; upstream's exact string.
pub const FINALIZER: &str = "cloudprivateipconfig.cloud.network.openshift.io/finalizer";
/// The one condition type the status carries.
pub const CONDITION_ASSIGNED: &str = "Assigned";
/// The label that marks an object as created by a cloudnet front end (Antrea's, ...), its value
/// the front end's name; objects without it are a network plugin's or an admin's. The CRD's
/// `Front End` column shows it.
pub const FRONT_END_LABEL: &str = "cloudnet.io/front-end";

/// Why the `Assigned` condition has its status; upstream's reason strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AssignedReason {
    /// A cloud call is in flight (`Unknown`).
    CloudResponsePending,
    /// The cloud call failed (`False`).
    CloudResponseError,
    /// The cloud call succeeded (`True`).
    CloudResponseSuccess,
}

impl AssignedReason {
    /// The reason string written to the condition.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::CloudResponsePending => "CloudResponsePending",
            Self::CloudResponseError => "CloudResponseError",
            Self::CloudResponseSuccess => "CloudResponseSuccess",
        }
    }

    /// The condition status that goes with this reason.
    pub const fn status(self) -> &'static str {
        match self {
            Self::CloudResponsePending => "Unknown",
            Self::CloudResponseError => "False",
            Self::CloudResponseSuccess => "True",
        }
    }
}

/// Desired state: the node the IP in the object's name should be attached to.
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "cloud.network.openshift.io",
    version = "v1",
    kind = "CloudPrivateIPConfig",
    plural = "cloudprivateipconfigs",
    singular = "cloudprivateipconfig",
    status = "CloudPrivateIPConfigStatus",
    doc = "Attaches the private IP named by the object (IPv4, or IPv6 written as eight dotted groups) to the primary NIC of a node's cloud VM. Created by the network plugin; status is written by the controller.",
    printcolumn = r#"{"name":"Spec Node","type":"string","description":"Node the IP is requested on","jsonPath":".spec.node"}"#,
    printcolumn = r#"{"name":"Status Node","type":"string","description":"Node the IP is attached to or being worked on","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Assigned","type":"string","description":"Status of the Assigned condition","jsonPath":".status.conditions[?(@.type==\"Assigned\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Reason of the Assigned condition","jsonPath":".status.conditions[?(@.type==\"Assigned\")].reason"}"#,
    printcolumn = r#"{"name":"Front End","type":"string","description":"The cloudnet front end that created it (label cloudnet.io/front-end); empty: a network plugin's or an admin's","jsonPath":".metadata.labels.cloudnet\\.io/front-end"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct CloudPrivateIPConfigSpec {
    /// node is the name of the Node the IP should be attached to; empty means attached nowhere.
    // Upstream serialises the field even when empty; consumers may rely on its presence.
    #[serde(default)]
    pub node: String,
}

/// Observed state: where the IP is attached and how the last cloud call went.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct CloudPrivateIPConfigStatus {
    /// node is the name of the Node the IP is attached to, or being attached to or detached from.
    #[serde(default)]
    pub node: String,
    /// conditions holds exactly one condition, of type Assigned.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::conditions_schema")]
    pub conditions: Vec<Condition>,
}

impl CloudPrivateIPConfig {
    /// The `Assigned` condition, if the status has one.
    pub fn assigned_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_ASSIGNED)
    }

    /// The node the status names, if any.
    pub fn status_node(&self) -> Option<&str> {
        self.status
            .as_ref()
            .map(|s| s.node.as_str())
            .filter(|n| !n.is_empty())
    }

    /// Whether a client may treat the assignment as done: spec and status agree and `Assigned=True`.
    pub fn is_assigned(&self) -> bool {
        !self.spec.node.is_empty()
            && self.status_node() == Some(self.spec.node.as_str())
            && self
                .assigned_condition()
                .is_some_and(|c| c.status == "True")
    }
}
