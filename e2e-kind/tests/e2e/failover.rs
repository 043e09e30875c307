#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Failover end to end: a node's VM is terminated while egress IPs sit on it, its Node is
//! deleted, and the network plugin moves some IPs to live nodes and deletes others. Everything
//! must converge within seconds, in both phases of a terminated instance as EC2 shows them (the
//! fault proxy plays EC2's part, see `faultproxy::termination`): listed without interfaces, then
//! unknown.
//!
//! Locally the suite starts the whole system (see `system.rs`); build the binaries first:
//! `cargo build --workspace --all-targets`. Against an existing cluster the VM
//! is terminated through the EC2 endpoint and EC2 itself (or moto, which keeps the interface)
//! shows what it shows.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::TerminationPhase;
use cloudnet_e2e::harness::e2e::ec2::{self, Instance, Network};
use cloudnet_e2e::harness::e2e::{Cluster, plugin, wait};
use cloudnet_shared::encode_name;
use k8s_openapi::api::core::v1::Node;
use kube::api::DeleteParams;
use kube::{Api, Client};

/// How long the system may take to converge after a node's VM is gone: it takes well under a
/// second here, as detaching from a dead VM is one EC2 read that answers at once; a detach
/// retried with backoff instead (60 s cap) misses this bound.
const CONVERGE: Duration = Duration::from_secs(10);

struct Env {
    cluster: &'static Cluster,
    client: Client,
    ec2: aws_sdk_ec2::Client,
    network: Network,
}

impl Env {
    async fn start() -> Self {
        let cluster = tokio::task::spawn_blocking(|| Cluster::shared(module_path!()))
            .await
            .unwrap();
        let ec2 = cluster.ec2().unwrap();
        let network = ec2::create_network(&ec2, "10.1.0.0/16".parse().unwrap())
            .await
            .unwrap();
        Self {
            client: cluster.client().await.unwrap(),
            cluster,
            ec2,
            network,
        }
    }

    /// A new m5.large instance and its Node `name`, annotated by the reconciler.
    async fn node(&self, name: &str) -> Instance {
        let instance = ec2::run_instances(&self.ec2, &self.network, InstanceType::M5Large, 1)
            .await
            .unwrap()
            .remove(0);
        plugin::create_node(&self.client, name, &instance)
            .await
            .unwrap();
        plugin::wait_annotation(&self.client, name)
            .await
            .unwrap_or_else(|e| self.fail(e));
        instance
    }

    fn v4(&self, host: u8) -> IpAddr {
        let mut octets = self.network.ipv4.broadcast().octets();
        octets[3] = host;
        IpAddr::from(octets)
    }

    fn v6(&self, host: u16) -> IpAddr {
        let mut segments = self.network.ipv6.network().segments();
        segments[6] = 0xfa11;
        segments[7] = host;
        IpAddr::from(segments)
    }

    /// Terminates `instance` in EC2 and, locally, has the proxy show it as EC2 does.
    async fn terminate(&self, instance: &Instance) {
        self.ec2
            .terminate_instances()
            .instance_ids(&instance.id)
            .send()
            .await
            .unwrap();
        if let Some(proxy) = self.cluster.proxy() {
            proxy.terminate(&instance.id, &[&instance.eni], None);
        }
    }

    /// Waits until every `(ip, node)` of `moved` is Assigned on its node and every IP of
    /// `deleted` is gone; returns how long that took from `since`.
    async fn converged(
        &self,
        since: Instant,
        moved: &[(IpAddr, &str)],
        deleted: &[IpAddr],
    ) -> Duration {
        let objects = plugin::objects(&self.client);
        let what = format!("{} moves and {} deletes", moved.len(), deleted.len());
        wait::until(CONVERGE, &what, || {
            let objects = objects.clone();
            async move {
                for (ip, node) in moved {
                    let Some(obj) = objects.get_opt(&name(*ip)).await? else {
                        anyhow::bail!("{ip} disappeared");
                    };
                    let done = obj.is_assigned()
                        && obj.spec.node == *node
                        && obj.status_node() == Some(*node);
                    if !done {
                        return Ok(false);
                    }
                }
                for ip in deleted {
                    if objects.get_opt(&name(*ip)).await?.is_some() {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
        since.elapsed()
    }

    fn fail(&self, e: anyhow::Error) -> ! {
        panic!("{e:#}\n{}", self.cluster.diagnostics())
    }
}

fn name(ip: IpAddr) -> String {
    encode_name(ip).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ips_on_a_terminated_vm_move_to_live_nodes_and_delete_within_seconds() {
    let env = Env::start().await;
    let dead = env.node("fo-dead").await;
    let live_a = env.node("fo-live-a").await;
    let live_b = env.node("fo-live-b").await;

    // Six IPs on the node whose VM is about to die.
    let listed_moves = [
        (env.v4(60), "fo-live-a"),
        (env.v6(0x60), "fo-live-a"),
        (env.v4(61), "fo-live-b"),
    ];
    let listed_deletes = [env.v4(62)];
    let gone_moves = [(env.v4(63), "fo-live-b")];
    let gone_deletes = [env.v6(0x61)];
    let all: Vec<IpAddr> = listed_moves
        .iter()
        .chain(&gone_moves)
        .map(|(ip, _)| *ip)
        .chain(listed_deletes)
        .chain(gone_deletes)
        .collect();
    for ip in &all {
        plugin::create(&env.client, &name(*ip), "fo-dead")
            .await
            .unwrap();
    }
    for ip in &all {
        plugin::wait_assigned(&env.client, &name(*ip), "fo-dead")
            .await
            .unwrap_or_else(|e| env.fail(e));
    }

    // The VM dies; the cloud controller deletes its Node.
    env.terminate(&dead).await;
    Api::<Node>::all(env.client.clone())
        .delete("fo-dead", &DeleteParams::default())
        .await
        .unwrap();

    // Phase 1: EC2 lists the instance without interfaces.
    let start = Instant::now();
    for (ip, node) in listed_moves {
        plugin::retarget(&env.client, &name(ip), node)
            .await
            .unwrap();
    }
    for ip in listed_deletes {
        plugin::delete(&env.client, &name(ip)).await.unwrap();
    }
    let listed = env.converged(start, &listed_moves, &listed_deletes).await;

    // Phase 2: EC2 no longer knows the instance.
    if let Some(proxy) = env.cluster.proxy() {
        assert!(proxy.forget(&dead.id));
        assert_eq!(
            proxy.termination_phase(&dead.id),
            Some(TerminationPhase::Gone)
        );
    }
    let start = Instant::now();
    for (ip, node) in gone_moves {
        plugin::retarget(&env.client, &name(ip), node)
            .await
            .unwrap();
    }
    for ip in gone_deletes {
        plugin::delete(&env.client, &name(ip)).await.unwrap();
    }
    let gone = env.converged(start, &gone_moves, &gone_deletes).await;
    println!(
        "terminated VM, Node deleted: {} moves and {} deletes converged in {listed:?} while EC2 \
         listed the instance without interfaces; {} moves and {} deletes in {gone:?} once EC2 \
         no longer knew it",
        listed_moves.len(),
        listed_deletes.len(),
        gone_moves.len(),
        gone_deletes.len()
    );

    // The IPs are on the live ENIs only, each on the one its object names.
    let snapshot = ec2::addresses(&env.ec2, &[&live_a.eni, &live_b.eni])
        .await
        .unwrap();
    let want = |node: &str, primary: IpAddr| -> BTreeSet<IpAddr> {
        listed_moves
            .iter()
            .chain(&gone_moves)
            .filter(|(_, n)| *n == node)
            .map(|(ip, _)| *ip)
            .chain([primary])
            .collect()
    };
    assert_eq!(snapshot[0].1, want("fo-live-a", live_a.primary_ipv4));
    assert_eq!(snapshot[1].1, want("fo-live-b", live_b.primary_ipv4));
    if let Some(ec2) = env.cluster.ec2_through_proxy().unwrap() {
        let error = ec2
            .describe_network_interfaces()
            .network_interface_ids(&dead.eni)
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            error.code(),
            Some("InvalidNetworkInterfaceID.NotFound"),
            "the dead VM's interface is gone, its addresses with it"
        );
    }
}
