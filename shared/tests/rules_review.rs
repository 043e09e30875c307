//! SPEC §3: the whole admission decision, rule by rule, on every platform.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use cloudnet_shared::annotation::EGRESS_IPCONFIG_ANNOTATION;
use cloudnet_shared::node::{EgressState, NodeInfo};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::{
    ClusterSnapshot, Denial, ObjectView, Operation, Rule, Verdict, review,
};

const AWS: Option<Platform> = Some(Platform::Aws);
const AZURE: Option<Platform> = Some(Platform::Azure);
const GCP: Option<Platform> = Some(Platform::Gcp);
const OPENSTACK: Option<Platform> = Some(Platform::OpenStack);
const UNKNOWN: Option<Platform> = None;

fn node(name: &str, addresses: &[&str], annotation: Option<&str>) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        egress: EgressState::from_annotation(annotation),
    }
}

/// The cluster every case starts from, annotated the way `platform`'s reconciler would.
///
/// * worker-1: dual stack, 10.0.0.0/24 + fd00:10::/64; room for 2 IPv4 + 1 IPv6 (AWS) or 2 IPs.
/// * worker-2: IPv4 only, 10.0.0.0/24; room for 5.
/// * worker-3: not annotated yet. worker-4: unreadable annotation.
fn cluster(platform: Option<Platform>, objects: &[(&str, &str)]) -> ClusterSnapshot {
    let (w1, w2) = if platform == AWS {
        (
            r#"[{"interface":"eni-1","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd00:10::/64"},"capacity":{"ipv4":2,"ipv6":1}}]"#,
            r#"[{"interface":"eni-2","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ipv4":5,"ipv6":5}}]"#,
        )
    } else {
        (
            r#"[{"interface":"nic-1","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd00:10::/64"},"capacity":{"ip":2}}]"#,
            r#"[{"interface":"nic-2","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ip":5}}]"#,
        )
    };
    let mut snapshot = ClusterSnapshot::new();
    snapshot.upsert_node(node("worker-1", &["10.0.0.10", "fd00:10::10"], Some(w1)));
    snapshot.upsert_node(node("worker-2", &["10.0.0.11"], Some(w2)));
    snapshot.upsert_node(node("worker-3", &["10.0.0.12"], None));
    snapshot.upsert_node(node("worker-4", &["10.0.0.13"], Some("{oops")));
    for (name, spec_node) in objects {
        snapshot.upsert_object(name, spec_node, "");
    }
    snapshot
}

fn view<'a>(name: &'a str, spec_node: &'a str) -> ObjectView<'a> {
    ObjectView { name, spec_node }
}

fn create(platform: Option<Platform>, objects: &[(&str, &str)], name: &str, node: &str) -> Verdict {
    review(
        Operation::Create,
        Some(view(name, node)),
        None,
        &cluster(platform, objects),
        platform,
    )
}

fn update(
    platform: Option<Platform>,
    objects: &[(&str, &str)],
    name: &str,
    from: &str,
    to: &str,
) -> Verdict {
    review(
        Operation::Update,
        Some(view(name, to)),
        Some(view(name, from)),
        &cluster(platform, objects),
        platform,
    )
}

#[track_caller]
fn assert_allowed(verdict: &Verdict) {
    assert!(verdict.allowed(), "{verdict:?}");
    assert!(verdict.warnings.is_empty(), "{verdict:?}");
}

#[track_caller]
fn assert_warned(verdict: &Verdict, fragment: &str) {
    assert!(verdict.allowed(), "{verdict:?}");
    assert!(
        verdict.warnings.iter().any(|w| w.contains(fragment)),
        "no warning containing {fragment:?}: {verdict:?}"
    );
}

/// Asserts the denial's rule and that its message names rule, IP, node and the given fragments.
#[track_caller]
fn assert_denied(
    verdict: &Verdict,
    rule: Rule,
    ip: &str,
    node: &str,
    fragments: &[&str],
) -> Denial {
    let denial = verdict
        .denial
        .clone()
        .unwrap_or_else(|| panic!("allowed: {verdict:?}"));
    assert_eq!(denial.rule, rule, "{}", denial.message);
    let message = &denial.message;
    assert!(message.starts_with(&format!("{rule}: ")), "{message}");
    assert!(message.contains(ip), "IP {ip} missing: {message}");
    assert!(message.contains(node), "node {node} missing: {message}");
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "{fragment:?} missing: {message}"
        );
    }
    assert!(
        message.contains("; ") || message.contains(": use "),
        "no fix offered: {message}"
    );
    denial
}

// Operations that always pass.

#[test]
fn delete_and_connect_are_allowed_whatever_the_object() {
    let snapshot = cluster(AWS, &[]);
    for op in [Operation::Delete, Operation::Connect] {
        for obj in [
            None,
            Some(view("FC00:F853::54", "no-such-node")),
            Some(view("10.0.0.10", "worker-1")),
        ] {
            assert_allowed(&review(op, None, obj, &snapshot, AWS));
            assert_allowed(&review(op, obj, obj, &snapshot, AWS));
        }
    }
}

#[test]
fn metadata_only_update_of_an_object_that_is_now_invalid_is_allowed() {
    // Each object would be refused if created today; its finalizer must still be removable.
    let full = &[
        ("10.0.0.5", "worker-1"),
        ("10.0.0.6", "worker-1"),
        ("10.0.0.7", "worker-1"),
    ];
    for (name, node) in [
        ("10.0.0.7", "worker-1"),               // over capacity
        ("10.0.0.1", "worker-1"),               // reserved index
        ("10.0.0.10", "worker-1"),              // node IP
        ("10.9.0.5", "worker-1"),               // outside the subnet
        ("10.0.0.5", "gone-node"),              // node deleted since
        ("fc00:f853:ccd:e793::54", "worker-1"), // predates the webhook
        ("FC00.F853.0CCD.E793.0000.0000.0000.0054", "worker-1"),
    ] {
        let verdict = update(AWS, full, name, node, node);
        assert_allowed(&verdict);
    }
}

#[test]
fn create_without_an_object_is_bad_input() {
    let snapshot = cluster(AWS, &[]);
    for op in [Operation::Create, Operation::Update] {
        let verdict = review(op, None, Some(view("10.0.0.5", "worker-1")), &snapshot, AWS);
        let denial = verdict.denial.unwrap();
        assert_eq!(denial.rule, Rule::BadInput);
        assert!(
            denial.message.starts_with("bad_input: "),
            "{}",
            denial.message
        );
    }
}

// Rule 1: name encoding.

#[test]
fn non_canonical_names_are_denied_with_the_canonical_spelling() {
    let canonical = "fd00.0010.0000.0000.0000.0000.0000.0005";
    for name in [
        "fd00:10::5",
        "FD00.0010.0000.0000.0000.0000.0000.0005",
        "fd00.10.0.0.0.0.0.5",
    ] {
        let verdict = create(AWS, &[], name, "worker-1");
        assert_denied(
            &verdict,
            Rule::NameEncoding,
            name,
            "worker-1",
            &[&format!("use \"{canonical}\"")],
        );
    }
    let verdict = create(AWS, &[], "010.0.0.5", "worker-1");
    assert_denied(
        &verdict,
        Rule::NameEncoding,
        "010.0.0.5",
        "worker-1",
        &["use \"10.0.0.5\""],
    );
    let verdict = create(AWS, &[], "::ffff:10.0.0.5", "worker-1");
    assert_denied(
        &verdict,
        Rule::NameEncoding,
        "::ffff:10.0.0.5",
        "worker-1",
        &["IPv4-mapped", "use \"10.0.0.5\""],
    );
}

#[test]
fn unusable_and_non_ip_names_are_denied() {
    for (name, fragment) in [
        ("127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.5", "multicast"),
        ("169.254.0.5", "link-local"),
        ("255.255.255.255", "broadcast"),
        ("fe80.0000.0000.0000.0000.0000.0000.0005", "link-local"),
        ("worker-1-egress", "not an IP address"),
    ] {
        let verdict = create(AWS, &[], name, "worker-1");
        assert_denied(&verdict, Rule::NameEncoding, name, "worker-1", &[fragment]);
    }
}

#[test]
fn spec_change_reruns_the_name_rule() {
    let verdict = update(AWS, &[], "fd00:10::5", "", "worker-1");
    assert_eq!(verdict.denial.unwrap().rule, Rule::NameEncoding);
}

// Rule 3: node-IP exclusion.

#[test]
fn a_node_ip_is_denied_even_on_another_node_or_on_none() {
    for (name, ip, owner, target) in [
        ("10.0.0.11", "10.0.0.11", "worker-2", "worker-1"),
        ("10.0.0.10", "10.0.0.10", "worker-1", "worker-1"),
        ("10.0.0.12", "10.0.0.12", "worker-3", "worker-2"),
        (
            "fd00.0010.0000.0000.0000.0000.0000.0010",
            "fd00:10::10",
            "worker-1",
            "worker-1",
        ),
    ] {
        let verdict = create(OPENSTACK, &[], name, target);
        assert_denied(
            &verdict,
            Rule::NodeIp,
            ip,
            target,
            &[&format!("address of node {owner}")],
        );
    }
    let verdict = create(AWS, &[], "10.0.0.11", "");
    assert_denied(
        &verdict,
        Rule::NodeIp,
        "10.0.0.11",
        "worker-2",
        &["status.addresses"],
    );
}

/// worker-1 as cloud-provider-aws reports it: its own addresses, then every other private IP of
/// the ENI, egress IPs 10.0.0.30 and fd00:10::30 included; worker-7 is a second dual-stack node.
fn listing_egress_ips(platform: Option<Platform>) -> ClusterSnapshot {
    let mut snapshot = cluster(platform, &[]);
    let mut worker1 = snapshot.node("worker-1").unwrap().clone();
    worker1
        .addresses
        .extend(["10.0.0.30", "fd00:10::30"].map(|a| a.parse::<std::net::IpAddr>().unwrap()));
    snapshot.upsert_node(worker1);
    snapshot.upsert_node(node(
        "worker-7",
        &["10.0.0.17", "fd00:10::17"],
        Some(r#"[{"interface":"eni-7","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd00:10::/64"},"capacity":{"ipv4":5,"ipv6":5}}]"#),
    ));
    snapshot
}

const EGRESS_V6: &str = "fd00.0010.0000.0000.0000.0000.0000.0030";

fn review_on(
    snapshot: &ClusterSnapshot,
    operation: Operation,
    name: &str,
    from: Option<&str>,
    to: &str,
) -> Verdict {
    review(
        operation,
        Some(view(name, to)),
        from.map(|from| view(name, from)),
        snapshot,
        AWS,
    )
}

#[test]
fn moving_or_parking_an_egress_ip_its_node_still_lists_is_allowed() {
    let mut snapshot = listing_egress_ips(AWS);
    for name in ["10.0.0.30", EGRESS_V6] {
        // Whether or not the cache has caught up with the object yet: an update never trips it.
        for cached in [false, true] {
            if cached {
                snapshot.upsert_object(name, "worker-1", "worker-1");
            }
            let moved = review_on(
                &snapshot,
                Operation::Update,
                name,
                Some("worker-1"),
                "worker-7",
            );
            assert!(moved.allowed(), "{name} cached={cached}: {moved:?}");
            let parked = review_on(&snapshot, Operation::Update, name, Some("worker-1"), "");
            assert_warned(&parked, "empty spec.node");
            let back = review_on(&snapshot, Operation::Update, name, Some(""), "worker-1");
            assert!(back.allowed(), "{name} cached={cached}: {back:?}");
        }
    }
}

#[test]
fn a_parked_or_existing_egress_ip_its_node_lists_is_managed_on_create_too() {
    // A re-applied or dry-run create of an object the cache holds, even one parked nowhere.
    let mut snapshot = listing_egress_ips(AWS);
    snapshot.upsert_object("10.0.0.30", "", "");
    assert_warned(
        &review_on(&snapshot, Operation::Create, "10.0.0.30", None, ""),
        "empty spec.node",
    );
    assert_allowed(&review_on(
        &snapshot,
        Operation::Create,
        "10.0.0.30",
        None,
        "worker-7",
    ));
}

#[test]
fn recreating_a_recently_deleted_egress_ip_its_node_still_lists_is_allowed() {
    let mut snapshot = listing_egress_ips(AWS);
    for name in ["10.0.0.30", EGRESS_V6] {
        snapshot.remember_deleted(name);
        for target in ["worker-1", "worker-7"] {
            assert_allowed(&review_on(&snapshot, Operation::Create, name, None, target));
        }
        // Once the grace ends, an address the node still lists is its own again.
        snapshot.forget_deleted(name);
        assert_denied(
            &review_on(&snapshot, Operation::Create, name, None, "worker-7"),
            Rule::NodeIp,
            name.strip_prefix("fd00.").map_or(name, |_| "fd00:10::30"),
            "worker-7",
            &[
                "address of node worker-1",
                "no CloudPrivateIPConfig manages",
            ],
        );
    }
}

#[test]
fn a_genuine_node_ip_is_denied_beside_managed_egress_ips() {
    let mut snapshot = listing_egress_ips(AWS);
    snapshot.upsert_object("10.0.0.30", "worker-1", "worker-1");
    snapshot.remember_deleted("10.0.0.31");
    for target in ["worker-1", "worker-7", ""] {
        let verdict = review_on(&snapshot, Operation::Create, "10.0.0.10", None, target);
        assert_eq!(verdict.denial.unwrap().rule, Rule::NodeIp, "{target:?}");
    }
}

#[test]
fn node_ip_is_checked_without_platform_or_annotation() {
    let verdict = create(UNKNOWN, &[], "10.0.0.13", "worker-3");
    assert_eq!(verdict.denial.unwrap().rule, Rule::NodeIp);
}

// Empty spec.node.

#[test]
fn empty_spec_node_is_allowed_with_a_warning() {
    for platform in [AWS, GCP, UNKNOWN] {
        let verdict = create(platform, &[], "10.0.0.5", "");
        assert_warned(&verdict, "will not be attached to any node");
        assert_warned(&verdict, "10.0.0.5");
    }
    // Unsetting spec.node is how a client parks an IP.
    assert_warned(
        &update(AWS, &[], "10.0.0.5", "worker-1", ""),
        "empty spec.node",
    );
}

// Rule 2: target node.

#[test]
fn unknown_target_node_is_denied() {
    let verdict = create(AWS, &[], "10.0.0.5", "worker-9");
    assert_denied(
        &verdict,
        Rule::TargetNode,
        "10.0.0.5",
        "worker-9",
        &["no Node named \"worker-9\""],
    );
    let verdict = update(UNKNOWN, &[], "10.0.0.5", "worker-1", "worker-9");
    assert_eq!(verdict.denial.unwrap().rule, Rule::TargetNode);
}

// Missing or unreadable annotation.

#[test]
fn target_without_annotation_is_allowed_with_a_warning() {
    // 10.9.0.1 would be out of subnet and reserved; nobody can tell yet.
    for platform in [AWS, AZURE, OPENSTACK, UNKNOWN] {
        let verdict = create(platform, &[], "10.9.0.1", "worker-3");
        assert_warned(
            &verdict,
            "node worker-3 has no cloud.network.openshift.io/egress-ipconfig annotation",
        );
        // Says what really happens: checked later only if annotated by then, else the cloud decides.
        assert_warned(
            &verdict,
            "the reconciler repeats them from the annotation before attaching if the node is annotated by then",
        );
        assert_warned(&verdict, "otherwise the cloud's own answer decides");
        let verdict = create(platform, &[], "10.9.0.1", "worker-4");
        assert_warned(
            &verdict,
            "node worker-4: annotation cloud.network.openshift.io/egress-ipconfig is not",
        );
        assert_warned(&verdict, "skipped");
    }
}

// Rule 4: address index.

#[test]
fn reserved_indices_are_denied_per_cloud() {
    let cases: &[(Option<Platform>, &[&str], &[&str])] = &[
        (
            AWS,
            &[
                "10.0.0.0",
                "10.0.0.1",
                "10.0.0.2",
                "10.0.0.3",
                "10.0.0.255",
                "fd00:10::",
                "fd00:10::3",
                "fd00:10::ffff:ffff:ffff:ffff",
            ],
            &[
                "10.0.0.4",
                "10.0.0.254",
                "fd00:10::4",
                "fd00:10::ffff:ffff:ffff:fffe",
            ],
        ),
        (
            AZURE,
            &[
                "10.0.0.0",
                "10.0.0.1",
                "10.0.0.2",
                "10.0.0.3",
                "10.0.0.255",
                "fd00:10::1",
                "fd00:10::2",
                "fd00:10::ffff:ffff:ffff:ffff",
            ],
            &["10.0.0.4", "10.0.0.254", "fd00:10::4"],
        ),
        (
            GCP,
            &["10.0.0.0", "10.0.0.1", "10.0.0.254", "10.0.0.255"],
            &["10.0.0.2", "10.0.0.3", "10.0.0.253"],
        ),
        (
            OPENSTACK,
            &["10.0.0.0", "10.0.0.1", "10.0.0.255", "fd00:10::"],
            // Neutron's IPv6 gateway is the subnet-router anycast address; its pool starts at ::1.
            &[
                "10.0.0.2",
                "10.0.0.3",
                "10.0.0.254",
                "fd00:10::1",
                "fd00:10::2",
                "fd00:10::3",
                "fd00:10::ffff:ffff:ffff:ffff",
            ],
        ),
    ];
    for (platform, reserved, free) in cases {
        let platform = *platform;
        for ip in *reserved {
            let name = cloudnet_shared::codec::encode_name(ip.parse().unwrap()).unwrap();
            let verdict = create(platform, &[], &name, "worker-1");
            let subnet = if ip.contains(':') {
                "fd00:10::/64"
            } else {
                "10.0.0.0/24"
            };
            assert_denied(
                &verdict,
                Rule::AddressIndex,
                ip,
                "worker-1",
                &[subnet, "reserves", "pick another address"],
            );
        }
        for ip in *free {
            let name = cloudnet_shared::codec::encode_name(ip.parse().unwrap()).unwrap();
            assert_allowed(&create(platform, &[], &name, "worker-1"));
        }
    }
}

#[test]
fn gcp_refuses_ipv6_with_or_without_annotation() {
    let name = "fd00.0010.0000.0000.0000.0000.0000.0005";
    for node in ["worker-1", "worker-3"] {
        let verdict = create(GCP, &[], name, node);
        assert_denied(
            &verdict,
            Rule::AddressIndex,
            "fd00:10::5",
            node,
            &["GCP attaches only IPv4", "use an IPv4 address"],
        );
    }
    assert_allowed(&create(AZURE, &[], name, "worker-1"));
}

#[test]
fn node_without_a_subnet_of_the_family_is_denied() {
    let name = "fd00.0010.0000.0000.0000.0000.0000.0005";
    for platform in [AWS, AZURE, OPENSTACK] {
        let verdict = create(platform, &[], name, "worker-2");
        assert_denied(
            &verdict,
            Rule::AddressIndex,
            "fd00:10::5",
            "worker-2",
            &["no IPv6 subnet"],
        );
    }
}

#[test]
fn out_of_subnet_ip_is_denied() {
    let verdict = create(AWS, &[], "10.1.0.5", "worker-1");
    assert_denied(
        &verdict,
        Rule::AddressIndex,
        "10.1.0.5",
        "worker-1",
        &[
            "outside the node's subnet 10.0.0.0/24",
            "pick an address in 10.0.0.0/24",
        ],
    );
    let verdict = create(
        OPENSTACK,
        &[],
        "fd00.0011.0000.0000.0000.0000.0000.0005",
        "worker-1",
    );
    assert_denied(
        &verdict,
        Rule::AddressIndex,
        "fd00:11::5",
        "worker-1",
        &["fd00:10::/64"],
    );
}

#[test]
fn unknown_platform_skips_address_index_but_not_capacity() {
    assert_allowed(&create(UNKNOWN, &[], "10.0.0.1", "worker-1"));
    assert_allowed(&create(UNKNOWN, &[], "10.9.0.5", "worker-1"));
    let full = &[("10.0.0.5", "worker-1"), ("10.0.0.6", "worker-1")];
    let verdict = create(UNKNOWN, full, "10.0.0.7", "worker-1");
    assert_eq!(verdict.denial.unwrap().rule, Rule::Capacity);
}

// Rule 5: capacity.

#[test]
fn capacity_message_is_actionable() {
    let full = &[("10.0.0.5", "worker-1"), ("10.0.0.6", "worker-1")];
    let denial = create(AWS, full, "10.0.0.7", "worker-1").denial.unwrap();
    assert_eq!(
        denial.message,
        format!(
            "capacity: cannot place 10.0.0.7 on node worker-1: the node already carries 2 of its 2 ipv4 egress IPs (capacity \"ipv4\" in annotation {EGRESS_IPCONFIG_ANNOTATION}); pick another node or release one of its IPs"
        )
    );
}

#[test]
fn aws_counts_each_family_in_its_own_bucket() {
    let v4_full = &[("10.0.0.5", "worker-1"), ("10.0.0.6", "worker-1")];
    let v6 = "fd00.0010.0000.0000.0000.0000.0000.0005";
    // A full IPv4 bucket does not block IPv6.
    assert_allowed(&create(AWS, v4_full, v6, "worker-1"));
    assert_denied(
        &create(AWS, v4_full, "10.0.0.7", "worker-1"),
        Rule::Capacity,
        "10.0.0.7",
        "worker-1",
        &["2 of its 2 ipv4"],
    );
    // And a full IPv6 bucket does not block IPv4.
    let v6_full = &[("fd00.0010.0000.0000.0000.0000.0000.0006", "worker-1")];
    assert_allowed(&create(AWS, v6_full, "10.0.0.7", "worker-1"));
    assert_denied(
        &create(AWS, v6_full, v6, "worker-1"),
        Rule::Capacity,
        "fd00:10::5",
        "worker-1",
        &["1 of its 1 ipv6", "capacity \"ipv6\""],
    );
}

#[test]
fn shared_clouds_count_both_families_in_the_ip_bucket() {
    let mixed = &[
        ("10.0.0.5", "worker-1"),
        ("fd00.0010.0000.0000.0000.0000.0000.0006", "worker-1"),
    ];
    for platform in [AZURE, OPENSTACK] {
        assert_denied(
            &create(platform, mixed, "10.0.0.7", "worker-1"),
            Rule::Capacity,
            "10.0.0.7",
            "worker-1",
            &["2 of its 2 egress IPs", "capacity \"ip\""],
        );
        assert_denied(
            &create(
                platform,
                mixed,
                "fd00.0010.0000.0000.0000.0000.0000.0007",
                "worker-1",
            ),
            Rule::Capacity,
            "fd00:10::7",
            "worker-1",
            &["capacity \"ip\""],
        );
        assert_allowed(&create(platform, &mixed[..1], "10.0.0.7", "worker-1"));
    }
    let gcp_full = &[("10.0.0.5", "worker-1"), ("10.0.0.6", "worker-1")];
    assert_eq!(
        create(GCP, gcp_full, "10.0.0.7", "worker-1")
            .denial
            .unwrap()
            .rule,
        Rule::Capacity
    );
}

#[test]
fn objects_on_other_nodes_or_nowhere_do_not_count() {
    let elsewhere = &[
        ("10.0.0.5", "worker-2"),
        ("10.0.0.6", ""),
        ("10.0.0.8", "worker-3"),
    ];
    assert_allowed(&create(AZURE, elsewhere, "10.0.0.7", "worker-1"));
}

#[test]
fn zero_capacity_denies_and_missing_bucket_is_unlimited() {
    let mut snapshot = cluster(AWS, &[]);
    snapshot.upsert_node(node(
        "worker-5",
        &["10.0.0.15"],
        Some(r#"[{"interface":"eni-5","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd00:10::/64"},"capacity":{"ipv4":0}}]"#),
    ));
    let verdict = review(
        Operation::Create,
        Some(view("10.0.0.7", "worker-5")),
        None,
        &snapshot,
        AWS,
    );
    assert_denied(
        &verdict,
        Rule::Capacity,
        "10.0.0.7",
        "worker-5",
        &["0 of its 0 ipv4"],
    );
    for i in 0..50 {
        snapshot.upsert_object(
            &format!("fd00.0010.0000.0000.0000.0000.0000.{:04x}", 0x100 + i),
            "worker-5",
            "",
        );
    }
    let verdict = review(
        Operation::Create,
        Some(view("fd00.0010.0000.0000.0000.0000.0000.0007", "worker-5")),
        None,
        &snapshot,
        AWS,
    );
    assert_allowed(&verdict);
}

#[test]
fn an_object_already_counted_on_the_node_is_not_counted_twice() {
    // The cache may already hold the object under review (re-apply, or the watch event of the
    // update arrived first): it must not count against its own admission.
    let full = &[("10.0.0.5", "worker-1"), ("10.0.0.6", "worker-1")];
    assert_allowed(&create(AWS, full, "10.0.0.5", "worker-1"));
    assert_allowed(&update(AWS, full, "10.0.0.5", "worker-2", "worker-1"));
}

// Moves.

#[test]
fn a_move_rechecks_everything_against_the_new_target() {
    let worker1_full = &[
        ("10.0.0.5", "worker-1"),
        ("10.0.0.6", "worker-1"),
        ("10.0.0.7", "worker-2"),
    ];
    // To a full node: denied.
    assert_denied(
        &update(AWS, worker1_full, "10.0.0.7", "worker-2", "worker-1"),
        Rule::Capacity,
        "10.0.0.7",
        "worker-1",
        &[],
    );
    // Back out of the full node to one with room: allowed.
    assert_allowed(&update(
        AWS,
        worker1_full,
        "10.0.0.5",
        "worker-1",
        "worker-2",
    ));
    // To a node that does not exist, or lacks the family: denied.
    assert_eq!(
        update(AWS, &[], "10.0.0.7", "worker-2", "worker-9")
            .denial
            .unwrap()
            .rule,
        Rule::TargetNode
    );
    let v6 = "fd00.0010.0000.0000.0000.0000.0000.0005";
    assert_eq!(
        update(AWS, &[], v6, "worker-1", "worker-2")
            .denial
            .unwrap()
            .rule,
        Rule::AddressIndex
    );
    // To an unannotated node: allowed with the warning.
    assert_warned(
        &update(AWS, worker1_full, "10.0.0.5", "worker-1", "worker-3"),
        "skipped",
    );
}

#[test]
fn move_between_full_nodes_is_denied_even_if_the_source_frees_a_slot() {
    let both_full = &[
        ("10.0.0.5", "worker-1"),
        ("10.0.0.6", "worker-1"),
        ("10.0.0.20", "worker-2"),
        ("10.0.0.21", "worker-2"),
        ("10.0.0.22", "worker-2"),
        ("10.0.0.23", "worker-2"),
        ("10.0.0.24", "worker-2"),
    ];
    assert_eq!(
        update(AWS, both_full, "10.0.0.5", "worker-1", "worker-2")
            .denial
            .unwrap()
            .rule,
        Rule::Capacity
    );
    assert_eq!(
        update(AWS, both_full, "10.0.0.24", "worker-2", "worker-1")
            .denial
            .unwrap()
            .rule,
        Rule::Capacity
    );
}

// Platform mismatch: another cloud's capacity keys.

/// worker-6 annotated as a shared-capacity cloud does ("ip" only), room for one.
fn with_ip_keyed_node(objects: &[&str]) -> ClusterSnapshot {
    let mut snapshot = cluster(AWS, &[]);
    snapshot.upsert_node(node(
        "worker-6",
        &["10.0.0.16"],
        Some(r#"[{"interface":"nic-6","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd00:10::/64"},"capacity":{"ip":1}}]"#),
    ));
    for name in objects {
        snapshot.upsert_object(name, "worker-6", "");
    }
    snapshot
}

#[test]
fn another_clouds_capacity_key_still_limits_and_is_reported() {
    let empty = with_ip_keyed_node(&[]);
    let verdict = review_on(&empty, Operation::Create, "10.0.0.7", None, "worker-6");
    assert!(verdict.allowed(), "{verdict:?}");
    assert_warned(
        &verdict,
        r#"node worker-6: annotation cloud.network.openshift.io/egress-ipconfig: its capacity keys are "ip" but platform AWS writes "ipv4"/"ipv6""#,
    );
    let reported = verdict.mismatch.clone().unwrap();
    assert_eq!(reported.node, "worker-6");
    assert_eq!(reported.mismatch.keys_label(), "ip");
    // Full: the "ip" key is the limit, for both families, and was not read as "unlimited".
    let full = with_ip_keyed_node(&["10.0.0.5"]);
    for name in ["10.0.0.7", "fd00.0010.0000.0000.0000.0000.0000.0007"] {
        let verdict = review_on(&full, Operation::Create, name, None, "worker-6");
        assert_eq!(
            verdict.denial.as_ref().unwrap().rule,
            Rule::Capacity,
            "{name}"
        );
        assert!(verdict.mismatch.is_some(), "{name}");
    }
    // The platform's own keys: nothing to report.
    assert_eq!(create(AWS, &[], "10.0.0.7", "worker-1").mismatch, None);
}

// Rule order: the first failing rule is reported.

#[test]
fn rules_run_in_spec_order() {
    // Badly named node IP on a missing node: the name is reported first.
    assert_eq!(
        create(AWS, &[], "010.0.0.11", "worker-9")
            .denial
            .unwrap()
            .rule,
        Rule::NameEncoding
    );
    // Node IP on a missing node: node IP before target node.
    assert_eq!(
        create(AWS, &[], "10.0.0.11", "worker-9")
            .denial
            .unwrap()
            .rule,
        Rule::NodeIp
    );
    // Reserved and over capacity: address index before capacity.
    let full = &[("10.0.0.5", "worker-1"), ("10.0.0.6", "worker-1")];
    assert_eq!(
        create(AWS, full, "10.0.0.1", "worker-1")
            .denial
            .unwrap()
            .rule,
        Rule::AddressIndex
    );
}

// Verdict and denial helpers.

#[test]
fn verdict_helpers() {
    assert!(Verdict::allow().allowed());
    let verdict = Verdict::deny(Rule::BadInput, "body too large");
    assert!(!verdict.allowed());
    assert_eq!(
        verdict.denial.as_ref().unwrap().message,
        "bad_input: body too large"
    );
    // A message that already names its rule is not prefixed twice.
    let denial = Denial::new(Rule::BadInput, "bad_input: wrong kind");
    assert_eq!(denial.message, "bad_input: wrong kind");
    assert_eq!(denial.to_string(), "bad_input: wrong kind");
    let warned = Verdict::allow().with_warning("careful");
    assert!(warned.allowed());
    assert_eq!(warned.warnings, ["careful"]);
    assert_eq!(Verdict::from(denial.clone()).denial, Some(denial));
}

#[test]
fn rule_labels_are_stable() {
    let labels: Vec<&str> = Rule::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        labels,
        [
            "name_encoding",
            "target_node",
            "node_ip",
            "address_index",
            "capacity",
            "bad_input",
            "egress_router_mode",
            "egress_router_interface",
            "egress_router_address",
            "egress_router_redirect",
            "egress_router_cni",
            "egress_router_conflict",
            "public_ip_private",
            "public_ip_id",
            "public_ip_platform",
            "public_ip_conflict",
            "public_ip_immutable",
            "antrea_egress_ip",
            "egress_gateway_ip",
            "egress_gateway_conflict",
        ]
    );
    for rule in Rule::ALL {
        assert_eq!(rule.to_string(), rule.as_str());
    }
}
