#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The GCP provider against the GCE fake (which checks every body against the Compute v1
//! discovery document), through the fault proxy's GCE dialect so every call is counted. Each
//! test has its own fake, and every test ends by asserting the fake saw no schema violation.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule};
use cloudnet_e2e::fakes::gce::{self, GceFake, PROJECT, ZONE};
use cloudnet_reconciler::cloud::gcp::{GcpProvider, GcpSettings, RetryPolicy};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{Change, CloudProvider, CloudProviderExt, ErrorKind, NodeTarget};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const PATCH: &str = "instances.updateNetworkInterface";

struct World {
    fake: GceFake,
    proxy: FaultProxy,
    provider: GcpProvider,
    _secrets: tempfile::TempDir,
}

impl World {
    async fn start(vms: &[(&str, [u8; 4])]) -> Self {
        let fake = GceFake::start().await.unwrap();
        fake.require_auth(true);
        for (name, ip) in vms {
            fake.add_standard_vm(name, Ipv4Addr::from(*ip)).unwrap();
        }
        let proxy = FaultProxy::builder(fake.url(), Dialect::Gce)
            .start()
            .await
            .unwrap();
        let secrets = tempfile::tempdir().unwrap();
        gce::write_service_account(secrets.path()).unwrap();
        let mut settings = GcpSettings::new(proxy.url());
        settings.retry = RetryPolicy {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(200),
            max_attempts: 10,
            call_timeout: Duration::from_secs(20),
            operation_timeout: Duration::from_secs(30),
        };
        settings.pacing = Pacing::UNLIMITED;
        let provider = GcpProvider::from_secret_dir(&settings, secrets.path())
            .await
            .unwrap();
        Self {
            fake,
            proxy,
            provider,
            _secrets: secrets,
        }
    }

    async fn node(&self, name: &str) -> NodeTarget {
        self.provider
            .resolve(name, &format!("gce://{PROJECT}/{ZONE}/{name}"))
            .await
            .unwrap()
    }

    fn aliases(&self, vm: &str) -> Vec<String> {
        self.fake.aliases(PROJECT, ZONE, vm)
    }

    fn patches(&self) -> u64 {
        self.proxy.counts(PATCH).total()
    }

    fn assert_schema_clean(&self) {
        assert_eq!(self.fake.violations(), Vec::<String>::new());
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

#[tokio::test]
async fn attach_and_detach_in_one_patch_each() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    let node = w.node("vm-1").await;
    let view = w
        .provider
        .attach(&node, &ips(&["10.0.0.10", "10.0.0.11"]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(w.aliases("vm-1"), ["10.0.0.10/32", "10.0.0.11/32"]);
    assert!(view.holds(ip("10.0.0.10")) && view.holds(ip("10.0.0.11")));
    assert_eq!(w.patches(), 1);

    // Additions and removals together: still one PATCH.
    let change = Change::new(ips(&["10.0.0.12"]), ips(&["10.0.0.10"]));
    let view = w
        .provider
        .apply(&node, &change, Some(&view))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(w.aliases("vm-1"), ["10.0.0.11/32", "10.0.0.12/32"]);
    assert_eq!(view.addresses, ips(&["10.0.0.11", "10.0.0.12"]));
    assert_eq!(w.patches(), 2);
    w.assert_schema_clean();
}

#[tokio::test]
async fn removing_the_last_alias_sends_an_explicit_empty_list() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    let node = w.node("vm-1").await;
    w.provider
        .attach(&node, &ips(&["10.0.0.20"]))
        .await
        .unwrap();
    assert_eq!(w.aliases("vm-1"), ["10.0.0.20/32"]);
    let view = w
        .provider
        .detach(&node, &ips(&["10.0.0.20"]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(w.aliases("vm-1"), Vec::<String>::new());
    assert!(view.addresses.is_empty());
    assert_eq!(
        w.proxy.counts(PATCH).addresses,
        1,
        "one alias sent, then none"
    );
    w.assert_schema_clean();
}

#[tokio::test]
async fn a_stale_fingerprint_is_read_again_and_the_other_writers_alias_kept() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    let node = w.node("vm-1").await;
    let view = w
        .provider
        .attach(&node, &ips(&["10.0.0.30"]))
        .await
        .unwrap()
        .unwrap();
    // Another client changes the NIC: the fingerprint the provider keeps is now stale.
    w.fake
        .set_aliases(PROJECT, ZONE, "vm-1", &["10.0.0.30/32", "10.0.0.99/32"])
        .unwrap();
    let before = w.patches();
    let view = w
        .provider
        .apply(
            &node,
            &Change::new(ips(&["10.0.0.31"]), Vec::new()),
            Some(&view),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        w.aliases("vm-1"),
        ["10.0.0.30/32", "10.0.0.99/32", "10.0.0.31/32"]
    );
    assert!(view.holds(ip("10.0.0.99")));
    assert_eq!(
        w.patches() - before,
        2,
        "a 412, then the PATCH from a fresh read"
    );
    w.assert_schema_clean();
}

#[tokio::test]
async fn an_ip_another_vm_uses_fails_in_the_operation() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2]), ("vm-2", [10, 0, 0, 3])]).await;
    let (a, b) = (w.node("vm-1").await, w.node("vm-2").await);
    w.provider.attach(&a, &ips(&["10.0.0.40"])).await.unwrap();
    let e = w
        .provider
        .attach(&b, &ips(&["10.0.0.40"]))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent);
    assert!(e.message.contains("IP_IN_USE_BY_ANOTHER_RESOURCE"), "{e}");
    // The node's own address is in use too.
    let e = w
        .provider
        .attach(&b, &ips(&["10.0.0.2"]))
        .await
        .unwrap_err();
    assert!(e.message.contains("IP_IN_USE_BY_ANOTHER_RESOURCE"), "{e}");
    assert_eq!(w.aliases("vm-2"), Vec::<String>::new());
    w.assert_schema_clean();
}

#[tokio::test]
async fn out_of_subnet_is_refused_without_a_patch_and_secondary_ranges_are_named() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    let node = w.node("vm-1").await;
    let e = w
        .provider
        .attach(&node, &ips(&["192.168.1.1"]))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent);
    assert!(e.message.contains("10.0.0.0/24"), "{e}");
    assert_eq!(w.patches(), 0);
    // An IP of the secondary range goes out with the range's name (the fake refuses it otherwise).
    w.provider.attach(&node, &ips(&["10.4.3.2"])).await.unwrap();
    assert_eq!(w.aliases("vm-1"), ["10.4.3.2/32"]);
    w.assert_schema_clean();
}

#[tokio::test]
async fn egress_config_reports_nic0_its_subnet_and_a_hundred() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    let node = w.node("vm-1").await;
    w.fake
        .set_aliases(PROJECT, ZONE, "vm-1", &["10.0.0.50/32"])
        .unwrap();
    let view = w.provider.egress_config(&node).await.unwrap();
    assert_eq!(view.interface, "nic0");
    assert_eq!(view.ipv4_subnet, "10.0.0.0/24".parse().ok());
    assert_eq!(view.ipv6_subnet, None);
    assert_eq!(view.capacity.ip, Some(100));
    assert_eq!(view.addresses, ips(&["10.0.0.50"]));
    w.assert_schema_clean();
}

/// On a dual-stack subnetwork the node annotation carries its IPv6 range, byte for byte as
/// upstream writes it (pkg/cloudprovider/gcp.go, GetNodeEgressIPConfiguration: `ifaddr.ipv6`
/// from the subnetwork's `ipv6CidrRange`, Go's IPNet text; capacity `ip` alone).
#[tokio::test]
async fn a_dual_stack_subnetwork_puts_its_ipv6_range_in_the_annotation_as_upstream() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    w.fake.add_subnet(gce::SubnetSpec {
        ipv6: Some("fd20:6f0:a1b2:0:0:0:0:0/64".parse().unwrap()),
        ..GceFake::standard_subnet()
    });
    let node = w.node("vm-1").await;
    let view = w.provider.egress_config(&node).await.unwrap();
    let config = cloudnet_reconciler::capacity::egress_config(
        &view,
        &std::collections::HashSet::new(),
        Some(cloudnet_shared::Platform::Gcp),
    );
    assert_eq!(
        cloudnet_shared::annotation::encode(&[config]),
        r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd20:6f0:a1b2::/64"},"capacity":{"ip":100}}]"#
    );
    w.assert_schema_clean();
}

#[tokio::test]
async fn a_vanished_vm_holds_nothing() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    let node = w.node("vm-1").await;
    assert!(w.fake.delete_instance(PROJECT, ZONE, "vm-1"));
    assert_eq!(
        w.provider
            .detach(&node, &ips(&["10.0.0.60"]))
            .await
            .unwrap(),
        None
    );
    let e = w
        .provider
        .attach(&node, &ips(&["10.0.0.60"]))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    w.assert_schema_clean();
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    w.proxy.reseed(7);
    w.proxy.set_rule(
        RouteMatch::prefix(""),
        Rule::PASS.with_throttle(0.3).with_server_error(0.2),
    );
    let node = w.node("vm-1").await;
    for i in 0..5u8 {
        let add = vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 70 + i))];
        w.provider.attach(&node, &add).await.unwrap();
    }
    assert_eq!(w.aliases("vm-1").len(), 5);
    let injected: u64 = w.proxy.all_counts().values().map(|c| c.injected()).sum();
    assert!(
        injected > 0,
        "faults were injected: {:?}",
        w.proxy.all_counts()
    );
    w.assert_schema_clean();
}

#[tokio::test]
async fn operations_go_pending_running_done_and_change_only_when_done() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    w.fake.set_operation_delay(Duration::from_millis(400));
    let instance = get(
        &w.fake,
        &format!("/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/vm-1"),
    )
    .await;
    let fingerprint = instance.1["networkInterfaces"][0]["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();
    let patch_path = format!(
        "/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/vm-1/updateNetworkInterface?networkInterface=nic0&$apiVersion=any-version"
    );
    let body = serde_json::json!({"fingerprint": fingerprint,
        "aliasIpRanges": [{"ipCidrRange": "10.0.0.80/32"}]});
    let (status, op) = send(&w.fake, "PATCH", &patch_path, Some(&body)).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(op["status"], "PENDING");
    assert_eq!(w.aliases("vm-1"), Vec::<String>::new(), "not before DONE");
    let name = op["name"].as_str().unwrap();
    let wait = format!("/compute/v1/projects/{PROJECT}/zones/{ZONE}/operations/{name}/wait");
    let (_, done) = send(&w.fake, "POST", &wait, None).await;
    assert_eq!(done["status"], "DONE");
    assert_eq!(w.aliases("vm-1"), ["10.0.0.80/32"]);

    // The old fingerprint is stale now; none at all is a 400.
    let (status, _) = send(&w.fake, "PATCH", &patch_path, Some(&body)).await;
    assert_eq!(status, 412);
    let none = serde_json::json!({"aliasIpRanges": []});
    let (status, _) = send(&w.fake, "PATCH", &patch_path, Some(&none)).await;
    assert_eq!(status, 400);
    w.assert_schema_clean();
}

#[tokio::test]
async fn a_body_off_the_schema_is_refused_and_recorded() {
    let w = World::start(&[("vm-1", [10, 0, 0, 2])]).await;
    let path = format!(
        "/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/vm-1/updateNetworkInterface?networkInterface=nic0"
    );
    let body = serde_json::json!({"fingerprint": "AAAAAAAAAAA=", "aliasIPRanges": []});
    let (status, _) = send(&w.fake, "PATCH", &path, Some(&body)).await;
    assert_eq!(status, 400);
    let wrong_type = serde_json::json!({"fingerprint": 5});
    let (status, _) = send(&w.fake, "PATCH", &path, Some(&wrong_type)).await;
    assert_eq!(status, 400);
    let violations = w.fake.violations();
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(
        violations[0].contains("aliasIPRanges: unknown property"),
        "{violations:?}"
    );
    assert!(
        violations[1].contains("fingerprint: expected string"),
        "{violations:?}"
    );
}

async fn get(fake: &GceFake, path: &str) -> (u16, serde_json::Value) {
    send(fake, "GET", path, None).await
}

/// One request straight to the fake, with a bearer token (it checks only that there is one).
async fn send(
    fake: &GceFake,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", fake.url()))
        .header("authorization", "Bearer test")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let answer = client.request(request).await.unwrap();
    let status = answer.status().as_u16();
    let bytes = answer.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

#[allow(dead_code)]
fn _assert_send(p: Arc<GcpProvider>) -> Arc<dyn CloudProvider> {
    p
}

/// Workload identity as OpenShift configures it for the controller (CNO mounts a bound
/// ServiceAccount token, audience `openshift`, at /var/run/secrets/openshift/serviceaccount; the
/// Cloud Credential Operator's `service_account.json` names it): the token file is exchanged at
/// STS, the STS token impersonates the service account, and Compute calls carry only that last
/// token.
#[tokio::test]
async fn workload_identity_exchanges_the_projected_token_and_impersonates() {
    let fake = GceFake::start().await.unwrap();
    fake.require_auth(true);
    fake.add_standard_vm("wi-a", Ipv4Addr::new(10, 0, 0, 5))
        .unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("openshift-token");
    std::fs::write(&token, "projected-token-1").unwrap();
    gce::write_workload_identity(secrets.path(), &fake.url(), &token).unwrap();
    let settings = GcpSettings::new(&fake.url());
    let provider = GcpProvider::from_secret_dir(&settings, secrets.path())
        .await
        .unwrap();
    let node = provider
        .resolve("wi-a", &format!("gce://{PROJECT}/{ZONE}/wi-a"))
        .await
        .unwrap();
    provider.egress_config(&node).await.unwrap();
    assert_eq!(fake.subject_tokens(), ["projected-token-1"]);
    assert_eq!(fake.calls().get(gce::IMPERSONATION_CALL), Some(&1));
    let bearers: Vec<String> = fake.bearers().into_keys().collect();
    assert!(
        !bearers.is_empty() && bearers.iter().all(|b| b.starts_with("ya29.impersonated-")),
        "{bearers:?}"
    );
    assert_eq!(fake.violations(), Vec::<String>::new());
}
