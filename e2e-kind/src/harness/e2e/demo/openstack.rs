//! The demo on OpenStack (real Keystone and Neutron from PyPI): three "servers" (Neutron ports
//! with a `device_id` and a `compute:` owner) and their nodes, then node annotations, an IPv4 and
//! an IPv6 assignment, a native move that keeps the reservation port, and a denied request.

use std::net::IpAddr;

use anyhow::{Context, Result, bail};
use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, encode_name};
use serde_json::{Value, json};

use super::{NODES, annotation, assign, deny_node_ip, kubectl, step};
use crate::harness::e2e::openstack::OpenStack;
use crate::harness::e2e::{Cluster, plugin};

/// The walk-through on OpenStack: "servers" are Neutron ports with a `device_id` and a `compute:`
/// owner, created through the Neutron API as the reconciler's project (no Nova needed).
pub(super) async fn show(cluster: &Cluster) -> Result<()> {
    let local = cluster.local().context("the demo runs locally")?;
    let openstack = cluster
        .cloud::<OpenStack>()
        .context("the demo's cloud is OpenStack")?;
    let servers = openstack.servers();
    let [webhook_pid, reconciler_pid] = local.pids();
    println!(
        "running: kube-apiserver {}, Keystone {}, Neutron {} behind the fault proxy {} \
         (up after {:.1?}), cloudnet-webhook pid {webhook_pid}, cloudnet-reconciler pid \
         {reconciler_pid}",
        local.control_plane().server_url(),
        servers.keystone_url,
        servers.neutron_url,
        local.proxy().url(),
        servers.startup,
    );
    let client = cluster.client().await?;
    let api = servers.api(&servers.member).await?;
    let network = api.create("network", json!({"name": "demo"})).await?;
    let network = network["id"].as_str().context("network id")?.to_owned();
    let v4_subnet = api
        .create(
            "subnet",
            // Servers' own addresses from .100 up, away from the egress IPs the demo picks.
            json!({"network_id": network, "ip_version": 4, "cidr": "10.0.0.0/24",
                   "allocation_pools": [{"start": "10.0.0.100", "end": "10.0.0.199"}]}),
        )
        .await?;
    let v6_subnet = api
        .create(
            "subnet",
            json!({"network_id": network, "ip_version": 6, "cidr": "fd00:10::/64",
                   "allocation_pools": [{"start": "fd00:10::100", "end": "fd00:10::ffff"}]}),
        )
        .await?;

    step("the network plugin registers a Node for each server; the reconciler annotates them");
    let mut ports = Vec::new();
    for (n, node) in NODES.iter().enumerate() {
        let server = format!("00000000-de30-4000-8000-{:012x}", n + 1);
        let port = api
            .create(
                "port",
                json!({"network_id": network, "device_id": server, "device_owner": "compute:nova",
                       "name": node, "fixed_ips": [{"subnet_id": v4_subnet["id"]},
                                                   {"subnet_id": v6_subnet["id"]}]}),
            )
            .await?;
        let address = port["fixed_ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["ip_address"].as_str()?.parse::<IpAddr>().ok())
            .find(IpAddr::is_ipv4)
            .context("the server port has no IPv4 address")?;
        plugin::register_node(&client, node, &format!("openstack:///{server}"), address).await?;
        ports.push((port["id"].as_str().context("port id")?.to_owned(), address));
    }
    for (node, (port, _)) in NODES.iter().zip(&ports) {
        plugin::wait_annotation(&client, node).await?;
        println!(
            "{node}  port {port}  {EGRESS_IPCONFIG_ANNOTATION}: {}",
            annotation(&client, node).await?
        );
    }

    let v4: IpAddr = "10.0.0.10".parse()?;
    let v6: IpAddr = "fd00:10::10".parse()?;
    step(&format!("assign {v4} and {v6} to worker-a"));
    assign(&client, &[v4, v6], "worker-a").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_ports(&api, &network, &ports[..2]).await?;

    step(&format!(
        "move {v4} to worker-b (one Neutron move: the reservation port stays)"
    ));
    plugin::retarget(&client, &encode_name(v4)?, "worker-b").await?;
    plugin::wait_assigned(&client, &encode_name(v4)?, "worker-b").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_ports(&api, &network, &ports[..2]).await?;

    let node_ip = ports[2].1;
    step(&format!(
        "request worker-c's own address {node_ip} (denied)"
    ));
    deny_node_ip(
        cluster,
        &client,
        node_ip,
        "worker-c",
        "Neutron mutating calls",
    )
    .await?;

    super::explore(
        local,
        "nodes,cloudprivateipconfigs -o yaml",
        &format!(
            "OpenStack: clouds.yaml (cloud \"openstack\") in {}; Neutron at {}, Keystone at {}",
            local
                .control_plane()
                .dir()
                .join("cloud-credentials")
                .display(),
            servers.neutron_url,
            servers.keystone_url
        ),
        "",
    )?;
    Ok(())
}

/// The allowed-address-pairs of the server ports, and the reservation ports on the network.
async fn show_ports(
    api: &crate::fakes::openstack::Api,
    network: &str,
    ports: &[(String, IpAddr)],
) -> Result<()> {
    let (status, body) = api
        .neutron("GET", &format!("/ports?network_id={network}"), None)
        .await?;
    if status != 200 {
        bail!("listing the ports: HTTP {status}: {body}");
    }
    let listed = body["ports"].as_array().cloned().unwrap_or_default();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    println!("Neutron ports:");
    for (id, address) in ports {
        let Some(port) = listed.iter().find(|p| p["id"] == id.as_str()) else {
            continue;
        };
        let pairs: Vec<String> = port["allowed_address_pairs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| text(&p["ip_address"]))
            .collect();
        println!(
            "  {} ({address}) allowed_address_pairs: [{}]",
            text(&port["name"]),
            pairs.join(", ")
        );
    }
    for port in listed
        .iter()
        .filter(|p| p["device_owner"] == "OpenShiftEgressIP")
    {
        println!(
            "  reservation port {} {} device_id {}",
            text(&port["id"]),
            text(&port["name"]),
            text(&port["device_id"])
        );
    }
    Ok(())
}
