//! The admission rules of EgressGateways (`rules::gateway`): each egress IP's spelling, its
//! family, the nodes' own IPs, the subnets of the nodes the nodeSelector picks, and the claims of
//! other gateways, opted-in Antrea pools and CloudPrivateIPConfigs; updates judge only what they
//! add; and the reverse rule on CloudPrivateIPConfig creates.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use cloudnet_shared::antrea::{ExternalIPPool, ExternalIPPoolSpec, IpRange};
use cloudnet_shared::gateway::{EgressGatewaySpec, FRONT_END};
use cloudnet_shared::node::NodeInfo;
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::gateway::{gateway_of_object, gateway_source};
use cloudnet_shared::rules::{
    ClusterSnapshot, Operation, Rule, Verdict, check_object_claim, review_gateway,
};
use k8s_openapi::api::core::v1::NodeAddress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A node with its own `address`, an optional annotation, and `labels`.
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

fn annotation(ipv4: &str) -> String {
    format!(
        r#"[{{"interface":"nic0","ifaddr":{{"ipv4":"{ipv4}","ipv6":"fd00:10::/64"}},"capacity":{{"ipv4":10,"ipv6":10,"ip":10}}}}]"#
    )
}

/// Two gateway nodes (label `gateway=yes`) in 10.0.0.0/24, and an unlabelled node in another
/// subnet that no gateway below selects.
fn cluster() -> ClusterSnapshot {
    let mut cluster = ClusterSnapshot::new();
    let subnet = annotation("10.0.0.0/24");
    for (name, address) in [("worker-a", "10.0.0.10"), ("worker-b", "10.0.0.11")] {
        node(
            &mut cluster,
            name,
            address,
            Some(&subnet),
            &[("gateway", "yes")],
        );
    }
    node(
        &mut cluster,
        "worker-c",
        "10.9.0.10",
        Some(&annotation("10.9.0.0/24")),
        &[],
    );
    cluster
}

fn selector(value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([("gateway".to_owned(), value.to_owned())].into()),
        ..LabelSelector::default()
    }
}

fn gateway(ips: &[&str]) -> EgressGatewaySpec {
    EgressGatewaySpec {
        node_selector: selector("yes"),
        egress_ips: ips.iter().map(|ip| (*ip).to_owned()).collect(),
    }
}

fn create(
    spec: &EgressGatewaySpec,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Verdict {
    review_gateway(
        Operation::Create,
        "web",
        Some(spec),
        None,
        cluster,
        platform,
    )
}

fn update(new: &EgressGatewaySpec, old: &EgressGatewaySpec, cluster: &ClusterSnapshot) -> Verdict {
    review_gateway(
        Operation::Update,
        "web",
        Some(new),
        Some(old),
        cluster,
        Some(Platform::Aws),
    )
}

fn denied(verdict: &Verdict) -> (Rule, &str) {
    let denial = verdict.denial.as_ref().expect("refused");
    (denial.rule, denial.message.as_str())
}

#[test]
fn a_gateway_inside_the_picked_nodes_subnet_is_admitted_on_every_cloud() {
    for platform in Platform::ALL {
        let verdict = create(
            &gateway(&["10.0.0.100", "10.0.0.101"]),
            &cluster(),
            Some(platform),
        );
        assert_eq!(verdict, Verdict::allow(), "{platform}");
    }
    // An IPv6 address of the nodes' IPv6 subnet, where the cloud attaches IPv6.
    assert_eq!(
        create(&gateway(&["fd00:10::100"]), &cluster(), Some(Platform::Aws)),
        Verdict::allow()
    );
}

#[test]
fn egress_ips_that_are_not_canonical_usable_or_unique_are_refused_naming_the_spelling_to_use() {
    // (the IP as written, the end of the message)
    let table = [
        (
            "10.0.0.05",
            r#"egressIPs[1] "10.0.0.05" is not an IP address in canonical form: use "10.0.0.5""#,
        ),
        (
            "FD00:10::100",
            r#"egressIPs[1] "FD00:10::100" is not canonical: use "fd00:10::100""#,
        ),
        (
            "fd00:10:0:0:0:0:0:100",
            r#"egressIPs[1] "fd00:10:0:0:0:0:0:100" is not canonical: use "fd00:10::100""#,
        ),
        (
            "fd00.0010.0000.0000.0000.0000.0000.0100",
            r#"egressIPs[1] "fd00.0010.0000.0000.0000.0000.0000.0100" is not an IP address in canonical form: use "fd00:10::100""#,
        ),
        (
            "web.example.com",
            r#"egressIPs[1] "web.example.com" is not an IP address in canonical form: write an IPv4 address such as "10.0.0.5" or an IPv6 address such as "fc00::54""#,
        ),
        (
            "::ffff:10.0.0.100",
            r#"egressIPs[1] ::ffff:10.0.0.100 is an IPv4-mapped IPv6 address, a second spelling of an IPv4 address: use "10.0.0.100""#,
        ),
        (
            "127.0.0.1",
            "egressIPs[1] 127.0.0.1 is a loopback address, which cannot be an egress IP: use a unicast address of the nodes' subnet",
        ),
        (
            "10.0.0.100",
            "egressIPs[1] repeats egressIPs[0] (10.0.0.100); list each egress IP once",
        ),
    ];
    for (written, tail) in table {
        let verdict = create(
            &gateway(&["10.0.0.100", written]),
            &cluster(),
            Some(Platform::Aws),
        );
        assert_eq!(
            denied(&verdict),
            (
                Rule::GatewayIp,
                format!("egress_gateway_ip: EgressGateway web: {tail}").as_str()
            ),
            "{written}"
        );
    }
}

#[test]
fn ipv6_is_refused_where_the_cloud_attaches_ipv4_only() {
    for platform in Platform::ALL {
        let verdict = create(&gateway(&["fd00:10::100"]), &cluster(), Some(platform));
        if platform.supports_ipv6() {
            assert!(verdict.allowed(), "{platform}: {verdict:?}");
        } else {
            assert_eq!(
                denied(&verdict),
                (
                    Rule::AddressIndex,
                    "address_index: EgressGateway web: egressIPs[0] fd00:10::100 is IPv6, and GCP attaches only IPv4 egress IPs (alias IP ranges are IPv4 only); use IPv4 addresses"
                )
            );
        }
    }
}

#[test]
fn a_nodes_own_ip_is_refused_on_any_node_unless_a_cloudprivateipconfig_manages_it() {
    let mut cluster = cluster();
    assert_eq!(
        denied(&create(
            &gateway(&["10.0.0.100", "10.0.0.11"]),
            &cluster,
            Some(Platform::Aws)
        )),
        (
            Rule::NodeIp,
            "node_ip: EgressGateway web: egressIPs[1] 10.0.0.11 is an address of node worker-b (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must never be moved or detached; pick an unused address of the nodes' subnet"
        )
    );
    // worker-c is not picked, but its own IP must never be an egress IP anywhere.
    assert_eq!(
        denied(&create(&gateway(&["10.9.0.10"]), &cluster, None)).0,
        Rule::NodeIp
    );
    // An egress IP the cloud lists among a node's addresses (AWS does) is managed, not the
    // node's: the one the reconciler keeps for this gateway passes.
    cluster.upsert_object("10.0.0.11", "worker-b", "worker-b");
    cluster.set_object_gateway("10.0.0.11", Some("web"));
    assert!(create(&gateway(&["10.0.0.11"]), &cluster, Some(Platform::Aws)).allowed());
}

#[test]
fn an_ip_outside_a_picked_nodes_subnet_or_on_a_reserved_index_is_refused_per_cloud() {
    for platform in Platform::ALL {
        let verdict = create(
            &gateway(&["10.0.0.100", "10.0.1.5"]),
            &cluster(),
            Some(platform),
        );
        assert_eq!(
            denied(&verdict),
            (
                Rule::AddressIndex,
                format!("address_index: EgressGateway web: egressIPs[1] 10.0.1.5 cannot be attached by {platform} to node worker-a that the nodeSelector picks: it is outside the node's subnet 10.0.0.0/24, and the cloud only attaches addresses of the NIC's own subnet; pick an address in 10.0.0.0/24, or narrow the nodeSelector to nodes of the subnet of 10.0.1.5").as_str()
            ),
            "{platform}"
        );
    }
    // (cloud, an address it reserves, the reason named)
    let table = [
        (Platform::Aws, "10.0.0.3", "reserved by AWS for future use"),
        (
            Platform::Azure,
            "10.0.0.1",
            "the default gateway, reserved by Azure",
        ),
        (Platform::Gcp, "10.0.0.254", "reserved by Google Cloud"),
        (Platform::OpenStack, "10.0.0.255", "broadcast"),
    ];
    for (platform, ip, reason) in table {
        let verdict = create(&gateway(&[ip]), &cluster(), Some(platform));
        let (rule, message) = denied(&verdict);
        assert_eq!(rule, Rule::AddressIndex, "{platform}: {message}");
        assert!(
            message.starts_with(&format!(
                "address_index: EgressGateway web: egressIPs[0] {ip} cannot be attached by {platform} to node worker-a"
            )),
            "{message}"
        );
        assert!(message.contains(reason), "{platform}: {message}");
        assert!(
            message.ends_with("; pick another address in 10.0.0.0/24"),
            "{message}"
        );
    }
    // A node without the IP's family: the nodes picked here have no IPv6 subnet.
    let mut ipv4_only = ClusterSnapshot::new();
    node(
        &mut ipv4_only,
        "worker-a",
        "10.0.0.10",
        Some(r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ip":10}}]"#),
        &[("gateway", "yes")],
    );
    let verdict = create(
        &gateway(&["fd00:10::100"]),
        &ipv4_only,
        Some(Platform::Azure),
    );
    assert!(
        denied(&verdict).1.contains("the node has no IPv6 subnet"),
        "{verdict:?}"
    );
    // Without a known cloud the subnet is not checked.
    assert!(create(&gateway(&["10.0.1.5"]), &cluster(), None).allowed());
}

#[test]
fn an_empty_selector_picks_every_node() {
    let mut everywhere = gateway(&["10.0.0.100"]);
    everywhere.node_selector = LabelSelector::default();
    let verdict = create(&everywhere, &cluster(), Some(Platform::Aws));
    assert!(
        denied(&verdict)
            .1
            .contains("to node worker-c that the nodeSelector picks: it is outside the node's subnet 10.9.0.0/24"),
        "{verdict:?}"
    );
}

#[test]
fn what_cannot_be_verified_is_admitted_with_a_warning() {
    let mut cluster = cluster();
    let mut later = gateway(&["10.0.5.100"]);
    later.node_selector = selector("later");
    let verdict = create(&later, &cluster, Some(Platform::Aws));
    assert!(verdict.allowed(), "{verdict:?}");
    assert_eq!(verdict.warnings.len(), 1);
    assert!(
        verdict.warnings[0].starts_with(
            "EgressGateway web: its nodeSelector picks no node yet, so the subnet checks were skipped;"
        ),
        "{:?}",
        verdict.warnings
    );
    // An unannotated node is skipped with a warning; the annotated ones still decide.
    node(
        &mut cluster,
        "worker-new",
        "10.0.0.12",
        None,
        &[("gateway", "yes")],
    );
    let verdict = create(&gateway(&["10.0.0.100"]), &cluster, Some(Platform::Aws));
    assert!(verdict.allowed(), "{verdict:?}");
    assert!(
        verdict.warnings[0].starts_with("EgressGateway web: 1 of the 3 nodes its nodeSelector picks (worker-new) have no readable cloud.network.openshift.io/egress-ipconfig annotation yet"),
        "{:?}",
        verdict.warnings
    );
    assert_eq!(
        denied(&create(
            &gateway(&["10.0.1.5"]),
            &cluster,
            Some(Platform::Aws)
        ))
        .0,
        Rule::AddressIndex
    );
}

#[test]
fn an_ip_another_gateway_a_pool_or_another_owners_object_holds_is_refused() {
    let mut cluster = cluster();
    cluster
        .gateways_mut()
        .upsert("db", ["10.0.0.120", "10.0.0.121"]);
    let mut pool = ExternalIPPool::new(
        "egress-pool",
        ExternalIPPoolSpec {
            ip_ranges: vec![IpRange {
                cidr: "10.0.0.128/28".into(),
                ..IpRange::default()
            }],
            ..ExternalIPPoolSpec::default()
        },
    );
    pool.metadata.name = Some("egress-pool".into());
    cluster.upsert_antrea_pool(&pool);
    // Another owner's object (a plugin's, an admin's), one of another gateway's, one parked.
    cluster.upsert_object("10.0.0.150", "worker-a", "worker-a");
    cluster.upsert_object("10.0.0.151", "worker-b", "");
    cluster.set_object_gateway("10.0.0.151", Some("db"));
    cluster.upsert_object("10.0.0.152", "", "");
    let table = [
        (
            "10.0.0.121",
            "egressIPs[0] 10.0.0.121 is an egress IP of EgressGateway db already, and an egress IP has one gateway; pick another address, or remove 10.0.0.121 from db first",
        ),
        (
            "10.0.0.130",
            "egressIPs[0] 10.0.0.130 lies in Antrea ExternalIPPool egress-pool, whose IPs cloudnet attaches for Antrea's Egresses; pick an address outside the pool's ranges, or take it out of the pool first",
        ),
        (
            "10.0.0.150",
            "egressIPs[0] 10.0.0.150 is held by CloudPrivateIPConfig 10.0.0.150, on node worker-a, which is not this gateway's (a network plugin's, an admin's or another front end's); pick another address, or delete that CloudPrivateIPConfig first",
        ),
        (
            "10.0.0.151",
            "egressIPs[0] 10.0.0.151 is held by CloudPrivateIPConfig 10.0.0.151, on node worker-b, which is not this gateway's",
        ),
        (
            "10.0.0.152",
            "egressIPs[0] 10.0.0.152 is held by CloudPrivateIPConfig 10.0.0.152 which is not this gateway's",
        ),
    ];
    for (ip, detail) in table {
        let verdict = create(&gateway(&[ip]), &cluster, Some(Platform::Aws));
        let (rule, message) = denied(&verdict);
        assert_eq!(rule, Rule::GatewayConflict, "{ip}: {message}");
        assert!(
            message.starts_with(&format!(
                "egress_gateway_conflict: EgressGateway web: {detail}"
            )),
            "{ip}: {message}"
        );
    }
    // This gateway's own object and its own earlier claim are no clash (a re-created gateway).
    cluster.upsert_object("10.0.0.160", "worker-a", "worker-a");
    cluster.set_object_gateway("10.0.0.160", Some("web"));
    cluster.gateways_mut().upsert("web", ["10.0.0.160"]);
    assert!(create(&gateway(&["10.0.0.160"]), &cluster, Some(Platform::Aws)).allowed());
}

#[test]
fn an_update_judges_only_what_it_adds_unless_the_selector_changes() {
    let mut cluster = cluster();
    let admitted = gateway(&["10.0.0.100"]);
    // Since admitted, its IP became listed by a node and held by another's object.
    cluster.upsert_object("10.0.0.100", "worker-c", "");
    cluster.gateways_mut().upsert("db", ["10.0.0.100"]);
    // Labels and annotations (the spec unchanged) pass; so does adding a good IP.
    assert_eq!(update(&admitted, &admitted, &cluster), Verdict::allow());
    let grown = gateway(&["10.0.0.100", "10.0.0.101"]);
    assert!(update(&grown, &admitted, &cluster).allowed());
    // An added IP is judged in full.
    let clash = gateway(&["10.0.0.100", "10.0.0.11"]);
    assert_eq!(denied(&update(&clash, &admitted, &cluster)).0, Rule::NodeIp);
    // A new selector places every IP on the nodes it picks.
    let mut moved = admitted.clone();
    moved.node_selector = LabelSelector::default();
    assert!(
        denied(&update(&moved, &admitted, &cluster))
            .1
            .contains("egressIPs[0] 10.0.0.100 cannot be attached by AWS to node worker-c"),
    );
    // Spelling is judged every time: it does not depend on the cluster.
    let spelled = gateway(&["10.0.0.100", "10.0.0.100"]);
    assert_eq!(
        denied(&update(&spelled, &admitted, &cluster)).0,
        Rule::GatewayIp
    );
    // Deletes always pass; a create or update without an object is bad input.
    assert!(
        review_gateway(
            Operation::Delete,
            "web",
            None,
            Some(&admitted),
            &cluster,
            None
        )
        .allowed()
    );
    let empty = review_gateway(Operation::Create, "web", None, None, &cluster, None);
    assert_eq!(denied(&empty).0, Rule::BadInput);
}

#[test]
fn a_selector_that_is_no_label_selector_is_bad_input() {
    let mut bad = gateway(&["10.0.0.100"]);
    bad.node_selector = serde_json::from_value(serde_json::json!({
        "matchExpressions": [{"key": "gateway", "operator": "Gt", "values": ["1"]}]
    }))
    .unwrap();
    let verdict = create(&bad, &cluster(), Some(Platform::Aws));
    let (rule, message) = denied(&verdict);
    assert_eq!(rule, Rule::BadInput);
    assert!(
        message.starts_with("bad_input: EgressGateway web: spec.nodeSelector cannot be read"),
        "{message}"
    );
}

#[test]
fn a_cloudprivateipconfig_for_a_gateways_ip_needs_the_gateway_front_ends_label() {
    let mut cluster = cluster();
    cluster
        .gateways_mut()
        .upsert("web", ["10.0.0.100", "fd00:10::100"]);
    let create = |name: &str, front_end: Option<&str>| {
        check_object_claim(Operation::Create, name, front_end, &cluster)
    };
    let denial = create("10.0.0.100", None).unwrap_err();
    assert_eq!(denial.rule, Rule::GatewayConflict);
    assert_eq!(
        denial.message,
        "egress_gateway_conflict: cannot create CloudPrivateIPConfig 10.0.0.100: 10.0.0.100 is an egress IP of EgressGateway web, whose CloudPrivateIPConfigs cloudnet's reconciler creates (label cloudnet.io/front-end=egress-gateway); pick another address, or remove 10.0.0.100 from EgressGateway web first"
    );
    assert_eq!(
        create("fd00.0010.0000.0000.0000.0000.0000.0100", Some("antrea"))
            .unwrap_err()
            .rule,
        Rule::GatewayConflict
    );
    assert_eq!(create("10.0.0.100", Some(FRONT_END)), Ok(()));
    assert_eq!(create("10.0.0.101", None), Ok(()));
    // Updates and deletes of an existing object are never held back by a gateway.
    for operation in [Operation::Update, Operation::Delete] {
        assert_eq!(
            check_object_claim(operation, "10.0.0.100", None, &cluster),
            Ok(())
        );
    }
}

#[test]
fn a_gateways_object_is_told_by_its_label_and_source_together() {
    let source = gateway_source("web");
    assert_eq!(source, "EgressGateway/web");
    assert_eq!(
        gateway_of_object(Some(FRONT_END), Some(&source)),
        Some("web")
    );
    assert_eq!(gateway_of_object(Some("antrea"), Some(&source)), None);
    assert_eq!(gateway_of_object(Some(FRONT_END), Some("Egress/web")), None);
    assert_eq!(
        gateway_of_object(Some(FRONT_END), Some("EgressGateway/")),
        None
    );
    assert_eq!(gateway_of_object(None, Some(&source)), None);
}
