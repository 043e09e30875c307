#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The shipped images and manifests on a real one-node cluster (kubelet, containerd, runc,
//! scheduler, controller-manager; e2e-kind/src/cluster): the webhook and the reconciler run as
//! pods from `make images`' archives, configured by `manifests/` plus the test overlays of
//! e2e-kind/cluster/overlay, against moto; then end-to-end scenarios through the apiserver.
//!
//! One test, in order, because the cluster is one per machine and its cleanup (containers,
//! bridge, NAT rules, mounts) runs when the test drops it. Skipped, with the reason printed, only
//! where the machine lacks what a node needs (`cluster::missing_requirements`).

use std::net::IpAddr;
use std::time::Duration;

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::cluster::{self, NodeCluster};
use cloudnet_e2e::e2e::{self, binaries, ec2, plugin, wait};
use cloudnet_e2e::moto::MotoServer;
use cloudnet_shared::encode_name;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const POD_TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_manifests_and_images_run_on_a_one_node_cluster() {
    let missing = cluster::missing_requirements();
    if !missing.is_empty() {
        eprintln!(
            "SKIPPED: this machine cannot run a one-node cluster; it lacks:\n  {}",
            missing.join("\n  ")
        );
        return;
    }
    let moto = MotoServer::start().await.unwrap();
    let mut node = NodeCluster::start().await.unwrap();
    let client = node.control_plane().client().await.unwrap();
    if let Err(e) = run(&mut node, &client, moto.url()).await {
        panic!("{e:#}\n{}", node.diagnostics());
    }
}

async fn run(node: &mut NodeCluster, client: &Client, moto_url: &str) -> anyhow::Result<()> {
    // The webhook: shipped manifests, then the one-shot certificate path of the README.
    node.apply_overlay("cluster/overlay/webhook", moto_url)?;
    install_webhook_certs(node)?;
    wait_available(client, "cloudnet", "cloudnet-webhook").await?;
    let node_ip = node.node_ip().await?;
    node.route_service(
        "cloudnet",
        "cloudnet-webhook",
        443,
        &format!("{node_ip}:19443"),
    )
    .await?;

    // The reconciler, with moto's (any) keys in the Secret its Deployment mounts.
    node.apply_overlay("cluster/overlay/reconciler", moto_url)?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "cloud-credentials", "namespace": "cloudnet-system"},
        "stringData": {
            "aws_access_key_id": "AKIDCLOUDNETE2E",
            "aws_secret_access_key": "cloudnet-e2e-secret",
        }
    }))?;
    Api::<Secret>::namespaced(client.clone(), "cloudnet-system")
        .create(&PostParams::default(), &secret)
        .await?;
    wait_available(client, "cloudnet-system", "cloudnet-reconciler").await?;

    let ec2 = e2e::ec2_client("us-east-1", moto_url)?;
    let network = ec2::create_network(&ec2, "10.0.0.0/16".parse()?).await?;
    let instance = ec2::run_instances(&ec2, &network, InstanceType::M5Large, 1)
        .await?
        .remove(0);
    plugin::create_node(client, "cluster-a", &instance).await?;
    plugin::wait_annotation(client, "cluster-a").await?;
    let v4 = |host: u8| {
        let mut octets = network.ipv4.broadcast().octets();
        octets[3] = host;
        IpAddr::from(octets)
    };

    // The webhook pod is in the admission path: the node's own address is refused.
    let own = encode_name(instance.primary_ipv4)?;
    let message = plugin::webhook_denial(plugin::create(client, &own, "cluster-a").await)?;
    anyhow::ensure!(message.contains("node"), "unexpected denial: {message}");

    // The reconciler pod assigns and releases an address in EC2.
    let ip = v4(40);
    let name = encode_name(ip)?;
    plugin::create(client, &name, "cluster-a").await?;
    plugin::wait_assigned(client, &name, "cluster-a").await?;
    anyhow::ensure!(ec2::addresses_of(&ec2, &instance.eni).await?.contains(&ip));
    plugin::delete(client, &name).await?;
    plugin::wait_gone(client, &name).await?;
    anyhow::ensure!(!ec2::addresses_of(&ec2, &instance.eni).await?.contains(&ip));

    // With every webhook pod deleted, a finalizer removal still goes through: the object is
    // deleted, the reconciler releases the address and removes its finalizer, and nothing waits
    // on the webhook. A spec change is refused meanwhile (failurePolicy Fail), which proves the
    // webhook really was down and on the path.
    let ip = v4(41);
    let name = encode_name(ip)?;
    plugin::create(client, &name, "cluster-a").await?;
    plugin::wait_assigned(client, &name, "cluster-a").await?;
    scale(client, "cloudnet", "cloudnet-webhook", 0).await?;
    wait_no_pods(
        client,
        "cloudnet",
        "app.kubernetes.io/name=cloudnet-webhook",
    )
    .await?;
    let refused = plugin::objects(client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": "cluster-b"}})),
        )
        .await;
    anyhow::ensure!(
        refused.is_err(),
        "a spec change was admitted with no webhook pod: {refused:?}"
    );
    plugin::delete(client, &name).await?;
    plugin::wait_gone(client, &name).await?;
    anyhow::ensure!(!ec2::addresses_of(&ec2, &instance.eni).await?.contains(&ip));
    scale(client, "cloudnet", "cloudnet-webhook", 1).await?;
    wait_available(client, "cloudnet", "cloudnet-webhook").await?;
    Ok(())
}

fn install_webhook_certs(node: &NodeCluster) -> anyhow::Result<()> {
    let kubectl = node.control_plane().kubectl();
    let script = cloudnet_e2e::crate_file("../certs/install-webhook-certs.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .env(binaries::CERTS_ENV, binaries::certs()?)
        .env("KUBECTL", kubectl.get_program())
        .env("KUBECONFIG", node.control_plane().kubeconfig_path())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "install-webhook-certs.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

async fn wait_available(client: &Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace);
    wait::until(
        POD_TIMEOUT,
        &format!("deployment {namespace}/{name} available"),
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get(name).await?;
                let want = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                let status = d.status.unwrap_or_default();
                Ok(status.available_replicas.unwrap_or(0) >= want
                    && status.updated_replicas.unwrap_or(0) >= want)
            }
        },
    )
    .await
}

async fn scale(client: &Client, namespace: &str, name: &str, replicas: i32) -> anyhow::Result<()> {
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    Ok(())
}

async fn wait_no_pods(client: &Client, namespace: &str, selector: &str) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    wait::until(POD_TIMEOUT, &format!("no pods {selector}"), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels(selector)).await?;
            Ok(list.items.is_empty())
        }
    })
    .await
}
