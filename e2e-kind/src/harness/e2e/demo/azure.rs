//! The demo on Azure (the project's ARM fake, every NIC PUT checked against the NetworkInterface
//! schema of 2024-03-01): three VMs and their nodes, then node annotations, two assignments (one
//! NIC PUT with `If-Match`), a move and a denied request.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result};
use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, encode_name};

use super::{NODES, annotation, assign, deny_node_ip, kubectl, step};
use crate::harness::e2e::arm::{Arm, ArmVm};
use crate::harness::e2e::{Cluster, plugin};

/// The walk-through, then how to explore the running system.
pub(super) async fn show(cluster: &Cluster) -> Result<()> {
    let local = cluster.local().context("the demo runs locally")?;
    let arm: &Arm = cluster.cloud().context("the demo's cloud is Azure")?;
    let [webhook_pid, reconciler_pid] = local.pids();
    println!(
        "running: kube-apiserver {}, ARM fake {} behind the fault proxy {}, cloudnet-webhook \
         pid {webhook_pid} (registered with kube-apiserver), cloudnet-reconciler pid \
         {reconciler_pid}",
        local.control_plane().server_url(),
        local.cloud_url(),
        local.proxy().url(),
    );
    let client = cluster.client().await?;
    let mut vms = Vec::new();
    step("the network plugin registers a Node for each Azure VM; the reconciler annotates them");
    for node in NODES {
        let vm = arm.add_vm(node)?;
        plugin::register_node(
            &client,
            node,
            &vm.ids.provider_id,
            IpAddr::V4(vm.primary_ip),
        )
        .await?;
        vms.push(vm);
    }
    for (node, vm) in NODES.iter().zip(&vms) {
        plugin::wait_annotation(&client, node).await?;
        println!(
            "{node}  {}  {}-nic {}  {EGRESS_IPCONFIG_ANNOTATION}: {}",
            vm.ids.provider_id,
            node,
            vm.primary_ip,
            annotation(&client, node).await?
        );
    }

    let base = u32::from(arm.range().network());
    let (first, second) = (
        IpAddr::V4(Ipv4Addr::from(base | 0x0a0a)),
        IpAddr::V4(Ipv4Addr::from(base | 0x0a0b)),
    );
    step(&format!("assign {first} and {second} to worker-a"));
    let puts = cluster.cloud_mutations().unwrap_or_default();
    assign(&client, &[first, second], "worker-a").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_configs(arm, &vms);
    println!(
        "NIC PUTs (each with If-Match on the NIC's etag): {}",
        cluster.cloud_mutations().unwrap_or_default() - puts
    );

    step(&format!("move {first} to worker-b"));
    plugin::retarget(&client, &encode_name(first)?, "worker-b").await?;
    plugin::wait_assigned(&client, &encode_name(first)?, "worker-b").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_configs(arm, &vms);

    let node_ip = IpAddr::V4(vms[2].primary_ip);
    step(&format!(
        "request worker-c's own address {node_ip} (denied)"
    ));
    deny_node_ip(cluster, &client, node_ip, "worker-c", "ARM NIC PUTs").await?;
    println!(
        "schema departures seen by the ARM fake: {}",
        arm.fake().schema_violations().len()
    );

    super::explore(
        local,
        "nodes,cloudprivateipconfigs -o yaml",
        &format!(
            "ARM: curl -H 'Authorization: Bearer fake-arm-token-1' '{}{}?api-version=2024-03-01'",
            local.cloud_url(),
            vms[0].ids.nic
        ),
        "",
    )?;
    Ok(())
}

fn show_configs(arm: &Arm, vms: &[ArmVm]) {
    println!("Azure NIC secondary ip-configurations:");
    let refs: Vec<&ArmVm> = vms.iter().collect();
    for (node, ips) in NODES.iter().zip(arm.addresses(&refs)) {
        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
        println!("  {node}: {}", ips.join(", "));
    }
}
