//! The demo on EC2 (moto): three instances and their nodes, then what a network plugin sees —
//! node annotations, an assignment, a move and a denied request — and an Elastic IP bound to the
//! moved egress IP, which follows it ([`super::public`]).

use std::net::IpAddr;

use anyhow::{Context, Result};
use aws_sdk_ec2::types::InstanceType;
use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, encode_name};

use super::{NODES, annotation, assign, deny_node_ip, kubectl, public, step};
use crate::harness::e2e::ec2::{self, Instance};
use crate::harness::e2e::{Cluster, plugin};

/// The walk-through, then how to explore the running system.
pub(super) async fn show(cluster: &Cluster) -> Result<()> {
    let local = cluster.local().context("the demo runs locally")?;
    let [webhook_pid, reconciler_pid] = local.pids();
    println!(
        "running: kube-apiserver {}, EC2 (moto) {} behind the fault proxy {}, cloudnet-webhook \
         pid {webhook_pid} (registered with kube-apiserver), cloudnet-reconciler pid \
         {reconciler_pid}",
        local.control_plane().server_url(),
        local.cloud_url(),
        local.proxy().url(),
    );
    let client = cluster.client().await?;
    let ec2 = cluster.ec2()?;
    let (network, instances) = workers(
        &client,
        &ec2,
        "the network plugin registers a Node for each EC2 instance; the reconciler annotates them",
    )
    .await?;

    let v4 = host_v4(&network, 10);
    let mut v6 = network.ipv6.network().segments();
    v6[7] = 0x10;
    let v6 = IpAddr::from(v6);
    step(&format!("assign {v4} and {v6} to worker-a"));
    assign(&client, &[v4, v6], "worker-a").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_enis(&ec2, &instances[..2]).await?;

    step(&format!(
        "an admin binds a public address to {v4} (EgressPublicIP; the reconciler looks for its CRD every 30 s)"
    ));
    let eip = public::bind(&client, &ec2, &v4.to_string()).await?;
    public::wait_associated(&client, "worker-a").await?;
    kubectl(cluster, &["get", "egresspublicips", "-o", "wide"])?;
    public::show_address(&ec2, &eip).await?;

    step(&format!(
        "move {v4} to worker-b: its public address follows"
    ));
    plugin::retarget(&client, &encode_name(v4)?, "worker-b").await?;
    plugin::wait_assigned(&client, &encode_name(v4)?, "worker-b").await?;
    public::wait_associated(&client, "worker-b").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_enis(&ec2, &instances[..2]).await?;
    kubectl(cluster, &["get", "egresspublicips", "-o", "wide"])?;
    public::show_address(&ec2, &eip).await?;

    let node_ip = instances[2].primary_ipv4;
    step(&format!(
        "request worker-c's own address {node_ip} (denied)"
    ));
    deny_node_ip(cluster, &client, node_ip, "worker-c", "EC2 mutating calls").await?;

    super::explore(
        local,
        "nodes,cloudprivateipconfigs,egresspublicips -o yaml",
        &super::ec2_hint(local),
        "",
    )?;
    Ok(())
}

/// The demo's three workers: EgressPublicIP's CRD installed first (the reconciler looks for it
/// every 30 s), a network, an EC2 instance per node in [`NODES`] and its Node, announced as
/// `what`, printed once the reconciler has annotated each.
pub(super) async fn workers(
    client: &kube::Client,
    ec2: &aws_sdk_ec2::Client,
    what: &str,
) -> Result<(ec2::Network, Vec<Instance>)> {
    crate::harness::e2e::public_ips::install_crd(client).await?;
    let network = ec2::create_network(ec2, "10.0.0.0/16".parse()?).await?;
    let instances = ec2::run_instances(ec2, &network, InstanceType::M5Large, 3).await?;
    step(what);
    for (node, instance) in NODES.iter().zip(&instances) {
        plugin::create_node(client, node, instance).await?;
    }
    for (node, instance) in NODES.iter().zip(&instances) {
        plugin::wait_annotation(client, node).await?;
        println!(
            "{node}  {}  primary ENI {}  {EGRESS_IPCONFIG_ANNOTATION}: {}",
            instance.id,
            instance.eni,
            annotation(client, node).await?
        );
    }
    Ok((network, instances))
}

pub(super) fn host_v4(network: &ec2::Network, host: u8) -> IpAddr {
    let mut octets = network.ipv4.broadcast().octets();
    octets[3] = host;
    IpAddr::from(octets)
}

pub(super) async fn show_enis(ec2: &aws_sdk_ec2::Client, instances: &[Instance]) -> Result<()> {
    let enis: Vec<&str> = instances.iter().map(|i| i.eni.as_str()).collect();
    println!("EC2 DescribeNetworkInterfaces:");
    for (eni, ips) in ec2::addresses(ec2, &enis).await? {
        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
        println!("  {eni}: {}", ips.join(", "));
    }
    Ok(())
}
