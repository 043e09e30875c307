//! The admission rules of Antrea's objects (`rules::antrea`): an opted-in ExternalIPPool's
//! ranges against the family, the nodes' own IPs, the subnets and the capacity of the nodes its
//! nodeSelector picks, per cloud; an Egress's static IP against its opted-in pool.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use cloudnet_shared::antrea::{
    EgressSpec, ExternalIPPool, ExternalIPPoolSpec, IpRange, OPT_IN_LABEL,
};
use cloudnet_shared::node::NodeInfo;
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::{
    ClusterSnapshot, Operation, Rule, Verdict, review_egress, review_pool,
};
use k8s_openapi::api::core::v1::NodeAddress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A node in `subnet` with `capacity` (the annotation's JSON object), its own `address`, and
/// `labels`.
fn node(
    cluster: &mut ClusterSnapshot,
    name: &str,
    address: &str,
    annotation: Option<&str>,
    labels: &[(&str, &str)],
) {
    let addresses = [NodeAddress {
        type_: "InternalIP".into(),
        address: address.into(),
    }];
    cluster.upsert_node(NodeInfo::from_parts(name, annotation, &addresses));
    cluster.set_node_labels(
        name,
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
}

fn annotation(ipv4: &str, capacity: &str) -> String {
    format!(
        r#"[{{"interface":"nic0","ifaddr":{{"ipv4":"{ipv4}","ipv6":"fd00:10::/64"}},"capacity":{capacity}}}]"#
    )
}

/// The capacity keys each cloud writes, `n` of each.
fn capacity(platform: Platform, n: i64) -> String {
    match platform {
        Platform::Aws => format!(r#"{{"ipv4":{n},"ipv6":{n}}}"#),
        _ => format!(r#"{{"ip":{n}}}"#),
    }
}

/// Two egress nodes (label `egress=yes`) in 10.0.0.0/24 holding `per_node` egress IPs each, and
/// an unlabelled node in another subnet that no pool below selects.
fn cluster(platform: Platform, per_node: i64) -> ClusterSnapshot {
    let mut cluster = ClusterSnapshot::new();
    let egress = annotation("10.0.0.0/24", &capacity(platform, per_node));
    node(
        &mut cluster,
        "worker-a",
        "10.0.0.10",
        Some(&egress),
        &[("egress", "yes")],
    );
    node(
        &mut cluster,
        "worker-b",
        "10.0.0.11",
        Some(&egress),
        &[("egress", "yes")],
    );
    let other = annotation("10.9.0.0/24", &capacity(platform, per_node));
    node(&mut cluster, "worker-c", "10.9.0.10", Some(&other), &[]);
    cluster
}

fn range(text: &str) -> IpRange {
    match text.split_once('-') {
        Some((start, end)) if !text.contains('/') => IpRange {
            start: start.into(),
            end: end.into(),
            ..IpRange::default()
        },
        _ => IpRange {
            cidr: text.into(),
            ..IpRange::default()
        },
    }
}

fn pool(ranges: &[&str], opted_in: bool) -> ExternalIPPool {
    let mut pool = ExternalIPPool::new(
        "egress-pool",
        ExternalIPPoolSpec {
            ip_ranges: ranges.iter().map(|r| range(r)).collect(),
            subnet_info: None,
            node_selector: LabelSelector {
                match_labels: Some([("egress".to_owned(), "yes".to_owned())].into()),
                ..LabelSelector::default()
            },
        },
    );
    if opted_in {
        pool.metadata.labels = Some([(OPT_IN_LABEL.to_owned(), "true".to_owned())].into());
    }
    pool
}

fn create(pool: &ExternalIPPool, cluster: &ClusterSnapshot, platform: Option<Platform>) -> Verdict {
    review_pool(
        Operation::Create,
        "egress-pool",
        Some(pool),
        None,
        cluster,
        platform,
    )
}

fn denied(verdict: &Verdict) -> (Rule, &str) {
    let denial = verdict.denial.as_ref().expect("refused");
    (denial.rule, denial.message.as_str())
}

#[test]
fn a_pool_inside_the_selected_nodes_subnet_is_admitted_on_every_cloud() {
    for platform in Platform::ALL {
        let verdict = create(
            &pool(&["10.0.0.100-10.0.0.109"], true),
            &cluster(platform, 5),
            Some(platform),
        );
        assert_eq!(verdict, Verdict::allow(), "{platform}");
    }
}

#[test]
fn a_range_outside_a_selected_nodes_subnet_is_refused_on_every_cloud() {
    for platform in Platform::ALL {
        let verdict = create(
            &pool(&["10.0.0.100-10.0.0.101", "10.0.1.0/28"], true),
            &cluster(platform, 50),
            Some(platform),
        );
        assert_eq!(
            denied(&verdict),
            (
                Rule::AddressIndex,
                format!("address_index: ExternalIPPool egress-pool: ipRanges[1] (10.0.1.0/28) reaches 10.0.1.0, which {platform} cannot attach to node worker-a that the nodeSelector picks: it is outside the node's subnet 10.0.0.0/24, and the cloud only attaches addresses of the NIC's own subnet; keep the range inside 10.0.0.0/24, or narrow the nodeSelector to nodes of the range's subnet").as_str()
            ),
            "{platform}"
        );
    }
}

#[test]
fn a_range_reaching_an_address_the_cloud_reserves_is_refused_per_cloud() {
    // (cloud, range, the address and the reason named)
    let table = [
        (
            Platform::Aws,
            "10.0.0.3-10.0.0.9",
            "10.0.0.3",
            "reserved by AWS for future use",
        ),
        (
            Platform::Azure,
            "10.0.0.1-10.0.0.9",
            "10.0.0.1",
            "the default gateway, reserved by Azure",
        ),
        (
            Platform::Gcp,
            "10.0.0.200-10.0.0.254",
            "10.0.0.254",
            "reserved by Google Cloud",
        ),
        (
            Platform::OpenStack,
            "10.0.0.0/29",
            "10.0.0.0",
            "the network address",
        ),
    ];
    for (platform, text, ip, reason) in table {
        let verdict = create(
            &pool(&[text], true),
            &cluster(platform, 500),
            Some(platform),
        );
        let (rule, message) = denied(&verdict);
        assert_eq!(rule, Rule::AddressIndex, "{platform}: {message}");
        assert!(
            message.contains(&format!(
                "ipRanges[0] ({text}) reaches {ip}, which {platform} cannot attach"
            )),
            "{platform}: {message}"
        );
        assert!(message.contains(reason), "{platform}: {message}");
        assert!(
            message.ends_with("; leave it out of the range"),
            "{message}"
        );
    }
}

#[test]
fn ipv6_ranges_are_refused_where_the_cloud_attaches_ipv4_only() {
    for platform in Platform::ALL {
        let verdict = create(
            &pool(&["fd00:10::100-fd00:10::101"], true),
            &cluster(platform, 5),
            Some(platform),
        );
        if platform.supports_ipv6() {
            assert!(verdict.allowed(), "{platform}: {verdict:?}");
        } else {
            assert_eq!(
                denied(&verdict),
                (
                    Rule::AddressIndex,
                    "address_index: ExternalIPPool egress-pool: ipRanges[0] (fd00:10::100-fd00:10::101) is IPv6, and GCP attaches only IPv4 egress IPs (alias IP ranges are IPv4 only); use IPv4 ranges"
                )
            );
        }
    }
}

#[test]
fn a_range_holding_a_nodes_own_ip_is_refused_unless_a_cloudprivateipconfig_manages_it() {
    let mut cluster = cluster(Platform::Aws, 50);
    // worker-c is not selected, but its own IP must never be an egress IP anywhere.
    let verdict = create(
        &pool(&["10.0.0.4-10.0.0.20"], true),
        &cluster,
        Some(Platform::Aws),
    );
    assert_eq!(
        denied(&verdict),
        (
            Rule::NodeIp,
            "node_ip: ExternalIPPool egress-pool: ipRanges[0] (10.0.0.4-10.0.0.20) holds 10.0.0.10, an address of node worker-a (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must never be moved or detached; leave 10.0.0.10 out of the pool's ranges"
        )
    );
    let verdict = create(&pool(&["10.9.0.10/32"], true), &cluster, None);
    assert_eq!(
        denied(&verdict).0,
        Rule::NodeIp,
        "any node's, selected or not"
    );
    // An egress IP the cloud lists among a node's addresses (AWS does) is managed, not the node's.
    cluster.upsert_object("10.0.0.10", "worker-a", "worker-a");
    cluster.upsert_object("10.0.0.11", "worker-b", "worker-b");
    assert!(
        create(
            &pool(&["10.0.0.4-10.0.0.20"], true),
            &cluster,
            Some(Platform::Aws)
        )
        .allowed()
    );
}

#[test]
fn more_addresses_than_the_selected_nodes_hold_are_refused_naming_both_numbers() {
    // (cloud, the bucket named)
    for (platform, bucket, family) in [
        (Platform::Aws, "ipv4", "IPv4 "),
        (Platform::Azure, "ip", ""),
        (Platform::Gcp, "ip", ""),
        (Platform::OpenStack, "ip", ""),
    ] {
        let cluster = cluster(platform, 5);
        assert!(
            create(
                &pool(&["10.0.0.100-10.0.0.109"], true),
                &cluster,
                Some(platform)
            )
            .allowed(),
            "{platform}: 10 fit"
        );
        let verdict = create(
            &pool(&["10.0.0.100-10.0.0.110"], true),
            &cluster,
            Some(platform),
        );
        assert_eq!(
            denied(&verdict),
            (
                Rule::Capacity,
                format!("capacity: ExternalIPPool egress-pool holds 11 {family}addresses, but the 2 nodes its nodeSelector picks can hold 10 egress IPs between them (capacity \"{bucket}\" in annotation cloud.network.openshift.io/egress-ipconfig); shrink spec.ipRanges to at most 10 addresses, or select more nodes").as_str()
            ),
            "{platform}"
        );
    }
    // Shared capacity counts both families together; per-family counts each apart.
    let dual = pool(
        &["10.0.0.100-10.0.0.105", "fd00:10::100-fd00:10::105"],
        true,
    );
    assert_eq!(
        denied(&create(
            &dual,
            &cluster(Platform::Azure, 5),
            Some(Platform::Azure)
        ))
        .0,
        Rule::Capacity
    );
    assert!(create(&dual, &cluster(Platform::Aws, 5), Some(Platform::Aws)).allowed());
    // Without a known cloud, the annotation's keys decide, as for rule 5.
    let big = pool(&["10.0.0.100-10.0.0.110"], true);
    assert_eq!(
        denied(&create(&big, &cluster(Platform::Aws, 5), None)).0,
        Rule::Capacity
    );
    // A node without the bucket's key is unlimited.
    let mut unlimited = cluster(Platform::Aws, 5);
    let annotation = annotation("10.0.0.0/24", r#"{"ipv6":5}"#);
    node(
        &mut unlimited,
        "worker-b",
        "10.0.0.11",
        Some(&annotation),
        &[("egress", "yes")],
    );
    assert!(create(&big, &unlimited, Some(Platform::Aws)).allowed());
}

#[test]
fn what_cannot_be_verified_is_admitted_with_a_warning() {
    let mut cluster = cluster(Platform::Aws, 5);
    let mut elsewhere = pool(&["10.0.0.100-10.0.0.200"], true);
    elsewhere.spec.node_selector = LabelSelector {
        match_labels: Some([("egress".to_owned(), "later".to_owned())].into()),
        ..LabelSelector::default()
    };
    let verdict = create(&elsewhere, &cluster, Some(Platform::Aws));
    assert!(verdict.allowed());
    assert_eq!(verdict.warnings.len(), 1);
    assert!(
        verdict.warnings[0].starts_with("ExternalIPPool egress-pool: its nodeSelector picks no node yet, so the subnet and capacity checks were skipped;"),
        "{:?}",
        verdict.warnings
    );
    // An unannotated node: capacity cannot be summed, the annotated nodes' subnets still count.
    node(
        &mut cluster,
        "worker-new",
        "10.0.0.12",
        None,
        &[("egress", "yes")],
    );
    let verdict = create(
        &pool(&["10.0.0.100-10.0.0.200"], true),
        &cluster,
        Some(Platform::Aws),
    );
    assert!(verdict.allowed(), "{verdict:?}");
    assert!(
        verdict.warnings[0].starts_with("ExternalIPPool egress-pool: 1 of the 3 nodes its nodeSelector picks (worker-new) have no readable cloud.network.openshift.io/egress-ipconfig annotation yet"),
        "{:?}",
        verdict.warnings
    );
    let verdict = create(&pool(&["10.0.1.0/28"], true), &cluster, Some(Platform::Aws));
    assert_eq!(denied(&verdict).0, Rule::AddressIndex);
}

#[test]
fn pools_without_the_label_and_unchanged_updates_are_never_refused() {
    let cluster = cluster(Platform::Aws, 500);
    let outside = pool(&["10.0.1.0/24"], false);
    assert_eq!(
        create(&outside, &cluster, Some(Platform::Aws)),
        Verdict::allow()
    );
    // Removing the label (opting out) passes whatever the ranges.
    let opted_in = pool(&["10.0.1.0/24"], true);
    let update = |new: &ExternalIPPool, old: &ExternalIPPool| {
        review_pool(
            Operation::Update,
            "egress-pool",
            Some(new),
            Some(old),
            &cluster,
            Some(Platform::Aws),
        )
    };
    assert_eq!(update(&outside, &opted_in), Verdict::allow());
    // Adding the label reviews the pool in full.
    assert_eq!(denied(&update(&opted_in, &outside)).0, Rule::AddressIndex);
    // Keeping ranges and selector (labels, annotations) passes.
    assert_eq!(update(&opted_in, &opted_in), Verdict::allow());
    // An added range is checked alone; the ones admitted before are not re-judged.
    let grown = pool(&["10.0.1.0/24", "10.0.0.100-10.0.0.101"], true);
    assert!(update(&grown, &opted_in).allowed());
    let bad = pool(&["10.0.1.0/24", "10.0.2.0/28"], true);
    assert!(
        denied(&update(&bad, &opted_in))
            .1
            .contains("ipRanges[1] (10.0.2.0/28)")
    );
    assert!(
        review_pool(
            Operation::Delete,
            "egress-pool",
            None,
            Some(&opted_in),
            &cluster,
            None
        )
        .allowed()
    );
}

#[test]
fn malformed_ranges_and_selectors_are_bad_input() {
    let cluster = cluster(Platform::Aws, 5);
    let verdict = create(&pool(&["10.0.0.9-10.0.0.1"], true), &cluster, None);
    assert_eq!(
        denied(&verdict),
        (
            Rule::BadInput,
            "bad_input: ExternalIPPool egress-pool: ipRanges[0] runs from 10.0.0.9 to 10.0.0.1, which is no range; give each of spec.ipRanges a cidr, or a start and an end of one family"
        )
    );
    let mut selector = pool(&["10.0.0.100/32"], true);
    selector.spec.node_selector = serde_json::from_value(serde_json::json!({
        "matchExpressions": [{"key": "egress", "operator": "Gt", "values": ["1"]}]
    }))
    .unwrap();
    let verdict = create(&selector, &cluster, None);
    let (rule, message) = denied(&verdict);
    assert_eq!(rule, Rule::BadInput);
    assert!(
        message
            .starts_with("bad_input: ExternalIPPool egress-pool: spec.nodeSelector cannot be read"),
        "{message}"
    );
    let empty = review_pool(Operation::Create, "egress-pool", None, None, &cluster, None);
    assert_eq!(denied(&empty).0, Rule::BadInput);
}

fn egress(ip: &str, pool: &str) -> EgressSpec {
    EgressSpec {
        egress_ip: ip.into(),
        external_ip_pool: pool.into(),
        ..EgressSpec::default()
    }
}

#[test]
fn an_egress_ip_outside_its_opted_in_pool_is_refused() {
    let mut cluster = ClusterSnapshot::new();
    cluster.upsert_antrea_pool(&pool(&["10.0.0.100-10.0.0.109", "10.0.3.0/30"], true));
    let lookup = |name: &str| cluster.antrea_pool(name);
    let create =
        |spec: &EgressSpec| review_egress(Operation::Create, "web", Some(spec), None, lookup);
    assert_eq!(
        create(&egress("10.0.0.105", "egress-pool")),
        Verdict::allow()
    );
    assert_eq!(create(&egress("10.0.3.3", "egress-pool")), Verdict::allow());
    assert_eq!(
        denied(&create(&egress("10.0.0.110", "egress-pool"))),
        (
            Rule::AntreaEgressIp,
            "antrea_egress_ip: Egress web: spec.egressIP 10.0.0.110 is outside ExternalIPPool egress-pool (10.0.0.100-10.0.0.109, 10.0.3.0/30), whose IPs cloudnet attaches; pick an address in the pool's ranges, or leave the IP empty for Antrea to allocate one"
        )
    );
    // Dual stack: each IP with the pool of its index.
    let dual = EgressSpec {
        egress_ips: vec!["10.0.0.101".into(), "10.0.0.120".into()],
        external_ip_pools: vec!["egress-pool".into(), "egress-pool".into()],
        ..EgressSpec::default()
    };
    assert!(
        denied(&create(&dual))
            .1
            .contains("spec.egressIPs[1] 10.0.0.120 is outside")
    );
    // A pool that is not opted in (not in the index), no pool, or no IP yet: Antrea's business.
    assert!(create(&egress("192.0.2.1", "other-pool")).allowed());
    assert!(create(&egress("192.0.2.1", "")).allowed());
    assert!(create(&egress("", "egress-pool")).allowed());
    // An update that keeps the IPs passes; one that changes them is checked.
    let bad = egress("10.0.0.110", "egress-pool");
    assert!(review_egress(Operation::Update, "web", Some(&bad), Some(&bad), lookup).allowed());
    let good = egress("10.0.0.101", "egress-pool");
    assert_eq!(
        denied(&review_egress(
            Operation::Update,
            "web",
            Some(&bad),
            Some(&good),
            lookup
        ))
        .0,
        Rule::AntreaEgressIp
    );
    assert!(review_egress(Operation::Delete, "web", None, Some(&bad), lookup).allowed());
}

#[test]
fn node_labels_are_forgotten_with_the_node() {
    let mut cluster = cluster(Platform::Aws, 5);
    cluster.remove_node("worker-a");
    node(&mut cluster, "worker-a", "10.0.0.10", None, &[]);
    let labels: BTreeMap<_, _> = cluster
        .nodes_with_labels()
        .filter(|(node, _)| node.name == "worker-a")
        .map(|(_, labels)| labels.clone())
        .next()
        .unwrap();
    assert!(labels.is_empty());
}
