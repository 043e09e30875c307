//! Which of a server's ports carries its egress IPs: upstream's rule, the port whose subnet holds
//! the node's first InternalIP, so that a server with several ports gets the same annotation
//! (and the same port for attaches and detaches) under either controller.

use std::net::IpAddr;

use cloudnet_shared::InternalIps;
use ipnet::IpNet;

use super::neutron::{Port, Subnet};
use crate::cloud::CloudError;

/// A server's port the egress IPs go on, and its subnets.
#[derive(Clone, Debug)]
pub struct ServerPort {
    /// The port as last read or updated.
    pub port: Port,
    /// The subnets of its fixed addresses.
    pub subnets: Vec<Subnet>,
}

impl ServerPort {
    /// The port's subnet that holds `ip`.
    pub fn subnet_of(&self, ip: IpAddr) -> Option<&Subnet> {
        self.subnets.iter().find(|s| s.cidr.contains(&ip))
    }

    /// The addresses its allowed-address-pairs take, one per entry.
    pub fn pair_ips(&self) -> Vec<IpAddr> {
        self.port
            .allowed_address_pairs
            .iter()
            .filter_map(|p| {
                // A CIDR entry still takes one of the port's pair slots.
                p.ip()
                    .or_else(|| p.ip_address.parse::<IpNet>().ok().map(|n| n.network()))
            })
            .collect()
    }

    /// Whether `ip` is one of its allowed-address-pairs.
    pub fn holds(&self, ip: IpAddr) -> bool {
        self.port
            .allowed_address_pairs
            .iter()
            .any(|p| p.ip() == Some(ip))
    }

    fn cidrs(&self) -> String {
        let cidrs: Vec<String> = self.subnets.iter().map(|s| s.cidr.to_string()).collect();
        format!("{} ({})", self.port.id, cidrs.join(", "))
    }
}

/// What the port is picked by.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pick<'a> {
    /// The node's first InternalIPs (the target's, else the ones last seen for the server).
    pub node: InternalIps,
    /// IPs to take off: without the node's addresses, the port holding one of them is the one.
    pub remove: &'a [IpAddr],
    /// IPs to put on: without the node's addresses, the port whose subnet holds the first is the
    /// one (upstream's choice for an attach).
    pub add: &'a [IpAddr],
}

/// The answer of [`choose`].
#[derive(Debug)]
pub enum Chosen {
    /// The port at this index.
    Port(usize),
    /// A change that only removes, on a server none of whose ports holds the IPs: nothing to do.
    Nothing,
}

/// Picks one of `ports` (a server's `compute:` ports, in a stable order) for `pick`.
///
/// Upstream's rule, from its `GetNodeEgressIPConfiguration`: per port in order, the first whose
/// IPv4 subnet holds the node's first IPv4 InternalIP, or whose IPv6 subnet holds its first
/// IPv6 InternalIP; no such port is an error (the node gets no annotation). Upstream also refuses
/// a node whose ports share a CIDR; here only a share of the chosen subnet is refused, the one
/// that leaves the choice ambiguous. A single port needs no address to be chosen. Without the
/// node's addresses (a target known only from the ledger, before the Node was seen), a removal
/// goes to the port that holds the IP, an addition to the port whose subnet holds it.
pub fn choose(server: &str, ports: &[ServerPort], pick: &Pick<'_>) -> Result<Chosen, CloudError> {
    let node = pick.node;
    if !node.is_empty() {
        let holds = |p: &ServerPort, ip: IpAddr| p.subnet_of(ip).is_some();
        let by_v4 = node.ipv4.map(IpAddr::V4);
        let by_v6 = node.ipv6.map(IpAddr::V6);
        let found = ports.iter().enumerate().find_map(|(i, p)| {
            [by_v4, by_v6]
                .into_iter()
                .flatten()
                .find(|ip| holds(p, *ip))
                .map(|ip| (i, ip))
        });
        let Some((index, ip)) = found else {
            let listed: Vec<String> = ports.iter().map(ServerPort::cidrs).collect();
            return Err(CloudError::permanent(format!(
                "no port of server {server} has a subnet holding the node's first InternalIP \
                 ({}); its ports: {}",
                [by_v4, by_v6]
                    .into_iter()
                    .flatten()
                    .map(|ip| ip.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                listed.join("; ")
            )));
        };
        if let Some(other) = ports.iter().skip(index + 1).find(|p| holds(p, ip)) {
            return Err(CloudError::permanent(format!(
                "ports {} and {} of server {server} both have a subnet holding the node's \
                 InternalIP {ip}: which one carries egress IPs is ambiguous",
                ports[index].port.id, other.port.id
            )));
        }
        return Ok(Chosen::Port(index));
    }
    if ports.len() == 1 {
        return Ok(Chosen::Port(0));
    }
    if let Some(i) = ports
        .iter()
        .position(|p| pick.remove.iter().any(|ip| p.holds(*ip)))
    {
        return Ok(Chosen::Port(i));
    }
    if let Some(first) = pick.add.first() {
        return ports
            .iter()
            .position(|p| p.subnet_of(*first).is_some())
            .map(Chosen::Port)
            .ok_or_else(|| {
                let listed: Vec<String> = ports.iter().map(ServerPort::cidrs).collect();
                CloudError::permanent(format!(
                    "{first} is outside the subnets of every port of server {server}: {}",
                    listed.join("; ")
                ))
            });
    }
    if !pick.remove.is_empty() {
        return Ok(Chosen::Nothing);
    }
    Err(CloudError::retryable(format!(
        "server {server} has {} ports; the node's first InternalIP decides which carries egress \
         IPs, and none is known yet",
        ports.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::ErrorKind;

    fn port(id: &str, cidrs: &[&str], pairs: &[&str]) -> ServerPort {
        let value = serde_json::json!({
            "id": id,
            "network_id": "net",
            "allowed_address_pairs": pairs.iter().map(|p| serde_json::json!({"ip_address": p}))
                .collect::<Vec<_>>(),
        });
        let port: Port = serde_json::from_value(value).unwrap();
        let subnets = cidrs
            .iter()
            .map(|c| Subnet {
                id: format!("subnet-{c}"),
                cidr: c.parse().unwrap(),
            })
            .collect();
        ServerPort { port, subnets }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node(v4: Option<&str>, v6: Option<&str>) -> InternalIps {
        InternalIps {
            ipv4: v4.map(|s| s.parse().unwrap()),
            ipv6: v6.map(|s| s.parse().unwrap()),
        }
    }

    fn chosen(ports: &[ServerPort], pick: &Pick<'_>) -> Result<Option<usize>, ErrorKind> {
        match choose("srv", ports, pick) {
            Ok(Chosen::Port(i)) => Ok(Some(i)),
            Ok(Chosen::Nothing) => Ok(None),
            Err(e) => Err(e.kind),
        }
    }

    #[test]
    fn the_port_of_the_nodes_first_internal_ip_is_chosen_as_upstream_does() {
        let two = [
            port("a", &["10.1.0.0/24"], &["10.2.0.50"]),
            port("b", &["10.2.0.0/24", "fd00:2::/64"], &[]),
        ];
        let by = |v4, v6| Pick {
            node: node(v4, v6),
            ..Pick::default()
        };
        let removing = [ip("10.2.0.50")];
        // (node's first InternalIPs, change, expected)
        let cases: Vec<(Pick<'_>, Result<Option<usize>, ErrorKind>)> = vec![
            (by(Some("10.2.0.5"), None), Ok(Some(1))),
            (by(Some("10.1.0.5"), None), Ok(Some(0))),
            // IPv6 decides when the IPv4 address is on no port.
            (by(Some("192.0.2.1"), Some("fd00:2::5")), Ok(Some(1))),
            (by(None, Some("fd00:2::5")), Ok(Some(1))),
            (by(Some("192.0.2.1"), None), Err(ErrorKind::Permanent)),
            // The node's address wins over where a removed IP sits.
            (
                Pick {
                    node: node(Some("10.2.0.5"), None),
                    remove: &removing,
                    add: &[],
                },
                Ok(Some(1)),
            ),
        ];
        for (pick, expected) in cases {
            assert_eq!(chosen(&two, &pick), expected, "{pick:?}");
        }
    }

    #[test]
    fn a_subnet_of_the_node_on_two_ports_is_refused_and_one_port_needs_no_address() {
        let shared = [
            port("a", &["10.2.0.0/24"], &[]),
            port("b", &["10.2.0.0/24"], &[]),
        ];
        let pick = Pick {
            node: node(Some("10.2.0.5"), None),
            ..Pick::default()
        };
        assert_eq!(chosen(&shared, &pick), Err(ErrorKind::Permanent));
        let one = [port("a", &["10.1.0.0/24"], &[])];
        assert_eq!(chosen(&one, &Pick::default()), Ok(Some(0)));
    }

    #[test]
    fn without_the_nodes_address_a_removal_finds_its_holder_and_an_addition_its_subnet() {
        let two = [
            port("a", &["10.1.0.0/24"], &[]),
            port("b", &["10.2.0.0/24"], &["10.2.0.50"]),
        ];
        let held = [ip("10.2.0.50")];
        let elsewhere = [ip("10.2.0.60")];
        let in_a = [ip("10.1.0.60")];
        let outside = [ip("192.0.2.9")];
        fn pick<'a>(remove: &'a [IpAddr], add: &'a [IpAddr]) -> Pick<'a> {
            Pick {
                node: InternalIps::default(),
                remove,
                add,
            }
        }
        assert_eq!(chosen(&two, &pick(&held, &in_a)), Ok(Some(1)));
        assert_eq!(chosen(&two, &pick(&[], &in_a)), Ok(Some(0)));
        assert_eq!(chosen(&two, &pick(&[], &elsewhere)), Ok(Some(1)));
        assert_eq!(
            chosen(&two, &pick(&[], &outside)),
            Err(ErrorKind::Permanent)
        );
        assert_eq!(chosen(&two, &pick(&elsewhere, &[])), Ok(None));
        assert_eq!(chosen(&two, &pick(&[], &[])), Err(ErrorKind::Retryable));
    }
}
