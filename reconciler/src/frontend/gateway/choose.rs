//! Which node each egress gateway is active on. Pure, so that every replica and every restart
//! chooses alike and anyone can predict the choice from the API:
//! - eligible: the selector matches; Ready; schedulable (not cordoned); not being deleted; no
//!   `NoExecute` taint; its node agent's heartbeat fresh; annotated, with room for the
//!   gateway's IPs in each capacity bucket;
//! - the active node stays while it is eligible (a node that returns takes nothing back);
//! - otherwise the first eligible node by name.
//!
//! Gateways are chosen in name order, each counting the IPs the ones before it put on a node,
//! so that many gateways can share nodes without overfilling one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use cloudnet_shared::Capacity;
use cloudnet_shared::platform::{Bucket, bucket_for};
use kube::core::{Selector, SelectorExt};

/// A node as choosing reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Its labels.
    pub(crate) labels: BTreeMap<String, String>,
    /// Its Ready condition is True, it is schedulable, not being deleted and has no NoExecute
    /// taint.
    pub(crate) healthy: bool,
    /// Its node agent renewed its Lease within the timeout.
    pub(crate) heartbeat: bool,
    /// Its capacity from the egress annotation; `None`: not annotated (yet).
    pub(crate) capacity: Option<Capacity>,
    /// The egress IPs that occupy it (any owner's), in `spec.node` or `status.node`.
    pub(crate) occupants: BTreeSet<IpAddr>,
}

/// One gateway as choosing reads it.
#[derive(Clone, Debug)]
pub(crate) struct Gateway {
    /// Its name.
    pub(crate) name: String,
    /// Its node selector, as read; `None` if it cannot be read (nothing matches).
    pub(crate) selector: Option<Selector>,
    /// Its egress IPs.
    pub(crate) ips: Vec<IpAddr>,
    /// The active node its status names, if any.
    pub(crate) active: Option<String>,
}

/// What was chosen for one gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Active on this node.
    Active(String),
    /// No node the selector matches is healthy with a fresh heartbeat.
    NoEligibleNode,
    /// The healthy nodes have no room for the IPs.
    CapacityReached,
}

/// The choice for each of `gateways` over `nodes` (by name).
pub(crate) fn choose(
    gateways: &[Gateway],
    nodes: &BTreeMap<String, Candidate>,
) -> BTreeMap<String, Choice> {
    let mut sorted: Vec<&Gateway> = gateways.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    // IPs this pass has put on a node, for the gateways after.
    let mut added: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
    let mut choices = BTreeMap::new();
    for gateway in sorted {
        let live: Vec<(&str, &Candidate)> = live(gateway, nodes).collect();
        let fits =
            |(name, node): &(&str, &Candidate)| room_for(&gateway.ips, node, added.get(name));
        let kept = gateway
            .active
            .as_deref()
            .and_then(|active| live.iter().find(|(name, _)| *name == active))
            .filter(|candidate| fits(candidate));
        let chosen = kept.or_else(|| live.iter().find(|candidate| fits(candidate)));
        let choice = match chosen {
            Some((name, _)) => {
                added
                    .entry(name)
                    .or_default()
                    .extend(gateway.ips.iter().copied());
                Choice::Active((*name).to_owned())
            }
            None if live.is_empty() => Choice::NoEligibleNode,
            None => Choice::CapacityReached,
        };
        choices.insert(gateway.name.clone(), choice);
    }
    choices
}

/// The nodes `gateway`'s selector picks that are healthy with a fresh heartbeat: eligible but
/// for room.
pub(crate) fn live<'a>(
    gateway: &'a Gateway,
    nodes: &'a BTreeMap<String, Candidate>,
) -> impl Iterator<Item = (&'a str, &'a Candidate)> {
    nodes
        .iter()
        .filter(|(_, node)| node.healthy && node.heartbeat)
        .filter(|(_, node)| {
            gateway
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(&node.labels))
        })
        .map(|(name, node)| (name.as_str(), node))
}

/// Whether `node` has room for `ips` besides its occupants and `added` (this pass's), not
/// counting any of `ips` twice: those already on the node are there.
fn room_for(ips: &[IpAddr], node: &Candidate, added: Option<&BTreeSet<IpAddr>>) -> bool {
    let Some(capacity) = &node.capacity else {
        return false;
    };
    let ours: BTreeSet<IpAddr> = ips.iter().copied().collect();
    let mut used: HashMap<Bucket, i64> = HashMap::new();
    let others = node
        .occupants
        .iter()
        .chain(added.into_iter().flatten())
        .filter(|ip| !ours.contains(ip))
        .collect::<BTreeSet<_>>();
    for ip in others.into_iter().chain(ours.iter()) {
        *used.entry(bucket_for(None, *ip, capacity)).or_default() += 1;
    }
    // A missing key means unlimited, as it does to OVN-Kubernetes.
    used.iter()
        .all(|(bucket, count)| capacity.get(*bucket).is_none_or(|limit| *count <= limit))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(role: &str, healthy: bool, heartbeat: bool, limit: i64) -> Candidate {
        Candidate {
            labels: BTreeMap::from([("role".to_owned(), role.to_owned())]),
            healthy,
            heartbeat,
            capacity: Some(Capacity {
                ipv4: Some(limit),
                ipv6: None,
                ip: None,
            }),
            occupants: BTreeSet::new(),
        }
    }

    fn gateway(name: &str, ips: &[&str], active: Option<&str>) -> Gateway {
        Gateway {
            name: name.into(),
            selector: Some(
                Selector::try_from(
                    serde_json::from_value::<
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
                    >(serde_json::json!({"matchLabels": {"role": "gw"}}))
                    .unwrap(),
                )
                .unwrap(),
            ),
            ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            active: active.map(str::to_owned),
        }
    }

    fn nodes(list: &[(&str, Candidate)]) -> BTreeMap<String, Candidate> {
        list.iter()
            .map(|(n, c)| ((*n).to_owned(), c.clone()))
            .collect()
    }

    fn active(name: &str) -> Choice {
        Choice::Active(name.into())
    }

    #[test]
    fn the_first_eligible_by_name_is_chosen_and_stays_while_eligible() {
        let all = nodes(&[
            ("c", node("gw", true, true, 10)),
            ("b", node("gw", true, true, 10)),
            ("a", node("other", true, true, 10)),
        ]);
        let chosen = choose(&[gateway("web", &["10.0.0.5"], None)], &all);
        assert_eq!(chosen["web"], active("b"), "a is not selected");
        let chosen = choose(&[gateway("web", &["10.0.0.5"], Some("c"))], &all);
        assert_eq!(chosen["web"], active("c"), "no flapping back to b");
    }

    #[test]
    fn an_unhealthy_or_silent_node_is_never_chosen() {
        let all = nodes(&[
            ("a", node("gw", false, true, 10)),
            ("b", node("gw", true, false, 10)),
            ("c", node("gw", true, true, 10)),
        ]);
        let chosen = choose(&[gateway("web", &["10.0.0.5"], Some("b"))], &all);
        assert_eq!(chosen["web"], active("c"), "b's agent stopped: fail over");
        let none = nodes(&[("a", node("gw", false, true, 10))]);
        assert_eq!(
            choose(&[gateway("web", &["10.0.0.5"], Some("a"))], &none)["web"],
            Choice::NoEligibleNode
        );
        let mut unreadable = gateway("web", &["10.0.0.5"], None);
        unreadable.selector = None;
        assert_eq!(choose(&[unreadable], &all)["web"], Choice::NoEligibleNode);
    }

    #[test]
    fn capacity_counts_other_owners_and_earlier_gateways_but_not_the_gateways_own_ips() {
        let mut a = node("gw", true, true, 2);
        a.occupants = BTreeSet::from(["10.0.0.9".parse().unwrap()]);
        let all = nodes(&[("a", a.clone()), ("b", node("gw", true, true, 2))]);
        let chosen = choose(
            &[
                gateway("one", &["10.0.0.5"], None),
                gateway("two", &["10.0.0.6"], None),
            ],
            &all,
        );
        assert_eq!(
            chosen["one"],
            active("a"),
            "one of two taken by another owner"
        );
        assert_eq!(chosen["two"], active("b"), "a is full after one");

        let mut full = a;
        full.occupants.insert("10.0.0.5".parse().unwrap());
        let all = nodes(&[("a", full)]);
        assert_eq!(
            choose(&[gateway("one", &["10.0.0.5"], Some("a"))], &all)["one"],
            active("a"),
            "its own IP on the node is not counted twice"
        );
        assert_eq!(
            choose(&[gateway("two", &["10.0.0.6"], None)], &all)["two"],
            Choice::CapacityReached
        );
    }

    #[test]
    fn an_unannotated_node_has_no_room() {
        let mut a = node("gw", true, true, 10);
        a.capacity = None;
        assert_eq!(
            choose(&[gateway("web", &["10.0.0.5"], None)], &nodes(&[("a", a)]))["web"],
            Choice::CapacityReached
        );
    }
}
