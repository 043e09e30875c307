//! What the rules need to know about a Node, extracted once when the Node is seen.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::annotation::{self, EGRESS_IPCONFIG_ANNOTATION, EgressIpConfig};

/// A Node reduced to its name, its own addresses and its egress annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// The IPs in `status.addresses` (hostnames dropped).
    pub addresses: Vec<IpAddr>,
    /// The parsed `cloud.network.openshift.io/egress-ipconfig` annotation.
    pub egress: EgressState,
}

/// The state of a node's egress annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EgressState {
    /// No annotation, or an empty list: the reconciler has not described the node yet.
    Missing,
    /// The annotation is present but unreadable; holds the parse error text.
    Invalid(String),
    /// The first (primary NIC) element of the annotation.
    Present(EgressIpConfig),
}

impl EgressState {
    /// Parses an annotation value as found on a Node.
    pub fn from_annotation(value: Option<&str>) -> Self {
        let Some(value) = value else {
            return Self::Missing;
        };
        match annotation::decode(value) {
            Ok(configs) => configs
                .into_iter()
                .next()
                .map_or(Self::Missing, Self::Present),
            Err(e) => Self::Invalid(e.to_string()),
        }
    }

    /// The egress config, when present.
    pub fn config(&self) -> Option<&EgressIpConfig> {
        match self {
            Self::Present(config) => Some(config),
            Self::Missing | Self::Invalid(_) => None,
        }
    }
}

impl NodeInfo {
    /// Extracts the name, the IP addresses and the parsed egress annotation of `node`.
    pub fn from_node(node: &Node) -> NodeInfo {
        let addresses = node.status.as_ref().and_then(|s| s.addresses.as_deref());
        let annotation = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(EGRESS_IPCONFIG_ANNOTATION))
            .map(String::as_str);
        Self::from_parts(
            node.metadata.name.as_deref().unwrap_or_default(),
            annotation,
            addresses.unwrap_or_default(),
        )
    }

    /// The same from a Node's name, egress annotation and `status.addresses`, as a projection of
    /// a Node holds them.
    pub fn from_parts(name: &str, annotation: Option<&str>, addresses: &[NodeAddress]) -> NodeInfo {
        let addresses = addresses
            .iter()
            // Hostname and DNS entries share the list; only IPs can collide with an egress IP.
            .filter_map(|a| a.address.trim().parse::<IpAddr>().ok())
            .collect();
        NodeInfo {
            name: name.to_owned(),
            addresses,
            egress: EgressState::from_annotation(annotation),
        }
    }
}

/// A Node's first `InternalIP` of each family, in `status.addresses` order: the addresses the
/// network plugin and upstream's controller take as the node's own (a cloud that lists egress IPs
/// as `InternalIP`s lists them after these).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InternalIps {
    /// The first IPv4 `InternalIP`.
    pub ipv4: Option<Ipv4Addr>,
    /// The first IPv6 `InternalIP`.
    pub ipv6: Option<Ipv6Addr>,
}

impl InternalIps {
    /// The first `InternalIP` of each family of `node`.
    pub fn of(node: &Node) -> Self {
        let addresses = node.status.as_ref().and_then(|s| s.addresses.as_deref());
        Self::among(addresses.unwrap_or_default())
    }

    /// The first `InternalIP` of each family in `addresses` (a Node's `status.addresses`).
    pub fn among(addresses: &[NodeAddress]) -> Self {
        let mut found = Self::default();
        for address in addresses {
            if address.type_ != "InternalIP" {
                continue;
            }
            match address.address.trim().parse::<IpAddr>() {
                Ok(IpAddr::V4(ip)) => {
                    found.ipv4.get_or_insert(ip);
                }
                Ok(IpAddr::V6(ip)) => {
                    found.ipv6.get_or_insert(ip);
                }
                Err(_) => {}
            }
        }
        found
    }

    /// Whether the node lists no `InternalIP` (or none is known).
    pub fn is_empty(&self) -> bool {
        self.ipv4.is_none() && self.ipv6.is_none()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node(annotation: Option<&str>, addresses: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("worker-1".into()),
                annotations: annotation
                    .map(|v| [(EGRESS_IPCONFIG_ANNOTATION.to_string(), v.to_string())].into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(t, a)| NodeAddress {
                            type_: (*t).into(),
                            address: (*a).into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn addresses_keep_ips_and_skip_hostnames() {
        let info = NodeInfo::from_node(&node(
            None,
            &[
                ("InternalIP", "10.0.0.10"),
                ("Hostname", "worker-1"),
                ("InternalDNS", "ip-10-0-0-10.ec2.internal"),
                ("InternalIP", "fd00::10"),
            ],
        ));
        assert_eq!(info.name, "worker-1");
        assert_eq!(
            info.addresses,
            vec![
                "10.0.0.10".parse::<IpAddr>().unwrap(),
                "fd00::10".parse().unwrap()
            ]
        );
    }

    #[test]
    fn internal_ips_are_the_first_internal_ip_of_each_family() {
        let listed = node(
            None,
            &[
                ("ExternalIP", "192.0.2.1"),
                ("InternalIP", "not-an-ip"),
                ("InternalIP", "fd00::10"),
                ("InternalIP", "10.0.0.10"),
                ("InternalIP", "10.0.0.99"),
                ("InternalIP", "fd00::99"),
            ],
        );
        let ips = InternalIps::of(&listed);
        assert_eq!(ips.ipv4, "10.0.0.10".parse().ok());
        assert_eq!(ips.ipv6, "fd00::10".parse().ok());
        assert!(!ips.is_empty());
        assert!(InternalIps::of(&node(None, &[("Hostname", "w")])).is_empty());
    }

    #[test]
    fn annotation_states() {
        let present = NodeInfo::from_node(&node(
            Some(
                r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.128.0/17"},"capacity":{"ip":100}}]"#,
            ),
            &[],
        ));
        let config = present.egress.config().unwrap();
        assert_eq!(config.interface, "nic0");
        assert_eq!(config.capacity.ip, Some(100));

        assert_eq!(
            NodeInfo::from_node(&node(None, &[])).egress,
            EgressState::Missing
        );
        assert_eq!(
            NodeInfo::from_node(&node(Some("[]"), &[])).egress,
            EgressState::Missing
        );
        let invalid = NodeInfo::from_node(&node(Some("{not json"), &[])).egress;
        assert!(
            matches!(&invalid, EgressState::Invalid(e) if e.contains(EGRESS_IPCONFIG_ANNOTATION)),
            "{invalid:?}"
        );
        assert_eq!(invalid.config(), None);
    }

    #[test]
    fn node_without_status_has_no_addresses() {
        let info = NodeInfo::from_node(&Node::default());
        assert!(info.addresses.is_empty());
        assert_eq!(info.name, "");
        assert_eq!(info.egress, EgressState::Missing);
    }
}
