//! The agent's decision, pure: from what the API says (gateways, their CloudPrivateIPConfigs, this
//! node) and what the host has (links, addresses), the addresses to add and remove and the node
//! labels to set and remove. No I/O: the netlink and Kubernetes edges call [`plan`] and perform
//! its steps.
//!
//! An egress IP is *desired* on this node when a gateway whose `status.activeNode` is this node
//! lists it and its CloudPrivateIPConfig says the cloud attached it here (`status.node` is this
//! node and `Assigned=True`): the cloud first, then the interface, then the label.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use cloudnet_shared::EgressIpConfig;
use cloudnet_shared::gateway::{ACTIVE_VALUE, active_label, gateway_of_label};

/// The `IFA_PROTO` value the agent writes on every address it adds, and by which it knows its own.
///
/// The kernel (5.18 and later) stores it and never interprets values above its own 0 to 3
/// (`IFAPROT_UNSPEC`, `_KERNEL_LO`, `_KERNEL_RA`, `_KERNEL_LL`); iproute2 prints it with `ip -d
/// address`, by name when `/etc/iproute2/rt_addrprotos` has one. Without a mark of our own the
/// agent could not tell its addresses from the ones the cloud's DHCP client, an admin or another
/// agent (Antrea's, kube-vip) put there, and would either leak its own or delete theirs. The value
/// is arbitrary but must never change: an agent of another version must recognise what this one
/// added.
pub const ADDRESS_PROTOCOL: u8 = 0xc7;

/// A gateway as the agent reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gateway {
    /// Its name (the label key's name part).
    pub name: String,
    /// `spec.egressIPs`, those that parse.
    pub egress_ips: Vec<IpAddr>,
    /// `status.activeNode`, if set.
    pub active_node: Option<String>,
}

/// Where the cloud has an IP, from its CloudPrivateIPConfig.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// `status.node`, if set.
    pub node: Option<String>,
    /// Whether the `Assigned` condition is `True`.
    pub assigned: bool,
}

/// This node as the agent reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// The node's name.
    pub name: String,
    /// Its labels with the active-label prefix (the only ones the agent writes).
    pub labels: BTreeMap<String, String>,
    /// Its `cloud.network.openshift.io/egress-ipconfig` annotation, parsed (empty when absent or
    /// unreadable).
    pub egress: Vec<EgressIpConfig>,
}

/// What the API says, as one consistent picture.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// This node.
    pub node: NodeView,
    /// Every gateway.
    pub gateways: Vec<Gateway>,
    /// The gateways' CloudPrivateIPConfigs, by IP.
    pub attachments: BTreeMap<IpAddr, Attachment>,
}

/// A network device of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Its ifindex.
    pub index: u32,
    /// Its name.
    pub name: String,
}

/// An address on a device of the host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostAddress {
    /// The device's ifindex.
    pub index: u32,
    /// The address.
    pub ip: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// Whether it carries [`ADDRESS_PROTOCOL`]: the agent added it.
    pub ours: bool,
}

/// The host's devices and addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Host {
    /// Every link.
    pub links: Vec<Link>,
    /// Every address of every link.
    pub addresses: Vec<HostAddress>,
}

/// An address to add: `ip` as a host address (/32, /128) on device `index`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Add {
    /// The device's ifindex.
    pub index: u32,
    /// The address.
    pub ip: IpAddr,
}

/// The node's active labels to change: set to [`ACTIVE_VALUE`] or removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelPatch {
    /// Keys to set to `active`.
    pub set: BTreeSet<String>,
    /// Keys to remove.
    pub remove: BTreeSet<String>,
}

impl LabelPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

/// The steps that bring the host and the node's labels to what the API says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Addresses to add.
    pub add: Vec<Add>,
    /// The agent's addresses that are no longer desired.
    pub remove: Vec<HostAddress>,
    /// Label changes; removals go out before (or with) the address removals.
    pub labels: LabelPatch,
    /// Desired IPs already on a device (the agent's, or someone else's left alone).
    pub held: usize,
    /// Desired IPs for which no device is known: no `--interface`, and no link has an address in
    /// the annotation's subnet of the IP (or the annotation has none). Not guessed.
    pub no_device: Vec<IpAddr>,
    /// Gateways this node holds (active here, at least one IP attached here).
    pub gateways: usize,
}

impl Plan {
    /// Whether the plan changes any address.
    pub fn changes_addresses(&self) -> bool {
        !self.add.is_empty() || !self.remove.is_empty()
    }
}

/// The plan for `snapshot` on `host`, the device named `interface` (`--interface`) taking every
/// IP when given.
pub fn plan(snapshot: &Snapshot, host: &Host, interface: Option<&str>) -> Plan {
    let me = snapshot.node.name.as_str();
    // Gateway → its IPs desired here; a gateway active here with none yet is not held.
    let mut held_gateways: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
    for gateway in &snapshot.gateways {
        if gateway.active_node.as_deref() != Some(me) {
            continue;
        }
        let desired: Vec<IpAddr> = gateway
            .egress_ips
            .iter()
            .copied()
            .filter(|ip| {
                snapshot
                    .attachments
                    .get(ip)
                    .is_some_and(|a| a.assigned && a.node.as_deref() == Some(me))
            })
            .collect();
        if !desired.is_empty() {
            held_gateways.insert(gateway.name.as_str(), desired);
        }
    }
    let desired: BTreeSet<IpAddr> = held_gateways.values().flatten().copied().collect();

    let mut plan = Plan {
        gateways: held_gateways.len(),
        ..Plan::default()
    };
    // (device, IP) pairs the agent's addresses may stay at.
    let mut keep: BTreeSet<(u32, IpAddr)> = BTreeSet::new();
    let mut present: BTreeSet<IpAddr> = BTreeSet::new();
    for &ip in &desired {
        let unmarked = host.addresses.iter().any(|a| a.ip == ip && !a.ours);
        match device(ip, snapshot, host, interface) {
            Some(index) => {
                keep.insert((index, ip));
                let ours_there = host
                    .addresses
                    .iter()
                    .any(|a| a.ip == ip && a.ours && a.index == index);
                if unmarked || ours_there {
                    present.insert(ip);
                } else {
                    plan.add.push(Add { index, ip });
                }
            }
            None => {
                // No device known (the annotation gone, a link renamed): what the agent already
                // put somewhere stays, as removing it would cut traffic on a guess.
                let ours: Vec<&HostAddress> = host
                    .addresses
                    .iter()
                    .filter(|a| a.ip == ip && a.ours)
                    .collect();
                keep.extend(ours.iter().map(|a| (a.index, a.ip)));
                if unmarked || !ours.is_empty() {
                    present.insert(ip);
                } else {
                    plan.no_device.push(ip);
                }
            }
        }
    }
    plan.held = present.len();
    plan.remove = host
        .addresses
        .iter()
        .filter(|a| a.ours && !keep.contains(&(a.index, a.ip)))
        .cloned()
        .collect();

    for (name, ips) in &held_gateways {
        let key = active_label(name);
        // Set once every IP attached here is on a device; while one is being repaired the label
        // stays, so that a removed address does not make the label flap.
        if ips.iter().all(|ip| present.contains(ip))
            && snapshot.node.labels.get(&key).map(String::as_str) != Some(ACTIVE_VALUE)
        {
            plan.labels.set.insert(key);
        }
    }
    for key in snapshot.node.labels.keys() {
        if gateway_of_label(key).is_some_and(|name| !held_gateways.contains_key(name)) {
            plan.labels.remove.insert(key.clone());
        }
    }
    plan
}

/// The device `ip` goes on: the one named `interface`, else the link with an address (not one of
/// the agent's) in the subnet the node's annotation gives for `ip`, the lowest ifindex first.
fn device(ip: IpAddr, snapshot: &Snapshot, host: &Host, interface: Option<&str>) -> Option<u32> {
    if let Some(name) = interface {
        return host.links.iter().find(|l| l.name == name).map(|l| l.index);
    }
    let contains = |config: &EgressIpConfig, addr: IpAddr| match addr {
        IpAddr::V4(v4) => config.ifaddr.ipv4.is_some_and(|net| net.contains(&v4)),
        IpAddr::V6(v6) => config.ifaddr.ipv6.is_some_and(|net| net.contains(&v6)),
    };
    let config = snapshot.node.egress.iter().find(|c| contains(c, ip))?;
    host.addresses
        .iter()
        .filter(|a| !a.ours && contains(config, a.ip))
        .map(|a| a.index)
        .min()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use cloudnet_shared::IfAddr;

    const ME: &str = "node-a";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn gateway(name: &str, ips: &[&str], active: Option<&str>) -> Gateway {
        Gateway {
            name: name.into(),
            egress_ips: ips.iter().map(|s| ip(s)).collect(),
            active_node: active.map(Into::into),
        }
    }

    fn attached(node: &str, assigned: bool) -> Attachment {
        Attachment {
            node: Some(node.into()),
            assigned,
        }
    }

    fn snapshot(gateways: Vec<Gateway>, attachments: &[(&str, Attachment)]) -> Snapshot {
        Snapshot {
            node: NodeView {
                name: ME.into(),
                labels: BTreeMap::new(),
                egress: vec![EgressIpConfig {
                    interface: "eni-1".into(),
                    ifaddr: IfAddr::new(
                        Some("10.0.0.0/24".parse().unwrap()),
                        Some("fd00::/64".parse().unwrap()),
                    ),
                    capacity: Default::default(),
                }],
            },
            gateways,
            attachments: attachments
                .iter()
                .map(|(s, a)| (ip(s), a.clone()))
                .collect(),
        }
    }

    fn addr(index: u32, s: &str, prefix_len: u8, ours: bool) -> HostAddress {
        HostAddress {
            index,
            ip: ip(s),
            prefix_len,
            ours,
        }
    }

    /// `lo` (1), `eth0` (2) in both subnets, `eth1` (3) elsewhere.
    fn host(extra: &[HostAddress]) -> Host {
        let mut addresses = vec![
            addr(1, "127.0.0.1", 8, false),
            addr(2, "10.0.0.10", 24, false),
            addr(2, "fd00::10", 64, false),
            addr(3, "192.168.5.10", 24, false),
        ];
        addresses.extend_from_slice(extra);
        Host {
            links: vec![
                Link {
                    index: 1,
                    name: "lo".into(),
                },
                Link {
                    index: 2,
                    name: "eth0".into(),
                },
                Link {
                    index: 3,
                    name: "eth1".into(),
                },
            ],
            addresses,
        }
    }

    fn adds(plan: &Plan) -> Vec<(u32, IpAddr)> {
        plan.add.iter().map(|a| (a.index, a.ip)).collect()
    }

    fn keys(set: &BTreeSet<String>) -> Vec<&str> {
        set.iter().map(String::as_str).collect()
    }

    #[test]
    fn each_case_plans_the_steps_it_should() {
        struct Case {
            name: &'static str,
            snapshot: Snapshot,
            host: Host,
            interface: Option<&'static str>,
            add: Vec<(u32, IpAddr)>,
            remove: Vec<HostAddress>,
            set: Vec<&'static str>,
            unset: Vec<&'static str>,
            held: usize,
            no_device: Vec<IpAddr>,
        }
        let label = "egress-gateway.cloudnet.io/web";
        let with_label = |mut s: Snapshot, key: &str| {
            s.node.labels.insert(key.into(), "active".into());
            s
        };
        let both = ["10.0.0.5", "fd00::5"];
        let cases = vec![
            Case {
                name: "attached here: both families go on the device of their subnet",
                snapshot: snapshot(
                    vec![gateway("web", &both, Some(ME))],
                    &[
                        ("10.0.0.5", attached(ME, true)),
                        ("fd00::5", attached(ME, true)),
                    ],
                ),
                host: host(&[]),
                interface: None,
                add: vec![(2, ip("10.0.0.5")), (2, ip("fd00::5"))],
                remove: vec![],
                set: vec![],
                unset: vec![],
                held: 0,
                no_device: vec![],
            },
            Case {
                name: "not yet Assigned: nothing, and no label",
                snapshot: snapshot(
                    vec![gateway("web", &["10.0.0.5"], Some(ME))],
                    &[("10.0.0.5", attached(ME, false))],
                ),
                host: host(&[]),
                interface: None,
                add: vec![],
                remove: vec![],
                set: vec![],
                unset: vec![],
                held: 0,
                no_device: vec![],
            },
            Case {
                name: "attached but to another node (the move not done): nothing",
                snapshot: snapshot(
                    vec![gateway("web", &["10.0.0.5"], Some(ME))],
                    &[("10.0.0.5", attached("node-b", true))],
                ),
                host: host(&[]),
                interface: None,
                add: vec![],
                remove: vec![],
                set: vec![],
                unset: vec![],
                held: 0,
                no_device: vec![],
            },
            Case {
                name: "on the device: the label is set",
                snapshot: snapshot(
                    vec![gateway("web", &both, Some(ME))],
                    &[
                        ("10.0.0.5", attached(ME, true)),
                        ("fd00::5", attached(ME, true)),
                    ],
                ),
                host: host(&[addr(2, "10.0.0.5", 32, true), addr(2, "fd00::5", 128, true)]),
                interface: None,
                add: vec![],
                remove: vec![],
                set: vec![label],
                unset: vec![],
                held: 2,
                no_device: vec![],
            },
            Case {
                name: "labelled, one address removed by someone: re-added, the label stays",
                snapshot: with_label(
                    snapshot(
                        vec![gateway("web", &both, Some(ME))],
                        &[
                            ("10.0.0.5", attached(ME, true)),
                            ("fd00::5", attached(ME, true)),
                        ],
                    ),
                    label,
                ),
                host: host(&[addr(2, "fd00::5", 128, true)]),
                interface: None,
                add: vec![(2, ip("10.0.0.5"))],
                remove: vec![],
                set: vec![],
                unset: vec![],
                held: 1,
                no_device: vec![],
            },
            Case {
                name: "a third IP not yet attached: the two held keep the label",
                snapshot: with_label(
                    snapshot(
                        vec![gateway(
                            "web",
                            &["10.0.0.5", "fd00::5", "10.0.0.6"],
                            Some(ME),
                        )],
                        &[
                            ("10.0.0.5", attached(ME, true)),
                            ("fd00::5", attached(ME, true)),
                            ("10.0.0.6", attached(ME, false)),
                        ],
                    ),
                    label,
                ),
                host: host(&[addr(2, "10.0.0.5", 32, true), addr(2, "fd00::5", 128, true)]),
                interface: None,
                add: vec![],
                remove: vec![],
                set: vec![],
                unset: vec![],
                held: 2,
                no_device: vec![],
            },
            Case {
                name: "moved to another node: label and addresses go",
                snapshot: with_label(
                    snapshot(
                        vec![gateway("web", &both, Some("node-b"))],
                        &[
                            ("10.0.0.5", attached(ME, true)),
                            ("fd00::5", attached(ME, true)),
                        ],
                    ),
                    label,
                ),
                host: host(&[addr(2, "10.0.0.5", 32, true), addr(2, "fd00::5", 128, true)]),
                interface: None,
                add: vec![],
                remove: vec![addr(2, "10.0.0.5", 32, true), addr(2, "fd00::5", 128, true)],
                set: vec![],
                unset: vec![label],
                held: 0,
                no_device: vec![],
            },
            Case {
                name: "gateway and objects deleted: only the marked address and our label go",
                snapshot: with_label(
                    with_label(snapshot(vec![], &[]), label),
                    "kubernetes.io/hostname",
                ),
                host: host(&[
                    addr(2, "10.0.0.5", 32, true),
                    addr(2, "10.0.0.7", 32, false),
                ]),
                interface: None,
                add: vec![],
                remove: vec![addr(2, "10.0.0.5", 32, true)],
                set: vec![],
                unset: vec![label],
                held: 0,
                no_device: vec![],
            },
            Case {
                name: "desired IP already there unmarked: held, not added, never removed",
                snapshot: snapshot(
                    vec![gateway("web", &["10.0.0.5"], Some(ME))],
                    &[("10.0.0.5", attached(ME, true))],
                ),
                host: host(&[addr(2, "10.0.0.5", 24, false)]),
                interface: None,
                add: vec![],
                remove: vec![],
                set: vec![label],
                unset: vec![],
                held: 1,
                no_device: vec![],
            },
            Case {
                name: "no subnet of the annotation has the IP: not guessed, reported",
                snapshot: snapshot(
                    vec![gateway("web", &["10.9.0.5"], Some(ME))],
                    &[("10.9.0.5", attached(ME, true))],
                ),
                host: host(&[]),
                interface: None,
                add: vec![],
                remove: vec![],
                set: vec![],
                unset: vec![],
                held: 0,
                no_device: vec![ip("10.9.0.5")],
            },
            Case {
                name: "no device in the subnet: reported; the agent's own address elsewhere stays",
                snapshot: snapshot(
                    vec![gateway("web", &["10.0.0.5", "fd00::5"], Some(ME))],
                    &[
                        ("10.0.0.5", attached(ME, true)),
                        ("fd00::5", attached(ME, true)),
                    ],
                ),
                host: Host {
                    addresses: vec![addr(3, "fd00::5", 128, true)],
                    ..host(&[])
                },
                interface: None,
                add: vec![],
                remove: vec![],
                set: vec![],
                unset: vec![],
                held: 1,
                no_device: vec![ip("10.0.0.5")],
            },
            Case {
                name: "--interface wins over the subnet; a copy on the old device goes",
                snapshot: snapshot(
                    vec![gateway("web", &["10.0.0.5"], Some(ME))],
                    &[("10.0.0.5", attached(ME, true))],
                ),
                host: host(&[addr(2, "10.0.0.5", 32, true)]),
                interface: Some("eth1"),
                add: vec![(3, ip("10.0.0.5"))],
                remove: vec![addr(2, "10.0.0.5", 32, true)],
                set: vec![],
                unset: vec![],
                held: 0,
                no_device: vec![],
            },
            Case {
                name: "a stale address of ours does not make its link the subnet's device",
                snapshot: snapshot(
                    vec![gateway("web", &["10.0.0.5"], Some(ME))],
                    &[("10.0.0.5", attached(ME, true))],
                ),
                host: Host {
                    addresses: vec![
                        addr(3, "10.0.0.99", 32, true),
                        addr(2, "10.0.0.10", 24, false),
                    ],
                    ..host(&[])
                },
                interface: None,
                add: vec![(2, ip("10.0.0.5"))],
                remove: vec![addr(3, "10.0.0.99", 32, true)],
                set: vec![],
                unset: vec![],
                held: 0,
                no_device: vec![],
            },
        ];
        for case in cases {
            let plan = plan(&case.snapshot, &case.host, case.interface);
            assert_eq!(adds(&plan), case.add, "{}: add", case.name);
            assert_eq!(plan.remove, case.remove, "{}: remove", case.name);
            assert_eq!(keys(&plan.labels.set), case.set, "{}: set", case.name);
            assert_eq!(
                keys(&plan.labels.remove),
                case.unset,
                "{}: unset",
                case.name
            );
            assert_eq!(plan.held, case.held, "{}: held", case.name);
            assert_eq!(plan.no_device, case.no_device, "{}: no device", case.name);
        }
    }

    #[test]
    fn gateways_sharing_the_node_are_labelled_each_by_its_own_ips() {
        let snapshot = snapshot(
            vec![
                gateway("web", &["10.0.0.5"], Some(ME)),
                gateway("db", &["10.0.0.6"], Some(ME)),
                gateway("batch", &["10.0.0.7"], Some("node-b")),
            ],
            &[
                ("10.0.0.5", attached(ME, true)),
                ("10.0.0.6", attached(ME, true)),
                ("10.0.0.7", attached("node-b", true)),
            ],
        );
        let plan = plan(&snapshot, &host(&[addr(2, "10.0.0.5", 32, true)]), None);
        assert_eq!(adds(&plan), vec![(2, ip("10.0.0.6"))]);
        assert_eq!(
            keys(&plan.labels.set),
            vec!["egress-gateway.cloudnet.io/web"]
        );
        assert_eq!(plan.gateways, 2);
    }

    #[test]
    fn a_converged_host_plans_nothing() {
        let mut snapshot = snapshot(
            vec![gateway("web", &["10.0.0.5"], Some(ME))],
            &[("10.0.0.5", attached(ME, true))],
        );
        snapshot
            .node
            .labels
            .insert("egress-gateway.cloudnet.io/web".into(), "active".into());
        let plan = plan(&snapshot, &host(&[addr(2, "10.0.0.5", 32, true)]), None);
        assert!(!plan.changes_addresses(), "{plan:?}");
        assert!(plan.labels.is_empty(), "{plan:?}");
    }
}
