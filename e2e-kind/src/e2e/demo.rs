//! The main job on embedded defaults: the whole system started locally, three VMs and their nodes
//! (EC2 instances on moto, or "servers" on real Keystone and Neutron), then what a network plugin
//! sees — node annotations, an assignment, a move and a denied request — and the system left
//! running for exploration until the caller says stop.

use std::future::Future;
use std::net::IpAddr;

use anyhow::{Context, Result, bail};
use aws_sdk_ec2::types::InstanceType;
use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, Platform, encode_name};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use serde_json::{Value, json};

use super::ec2::{self, Instance};
use super::openstack::OpenStack;
use super::{Cluster, plugin};
use crate::openstack::Options;

const NODES: [&str; 3] = ["worker-a", "worker-b", "worker-c"];

/// Runs the demo on `platform` (AWS or OpenStack) until `stop` resolves, then stops every
/// process it started.
pub async fn run(platform: Platform, stop: impl Future<Output = ()>) -> Result<()> {
    let cloud = match platform {
        Platform::Aws => "moto (EC2)",
        Platform::OpenStack => "Keystone and Neutron",
        other => bail!("the demo runs on AWS or OpenStack, not {other}"),
    };
    println!(
        "cloudnet demo: starting etcd, kube-apiserver, {cloud} behind the fault proxy, \
         cloudnet-webhook and cloudnet-reconciler..."
    );
    let mut stop = std::pin::pin!(stop);
    let start = async {
        match platform {
            Platform::OpenStack => {
                let cloud = OpenStack::start(Options::default()).await?;
                Cluster::start_local_with(Box::new(cloud)).await
            }
            _ => Cluster::start_local().await,
        }
    };
    let cluster = tokio::select! {
        cluster = start => cluster?,
        () = &mut stop => return Ok(()),
    };
    let walk = async {
        match platform {
            Platform::OpenStack => show_openstack(&cluster).await,
            _ => show(&cluster).await,
        }
    };
    let shown = tokio::select! {
        shown = walk => shown,
        () = &mut stop => Ok(()),
    };
    if shown.is_ok() {
        stop.await;
    }
    drop(cluster);
    println!("\nstopped the reconciler, the webhook, {cloud}, etcd and kube-apiserver");
    shown
}

/// The walk-through, then how to explore the running system.
async fn show(cluster: &Cluster) -> Result<()> {
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
    let network = ec2::create_network(&ec2, "10.0.0.0/16".parse()?).await?;
    let instances = ec2::run_instances(&ec2, &network, InstanceType::M5Large, 3).await?;

    step(
        "the network plugin registers a Node for each EC2 instance; the reconciler annotates them",
    );
    for (node, instance) in NODES.iter().zip(&instances) {
        plugin::create_node(&client, node, instance).await?;
    }
    for (node, instance) in NODES.iter().zip(&instances) {
        plugin::wait_annotation(&client, node).await?;
        println!(
            "{node}  {}  primary ENI {}  {EGRESS_IPCONFIG_ANNOTATION}: {}",
            instance.id,
            instance.eni,
            annotation(&client, node).await?
        );
    }

    let v4 = host_v4(&network, 10);
    let mut v6 = network.ipv6.network().segments();
    v6[7] = 0x10;
    let v6 = IpAddr::from(v6);
    step(&format!("assign {v4} and {v6} to worker-a"));
    for ip in [v4, v6] {
        plugin::create(&client, &encode_name(ip)?, "worker-a").await?;
    }
    for ip in [v4, v6] {
        plugin::wait_assigned(&client, &encode_name(ip)?, "worker-a").await?;
    }
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_enis(&ec2, &instances[..2]).await?;

    step(&format!("move {v4} to worker-b"));
    plugin::retarget(&client, &encode_name(v4)?, "worker-b").await?;
    plugin::wait_assigned(&client, &encode_name(v4)?, "worker-b").await?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_enis(&ec2, &instances[..2]).await?;

    let node_ip = instances[2].primary_ipv4;
    step(&format!(
        "request worker-c's own address {node_ip} (denied)"
    ));
    let before = cluster.ec2_mutations();
    let denied = plugin::create(&client, &encode_name(node_ip)?, "worker-c").await;
    println!("{}", plugin::webhook_denial(denied)?);
    println!(
        "EC2 mutating calls caused by it: {}",
        cluster.ec2_mutations().unwrap_or_default() - before.unwrap_or_default()
    );

    println!(
        "\nExplore it from another terminal:\n  export KUBECONFIG={}\n  {} get nodes,cloudprivateipconfigs -o yaml\n  \
         EC2: {} (any credentials), e.g. aws --endpoint-url {} --region us-east-1 ec2 describe-network-interfaces\n  \
         reconciler metrics: {}\n\nPress Ctrl-C to stop; everything started here is stopped and removed.",
        local.control_plane().kubeconfig_path().display(),
        crate::controlplane::locate_binaries()?.kubectl.display(),
        local.cloud_url(),
        local.cloud_url(),
        local.metrics_url(),
    );
    Ok(())
}

fn step(what: &str) {
    println!("\n== {what}");
}

fn host_v4(network: &ec2::Network, host: u8) -> IpAddr {
    let mut octets = network.ipv4.broadcast().octets();
    octets[3] = host;
    IpAddr::from(octets)
}

async fn annotation(client: &Client, node: &str) -> Result<String> {
    let node = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(node
        .metadata
        .annotations
        .and_then(|mut a| a.remove(EGRESS_IPCONFIG_ANNOTATION))
        .unwrap_or_default())
}

async fn show_enis(ec2: &aws_sdk_ec2::Client, instances: &[Instance]) -> Result<()> {
    let enis: Vec<&str> = instances.iter().map(|i| i.eni.as_str()).collect();
    println!("EC2 DescribeNetworkInterfaces:");
    for (eni, ips) in ec2::addresses(ec2, &enis).await? {
        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
        println!("  {eni}: {}", ips.join(", "));
    }
    Ok(())
}

fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<()> {
    let local = cluster.local().context("the demo runs locally")?;
    println!("$ kubectl {}", args.join(" "));
    let status = local
        .control_plane()
        .kubectl()
        .args(args)
        .status()
        .context("running kubectl")?;
    if !status.success() {
        bail!("kubectl {} failed with {status}", args.join(" "));
    }
    Ok(())
}

/// The walk-through on OpenStack: "servers" are Neutron ports with a `device_id` and a `compute:`
/// owner, created through the Neutron API as the reconciler's project (no Nova needed).
async fn show_openstack(cluster: &Cluster) -> Result<()> {
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
        plugin::create_node_for(&client, node, &format!("openstack:///{server}"), address).await?;
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
    for ip in [v4, v6] {
        plugin::create(&client, &encode_name(ip)?, "worker-a").await?;
    }
    for ip in [v4, v6] {
        plugin::wait_assigned(&client, &encode_name(ip)?, "worker-a").await?;
    }
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
    let before = cluster.cloud_mutations();
    let denied = plugin::create(&client, &encode_name(node_ip)?, "worker-c").await;
    println!("{}", plugin::webhook_denial(denied)?);
    println!(
        "Neutron mutating calls caused by it: {}",
        cluster.cloud_mutations().unwrap_or_default() - before.unwrap_or_default()
    );

    println!(
        "\nExplore it from another terminal:\n  export KUBECONFIG={}\n  {} get nodes,cloudprivateipconfigs -o yaml\n  \
         OpenStack: clouds.yaml (cloud \"openstack\") in {}; Neutron at {}, Keystone at {}\n  \
         reconciler metrics: {}\n\nPress Ctrl-C to stop; everything started here is stopped and removed.",
        local.control_plane().kubeconfig_path().display(),
        crate::controlplane::locate_binaries()?.kubectl.display(),
        local
            .control_plane()
            .dir()
            .join("cloud-credentials")
            .display(),
        servers.neutron_url,
        servers.keystone_url,
        local.metrics_url(),
    );
    Ok(())
}

/// The allowed-address-pairs of the server ports, and the reservation ports on the network.
async fn show_ports(
    api: &crate::openstack::Api,
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
