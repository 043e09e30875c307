//! The egress-router objects the admission rules read, reduced to the fields they check, and the
//! small parsers for their string fields.
//!
//! - `EgressRouter` (`network.operator.openshift.io/v1`), after openshift/api
//!   `networkoperator/v1/types_egressrouter.go`: `spec.mode`, `spec.redirect`,
//!   `spec.networkInterface.macvlan`, `spec.addresses[]`.
//! - The `egress-router` CNI plugin's configuration, after openshift/egress-router-cni
//!   `pkg/types/types.go`: `interfaceType`, `interfaceArgs`, and exactly one of `ip`, `podIP`,
//!   `ipConfig`, as found in a NetworkAttachmentDefinition's `spec.config` (alone, or in the
//!   `plugins` list of a conflist).

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

/// The API group of `EgressRouter`.
pub const EGRESS_ROUTER_GROUP: &str = "network.operator.openshift.io";
/// The kind of the egress router resource.
pub const EGRESS_ROUTER_KIND: &str = "EgressRouter";
/// The API group of `NetworkAttachmentDefinition`.
pub const NAD_GROUP: &str = "k8s.cni.cncf.io";
/// The kind of Multus' network attachment resource.
pub const NAD_KIND: &str = "NetworkAttachmentDefinition";
/// The CNI `type` of the egress-router plugin.
pub const EGRESS_ROUTER_CNI_TYPE: &str = "egress-router";

/// `EgressRouter.spec`; absent fields are the CRD's defaults (`mode: Redirect`,
/// `networkInterface: {macvlan: {mode: Bridge}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressRouterSpec {
    /// `Redirect`, the only mode.
    pub mode: Option<String>,
    /// The redirect-mode configuration.
    pub redirect: Option<RedirectConfig>,
    /// The secondary interface.
    pub network_interface: Option<EgressRouterInterface>,
    /// The addresses of the secondary interface.
    pub addresses: Option<Vec<EgressRouterAddress>>,
}

/// `spec.redirect`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedirectConfig {
    /// DNAT rules by local port.
    pub redirect_rules: Option<Vec<L4RedirectRule>>,
    /// Where traffic no rule matches goes.
    #[serde(rename = "fallbackIP")]
    pub fallback_ip: Option<String>,
}

/// One `spec.redirect.redirectRules[]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct L4RedirectRule {
    /// The remote destination.
    #[serde(rename = "destinationIP")]
    pub destination_ip: Option<String>,
    /// The local port clients send to.
    pub port: Option<i64>,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: Option<String>,
    /// The remote port; unset or 0 means `port`.
    pub target_port: Option<i64>,
}

/// `spec.networkInterface`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct EgressRouterInterface {
    /// The only interface type.
    pub macvlan: Option<MacvlanConfig>,
}

/// `spec.networkInterface.macvlan`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct MacvlanConfig {
    /// `Bridge` (default), `Private`, `VEPA` or `Passthru`.
    pub mode: Option<String>,
    /// The node's interface to attach to; inferred from the address when unset.
    pub master: Option<String>,
}

/// One `spec.addresses[]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct EgressRouterAddress {
    /// The address in CIDR form.
    pub ip: Option<String>,
    /// The next hop, when it cannot be inferred.
    pub gateway: Option<String>,
}

/// The egress-router plugin's own configuration (one plugin entry).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressRouterCniConfig {
    /// `macvlan`, `ipvlan` or `aws-elastic-ip`; the plugin picks macvlan when unset.
    pub interface_type: Option<String>,
    /// Arguments of the interface type (`mode`, `master`, `mtu`); the plugin reads strings.
    pub interface_args: Option<BTreeMap<String, serde_json::Value>>,
    /// One static configuration for every pod.
    pub ip: Option<IpBlock>,
    /// Per-pod static configuration, keyed by pod name or name prefix ending in `*`.
    #[serde(rename = "podIP")]
    pub pod_ip: Option<BTreeMap<String, IpBlock>>,
    /// A ConfigMap holding the configuration.
    pub ip_config: Option<IpConfig>,
}

/// The `ip` block: addresses, gateway, destinations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct IpBlock {
    /// Addresses in CIDR form.
    pub addresses: Option<Vec<String>>,
    /// The next hop.
    pub gateway: Option<String>,
    /// Where the router may send: CIDRs or `<port> <protocol> <IP> [<targetPort>]` rules.
    pub destinations: Option<Vec<String>>,
}

/// The `ipConfig` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct IpConfig {
    /// The ConfigMap's namespace; the pod's when unset.
    pub namespace: Option<String>,
    /// The ConfigMap's name (required).
    pub name: Option<String>,
    /// Limits on what the ConfigMap may set.
    pub overrides: Option<IpBlock>,
}

/// Which egress router an address belongs to: an `EgressRouter`, or a NetworkAttachmentDefinition
/// that no EgressRouter controls.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouterRef {
    /// `EgressRouter` or `NetworkAttachmentDefinition`.
    pub kind: RouterKind,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

/// The two kinds of object that hold egress-router addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouterKind {
    /// `network.operator.openshift.io/v1` EgressRouter.
    EgressRouter,
    /// `k8s.cni.cncf.io/v1` NetworkAttachmentDefinition.
    NetworkAttachmentDefinition,
}

impl RouterRef {
    /// An EgressRouter's reference.
    pub fn egress_router(namespace: &str, name: &str) -> Self {
        Self {
            kind: RouterKind::EgressRouter,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// A NetworkAttachmentDefinition's reference.
    pub fn nad(namespace: &str, name: &str) -> Self {
        Self {
            kind: RouterKind::NetworkAttachmentDefinition,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for RouterRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            RouterKind::EgressRouter => EGRESS_ROUTER_KIND,
            RouterKind::NetworkAttachmentDefinition => NAD_KIND,
        };
        write!(f, "{kind} {}/{}", self.namespace, self.name)
    }
}

/// An address in CIDR form: the address itself and its network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// The address as written (host bits kept).
    pub ip: IpAddr,
    /// The network it lies in.
    pub net: IpNet,
}

/// Parses `<address>/<prefix length>` as the plugin's `net.ParseCIDR` does: host bits allowed,
/// the prefix length within the family's width, no zone.
pub fn parse_cidr(text: &str) -> Option<Cidr> {
    let (addr, len) = text.split_once('/')?;
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ip: IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let net = IpNet::new(ip, len).ok()?;
    Some(Cidr { ip, net })
}

/// One `destinations` entry of the CNI configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A network (or a bare IP) the router may reach: the README's form.
    Network(IpNet),
    /// `<port> <protocol> <IP> [<targetPort>]`: the DNAT rule form the network operator writes
    /// from an EgressRouter's redirect rules.
    Redirect {
        /// Local port, 1–65535.
        port: u16,
        /// TCP, UDP or SCTP.
        protocol: Protocol,
        /// The remote destination.
        to: IpNet,
        /// Remote port, 1–65535, when it differs from `port`.
        target_port: Option<u16>,
    },
}

/// The layer-4 protocols a redirect can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Parses `TCP`, `UDP` or `SCTP` exactly as the EgressRouter enum spells them.
    pub fn from_enum(text: &str) -> Option<Self> {
        match text {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The enum spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// Why a `destinations` entry is unusable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DestinationError {
    /// Neither one nor three or four space-separated fields.
    Shape,
    /// The address field is no IP or CIDR.
    Address(String),
    /// A port field is not 1–65535.
    Port(String),
    /// The protocol is not TCP, UDP or SCTP.
    Protocol(String),
}

impl fmt::Display for DestinationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shape => f.write_str(
                "is neither a CIDR nor a \"<port> <protocol> <IP> [<targetPort>]\" rule",
            ),
            Self::Address(a) => write!(f, "has {a:?}, which is no IP address or CIDR"),
            Self::Port(p) => write!(f, "has port {p:?}, which is not 1-65535"),
            Self::Protocol(p) => write!(f, "has protocol {p:?}, which is not TCP, UDP or SCTP"),
        }
    }
}

/// Parses one `destinations` entry: a CIDR or bare IP, or a redirect rule (protocol case
/// insensitive, as the plugin lowercases it).
pub fn parse_destination(text: &str) -> Result<Destination, DestinationError> {
    let fields: Vec<&str> = text.split(' ').collect();
    match fields.as_slice() {
        [address] => parse_network(address).map(Destination::Network),
        [port, protocol, address, rest @ ..] if rest.len() <= 1 => {
            let port = parse_port(port)?;
            let protocol = match protocol.to_ascii_uppercase().as_str() {
                "TCP" => Protocol::Tcp,
                "UDP" => Protocol::Udp,
                "SCTP" => Protocol::Sctp,
                _ => return Err(DestinationError::Protocol((*protocol).to_owned())),
            };
            let to = parse_network(address)?;
            let target_port = rest.first().map(|p| parse_port(p)).transpose()?;
            Ok(Destination::Redirect {
                port,
                protocol,
                to,
                target_port,
            })
        }
        _ => Err(DestinationError::Shape),
    }
}

fn parse_network(text: &str) -> Result<IpNet, DestinationError> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(IpNet::from(ip));
    }
    parse_cidr(text)
        .map(|cidr| cidr.net)
        .ok_or_else(|| DestinationError::Address(text.to_owned()))
}

fn parse_port(text: &str) -> Result<u16, DestinationError> {
    text.parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && text.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| DestinationError::Port(text.to_owned()))
}

/// Whether `key` is a `podIP` key: a pod name (a DNS-1123 subdomain), or a name prefix followed
/// by one `*` that matches every pod whose name starts with it.
pub fn valid_pod_key(key: &str) -> bool {
    match key.strip_suffix('*') {
        Some(prefix) => {
            prefix.len() < 253
                && !prefix.contains('*')
                && prefix.bytes().all(subdomain_byte)
                && prefix.bytes().next().is_none_or(alnum)
        }
        None => valid_subdomain(key),
    }
}

/// Whether `name` is a DNS-1123 subdomain (the form of pod and ConfigMap names).
pub fn valid_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| alnum(b) || b == b'-')
                && label.bytes().next().is_some_and(alnum)
                && label.bytes().last().is_some_and(alnum)
        })
}

/// Whether `name` is a DNS-1123 label (the form of namespace names).
pub fn valid_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && valid_subdomain(name)
}

/// Whether `name` is a Linux interface name the kernel accepts (`dev_valid_name`): 1–15 bytes,
/// not `.` or `..`, no `/`, `:` or whitespace.
pub fn valid_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0')
}

fn subdomain_byte(b: u8) -> bool {
    alnum(b) || b == b'-' || b == b'.'
}

fn alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}
