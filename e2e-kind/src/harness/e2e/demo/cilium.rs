//! The demo of an egress gateway for Cilium on EC2 (moto): the reconciler runs with
//! `--front-end=egress-gateway`; the real node agent (`cloudnet-node`'s library) runs for each
//! of the three nodes in a network namespace of the node's own (`harness::node_host`, needs
//! root); an EgressGateway, the `CiliumEgressGatewayPolicy` Cilium would read (Cilium's CRD at
//! its pinned version; its agent is not run), the IP on the active node's ENI and interface, then that node's agent stopped as when its
//! VM is powered off, and the failover with its time from the agent's last heartbeat.

use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use cloudnet_node::Settings;
use cloudnet_shared::gateway::{ACTIVE_VALUE, EgressGateway, active_label};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

use super::aws::{host_v4, show_enis, workers};
use super::{NODES, kubectl, step};
use crate::harness::cilium;
use crate::harness::e2e::local::{self, NAMESPACE, RECONCILER_ACCOUNT};
use crate::harness::e2e::{Cluster, gateway};
use crate::harness::node_host::{DEVICE, NodeHost};

/// The flag that turns the front end on.
pub(super) const FLAG: &str = "--front-end=egress-gateway";
/// The gateway's name.
const GATEWAY: &str = "web";
/// The label the gateway's nodeSelector picks, as an admin would mark egress nodes.
const EGRESS_NODE: &str = "node-role.kubernetes.io/egress";
/// How long any step may take (the front end may start before the CRD and its grants).
const WITHIN: Duration = Duration::from_secs(120);

/// The walk-through, then how to explore the running system; returns the node hosts, which
/// must outlive the walk-through (dropping one stops its agent).
pub(super) async fn show(cluster: &Cluster) -> Result<Vec<NodeHost>> {
    let local = cluster.local().context("the demo runs locally")?;
    super::running(local, FLAG);
    let client = cluster.client().await?;
    let ec2 = cluster.ec2()?;

    step("install the EgressGateway CRD and grant the front end its permissions");
    gateway::install_crd(&client).await?;
    local::apply_gateway_rbac(local.control_plane())?;
    println!(
        "manifests/reconciler/overlays/egress-gateway/rbac.yaml applied: bound to \
         {NAMESPACE}/{RECONCILER_ACCOUNT} (EgressGateways read and their status written, its own \
         CloudPrivateIPConfigs, the agents' Leases read)"
    );
    let (network, instances) = workers(
        &client,
        &ec2,
        "a Node for each EC2 instance; the reconciler annotates them",
    )
    .await?;

    step(&format!(
        "an admin marks the three nodes as egress nodes ({EGRESS_NODE}); they are Ready"
    ));
    for node in NODES {
        gateway::gateway_node(&client, node, (EGRESS_NODE, "")).await?;
    }
    kubectl(cluster, &["get", "nodes", "-L", EGRESS_NODE])?;

    step(&format!(
        "the node agent (cloudnet-node) on each node, in a network namespace of the node's own \
         whose {DEVICE} has the node's address; each renews its heartbeat Lease every second"
    ));
    let mut hosts = Vec::new();
    for (node, instance) in NODES.iter().zip(&instances) {
        let settings = Settings {
            node: (*node).to_owned(),
            lease_namespace: NAMESPACE.into(),
            heartbeat_interval: Duration::from_secs(1),
            lease_duration_seconds: 3,
            interface: None,
        };
        let host = NodeHost::start(
            client.clone(),
            settings,
            instance.primary_ipv4,
            network.ipv4.prefix_len(),
        )
        .await
        .context("PLUGIN=cilium runs each node's agent in a network namespace: run it as root")?;
        hosts.push(host);
    }
    kubectl(cluster, &["-n", NAMESPACE, "get", "leases"])?;

    let ip = host_v4(&network, 30);
    step(&format!(
        "an admin creates EgressGateway {GATEWAY} with egress IP {ip} on the egress nodes"
    ));
    gateway::create(&client, GATEWAY, (EGRESS_NODE, ""), &[ip]).await?;
    wait_active(&client, NODES[0]).await?;
    wait_held(&hosts[0], ip).await?;
    show_gateway(cluster)?;
    show_enis(&ec2, &instances).await?;
    show_interfaces(&hosts, ip).await?;

    step(
        "Cilium's CiliumEgressGatewayPolicy CRD (pinned Cilium; its agent is not run here) and the \
         policy Cilium would read: its gateway is the node with the active label",
    );
    cilium::install_egress_gateway_policy_crd(&client).await?;
    let label = active_label(GATEWAY);
    cilium::create_policy(&client, GATEWAY, (&label, ACTIVE_VALUE), ip).await?;
    kubectl(
        cluster,
        &["get", "ciliumegressgatewaypolicies", GATEWAY, "-o", "yaml"],
    )?;
    kubectl(
        cluster,
        &["get", "nodes", "-l", &format!("{label}={ACTIVE_VALUE}")],
    )?;

    step(&format!(
        "{} is powered off: its agent stops (no more heartbeats; the address it added stays on \
         the switched-off VM)",
        NODES[0]
    ));
    hosts[0].stop_agent().await?;
    let last = gateway::last_heartbeat(&client, NAMESPACE, NODES[0]).await?;
    wait_active(&client, NODES[1]).await?;
    wait_held(&hosts[1], ip).await?;
    let failed_over = SystemTime::now();
    println!(
        "{GATEWAY} active on {} with {ip} on its ENI and {DEVICE}, {:.2} s after {}'s last \
         heartbeat (the heartbeat timeout is 3 s)",
        NODES[1],
        failed_over
            .duration_since(last)
            .map_or(f64::NAN, |d| d.as_secs_f64()),
        NODES[0]
    );
    show_gateway(cluster)?;
    show_enis(&ec2, &instances).await?;
    show_interfaces(&hosts, ip).await?;
    kubectl(
        cluster,
        &[
            "get",
            "nodes",
            "-l",
            &format!("{}=active", active_label(GATEWAY)),
        ],
    )?;

    step(&format!(
        "{} comes back: its agent takes {ip} off its interface and the gateway stays on {}",
        NODES[0], NODES[1]
    ));
    hosts[0].start_agent()?;
    let give_up = Instant::now() + WITHIN;
    while hosts[0].holds(ip).await? {
        if Instant::now() > give_up {
            bail!("{ip} still on {}'s {DEVICE} after {WITHIN:?}", NODES[0]);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_active(&client, NODES[1]).await?;
    show_interfaces(&hosts, ip).await?;
    kubectl(cluster, &["get", "egressgateways"])?;

    super::explore(
        local,
        "egressgateways,cloudprivateipconfigs,nodes --show-labels",
        &super::ec2_hint(local),
        "cloudnet_egress_gateway_*",
    )?;
    Ok(hosts)
}

/// Waits until the gateway is `Ready` on `node` and only that node carries its label.
async fn wait_active(client: &Client, node: &str) -> Result<()> {
    let gateways: Api<EgressGateway> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let label = format!("{}=active", active_label(GATEWAY));
    let give_up = Instant::now() + WITHIN;
    loop {
        let gateway = gateways.get(GATEWAY).await?;
        let ready = gateway
            .ready_condition()
            .is_some_and(|c| c.status == "True");
        let labelled: Vec<String> = nodes
            .list_metadata(&kube::api::ListParams::default().labels(&label))
            .await?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        if ready && gateway.active_node() == Some(node) && labelled == [node] {
            return Ok(());
        }
        if Instant::now() > give_up {
            bail!(
                "EgressGateway {GATEWAY} not Ready on {node} after {WITHIN:?}: active {:?}, \
                 labelled {labelled:?}",
                gateway.active_node()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `host`'s agent has put `ip` on its interface.
async fn wait_held(host: &NodeHost, ip: IpAddr) -> Result<()> {
    let give_up = Instant::now() + WITHIN;
    while !host.holds(ip).await? {
        if Instant::now() > give_up {
            bail!("{ip} not on {}'s {DEVICE} after {WITHIN:?}", host.node());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn show_gateway(cluster: &Cluster) -> Result<()> {
    kubectl(cluster, &["get", "egressgateways"])?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])
}

/// Each node's interface as `ip -d address` would show the gateway's IP on it.
async fn show_interfaces(hosts: &[NodeHost], ip: IpAddr) -> Result<()> {
    println!("the nodes' interfaces (each node's network namespace):");
    for host in hosts {
        let held: Vec<String> = host
            .addresses()
            .await?
            .into_iter()
            .filter(|a| a.ip == ip)
            .map(|a| {
                let mark = if a.ours {
                    " proto 0xc7 (the agent's)"
                } else {
                    ""
                };
                format!("{}/{}{mark}", a.ip, a.prefix_len)
            })
            .collect();
        let shown = if held.is_empty() {
            format!("no {ip}")
        } else {
            held.join(", ")
        };
        println!("  {} {DEVICE}: {shown}", host.node());
    }
    Ok(())
}
