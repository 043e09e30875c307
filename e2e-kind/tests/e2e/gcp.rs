#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The whole system end to end on GCP: the GCE fake (every body checked against the Compute v1
//! discovery document) behind the fault proxy, the webhook and the reconciler with
//! `--platform-type=GCP`, played as a network plugin would, with the VMs' aliases read back from
//! the fake after every step.
//!
//! Tests run in parallel on their own VMs and addresses; the tests that assert exact mutation
//! counts take the suite lock exclusively. Each test ends by asserting the fake saw no request
//! that departs from the schema.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use cloudnet_e2e::fakes::faultproxy::{RouteMatch, Rule};
use cloudnet_e2e::fakes::gce::InstanceSpec;
use cloudnet_e2e::harness::e2e::gce::{GCE_MUTATION, Gce};
use cloudnet_e2e::harness::e2e::{Cluster, plugin, wait};
use cloudnet_shared::{
    ClusterSnapshot, NodeInfo, ObjectView, Operation, Platform, encode_name, review,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use tokio::sync::RwLock;

/// Shared by the tests that only touch their own VMs; taken exclusively by the counting tests.
static SUITE: RwLock<()> = RwLock::const_new(());

struct Env {
    cluster: &'static Cluster,
    client: Client,
}

async fn env() -> Env {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::shared_with(module_path!(), || async {
            Cluster::start_local_with(Box::new(Gce::start().await?)).await
        })
    })
    .await
    .unwrap();
    Env {
        client: cluster.client().await.unwrap(),
        cluster,
    }
}

impl Env {
    fn gce(&self) -> &Gce {
        self.cluster
            .cloud::<Gce>()
            .expect("the GCP suite runs locally")
    }

    /// A new VM and its Node `name`, once the reconciler has annotated it.
    async fn node(&self, name: &str) -> InstanceSpec {
        let vm = self.gce().add_vm(name).unwrap();
        plugin::register_node(
            &self.client,
            name,
            &vm.provider_id(),
            IpAddr::V4(vm.network_ip),
        )
        .await
        .unwrap();
        plugin::wait_annotation(&self.client, name)
            .await
            .unwrap_or_else(|e| self.fail(e));
        vm
    }

    /// `nic0`'s aliases of one VM.
    fn on(&self, vm: &str) -> BTreeSet<IpAddr> {
        self.gce().aliases(&[vm]).remove(0)
    }

    /// Address `host` of the /24 numbered `block` in the subnetwork (VMs use the top /24).
    fn ip(&self, block: u8, host: u8) -> IpAddr {
        let base = u32::from(self.gce().range().network());
        IpAddr::V4(Ipv4Addr::from(
            base | (u32::from(block) << 8) | u32::from(host),
        ))
    }

    fn mutations(&self) -> u64 {
        self.cluster.cloud_mutations().unwrap()
    }

    fn assert_schema_clean(&self) {
        assert_eq!(self.gce().fake().violations(), Vec::<String>::new());
    }

    fn fail(&self, e: anyhow::Error) -> ! {
        panic!("{e:#}\n{}", self.cluster.diagnostics())
    }
}

fn name(ip: IpAddr) -> String {
    encode_name(ip).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_names_nic0_the_primary_range_and_100_minus_unmanaged_aliases() {
    let _shared = SUITE.read().await;
    let env = env().await;
    let gce = env.gce();
    let vm = gce.add_vm("gcp-annotated").unwrap();
    // Two aliases another tool put there before the node joined.
    gce.set_aliases("gcp-annotated", &[env.ip(1, 200), env.ip(1, 201)])
        .unwrap();
    plugin::register_node(
        &env.client,
        "gcp-annotated",
        &vm.provider_id(),
        IpAddr::V4(vm.network_ip),
    )
    .await
    .unwrap();
    let annotation = plugin::wait_annotation(&env.client, "gcp-annotated")
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert_eq!(annotation.len(), 1, "{annotation:?}");
    let config = &annotation[0];
    assert_eq!(config.interface, "nic0");
    assert_eq!(config.ifaddr.ipv4, Some(gce.range()));
    assert_eq!(config.ifaddr.ipv6, None, "GCP is IPv4 only");
    assert_eq!(
        config.capacity.ip,
        Some(98),
        "100 per NIC minus 2 unmanaged"
    );
    assert_eq!((config.capacity.ipv4, config.capacity.ipv6), (None, None));
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_become_aliases_and_deleting_the_last_one_empties_the_list() {
    let _shared = SUITE.read().await;
    let env = env().await;
    env.node("gcp-assign").await;
    let ips = [env.ip(2, 10), env.ip(2, 11), env.ip(2, 12)];
    for ip in ips {
        plugin::create(&env.client, &name(ip), "gcp-assign")
            .await
            .unwrap();
    }
    for ip in ips {
        plugin::wait_assigned(&env.client, &name(ip), "gcp-assign")
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    assert_eq!(env.on("gcp-assign"), BTreeSet::from(ips));

    for ip in ips {
        plugin::delete(&env.client, &name(ip)).await.unwrap();
    }
    for ip in ips {
        plugin::wait_gone(&env.client, &name(ip))
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    // GCE keeps a field the PATCH leaves out, so an empty list proves `"aliasIpRanges": []` went
    // out explicitly.
    assert_eq!(env.on("gcp-assign"), BTreeSet::new());
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_never_shows_the_alias_on_two_vms_at_any_poll() {
    let _shared = SUITE.read().await;
    let env = env().await;
    env.node("gcp-move-from").await;
    env.node("gcp-move-to").await;
    let ips = [env.ip(3, 20), env.ip(3, 21)];
    for ip in ips {
        plugin::create(&env.client, &name(ip), "gcp-move-from")
            .await
            .unwrap();
    }
    for ip in ips {
        plugin::wait_assigned(&env.client, &name(ip), "gcp-move-from")
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    // Slow the zone operations down so the polls see the move in flight, not just its end.
    env.gce()
        .fake()
        .set_operation_delay(Duration::from_millis(600));
    for ip in ips {
        plugin::retarget(&env.client, &name(ip), "gcp-move-to")
            .await
            .unwrap();
    }
    let objects = plugin::objects(&env.client);
    let mut polls = 0u32;
    let moved = wait::until(plugin::STEP, "both IPs moved to gcp-move-to", || {
        polls += 1;
        let (env, objects) = (&env, &objects);
        async move {
            let snapshot = env.gce().aliases(&["gcp-move-from", "gcp-move-to"]);
            let (on_from, on_to) = (&snapshot[0], &snapshot[1]);
            for ip in ips {
                anyhow::ensure!(
                    !(on_from.contains(&ip) && on_to.contains(&ip)),
                    "{ip} is an alias of both VMs at once"
                );
            }
            let mut done = ips
                .iter()
                .all(|ip| on_to.contains(ip) && !on_from.contains(ip));
            for ip in ips {
                let obj = objects.get(&name(ip)).await?;
                done &= obj.is_assigned() && obj.status_node() == Some("gcp-move-to");
            }
            Ok(done)
        }
    })
    .await;
    env.gce()
        .fake()
        .set_operation_delay(Duration::from_millis(50));
    moved.unwrap_or_else(|e| env.fail(e));
    println!("move observed over {polls} polls of both VMs, never on both");
    for ip in ips {
        plugin::delete(&env.client, &name(ip)).await.unwrap();
        plugin::wait_gone(&env.client, &name(ip))
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    assert_eq!(env.on("gcp-move-to"), BTreeSet::new());
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_by_another_client_mid_patch_costs_a_retry_not_its_alias() {
    let _exclusive = SUITE.write().await;
    let env = env().await;
    env.node("gcp-race").await;
    let theirs = env.ip(4, 250);
    let ours = env.ip(4, 10);
    let proxy = env.cluster.proxy().unwrap();
    let before = proxy.counts(GCE_MUTATION).forwarded;
    // Hold our PATCH at the proxy long enough for the other client to change the NIC first.
    proxy.set_rule(
        RouteMatch::exact(GCE_MUTATION),
        Rule::PASS.with_latency(Duration::from_secs(2)),
    );
    plugin::create(&env.client, &name(ours), "gcp-race")
        .await
        .unwrap();
    let arrived = wait::until(plugin::STEP, "our PATCH at the proxy", || async {
        Ok(proxy.counts(GCE_MUTATION).forwarded > before)
    })
    .await;
    let changed = env.gce().set_aliases("gcp-race", &[theirs]);
    proxy.clear_rules();
    arrived.unwrap_or_else(|e| env.fail(e));
    changed.unwrap();

    plugin::wait_assigned(&env.client, &name(ours), "gcp-race")
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert_eq!(
        env.on("gcp-race"),
        BTreeSet::from([ours, theirs]),
        "re-read after the stale fingerprint, so the other client's alias stays"
    );
    let patches = proxy.counts(GCE_MUTATION).forwarded - before;
    assert!(
        patches >= 2,
        "the stale PATCH is refused (412) and sent again: {patches} PATCHes"
    );
    plugin::delete(&env.client, &name(ours)).await.unwrap();
    plugin::wait_gone(&env.client, &name(ours))
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert_eq!(env.on("gcp-race"), BTreeSet::from([theirs]));
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_objects_for_one_vm_at_once_share_patches_and_all_land() {
    let _exclusive = SUITE.write().await;
    let env = env().await;
    env.node("gcp-burst").await;
    let ips: Vec<IpAddr> = (10..40).map(|host| env.ip(5, host)).collect();
    let before = env.mutations();
    futures::future::try_join_all(ips.iter().map(|ip| {
        let client = env.client.clone();
        let ip_name = name(*ip);
        async move { plugin::create(&client, &ip_name, "gcp-burst").await }
    }))
    .await
    .unwrap();
    for ip in &ips {
        plugin::wait_assigned(&env.client, &name(*ip), "gcp-burst")
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    let patches = env.mutations() - before;
    assert_eq!(env.on("gcp-burst"), ips.iter().copied().collect());
    // Every PATCH replaces the whole list under one fingerprint: concurrent writes for one VM
    // would collide, so they must be one lane's batches, fewer than the IPs.
    assert!(
        patches < ips.len() as u64,
        "{patches} PATCHes for {} IPs",
        ips.len()
    );
    println!("{} IPs on one VM in {patches} PATCHes", ips.len());
    for ip in &ips {
        plugin::delete(&env.client, &name(*ip)).await.unwrap();
    }
    for ip in &ips {
        plugin::wait_gone(&env.client, &name(*ip))
            .await
            .unwrap_or_else(|e| env.fail(e));
    }
    assert_eq!(env.on("gcp-burst"), BTreeSet::new());
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ip_out_of_subnet_reserved_indices_and_ipv6_are_denied_without_a_patch() {
    let _exclusive = SUITE.write().await;
    let env = env().await;
    let vm = env.node("gcp-deny").await;
    let nodes = Api::<Node>::all(env.client.clone());
    let mut snapshot = ClusterSnapshot::new();
    snapshot.upsert_node(NodeInfo::from_node(&nodes.get("gcp-deny").await.unwrap()));
    let range = env.gce().range();
    let at = |n: u32| IpAddr::V4(Ipv4Addr::from(u32::from(range.network()) + n));
    let broadcast = u32::from(range.broadcast()) - u32::from(range.network());
    let requests = [
        ("node IP", IpAddr::V4(vm.network_ip), "node_ip"),
        (
            "out of subnet",
            "10.99.0.10".parse().unwrap(),
            "address_index",
        ),
        ("network address", at(0), "address_index"),
        ("gateway", at(1), "address_index"),
        ("second-to-last", at(broadcast - 1), "address_index"),
        ("broadcast", at(broadcast), "address_index"),
        ("IPv6", "fd00::10".parse().unwrap(), "address_index"),
    ];
    let before = env.mutations();
    for (what, ip, rule) in requests {
        let ip_name = name(ip);
        let expected = review(
            Operation::Create,
            Some(ObjectView {
                name: &ip_name,
                spec_node: "gcp-deny",
            }),
            None,
            &snapshot,
            Some(Platform::Gcp),
        )
        .denial
        .unwrap_or_else(|| panic!("{what}: the rules themselves allow {ip}"));
        assert_eq!(expected.rule.as_str(), rule, "{what}");
        let message =
            plugin::webhook_denial(plugin::create(&env.client, &ip_name, "gcp-deny").await)
                .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert!(
            message.contains(&expected.message),
            "{what}: {message:?} lacks {:?}",
            expected.message
        );
        println!("{what}: {message}");
    }
    assert_eq!(env.mutations(), before, "denied requests cause no PATCH");
    assert_eq!(env.on("gcp-deny"), BTreeSet::new());
    env.assert_schema_clean();
}

/// Issue 28: the instance annotation a user can write names another VM; the delete still takes
/// the alias off the VM the reconciler recorded, and leaves the named one alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_instance_annotation_never_decides_which_vm_is_called() {
    let _shared = SUITE.read().await;
    let env = env().await;
    env.node("gcp-forged").await;
    let other = env.node("gcp-forged-other").await;
    let ip = env.ip(9, 10);
    let other_key = other.provider_id().trim_start_matches("gce://").to_owned();
    plugin::delete_with_forged_instance(&env.client, &name(ip), "gcp-forged", &other_key)
        .await
        .unwrap_or_else(|e| env.fail(e));
    assert_eq!(
        env.on("gcp-forged"),
        BTreeSet::new(),
        "left on the recorded VM"
    );
    assert_eq!(env.on("gcp-forged-other"), BTreeSet::new());
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_antrea_egress_ip_becomes_an_alias_of_antreas_node_and_moves_with_it() {
    let _shared = SUITE.read().await;
    let env = env().await;
    env.node("gcp-antrea-a").await;
    env.node("gcp-antrea-b").await;
    let ip = env.ip(10, 10);
    crate::antrea::start_front_end(&env.client).await;
    crate::antrea::an_egress_ip_follows_antrea(
        &env.client,
        "gcp",
        ip,
        ["gcp-antrea-a", "gcp-antrea-b"],
        |vm| std::future::ready(env.on(vm)),
    )
    .await;
    env.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_gateway_follows_its_live_agent_as_aliases_and_on_the_interface() {
    let _shared = SUITE.read().await;
    let env = env().await;
    env.node("gcp-gw-a").await;
    env.node("gcp-gw-b").await;
    // IPv4 alone: GCE attaches no IPv6 alias ranges (docs/clouds/gcp.md).
    crate::gateway::a_gateway_follows_its_live_agent(
        &env.client,
        "gcp",
        &[env.ip(11, 10)],
        ["gcp-gw-a", "gcp-gw-b"],
        crate::gateway::Cilium::Skip,
        |vm| std::future::ready(env.on(vm)),
    )
    .await;
    env.assert_schema_clean();
}
