#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Floating IPs that follow an egress IP (docs/clouds/openstack.md), the OpenStack provider
//! against real Keystone and Neutron with Neutron's L3 router service plugin: an external
//! network, a router with its gateway there and an interface on the tenant subnet, floating IPs
//! on the external network. The floating IP goes on the egress IP's reservation port, which a
//! move keeps, so after a move nothing is to be done; undoing touches only our association; an
//! unmarked floating IP is never touched; a policy refusal names the rule.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use super::aws_elastic_ip::refused_unmarked;
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy};
use cloudnet_e2e::fakes::openstack::{Api, OpenStackServers, Options};
use cloudnet_reconciler::cloud::openstack::OpenStackProvider;
use cloudnet_reconciler::cloud::public_ip::{PublicIpError, PublicIps};
use cloudnet_reconciler::cloud::{CloudProvider, CloudProviderExt, InstanceId, NodeTarget};
use cloudnet_shared::public_ip::{AssociatedReason, MARKER_PLAIN};
use serde_json::{Value, json};

/// This table's Keystone and Neutron, with floating IPs.
async fn servers() -> &'static OpenStackServers {
    static SHARED: tokio::sync::OnceCell<OpenStackServers> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            let options = Options {
                floating_ips: true,
                ..Options::default()
            };
            OpenStackServers::start(options).await.unwrap()
        })
        .await
}

fn id(value: &Value) -> String {
    value["id"].as_str().unwrap().to_owned()
}

/// Two servers on a routed tenant network, the egress IP attached to the first by the engine's
/// provider (so its reservation port exists), the member's provider behind a counting proxy.
struct Lab {
    member: Api,
    network: String,
    subnet: String,
    external: String,
    prefix: String,
    nodes: Vec<(NodeTarget, String)>,
    egress_ip: IpAddr,
    proxy: FaultProxy,
    provider: OpenStackProvider,
}

async fn lab() -> Lab {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let servers = servers().await;
    let admin = servers.api(&servers.admin).await.unwrap();
    let member = servers.api(&servers.member).await.unwrap();
    // Only an admin makes a network external; the member's project uses it.
    let external = id(&admin
        .create(
            "network",
            json!({"name": format!("public-{n}"), "router:external": true}),
        )
        .await
        .unwrap());
    admin
        .create(
            "subnet",
            json!({"network_id": external, "ip_version": 4,
                   "cidr": format!("100.64.{n}.0/24")}),
        )
        .await
        .unwrap();
    let network = id(&member
        .create("network", json!({"name": format!("fip-lab-{n}")}))
        .await
        .unwrap());
    let prefix = format!("10.{n}.0");
    let subnet = id(&member
        .create(
            "subnet",
            json!({"network_id": network, "ip_version": 4, "cidr": format!("{prefix}.0/24")}),
        )
        .await
        .unwrap());
    let router = id(&member
        .create(
            "router",
            json!({"name": format!("r-{n}"), "external_gateway_info": {"network_id": external}}),
        )
        .await
        .unwrap());
    let (status, body) = member
        .neutron(
            "PUT",
            &format!("/routers/{router}/add_router_interface"),
            Some(&json!({ "subnet_id": subnet })),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let mut nodes = Vec::new();
    for i in 0..2 {
        let server = format!("{n:08x}-0000-4000-8000-{:012x}", i + 1);
        let port = member
            .create(
                "port",
                json!({"network_id": network, "device_id": server, "device_owner": "compute:nova",
                       "fixed_ips": [{"subnet_id": subnet, "ip_address": format!("{prefix}.{}", 10 + i)}]}),
            )
            .await
            .unwrap();
        let target = NodeTarget {
            node_name: format!("node-{i}"),
            provider_id: format!("openstack:///{server}"),
            instance: InstanceId(server),
            internal_ips: Default::default(),
        };
        nodes.push((target, id(&port)));
    }
    let proxy = FaultProxy::builder(servers.neutron_url.clone(), Dialect::Rest)
        .start()
        .await
        .unwrap();
    let provider = super::driver::provider_as(servers, &servers.member, Some(proxy.url()));
    let egress_ip: IpAddr = format!("{prefix}.40").parse().unwrap();
    provider.attach(&nodes[0].0, &[egress_ip]).await.unwrap();
    Lab {
        member,
        network,
        subnet,
        external,
        prefix,
        nodes,
        egress_ip,
        proxy,
        provider,
    }
}

impl Lab {
    /// A new floating IP on the external network, with `tags`.
    async fn floating_ip(&self, tags: &[&str]) -> String {
        let fip = id(&self
            .member
            .create(
                "floatingip",
                json!({ "floating_network_id": self.external }),
            )
            .await
            .unwrap());
        for tag in tags {
            let (status, body) = self
                .member
                .neutron("PUT", &format!("/floatingips/{fip}/tags/{tag}"), None)
                .await
                .unwrap();
            assert_eq!(status, 201, "{body}");
        }
        fip
    }

    /// The floating IP as Neutron shows it now (not through the provider).
    async fn fip(&self, fip: &str) -> Value {
        let (status, body) = self
            .member
            .neutron("GET", &format!("/floatingips/{fip}"), None)
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        body["floatingip"].clone()
    }

    /// Someone else's change of the floating IP's port.
    async fn set_port(&self, fip: &str, port: Option<&str>, fixed_ip: Option<&str>) {
        let mut body = json!({ "floatingip": { "port_id": port } });
        if let Some(ip) = fixed_ip {
            body["floatingip"]["fixed_ip_address"] = json!(ip);
        }
        let (status, answer) = self
            .member
            .neutron("PUT", &format!("/floatingips/{fip}"), Some(&body))
            .await
            .unwrap();
        assert_eq!(status, 200, "{answer}");
    }

    /// The egress IP's reservation port.
    async fn reservation(&self) -> Value {
        let (status, body) = self
            .member
            .neutron(
                "GET",
                &format!(
                    "/ports?network_id={}&device_owner=OpenShiftEgressIP",
                    self.network
                ),
                None,
            )
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let ports = body["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 1, "{body}");
        ports[0].clone()
    }

    /// Floating IP updates forwarded to Neutron by the provider.
    fn fip_updates(&self) -> u64 {
        self.proxy
            .forwarded_where(|route| route.starts_with("PUT /v2.0/floatingips"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_floating_ip_goes_on_the_reservation_port_stays_there_across_a_move_and_is_kept_when_undone()
 {
    let lab = lab().await;
    let (port_a, port_b) = (lab.nodes[0].1.clone(), lab.nodes[1].1.clone());
    let fip = lab.floating_ip(&[MARKER_PLAIN, "team-a"]).await;
    let read = lab.provider.public_address(&fip).await.unwrap();
    assert_eq!(read.id, fip);
    assert!(read.marked);
    assert!(read.address.is_some());
    assert_eq!(read.association, None);
    assert!(!lab.provider.serves(&read, &port_a, lab.egress_ip));

    // Bind: on the reservation port, with the egress IP as its fixed IP.
    let made = lab
        .provider
        .associate(&read, &port_a, lab.egress_ip)
        .await
        .unwrap();
    let reservation = lab.reservation().await;
    assert_eq!(made.interface, id(&reservation));
    assert_eq!(made.private_ip, Some(lab.egress_ip));
    let shown = lab.fip(&fip).await;
    assert_eq!(shown["port_id"], reservation["id"], "{shown}");
    assert_eq!(shown["fixed_ip_address"], lab.egress_ip.to_string());
    assert_eq!(lab.fip_updates(), 1);

    let read = lab.provider.public_address(&fip).await.unwrap();
    assert!(lab.provider.serves(&read, &port_a, lab.egress_ip));
    lab.provider
        .associate(&read, &port_a, lab.egress_ip)
        .await
        .unwrap();
    assert_eq!(
        lab.fip_updates(),
        1,
        "associating where it is costs no update"
    );

    // Move: the engine re-points the reservation port at the other server; the floating IP
    // stays on it and serves the egress IP there, with no call.
    lab.provider
        .move_ips(&lab.nodes[0].0, &lab.nodes[1].0, &[lab.egress_ip])
        .await
        .unwrap();
    assert_eq!(lab.reservation().await["id"], reservation["id"]);
    let read = lab.provider.public_address(&fip).await.unwrap();
    assert!(lab.provider.serves(&read, &port_b, lab.egress_ip));
    assert!(
        !lab.provider.serves(&read, &port_a, lab.egress_ip),
        "the reservation names the new server now"
    );
    assert_eq!(lab.fip(&fip).await["port_id"], reservation["id"]);
    assert_eq!(lab.fip_updates(), 1);

    // Delete: disassociated, the floating IP itself kept.
    lab.provider.disassociate(&fip, &made).await.unwrap();
    let kept = lab.fip(&fip).await;
    assert_eq!(kept["port_id"], Value::Null, "{kept}");
    assert_eq!(
        kept["floating_ip_address"].as_str(),
        read.address.map(|a| a.to_string()).as_deref()
    );
    assert_eq!(lab.fip_updates(), 2);
    let read = lab.provider.public_address(&fip).await.unwrap();
    assert_eq!(read.association, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_association_removed_by_someone_else_is_made_again_and_only_ours_is_ever_undone() {
    let lab = lab().await;
    let port_a = lab.nodes[0].1.clone();
    let fip = lab.floating_ip(&[MARKER_PLAIN]).await;
    let read = lab.provider.public_address(&fip).await.unwrap();
    let made = lab
        .provider
        .associate(&read, &port_a, lab.egress_ip)
        .await
        .unwrap();

    // Drift: someone removes it; the read shows it, and associating puts it back.
    lab.set_port(&fip, None, None).await;
    let read = lab.provider.public_address(&fip).await.unwrap();
    assert_eq!(read.association, None);
    assert!(!lab.provider.serves(&read, &port_a, lab.egress_ip));
    let again = lab
        .provider
        .associate(&read, &port_a, lab.egress_ip)
        .await
        .unwrap();
    assert_eq!(again, made);
    assert_eq!(
        lab.fip(&fip).await["port_id"].as_str(),
        Some(made.interface.as_str())
    );

    // Someone moves it to a port of their own: undoing ours leaves theirs alone.
    let theirs = id(&lab
        .member
        .create(
            "port",
            json!({"network_id": lab.network,
                   "fixed_ips": [{"subnet_id": lab.subnet, "ip_address": format!("{}.50", lab.prefix)}]}),
        )
        .await
        .unwrap());
    lab.set_port(&fip, Some(&theirs), Some(&format!("{}.50", lab.prefix)))
        .await;
    let before = lab.fip_updates();
    lab.provider.disassociate(&fip, &made).await.unwrap();
    assert_eq!(
        lab.fip(&fip).await["port_id"].as_str(),
        Some(theirs.as_str())
    );
    assert_eq!(
        lab.fip_updates(),
        before,
        "no update of someone else's association"
    );
    let read = lab.provider.public_address(&fip).await.unwrap();
    assert!(!lab.provider.serves(&read, &port_a, lab.egress_ip));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floating_ip_without_the_marker_is_never_associated() {
    let lab = lab().await;
    for tags in [&[][..], &["cloudnet-egress-public-ip=true", "other"][..]] {
        let fip = lab.floating_ip(tags).await;
        let read = lab.provider.public_address(&fip).await.unwrap();
        refused_unmarked(
            &lab.provider,
            &read,
            &lab.nodes[0].1,
            lab.egress_ip,
            "the floating IP tag cloudnet-egress-public-ip",
        )
        .await;
        assert_eq!(lab.fip(&fip).await["port_id"], Value::Null);
    }
    assert_eq!(lab.fip_updates(), 0, "refused before any update");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_refusal_names_the_rule_and_an_unknown_floating_ip_is_not_found() {
    let lab = lab().await;
    let servers = servers().await;
    let reader = super::driver::provider_as(servers, &servers.reader, None);
    let fip = lab.floating_ip(&[MARKER_PLAIN]).await;
    let read = reader.public_address(&fip).await.unwrap();
    assert!(read.marked, "a reader may read it");
    let error = reader
        .associate(&read, &lab.nodes[0].1, lab.egress_ip)
        .await
        .unwrap_err();
    assert_eq!(
        error,
        PublicIpError::MissingPermission {
            cloud: "Neutron",
            action: "update_floatingip",
            permission: "update_floatingip",
        }
    );
    assert!(
        error
            .to_string()
            .contains("lack the permission update_floatingip"),
        "{error}"
    );
    assert_eq!(error.reason(), AssociatedReason::PermissionDenied);
    assert!(!error.is_transient());
    assert_eq!(lab.fip(&fip).await["port_id"], Value::Null);

    let made = lab
        .provider
        .associate(&read, &lab.nodes[0].1, lab.egress_ip)
        .await
        .unwrap();
    let error = reader.disassociate(&fip, &made).await.unwrap_err();
    assert!(
        matches!(
            error,
            PublicIpError::MissingPermission {
                permission: "update_floatingip",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        lab.fip(&fip).await["port_id"].as_str(),
        Some(made.interface.as_str())
    );

    for unknown in ["00000000-0000-4000-8000-000000000000", "../ports"] {
        let error = lab.provider.public_address(unknown).await.unwrap_err();
        assert!(matches!(error, PublicIpError::NotFound { .. }), "{error:?}");
        assert_eq!(error.reason(), AssociatedReason::PublicIPNotFound);
    }
    assert_eq!(
        lab.proxy.forwarded_where(|route| route.contains("..")),
        0,
        "an id that is no UUID never reaches a URL"
    );
}
