//! Egress gateways as an admin and the kubelet set them up, for the gateway benchmark, the demo
//! and the tests: the CRD installed, nodes marked and Ready, a gateway created, and the time of a
//! node agent's last heartbeat.

use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, ensure};
use cloudnet_shared::gateway::{EgressGateway, lease_name};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// How long the API server may take to serve a new CRD.
const SERVED_WITHIN: Duration = Duration::from_secs(30);

/// Installs the EgressGateway CRD (an existing one is kept) and waits until it is served.
pub async fn install_crd(client: &Client) -> Result<()> {
    match Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &cloudnet_shared::gateway::crd())
        .await
    {
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        other => {
            other.context("installing the EgressGateway CRD")?;
        }
    }
    let gateways = Api::<EgressGateway>::all(client.clone());
    let give_up = Instant::now() + SERVED_WITHIN;
    while gateways
        .list(&ListParams::default().limit(1))
        .await
        .is_err()
    {
        ensure!(
            Instant::now() < give_up,
            "the EgressGateway CRD is not served after {SERVED_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Labels `node` with `label=value` (what a gateway's nodeSelector picks) and makes it Ready, as
/// the kubelet would.
pub async fn gateway_node(client: &Client, node: &str, (label, value): (&str, &str)) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {label: value}}})),
    )
    .await
    .with_context(|| format!("labelling node {node}"))?;
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": "2026-11-29T00:00:00Z",
            "lastTransitionTime": "2026-11-29T00:00:00Z",
        }]}})),
    )
    .await
    .with_context(|| format!("making node {node} Ready"))?;
    Ok(())
}

/// Creates EgressGateway `name` of `ips` on the nodes labelled `label=value`.
pub async fn create(
    client: &Client,
    name: &str,
    (label, value): (&str, &str),
    ips: &[IpAddr],
) -> Result<()> {
    let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
    let gateway: EgressGateway = serde_json::from_value(json!({
        "apiVersion": "cloudnet.io/v1alpha1",
        "kind": "EgressGateway",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {label: value}},
            "egressIPs": ips,
        },
    }))?;
    Api::<EgressGateway>::all(client.clone())
        .create(&PostParams::default(), &gateway)
        .await
        .with_context(|| format!("creating EgressGateway {name}"))?;
    Ok(())
}

/// The `renewTime` of `node`'s heartbeat Lease in `namespace`, as the wall clock.
pub async fn last_heartbeat(client: &Client, namespace: &str, node: &str) -> Result<SystemTime> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get(&lease_name(node))
        .await
        .with_context(|| format!("reading {node}'s heartbeat Lease"))?;
    let renewed = lease
        .spec
        .and_then(|s| s.renew_time)
        .with_context(|| format!("{node}'s heartbeat Lease has no renewTime"))?;
    Ok(SystemTime::from(renewed.0))
}
