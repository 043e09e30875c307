//! An egress gateway's whole path on the one-node cluster: the chart's reconciler with the gateway
//! front end, the node agent as the chart's DaemonSet (host network, `NET_ADMIN`, its pod-bound
//! token under the admission policy), the webhook admitting the gateway, and EC2 at moto. The
//! real node is given a moto VM (its `spec.providerID` set once, from empty, as a cloud provider
//! would), so the reconciler annotates it and attaches the gateway's IP to that VM's ENI; the
//! agent puts the IP on the device the chart's `nodeAgent.interface` names, a veth pair this
//! scenario makes on the host and removes when it ends, and labels the node. Nothing else of the
//! host's network is touched: the agent adds only to that device and removes only what it marked.

use std::net::IpAddr;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::harness::e2e::{ec2, gateway, plugin, wait};
use cloudnet_shared::gateway::{ACTIVE_VALUE, EgressGateway, active_label};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::support::POD_TIMEOUT;

/// The device `nodeAgent.interface` names in e2e-kind/cluster/values.yaml.
pub const DEVICE: &str = "cloudnet-gw0";
/// The label the kubelet puts on the real node (`--node-labels`).
const REAL: (&str, &str) = ("cloudnet.test/node", "real");
/// The gateway's name.
const NAME: &str = "cluster-gw";

/// The veth pair the agent's device is, removed on drop (a panic included).
struct Device;

impl Device {
    fn create() -> Result<Self> {
        let _ = Command::new("ip").args(["link", "del", DEVICE]).output();
        run(&[
            "link",
            "add",
            DEVICE,
            "type",
            "veth",
            "peer",
            "name",
            "cloudnet-gw1",
        ])?;
        run(&["link", "set", DEVICE, "up"])?;
        Ok(Self)
    }

    /// The addresses on the device, as `ip -d -o address` prints them, one per line.
    fn addresses() -> Result<String> {
        let out = Command::new("ip")
            .args(["-d", "-o", "address", "show", "dev", DEVICE])
            .output()
            .context("running ip")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", DEVICE]).output();
    }
}

fn run(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The scenario: `node` (the real node's name) becomes a moto VM, a gateway selecting it gets its
/// IP on the VM's ENI, on [`DEVICE`] and the node's active label; the gateway deleted, all of it
/// goes.
pub async fn whole_path(
    client: &Client,
    ec2_client: &aws_sdk_ec2::Client,
    network: &ec2::Network,
    node: &str,
    ip: IpAddr,
) -> Result<()> {
    let _device = Device::create()?;
    let instance = ec2::run_instances(ec2_client, network, InstanceType::M5Large, 1)
        .await?
        .remove(0);
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerID": instance.provider_id()}})),
        )
        .await
        .context("giving the real node a moto VM")?;
    plugin::wait_annotation(client, node).await?;

    gateway::create(client, NAME, REAL, &[ip]).await?;
    let gateways: Api<EgressGateway> = Api::all(client.clone());
    let label = active_label(NAME);
    wait::until(
        POD_TIMEOUT,
        "the gateway Ready on the real node",
        || async {
            let gw = gateways.get(NAME).await?;
            let ready = gw.ready_condition().is_some_and(|c| c.status == "True");
            let labelled = nodes.get(node).await?.metadata.labels.unwrap_or_default();
            Ok(ready
                && gw.active_node() == Some(node)
                && labelled.get(&label).map(String::as_str) == Some(ACTIVE_VALUE))
        },
    )
    .await
    .with_context(|| Device::addresses().unwrap_or_default())?;
    ensure!(
        ec2::addresses_of(ec2_client, &instance.eni)
            .await?
            .contains(&ip),
        "{ip} not on the real node's ENI {}",
        instance.eni
    );
    // The agent's mark is not asserted here: this iproute2 does not print IFA_PROTO (the e2e tier
    // reads it through netlink).
    let shown = Device::addresses()?;
    let host = if ip.is_ipv4() { 32 } else { 128 };
    let family = if ip.is_ipv4() { "inet" } else { "inet6" };
    ensure!(
        shown.contains(&format!("{family} {ip}/{host} ")),
        "{ip} not on {DEVICE} as a host address:\n{shown}"
    );

    gateways
        .delete(NAME, &DeleteParams::default())
        .await
        .context("deleting the gateway")?;
    let objects = plugin::objects(client);
    let name = cloudnet_shared::encode_name(ip)?;
    wait::until(
        POD_TIMEOUT,
        "the gateway's IP gone from the ENI, the device, the label and the API",
        || async {
            let on_eni = ec2::addresses_of(ec2_client, &instance.eni)
                .await?
                .contains(&ip);
            let on_device = Device::addresses()?.contains(&format!("{ip}/"));
            let labelled = nodes
                .get(node)
                .await?
                .metadata
                .labels
                .unwrap_or_default()
                .contains_key(&label);
            let object = objects.get_opt(&name).await?.is_some();
            Ok(!on_eni && !on_device && !labelled && !object)
        },
    )
    .await?;
    Ok(())
}
