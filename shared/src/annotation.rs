//! The node annotation `cloud.network.openshift.io/egress-ipconfig`: a node's cloud subnet and
//! egress-IP capacity, byte-identical to what upstream writes.
//!
//! Consumers such as OVN-Kubernetes search the raw string (e.g. for `"ipv4":"`), so the field
//! order, the compact form and the omission rules below are part of the wire contract.

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Deserializer, Serialize};
use thiserror::Error;

use crate::platform::Bucket;

/// The annotation key on Node objects.
pub const EGRESS_IPCONFIG_ANNOTATION: &str = "cloud.network.openshift.io/egress-ipconfig";

/// One managed interface of a node (today always the primary NIC).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressIpConfig {
    /// Cloud identifier or name of the interface (ENI id, `nic0`, NIC name, port id).
    #[serde(default)]
    pub interface: String,
    /// The subnets of the interface, one per family.
    #[serde(default)]
    pub ifaddr: IfAddr,
    /// How many more egress IPs the interface can take.
    #[serde(default)]
    pub capacity: Capacity,
}

/// The network CIDR of the interface's subnet in each family it has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfAddr {
    /// IPv4 subnet, host bits zero.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "empty_as_none"
    )]
    pub ipv4: Option<Ipv4Net>,
    /// IPv6 subnet, host bits zero.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "empty_as_none"
    )]
    pub ipv6: Option<Ipv6Net>,
}

impl IfAddr {
    /// Subnets with the host bits cleared, as the annotation must carry them.
    pub fn new(ipv4: Option<Ipv4Net>, ipv6: Option<Ipv6Net>) -> Self {
        Self {
            ipv4: ipv4.map(|n| n.trunc()),
            ipv6: ipv6.map(|n| n.trunc()),
        }
    }

    /// The same subnets with any host bits cleared.
    pub fn normalized(self) -> Self {
        Self::new(self.ipv4, self.ipv6)
    }
}

/// Egress-IP capacity per bucket; `None` (key absent) means unlimited to OVN-Kubernetes.
///
/// A present value is always written, even 0 or negative: dropping it would turn a full node into
/// an unlimited one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// IPv4 capacity on per-family clouds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<i64>,
    /// IPv6 capacity on per-family clouds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<i64>,
    /// Shared capacity of both families on the other clouds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<i64>,
}

impl Capacity {
    /// The capacity of `bucket`; `None` means unlimited.
    pub const fn get(&self, bucket: Bucket) -> Option<i64> {
        match bucket {
            Bucket::Ipv4 => self.ipv4,
            Bucket::Ipv6 => self.ipv6,
            Bucket::Ip => self.ip,
        }
    }
}

/// The annotation value could not be read.
#[derive(Debug, Error)]
#[error(
    "annotation {EGRESS_IPCONFIG_ANNOTATION} is not a JSON list of \
     {{\"interface\",\"ifaddr\",\"capacity\"}} objects: {source}"
)]
pub struct AnnotationError {
    #[from]
    source: serde_json::Error,
}

/// The annotation value for `configs`: compact JSON in upstream's key order, subnets normalised.
pub fn encode(configs: &[EgressIpConfig]) -> String {
    let normalized: Vec<EgressIpConfig> = configs
        .iter()
        .map(|c| EgressIpConfig {
            ifaddr: c.ifaddr.normalized(),
            ..c.clone()
        })
        .collect();
    // Serialising plain strings, CIDRs and integers into a String cannot fail; an empty list is
    // still the right answer should that ever change, as it means "nothing known" to readers.
    serde_json::to_string(&normalized).unwrap_or_else(|_| String::from("[]"))
}

/// Parses an annotation value; unknown keys are ignored and subnets are normalised.
pub fn decode(value: &str) -> Result<Vec<EgressIpConfig>, AnnotationError> {
    let mut configs: Vec<EgressIpConfig> = serde_json::from_str(value)?;
    for config in &mut configs {
        config.ifaddr = config.ifaddr.normalized();
    }
    Ok(configs)
}

/// Reads a CIDR, treating `""` as absent: Go writers with a plain string field emit it so.
fn empty_as_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match Option::<String>::deserialize(deserializer)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a CIDR: {e}"))),
    }
}
