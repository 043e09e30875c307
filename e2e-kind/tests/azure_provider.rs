#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Azure provider against the ARM fake: one PUT per change with `If-Match`, stale etags,
//! asynchronous operations, concurrent writers, ARM's refusals, load-balancer pool stripping and
//! throttling through the fault proxy. Each test starts its own fake.

use std::net::IpAddr;
use std::time::Duration;

use cloudnet_e2e::arm::{ArmConfig, ArmFake, VmIds, config_ip, configs};
use cloudnet_e2e::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule};
use cloudnet_reconciler::cloud::aws::Secret;
use cloudnet_reconciler::cloud::azure::{
    AzureAuth, AzureCredentials, AzureProvider, AzureSettings, Environment, RetryPolicy,
};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{Change, CloudProvider, CloudProviderExt, ErrorKind, NodeTarget};

const SUB: &str = "00000000-0000-0000-0000-000000000001";
const RG: &str = "cluster-rg";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn settings(url: &str, auth: AzureAuth) -> AzureSettings {
    AzureSettings {
        environment: Environment::resolve("AzurePublicCloud", Some(url), Some(url)).unwrap(),
        credentials: AzureCredentials {
            client_id: "app".into(),
            tenant_id: "tenant".into(),
            auth,
            subscription_id: Some(SUB.into()),
            resource_group: Some(RG.into()),
        },
        retry: RetryPolicy {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(300),
            max_attempts: 12,
            poll_interval: Duration::from_millis(20),
            operation_timeout: Duration::from_secs(20),
        },
        call_timeout: Duration::from_secs(10),
        pacing: Pacing::PUBLISHED,
    }
}

fn secret() -> AzureAuth {
    AzureAuth::ClientSecret(Secret::new("test-secret"))
}

struct World {
    fake: ArmFake,
    provider: AzureProvider,
    vm: VmIds,
    node: NodeTarget,
}

async fn world(config: ArmConfig) -> World {
    let fake = ArmFake::start(config).await.unwrap();
    let subnet = fake
        .add_subnet(
            SUB,
            "net-rg",
            "vnet",
            "workers",
            &["10.0.0.0/16", "fd00:0:0:1::/64"],
        )
        .unwrap();
    let vm = fake.add_vm(SUB, RG, "worker-0", &subnet, ip("10.0.0.4"));
    let provider = AzureProvider::new(&settings(fake.url(), secret())).unwrap();
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    World {
        fake,
        provider,
        vm,
        node,
    }
}

fn count(fake: &ArmFake, route: &str) -> u64 {
    fake.counts().get(route).copied().unwrap_or(0)
}

#[tokio::test]
async fn one_put_carries_additions_and_removals_with_the_etag() {
    let w = world(ArmConfig::default()).await;
    let first = Change {
        add: vec![ip("10.0.1.10"), ip("10.0.1.11"), ip("fd00:0:0:1::10")],
        remove: vec![],
    };
    let view = w
        .provider
        .apply(&w.node, &first, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(count(&w.fake, "PUT nic"), 1);
    for a in &first.add {
        assert!(view.holds(*a), "{a} missing from {view:?}");
    }
    assert_eq!(view.capacity.ip, Some(256));
    assert_eq!(view.ipv4_subnet.unwrap().to_string(), "10.0.0.0/16");
    assert_eq!(view.ipv6_subnet.unwrap().to_string(), "fd00:0:0:1::/64");
    assert_eq!(view.primary, vec![ip("10.0.0.4")]);

    let second = Change {
        add: vec![ip("10.0.1.12")],
        remove: vec![ip("10.0.1.10"), ip("fd00:0:0:1::10")],
    };
    let view = w
        .provider
        .apply(&w.node, &second, Some(&view))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(count(&w.fake, "PUT nic"), 2, "{:?}", w.fake.counts());
    assert_eq!(
        w.fake.nic_addresses(&w.vm.nic),
        [ip("10.0.0.4"), ip("10.0.1.11"), ip("10.0.1.12")]
    );
    assert_eq!(view.addresses, w.fake.nic_addresses(&w.vm.nic));
    let if_match = w.fake.if_match_seen();
    assert!(
        if_match
            .iter()
            .all(|m| m.as_deref().is_some_and(|e| e.starts_with("W/\""))),
        "{if_match:?}"
    );
    assert!(
        w.fake.schema_violations().is_empty(),
        "{:?}",
        w.fake.schema_violations()
    );

    let nic = w.fake.nic(&w.vm.nic).unwrap();
    let managed = configs(&nic)
        .into_iter()
        .find(|c| config_ip(c) == Some(ip("10.0.1.11")))
        .unwrap();
    assert_eq!(managed["name"], "worker-0_10.0.1.11");
    assert_eq!(managed["properties"]["privateIPAllocationMethod"], "Static");
    assert_eq!(managed["properties"]["primary"], false);
    assert!(
        managed["properties"]["subnet"]["id"]
            .as_str()
            .unwrap()
            .ends_with("/subnets/workers")
    );

    // Nothing left to do: no PUT.
    w.provider
        .apply(&w.node, &second, Some(&view))
        .await
        .unwrap();
    assert_eq!(count(&w.fake, "PUT nic"), 2);
}

#[tokio::test]
async fn an_ipv6_configuration_has_its_version_and_a_valid_name() {
    let w = world(ArmConfig::default()).await;
    w.provider
        .attach(&w.node, &[ip("fd00:0:0:1::54")])
        .await
        .unwrap();
    let nic = w.fake.nic(&w.vm.nic).unwrap();
    let v6 = configs(&nic)
        .into_iter()
        .find(|c| config_ip(c) == Some(ip("fd00:0:0:1::54")))
        .unwrap();
    assert_eq!(v6["properties"]["privateIPAddressVersion"], "IPv6");
    assert_eq!(v6["name"], "worker-0_fd00-0-0-1--54");
}

#[tokio::test]
async fn a_stale_etag_is_a_412_and_the_provider_rereads_keeping_the_other_writers_edit() {
    let w = world(ArmConfig::default()).await;
    let view = w
        .provider
        .attach(&w.node, &[ip("10.0.1.20")])
        .await
        .unwrap()
        .unwrap();
    // Another writer changes the NIC after our last answer.
    w.fake.edit_nic(&w.vm.nic, |doc| {
        doc["properties"]["enableIPForwarding"] = serde_json::json!(true);
        doc["tags"] = serde_json::json!({ "owner": "someone-else" });
    });
    let change = Change {
        add: vec![ip("10.0.1.21")],
        remove: vec![],
    };
    w.provider
        .apply(&w.node, &change, Some(&view))
        .await
        .unwrap();
    assert_eq!(count(&w.fake, "PUT nic 412"), 1, "{:?}", w.fake.counts());
    let nic = w.fake.nic(&w.vm.nic).unwrap();
    assert_eq!(nic["properties"]["enableIPForwarding"], true);
    assert_eq!(nic["tags"]["owner"], "someone-else");
    assert!(w.fake.nic_addresses(&w.vm.nic).contains(&ip("10.0.1.21")));
}

#[tokio::test]
async fn the_operation_is_followed_from_in_progress_to_succeeded() {
    let w = world(ArmConfig {
        operation_time: Duration::from_millis(300),
        ..ArmConfig::default()
    })
    .await;
    let view = w
        .provider
        .attach(&w.node, &[ip("10.0.1.30")])
        .await
        .unwrap()
        .unwrap();
    assert!(
        count(&w.fake, "GET operation") >= 2,
        "{:?}",
        w.fake.counts()
    );
    assert!(view.holds(ip("10.0.1.30")));
    let nic = w.fake.nic(&w.vm.nic).unwrap();
    assert_eq!(nic["properties"]["provisioningState"], "Succeeded");
}

#[tokio::test]
async fn a_failed_operation_reports_arms_error_text() {
    let w = world(ArmConfig::default()).await;
    w.fake
        .fail_next_operation("SubnetIsFull", "Subnet workers has no free addresses.");
    let err = w
        .provider
        .attach(&w.node, &[ip("10.0.1.40")])
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Permanent);
    assert!(err.message.contains("SubnetIsFull"), "{}", err.message);
    assert!(err.message.contains("no free addresses"), "{}", err.message);
    assert!(!w.fake.nic_addresses(&w.vm.nic).contains(&ip("10.0.1.40")));
}

#[tokio::test]
async fn two_writers_racing_on_one_nic_both_land() {
    let w = world(ArmConfig {
        operation_time: Duration::from_millis(200),
        ..ArmConfig::default()
    })
    .await;
    let other = AzureProvider::new(&settings(w.fake.url(), secret())).unwrap();
    let (ours, theirs) = ([ip("10.0.1.50")], [ip("10.0.1.51")]);
    let a = w.provider.attach(&w.node, &ours);
    let b = other.attach(&w.node, &theirs);
    let (a, b) = tokio::join!(a, b);
    a.unwrap();
    b.unwrap();
    let held = w.fake.nic_addresses(&w.vm.nic);
    assert!(
        held.contains(&ip("10.0.1.50")) && held.contains(&ip("10.0.1.51")),
        "{held:?}"
    );
    let conflicts = count(&w.fake, "PUT nic 409") + count(&w.fake, "PUT nic 412");
    assert!(conflicts >= 1, "{:?}", w.fake.counts());
}

#[tokio::test]
async fn an_address_held_by_another_nic_is_refused() {
    let w = world(ArmConfig::default()).await;
    let subnet = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/net-rg/providers/Microsoft.Network/virtualNetworks/vnet/subnets/workers";
    w.fake.add_vm(SUB, RG, "worker-1", subnet, ip("10.0.0.5"));
    let err = w
        .provider
        .attach(&w.node, &[ip("10.0.0.5")])
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Permanent);
    assert!(
        err.message.contains("PrivateIPAddressIsAllocated"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn reserved_and_outside_addresses_are_refused() {
    let w = world(ArmConfig::default()).await;
    for reserved in ["10.0.0.1", "10.0.255.255", "fd00:0:0:1::2"] {
        let err = w
            .provider
            .attach(&w.node, &[ip(reserved)])
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Permanent, "{reserved}");
        assert!(
            err.message.contains("PrivateIPAddressInReservedRange"),
            "{}",
            err.message
        );
    }
    let err = w
        .provider
        .attach(&w.node, &[ip("192.168.0.9")])
        .await
        .unwrap_err();
    assert!(
        err.message.contains("outside the subnet"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn the_256_limit_holds() {
    let w = world(ArmConfig::default()).await;
    let many: Vec<IpAddr> = (0..255u32)
        .map(|i| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0200 + i)))
        .collect();
    let view = w.provider.attach(&w.node, &many).await.unwrap().unwrap();
    assert_eq!(view.addresses.len(), 256);
    let change = Change {
        add: vec![ip("10.0.9.9")],
        remove: vec![],
    };
    let err = w
        .provider
        .apply(&w.node, &change, Some(&view))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Permanent);
    assert!(err.message.contains("256"), "{}", err.message);
    // A swap fits.
    let swap = Change {
        add: vec![ip("10.0.9.9")],
        remove: vec![many[0]],
    };
    let view = w
        .provider
        .apply(&w.node, &swap, Some(&view))
        .await
        .unwrap()
        .unwrap();
    assert!(view.holds(ip("10.0.9.9")) && !view.holds(many[0]));
}

#[tokio::test]
async fn a_vanished_vm_holds_nothing_but_cannot_take_addresses() {
    let w = world(ArmConfig::default()).await;
    w.provider
        .attach(&w.node, &[ip("10.0.1.60")])
        .await
        .unwrap();
    w.fake.delete_vm(&w.vm.vm);
    assert_eq!(
        w.provider
            .detach(&w.node, &[ip("10.0.1.60")])
            .await
            .unwrap(),
        None
    );
    let err = w
        .provider
        .attach(&w.node, &[ip("10.0.1.61")])
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound, "{err:?}");
}

#[tokio::test]
async fn load_balancer_pools_are_stripped_from_managed_configurations() {
    let w = world(ArmConfig::default()).await;
    w.provider
        .attach(&w.node, &[ip("10.0.1.70")])
        .await
        .unwrap();
    let pool = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/backendAddressPools/pool";
    w.fake.add_to_lb_pool(&w.vm.nic, ip("10.0.1.70"), pool);
    w.fake.add_to_lb_pool(&w.vm.nic, ip("10.0.0.4"), pool);
    assert_eq!(w.fake.lb_pools(&w.vm.nic, ip("10.0.1.70")), 1);
    let view = w.provider.egress_config(&w.node).await.unwrap();
    assert!(view.holds(ip("10.0.1.70")));
    assert_eq!(w.fake.lb_pools(&w.vm.nic, ip("10.0.1.70")), 0);
    assert_eq!(
        w.fake.lb_pools(&w.vm.nic, ip("10.0.0.4")),
        1,
        "the node's own stays pooled"
    );
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried() {
    let fake = ArmFake::start(ArmConfig::default()).await.unwrap();
    let subnet = fake
        .add_subnet(SUB, "net-rg", "vnet", "workers", &["10.0.0.0/16"])
        .unwrap();
    let vm = fake.add_vm(SUB, RG, "worker-0", &subnet, ip("10.0.0.4"));
    let proxy = FaultProxy::builder(fake.url(), Dialect::Arm)
        .seed(7)
        .start()
        .await
        .unwrap();
    // Tokens come straight from the fake; ARM calls go through the proxy.
    let mut s = settings(fake.url(), secret());
    s.environment = Environment::resolve("", Some(proxy.url()), Some(fake.url())).unwrap();
    let provider = AzureProvider::new(&s).unwrap();
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    proxy.set_rule(
        RouteMatch::Any,
        Rule {
            throttle: 0.25,
            server_error: 0.15,
            ..Rule::PASS
        },
    );
    for i in 0..5u8 {
        let a = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 3, 10 + i));
        provider.attach(&node, &[a]).await.unwrap();
    }
    proxy.clear_rules();
    assert_eq!(fake.nic_addresses(&vm.nic).len(), 6);
    let counts = proxy.all_counts();
    let throttled: u64 = counts.values().map(|c| c.throttled).sum();
    let failed: u64 = counts.values().map(|c| c.server_errors).sum();
    assert!(throttled > 0 && failed > 0, "{counts:?}");
}

#[tokio::test]
async fn workload_identity_exchanges_the_token_file() {
    let fake = ArmFake::start(ArmConfig::default()).await.unwrap();
    let subnet = fake
        .add_subnet(SUB, "net-rg", "vnet", "workers", &["10.0.0.0/16"])
        .unwrap();
    let vm = fake.add_vm(SUB, RG, "worker-0", &subnet, ip("10.0.0.4"));
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "projected.jwt.token").unwrap();
    let provider = AzureProvider::new(&settings(
        fake.url(),
        AzureAuth::FederatedTokenFile(token_file),
    ))
    .unwrap();
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    provider.egress_config(&node).await.unwrap();
    assert_eq!(fake.grants(), ["client_assertion"]);
}
