#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Azure provider against the ARM fake: one PUT per change with `If-Match`, stale etags,
//! asynchronous operations, concurrent writers, ARM's refusals, load-balancer pool stripping and
//! throttling through the fault proxy. Each test starts its own fake.

use std::net::IpAddr;
use std::time::Duration;

use cloudnet_e2e::fakes::arm::{ArmConfig, ArmFake, VmIds, config_ip, configs};
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule};
use cloudnet_reconciler::cloud::aws::Secret;
use cloudnet_reconciler::cloud::azure::{
    APPLICATION_ID, AzureAuth, AzureCredentials, AzureProvider, AzureSettings, Environment,
    RetryPolicy,
};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{Change, CloudProvider, CloudProviderExt, ErrorKind, NodeTarget};

pub(super) const SUB: &str = "00000000-0000-0000-0000-000000000001";
pub(super) const RG: &str = "cluster-rg";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn settings(url: &str, auth: AzureAuth) -> AzureSettings {
    AzureSettings {
        environment: Environment::at(url, url).unwrap(),
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

pub(super) fn secret() -> AzureAuth {
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

/// A fake of its own with one subnet and VM `worker-0` in it.
async fn fake_with_vm(config: ArmConfig) -> (ArmFake, VmIds) {
    let fake = ArmFake::start(config).await.unwrap();
    let subnet = fake
        .add_subnet(SUB, "net-rg", "vnet", "workers", &["10.0.0.0/16"])
        .unwrap();
    let vm = fake.add_vm(SUB, RG, "worker-0", &subnet, ip("10.0.0.4"));
    (fake, vm)
}

fn count(fake: &ArmFake, route: &str) -> u64 {
    fake.counts().get(route).copied().unwrap_or(0)
}

#[tokio::test]
async fn one_put_carries_additions_and_removals_with_the_etag() {
    let w = world(ArmConfig::default()).await;
    let first = Change::new(
        vec![ip("10.0.1.10"), ip("10.0.1.11"), ip("fd00:0:0:1::10")],
        vec![],
    );
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

    let second = Change::new(
        vec![ip("10.0.1.12")],
        vec![ip("10.0.1.10"), ip("fd00:0:0:1::10")],
    );
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

    // Nothing left to do for a change of ours (recorded before the first PUT): no PUT.
    let ours = second.add.clone();
    w.provider
        .apply(&w.node, &second.with_ours(ours), Some(&view))
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
    let change = Change::new(vec![ip("10.0.1.21")], vec![]);
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
    let change = Change::new(vec![ip("10.0.9.9")], vec![]);
    let err = w
        .provider
        .apply(&w.node, &change, Some(&view))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Permanent);
    assert!(err.message.contains("256"), "{}", err.message);
    // A swap fits.
    let swap = Change::new(vec![ip("10.0.9.9")], vec![many[0]]);
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
    let (fake, vm) = fake_with_vm(ArmConfig::default()).await;
    let proxy = FaultProxy::builder(fake.url(), Dialect::Arm)
        .seed(7)
        .start()
        .await
        .unwrap();
    // Tokens come straight from the fake; ARM calls go through the proxy.
    let mut s = settings(fake.url(), secret());
    s.environment = Environment {
        // Tokens are the fake's, for its own URL; Resource Manager is reached through the proxy.
        token_audience: fake.url().to_owned(),
        ..Environment::at(proxy.url(), fake.url()).unwrap()
    };
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
    let (fake, vm) = fake_with_vm(ArmConfig::default()).await;
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

/// A secret directory for a service principal, and no environment variable but `vars`.
fn secret_dir(
    vars: &[(&str, String)],
) -> (
    tempfile::TempDir,
    impl Fn(&str) -> Option<String> + Sync + use<>,
) {
    secret_dir_with(&[("azure_client_secret", "test-secret")], vars)
}

/// A secret directory with the ids and `files`, and no environment variable but `vars`.
fn secret_dir_with(
    files: &[(&str, &str)],
    vars: &[(&str, String)],
) -> (
    tempfile::TempDir,
    impl Fn(&str) -> Option<String> + Sync + use<>,
) {
    let dir = tempfile::tempdir().unwrap();
    for (name, value) in [
        ("azure_client_id", "app"),
        ("azure_tenant_id", "tenant"),
        ("azure_subscription_id", SUB),
        ("azure_resourcegroup", RG),
    ]
    .iter()
    .chain(files)
    {
        std::fs::write(dir.path().join(name), value).unwrap();
    }
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    let env = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    (dir, env)
}

/// An Azure Stack Hub stamp's audience: not Resource Manager's URL.
const STACK_AUDIENCE: &str = "https://management.contoso.onmicrosoft.com/4c0b2d5e-stack";

/// Issue 30: on Azure Stack Hub (`AzureStackCloud` with `--platform-api-url`, as the network
/// operator renders it) the token authority and audience come from Resource Manager's metadata
/// endpoint, as upstream takes them; the fake refuses a token asked for any other audience.
#[tokio::test]
async fn azure_stack_hub_takes_its_authority_and_audience_from_the_metadata_endpoint() {
    let (fake, vm) = fake_with_vm(ArmConfig {
        audience: Some(STACK_AUDIENCE.into()),
        ..ArmConfig::default()
    })
    .await;
    let (dir, env) = secret_dir(&[]);
    let loaded = AzureSettings::load_with(dir.path(), "AzureStackCloud", Some(fake.url()), &env)
        .await
        .unwrap();
    assert_eq!(loaded.environment.token_audience, STACK_AUDIENCE);
    assert_eq!(
        loaded.environment.authority_host.as_str(),
        format!("{}/", fake.url())
    );
    assert_eq!(count(&fake, "GET metadata"), 1);
    assert!(
        fake.user_agents()["GET metadata"]
            .iter()
            .all(|a| a.starts_with(APPLICATION_ID)),
        "{:?}",
        fake.user_agents()
    );
    let provider = AzureProvider::new(&AzureSettings {
        retry: settings(fake.url(), secret()).retry,
        ..loaded
    })
    .unwrap();
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    provider.egress_config(&node).await.unwrap();
    assert_eq!(fake.token_scopes(), [format!("{STACK_AUDIENCE}/.default")]);

    // Resource Manager's own URL as the audience (the public clouds' rule) is refused there.
    let public_rule = AzureProvider::new(&settings(fake.url(), secret())).unwrap();
    let err = public_rule.egress_config(&node).await.unwrap_err();
    assert!(
        err.message.contains("InvalidAuthenticationTokenAudience"),
        "{err}"
    );
}

/// Without `--platform-api-url`, `AzureStackCloud` reads go-autorest's environment file named by
/// `AZURE_ENVIRONMENT_FILEPATH`, as upstream does; no metadata is read then.
#[tokio::test]
async fn azure_stack_hub_without_an_api_url_reads_the_environment_file() {
    let (fake, vm) = fake_with_vm(ArmConfig {
        audience: Some(STACK_AUDIENCE.into()),
        ..ArmConfig::default()
    })
    .await;
    let files = tempfile::tempdir().unwrap();
    let file = files.path().join("azurestackcloud.json");
    std::fs::write(
        &file,
        serde_json::json!({
            "name": "AzureStackCloud",
            "resourceManagerEndpoint": format!("{}/", fake.url()),
            "activeDirectoryEndpoint": format!("{}/", fake.url()),
            "tokenAudience": STACK_AUDIENCE,
        })
        .to_string(),
    )
    .unwrap();
    let (dir, env) = secret_dir(&[("AZURE_ENVIRONMENT_FILEPATH", file.display().to_string())]);
    let loaded = AzureSettings::load_with(dir.path(), "AzureStackCloud", None, &env)
        .await
        .unwrap();
    let provider = AzureProvider::new(&loaded).unwrap();
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    provider.egress_config(&node).await.unwrap();
    assert_eq!(count(&fake, "GET metadata"), 0);
    assert_eq!(fake.token_scopes(), [format!("{STACK_AUDIENCE}/.default")]);

    let (dir, env) = secret_dir(&[]);
    let err = AzureSettings::load_with(dir.path(), "AzureStackCloud", None, &env)
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("AZURE_ENVIRONMENT_FILEPATH"),
        "{err}"
    );
}

/// Issue 30: every Azure call names cloudnet in its `User-Agent`, as upstream names itself
/// (through the Go SDK's application id): the token request, the raw VM read and NIC PUT and
/// operation polls, and the SDK's NIC and VNet reads, which keep the SDK's own agent after it.
#[tokio::test]
async fn every_azure_call_names_cloudnet_in_its_user_agent() {
    let w = world(ArmConfig::default()).await;
    w.provider
        .attach(&w.node, &[ip("10.0.1.10")])
        .await
        .unwrap();
    w.provider.egress_config(&w.node).await.unwrap();
    let agents = w.fake.user_agents();
    for class in [
        "POST token",
        "GET virtualmachines",
        "GET networkinterfaces",
        "PUT networkinterfaces",
        "GET virtualnetworks",
        "GET operations",
    ] {
        let seen = agents
            .get(class)
            .unwrap_or_else(|| panic!("no {class}: {agents:?}"));
        for agent in seen {
            assert!(
                agent.starts_with(&format!("{APPLICATION_ID} ")) || agent == APPLICATION_ID,
                "{class}: {agent:?}"
            );
        }
    }
    assert!(
        agents["GET networkinterfaces"]
            .iter()
            .any(|a| a.contains(" azsdk-rust-mgmt_network/")),
        "{agents:?}"
    );
}

/// The ARO-HCP test identity (`e2e-kind/azure/README.md`): its PKCS#12 and its public key.
const ARO_HCP_PFX: &[u8] = include_bytes!("../../azure/aro-hcp-identity.pfx");
const ARO_HCP_KEY: &[u8] = include_bytes!("../../azure/aro-hcp-identity.rsa-public.der");

/// Issue 30: with `ARO_HCP_CLIENT_CREDENTIALS_PATH` set, tokens come from the user-assigned
/// identity's certificate in that file (over the secret's client secret), as upstream's
/// msi-dataplane credential gets them: an RS256 client assertion the fake verifies against the
/// registered certificate, at the file's authentication endpoint.
#[tokio::test]
async fn aro_hcps_identity_file_authenticates_with_its_certificate() {
    use base64::Engine;
    let (fake, vm) = fake_with_vm(ArmConfig {
        client_certificate_key: Some(ARO_HCP_KEY.to_vec()),
        ..ArmConfig::default()
    })
    .await;
    let files = tempfile::tempdir().unwrap();
    let file = files.path().join("identity.json");
    std::fs::write(
        &file,
        serde_json::json!({
            "authentication_endpoint": format!("{}/", fake.url()),
            "client_id": "aro-hcp-cncc",
            "tenant_id": "aro-hcp-tenant",
            "client_secret": base64::engine::general_purpose::STANDARD.encode(ARO_HCP_PFX),
            "not_before": "2026-01-01T00:00:00Z",
            "not_after": "2099-01-01T00:00:00Z",
        })
        .to_string(),
    )
    .unwrap();
    let (dir, env) = secret_dir(&[(
        "ARO_HCP_CLIENT_CREDENTIALS_PATH",
        file.display().to_string(),
    )]);
    let loaded = AzureSettings::load_with(dir.path(), "AzurePublicCloud", Some(fake.url()), &env)
        .await
        .unwrap();
    assert_eq!(
        loaded.credentials.auth,
        AzureAuth::UserAssignedIdentity(file.clone())
    );
    let provider = AzureProvider::new(&loaded).unwrap();
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    provider.egress_config(&node).await.unwrap();
    assert_eq!(fake.grants(), ["client_certificate"]);

    // A tenant that registered another certificate refuses the same assertion.
    let (stranger, vm) = fake_with_vm(ArmConfig::default()).await;
    std::fs::write(
        &file,
        std::fs::read_to_string(&file)
            .unwrap()
            .replace(fake.url(), stranger.url()),
    )
    .unwrap();
    let loaded =
        AzureSettings::load_with(dir.path(), "AzurePublicCloud", Some(stranger.url()), &env)
            .await
            .unwrap();
    let provider = AzureProvider::new(&loaded).unwrap();
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    let err = provider.egress_config(&node).await.unwrap_err();
    // The SDK's token flow reports only the status; the fake says why it refused.
    assert!(err.message.contains("401"), "{err}");
    assert_eq!(stranger.grants(), ["refused client_certificate"]);
}

/// Issue 30 item 3: the Secret as the cloud credential operator writes it for workload identity
/// (`azure_federated_token_file` naming the projected token, no client secret), read from the
/// secret directory and exchanged at the fake's token endpoint.
#[tokio::test]
async fn workload_identity_as_the_cloud_credential_operator_writes_it() {
    let (fake, vm) = fake_with_vm(ArmConfig::default()).await;
    let tokens = tempfile::tempdir().unwrap();
    let token = tokens.path().join("token");
    std::fs::write(&token, "projected.service-account.token").unwrap();
    let token_path = token.display().to_string();
    let (dir, env) = secret_dir_with(&[("azure_federated_token_file", &token_path)], &[]);
    let loaded = AzureSettings::load_with(dir.path(), "AzurePublicCloud", Some(fake.url()), &env)
        .await
        .unwrap();
    assert_eq!(
        loaded.credentials.auth,
        AzureAuth::FederatedTokenFile(token)
    );
    let provider = AzureProvider::new(&loaded).unwrap();
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    provider.egress_config(&node).await.unwrap();
    assert_eq!(fake.grants(), ["client_assertion"]);
}
