//! The OpenStack provider against real Keystone and Neutron (one pair of servers per test binary;
//! every test on its own network, so they run in parallel).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use cloudnet_e2e::fakes::openstack::{Api, OpenStackServers, Options};
use cloudnet_reconciler::cloud::openstack::OpenStackProvider;
use cloudnet_reconciler::cloud::{
    Change, CloudProvider, CloudProviderExt, ErrorKind, InstanceId, NodeTarget,
};
use cloudnet_shared::InternalIps;
use serde_json::{Value, json};

/// Neutron's `pagination_max_limit` here: every list of more ports than this comes in pages, as
/// in deployments that cap their lists (no list of this table's labs is that long).
pub(super) const PAGINATION_MAX_LIMIT: u32 = 50;

/// This table's Keystone and Neutron.
pub(super) async fn servers() -> &'static OpenStackServers {
    static SHARED: tokio::sync::OnceCell<OpenStackServers> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            let options = Options {
                pagination_max_limit: Some(PAGINATION_MAX_LIMIT),
                ..Options::default()
            };
            let servers = OpenStackServers::start(options).await.unwrap();
            eprintln!("Keystone and Neutron answered after {:?}", servers.startup);
            servers
        })
        .await
}

fn provider(servers: &OpenStackServers) -> OpenStackProvider {
    super::driver::member_provider(servers, None)
}

/// A member-owned network with an IPv4 and an IPv6 subnet, and `servers` "server" ports on it.
struct Lab {
    api: Api,
    network: String,
    v4: String,
    v6: String,
    prefix: String,
    servers: Vec<(NodeTarget, Value)>,
}

fn uuid(n: u32, i: usize) -> String {
    format!("{n:08x}-0000-4000-8000-{:012x}", i + 1)
}

async fn lab(count: usize) -> Lab {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let servers = servers().await;
    let api = servers.api(&servers.member).await.unwrap();
    let network = api
        .create("network", json!({"name": format!("lab-{n}")}))
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let prefix = format!("10.{n}.0");
    let v4 = api
        .create(
            "subnet",
            json!({"network_id": network, "ip_version": 4, "cidr": format!("{prefix}.0/24")}),
        )
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let v6 = api
        .create(
            "subnet",
            json!({"network_id": network, "ip_version": 6, "cidr": format!("fd00:{n}::/64")}),
        )
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut vms = Vec::new();
    for i in 0..count {
        let server = uuid(n, i);
        let port = api
            .create(
                "port",
                json!({"network_id": network, "device_id": server, "device_owner": "compute:nova",
                       "fixed_ips": [{"subnet_id": v4, "ip_address": format!("{prefix}.{}", 10 + i)},
                                     {"subnet_id": v6}]}),
            )
            .await
            .unwrap();
        let target = NodeTarget {
            node_name: format!("node-{i}"),
            provider_id: format!("openstack:///{server}"),
            instance: InstanceId(server),
            internal_ips: Default::default(),
        };
        vms.push((target, port));
    }
    Lab {
        api,
        network,
        v4,
        v6,
        prefix,
        servers: vms,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pairs(port: &Value) -> Vec<String> {
    port["allowed_address_pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["ip_address"].as_str().unwrap().to_owned())
        .collect()
}

async fn reservations(lab: &Lab, ip: &str) -> Vec<Value> {
    reservations_on(lab, &lab.network, ip).await
}

async fn reservations_on(lab: &Lab, network: &str, ip: &str) -> Vec<Value> {
    let (status, body) = lab
        .api
        .neutron(
            "GET",
            &format!(
                "/ports?network_id={network}&fixed_ips=ip_address%3D{}",
                ip.replace(':', "%3A")
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    body["ports"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_neutron_answers_409_412_and_the_pairs_limit() {
    let lab = lab(1).await;
    let port = &lab.servers[0].1;
    let taken = format!("{}.10", lab.prefix);
    let (status, body) = lab
        .api
        .neutron(
            "POST",
            "/ports",
            Some(&json!({"port": {"network_id": lab.network,
                "fixed_ips": [{"subnet_id": lab.v4, "ip_address": taken}]}})),
        )
        .await
        .unwrap();
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["NeutronError"]["type"], "IpAddressAlreadyAllocated");

    let id = port["id"].as_str().unwrap();
    let revision = port["revision_number"].as_u64().unwrap();
    let (status, _) = lab
        .api
        .put_if(
            &format!("/ports/{id}"),
            revision,
            &json!({"port": {"name": "a"}}),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let (status, body) = lab
        .api
        .put_if(
            &format!("/ports/{id}"),
            revision,
            &json!({"port": {"name": "b"}}),
        )
        .await
        .unwrap();
    assert_eq!(status, 412, "{body}");
    assert_eq!(
        body["NeutronError"]["type"],
        "RevisionNumberConstraintFailed"
    );

    let eleven: Vec<Value> = (100..111)
        .map(|i| json!({"ip_address": format!("{}.{i}", lab.prefix)}))
        .collect();
    let (status, body) = lab
        .api
        .neutron(
            "PUT",
            &format!("/ports/{id}"),
            Some(&json!({"port": {"allowed_address_pairs": eleven}})),
        )
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["NeutronError"]["type"], "AllowedAddressPairExhausted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_reserves_and_pairs_detach_frees_the_ip() {
    let lab = lab(1).await;
    let cloud = provider(servers().await);
    let (node, port) = &lab.servers[0];
    let v4 = format!("{}.50", lab.prefix);
    let v6 = format!("fd00:{}::50", lab.prefix.split('.').nth(1).unwrap());

    let view = cloud.egress_config(node).await.unwrap();
    assert_eq!(view.interface, port["id"].as_str().unwrap());
    assert_eq!(
        view.ipv4_subnet.map(|n| n.to_string()),
        Some(format!("{}.0/24", lab.prefix))
    );
    assert!(view.ipv6_subnet.is_some());
    assert_eq!(view.capacity.ip, Some(10));
    assert!(view.addresses.is_empty());

    let view = cloud
        .attach(node, &[ip(&v4), ip(&v6)])
        .await
        .unwrap()
        .unwrap();
    assert!(view.holds(ip(&v4)) && view.holds(ip(&v6)));
    let now = lab.api.port(port["id"].as_str().unwrap()).await.unwrap();
    let mut got = pairs(&now);
    got.sort();
    assert_eq!(got.len(), 2, "{got:?}");
    for addr in [&v4, &v6] {
        let held = reservations(&lab, addr).await;
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0]["device_owner"], "OpenShiftEgressIP");
        assert_eq!(
            held[0]["device_id"],
            format!("OpenShiftEgressIP_{}", node.instance)
        );
        assert_eq!(held[0]["name"], format!("egressip-{}", ip(addr)));
    }
    // Again, as ours (recorded before the first call): already attached is success, and nothing
    // is added twice. Not as ours, it is another's and refused.
    let again = Change::new(vec![ip(&v4)], Vec::new());
    let error = cloud.apply(node, &again, None).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Foreign, "{error}");
    let again = again.with_ours(vec![ip(&v4)]);
    cloud.apply(node, &again, None).await.unwrap();
    assert_eq!(reservations(&lab, &v4).await.len(), 1);

    let view = cloud
        .detach(node, &[ip(&v4), ip(&v6)])
        .await
        .unwrap()
        .unwrap();
    assert!(view.addresses.is_empty());
    let now = lab.api.port(port["id"].as_str().unwrap()).await.unwrap();
    assert!(pairs(&now).is_empty());
    assert!(reservations(&lab, &v4).await.is_empty());
    // The address is free again.
    lab.api
        .create(
            "port",
            json!({"network_id": lab.network, "fixed_ips": [{"subnet_id": lab.v4, "ip_address": v4}]}),
        )
        .await
        .unwrap();
    let _ = &lab.v6;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_held_by_someone_elses_port_is_refused_without_change() {
    let lab = lab(1).await;
    let cloud = provider(servers().await);
    let (node, port) = &lab.servers[0];
    let foreign = format!("{}.60", lab.prefix);
    let other = lab
        .api
        .create(
            "port",
            json!({"network_id": lab.network, "device_owner": "network:router_interface",
                   "fixed_ips": [{"subnet_id": lab.v4, "ip_address": foreign}]}),
        )
        .await
        .unwrap();
    let err = cloud.attach(node, &[ip(&foreign)]).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Permanent, "{err}");
    assert!(err.message.contains(other["id"].as_str().unwrap()), "{err}");
    assert!(
        err.message.contains("not an egress IP reservation"),
        "{err}"
    );
    let now = lab.api.port(port["id"].as_str().unwrap()).await.unwrap();
    assert!(pairs(&now).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_revision_is_reread_and_retried() {
    let lab = lab(1).await;
    let cloud = provider(servers().await);
    let (node, port) = &lab.servers[0];
    let id = port["id"].as_str().unwrap();
    let first = format!("{}.70", lab.prefix);
    let view = cloud.attach(node, &[ip(&first)]).await.unwrap().unwrap();
    // Another writer bumps the revision behind the provider's back.
    let (status, _) = lab
        .api
        .neutron(
            "PUT",
            &format!("/ports/{id}"),
            Some(&json!({"port": {"name": "touched"}})),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let second = format!("{}.71", lab.prefix);
    let change = Change::new(vec![ip(&second)], Vec::new());
    let view = cloud
        .apply(node, &change, Some(&view))
        .await
        .unwrap()
        .unwrap();
    assert!(view.holds(ip(&first)) && view.holds(ip(&second)));
    let now = lab.api.port(id).await.unwrap();
    assert_eq!(now["name"], "touched");
    assert_eq!(pairs(&now).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_pairs_than_the_limit_are_refused_before_any_call() {
    let lab = lab(1).await;
    let cloud = provider(servers().await);
    let (node, port) = &lab.servers[0];
    let ips: Vec<IpAddr> = (100..111)
        .map(|i| ip(&format!("{}.{i}", lab.prefix)))
        .collect();
    let err = cloud.attach(node, &ips).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Permanent, "{err}");
    assert!(err.message.contains("AllowedAddressPairExhausted"), "{err}");
    let now = lab.api.port(port["id"].as_str().unwrap()).await.unwrap();
    assert!(pairs(&now).is_empty());
    assert!(
        reservations(&lab, &format!("{}.100", lab.prefix))
            .await
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_move_keeps_the_reservation_port() {
    let lab = lab(2).await;
    let cloud = provider(servers().await);
    let (from, from_port) = &lab.servers[0];
    let (to, to_port) = &lab.servers[1];
    let moved = format!("{}.80", lab.prefix);
    cloud.attach(from, &[ip(&moved)]).await.unwrap();
    let before = reservations(&lab, &moved).await;
    assert_eq!(before.len(), 1);
    cloud.move_ips(from, to, &[ip(&moved)]).await.unwrap();
    // Idempotent: a rerun after a crash succeeds.
    cloud.move_ips(from, to, &[ip(&moved)]).await.unwrap();
    let after = reservations(&lab, &moved).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0]["id"], before[0]["id"]);
    assert_eq!(
        after[0]["device_id"],
        format!("OpenShiftEgressIP_{}", to.instance)
    );
    let a = lab
        .api
        .port(from_port["id"].as_str().unwrap())
        .await
        .unwrap();
    let b = lab.api.port(to_port["id"].as_str().unwrap()).await.unwrap();
    assert!(pairs(&a).is_empty());
    assert_eq!(pairs(&b), vec![moved.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detaching_from_a_vanished_server_frees_its_reservations() {
    let lab = lab(1).await;
    let cloud = provider(servers().await);
    let (node, port) = &lab.servers[0];
    let addr = format!("{}.90", lab.prefix);
    cloud.attach(node, &[ip(&addr)]).await.unwrap();
    // Nova deletes a server's port with its own (admin) credentials; Neutron's default policy
    // refuses a member the delete of a `compute:` port (403).
    let servers = servers().await;
    let admin = servers.api(&servers.admin).await.unwrap();
    let (status, body) = admin
        .neutron(
            "DELETE",
            &format!("/ports/{}", port["id"].as_str().unwrap()),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 204, "{body}");
    let gone = cloud.detach(node, &[ip(&addr)]).await.unwrap();
    assert!(gone.is_none());
    assert!(reservations(&lab, &addr).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_elsewhere_finishes_an_interrupted_move_without_the_ip_on_both_ports() {
    let lab = lab(2).await;
    let cloud = provider(servers().await);
    let (from, from_port) = &lab.servers[0];
    let (to, to_port) = &lab.servers[1];
    let moved = format!("{}.85", lab.prefix);
    cloud.attach(from, &[ip(&moved)]).await.unwrap();
    let before = reservations(&lab, &moved).await;
    assert_eq!(before.len(), 1);
    // What the engine does after a crash mid-move: the object names the target, so it attaches,
    // the IP recorded there (ours) before the move's call.
    let resume = Change::new(vec![ip(&moved)], Vec::new()).with_ours(vec![ip(&moved)]);
    cloud.apply(to, &resume, None).await.unwrap();
    let after = reservations(&lab, &moved).await;
    assert_eq!(after.len(), 1);
    assert_eq!(
        after[0]["id"], before[0]["id"],
        "the reservation port is kept"
    );
    assert_eq!(
        after[0]["device_id"],
        format!("OpenShiftEgressIP_{}", to.instance)
    );
    let a = lab
        .api
        .port(from_port["id"].as_str().unwrap())
        .await
        .unwrap();
    let b = lab.api.port(to_port["id"].as_str().unwrap()).await.unwrap();
    assert!(pairs(&a).is_empty(), "{:?}", pairs(&a));
    assert_eq!(pairs(&b), vec![moved.clone()]);
}

/// Issue 42: another cluster in the same network (or anyone creating `OpenShiftEgressIP` ports)
/// holds a reservation for the IP on a server of its own: an attach here never takes it over,
/// whether or not the ledger says the IP is ours on the target, and nothing of theirs changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_reservation_of_the_ip_is_never_taken_over() {
    let lab = lab(2).await;
    let theirs = provider(servers().await);
    let cloud = provider(servers().await);
    let (outside, outside_port) = &lab.servers[0];
    let (member, member_port) = &lab.servers[1];
    let addr = format!("{}.97", lab.prefix);
    theirs.attach(outside, &[ip(&addr)]).await.unwrap();
    let before = reservations(&lab, &addr).await;
    assert_eq!(before.len(), 1);
    // The member is one of this cluster's: read as its Node's annotation is.
    cloud.egress_config(member).await.unwrap();
    for ours in [Vec::new(), vec![ip(&addr)]] {
        let change = Change::new(vec![ip(&addr)], Vec::new()).with_ours(ours);
        let error = cloud.apply(member, &change, None).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Foreign, "{error}");
        assert!(error.message.contains("another server"), "{error}");
    }
    assert_eq!(reservations(&lab, &addr).await, before, "their reservation");
    let port = |p: &Value| p["id"].as_str().unwrap().to_owned();
    let outside_now = lab.api.port(&port(outside_port)).await.unwrap();
    assert_eq!(pairs(&outside_now), vec![addr.clone()], "their pair");
    let member_now = lab.api.port(&port(member_port)).await.unwrap();
    assert!(pairs(&member_now).is_empty(), "{:?}", pairs(&member_now));
}

/// Creates a reservation-like port at `addr` in `subnet`; the status, and the port deleted again.
async fn try_reserve(lab: &Lab, subnet: &str, addr: IpAddr) -> (u16, Value) {
    let (status, body) = lab
        .api
        .neutron(
            "POST",
            "/ports",
            Some(
                &json!({"port": {"network_id": lab.network, "device_owner": "OpenShiftEgressIP",
                "fixed_ips": [{"subnet_id": subnet, "ip_address": addr.to_string()}]}}),
            ),
        )
        .await
        .unwrap();
    if status == 201 {
        let id = body["port"]["id"].as_str().unwrap();
        let (deleted, _) = lab
            .api
            .neutron("DELETE", &format!("/ports/{id}"), None)
            .await
            .unwrap();
        assert_eq!(deleted, 204);
    }
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_reserved_addresses_are_the_ones_real_neutron_keeps_out_of_its_pools() {
    use cloudnet_shared::Platform;
    use cloudnet_shared::platform::reserved_index;
    use ipnet::IpNet;

    let lab = lab(0).await;
    for subnet_id in [&lab.v4, &lab.v6] {
        let (status, body) = lab
            .api
            .neutron("GET", &format!("/subnets/{subnet_id}"), None)
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let subnet = &body["subnet"];
        let cidr: IpNet = subnet["cidr"].as_str().unwrap().parse().unwrap();
        let gateway = ip(subnet["gateway_ip"].as_str().unwrap());
        let pools = subnet["allocation_pools"].as_array().unwrap();
        assert_eq!(pools.len(), 1, "{subnet}");
        let (start, end) = (
            ip(pools[0]["start"].as_str().unwrap()),
            ip(pools[0]["end"].as_str().unwrap()),
        );
        let rule = |addr: IpAddr| reserved_index(Platform::OpenStack, cidr, addr);
        let (network, last) = match cidr {
            IpNet::V4(n) => (IpAddr::V4(n.network()), IpAddr::V4(n.broadcast())),
            IpNet::V6(n) => (IpAddr::V6(n.network()), IpAddr::V6(n.broadcast())),
        };
        println!("{cidr}: gateway {gateway}, pool {start}-{end}");

        // Everything Neutron keeps out of its pool (network, gateway, IPv4 broadcast) the
        // webhook denies, and the pool's first and last addresses it allows.
        assert!(rule(network).is_some(), "{cidr}: network address");
        assert!(
            rule(gateway).is_some(),
            "{cidr}: Neutron's gateway {gateway}"
        );
        assert!(rule(start).is_none(), "{cidr}: pool start {start}");
        assert!(rule(end).is_none(), "{cidr}: pool end {end}");
        if cidr.addr().is_ipv4() {
            assert!(rule(last).is_some(), "{cidr}: broadcast");
            assert_eq!(end, ip(&format!("{}.254", lab.prefix)));
        } else {
            assert_eq!(end, last, "{cidr}: IPv6 has no broadcast");
        }

        // Real Neutron refuses a port at the network address (and IPv4's broadcast), and takes
        // one at either end of the pool.
        let mut refused = vec![network];
        if cidr.addr().is_ipv4() {
            refused.push(last);
        }
        for addr in refused {
            let (status, body) = try_reserve(&lab, subnet_id, addr).await;
            assert_eq!(status, 400, "{addr}: {body}");
            assert_eq!(body["NeutronError"]["type"], "InvalidIpForSubnet", "{addr}");
        }
        // Neutron leaves the IPv4 gateway address free until a router interface takes it
        // (observed: 201), so only the webhook keeps an egress IP off the address the router
        // will need. (IPv6's default gateway is the network address, refused above.)
        if gateway != network {
            let (status, body) = try_reserve(&lab, subnet_id, gateway).await;
            assert_eq!(status, 201, "{gateway}: {body}");
        }
        for addr in [start, end] {
            let (status, body) = try_reserve(&lab, subnet_id, addr).await;
            assert_eq!(status, 201, "{addr}: {body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_after_a_failed_move_frees_the_reservation_left_on_the_old_server() {
    let lab = lab(2).await;
    let cloud = provider(servers().await);
    let (from, from_port) = &lab.servers[0];
    let (to, _) = &lab.servers[1];
    let addr = format!("{}.95", lab.prefix);
    cloud.attach(from, &[ip(&addr)]).await.unwrap();
    let held = reservations(&lab, &addr).await;
    assert_eq!(
        held[0]["device_id"],
        format!("OpenShiftEgressIP_{}", from.instance)
    );
    // A move that failed after its first step: the pair is off the old port, the reservation
    // still names the old server, and the object already names the new one.
    let id = from_port["id"].as_str().unwrap();
    let (status, body) = lab
        .api
        .neutron(
            "PUT",
            &format!("/ports/{id}"),
            Some(&json!({"port": {"allowed_address_pairs": []}})),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(reservations(&lab, &addr).await.len(), 1);
    // The object is deleted: the engine detaches from the node its status names.
    cloud.detach(to, &[ip(&addr)]).await.unwrap();
    assert!(
        reservations(&lab, &addr).await.is_empty(),
        "the address is freed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_leaves_another_servers_reservation_while_that_server_allows_the_ip() {
    let lab = lab(2).await;
    let cloud = provider(servers().await);
    let (owner, _) = &lab.servers[0];
    let (other, _) = &lab.servers[1];
    let addr = format!("{}.96", lab.prefix);
    cloud.attach(owner, &[ip(&addr)]).await.unwrap();
    // A stale detach from a server the IP has left.
    cloud.detach(other, &[ip(&addr)]).await.unwrap();
    let held = reservations(&lab, &addr).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        held[0]["device_id"],
        format!("OpenShiftEgressIP_{}", owner.instance)
    );
}

/// Issue 30: of a server's two ports, the one whose subnet holds the node's first InternalIP is
/// read and written, as upstream picks it; a detach whose target carries no addresses (one built
/// from the ledger, by a provider that never saw the Node) finds the port that holds the IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_port_server_is_read_on_the_port_of_the_nodes_internal_ip() {
    let lab = lab(1).await;
    let (node, _) = &lab.servers[0];
    let n = lab.prefix.split('.').nth(1).unwrap();
    let network = lab
        .api
        .create("network", json!({"name": format!("lab-{n}-second")}))
        .await
        .unwrap();
    let subnet = lab
        .api
        .create(
            "subnet",
            json!({"network_id": network["id"], "ip_version": 4, "cidr": format!("10.{n}.1.0/24")}),
        )
        .await
        .unwrap();
    lab.api
        .create(
            "port",
            json!({"network_id": network["id"], "device_id": node.instance.0,
                   "device_owner": "compute:nova",
                   "fixed_ips": [{"subnet_id": subnet["id"], "ip_address": format!("10.{n}.1.10")}]}),
        )
        .await
        .unwrap();
    // The node's address on the port the first `compute:` port (by creation, then id) is not.
    let (status, listed) = lab
        .api
        .neutron("GET", &format!("/ports?device_id={}", node.instance), None)
        .await
        .unwrap();
    assert_eq!(status, 200, "{listed}");
    let mut ports = listed["ports"].as_array().unwrap().clone();
    assert_eq!(ports.len(), 2, "{listed}");
    ports.sort_by_key(|p| (p["created_at"].to_string(), p["id"].to_string()));
    let (first, chosen) = (&ports[0], &ports[1]);
    let v4 = |p: &Value| -> std::net::Ipv4Addr {
        p["fixed_ips"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|f| f["ip_address"].as_str()?.parse().ok())
            .unwrap()
    };
    let node_ip = v4(chosen);
    let mut octets = node_ip.octets();
    octets[3] = 50;
    let egress = IpAddr::from(octets);
    let target = NodeTarget {
        internal_ips: InternalIps {
            ipv4: Some(node_ip),
            ipv6: None,
        },
        ..node.clone()
    };

    let cloud = provider(servers().await);
    let view = cloud.egress_config(&target).await.unwrap();
    assert_eq!(view.interface, chosen["id"].as_str().unwrap());
    assert!(view.ipv4_subnet.unwrap().contains(&node_ip), "{view:?}");
    cloud.attach(&target, &[egress]).await.unwrap();
    let network = chosen["network_id"].as_str().unwrap();
    assert_eq!(
        reservations_on(&lab, network, &egress.to_string())
            .await
            .len(),
        1
    );
    let on = |p: &Value| p["id"].as_str().unwrap().to_owned();
    assert_eq!(
        pairs(&lab.api.port(&on(chosen)).await.unwrap()),
        [egress.to_string()]
    );
    assert!(pairs(&lab.api.port(&on(first)).await.unwrap()).is_empty());

    // A provider that never saw the Node cannot tell which port the annotation names ...
    let fresh = provider(servers().await);
    let err = fresh.egress_config(node).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Retryable, "{err}");
    // ... but a detach finds the IP where it is.
    let view = fresh.detach(node, &[egress]).await.unwrap().unwrap();
    assert_eq!(view.interface, on(chosen));
    assert!(pairs(&lab.api.port(&on(chosen)).await.unwrap()).is_empty());
    assert!(
        reservations_on(&lab, network, &egress.to_string())
            .await
            .is_empty()
    );

    // A node whose address is on neither port gets no port, as upstream annotates none.
    let stray = NodeTarget {
        internal_ips: InternalIps {
            ipv4: Some("192.0.2.1".parse().unwrap()),
            ipv6: None,
        },
        ..node.clone()
    };
    let err = provider(servers().await)
        .egress_config(&stray)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Permanent, "{err}");
    assert!(err.message.contains("192.0.2.1"), "{err}");
}
