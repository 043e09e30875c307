//! The single rules as the reconciler calls them, outside of a full review.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use std::net::IpAddr;

use cloudnet_shared::annotation::{Capacity, IfAddr};
use cloudnet_shared::node::{EgressState, NodeInfo};
use cloudnet_shared::platform::{Bucket, Platform};
use cloudnet_shared::rules::{
    ClusterSnapshot, Operation, Rule, check_address_index, check_capacity, check_capacity_count,
    check_family_supported, check_name, check_node_ip, check_target_node,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn check_name_returns_the_ip() {
    assert_eq!(check_name("10.0.0.5", "n1"), Ok(ip("10.0.0.5")));
    assert_eq!(
        check_name("fd00.0000.0000.0000.0000.0000.0000.0005", ""),
        Ok(ip("fd00::5"))
    );
    let denial = check_name("fd00::5", "n1").unwrap_err();
    assert_eq!(denial.rule, Rule::NameEncoding);
    assert_eq!(
        denial.message,
        "name_encoding: object for node n1: name \"fd00::5\" is an IPv6 address written with colons, which object names cannot hold: use \"fd00.0000.0000.0000.0000.0000.0000.0005\""
    );
}

#[test]
fn check_target_node_returns_the_node() {
    let mut cluster = ClusterSnapshot::new();
    cluster.upsert_node(NodeInfo {
        name: "n1".into(),
        addresses: vec![ip("10.0.0.10")],
        egress: EgressState::Missing,
    });
    assert_eq!(
        check_target_node(ip("10.0.0.5"), "n1", &cluster)
            .unwrap()
            .name,
        "n1"
    );
    assert_eq!(
        check_target_node(ip("10.0.0.5"), "n2", &cluster)
            .unwrap_err()
            .rule,
        Rule::TargetNode
    );
    let create = Operation::Create;
    assert!(check_node_ip(create, ip("10.0.0.5"), "10.0.0.5", "n1", &cluster).is_ok());
    assert_eq!(
        check_node_ip(create, ip("10.0.0.10"), "10.0.0.10", "n2", &cluster)
            .unwrap_err()
            .message,
        "node_ip: cannot place 10.0.0.10 on node n2: 10.0.0.10 is an address of node n1 (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must never be moved or detached; pick an unused address of the node's subnet"
    );
    // Managed by an object, or an update: never refused.
    assert!(
        check_node_ip(
            Operation::Update,
            ip("10.0.0.10"),
            "10.0.0.10",
            "n2",
            &cluster
        )
        .is_ok()
    );
    cluster.upsert_object("10.0.0.10", "", "");
    assert!(check_node_ip(create, ip("10.0.0.10"), "10.0.0.10", "n2", &cluster).is_ok());
}

#[test]
fn check_address_index_covers_family_subnet_and_reserved_index() {
    let ifaddr = IfAddr::new(Some("10.0.0.0/28".parse().unwrap()), None);
    let check = |platform, addr| check_address_index(ip(addr), "n1", &ifaddr, platform);
    assert!(check(Platform::Aws, "10.0.0.4").is_ok());
    assert!(check(Platform::Aws, "10.0.0.14").is_ok());
    assert!(check(Platform::Aws, "10.0.0.15").is_err());
    assert!(check(Platform::Gcp, "10.0.0.14").is_err());
    assert!(check(Platform::Gcp, "10.0.0.13").is_ok());
    assert!(check(Platform::OpenStack, "10.0.0.2").is_ok());
    assert!(check(Platform::OpenStack, "10.0.0.16").is_err());
    assert!(check(Platform::Azure, "fd00::5").is_err());
    assert!(check_family_supported(ip("fd00::5"), "n1", Platform::Aws).is_ok());
    assert!(check_family_supported(ip("10.0.0.5"), "n1", Platform::Gcp).is_ok());
    assert_eq!(
        check_family_supported(ip("fd00::5"), "n1", Platform::Gcp)
            .unwrap_err()
            .rule,
        Rule::AddressIndex
    );
}

#[test]
fn check_address_index_on_a_subnet_with_no_free_address() {
    // A /30 on AWS or Azure is entirely reserved; nothing in it may be placed.
    let ifaddr = IfAddr::new(Some("10.0.0.0/30".parse().unwrap()), None);
    for platform in [Platform::Aws, Platform::Azure, Platform::Gcp] {
        for addr in ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"] {
            assert!(
                check_address_index(ip(addr), "n1", &ifaddr, platform).is_err(),
                "{platform} {addr}"
            );
        }
    }
    let tiny = IfAddr::new(None, Some("fd00::/127".parse().unwrap()));
    for addr in ["fd00::", "fd00::1"] {
        assert!(check_address_index(ip(addr), "n1", &tiny, Platform::OpenStack).is_err());
    }
}

#[test]
fn check_capacity_count_compares_with_the_bucket() {
    let capacity = Capacity {
        ipv4: Some(3),
        ipv6: Some(0),
        ip: Some(-2),
    };
    let v4 = ip("10.0.0.5");
    assert!(check_capacity_count(v4, "n1", &capacity, Bucket::Ipv4, 2).is_ok());
    assert!(check_capacity_count(v4, "n1", &capacity, Bucket::Ipv4, 3).is_err());
    // Already over the limit (admission raced): still refused, and the count is reported.
    let denial = check_capacity_count(v4, "n1", &capacity, Bucket::Ipv4, 7).unwrap_err();
    assert!(
        denial.message.contains("7 of its 3 ipv4"),
        "{}",
        denial.message
    );
    assert!(check_capacity_count(ip("fd00::5"), "n1", &capacity, Bucket::Ipv6, 0).is_err());
    assert!(check_capacity_count(v4, "n1", &capacity, Bucket::Ip, 0).is_err());
    // No key: unlimited.
    let open = Capacity::default();
    for bucket in [Bucket::Ipv4, Bucket::Ipv6, Bucket::Ip] {
        assert!(check_capacity_count(v4, "n1", &open, bucket, usize::MAX).is_ok());
    }
}

#[test]
fn check_capacity_counts_from_the_snapshot_without_the_object_itself() {
    let mut cluster = ClusterSnapshot::new();
    cluster.upsert_object("10.0.0.5", "n1", "");
    cluster.upsert_object("10.0.0.6", "n1", "");
    let capacity = Capacity {
        ip: Some(2),
        ..Capacity::default()
    };
    let azure = Some(Platform::Azure);
    // The reconciler re-checking an object already aimed at n1 must not count it twice.
    assert!(check_capacity(ip("10.0.0.6"), "10.0.0.6", "n1", &capacity, azure, &cluster).is_ok());
    let denial =
        check_capacity(ip("10.0.0.7"), "10.0.0.7", "n1", &capacity, azure, &cluster).unwrap_err();
    assert_eq!(denial.rule, Rule::Capacity);
    assert!(
        denial.message.contains("2 of its 2 egress IPs"),
        "{}",
        denial.message
    );
}
