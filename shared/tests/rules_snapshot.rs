//! The cluster snapshot's indexes stay consistent with the objects and nodes fed into it.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use std::collections::BTreeMap;
use std::net::IpAddr;

use cloudnet_shared::node::{EgressState, NodeInfo};
use cloudnet_shared::platform::Bucket;
use cloudnet_shared::rules::{Claim, ClusterSnapshot, claims_ahead, occupies};
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

fn node(name: &str, addresses: &[&str]) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        egress: EgressState::Missing,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const V6_A: &str = "fd00.0000.0000.0000.0000.0000.0000.000a";
const V6_B: &str = "fd00.0000.0000.0000.0000.0000.0000.000b";

#[test]
fn objects_are_counted_per_node_and_family() {
    let mut s = ClusterSnapshot::new();
    s.upsert_object("10.0.0.5", "n1", "");
    s.upsert_object("10.0.0.6", "n1", "");
    s.upsert_object(V6_A, "n1", "");
    s.upsert_object("10.0.0.7", "n2", "");
    assert_eq!(s.count_occupying("n1", Bucket::Ipv4, ""), 2);
    assert_eq!(s.count_occupying("n1", Bucket::Ipv6, ""), 1);
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 3);
    assert_eq!(s.count_occupying("n2", Bucket::Ip, ""), 1);
    assert_eq!(s.count_occupying("n3", Bucket::Ip, ""), 0);
    assert_eq!(s.object_node("10.0.0.7"), Some("n2"));
    assert_eq!(s.object_count(), 4);
}

#[test]
fn excluding_an_object_only_discounts_it_where_it_is_counted() {
    let mut s = ClusterSnapshot::new();
    s.upsert_object("10.0.0.5", "n1", "");
    s.upsert_object(V6_A, "n1", "");
    assert_eq!(s.count_occupying("n1", Bucket::Ipv4, "10.0.0.5"), 0);
    assert_eq!(s.count_occupying("n1", Bucket::Ipv6, "10.0.0.5"), 1);
    assert_eq!(s.count_occupying("n1", Bucket::Ip, "10.0.0.5"), 1);
    assert_eq!(s.count_occupying("n1", Bucket::Ip, V6_A), 1);
    assert_eq!(s.count_occupying("n1", Bucket::Ip, "10.0.0.99"), 2);
}

#[test]
fn moving_an_object_leaves_the_old_node() {
    let mut s = ClusterSnapshot::new();
    s.upsert_object("10.0.0.5", "n1", "");
    s.upsert_object("10.0.0.5", "n2", "");
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 0);
    assert_eq!(s.count_occupying("n2", Bucket::Ip, ""), 1);
    // Re-applying the same spec is idempotent.
    s.upsert_object("10.0.0.5", "n2", "");
    assert_eq!(s.count_occupying("n2", Bucket::Ipv4, ""), 1);
    // Parking it (empty spec.node) takes it off every node, but it is still known.
    s.upsert_object("10.0.0.5", "", "");
    assert_eq!(s.count_occupying("n2", Bucket::Ip, ""), 0);
    assert_eq!(s.object_node("10.0.0.5"), None);
    assert_eq!(s.object_count(), 1);
    s.upsert_object("10.0.0.5", "n1", "");
    s.remove_object("10.0.0.5");
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 0);
    assert_eq!(s.object_count(), 0);
    // Removing what is not there is harmless.
    s.remove_object("10.0.0.5");
}

#[test]
fn an_ip_on_its_way_out_occupies_its_source_until_detached() {
    let mut s = ClusterSnapshot::new();
    // Moved from n1 to n2, not yet detached from n1: it occupies both.
    s.upsert_object("10.0.0.5", "n2", "n1");
    assert_eq!(s.count_occupying("n1", Bucket::Ipv4, ""), 1);
    assert_eq!(s.count_occupying("n2", Bucket::Ipv4, ""), 1);
    // Parked but still attached to n1; or being deleted from n1.
    s.upsert_object("10.0.0.6", "", "n1");
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 2);
    assert_eq!(s.count_occupying("n1", Bucket::Ip, "10.0.0.5"), 1);
    // Detached from n1 (status.node cleared), then attached to n2: once per node.
    s.upsert_object("10.0.0.5", "n2", "");
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 1);
    s.upsert_object("10.0.0.5", "n2", "n2");
    assert_eq!(s.count_occupying("n2", Bucket::Ip, ""), 1);
    s.remove_object("10.0.0.6");
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 0);
}

#[test]
fn every_known_or_recently_deleted_object_manages_its_ip() {
    let mut s = ClusterSnapshot::new();
    s.upsert_object("10.0.0.5", "", "");
    s.upsert_object("10.0.0.6", "n1", "n1");
    assert!(s.is_managed("10.0.0.5"), "parked objects manage their IP");
    assert!(s.is_managed("10.0.0.6"));
    assert!(!s.is_managed("10.0.0.7"));
    s.remove_object("10.0.0.6");
    assert!(!s.is_managed("10.0.0.6"));
    s.remember_deleted("10.0.0.6");
    assert!(s.is_managed("10.0.0.6"));
    // Re-created and deleted again within the grace: still managed until the grace ends.
    s.upsert_object("10.0.0.6", "n2", "");
    s.remove_object("10.0.0.6");
    assert!(s.is_managed("10.0.0.6"));
    s.forget_deleted("10.0.0.6");
    assert!(!s.is_managed("10.0.0.6"));
    // An object of the name keeps the IP managed whatever the deleted set says.
    s.upsert_object("10.0.0.6", "", "");
    s.forget_deleted("10.0.0.6");
    assert!(s.is_managed("10.0.0.6"));
}

#[test]
fn objects_with_undecodable_names_are_not_counted() {
    let mut s = ClusterSnapshot::new();
    for name in [
        "fd00::a",
        "FD00.0000.0000.0000.0000.0000.0000.000A",
        "010.0.0.5",
        "127.0.0.1",
        "x",
    ] {
        s.upsert_object(name, "n1", "");
    }
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 0);
    assert_eq!(s.object_count(), 0);
}

#[test]
fn node_addresses_follow_node_updates_and_removal() {
    let mut s = ClusterSnapshot::new();
    s.upsert_node(node("n1", &["10.0.0.10", "fd00::10"]));
    assert_eq!(s.node_with_address(ip("10.0.0.10")), Some("n1"));
    assert_eq!(s.node_with_address(ip("fd00::10")), Some("n1"));
    // The node changed address (e.g. DHCP): the old one is free again.
    s.upsert_node(node("n1", &["10.0.0.20"]));
    assert_eq!(s.node_with_address(ip("10.0.0.10")), None);
    assert_eq!(s.node_with_address(ip("fd00::10")), None);
    assert_eq!(s.node_with_address(ip("10.0.0.20")), Some("n1"));
    assert_eq!(s.node("n1").unwrap().addresses, vec![ip("10.0.0.20")]);
    s.remove_node("n1");
    assert_eq!(s.node_with_address(ip("10.0.0.20")), None);
    assert!(s.node("n1").is_none());
    assert_eq!(s.node_count(), 0);
}

#[test]
fn a_shared_address_survives_the_removal_of_one_holder() {
    let mut s = ClusterSnapshot::new();
    s.upsert_node(node("old-vm", &["10.0.0.10"]));
    s.upsert_node(node("new-vm", &["10.0.0.10"]));
    s.remove_node("old-vm");
    assert_eq!(s.node_with_address(ip("10.0.0.10")), Some("new-vm"));
}

#[test]
fn objects_keep_counting_across_node_removal_and_return() {
    let mut s = ClusterSnapshot::new();
    s.upsert_node(node("n1", &[]));
    s.upsert_object("10.0.0.5", "n1", "");
    s.remove_node("n1");
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 1);
    s.upsert_node(node("n1", &[]));
    assert_eq!(s.count_occupying("n1", Bucket::Ip, ""), 1);
}

/// One watch event.
#[derive(Clone, Debug)]
enum Event {
    UpsertObject(usize, usize, usize),
    RemoveObject(usize),
    UpsertNode(usize, Vec<usize>),
    RemoveNode(usize),
}

const NAMES: [&str; 6] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", V6_A, V6_B, "not-an-ip"];
const NODES: [&str; 4] = ["", "n1", "n2", "n3"];
const ADDRESSES: [&str; 4] = ["10.0.1.1", "10.0.1.2", "fd00::1", "fd00::2"];

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..NAMES.len(), 0..NODES.len(), 0..NODES.len())
            .prop_map(|(o, n, st)| Event::UpsertObject(o, n, st)),
        1 => (0..NAMES.len()).prop_map(Event::RemoveObject),
        2 => (1..NODES.len(), proptest::collection::vec(0..ADDRESSES.len(), 0..3))
            .prop_map(|(n, a)| Event::UpsertNode(n, a)),
        1 => (1..NODES.len()).prop_map(Event::RemoveNode),
    ]
}

proptest! {
    /// After any sequence of events, every index answer equals a brute-force scan of the latest
    /// state of each object and node.
    #[test]
    fn indexes_match_a_full_scan(events in proptest::collection::vec(event(), 0..40)) {
        let mut s = ClusterSnapshot::new();
        let mut objects: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
        let mut nodes: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
        for event in events {
            match event {
                Event::UpsertObject(o, n, st) => {
                    s.upsert_object(NAMES[o], NODES[n], NODES[st]);
                    objects.insert(NAMES[o], (NODES[n], NODES[st]));
                }
                Event::RemoveObject(o) => {
                    s.remove_object(NAMES[o]);
                    objects.remove(NAMES[o]);
                }
                Event::UpsertNode(n, addrs) => {
                    let addrs: Vec<&str> = addrs.iter().map(|a| ADDRESSES[*a]).collect();
                    s.upsert_node(node(NODES[n], &addrs));
                    nodes.insert(NODES[n], addrs.iter().map(|a| ip(a)).collect());
                }
                Event::RemoveNode(n) => {
                    s.remove_node(NODES[n]);
                    nodes.remove(NODES[n]);
                }
            }
        }
        for node_name in NODES {
            for bucket in [Bucket::Ipv4, Bucket::Ipv6, Bucket::Ip] {
                for excluding in NAMES.iter().chain([&""]) {
                    let want = objects
                        .iter()
                        .filter(|(name, (spec, status))| occupies(spec, status, node_name) && *name != excluding)
                        .filter_map(|(name, _)| cloudnet_shared::codec::decode_name(name).ok())
                        .filter(|ip| bucket.holds(*ip))
                        .count();
                    prop_assert_eq!(s.count_occupying(node_name, bucket, excluding), want);
                    // The same answer as the shared ranking, for a request (a newcomer).
                    let ahead = claims_ahead(
                        &Claim::newcomer(excluding),
                        objects
                            .iter()
                            .filter(|(_, (spec, status))| occupies(spec, status, node_name))
                            .filter(|(name, _)| {
                                cloudnet_shared::codec::decode_name(name).is_ok_and(|ip| bucket.holds(ip))
                            })
                            // Existing objects all have a creation time; the request has none.
                            .map(|(name, _)| Claim { name, attached: false, created: Some(Timestamp::UNIX_EPOCH) }),
                    );
                    prop_assert_eq!(ahead, want);
                }
            }
            prop_assert_eq!(s.node(node_name).is_some(), nodes.contains_key(node_name));
        }
        for name in NAMES {
            let known = objects.contains_key(name)
                && cloudnet_shared::codec::decode_name(name).is_ok();
            prop_assert_eq!(s.is_managed(name), known);
        }
        for address in ADDRESSES.map(ip) {
            let want = nodes
                .iter()
                .find(|(_, addrs)| addrs.contains(&address))
                .map(|(name, _)| *name);
            prop_assert_eq!(s.node_with_address(address), want);
        }
    }
}
