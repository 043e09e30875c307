//! The `EgressPublicIP` resource (`cloudnet.io/v1alpha1`): an admin's binding of a public address
//! (AWS Elastic IP, Azure public IP, OpenStack floating IP) to an egress IP, which the reconciler
//! keeps associated with whichever node's interface holds the egress IP (docs/public-ips.md).

pub mod crd;
pub mod id;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crd::crd;
pub use id::{PublicId, PublicIdError};

/// API group of the resource.
pub const GROUP: &str = "cloudnet.io";
/// API version of the resource.
pub const VERSION: &str = "v1alpha1";
/// The one condition type the status carries.
pub const CONDITION_ASSOCIATED: &str = "Associated";
/// The marker the admin puts on a public address in the cloud to let cloudnet move it; an
/// address without it is never touched. On AWS: the tag with this key and [`MARKER_VALUE`].
pub const MARKER_KEY: &str = "cloudnet.io/egress-public-ip";
/// The marker on Azure (a tag of this name with [`MARKER_VALUE`]) and on OpenStack (a floating IP
/// tag of this text): Azure tag names cannot hold `/`, nor can a Neutron tag in its URL.
pub const MARKER_PLAIN: &str = "cloudnet-egress-public-ip";
/// The marker tag's value (AWS, Azure).
pub const MARKER_VALUE: &str = "true";

/// The marker on `platform`'s public addresses, as messages and docs spell it.
pub const fn marker(platform: crate::platform::Platform) -> &'static str {
    use crate::platform::Platform;
    match platform {
        Platform::Aws => "the tag cloudnet.io/egress-public-ip=true",
        Platform::Azure => "the tag cloudnet-egress-public-ip=true",
        Platform::OpenStack => "the floating IP tag cloudnet-egress-public-ip",
        Platform::Gcp => "none (GCP is not supported)",
    }
}

/// Why the `Associated` condition has its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AssociatedReason {
    /// The public address sits on the egress IP on the node's interface (`True`).
    Associated,
    /// An association call is in flight (`Unknown`).
    Pending,
    /// The egress IP is attached to no node yet, so there is nothing to associate with (`False`).
    EgressIPNotAttached,
    /// The public address does not carry the admin's marker ([`MARKER_KEY`]) (`False`).
    MarkerMissing,
    /// The cloud has no public address with this id (`False`).
    PublicIPNotFound,
    /// The cloud refused for want of a permission, which the message names (`False`).
    PermissionDenied,
    /// Another binding already claims the private IP or the public address (`False`).
    Conflict,
    /// Any other cloud failure; retried (`False`).
    CloudError,
}

impl AssociatedReason {
    /// The reason string written to the condition.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Associated => "Associated",
            Self::Pending => "Pending",
            Self::EgressIPNotAttached => "EgressIPNotAttached",
            Self::MarkerMissing => "MarkerMissing",
            Self::PublicIPNotFound => "PublicIPNotFound",
            Self::PermissionDenied => "PermissionDenied",
            Self::Conflict => "Conflict",
            Self::CloudError => "CloudError",
        }
    }

    /// The condition status that goes with this reason.
    pub const fn status(self) -> &'static str {
        match self {
            Self::Associated => "True",
            Self::Pending => "Unknown",
            _ => "False",
        }
    }
}

/// The message kube-apiserver refuses a change of an `EgressPublicIP`'s spec with.
pub const SPEC_IMMUTABLE: &str = "spec is immutable: delete the binding and create another";

/// Desired state: which public address follows which egress IP.
// The CRD's own rule keeps spec immutable wherever the webhook does not answer for it (its
// configuration not installed, or set to `failurePolicy: Ignore` by an admin): the reconciler
// must always know which association it made, to undo exactly that one.
#[derive(
    CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[x_kube(validation = Rule::new("self == oldSelf").message(SPEC_IMMUTABLE))]
#[kube(
    group = "cloudnet.io",
    version = "v1alpha1",
    kind = "EgressPublicIP",
    plural = "egresspublicips",
    singular = "egresspublicip",
    status = "EgressPublicIPStatus",
    doc = "Binds a public address of the cloud to an egress IP: the reconciler keeps the public address associated with the egress IP on whichever node holds it. Written by cluster admins; status is written by the reconciler.",
    printcolumn = r#"{"name":"Private","type":"string","description":"The egress IP","jsonPath":".spec.privateIP"}"#,
    printcolumn = r#"{"name":"Public","type":"string","description":"The cloud's id of the public address","jsonPath":".spec.publicIP"}"#,
    printcolumn = r#"{"name":"Node","type":"string","description":"Node whose interface the public address is associated on","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Associated","type":"string","description":"Status of the Associated condition","jsonPath":".status.conditions[?(@.type==\"Associated\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Reason of the Associated condition","priority":1,"jsonPath":".status.conditions[?(@.type==\"Associated\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct EgressPublicIPSpec {
    /// privateIP is the egress IP in canonical form (IPv4 dotted decimal, IPv6 as RFC 5952 writes it); immutable.
    #[serde(rename = "privateIP")]
    pub private_ip: String,
    /// publicIP is the cloud's id of the public address: an AWS allocation id (eipalloc-…), an Azure public IP resource id, or an OpenStack floating IP id; immutable.
    #[serde(rename = "publicIP")]
    pub public_ip: String,
}

/// Observed state: where the public address is associated and how the last cloud call went.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct EgressPublicIPStatus {
    /// node is the Node whose interface holds the egress IP and the public address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// interface is the cloud's id of that interface (ENI id, NIC name, Neutron port id).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface: String,
    /// associationID is the cloud's id of the association the reconciler made (AWS eipassoc-…), so that deleting the binding undoes that one and no other.
    #[serde(
        rename = "associationID",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub association_id: String,
    /// conditions holds exactly one condition, of type Associated.
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

impl EgressPublicIP {
    /// The `Associated` condition, if the status has one.
    pub fn associated_condition(&self) -> Option<&Condition> {
        self.status.as_ref()?.associated_condition()
    }
}

impl EgressPublicIPStatus {
    /// The `Associated` condition, if there is one.
    pub fn associated_condition(&self) -> Option<&Condition> {
        self.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_ASSOCIATED)
    }
}
