#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The whole system end to end on Azure: the ARM fake (every NIC PUT checked against the
//! NetworkInterface schema of 2024-03-01, etags, asynchronous operations with `Retry-After`)
//! behind the fault proxy, the webhook and the reconciler with `--platform-type=Azure`, played as
//! a network plugin would, with the NICs' ip-configurations read back from the fake after every
//! step.
//!
//! Tests run in parallel on their own VMs and addresses; the tests that assert exact mutation
//! counts or set proxy rules take the suite lock exclusively. Each test ends by asserting the
//! fake saw no PUT that departs from the schema.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use cloudnet_e2e::fakes::arm::{config_ip, configs};
use cloudnet_e2e::fakes::faultproxy::{RouteMatch, Rule};
use cloudnet_e2e::harness::e2e::arm::{Arm, ArmVm, OPERATION_TIME, RETRY_AFTER_SECS};
use cloudnet_e2e::harness::e2e::{Cluster, plugin, public_ips, wait};
use cloudnet_shared::public_ip::EgressPublicIP;
use cloudnet_shared::{
    ClusterSnapshot, NodeInfo, ObjectView, Operation, Platform, encode_name, review,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::RwLock;

/// Shared by the tests that only touch their own VMs; taken exclusively by the counting tests.
static SUITE: RwLock<()> = RwLock::const_new(());
/// The same for the public-address tests' cluster; taken exclusively by the test that takes a
/// permission back from the whole fake.
static PUBLIC: RwLock<()> = RwLock::const_new(());

/// The opt-in permissions of public IPs (docs/clouds/azure.md).
const PUBLIC_READ: &str = "Microsoft.Network/publicIPAddresses/read";
const PUBLIC_JOIN: &str = "Microsoft.Network/publicIPAddresses/join/action";
/// The public-address cluster's drift period: short, so a test sees several pass.
const DRIFT_SECONDS: u64 = 3;
/// A failure bound for a binding to reach a state, not a speed measure: the reconciler looks for
/// the CRD every 30 s, and a loaded machine is slow.
const BINDING_WITHIN: Duration = Duration::from_secs(240);

struct Env {
    cluster: &'static Cluster,
    client: Client,
}

async fn env() -> Env {
    env_of(|| {
        Cluster::shared_with(module_path!(), || async {
            Cluster::start_local_with(Box::new(Arm::start().await?)).await
        })
    })
    .await
}

/// The system of the public-address tests: a cluster of its own, whose role grants public IP
/// read and join and whose reconciler checks for drift every [`DRIFT_SECONDS`].
async fn public_env() -> Env {
    let env = env_of(|| {
        Cluster::shared_with(concat!(module_path!(), "::public"), || async {
            let flags = vec![format!("--drift-period={DRIFT_SECONDS}")];
            let arm = Arm::start_with(&[PUBLIC_READ, PUBLIC_JOIN], flags).await?;
            Cluster::start_local_with(Box::new(arm)).await
        })
    })
    .await;
    public_ips::ensure_crd(&env.client).await.unwrap();
    env
}

async fn env_of(cluster: fn() -> &'static Cluster) -> Env {
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    Env {
        client: cluster.client().await.unwrap(),
        cluster,
    }
}

impl Env {
    fn arm(&self) -> &Arm {
        self.cluster
            .cloud::<Arm>()
            .expect("the Azure suite runs locally")
    }

    /// Registers `vm`'s Node and waits until the reconciler has annotated it.
    async fn join(&self, vm: &ArmVm) {
        plugin::register_node(
            &self.client,
            vm.name(),
            &vm.ids.provider_id,
            IpAddr::V4(vm.primary_ip),
        )
        .await
        .unwrap();
        plugin::wait_annotation(&self.client, vm.name())
            .await
            .unwrap_or_else(|e| self.fail(e));
    }

    /// A new VM and its Node `name`, once the reconciler has annotated it.
    async fn node(&self, name: &str) -> ArmVm {
        let vm = self.arm().add_vm(name).unwrap();
        self.join(&vm).await;
        vm
    }

    /// The secondary addresses of one VM's NIC.
    fn on(&self, vm: &ArmVm) -> BTreeSet<IpAddr> {
        self.arm().addresses(&[vm]).remove(0)
    }

    /// Address `host` of the /24 numbered `block` in the subnet (VMs use the top /24).
    fn ip(&self, block: u8, host: u8) -> IpAddr {
        let base = u32::from(self.arm().range().network());
        IpAddr::V4(Ipv4Addr::from(
            base | (u32::from(block) << 8) | u32::from(host),
        ))
    }

    fn mutations(&self) -> u64 {
        self.cluster.cloud_mutations().unwrap()
    }

    /// The ip-configuration of `vm`'s NIC holding `ip`.
    fn config(&self, vm: &ArmVm, ip: IpAddr) -> Value {
        let nic = self.arm().fake().nic(&vm.ids.nic).unwrap();
        configs(&nic)
            .into_iter()
            .find(|c| config_ip(c) == Some(ip))
            .unwrap_or_else(|| panic!("no ip-configuration holds {ip}: {nic}"))
    }

    /// Adds an ip-configuration no object manages, as another tool would.
    fn add_foreign_config(&self, vm: &ArmVm, name: &str, ip: IpAddr) {
        let subnet = self.config(vm, IpAddr::V4(vm.primary_ip))["properties"]["subnet"].clone();
        self.arm().fake().edit_nic(&vm.ids.nic, |doc| {
            if let Some(list) = doc["properties"]["ipConfigurations"].as_array_mut() {
                list.push(json!({
                    "name": name,
                    "properties": {
                        "privateIPAddress": ip.to_string(),
                        "privateIPAllocationMethod": "Static",
                        "privateIPAddressVersion": "IPv4",
                        "primary": false,
                        "subnet": subnet,
                    }
                }));
            }
        });
    }

    fn assert_schema_clean(&self) {
        assert_eq!(self.arm().fake().schema_violations(), Vec::<String>::new());
    }

    fn fail(&self, e: anyhow::Error) -> ! {
        panic!("{e:#}\n{}", self.cluster.diagnostics())
    }

    async fn assign(&self, ips: &[IpAddr], node: &str) {
        for ip in ips {
            plugin::create(&self.client, &name(*ip), node)
                .await
                .unwrap();
        }
        for ip in ips {
            plugin::wait_assigned(&self.client, &name(*ip), node)
                .await
                .unwrap_or_else(|e| self.fail(e));
        }
    }

    async fn release(&self, ips: &[IpAddr]) {
        for ip in ips {
            plugin::delete(&self.client, &name(*ip)).await.unwrap();
        }
        for ip in ips {
            plugin::wait_gone(&self.client, &name(*ip))
                .await
                .unwrap_or_else(|e| self.fail(e));
        }
    }
}

fn name(ip: IpAddr) -> String {
    encode_name(ip).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_names_the_nic_both_prefixes_and_256_minus_unmanaged_configurations() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let arm = env.arm();
    let vm = arm.add_vm("az-annotated").unwrap();
    // Two ip-configurations another tool put there before the node joined.
    env.add_foreign_config(&vm, "other-1", env.ip(1, 200));
    env.add_foreign_config(&vm, "other-2", env.ip(1, 201));
    env.join(&vm).await;
    let annotation = plugin::wait_annotation(&env.client, "az-annotated")
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert_eq!(annotation.len(), 1, "{annotation:?}");
    let config = &annotation[0];
    assert_eq!(config.interface, "az-annotated-nic");
    assert_eq!(config.ifaddr.ipv4, Some(arm.range()));
    assert_eq!(config.ifaddr.ipv6, Some(arm.range_v6()));
    assert_eq!(
        config.capacity.ip,
        Some(253),
        "256 per NIC minus the primary and 2 unmanaged configurations"
    );
    assert_eq!((config.capacity.ipv4, config.capacity.ipv6), (None, None));
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_become_static_secondary_configurations_put_with_the_etag_and_leave_on_delete() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.node("az-assign").await;
    let ips = [env.ip(2, 10), env.ip(2, 11), env.ip(2, 12)];
    env.assign(&ips, "az-assign").await;
    assert_eq!(env.on(&vm), BTreeSet::from(ips));
    let primary = env.config(&vm, IpAddr::V4(vm.primary_ip));
    for ip in ips {
        let config = env.config(&vm, ip);
        let props = &config["properties"];
        assert_eq!(config["name"], json!(format!("az-assign_{ip}")), "{config}");
        assert_eq!(props["privateIPAllocationMethod"], json!("Static"));
        assert_eq!(props["privateIPAddressVersion"], json!("IPv4"));
        assert_eq!(props["primary"], json!(false));
        assert_eq!(props["subnet"], primary["properties"]["subnet"]);
    }
    // No PUT went out without an etag: a blind PUT could overwrite another writer's change.
    let if_match = env.arm().fake().if_match_seen();
    assert!(!if_match.is_empty() && if_match.iter().all(Option::is_some));
    // Every call names cloudnet in its User-Agent (issue 30), the metadata read at start-up
    // included, from which the reconciler took its token authority and audience.
    let agents = env.arm().fake().user_agents();
    assert!(agents.contains_key("GET metadata"), "{agents:?}");
    assert!(
        agents
            .values()
            .flatten()
            .all(|a| a.starts_with(cloudnet_reconciler::cloud::azure::APPLICATION_ID)),
        "{agents:?}"
    );

    env.release(&ips).await;
    assert_eq!(env.on(&vm), BTreeSet::new());
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_never_shows_the_address_on_two_nics_at_any_poll() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let from = env.node("az-move-from").await;
    let to = env.node("az-move-to").await;
    let ips = [env.ip(3, 20), env.ip(3, 21)];
    env.assign(&ips, "az-move-from").await;
    // Slow the NIC operations down so the polls see the move in flight, not just its end.
    env.arm()
        .fake()
        .set_operation_time(Duration::from_millis(600));
    for ip in ips {
        plugin::retarget(&env.client, &name(ip), "az-move-to")
            .await
            .unwrap();
    }
    let objects = plugin::objects(&env.client);
    let mut polls = 0u32;
    let moved = wait::until(plugin::STEP, "both IPs moved to az-move-to", || {
        polls += 1;
        let (env, objects, from, to) = (&env, &objects, &from, &to);
        async move {
            let snapshot = env.arm().addresses(&[from, to]);
            let (on_from, on_to) = (&snapshot[0], &snapshot[1]);
            for ip in ips {
                anyhow::ensure!(
                    !(on_from.contains(&ip) && on_to.contains(&ip)),
                    "{ip} is on both NICs at once"
                );
            }
            let mut done = ips
                .iter()
                .all(|ip| on_to.contains(ip) && !on_from.contains(ip));
            for ip in ips {
                let obj = objects.get(&name(ip)).await?;
                done &= obj.is_assigned() && obj.status_node() == Some("az-move-to");
            }
            Ok(done)
        }
    })
    .await;
    env.arm()
        .fake()
        .set_operation_time(Duration::from_millis(50));
    moved.unwrap_or_else(|e| env.fail(e));
    println!("move observed over {polls} polls of both NICs, never on both");
    env.release(&ips).await;
    assert_eq!(env.on(&to), BTreeSet::new());
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_racing_on_the_nic_costs_a_412_and_a_retry_not_its_configuration() {
    let _exclusive = SUITE.write().await;
    let env = env().await;
    let vm = env.node("az-race").await;
    let theirs = env.ip(4, 250);
    let ours = env.ip(4, 10);
    let proxy = env.cluster.proxy().unwrap();
    let route = format!("PUT {}", vm.ids.nic);
    let before = proxy.counts(&route).forwarded;
    let stale_before = env.arm().fake().counts().get("PUT nic 412").copied();
    // Hold our PUT at the proxy long enough for the other writer to change the NIC first.
    proxy.set_rule(
        RouteMatch::exact(route.clone()),
        Rule::PASS.with_latency(Duration::from_secs(2)),
    );
    plugin::create(&env.client, &name(ours), "az-race")
        .await
        .unwrap();
    let arrived = wait::until(plugin::STEP, "our PUT at the proxy", || async {
        Ok(proxy.counts(&route).forwarded > before)
    })
    .await;
    env.add_foreign_config(&vm, "other-writer", theirs);
    proxy.clear_rules();
    arrived.unwrap_or_else(|e| env.fail(e));

    plugin::wait_assigned(&env.client, &name(ours), "az-race")
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert_eq!(
        env.on(&vm),
        BTreeSet::from([ours, theirs]),
        "re-read after the stale etag, so the other writer's configuration stays"
    );
    let puts = proxy.counts(&route).forwarded - before;
    let stale = env.arm().fake().counts().get("PUT nic 412").copied();
    assert!(
        puts >= 2 && stale > stale_before,
        "the stale PUT is refused (412) and sent again: {puts} PUTs, 412s {stale_before:?} -> {stale:?}"
    );
    env.release(&[ours]).await;
    assert_eq!(env.on(&vm), BTreeSet::from([theirs]));
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_egress_ip_becomes_an_ipv6_configuration_with_a_valid_name() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.node("az-ipv6").await;
    let base = u128::from(env.arm().range_v6().network());
    let ip = IpAddr::V6(Ipv6Addr::from(base | 0x1_0010));
    env.assign(&[ip], "az-ipv6").await;
    let config = env.config(&vm, ip);
    assert_eq!(
        config["properties"]["privateIPAddressVersion"],
        json!("IPv6"),
        "{config}"
    );
    let config_name = config["name"].as_str().unwrap();
    assert!(
        config_name.starts_with("az-ipv6_")
            && config_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)),
        "{config_name:?} is not a valid ARM name"
    );
    env.release(&[ip]).await;
    assert_eq!(env.on(&vm), BTreeSet::new());
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_pools_leave_managed_configurations_and_stay_on_the_nodes_own() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.node("az-pools").await;
    let (pooled, next) = (env.ip(6, 10), env.ip(6, 11));
    env.assign(&[pooled], "az-pools").await;
    let pool = format!(
        "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/loadBalancers/public/backendAddressPools/workers",
        cloudnet_e2e::harness::e2e::arm::SUBSCRIPTION,
        cloudnet_e2e::harness::e2e::arm::RESOURCE_GROUP,
    );
    // The cloud provider's service controller puts the node's configurations into the public
    // load balancer's pool; egress through an egress IP must not leave that way.
    let own = IpAddr::V4(vm.primary_ip);
    let fake = env.arm().fake();
    fake.add_to_lb_pool(&vm.ids.nic, own, &pool);
    fake.add_to_lb_pool(&vm.ids.nic, pooled, &pool);
    assert_eq!(fake.lb_pools(&vm.ids.nic, pooled), 1);
    env.assign(&[next], "az-pools").await;
    assert_eq!(
        fake.lb_pools(&vm.ids.nic, pooled),
        0,
        "the next PUT strips the managed configuration's pool"
    );
    assert_eq!(fake.lb_pools(&vm.ids.nic, next), 0);
    assert_eq!(
        fake.lb_pools(&vm.ids.nic, own),
        1,
        "the node's own configuration keeps it"
    );
    env.release(&[pooled, next]).await;
    assert_eq!(fake.lb_pools(&vm.ids.nic, own), 1);
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_objects_for_one_vm_at_once_share_puts_and_all_land() {
    let _exclusive = SUITE.write().await;
    let env = env().await;
    let vm = env.node("az-burst").await;
    let ips: Vec<IpAddr> = (10..40).map(|host| env.ip(5, host)).collect();
    let before = env.mutations();
    futures::future::try_join_all(ips.iter().map(|ip| {
        let client = env.client.clone();
        let ip_name = name(*ip);
        async move { plugin::create(&client, &ip_name, "az-burst").await }
    }))
    .await
    .unwrap();
    for ip in &ips {
        plugin::wait_assigned(&env.client, &name(*ip), "az-burst")
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    let puts = env.mutations() - before;
    assert_eq!(env.on(&vm), ips.iter().copied().collect());
    // Every PUT replaces the whole NIC under one etag: concurrent writes for one VM would
    // collide, so they must be one lane's batches, fewer than the IPs.
    assert!(puts < ips.len() as u64, "{puts} PUTs for {} IPs", ips.len());
    println!("{} IPs on one VM in {puts} PUTs", ips.len());
    env.release(&ips).await;
    assert_eq!(env.on(&vm), BTreeSet::new());
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ip_out_of_subnet_and_reserved_addresses_are_denied_without_a_put() {
    let _exclusive = SUITE.write().await;
    let env = env().await;
    let vm = env.node("az-deny").await;
    let nodes = Api::<Node>::all(env.client.clone());
    let mut snapshot = ClusterSnapshot::new();
    snapshot.upsert_node(NodeInfo::from_node(&nodes.get("az-deny").await.unwrap()));
    let range = env.arm().range();
    let at = |n: u32| IpAddr::V4(Ipv4Addr::from(u32::from(range.network()) + n));
    let last = u32::from(range.broadcast()) - u32::from(range.network());
    let requests = [
        ("node IP", IpAddr::V4(vm.primary_ip), "node_ip"),
        (
            "out of subnet",
            "10.99.0.10".parse().unwrap(),
            "address_index",
        ),
        ("network address", at(0), "address_index"),
        ("default gateway", at(1), "address_index"),
        ("Azure DNS (.2)", at(2), "address_index"),
        ("Azure DNS (.3)", at(3), "address_index"),
        ("last address", at(last), "address_index"),
        (
            "IPv6 outside the /64",
            "fd00:0:0:e3::10".parse().unwrap(),
            "address_index",
        ),
    ];
    let before = env.mutations();
    for (what, ip, rule) in requests {
        let ip_name = name(ip);
        let expected = review(
            Operation::Create,
            Some(ObjectView {
                name: &ip_name,
                spec_node: "az-deny",
            }),
            None,
            &snapshot,
            Some(Platform::Azure),
        )
        .denial
        .unwrap_or_else(|| panic!("{what}: the rules themselves allow {ip}"));
        assert_eq!(expected.rule.as_str(), rule, "{what}");
        let message =
            plugin::webhook_denial(plugin::create(&env.client, &ip_name, "az-deny").await)
                .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert!(
            message.contains(&expected.message),
            "{what}: {message:?} lacks {:?}",
            expected.message
        );
        println!("{what}: {message}");
    }
    assert_eq!(env.mutations(), before, "denied requests cause no PUT");
    assert_eq!(env.on(&vm), BTreeSet::new());
    env.assert_schema_clean();
}

/// Issue 28: the instance annotation a user can write names another VM; the delete still takes
/// the address off the VM the reconciler recorded, and leaves the named one alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_instance_annotation_never_decides_which_vm_is_called() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let vm = env.node("az-forged").await;
    let other = env.node("az-forged-other").await;
    let ip = env.ip(9, 10);
    env.assign(&[ip], "az-forged").await;
    let theirs = env.ip(9, 11);
    env.add_foreign_config(&other, "other-tool", theirs);
    plugin::forge_instance(&env.client, &name(ip), "az-forged", &other.ids.vm)
        .await
        .unwrap();
    env.release(&[ip]).await;
    assert_eq!(env.on(&vm), BTreeSet::new(), "left on the recorded VM");
    assert_eq!(env.on(&other), BTreeSet::from([theirs]));
    env.assert_schema_clean();
}

/// The id of the ip-configuration of `vm`'s NIC holding `ip`, if any.
fn config_id(env: &Env, vm: &ArmVm, ip: IpAddr) -> Option<String> {
    let nic = env.arm().fake().nic(&vm.ids.nic)?;
    configs(&nic)
        .into_iter()
        .find(|c| config_ip(c) == Some(ip))
        .and_then(|c| c["id"].as_str().map(str::to_owned))
}

/// Whether public IP `public` sits on the ip-configuration of `vm`'s NIC holding `ip`.
fn public_on(env: &Env, public: &str, vm: &ArmVm, ip: IpAddr) -> bool {
    let at = env.arm().fake().public_ip_config(public);
    matches!((at, config_id(env, vm, ip)), (Some(at), Some(config)) if at.eq_ignore_ascii_case(&config))
}

/// Public IP reads the reconciler made so far.
fn public_reads(env: &Env) -> u64 {
    let counts = env.arm().fake().counts();
    counts.get("GET public ip").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_public_ip_follows_its_egress_ip_to_the_new_nic_and_no_drift_period_associates_it_again()
 {
    let _shared = PUBLIC.read().await;
    let env = public_env().await;
    let from = env.node("azp-from").await;
    let to = env.node("azp-to").await;
    let ip = env.ip(1, 10);
    env.assign(&[ip], "azp-from").await;
    let public = env
        .arm()
        .add_public_ip("azp-follow", "198.51.100.20".parse().unwrap(), true);
    public_ips::bind(&env.client, "azp-follow", ip, &public)
        .await
        .unwrap();
    let (e, p, from_vm, to_vm) = (&env, public.as_str(), &from, &to);

    // Bind: on the ip-configuration holding the egress IP on the first node's NIC.
    let status = public_ips::wait_reason(
        &env.client,
        "azp-follow",
        "Associated",
        Some("azp-from"),
        BINDING_WITHIN,
        move || async move { Ok(public_on(e, p, from_vm, ip)) },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    assert_eq!(status.interface, "azp-from-nic", "{status:?}");
    assert!(
        status
            .association_id
            .eq_ignore_ascii_case(&config_id(&env, &from, ip).unwrap()),
        "{status:?}"
    );

    // Move, as OVN-Kubernetes does: the same object's spec.node.
    let followed = public_ips::follow_move(
        &env.client,
        &name(ip),
        "azp-follow",
        "azp-to",
        BINDING_WITHIN,
        move || async move {
            let nic = e.arm().fake().nic(&from_vm.ids.nic).unwrap().to_string();
            let left = !nic.to_ascii_lowercase().contains(&p.to_ascii_lowercase());
            Ok(public_on(e, p, to_vm, ip) && left)
        },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    println!(
        "Azure follow time: {:?} from the egress IP seen attached on the new node, {:?} from the move's patch",
        followed.after_attach, followed.after_patch
    );
    let status = followed.status;
    assert_eq!(status.interface, "azp-to-nic", "{status:?}");
    assert!(!env.on(&from).contains(&ip));

    // The association `public_address` reports names the interface as the engine's view does,
    // so no drift period associates again: no association call (Azure's would skip a PUT that
    // changes nothing, so the reconciler's count says it), no NIC PUT carrying the public IP.
    let puts = env.arm().puts_carrying(&public);
    let calls = public_ips::associations(env.cluster).await.unwrap();
    println!(
        "Azure calls for the bind and the move: {calls} associations, {puts} NIC PUTs carrying the public IP"
    );
    let reads = public_reads(&env);
    wait::until(
        BINDING_WITHIN,
        "two public IP reads by the drift check",
        move || async move { Ok(public_reads(e) >= reads + 2) },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    assert_eq!(
        public_ips::associations(env.cluster).await.unwrap(),
        calls,
        "a drift period associated the public IP again"
    );
    assert_eq!(
        env.arm().puts_carrying(&public),
        puts,
        "a drift period put the public IP on a NIC again"
    );
    assert!(public_on(&env, &public, &to, ip));

    // Delete: off the configuration, the public IP resource kept; the egress IP stays.
    public_ips::unbind(
        &env.client,
        "azp-follow",
        BINDING_WITHIN,
        move || async move { Ok(e.arm().fake().public_ip_config(p).is_none()) },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    assert!(env.arm().fake().public_ip(&public).is_some());
    assert_eq!(env.on(&to), BTreeSet::from([ip]));
    env.release(&[ip]).await;
    env.assert_schema_clean();
}

/// Gives every action back when dropped, so a failed test leaves the suite's fake whole.
struct Revoked<'a>(&'a Arm);

/// Puts the fake's answers back as the suite starts them and lets every held request go when
/// dropped, so a failed test leaves the public-address cluster whole.
struct Restored<'a>(&'a Env);

impl Drop for Restored<'_> {
    fn drop(&mut self) {
        let fake = self.0.arm().fake();
        fake.echo_ids_in_other_case(false);
        fake.set_operation_time(OPERATION_TIME);
        fake.set_retry_after(Some(RETRY_AFTER_SECS));
        if let Some(proxy) = self.0.cluster.proxy() {
            proxy.release_held();
        }
    }
}

impl Drop for Revoked<'_> {
    fn drop(&mut self) {
        self.0.fake().revoke(&[]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_join_permission_the_binding_names_it_and_its_egress_ip_still_moves() {
    let _exclusive = PUBLIC.write().await;
    let env = public_env().await;
    let from = env.node("azp-denied-from").await;
    let to = env.node("azp-denied-to").await;
    env.arm().fake().revoke(&[PUBLIC_JOIN]);
    let _revoked = Revoked(env.arm());
    let ip = env.ip(2, 10);
    env.assign(&[ip], "azp-denied-from").await;
    let public = env
        .arm()
        .add_public_ip("azp-denied", "198.51.100.21".parse().unwrap(), true);
    public_ips::bind(&env.client, "azp-denied", ip, &public)
        .await
        .unwrap();
    let (client, e, p) = (&env.client, &env, public.as_str());
    let names_join = move || async move {
        let binding = Api::<EgressPublicIP>::all(client.clone())
            .get("azp-denied")
            .await?;
        let message = binding
            .associated_condition()
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let unassociated = e.arm().fake().public_ip_config(p).is_none();
        Ok::<_, anyhow::Error>(message.contains(PUBLIC_JOIN) && unassociated)
    };
    public_ips::wait_reason(
        client,
        "azp-denied",
        "PermissionDenied",
        Some("azp-denied-from"),
        BINDING_WITHIN,
        names_join,
    )
    .await
    .unwrap_or_else(|e| env.fail(e));

    plugin::retarget(client, &name(ip), "azp-denied-to")
        .await
        .unwrap();
    plugin::wait_assigned(client, &name(ip), "azp-denied-to")
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert_eq!(env.on(&to), BTreeSet::from([ip]));
    assert_eq!(env.on(&from), BTreeSet::new());
    public_ips::wait_reason(
        client,
        "azp-denied",
        "PermissionDenied",
        Some("azp-denied-to"),
        BINDING_WITHIN,
        names_join,
    )
    .await
    .unwrap_or_else(|e| env.fail(e));

    public_ips::unbind(client, "azp-denied", BINDING_WITHIN, move || async move {
        Ok(e.arm().fake().public_ip_config(p).is_none())
    })
    .await
    .unwrap_or_else(|e| env.fail(e));
    env.release(&[ip]).await;
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_bound_public_ips_moved_together_all_follow_to_the_new_nic() {
    let _shared = PUBLIC.read().await;
    let env = public_env().await;
    let from = env.node("azp-many-from").await;
    let to = env.node("azp-many-to").await;
    let ips = [env.ip(3, 10), env.ip(3, 11), env.ip(3, 12)];
    env.assign(&ips, "azp-many-from").await;
    let mut publics = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let address = format!("198.51.100.{}", 40 + i).parse().unwrap();
        let public = env
            .arm()
            .add_public_ip(&format!("azp-many-{i}"), address, true);
        public_ips::bind(&env.client, &format!("azp-many-{i}"), *ip, &public)
            .await
            .unwrap();
        publics.push(public);
    }
    let e = &env;
    for (i, (ip, public)) in ips.iter().zip(&publics).enumerate() {
        let (p, vm, ip) = (public.as_str(), &from, *ip);
        public_ips::wait_reason(
            &env.client,
            &format!("azp-many-{i}"),
            "Associated",
            Some("azp-many-from"),
            BINDING_WITHIN,
            move || async move { Ok(public_on(e, p, vm, ip)) },
        )
        .await
        .unwrap_or_else(|e| env.fail(e));
    }

    // A failover as OVN-Kubernetes makes it: every object's spec.node at once. The bindings'
    // edits of the new NIC wait on each other and share PUTs (counted exactly at the providers
    // tier, where they arrive together by construction; here printed, as the engine's own
    // batching decides when each egress IP lands).
    let carrying = |env: &Env, since: usize| -> usize {
        env.arm().fake().put_bodies()[since..]
            .iter()
            .filter(|body| {
                let body = body.to_string().to_ascii_lowercase();
                publics
                    .iter()
                    .any(|p| body.contains(&p.to_ascii_lowercase()))
            })
            .count()
    };
    let before = env.arm().fake().put_bodies().len();
    for ip in ips {
        plugin::retarget(&env.client, &name(ip), "azp-many-to")
            .await
            .unwrap();
    }
    for (i, (ip, public)) in ips.iter().zip(&publics).enumerate() {
        let (p, vm, ip) = (public.as_str(), &to, *ip);
        let status = public_ips::wait_reason(
            &env.client,
            &format!("azp-many-{i}"),
            "Associated",
            Some("azp-many-to"),
            BINDING_WITHIN,
            move || async move { Ok(public_on(e, p, vm, ip)) },
        )
        .await
        .unwrap_or_else(|e| env.fail(e));
        assert_eq!(status.interface, "azp-many-to-nic", "{status:?}");
    }
    println!(
        "Azure: three bindings moved together: {} NIC PUTs carried their public IPs",
        carrying(&env, before)
    );
    assert_eq!(env.on(&from), BTreeSet::new());
    let left = env.arm().fake().nic(&from.ids.nic).unwrap().to_string();
    for public in &publics {
        assert!(
            !left
                .to_ascii_lowercase()
                .contains(&public.to_ascii_lowercase()),
            "{public} still on the old NIC: {left}"
        );
    }

    for (i, public) in publics.iter().enumerate() {
        let p = public.as_str();
        public_ips::unbind(
            &env.client,
            &format!("azp-many-{i}"),
            BINDING_WITHIN,
            move || async move { Ok(e.arm().fake().public_ip_config(p).is_none()) },
        )
        .await
        .unwrap_or_else(|e| env.fail(e));
    }
    env.release(&ips).await;
    env.assert_schema_clean();
}

/// Issue 52: ARM writes the public IP's `ipConfiguration` (and the VM's NIC, the
/// configuration's public IP) with another case of the resource group than the NIC's own id.
/// The binding records the association as the NIC spells it, no drift period associates it
/// again, and deleting the binding still takes the public IP off the NIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_ip_arm_names_in_another_case_stays_put_and_leaves_the_nic_on_delete() {
    let _exclusive = PUBLIC.write().await;
    let env = public_env().await;
    let _restored = Restored(&env);
    env.arm().fake().echo_ids_in_other_case(true);
    let vm = env.node("azp-case").await;
    let ip = env.ip(4, 10);
    env.assign(&[ip], "azp-case").await;
    let public = env
        .arm()
        .add_public_ip("azp-case", "198.51.100.24".parse().unwrap(), true);
    public_ips::bind(&env.client, "azp-case", ip, &public)
        .await
        .unwrap();
    let (e, p, on) = (&env, public.as_str(), &vm);
    let status = public_ips::wait_reason(
        &env.client,
        "azp-case",
        "Associated",
        Some("azp-case"),
        BINDING_WITHIN,
        move || async move { Ok(public_on(e, p, on, ip)) },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    let config = config_id(&env, &vm, ip).unwrap();
    assert_eq!(status.association_id, config, "as the NIC spells it");
    let echoed = env.arm().fake().public_ip_config(&public).unwrap();
    assert!(
        echoed != config,
        "the fake names the configuration in another case: {echoed}"
    );

    // The drift checks find it where it is: no association call, no PUT carrying it.
    let calls = public_ips::associations(env.cluster).await.unwrap();
    let puts = env.arm().puts_carrying(&public);
    let reads = public_reads(&env);
    wait::until(
        BINDING_WITHIN,
        "two public IP reads by the drift check",
        move || async move { Ok(public_reads(e) >= reads + 2) },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    assert_eq!(public_ips::associations(env.cluster).await.unwrap(), calls);
    assert_eq!(env.arm().puts_carrying(&public), puts);

    // Delete: the association recorded is the one ARM shows, so it is undone.
    public_ips::unbind(
        &env.client,
        "azp-case",
        BINDING_WITHIN,
        move || async move { Ok(e.arm().fake().public_ip_config(p).is_none()) },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    assert_eq!(env.on(&vm), BTreeSet::from([ip]));
    env.release(&[ip]).await;
    env.assert_schema_clean();
}

/// Issue 52: a failover moves two bound egress IPs at once; the bindings' PUT of the new NIC is
/// held at the proxy after their read of it, while the engine's own update of that NIC (a third
/// egress IP arriving there) lands, so the held PUT meets a 412 when it goes. A transient
/// failure is tried again after a short backoff, not the backoff cap: both bindings are
/// associated on the new node within 3 s of the release. The fake's operations answer at once
/// meanwhile (`Retry-After: 0`), so those seconds are the controller's retry, not ARM's polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_whose_put_meets_a_412_in_a_failover_are_associated_within_seconds_of_it() {
    let _exclusive = PUBLIC.write().await;
    let env = public_env().await;
    let _restored = Restored(&env);
    let from = env.node("azp-412-from").await;
    let to = env.node("azp-412-to").await;
    let ips = [env.ip(5, 10), env.ip(5, 11)];
    env.assign(&ips, "azp-412-from").await;
    let mut publics = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let address = format!("198.51.100.{}", 50 + i).parse().unwrap();
        let public = env
            .arm()
            .add_public_ip(&format!("azp-412-{i}"), address, true);
        public_ips::bind(&env.client, &format!("azp-412-{i}"), *ip, &public)
            .await
            .unwrap();
        publics.push(public);
    }
    let e = &env;
    let associated_on = |vm: &ArmVm, node: &str| {
        let (vm, node, publics) = (vm.clone(), node.to_owned(), publics.clone());
        async move {
            for (i, (ip, public)) in ips.iter().zip(&publics).enumerate() {
                let (p, vm, ip) = (public.as_str(), &vm, *ip);
                public_ips::wait_reason(
                    &e.client,
                    &format!("azp-412-{i}"),
                    "Associated",
                    Some(node.as_str()),
                    BINDING_WITHIN,
                    move || async move { Ok(public_on(e, p, vm, ip)) },
                )
                .await
                .unwrap_or_else(|err| e.fail(err));
            }
        }
    };
    associated_on(&from, "azp-412-from").await;

    // Operations answer at once, so the time after the release is the controller's retry: with
    // the suite's `Retry-After: 1` two NIC operations in a row after the retry took 2.5 s of the
    // 3 (2026-11-28), with this 0.6-0.7 s.
    let fake = env.arm().fake();
    fake.set_operation_time(Duration::ZERO);
    fake.set_retry_after(Some(0));
    // Only the bindings' PUTs of the new NIC carry their public IPs; the engine's carry none
    // until one of the bindings' has landed, so they pass.
    let proxy = env.cluster.proxy().unwrap();
    let new_nic = RouteMatch::exact(format!("PUT {}", to.ids.nic));
    for public in &publics {
        proxy.hold_carrying(new_nic.clone(), public);
    }
    for ip in ips {
        plugin::retarget(&env.client, &name(ip), "azp-412-to")
            .await
            .unwrap();
    }
    for ip in ips {
        plugin::wait_assigned(&env.client, &name(ip), "azp-412-to")
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    wait::until(
        BINDING_WITHIN,
        "the bindings' PUT of the new NIC held at the proxy",
        || async { Ok(proxy.held_now() > 0) },
    )
    .await
    .unwrap_or_else(|e| env.fail(e));
    // The engine's own update of that NIC lands after the bindings' read of it.
    let third = env.ip(5, 12);
    env.assign(&[third], "azp-412-to").await;
    assert!(env.on(&to).contains(&third));
    let stale = || fake.counts().get("PUT nic 412").copied().unwrap_or(0);
    let stale_before = stale();

    let released = Instant::now();
    assert!(proxy.release_held() > 0);
    associated_on(&to, "azp-412-to").await;
    let took = released.elapsed();
    println!("Azure: two bindings associated on the new node {took:?} after their PUT met a 412");
    assert!(
        stale() > stale_before,
        "the held PUT met a 412: {:?}",
        fake.counts()
    );
    // A failure bound, not a speed one: a 412 retried only at the backoff cap took 60 s; the
    // margin is for a loaded 2-core machine (0.6-0.7 s on a quiet one).
    assert!(
        took <= Duration::from_secs(20),
        "associated {took:?} after the release: a 412 waited for the backoff cap"
    );
    assert_eq!(env.on(&from), BTreeSet::new());

    for (i, public) in publics.iter().enumerate() {
        let p = public.as_str();
        public_ips::unbind(
            &env.client,
            &format!("azp-412-{i}"),
            BINDING_WITHIN,
            move || async move { Ok(e.arm().fake().public_ip_config(p).is_none()) },
        )
        .await
        .unwrap_or_else(|e| env.fail(e));
    }
    env.release(&[ips[0], ips[1], third]).await;
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_antrea_egress_ip_becomes_a_configuration_of_antreas_node_and_moves_with_it() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let a = env.node("az-antrea-a").await;
    let b = env.node("az-antrea-b").await;
    let ip = env.ip(10, 10);
    crate::antrea::start_front_end(&env.client).await;
    crate::antrea::an_egress_ip_follows_antrea(
        &env.client,
        "azure",
        ip,
        ["az-antrea-a", "az-antrea-b"],
        |node| std::future::ready(env.on(if node == "az-antrea-a" { &a } else { &b })),
    )
    .await;
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_gateway_follows_its_live_agent_as_configurations_and_on_the_interface() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let a = env.node("az-gw-a").await;
    let b = env.node("az-gw-b").await;
    let v6 = IpAddr::V6(Ipv6Addr::from(
        u128::from(env.arm().range_v6().network()) | 0x1_0240,
    ));
    crate::gateway::a_gateway_follows_its_live_agent(
        &env.client,
        "azure",
        &[env.ip(11, 10), v6],
        ["az-gw-a", "az-gw-b"],
        crate::gateway::Cilium::Skip,
        |node| std::future::ready(env.on(if node == "az-gw-a" { &a } else { &b })),
    )
    .await;
    env.assert_schema_clean();
}
