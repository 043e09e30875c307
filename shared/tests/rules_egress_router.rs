//! The EgressRouter rules, one table row per check, each with its exact message; the
//! cross-object rule against nodes, CloudPrivateIPConfigs and other routers.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use cloudnet_shared::egress::{EgressRouterSpec, RouterRef};
use cloudnet_shared::node::{EgressState, NodeInfo};
use cloudnet_shared::rules::{
    ClusterSnapshot, Operation, Rule, check_egress_router, review_egress_router,
};
use serde_json::{Value, json};

fn valid() -> Value {
    json!({
        "mode": "Redirect",
        "networkInterface": {"macvlan": {"mode": "Bridge", "master": "eth1"}},
        "addresses": [{"ip": "192.168.3.10/24", "gateway": "192.168.3.1"}],
        "redirect": {
            "redirectRules": [
                {"destinationIP": "10.100.3.3", "port": 80, "protocol": "UDP"},
                {"destinationIP": "203.0.113.26", "port": 8080, "protocol": "TCP", "targetPort": 80},
                {"destinationIP": "fd00::26", "port": 8080, "protocol": "SCTP"}
            ],
            "fallbackIP": "203.0.113.27"
        }
    })
}

/// `valid()` with the value at `pointer` replaced (or removed when `value` is null).
fn with(pointer: &str, value: Value) -> EgressRouterSpec {
    let mut spec = valid();
    if value.is_null() {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        spec.pointer_mut(parent)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove(key);
    } else {
        *spec.pointer_mut(pointer).unwrap() = value;
    }
    serde_json::from_value(spec).unwrap()
}

fn router() -> RouterRef {
    RouterRef::egress_router("egress", "r1")
}

#[test]
fn a_valid_egress_router_passes_and_yields_its_addresses() {
    let spec: EgressRouterSpec = serde_json::from_value(valid()).unwrap();
    assert_eq!(
        check_egress_router(&router(), &spec),
        Ok(vec!["192.168.3.10".parse().unwrap()])
    );
}

#[test]
fn defaults_stand_in_for_absent_mode_interface_and_gateway() {
    let spec: EgressRouterSpec = serde_json::from_value(json!({
        "addresses": [{"ip": "fd00:1::10/64"}],
        "redirect": {"fallbackIP": "fd00:2::1"}
    }))
    .unwrap();
    assert!(check_egress_router(&router(), &spec).is_ok());
}

#[test]
fn every_spec_rule_refuses_with_its_message() {
    let p = "egress_router";
    let cases: Vec<(EgressRouterSpec, Rule, String)> = vec![
        (
            with("/mode", json!("Forward")),
            Rule::EgressRouterMode,
            format!(
                "{p}_mode: EgressRouter egress/r1: spec.mode is \"Forward\", but Redirect is the only mode; set spec.mode to Redirect (or leave it out)"
            ),
        ),
        (
            with("/networkInterface/macvlan/mode", json!("bridge")),
            Rule::EgressRouterInterface,
            format!(
                "{p}_interface: EgressRouter egress/r1: spec.networkInterface.macvlan.mode is \"bridge\", which is not one of Bridge, Private, VEPA, Passthru; use one of them (Bridge is the default)"
            ),
        ),
        (
            with(
                "/networkInterface/macvlan/master",
                json!("a-very-long-interface"),
            ),
            Rule::EgressRouterInterface,
            format!(
                "{p}_interface: EgressRouter egress/r1: spec.networkInterface.macvlan.master \"a-very-long-interface\" is no Linux interface name (1-15 characters, no '/', ':' or whitespace); name the node's interface, or leave master out to infer it from the address"
            ),
        ),
        (
            with("/addresses", json!([])),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses lists no address; add at least one {{ip: <address>/<prefix length>, gateway: <next hop>}}"
            ),
        ),
        (
            with("/addresses", Value::Null),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses lists no address; add at least one {{ip: <address>/<prefix length>, gateway: <next hop>}}"
            ),
        ),
        (
            with("/addresses/0/ip", json!("")),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[0] has no ip; set ip to the router's address in CIDR form, e.g. \"192.168.3.10/24\""
            ),
        ),
        (
            with("/addresses/0/ip", json!("192.168.3.10")),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[0].ip \"192.168.3.10\" has no prefix length; write it in CIDR form with its network's prefix length, e.g. \"192.168.3.10/24\""
            ),
        ),
        (
            with("/addresses/0/ip", json!("192.168.3.10/33")),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[0].ip \"192.168.3.10/33\" is no address in CIDR form; write it as <address>/<prefix length>, e.g. \"192.168.3.10/24\""
            ),
        ),
        (
            with("/addresses/0/ip", json!("224.0.0.5/24")),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[0].ip \"224.0.0.5/24\" is a multicast address, which cannot be a router's address; use a unicast address of the router's network"
            ),
        ),
        (
            with("/addresses/0/gateway", json!("192.168.4.1")),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[0].gateway 192.168.4.1 is outside 192.168.3.0/24 (spec.addresses[0].ip 192.168.3.10/24); use a gateway inside the address's network, or correct the address's prefix length"
            ),
        ),
        (
            with("/addresses/0/gateway", json!("192.168.3.10")),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[0].gateway 192.168.3.10 is the router's own address (spec.addresses[0].ip); set the next hop's IP, another address of that network"
            ),
        ),
        (
            with("/addresses/0/gateway", json!("gw")),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[0].gateway \"gw\" is no IP address; set the next hop's IP, or leave spec.addresses[0].gateway out to have it inferred"
            ),
        ),
        (
            with("/addresses/0/gateway", json!("fd00::1")),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[0].gateway fd00::1 is outside 192.168.3.0/24 (spec.addresses[0].ip 192.168.3.10/24); use a gateway inside the address's network, or correct the address's prefix length"
            ),
        ),
        (
            with(
                "/addresses",
                json!([{"ip": "192.168.3.10/24"}, {"ip": "192.168.3.10/25"}]),
            ),
            Rule::EgressRouterAddress,
            format!(
                "{p}_address: EgressRouter egress/r1: spec.addresses[1].ip 192.168.3.10 repeats spec.addresses[0]; list each address once"
            ),
        ),
        (
            with("/redirect", Value::Null),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect is missing, and Redirect mode needs it; add spec.redirect with redirectRules or a fallbackIP"
            ),
        ),
        (
            with("/redirect", json!({"redirectRules": []})),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect has neither redirectRules nor a fallbackIP, so the router would forward nothing; add a redirect rule or set fallbackIP"
            ),
        ),
        (
            with(
                "/redirect/redirectRules/0/destinationIP",
                json!("10.100.3.0/30"),
            ),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[0].destinationIP \"10.100.3.0/30\" is no IP address; set the remote destination's IP (IPv4 or IPv6, no prefix length)"
            ),
        ),
        (
            with("/redirect/redirectRules/0/protocol", json!("ICMP")),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[0].protocol \"ICMP\" is not TCP, UDP or SCTP; use one of them, in capitals"
            ),
        ),
        (
            with("/redirect/redirectRules/0/port", json!(0)),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[0].port 0 is not a port number (1-65535); set the port clients send to"
            ),
        ),
        (
            with("/redirect/redirectRules/0/port", json!(65536)),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[0].port 65536 is not a port number (1-65535); set the port clients send to"
            ),
        ),
        (
            with("/redirect/redirectRules/1/targetPort", json!(70000)),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[1].targetPort 70000 is not a port number (1-65535); set the destination's port, or leave targetPort out to keep 8080"
            ),
        ),
        (
            with("/redirect/redirectRules/2/protocol", json!("TCP")),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[2] redirects TCP port 8080 again (redirectRules[1] already does); keep one rule per port and protocol"
            ),
        ),
        (
            with("/redirect/fallbackIP", json!("example.com")),
            Rule::EgressRouterRedirect,
            format!(
                "{p}_redirect: EgressRouter egress/r1: spec.redirect.fallbackIP \"example.com\" is no IP address; set the IP that traffic no rule matches goes to, or leave fallbackIP out"
            ),
        ),
    ];
    for (spec, rule, message) in cases {
        let denial = check_egress_router(&router(), &spec).unwrap_err();
        assert_eq!(denial.rule, rule, "{message}");
        assert_eq!(denial.message, message);
    }
}

#[test]
fn a_target_port_of_zero_means_unset() {
    assert!(
        check_egress_router(
            &router(),
            &with("/redirect/redirectRules/1/targetPort", json!(0))
        )
        .is_ok()
    );
}

fn cluster() -> ClusterSnapshot {
    let mut cluster = ClusterSnapshot::new();
    cluster.upsert_node(NodeInfo {
        name: "worker-a".into(),
        addresses: vec![
            "192.168.3.5".parse().unwrap(),
            "192.168.3.7".parse().unwrap(),
        ],
        egress: EgressState::Missing,
    });
    cluster.upsert_object("192.168.3.20", "worker-a", "worker-a");
    // Listed by the node but managed by a CloudPrivateIPConfig deleted lately: not the node's own.
    cluster.remember_deleted("192.168.3.7");
    cluster.routers_mut().upsert(
        RouterRef::egress_router("other", "r2"),
        RouterRef::egress_router("other", "r2"),
        vec!["192.168.3.30".parse().unwrap()],
    );
    // The network operator's NetworkAttachmentDefinition for r1 lists r1's address too.
    cluster.routers_mut().upsert(
        RouterRef::nad("egress", "r1"),
        router(),
        vec!["192.168.3.40".parse().unwrap()],
    );
    cluster
}

fn address(ip: &str) -> EgressRouterSpec {
    with("/addresses", json!([{"ip": ip, "gateway": "192.168.3.1"}]))
}

#[test]
fn addresses_taken_by_a_node_an_egress_ip_or_another_router_are_refused() {
    let cluster = cluster();
    let cases = [
        (
            "192.168.3.5/24",
            "egress_router_conflict: EgressRouter egress/r1 uses 192.168.3.5, which is an address of node worker-a (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must not be taken by a router; pick an unused address of the router's network",
        ),
        (
            "192.168.3.20/24",
            "egress_router_conflict: EgressRouter egress/r1 uses 192.168.3.20, which is the egress IP of CloudPrivateIPConfig 192.168.3.20 that the cloud attaches to a node; pick an address no CloudPrivateIPConfig uses",
        ),
        (
            "192.168.3.30/24",
            "egress_router_conflict: EgressRouter egress/r1 uses 192.168.3.30, which EgressRouter other/r2 already uses; give each egress router its own address",
        ),
    ];
    for (ip, message) in cases {
        let verdict = review_egress_router(
            Operation::Create,
            &router(),
            Some(&address(ip)),
            None,
            &cluster,
        );
        let denial = verdict.denial.unwrap();
        assert_eq!(denial.rule, Rule::EgressRouterConflict);
        assert_eq!(denial.message, message);
    }
}

#[test]
fn own_nad_addresses_managed_node_ips_and_unchanged_addresses_pass() {
    let cluster = cluster();
    for ip in ["192.168.3.40/24", "192.168.3.7/24", "192.168.3.50/24"] {
        let verdict = review_egress_router(
            Operation::Create,
            &router(),
            Some(&address(ip)),
            None,
            &cluster,
        );
        assert!(verdict.allowed(), "{ip}: {verdict:?}");
    }
    // An update keeping an address that a node started listing meanwhile is not stuck.
    let old = address("192.168.3.5/24");
    let new = with(
        "/addresses",
        json!([{"ip": "192.168.3.5/24", "gateway": "192.168.3.1"}, {"ip": "192.168.3.60/24"}]),
    );
    assert!(
        review_egress_router(
            Operation::Update,
            &router(),
            Some(&new),
            Some(&old),
            &cluster
        )
        .allowed()
    );
    // A metadata-only update passes even when the spec breaks today's rules.
    let broken = with("/mode", json!("Forward"));
    assert!(
        review_egress_router(
            Operation::Update,
            &router(),
            Some(&broken),
            Some(&broken),
            &cluster
        )
        .allowed()
    );
    assert!(
        review_egress_router(Operation::Delete, &router(), None, Some(&broken), &cluster).allowed()
    );
}

#[test]
fn a_request_without_an_object_is_bad_input() {
    let verdict = review_egress_router(
        Operation::Create,
        &router(),
        None,
        None,
        &ClusterSnapshot::new(),
    );
    assert_eq!(
        verdict.denial.unwrap().message,
        "bad_input: the CREATE request for EgressRouter egress/r1 carries no object to review; send the EgressRouter in request.object"
    );
}

#[test]
fn the_router_index_forgets_replaced_and_removed_addresses() {
    let mut cluster = cluster();
    let r2 = RouterRef::egress_router("other", "r2");
    cluster.routers_mut().upsert(
        r2.clone(),
        r2.clone(),
        vec!["192.168.3.31".parse().unwrap()],
    );
    let verdict = review_egress_router(
        Operation::Create,
        &router(),
        Some(&address("192.168.3.30/24")),
        None,
        &cluster,
    );
    assert!(verdict.allowed(), "{verdict:?}");
    assert_eq!(
        cluster
            .routers()
            .other_owner("192.168.3.31".parse().unwrap(), &router()),
        Some(&r2)
    );
    cluster.routers_mut().remove(&r2);
    assert_eq!(
        cluster
            .routers()
            .other_owner("192.168.3.31".parse().unwrap(), &router()),
        None
    );
    assert_eq!(cluster.routers().len(), 1);
}
