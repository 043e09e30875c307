//! Cilium's `CiliumEgressGatewayPolicy` CRD (`cilium.io/v2`), found through the environment or
//! else installed by `cilium/crds.sh` (a no-op once cached) from the pinned
//! `github.com/cilium/cilium` module, as the module ships it. Only the API is served: Cilium's
//! agent and operator are not run.

use std::path::PathBuf;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// Environment variable naming the directory that holds Cilium's CRDs.
pub const CRDS_ENV: &str = "CLOUDNET_CILIUM_CRDS";

/// The CiliumEgressGatewayPolicy CRD's file in that directory.
const EGRESS_GATEWAY_POLICY: &str = "ciliumegressgatewaypolicies.yaml";

/// The directory of Cilium's CRDs. Blocking.
pub fn crds_dir() -> Result<PathBuf> {
    match std::env::var_os(CRDS_ENV) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => crate::harness::cache_script::run(&crate::crate_file("cilium/crds.sh")),
    }
}

/// The CiliumEgressGatewayPolicy CRD of the pinned Cilium. Blocking.
pub fn egress_gateway_policy_crd() -> Result<CustomResourceDefinition> {
    let path = crds_dir()?.join(EGRESS_GATEWAY_POLICY);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// How long the API server may take to serve the CRD.
const SERVED_WITHIN: Duration = Duration::from_secs(30);

/// The CiliumEgressGatewayPolicy API (`cilium.io/v2`).
pub fn policies(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cilium.io", "v2", "CiliumEgressGatewayPolicy");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "ciliumegressgatewaypolicies");
    Api::all_with(client.clone(), &resource)
}

/// Installs the pinned Cilium's CiliumEgressGatewayPolicy CRD (one already there is kept) and
/// waits until it is served.
pub async fn install_egress_gateway_policy_crd(client: &Client) -> Result<()> {
    let crd = tokio::task::spawn_blocking(egress_gateway_policy_crd).await??;
    match Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
    {
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        other => {
            other.context("installing Cilium's CiliumEgressGatewayPolicy CRD")?;
        }
    }
    let give_up = Instant::now() + SERVED_WITHIN;
    while policies(client)
        .list(&ListParams::default().limit(1))
        .await
        .is_err()
    {
        ensure!(
            Instant::now() < give_up,
            "CiliumEgressGatewayPolicy is not served after {SERVED_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Creates the policy Cilium would read for pods labelled `app=<name>`: their traffic SNATed to
/// `egress_ip` on the node carrying `label=value`. Returns the stored policy.
pub async fn create_policy(
    client: &Client,
    name: &str,
    (label, value): (&str, &str),
    egress_ip: IpAddr,
) -> Result<DynamicObject> {
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumEgressGatewayPolicy",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"podSelector": {"matchLabels": {"app": name}}}],
            "destinationCIDRs": ["0.0.0.0/0"],
            "egressGateway": {
                "nodeSelector": {"matchLabels": {label: value}},
                "egressIP": egress_ip.to_string(),
            },
        },
    }))?;
    policies(client)
        .create(&PostParams::default(), &policy)
        .await
        .context("the API server refused the CiliumEgressGatewayPolicy")
}
