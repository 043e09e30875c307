//! The demo on GCE (the project's fake, every body checked against the Compute v1 discovery
//! document): three VMs and their nodes, then node annotations, two assignments (one PATCH), a
//! move and a denied request.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result};
use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, encode_name};

use super::{NODES, annotation, assign, deny_node_ip, kubectl, step};
use crate::harness::e2e::gce::Gce;
use crate::harness::e2e::{Cluster, plugin};

/// The walk-through, then how to explore the running system.
pub(super) async fn show(cluster: &Cluster) -> Result<()> {
    let local = cluster.local().context("the demo runs locally")?;
    let gce: &Gce = cluster.cloud().context("the demo's cloud is GCE")?;
    let [webhook_pid, reconciler_pid] = local.pids();
    println!(
        "running: kube-apiserver {}, GCE fake {} behind the fault proxy {}, cloudnet-webhook \
         pid {webhook_pid} (registered with kube-apiserver), cloudnet-reconciler pid \
         {reconciler_pid}",
        local.control_plane().server_url(),
        local.cloud_url(),
        local.proxy().url(),
    );
    let client = cluster.client().await?;
    let mut vms = Vec::new();
    step("the network plugin registers a Node for each GCE VM; the reconciler annotates them");
    for node in NODES {
        let vm = gce.add_vm(node)?;
        plugin::register_node(&client, node, &vm.provider_id(), IpAddr::V4(vm.network_ip)).await?;
        vms.push(vm);
    }
    for (node, vm) in NODES.iter().zip(&vms) {
        plugin::wait_annotation(&client, node).await?;
        println!(
            "{node}  {}  nic0 {}  {EGRESS_IPCONFIG_ANNOTATION}: {}",
            vm.provider_id(),
            vm.network_ip,
            annotation(&client, node).await?
        );
    }

    let base = u32::from(gce.range().network());
    let (first, second) = (
        IpAddr::V4(Ipv4Addr::from(base | 0x0a0a)),
        IpAddr::V4(Ipv4Addr::from(base | 0x0a0b)),
    );
    step(&format!("assign {first} and {second} to worker-a"));
    let patches = cluster.cloud_mutations().unwrap_or_default();
    assign(&client, &[first, second], "worker-a").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_aliases(gce)?;
    println!(
        "instances.updateNetworkInterface calls: {}",
        cluster.cloud_mutations().unwrap_or_default() - patches
    );

    step(&format!("move {first} to worker-b"));
    plugin::retarget(&client, &encode_name(first)?, "worker-b").await?;
    plugin::wait_assigned(&client, &encode_name(first)?, "worker-b").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_aliases(gce)?;

    let node_ip = IpAddr::V4(vms[2].network_ip);
    step(&format!(
        "request worker-c's own address {node_ip} (denied)"
    ));
    deny_node_ip(cluster, &client, node_ip, "worker-c", "GCE PATCHes").await?;
    println!(
        "schema departures seen by the GCE fake: {}",
        gce.fake().violations().len()
    );

    super::explore(
        local,
        "nodes,cloudprivateipconfigs -o yaml",
        &format!(
            "GCE: curl -H 'Authorization: Bearer x' {}/compute/v1/projects/{}/zones/{}/instances/worker-a",
            local.cloud_url(),
            vms[0].project,
            vms[0].zone
        ),
        "",
    )?;
    Ok(())
}

fn show_aliases(gce: &Gce) -> Result<()> {
    println!("GCE nic0 aliasIpRanges:");
    for (node, aliases) in NODES.iter().zip(gce.aliases(&NODES)) {
        let ips: Vec<String> = aliases.iter().map(ToString::to_string).collect();
        println!("  {node}: {}", ips.join(", "));
    }
    Ok(())
}
