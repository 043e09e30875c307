//! The egress-router CNI configuration rules, one table row per check with its exact message;
//! unrelated configurations untouched; the cross-object rule through `review_nad`.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use cloudnet_shared::egress::RouterRef;
use cloudnet_shared::node::{EgressState, NodeInfo};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::egress_router_cni::{config_addresses, router_owner};
use cloudnet_shared::rules::{ClusterSnapshot, Operation, Rule, check_cni_config, review_nad};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

fn nad() -> RouterRef {
    RouterRef::nad("egress", "n1")
}

fn config(body: Value) -> String {
    let mut config =
        json!({"cniVersion": "0.4.0", "name": "egress-router-1", "type": "egress-router"});
    config
        .as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    config.to_string()
}

fn ip_block() -> Value {
    json!({"addresses": ["192.168.3.10/24"], "gateway": "192.168.3.1", "destinations": ["10.1.2.0/24"]})
}

#[test]
fn the_readme_examples_and_the_operators_rendering_pass() {
    let configs = [
        config(json!({"ip": {"addresses": ["192.168.1.99/24"]}})),
        config(json!({
            "interfaceType": "ipvlan",
            "interfaceArgs": {"master": "eth1"},
            "podIP": {
                "db-router": {"addresses": ["192.168.3.10/24"], "gateway": "192.168.3.1", "destinations": ["10.1.2.3/32"]},
                "metrics-router": {"addresses": ["192.168.3.11/24"], "gateway": "192.168.3.1"},
                "alpha-*": {"addresses": ["192.168.3.12/24"], "gateway": "192.168.3.1"}
            }
        })),
        // What the network operator writes for an EgressRouter.
        config(json!({"ip": {
            "addresses": ["192.168.3.10/24"],
            "destinations": ["80 UDP 10.100.3.0", "8080 SCTP 203.0.113.26 80", "8443 TCP 203.0.113.27/30 443", "203.0.113.28"],
            "gateway": "192.168.3.1"
        }, "log_file": "/tmp/egress-router-log", "log_level": "debug"})),
        config(
            json!({"ipConfig": {"name": "router-ips", "namespace": "egress",
            "overrides": {"addresses": ["192.168.3.10/24", "192.168.3.11/24"], "gateway": "192.168.3.1"}}}),
        ),
        config(
            json!({"interfaceType": "macvlan", "interfaceArgs": {"mode": "vepa", "master": "ens3", "mtu": "1400"}, "ip": ip_block()}),
        ),
    ];
    for config in configs {
        let checked = check_cni_config(&nad(), &config, Some(Platform::Aws))
            .unwrap()
            .unwrap();
        assert!(!checked.addresses.is_empty(), "{config}");
        assert!(checked.warnings.is_empty(), "{config}");
    }
}

#[test]
fn other_plugins_and_unreadable_json_are_not_egress_router_configs() {
    for config in [
        r#"{"cniVersion":"0.3.1","type":"macvlan","master":"eth0","ipam":{"type":"dhcp"}}"#,
        r#"{"name":"egress-router","type":"bridge"}"#,
        r#"{"plugins":[{"type":"bridge","name":"egress-router"},{"type":"tuning"}]}"#,
        "not json at all, mentions egress-router",
        r#"["egress-router"]"#,
        "",
    ] {
        assert_eq!(check_cni_config(&nad(), config, None), None, "{config}");
        assert!(
            review_nad(
                Operation::Create,
                &nad(),
                &nad(),
                Some(config),
                None,
                &ClusterSnapshot::new(),
                None
            )
            .allowed()
        );
    }
}

#[test]
fn a_conflist_entry_of_type_egress_router_is_checked() {
    let conflist = json!({"cniVersion": "0.4.0", "name": "net", "plugins": [
        {"type": "tuning"},
        {"type": "egress-router", "ip": {"addresses": ["192.168.3.10"]}}
    ]})
    .to_string();
    let denial = check_cni_config(&nad(), &conflist, None)
        .unwrap()
        .unwrap_err();
    assert_eq!(
        denial.message,
        "egress_router_address: NetworkAttachmentDefinition egress/n1: spec.config plugins[1]: ip.addresses[0] \"192.168.3.10\" has no prefix length; write it in CIDR form with its network's prefix length, e.g. \"192.168.3.10/24\""
    );
}

#[test]
fn every_config_rule_refuses_with_its_message() {
    let at = "NetworkAttachmentDefinition egress/n1: spec.config";
    let cases: Vec<(String, Option<Platform>, Rule, String)> = vec![
        (
            config(json!({})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: sets none of ip, podIP and ipConfig; set exactly one of them"
            ),
        ),
        (
            config(json!({"ip": ip_block(), "ipConfig": {"name": "x"}})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: sets ip and ipConfig; set exactly one of ip, podIP and ipConfig"
            ),
        ),
        (
            config(json!({"ip": {"addresses": "192.168.3.10/24"}})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: the egress-router configuration is not what the plugin reads (invalid type: string \"192.168.3.10/24\", expected a sequence); write addresses and destinations as lists of strings, gateway and interfaceArgs values as strings, podIP as an object"
            ),
        ),
        (
            config(json!({"podIP": {}})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: podIP names no pod; add an entry per pod name (or name prefix ending in *), or use ip"
            ),
        ),
        (
            config(json!({"podIP": {"db-*-router": ip_block()}})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: podIP key \"db-*-router\" is no pod name; use a pod's name (lowercase letters, digits, '-' and '.') or a name prefix followed by a single trailing *"
            ),
        ),
        (
            config(json!({"podIP": {"DB": ip_block()}})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: podIP key \"DB\" is no pod name; use a pod's name (lowercase letters, digits, '-' and '.') or a name prefix followed by a single trailing *"
            ),
        ),
        (
            config(json!({"ipConfig": {"namespace": "egress"}})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: ipConfig.name is missing; name the ConfigMap that holds the ip or podIP configuration"
            ),
        ),
        (
            config(json!({"ipConfig": {"name": "Router_IPs"}})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: ipConfig.name \"Router_IPs\" is no ConfigMap name; use the ConfigMap's name (lowercase letters, digits, '-' and '.')"
            ),
        ),
        (
            config(json!({"ipConfig": {"name": "ips", "namespace": "a.b"}})),
            None,
            Rule::EgressRouterCni,
            format!(
                "egress_router_cni: {at}: ipConfig.namespace \"a.b\" is no namespace name; use the ConfigMap's namespace, or leave it out for the pod's"
            ),
        ),
        (
            config(
                json!({"ipConfig": {"name": "ips", "overrides": {"gateway": "192.168.3.1", "destinations": ["10.0.0.0/40"]}}}),
            ),
            None,
            Rule::EgressRouterRedirect,
            format!(
                "egress_router_redirect: {at}: ipConfig.overrides.destinations[0] \"10.0.0.0/40\" has \"10.0.0.0/40\", which is no IP address or CIDR; write a CIDR such as \"203.0.113.0/24\" or a rule such as \"80 TCP 203.0.113.26 8080\""
            ),
        ),
        (
            config(
                json!({"ipConfig": {"name": "ips", "overrides": {"addresses": ["192.168.3.10/24"], "gateway": "10.0.0.1"}}}),
            ),
            None,
            Rule::EgressRouterAddress,
            format!(
                "egress_router_address: {at}: ipConfig.overrides.gateway 10.0.0.1 is outside 192.168.3.0/24 (ipConfig.overrides.addresses[0] 192.168.3.10/24); use a gateway inside the address's network, or correct the address's prefix length"
            ),
        ),
        (
            config(json!({"ip": {"gateway": "192.168.3.1"}})),
            None,
            Rule::EgressRouterAddress,
            format!(
                "egress_router_address: {at}: ip.addresses lists no address; add the router's address in CIDR form, e.g. \"192.168.3.10/24\""
            ),
        ),
        (
            config(json!({"ip": {"addresses": ["192.168.3.10/24"], "gateway": "192.168.3.10"}})),
            None,
            Rule::EgressRouterAddress,
            format!(
                "egress_router_address: {at}: ip.gateway 192.168.3.10 is the router's own address (ip.addresses[0]); set the next hop's IP, another address of that network"
            ),
        ),
        (
            config(json!({"podIP": {"db": {"addresses": ["fd00::10/64"], "gateway": "fd01::1"}}})),
            None,
            Rule::EgressRouterAddress,
            format!(
                "egress_router_address: {at}: podIP[\"db\"].gateway fd01::1 is outside fd00::/64 (podIP[\"db\"].addresses[0] fd00::10/64); use a gateway inside the address's network, or correct the address's prefix length"
            ),
        ),
        (
            config(json!({"ip": {"addresses": ["0.0.0.0/0"]}})),
            None,
            Rule::EgressRouterAddress,
            format!(
                "egress_router_address: {at}: ip.addresses[0] \"0.0.0.0/0\" is the unspecified address, which cannot be a router's address; use a unicast address of the router's network"
            ),
        ),
        (
            config(
                json!({"ip": {"addresses": ["192.168.3.10/24"], "destinations": ["80 ICMP 10.0.0.1"]}}),
            ),
            None,
            Rule::EgressRouterRedirect,
            format!(
                "egress_router_redirect: {at}: ip.destinations[0] \"80 ICMP 10.0.0.1\" has protocol \"ICMP\", which is not TCP, UDP or SCTP; write a CIDR such as \"203.0.113.0/24\" or a rule such as \"80 TCP 203.0.113.26 8080\""
            ),
        ),
        (
            config(
                json!({"ip": {"addresses": ["192.168.3.10/24"], "destinations": ["80 TCP 10.0.0.1 65536"]}}),
            ),
            None,
            Rule::EgressRouterRedirect,
            format!(
                "egress_router_redirect: {at}: ip.destinations[0] \"80 TCP 10.0.0.1 65536\" has port \"65536\", which is not 1-65535; write a CIDR such as \"203.0.113.0/24\" or a rule such as \"80 TCP 203.0.113.26 8080\""
            ),
        ),
        (
            config(json!({"ip": {"addresses": ["192.168.3.10/24"], "destinations": ["80 TCP"]}})),
            None,
            Rule::EgressRouterRedirect,
            format!(
                "egress_router_redirect: {at}: ip.destinations[0] \"80 TCP\" is neither a CIDR nor a \"<port> <protocol> <IP> [<targetPort>]\" rule; write a CIDR such as \"203.0.113.0/24\" or a rule such as \"80 TCP 203.0.113.26 8080\""
            ),
        ),
        (
            config(json!({"interfaceType": "sriov", "ip": ip_block()})),
            None,
            Rule::EgressRouterInterface,
            format!(
                "egress_router_interface: {at}: interfaceType \"sriov\" is not one of macvlan, ipvlan or aws-elastic-ip (AWS only); use one of them"
            ),
        ),
        (
            config(json!({"interfaceType": "aws-elastic-ip", "ip": ip_block()})),
            Some(Platform::Gcp),
            Rule::EgressRouterInterface,
            format!(
                "egress_router_interface: {at}: interfaceType aws-elastic-ip works on AWS only, and this cluster is GCP (--platform-type); use macvlan or ipvlan"
            ),
        ),
        (
            config(json!({"interfaceArgs": {"mode": "Bridge"}, "ip": ip_block()})),
            None,
            Rule::EgressRouterInterface,
            format!(
                "egress_router_interface: {at}: interfaceArgs.mode \"Bridge\" is not a macvlan mode of the kernel (bridge, private, vepa, passthru); use one of them, in lower case"
            ),
        ),
        (
            config(
                json!({"interfaceType": "ipvlan", "interfaceArgs": {"master": "eth0:1"}, "ip": ip_block()}),
            ),
            None,
            Rule::EgressRouterInterface,
            format!(
                "egress_router_interface: {at}: interfaceArgs.master \"eth0:1\" is no Linux interface name (1-15 characters, no '/', ':' or whitespace); name the node's interface, or leave master out to infer it"
            ),
        ),
        (
            config(json!({"interfaceArgs": {"mtu": 1400}, "ip": ip_block()})),
            None,
            Rule::EgressRouterInterface,
            format!(
                "egress_router_interface: {at}: interfaceArgs.mtu is 1400, not a string, and the plugin reads only strings there; write it as \"1400\""
            ),
        ),
    ];
    for (config, platform, rule, message) in cases {
        let denial = check_cni_config(&nad(), &config, platform)
            .unwrap()
            .unwrap_err();
        assert_eq!(denial.rule, rule, "{config}");
        assert_eq!(denial.message, message);
    }
}

#[test]
fn aws_elastic_ip_passes_on_aws_and_warns_when_the_cloud_is_unknown() {
    let config = config(json!({"interfaceType": "aws-elastic-ip", "ip": ip_block()}));
    let on_aws = check_cni_config(&nad(), &config, Some(Platform::Aws))
        .unwrap()
        .unwrap();
    assert!(on_aws.warnings.is_empty());
    let verdict = review_nad(
        Operation::Create,
        &nad(),
        &nad(),
        Some(&config),
        None,
        &ClusterSnapshot::new(),
        None,
    );
    assert!(verdict.allowed());
    assert_eq!(
        verdict.warnings,
        [
            "interfaceType aws-elastic-ip works on AWS only; the webhook was not told the cloud (--platform-type), so this was not checked"
        ]
    );
}

fn owner_ref(kind: &str, api_version: &str, name: &str, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: "u".into(),
        controller: Some(controller),
        block_owner_deletion: None,
    }
}

#[test]
fn a_nad_controlled_by_an_egress_router_shares_its_addresses() {
    let r1 = RouterRef::egress_router("egress", "r1");
    assert_eq!(
        router_owner(
            "egress",
            "n1",
            &[owner_ref(
                "EgressRouter",
                "network.operator.openshift.io/v1",
                "r1",
                true
            )]
        ),
        r1
    );
    assert_eq!(
        router_owner(
            "egress",
            "n1",
            &[owner_ref(
                "EgressRouter",
                "network.operator.openshift.io/v1",
                "r1",
                false
            )]
        ),
        nad()
    );
    assert_eq!(
        router_owner(
            "egress",
            "n1",
            &[owner_ref("Deployment", "apps/v1", "r1", true)]
        ),
        nad()
    );

    let mut cluster = ClusterSnapshot::new();
    cluster.routers_mut().upsert(
        r1.clone(),
        r1.clone(),
        vec!["192.168.3.10".parse().unwrap()],
    );
    cluster.upsert_node(NodeInfo {
        name: "worker-a".into(),
        addresses: vec!["192.168.3.5".parse().unwrap()],
        egress: EgressState::Missing,
    });
    cluster.upsert_object("192.168.3.20", "", "");
    let own = config(json!({"ip": ip_block()}));
    assert!(
        review_nad(
            Operation::Create,
            &nad(),
            &r1,
            Some(&own),
            None,
            &cluster,
            None
        )
        .allowed()
    );
    let cases = [
        (
            "192.168.3.10/24",
            "egress_router_conflict: NetworkAttachmentDefinition egress/n1 uses 192.168.3.10, which EgressRouter egress/r1 already uses; give each egress router its own address",
        ),
        (
            "192.168.3.5/24",
            "egress_router_conflict: NetworkAttachmentDefinition egress/n1 uses 192.168.3.5, which is an address of node worker-a (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must not be taken by a router; pick an unused address of the router's network",
        ),
        (
            "192.168.3.20/24",
            "egress_router_conflict: NetworkAttachmentDefinition egress/n1 uses 192.168.3.20, which is the egress IP of CloudPrivateIPConfig 192.168.3.20 that the cloud attaches to a node; pick an address no CloudPrivateIPConfig uses",
        ),
    ];
    for (address, message) in cases {
        let config = config(
            json!({"podIP": {"a": {"addresses": ["192.168.3.99/24"]}, "b": {"addresses": [address]}}}),
        );
        let verdict = review_nad(
            Operation::Create,
            &nad(),
            &nad(),
            Some(&config),
            None,
            &cluster,
            None,
        );
        assert_eq!(verdict.denial.unwrap().message, message);
        // Kept unchanged by an update, the address is not checked again.
        let updated = config.replace("192.168.3.99/24", "192.168.3.98/24");
        assert!(
            review_nad(
                Operation::Update,
                &nad(),
                &nad(),
                Some(&updated),
                Some(&config),
                &cluster,
                None
            )
            .allowed()
        );
    }
    assert_eq!(
        config_addresses(&own),
        vec!["192.168.3.10".parse::<std::net::IpAddr>().unwrap()]
    );
}
