//! Antrea's `Egress` and `ExternalIPPool` (`crd.antrea.io/v1beta1`, the only version Antrea 2.x
//! serves) as cloudnet reads them: the fields the Antrea front end and the admission rules use,
//! with Antrea's JSON names, and the pure reading of them (which IPs an Egress holds, on which
//! node, from which pool). Who writes which field (docs/plugins/antrea.md): antrea-controller
//! allocates `spec.egressIP` from the pool; the agent holding the IP writes `status.egressNode`
//! and `status.egressIP`; nobody writes status when an Egress is deleted.
//!
//! An admin opts a pool in with the label [`OPT_IN_LABEL`]; nothing happens to other pools'
//! Egresses. A label, not an annotation, so that the front end's watch selects the pools on the
//! server and caches no other.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of Antrea's resources.
pub const GROUP: &str = "crd.antrea.io";
/// The one version Antrea 2.x serves.
pub const VERSION: &str = "v1beta1";
/// The label (value [`OPT_IN_VALUE`]) an admin puts on an `ExternalIPPool` so that cloudnet
/// attaches its Egresses' IPs in the cloud.
pub const OPT_IN_LABEL: &str = "cloudnet.io/attach-egress-ips";
/// The opt-in label's value.
pub const OPT_IN_VALUE: &str = "true";

/// What an Egress asks for (`spec`); the Pods it applies to are Antrea's business alone.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "crd.antrea.io",
    version = "v1beta1",
    kind = "Egress",
    plural = "egresses",
    status = "EgressStatus"
)]
pub struct EgressSpec {
    /// The Pods whose traffic leaves through the Egress IP.
    #[serde(default, rename = "appliedTo")]
    pub applied_to: AppliedTo,
    /// The one IP (allocated from `externalIPPool` by antrea-controller when empty).
    #[serde(default, rename = "egressIP", skip_serializing_if = "String::is_empty")]
    pub egress_ip: String,
    /// Several IPs (dual stack), each from the pool of the same index in `externalIPPools`.
    #[serde(default, rename = "egressIPs", skip_serializing_if = "Vec::is_empty")]
    pub egress_ips: Vec<String>,
    /// The pool of `egressIP`.
    #[serde(
        default,
        rename = "externalIPPool",
        skip_serializing_if = "String::is_empty"
    )]
    pub external_ip_pool: String,
    /// The pools of `egressIPs`, index by index.
    #[serde(
        default,
        rename = "externalIPPools",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub external_ip_pools: Vec<String>,
    /// Antrea's rate limit of the Egress's traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
}

/// The Pods an Egress applies to.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct AppliedTo {
    /// Pods by label.
    #[serde(
        default,
        rename = "podSelector",
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_selector: Option<LabelSelector>,
    /// Pods of the Namespaces with these labels.
    #[serde(
        default,
        rename = "namespaceSelector",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace_selector: Option<LabelSelector>,
}

/// Antrea's rate limit of an Egress.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct Bandwidth {
    /// The sustained rate, e.g. `10M`.
    pub rate: String,
    /// The burst size, e.g. `300k`.
    pub burst: String,
}

/// Where the Egress IP is, as the agent holding it writes it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct EgressStatus {
    /// The node that holds the IP; empty when no node can take it.
    #[serde(default, rename = "egressNode")]
    pub egress_node: String,
    /// The effective IP; empty when no node holds it.
    #[serde(default, rename = "egressIP")]
    pub egress_ip: String,
    /// `IPAllocated` (antrea-controller) and `IPAssigned` (the agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<EgressCondition>,
}

/// One of an Egress's conditions.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct EgressCondition {
    /// `IPAllocated` or `IPAssigned`.
    #[serde(default, rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// When `status` last changed (Antrea stamps it on every write).
    #[serde(
        default,
        rename = "lastTransitionTime",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_transition_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// A word for why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// A sentence for why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// One IP an Egress holds, the pool it comes from, and the node Antrea put it on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldIp {
    /// The IP.
    pub ip: IpAddr,
    /// Its pool's name (empty for a static IP without a pool).
    pub pool: String,
    /// `status.egressNode`: empty while no node holds it.
    pub node: String,
}

impl Egress {
    /// The IPs this Egress holds now: `status.egressIP`, else `spec.egressIP` (with
    /// `externalIPPool`), and each of `spec.egressIPs` (with the pool of the same index). A text
    /// that is no IP is skipped: Antrea's schema refuses it, so none comes from Antrea.
    pub fn held_ips(&self) -> Vec<HeldIp> {
        let status = self.status.clone().unwrap_or_default();
        let node = status.egress_node;
        let held = |text: &str, pool: &str| {
            text.parse().ok().map(|ip| HeldIp {
                ip,
                pool: pool.to_owned(),
                node: node.clone(),
            })
        };
        if !self.spec.egress_ips.is_empty() {
            return self
                .spec
                .egress_ips
                .iter()
                .enumerate()
                .filter_map(|(i, ip)| {
                    let pool = self
                        .spec
                        .external_ip_pools
                        .get(i)
                        .map_or("", String::as_str);
                    held(ip, pool)
                })
                .collect();
        }
        let ip = if status.egress_ip.is_empty() {
            &self.spec.egress_ip
        } else {
            &status.egress_ip
        };
        held(ip, &self.spec.external_ip_pool).into_iter().collect()
    }
}

/// A pool of IPs Antrea allocates Egress IPs from, and the nodes they may go to.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "crd.antrea.io",
    version = "v1beta1",
    kind = "ExternalIPPool",
    plural = "externalippools",
    status = "ExternalIPPoolStatus"
)]
pub struct ExternalIPPoolSpec {
    /// The pool's IPs: CIDRs or start–end ranges.
    #[serde(default, rename = "ipRanges")]
    pub ip_ranges: Vec<IpRange>,
    /// Gateway, prefix and VLAN of the ranges (Antrea's use only).
    #[serde(
        default,
        rename = "subnetInfo",
        skip_serializing_if = "Option::is_none"
    )]
    pub subnet_info: Option<SubnetInfo>,
    /// The nodes the IPs may go to; empty selects every node.
    #[serde(default, rename = "nodeSelector")]
    pub node_selector: LabelSelector,
}

/// A range of a pool: `cidr`, or `start` and `end` (both included).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct IpRange {
    /// The range as a CIDR.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
    /// The first IP.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub start: String,
    /// The last IP.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub end: String,
}

/// Subnet attributes of a pool's ranges.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct SubnetInfo {
    /// The gateway.
    pub gateway: String,
    /// The prefix length.
    #[serde(rename = "prefixLength")]
    pub prefix_length: i32,
    /// The VLAN (0 for none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub vlan: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// What antrea-controller counts of a pool.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct ExternalIPPoolStatus {
    /// Total and used IPs.
    #[serde(default)]
    pub usage: IpPoolUsage,
}

/// A pool's size and use.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct IpPoolUsage {
    /// IPs in the pool.
    #[serde(default)]
    pub total: i64,
    /// IPs allocated.
    #[serde(default)]
    pub used: i64,
}

/// Why a range of a pool cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Neither a CIDR nor a start and an end.
    #[error("ipRanges[{index}] has neither a cidr nor a start and an end")]
    Empty {
        /// The range's index.
        index: usize,
    },
    /// A field that is no IP or CIDR.
    #[error("ipRanges[{index}].{field} {value:?} is not {what}")]
    Malformed {
        /// The range's index.
        index: usize,
        /// The field.
        field: &'static str,
        /// Its text.
        value: String,
        /// What it should be.
        what: &'static str,
    },
    /// A start after its end, or of another family.
    #[error("ipRanges[{index}] runs from {start} to {end}, which is no range")]
    Backwards {
        /// The range's index.
        index: usize,
        /// The start.
        start: IpAddr,
        /// The end.
        end: IpAddr,
    },
}

impl ExternalIPPool {
    /// Whether the admin opted this pool in ([`OPT_IN_LABEL`]).
    pub fn opted_in(&self) -> bool {
        self.metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(OPT_IN_LABEL))
            .is_some_and(|value| value == OPT_IN_VALUE)
    }

    /// The pool's ranges as first and last IP, both included.
    pub fn ranges(&self) -> Result<Vec<(IpAddr, IpAddr)>, RangeError> {
        self.spec
            .ip_ranges
            .iter()
            .enumerate()
            .map(|(index, range)| range.bounds(index))
            .collect()
    }

    /// Whether `ip` is in one of the pool's ranges (a malformed range holds nothing).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.spec
            .ip_ranges
            .iter()
            .enumerate()
            .filter_map(|(index, range)| range.bounds(index).ok())
            .any(|(first, last)| first <= ip && ip <= last && first.is_ipv4() == ip.is_ipv4())
    }
}

impl IpRange {
    /// First and last IP of this range (index `index` of its pool).
    pub fn bounds(&self, index: usize) -> Result<(IpAddr, IpAddr), RangeError> {
        let malformed = |field, value: &str, what| RangeError::Malformed {
            index,
            field,
            value: value.to_owned(),
            what,
        };
        if !self.cidr.is_empty() {
            let net: IpNet = self
                .cidr
                .parse()
                .map_err(|_| malformed("cidr", &self.cidr, "a CIDR"))?;
            return Ok((net.network(), net.broadcast()));
        }
        if self.start.is_empty() || self.end.is_empty() {
            return Err(RangeError::Empty { index });
        }
        let start: IpAddr = self
            .start
            .parse()
            .map_err(|_| malformed("start", &self.start, "an IP"))?;
        let end: IpAddr = self
            .end
            .parse()
            .map_err(|_| malformed("end", &self.end, "an IP"))?;
        if start.is_ipv4() != end.is_ipv4() || start > end {
            return Err(RangeError::Backwards { index, start, end });
        }
        Ok((start, end))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn egress(json: serde_json::Value) -> Egress {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn an_egress_holds_its_status_ip_else_its_spec_ip_and_each_of_its_dual_stack_ips() {
        let allocated = egress(serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "Egress",
            "metadata": {"name": "e"},
            "spec": {"appliedTo": {}, "egressIP": "10.0.0.5", "externalIPPool": "pool-a"},
            "status": {"egressNode": "node-b", "egressIP": "10.0.0.4"}
        }));
        assert_eq!(
            allocated.held_ips(),
            [HeldIp {
                ip: "10.0.0.4".parse().unwrap(),
                pool: "pool-a".into(),
                node: "node-b".into()
            }],
            "the agent still holds the old IP until it writes the new one"
        );
        let unassigned = egress(serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "Egress",
            "metadata": {"name": "e"},
            "spec": {"appliedTo": {}, "egressIP": "10.0.0.5", "externalIPPool": "pool-a"},
            "status": {"egressNode": "", "egressIP": ""}
        }));
        assert_eq!(unassigned.held_ips()[0].node, "");
        assert_eq!(unassigned.held_ips()[0].ip.to_string(), "10.0.0.5");
        let dual = egress(serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "Egress",
            "metadata": {"name": "e"},
            "spec": {"appliedTo": {}, "egressIPs": ["10.0.0.6", "fd00::6"],
                     "externalIPPools": ["v4", "v6"]},
            "status": {"egressNode": "node-a", "egressIP": "10.0.0.6"}
        }));
        let held = dual.held_ips();
        assert_eq!(held.len(), 2);
        assert_eq!(
            (held[1].pool.as_str(), held[1].node.as_str()),
            ("v6", "node-a")
        );
        let none = egress(serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "Egress",
            "metadata": {"name": "e"}, "spec": {"appliedTo": {}, "externalIPPool": "p"}
        }));
        assert!(none.held_ips().is_empty(), "not allocated yet");
    }

    #[test]
    fn a_pool_contains_its_cidrs_and_ranges_and_says_which_range_is_malformed() {
        let pool: ExternalIPPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "ExternalIPPool",
            "metadata": {"name": "p", "labels": {OPT_IN_LABEL: "true"}},
            "spec": {"ipRanges": [{"cidr": "10.0.1.0/30"}, {"start": "10.0.2.5", "end": "10.0.2.9"}],
                     "nodeSelector": {}}
        }))
        .unwrap();
        assert!(pool.opted_in());
        for (ip, inside) in [
            ("10.0.1.0", true),
            ("10.0.1.3", true),
            ("10.0.1.4", false),
            ("10.0.2.9", true),
            ("10.0.2.10", false),
            ("::ffff:10.0.2.6", false),
        ] {
            assert_eq!(pool.contains(ip.parse().unwrap()), inside, "{ip}");
        }
        let broken = IpRange {
            start: "10.0.0.9".into(),
            end: "10.0.0.1".into(),
            ..IpRange::default()
        };
        assert!(matches!(
            broken.bounds(2),
            Err(RangeError::Backwards { index: 2, .. })
        ));
        assert_eq!(
            IpRange::default().bounds(0).unwrap_err().to_string(),
            "ipRanges[0] has neither a cidr nor a start and an end"
        );
    }
}
