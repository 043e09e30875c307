#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The whole system end to end on OpenStack: real Keystone and Neutron, the control plane, and the
//! `cloudnet-webhook` and `cloudnet-reconciler` binaries as separate processes (build them first:
//! `cargo build --workspace --all-targets`; `make test` does), played as a
//! network plugin would, with Neutron read back after every step. "Servers" are Neutron ports
//! with a `device_id` and `device_owner=compute:nova`: no Nova is needed.
//!
//! Keystone issues tokens for [`TOKEN_SECONDS`] only, so every test runs across token expiries
//! and one waits for an expiry on purpose. Tests run in parallel on their own nodes and
//! addresses; the denial test takes the suite lock exclusively, because it asserts that no
//! Neutron mutation happens at all while it runs.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cloudnet_e2e::fakes::faultproxy::{RouteMatch, Rule};
use cloudnet_e2e::fakes::openstack::{Api, Options};
use cloudnet_e2e::harness::e2e::openstack::{
    floating_ip, floating_ip_update, route_to_external, show_floating_ip,
};
use cloudnet_e2e::harness::e2e::{Cluster, OpenStack, plugin, public_ips, wait};
use cloudnet_shared::public_ip::MARKER_PLAIN;
use cloudnet_shared::{
    ClusterSnapshot, NodeInfo, ObjectView, Operation, Platform, encode_name, review,
};
use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::api::core::v1::Node;
use kube::{Api as KubeApi, Client};
use serde_json::{Value, json};
use tokio::sync::{OnceCell, RwLock};

/// Keystone's token lifetime for the whole suite: short enough that tests run across expiries,
/// long enough that a token outlives a request's wait in Neutron's queue on a loaded machine
/// (with 20 s, a token taken just before a request had expired when Neutron got to it).
const TOKEN_SECONDS: u32 = 60;

/// Shared by the tests that only touch their own nodes; taken exclusively by the denial test.
static SUITE: RwLock<()> = RwLock::const_new(());

/// The suite's network: one IPv4 and one IPv6 subnet, owned by the reconciler's project.
#[derive(Clone, Debug)]
struct Network {
    id: String,
    v4_subnet: Value,
    v6_subnet: Value,
    v4: Ipv4Net,
    v6: Ipv6Net,
}

/// A "server": its id and its port.
#[derive(Clone, Debug)]
struct Vm {
    server: String,
    port: String,
    v4: IpAddr,
}

struct Env {
    cluster: &'static Cluster,
    openstack: &'static OpenStack,
    client: Client,
    api: Api,
    network: Network,
}

fn cluster() -> &'static Cluster {
    Cluster::shared_with(module_path!(), || async {
        let options = Options {
            token_expiration_secs: TOKEN_SECONDS,
            floating_ips: true,
            ..Options::default()
        };
        let cloud = OpenStack::start(options).await?;
        println!(
            "Keystone and Neutron answered after {:?}",
            cloud.servers().startup
        );
        Cluster::start_local_with(Box::new(cloud)).await
    })
}

async fn env() -> Env {
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let openstack = cluster
        .cloud::<OpenStack>()
        .expect("the local system runs on OpenStack");
    let servers = openstack.servers();
    let api = servers.api(&servers.member).await.unwrap();
    static NETWORK: OnceCell<Network> = OnceCell::const_new();
    let network = NETWORK
        .get_or_init(|| async {
            let id = api.create("network", json!({"name": "e2e"})).await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned();
            let v4_subnet = api
                .create(
                    "subnet",
                    // Servers' own addresses come from the low part only, so they never
                    // collide with the egress IPs the tests pick at .150 and above.
                    json!({"network_id": id, "ip_version": 4, "cidr": "10.20.0.0/24",
                           "allocation_pools": [{"start": "10.20.0.2", "end": "10.20.0.99"}]}),
                )
                .await
                .unwrap();
            let v6_subnet = api
                .create(
                    "subnet",
                    json!({"network_id": id, "ip_version": 6, "cidr": "fd00:20::/64",
                           "allocation_pools": [{"start": "fd00:20::1", "end": "fd00:20::ffff"}]}),
                )
                .await
                .unwrap();
            Network {
                id,
                v4_subnet,
                v6_subnet,
                v4: "10.20.0.0/24".parse().unwrap(),
                v6: "fd00:20::/64".parse().unwrap(),
            }
        })
        .await
        .clone();
    Env {
        client: cluster.client().await.unwrap(),
        cluster,
        openstack,
        api,
        network,
    }
}

impl Env {
    /// A new server port with one address of each family, and its Node `name`; `pairs` are
    /// allowed-address-pairs already on it that no object manages.
    async fn vm_with(&self, name: &str, pairs: &[IpAddr]) -> Vm {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let server = format!(
            "{:08x}-e2e0-4000-8000-{:012x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let pairs: Vec<Value> = pairs
            .iter()
            .map(|ip| json!({"ip_address": ip.to_string()}))
            .collect();
        let port = self
            .api
            .create(
                "port",
                json!({"network_id": self.network.id, "device_id": server,
                       "device_owner": "compute:nova", "name": name,
                       "fixed_ips": [{"subnet_id": self.network.v4_subnet["id"]},
                                     {"subnet_id": self.network.v6_subnet["id"]}],
                       "allowed_address_pairs": pairs}),
            )
            .await
            .unwrap();
        let v4: IpAddr = port["fixed_ips"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["ip_address"].as_str()?.parse::<IpAddr>().ok())
            .find(IpAddr::is_ipv4)
            .unwrap();
        plugin::register_node(&self.client, name, &format!("openstack:///{server}"), v4)
            .await
            .unwrap();
        Vm {
            server,
            port: port["id"].as_str().unwrap().to_owned(),
            v4,
        }
    }

    async fn vm(&self, name: &str) -> Vm {
        self.vm_with(name, &[]).await
    }

    /// The allowed-address-pairs of `ports`, read in one Neutron call: one consistent snapshot.
    async fn pairs_of(&self, ports: &[&str]) -> Vec<BTreeSet<IpAddr>> {
        let query: Vec<String> = ports.iter().map(|p| format!("id={p}")).collect();
        let (status, body) = self
            .api
            .neutron("GET", &format!("/ports?{}", query.join("&")), None)
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let listed = body["ports"].as_array().unwrap();
        ports
            .iter()
            .map(|id| {
                let port = listed
                    .iter()
                    .find(|p| p["id"] == *id)
                    .unwrap_or_else(|| panic!("port {id} not listed: {body}"));
                port["allowed_address_pairs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["ip_address"].as_str().unwrap().parse().unwrap())
                    .collect()
            })
            .collect()
    }

    async fn pairs(&self, port: &str) -> BTreeSet<IpAddr> {
        self.pairs_of(&[port]).await.remove(0)
    }

    /// The ports holding `ip` as a fixed address on the suite's network.
    async fn holders(&self, ip: IpAddr) -> Vec<Value> {
        self.holders_on(&self.network.id, ip).await
    }

    /// The ports holding `ip` as a fixed address on `network`.
    async fn holders_on(&self, network: &str, ip: IpAddr) -> Vec<Value> {
        let filter = format!("ip_address={ip}")
            .replace('=', "%3D")
            .replace(':', "%3A");
        let (status, body) = self
            .api
            .neutron(
                "GET",
                &format!("/ports?network_id={network}&fixed_ips={filter}"),
                None,
            )
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        body["ports"].as_array().unwrap().clone()
    }

    fn v4(&self, host: u8) -> IpAddr {
        let mut octets = self.network.v4.network().octets();
        octets[3] = host;
        IpAddr::from(octets)
    }

    fn v6(&self, host: u16) -> IpAddr {
        let mut segments = self.network.v6.network().segments();
        segments[6] = 0xe2e;
        segments[7] = host;
        IpAddr::from(segments)
    }

    fn fail(&self, e: anyhow::Error) -> ! {
        panic!("{e:#}\n{}", self.cluster.diagnostics())
    }

    /// The external network floating IPs come from, with the suite's IPv4 subnet routed to it
    /// (made once).
    async fn external(&self) -> String {
        static EXTERNAL: OnceCell<String> = OnceCell::const_new();
        EXTERNAL
            .get_or_init(|| async {
                let servers = self.openstack.servers();
                let admin = servers.api(&servers.admin).await.unwrap();
                let subnet = self.network.v4_subnet["id"].as_str().unwrap();
                route_to_external(&admin, &self.api, "e2e-public", "100.64.20.0/24", subnet)
                    .await
                    .unwrap()
            })
            .await
            .clone()
    }

    async fn annotated(&self, node: &str) -> Vec<cloudnet_shared::EgressIpConfig> {
        plugin::wait_annotation(&self.client, node)
            .await
            .unwrap_or_else(|e| self.fail(e))
    }
}

fn name(ip: IpAddr) -> String {
    encode_name(ip).unwrap()
}

/// The route of a `PUT` of one port at the fault proxy.
fn port_update(port: &str) -> String {
    format!("PUT /v2.0/ports/{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_annotations_match_neutron_and_a_port_full_of_pairs_reads_zero() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let plain = env.vm("os-annotated").await;
    let unmanaged: Vec<IpAddr> = (150..160).map(|h| env.v4(h)).collect();
    let full = env.vm_with("os-annotated-full", &unmanaged).await;

    for (node, vm, capacity) in [
        ("os-annotated", &plain, 10),
        ("os-annotated-full", &full, 0),
    ] {
        let annotation = env.annotated(node).await;
        assert_eq!(annotation.len(), 1, "{node}: {annotation:?}");
        let config = &annotation[0];
        assert_eq!(config.interface, vm.port, "{node}: the server's port");
        assert_eq!(config.ifaddr.ipv4, Some(env.network.v4), "{node}: IPv4");
        assert_eq!(config.ifaddr.ipv6, Some(env.network.v6), "{node}: IPv6");
        assert_eq!(
            config.capacity.ip,
            Some(capacity),
            "{node}: 10 pairs minus the ones no object manages"
        );
        assert_eq!(config.capacity.ipv4, None, "{node}: one shared bucket");
        assert_eq!(config.capacity.ipv6, None, "{node}: one shared bucket");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_get_a_reservation_port_and_a_pair_and_deletes_remove_both_and_the_finalizer() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.vm("os-assign").await;
    env.annotated("os-assign").await;
    let ips = [env.v4(200), env.v6(0x10)];

    for ip in ips {
        plugin::create(&env.client, &name(ip), "os-assign")
            .await
            .unwrap();
    }
    for ip in ips {
        plugin::wait_assigned(&env.client, &name(ip), "os-assign")
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    let pairs = env.pairs(&vm.port).await;
    for ip in ips {
        assert!(
            pairs.contains(&ip),
            "{ip} not a pair of {}: {pairs:?}",
            vm.port
        );
        let holders = env.holders(ip).await;
        assert_eq!(holders.len(), 1, "{ip}: {holders:?}");
        assert_eq!(holders[0]["device_owner"], "OpenShiftEgressIP");
        assert_eq!(
            holders[0]["device_id"],
            format!("OpenShiftEgressIP_{}", vm.server)
        );
        assert_eq!(holders[0]["name"], format!("egressip-{ip}"));
    }

    for ip in ips {
        plugin::delete(&env.client, &name(ip)).await.unwrap();
    }
    for ip in ips {
        plugin::wait_gone(&env.client, &name(ip))
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    let pairs = env.pairs(&vm.port).await;
    for ip in ips {
        assert!(!pairs.contains(&ip), "{ip} still a pair: {pairs:?}");
        assert!(env.holders(ip).await.is_empty(), "{ip} still reserved");
    }
    let holders = env.holders(vm.v4).await;
    assert_eq!(holders.len(), 1, "the server's own address is untouched");
    assert_eq!(holders[0]["id"], vm.port.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_never_allows_the_ip_on_two_ports_and_keeps_its_reservation_port() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let from = env.vm("os-move-from").await;
    let to = env.vm("os-move-to").await;
    for node in ["os-move-from", "os-move-to"] {
        env.annotated(node).await;
    }
    let ips = [env.v4(201), env.v6(0x20)];
    for ip in ips {
        plugin::create(&env.client, &name(ip), "os-move-from")
            .await
            .unwrap();
        plugin::wait_assigned(&env.client, &name(ip), "os-move-from")
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    let mut reservations = Vec::new();
    for ip in ips {
        let holders = env.holders(ip).await;
        assert_eq!(holders.len(), 1, "{ip}: {holders:?}");
        reservations.push(holders[0]["id"].clone());
    }

    // Slow both ports' updates down so the polls see the move in flight, not just its end.
    let proxy = env.cluster.proxy().unwrap();
    for port in [&from.port, &to.port] {
        proxy.set_rule(
            RouteMatch::exact(port_update(port)),
            Rule::PASS.with_latency(Duration::from_millis(300)),
        );
    }
    for ip in ips {
        plugin::retarget(&env.client, &name(ip), "os-move-to")
            .await
            .unwrap();
    }
    let objects = plugin::objects(&env.client);
    let mut polls = 0u32;
    let moved = wait::until(plugin::STEP, "both IPs moved to os-move-to", || {
        polls += 1;
        let (env, objects, from, to) = (&env, &objects, &from, &to);
        async move {
            let snapshot = env.pairs_of(&[&from.port, &to.port]).await;
            let (on_from, on_to) = (&snapshot[0], &snapshot[1]);
            for ip in ips {
                anyhow::ensure!(
                    !(on_from.contains(&ip) && on_to.contains(&ip)),
                    "{ip} is allowed on both {} and {} at once",
                    from.port,
                    to.port
                );
            }
            let mut done = ips
                .iter()
                .all(|ip| on_to.contains(ip) && !on_from.contains(ip));
            for ip in ips {
                let obj = objects.get(&name(ip)).await?;
                done &= obj.is_assigned() && obj.status_node() == Some("os-move-to");
            }
            Ok(done)
        }
    })
    .await;
    for port in [&from.port, &to.port] {
        proxy.set_rule(RouteMatch::exact(port_update(port)), Rule::PASS);
    }
    moved.unwrap_or_else(|e| env.fail(e));
    println!("move observed over {polls} polls of both ports, never on both");
    for (ip, reservation) in ips.iter().zip(&reservations) {
        let holders = env.holders(*ip).await;
        assert_eq!(holders.len(), 1, "{ip}: {holders:?}");
        assert_eq!(
            &holders[0]["id"], reservation,
            "{ip}: the move keeps the reservation port"
        );
        assert_eq!(
            holders[0]["device_id"],
            format!("OpenShiftEgressIP_{}", to.server)
        );
    }

    for ip in ips {
        plugin::delete(&env.client, &name(ip)).await.unwrap();
        plugin::wait_gone(&env.client, &name(ip))
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    let on_to = env.pairs(&to.port).await;
    assert!(ips.iter().all(|ip| !on_to.contains(ip)), "{on_to:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ip_out_of_subnet_neutrons_reserved_addresses_and_full_node_are_denied_without_neutron_mutation()
 {
    let _exclusive = SUITE.write().await;
    let env = env().await;
    let roomy = env.vm("os-deny").await;
    let unmanaged: Vec<IpAddr> = (160..170).map(|h| env.v4(h)).collect();
    env.vm_with("os-deny-full", &unmanaged).await;
    for node in ["os-deny", "os-deny-full"] {
        env.annotated(node).await;
    }
    let nodes = KubeApi::<Node>::all(env.client.clone());
    let mut snapshot = ClusterSnapshot::new();
    for node in ["os-deny", "os-deny-full"] {
        snapshot.upsert_node(NodeInfo::from_node(&nodes.get(node).await.unwrap()));
    }
    // The reserved addresses as real Neutron reports the subnet: its gateway, and the network
    // and broadcast addresses of its CIDR.
    let subnet = &env.network.v4_subnet;
    let gateway: IpAddr = subnet["gateway_ip"].as_str().unwrap().parse().unwrap();
    let requests = [
        ("node IP", roomy.v4, "os-deny", "node_ip"),
        (
            "out of subnet",
            "10.99.0.10".parse().unwrap(),
            "os-deny",
            "address_index",
        ),
        ("Neutron's gateway", gateway, "os-deny", "address_index"),
        (
            "network address",
            IpAddr::V4(env.network.v4.network()),
            "os-deny",
            "address_index",
        ),
        (
            "broadcast address",
            IpAddr::V4(env.network.v4.broadcast()),
            "os-deny",
            "address_index",
        ),
        ("full node", env.v4(202), "os-deny-full", "capacity"),
    ];
    let mutations_before = env.cluster.cloud_mutations();

    for (what, ip, node, rule) in requests {
        let ip_name = name(ip);
        let expected = review(
            Operation::Create,
            Some(ObjectView {
                name: &ip_name,
                spec_node: node,
            }),
            None,
            &snapshot,
            Some(Platform::OpenStack),
        )
        .denial
        .unwrap_or_else(|| panic!("{what}: the rules themselves allow {ip} on {node}"));
        assert_eq!(expected.rule.as_str(), rule, "{what}");
        let message = plugin::webhook_denial(plugin::create(&env.client, &ip_name, node).await)
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert!(
            message.contains(&expected.message),
            "{what}: {message:?} lacks the rules' message {:?}",
            expected.message
        );
        println!("{what}: {message}");
        assert!(
            plugin::objects(&env.client)
                .get_opt(&ip_name)
                .await
                .unwrap()
                .is_none(),
            "{what}: a denied object must not exist"
        );
    }
    assert_eq!(
        env.cluster.cloud_mutations(),
        mutations_before,
        "denied requests must cause no Neutron mutation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_racing_on_the_ports_revision_keeps_its_pair_and_the_ip_is_still_attached()
{
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.vm("os-race").await;
    env.annotated("os-race").await;
    let proxy = env.cluster.proxy().unwrap();
    let route = port_update(&vm.port);
    // The reconciler's update is held at the proxy, with the revision it read, until the other
    // writer is done (a fixed delay lost the race to a slow Neutron on a loaded machine)...
    proxy.hold(RouteMatch::exact(&route));
    let before = proxy.counts(&route).forwarded;
    let ip = env.v4(203);
    plugin::create(&env.client, &name(ip), "os-race")
        .await
        .unwrap();
    wait::until(plugin::STEP, "the reconciler's port update", || async {
        Ok(proxy.held_now() > 0)
    })
    .await
    .unwrap_or_else(|e| env.fail(e));
    // ... while another writer updates the port under its own If-Match: it wins the race.
    let theirs = env.v4(170);
    let port = env.api.port(&vm.port).await.unwrap();
    let mut pairs = port["allowed_address_pairs"].as_array().unwrap().clone();
    pairs.push(json!({"ip_address": theirs.to_string()}));
    let (status, body) = env
        .api
        .put_if(
            &format!("/ports/{}", vm.port),
            port["revision_number"].as_u64().unwrap(),
            &json!({"port": {"allowed_address_pairs": pairs}}),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");

    assert!(proxy.release_held() > 0, "the reconciler's update was held");
    plugin::wait_assigned(&env.client, &name(ip), "os-race")
        .await
        .unwrap_or_else(|e| env.fail(e));
    let updates = proxy.counts(&route).forwarded - before;
    assert!(
        updates >= 2,
        "the stale update (412) and its retry after a re-read: {updates} update(s)"
    );
    let pairs = env.pairs(&vm.port).await;
    assert!(pairs.contains(&ip), "ours: {pairs:?}");
    assert!(pairs.contains(&theirs), "the other writer's: {pairs:?}");
    println!("{updates} updates of the port for one attach raced by another writer");

    plugin::delete(&env.client, &name(ip)).await.unwrap();
    plugin::wait_gone(&env.client, &name(ip))
        .await
        .unwrap_or_else(|e| env.fail(e));
    let pairs = env.pairs(&vm.port).await;
    assert_eq!(
        pairs,
        BTreeSet::from([theirs]),
        "the delete leaves the other writer's pair"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_held_by_someone_elses_port_is_refused_with_a_clear_condition_and_no_change() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.vm("os-foreign").await;
    env.annotated("os-foreign").await;
    let ip = env.v4(204);
    let foreign = env
        .api
        .create(
            "port",
            json!({"network_id": env.network.id, "name": "someone-elses",
                   "fixed_ips": [{"subnet_id": env.network.v4_subnet["id"], "ip_address": ip.to_string()}]}),
        )
        .await
        .unwrap();
    let foreign_id = foreign["id"].as_str().unwrap();
    let proxy = env.cluster.proxy().unwrap();
    let updates_before = proxy.counts(&port_update(&vm.port)).total();

    plugin::create(&env.client, &name(ip), "os-foreign")
        .await
        .unwrap();
    let objects = plugin::objects(&env.client);
    let message = wait::found(plugin::STEP, "the refusal in the condition", || {
        let objects = objects.clone();
        async move {
            let obj = objects.get(&name(ip)).await?;
            Ok(obj
                .assigned_condition()
                .filter(|c| c.status == "False" && c.reason == "CloudResponseError")
                .map(|c| c.message.clone()))
        }
    })
    .await
    .unwrap_or_else(|e| env.fail(e));
    println!("condition: {message}");
    assert!(message.contains(foreign_id), "{message}");
    assert!(
        message.contains("not an egress IP reservation"),
        "{message}"
    );

    assert!(env.pairs(&vm.port).await.is_empty(), "no pair added");
    assert_eq!(
        proxy.counts(&port_update(&vm.port)).total(),
        updates_before,
        "the server's port was not updated"
    );
    let now = env.api.port(foreign_id).await.unwrap();
    assert_eq!(
        now["revision_number"], foreign["revision_number"],
        "the other port is untouched"
    );
    assert_eq!(now["device_id"], foreign["device_id"]);

    plugin::delete(&env.client, &name(ip)).await.unwrap();
    plugin::wait_gone(&env.client, &name(ip))
        .await
        .unwrap_or_else(|e| env.fail(e));
    let holders = env.holders(ip).await;
    assert_eq!(holders.len(), 1, "the delete leaves the other port alone");
    assert_eq!(holders[0]["id"], foreign_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keystone_token_expiring_mid_run_is_replaced_and_the_next_attach_succeeds() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.vm("os-token").await;
    env.annotated("os-token").await;
    let first = env.v4(205);
    plugin::create(&env.client, &name(first), "os-token")
        .await
        .unwrap();
    plugin::wait_assigned(&env.client, &name(first), "os-token")
        .await
        .unwrap_or_else(|e| env.fail(e));
    let issued = env.openstack.tokens_issued();
    assert!(
        issued >= 1,
        "the reconciler authenticated through the proxy"
    );

    // A token issued after the reconciler's: once Neutron refuses it, the reconciler's token
    // has expired too.
    let servers = env.openstack.servers();
    let probe = servers.api(&servers.member).await.unwrap().frozen();
    let started = Instant::now();
    wait::until(
        Duration::from_secs(u64::from(TOKEN_SECONDS) * 3),
        "a token issued now to expire",
        || {
            let probe = probe.clone();
            async move { Ok(probe.neutron("GET", "/networks", None).await?.0 == 401) }
        },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    println!("a fresh token was refused after {:?}", started.elapsed());

    let second = env.v4(206);
    plugin::create(&env.client, &name(second), "os-token")
        .await
        .unwrap();
    plugin::wait_assigned(&env.client, &name(second), "os-token")
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert!(
        env.openstack.tokens_issued() > issued,
        "the reconciler asked Keystone for a new token ({} then {})",
        issued,
        env.openstack.tokens_issued()
    );
    let pairs = env.pairs(&vm.port).await;
    assert!(
        pairs.contains(&first) && pairs.contains(&second),
        "{pairs:?}"
    );
    for ip in [first, second] {
        plugin::delete(&env.client, &name(ip)).await.unwrap();
        plugin::wait_gone(&env.client, &name(ip))
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_away_from_a_deleted_server_converges_and_keeps_the_reservation_port() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let gone = env.vm("os-failover-from").await;
    let live = env.vm("os-failover-to").await;
    for node in ["os-failover-from", "os-failover-to"] {
        env.annotated(node).await;
    }
    let ip = env.v4(207);
    plugin::create(&env.client, &name(ip), "os-failover-from")
        .await
        .unwrap();
    plugin::wait_assigned(&env.client, &name(ip), "os-failover-from")
        .await
        .unwrap_or_else(|e| env.fail(e));
    let reservation = env.holders(ip).await[0]["id"].clone();

    // The server is deleted: Nova removes its port (with its own admin credentials), the cloud
    // provider removes its Node, and the network plugin moves the IP to a live node.
    let servers = env.openstack.servers();
    let admin = servers.api(&servers.admin).await.unwrap();
    let (status, body) = admin
        .neutron("DELETE", &format!("/ports/{}", gone.port), None)
        .await
        .unwrap();
    assert_eq!(status, 204, "{body}");
    KubeApi::<Node>::all(env.client.clone())
        .delete("os-failover-from", &Default::default())
        .await
        .unwrap();
    let started = Instant::now();
    plugin::retarget(&env.client, &name(ip), "os-failover-to")
        .await
        .unwrap();
    plugin::wait_assigned(&env.client, &name(ip), "os-failover-to")
        .await
        .unwrap_or_else(|e| env.fail(e));
    println!("moved off the deleted server in {:?}", started.elapsed());
    assert!(env.pairs(&live.port).await.contains(&ip));
    let holders = env.holders(ip).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(
        holders[0]["id"], reservation,
        "the reservation port is kept"
    );
    assert_eq!(
        holders[0]["device_id"],
        format!("OpenShiftEgressIP_{}", live.server)
    );

    plugin::delete(&env.client, &name(ip)).await.unwrap();
    plugin::wait_gone(&env.client, &name(ip))
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert!(env.holders(ip).await.is_empty(), "the address is freed");
}

/// Issue 28: the instance annotation a user can write names another server; the delete still
/// takes the pair and reservation port off the server the reconciler recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_instance_annotation_never_decides_which_server_is_called() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.vm("os-forged").await;
    let other = env.vm("os-forged-other").await;
    env.annotated("os-forged").await;
    env.annotated("os-forged-other").await;
    let ip = env.v4(210);
    plugin::delete_with_forged_instance(&env.client, &name(ip), "os-forged", &other.server)
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert!(
        !env.pairs(&vm.port).await.contains(&ip),
        "left on the recorded server"
    );
    assert!(env.holders(ip).await.is_empty(), "{ip} still reserved");
    assert!(!env.pairs(&other.port).await.contains(&ip));
}

/// Issue 30: on a server with two ports, the egress IPs go on the port whose subnet holds the
/// node's first InternalIP, as upstream picks it: the annotation names that port, an attach lands
/// there and the detach takes it off there. The node's address is on the port that the first
/// `compute:` port (by creation, then id) is not, so the test tells the two rules apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_port_server_carries_egress_ips_on_the_port_of_the_nodes_internal_ip() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let other_network = env
        .api
        .create("network", json!({"name": "e2e-second-port"}))
        .await
        .unwrap();
    let other_subnet = env
        .api
        .create(
            "subnet",
            json!({"network_id": other_network["id"], "ip_version": 4, "cidr": "10.21.0.0/24",
                   "allocation_pools": [{"start": "10.21.0.2", "end": "10.21.0.99"}]}),
        )
        .await
        .unwrap();
    let server = format!("{:08x}-e2e2-4000-8000-000000000001", std::process::id());
    let mut ports = Vec::new();
    for (network, subnet) in [
        (env.network.id.as_str(), &env.network.v4_subnet),
        (other_network["id"].as_str().unwrap(), &other_subnet),
    ] {
        let port = env
            .api
            .create(
                "port",
                json!({"network_id": network, "device_id": server, "device_owner": "compute:nova",
                       "fixed_ips": [{"subnet_id": subnet["id"]}]}),
            )
            .await
            .unwrap();
        ports.push((port, subnet["cidr"].as_str().unwrap().to_owned()));
    }
    let key = |p: &Value| (p["created_at"].to_string(), p["id"].to_string());
    ports.sort_by_key(|(p, _)| key(p));
    let [(first, _), (chosen, cidr)] = <[(Value, String); 2]>::try_from(ports).unwrap();
    let address = |p: &Value| -> IpAddr {
        p["fixed_ips"][0]["ip_address"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (first_id, chosen_id) = (
        first["id"].as_str().unwrap(),
        chosen["id"].as_str().unwrap(),
    );
    plugin::register_node(
        &env.client,
        "os-two-ports",
        &format!("openstack:///{server}"),
        address(&chosen),
    )
    .await
    .unwrap();

    let annotation = env.annotated("os-two-ports").await;
    assert_eq!(annotation.len(), 1, "{annotation:?}");
    assert_eq!(
        annotation[0].interface, chosen_id,
        "the port of the node's InternalIP, not the first port {first_id}"
    );
    let cidr: Ipv4Net = cidr.parse().unwrap();
    assert_eq!(annotation[0].ifaddr.ipv4, Some(cidr));

    let mut octets = cidr.network().octets();
    octets[3] = 220;
    let ip = IpAddr::from(octets);
    plugin::create(&env.client, &name(ip), "os-two-ports")
        .await
        .unwrap();
    plugin::wait_assigned(&env.client, &name(ip), "os-two-ports")
        .await
        .unwrap_or_else(|e| env.fail(e));
    let pairs = env.pairs_of(&[chosen_id, first_id]).await;
    assert!(pairs[0].contains(&ip), "{ip} on {chosen_id}: {pairs:?}");
    assert!(pairs[1].is_empty(), "nothing on {first_id}: {pairs:?}");
    let network = chosen["network_id"].as_str().unwrap();
    assert_eq!(env.holders_on(network, ip).await.len(), 1, "reserved once");

    plugin::delete(&env.client, &name(ip)).await.unwrap();
    plugin::wait_gone(&env.client, &name(ip))
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert!(!env.pairs(chosen_id).await.contains(&ip), "taken off again");
    assert!(
        env.holders_on(network, ip).await.is_empty(),
        "the address is freed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_floating_ip_sits_on_the_reservation_port_across_a_move_with_one_association_and_is_kept_when_unbound()
 {
    // A failure bound, not a speed measure: the reconciler looks for the CRD every 30 s.
    const WITHIN: Duration = Duration::from_secs(240);
    let _shared = SUITE.read().await;
    let env = env().await;
    public_ips::ensure_crd(&env.client).await.unwrap();
    let external = env.external().await;
    let from = env.vm("os-public-from").await;
    let to = env.vm("os-public-to").await;
    env.annotated("os-public-from").await;
    env.annotated("os-public-to").await;
    let ip = env.v4(220);
    plugin::create(&env.client, &name(ip), "os-public-from")
        .await
        .unwrap();
    plugin::wait_assigned(&env.client, &name(ip), "os-public-from")
        .await
        .unwrap_or_else(|e| env.fail(e));
    let reservation = env.holders(ip).await[0]["id"].as_str().unwrap().to_owned();
    let fip = floating_ip(&env.api, &external, &[MARKER_PLAIN])
        .await
        .unwrap();
    let updates = floating_ip_update(&fip);
    let proxy = env.cluster.proxy().unwrap();
    public_ips::bind(&env.client, "os-public", ip, &fip)
        .await
        .unwrap();

    // Bind: on the egress IP's reservation port, with the egress IP as its fixed address.
    let (api, fip_id, port) = (&env.api, fip.as_str(), reservation.as_str());
    let on_reservation = move || async move {
        let shown = show_floating_ip(api, fip_id).await?;
        Ok::<_, anyhow::Error>(
            shown["port_id"] == port && shown["fixed_ip_address"] == ip.to_string(),
        )
    };
    let status = public_ips::wait_reason(
        &env.client,
        "os-public",
        "Associated",
        Some("os-public-from"),
        WITHIN,
        on_reservation,
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    assert_eq!(status.interface, from.port, "{status:?}");
    assert!(!status.association_id.is_empty(), "{status:?}");
    assert_eq!(proxy.counts(&updates).forwarded, 1, "one association");
    let calls = public_ips::associations(env.cluster).await.unwrap();

    // Move, as OVN-Kubernetes does: the same object's spec.node. The reservation port is
    // re-pointed and keeps the floating IP, so the binding follows without a call.
    let followed = public_ips::follow_move(
        &env.client,
        &name(ip),
        "os-public",
        "os-public-to",
        WITHIN,
        on_reservation,
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    println!(
        "OpenStack follow time: {:?} from the egress IP seen attached on the new node, {:?} from the move's patch",
        followed.after_attach, followed.after_patch
    );
    let status = followed.status;
    assert_eq!(status.interface, to.port, "{status:?}");
    let holders = env.holders(ip).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0]["id"], reservation.as_str());
    assert_eq!(
        holders[0]["device_id"],
        format!("OpenShiftEgressIP_{}", to.server)
    );
    assert_eq!(
        proxy.counts(&updates).forwarded,
        1,
        "a move needs no second association"
    );
    assert_eq!(
        public_ips::associations(env.cluster).await.unwrap(),
        calls,
        "the floating IP serves the egress IP on the new node without an association call"
    );

    // Delete: the floating IP taken off the port and still allocated; the egress IP stays.
    public_ips::unbind(&env.client, "os-public", WITHIN, move || async move {
        Ok(show_floating_ip(api, fip_id).await?["port_id"].is_null())
    })
    .await
    .unwrap_or_else(|e| env.fail(e));
    let shown = show_floating_ip(&env.api, &fip).await.unwrap();
    assert!(shown["floating_ip_address"].is_string(), "{shown}");
    assert_eq!(proxy.counts(&updates).forwarded, 2, "one disassociation");
    assert!(env.pairs(&to.port).await.contains(&ip));
    plugin::delete(&env.client, &name(ip)).await.unwrap();
    plugin::wait_gone(&env.client, &name(ip))
        .await
        .unwrap_or_else(|e| env.fail(e));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_antrea_egress_ip_becomes_a_pair_of_antreas_node_and_moves_with_it() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let a = env.vm("os-antrea-a").await;
    let b = env.vm("os-antrea-b").await;
    let ip = env.v4(230);
    crate::antrea::start_front_end(&env.client).await;
    crate::antrea::an_egress_ip_follows_antrea(
        &env.client,
        "openstack",
        ip,
        ["os-antrea-a", "os-antrea-b"],
        |node| {
            env.pairs(if node == "os-antrea-a" {
                &a.port
            } else {
                &b.port
            })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_gateway_follows_its_live_agent_as_pairs_and_on_the_interface() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let a = env.vm("os-gw-a").await;
    let b = env.vm("os-gw-b").await;
    crate::gateway::a_gateway_follows_its_live_agent(
        &env.client,
        "openstack",
        &[env.v4(240), env.v6(0x240)],
        ["os-gw-a", "os-gw-b"],
        crate::gateway::Cilium::Skip,
        |node| env.pairs(if node == "os-gw-a" { &a.port } else { &b.port }),
    )
    .await;
}
