//! The admission rules of SPEC §3 as pure functions over a [`ClusterSnapshot`].
//!
//! The webhook calls [`review`] for every request; the reconciler calls the single rules
//! ([`check_address_index`], [`check_claim`]) before a cloud call, so both make the same
//! decision.

pub mod address_index;
pub mod antrea;
pub mod capacity;
pub mod egress_router;
pub mod egress_router_cni;
pub mod gateway;
pub mod gateway_index;
pub mod name_encoding;
pub mod node_ip;
mod picked;
pub mod public_ip;
pub mod public_ip_index;
pub mod router_addresses;
pub mod router_conflict;
pub mod router_index;
pub mod snapshot;
pub mod target_node;

use std::fmt;

use thiserror::Error;

use crate::annotation::EGRESS_IPCONFIG_ANNOTATION;
use crate::excerpt;
use crate::node::EgressState;
use crate::platform::{KeyMismatch, Platform, key_mismatch};

pub use address_index::{check_address_index, check_family_supported};
pub use antrea::{review_egress, review_pool};
pub use capacity::{
    Claim, check_capacity, check_capacity_count, check_claim, claims_ahead, occupies,
};
pub use egress_router::{check_egress_router, review_egress_router};
pub use egress_router_cni::{check_cni_config, review_nad};
pub use gateway::{check_object_claim, review_gateway};
pub use gateway_index::GatewayIndex;
pub use name_encoding::check_name;
pub use node_ip::check_node_ip;
pub use public_ip::review_public_ip;
pub use public_ip_index::PublicIpIndex;
pub use router_conflict::check_router_addresses;
pub use router_index::RouterIndex;
pub use snapshot::ClusterSnapshot;
pub use target_node::check_target_node;

/// The admission operation being reviewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `CREATE`.
    Create,
    /// `UPDATE`.
    Update,
    /// `DELETE`.
    Delete,
    /// `CONNECT`.
    Connect,
}

impl Operation {
    /// The AdmissionReview spelling: `CREATE`, `UPDATE`, `DELETE`, `CONNECT`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Connect => "CONNECT",
        }
    }
}

/// The parts of a `CloudPrivateIPConfig` the rules look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectView<'a> {
    /// `metadata.name`: the IP in canonical spelling.
    pub name: &'a str,
    /// `spec.node`: the target node, or empty.
    pub spec_node: &'a str,
}

/// An admission rule, named by its stable metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Rule 1: the name is the canonical name of a usable unicast IP.
    NameEncoding,
    /// Rule 2: `spec.node` names an existing node.
    TargetNode,
    /// Rule 3: the IP is no node's own address.
    NodeIp,
    /// Rule 4: the IP lies in the node's subnet, off the cloud-reserved indices.
    AddressIndex,
    /// Rule 5: the node has room for one more egress IP in the IP's bucket.
    Capacity,
    /// Rule 6: the request itself is malformed.
    BadInput,
    /// An EgressRouter's mode is not `Redirect`.
    EgressRouterMode,
    /// An egress router's interface: macvlan mode and master, CNI `interfaceType` and its args.
    EgressRouterInterface,
    /// An egress router's addresses: CIDR form, gateway inside the network, unique, present.
    EgressRouterAddress,
    /// An egress router's redirect rules, fallback IP or CNI destinations.
    EgressRouterRedirect,
    /// The shape of an egress-router CNI configuration: readable, one of `ip`/`podIP`/`ipConfig`,
    /// pod keys, `ipConfig.name`.
    EgressRouterCni,
    /// An egress router's address is a node's, a CloudPrivateIPConfig's or another router's.
    EgressRouterConflict,
    /// An EgressPublicIP's `spec.privateIP`: canonical, usable, of a family the cloud serves.
    PublicIpPrivate,
    /// An EgressPublicIP's `spec.publicIP`: the id shape of the cloud in use.
    PublicIpId,
    /// An EgressPublicIP on a cloud that cannot bind public addresses to egress IPs (GCP).
    PublicIpPlatform,
    /// An EgressPublicIP's private IP or public address is bound by another one.
    PublicIpConflict,
    /// An EgressPublicIP's spec changed after creation.
    PublicIpImmutable,
    /// An Antrea Egress's IP lies outside its opted-in ExternalIPPool.
    AntreaEgressIp,
    /// An EgressGateway's egress IP: canonical, usable, listed once.
    GatewayIp,
    /// An EgressGateway's egress IP is another's (a gateway's, an opted-in Antrea pool's, a
    /// CloudPrivateIPConfig's), or a CloudPrivateIPConfig is created for a gateway's IP.
    GatewayConflict,
}

impl Rule {
    /// Every rule, e.g. to pre-register metric series.
    pub const ALL: [Rule; 20] = [
        Self::NameEncoding,
        Self::TargetNode,
        Self::NodeIp,
        Self::AddressIndex,
        Self::Capacity,
        Self::BadInput,
        Self::EgressRouterMode,
        Self::EgressRouterInterface,
        Self::EgressRouterAddress,
        Self::EgressRouterRedirect,
        Self::EgressRouterCni,
        Self::EgressRouterConflict,
        Self::PublicIpPrivate,
        Self::PublicIpId,
        Self::PublicIpPlatform,
        Self::PublicIpConflict,
        Self::PublicIpImmutable,
        Self::AntreaEgressIp,
        Self::GatewayIp,
        Self::GatewayConflict,
    ];

    /// Stable snake_case name, used as metric label and message prefix.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NameEncoding => "name_encoding",
            Self::TargetNode => "target_node",
            Self::NodeIp => "node_ip",
            Self::AddressIndex => "address_index",
            Self::Capacity => "capacity",
            Self::BadInput => "bad_input",
            Self::EgressRouterMode => "egress_router_mode",
            Self::EgressRouterInterface => "egress_router_interface",
            Self::EgressRouterAddress => "egress_router_address",
            Self::EgressRouterRedirect => "egress_router_redirect",
            Self::EgressRouterCni => "egress_router_cni",
            Self::EgressRouterConflict => "egress_router_conflict",
            Self::PublicIpPrivate => "public_ip_private",
            Self::PublicIpId => "public_ip_id",
            Self::PublicIpPlatform => "public_ip_platform",
            Self::PublicIpConflict => "public_ip_conflict",
            Self::PublicIpImmutable => "public_ip_immutable",
            Self::AntreaEgressIp => "antrea_egress_ip",
            Self::GatewayIp => "egress_gateway_ip",
            Self::GatewayConflict => "egress_gateway_conflict",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest denial message sent: every real one fits in a fraction of it, while one that
/// echoes a huge user-written field (a node name as long as the request body) is cut.
pub const MESSAGE_BYTES: usize = 2048;

/// A refusal: which rule, and a message for the cluster admin that starts with the rule name.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct Denial {
    /// The rule that refused.
    pub rule: Rule,
    /// `"<rule>: <what is wrong, with IP and node>; <the fix>"`.
    pub message: String,
}

impl Denial {
    /// A denial whose message is `detail` prefixed with the rule name (unless it already is),
    /// cut to [`MESSAGE_BYTES`].
    pub fn new(rule: Rule, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        let already_prefixed = detail
            .strip_prefix(rule.as_str())
            .is_some_and(|rest| rest.starts_with(": "));
        let message = if already_prefixed {
            detail
        } else {
            format!("{rule}: {detail}")
        };
        Self {
            rule,
            message: excerpt::bounded(message, MESSAGE_BYTES),
        }
    }
}

/// The outcome of a review: allowed or denied, plus admission warnings either way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// `Some` when the request is refused.
    pub denial: Option<Denial>,
    /// Non-fatal concerns, sent back as admission warnings.
    pub warnings: Vec<String>,
    /// The target node's annotation carries another cloud's capacity keys (also a warning);
    /// for the operator's metrics and logs.
    pub mismatch: Option<MismatchedNode>,
}

/// A node whose annotation's capacity keys are another cloud's than the configured platform's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MismatchedNode {
    /// The node's name.
    pub node: String,
    /// Which keys were expected and found.
    pub mismatch: KeyMismatch,
}

impl Verdict {
    /// An allowing verdict without warnings.
    pub fn allow() -> Self {
        Self::default()
    }

    /// A denying verdict; see [`Denial::new`] for the message.
    pub fn deny(rule: Rule, detail: impl Into<String>) -> Self {
        Self::from(Denial::new(rule, detail))
    }

    /// Whether the request is allowed.
    pub fn allowed(&self) -> bool {
        self.denial.is_none()
    }

    /// Adds an admission warning.
    pub fn with_warning(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
        self
    }
}

impl From<Denial> for Verdict {
    fn from(denial: Denial) -> Self {
        Self {
            denial: Some(denial),
            ..Self::default()
        }
    }
}

/// What a review decides before reading the object: a delete (or connect) always passes, since
/// it is how an object is undone and a finalizer, not admission, guards the cloud side; a create
/// or update without an object is bad input. `Ok` is the object to review. `subject` names the
/// object in the message (`" for egress/r1"`, or empty), `kind` its kind.
pub(crate) fn reviewable<'a, T>(
    operation: Operation,
    new: Option<&'a T>,
    subject: &str,
    kind: &str,
) -> Result<&'a T, Verdict> {
    if matches!(operation, Operation::Delete | Operation::Connect) {
        return Err(Verdict::allow());
    }
    new.ok_or_else(|| {
        Verdict::deny(
            Rule::BadInput,
            format!(
                "the {} request{subject} carries no object to review; send the {kind} in request.object",
                operation.as_str()
            ),
        )
    })
}

/// The whole admission decision for one request (SPEC §3).
///
/// `new` is the object after the operation, `old` the one before (updates only). `platform` is
/// `None` when the webhook was not told the cloud; the address-index rule is then skipped and the
/// capacity bucket is taken from the annotation's keys.
pub fn review(
    operation: Operation,
    new: Option<ObjectView<'_>>,
    old: Option<ObjectView<'_>>,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Verdict {
    if matches!(operation, Operation::Delete | Operation::Connect) {
        // A delete must always pass: the finalizer, not admission, guards the detach.
        return Verdict::allow();
    }
    let Some(new) = new else {
        return Verdict::deny(
            Rule::BadInput,
            format!(
                "the {} request carries no object to review; send the CloudPrivateIPConfig in request.object",
                operation.as_str()
            ),
        );
    };
    if operation == Operation::Update && old == Some(new) {
        // Metadata-only update (finalizer removal, labels): the rules may have changed since the
        // object was admitted, and refusing here would leave it stuck forever.
        return Verdict::allow();
    }
    let mut verdict = Verdict::allow();
    if let Err(denial) = check_spec(operation, new, cluster, platform, &mut verdict) {
        verdict.denial = Some(denial);
    }
    verdict
}

/// Rules 1–5 for a new or changed name/spec; a move is checked like a create on its new node
/// (except rule 3, which an update never trips). Warnings go into `verdict`.
fn check_spec(
    operation: Operation,
    object: ObjectView<'_>,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
    verdict: &mut Verdict,
) -> Result<(), Denial> {
    let warnings = &mut verdict.warnings;
    let ip = check_name(object.name, object.spec_node)?;
    check_node_ip(operation, ip, object.name, object.spec_node, cluster)?;
    if object.spec_node.is_empty() {
        warnings.push(format!(
            "{ip} has an empty spec.node, so it will not be attached to any node until spec.node is set"
        ));
        return Ok(());
    }
    let node = check_target_node(ip, object.spec_node, cluster)?;
    if let Some(platform) = platform {
        // Knowing the cloud is enough to refuse a family it cannot attach; no annotation needed.
        check_family_supported(ip, &node.name, platform)?;
    }
    let config = match &node.egress {
        EgressState::Present(config) => config,
        EgressState::Missing => {
            warnings.push(format!(
                "node {} has no {EGRESS_IPCONFIG_ANNOTATION} annotation yet, so the subnet, reserved-index and capacity checks for {ip} were skipped; {UNCHECKED}",
                node.name
            ));
            return Ok(());
        }
        EgressState::Invalid(error) => {
            warnings.push(format!(
                "node {}: {error}, so the subnet, reserved-index and capacity checks for {ip} were skipped; {UNCHECKED}",
                node.name
            ));
            return Ok(());
        }
    };
    if let Some(platform) = platform {
        check_address_index(ip, &node.name, &config.ifaddr, platform)?;
    }
    if let Some(mismatch) = key_mismatch(platform, &config.capacity) {
        warnings.push(format!(
            "node {}: annotation {EGRESS_IPCONFIG_ANNOTATION}: {mismatch}",
            node.name
        ));
        verdict.mismatch = Some(MismatchedNode {
            node: node.name.clone(),
            mismatch,
        });
    }
    check_capacity(
        ip,
        object.name,
        &node.name,
        &config.capacity,
        platform,
        cluster,
    )
}

/// What happens to an IP admitted without the annotation-based checks. The reconciler annotates
/// every node itself and repeats the checks from its own node cache right before the cloud
/// call, so they are skipped only while the node is still unannotated then (an attach racing
/// the first annotation, or a node it cannot describe: uninitialized, VM unknown to the cloud).
const UNCHECKED: &str = "the reconciler repeats them from the annotation before attaching if the node is annotated by then, otherwise the cloud's own answer decides (a refusal shows in the object's Assigned condition)";

/// The start of most denial messages: what cannot go where.
fn cannot_place(what: impl fmt::Display, node: &str) -> String {
    if node.is_empty() {
        format!("cannot use {what} as an egress IP")
    } else {
        format!("cannot place {what} on node {node}")
    }
}
