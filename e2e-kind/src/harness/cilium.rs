//! Cilium's `CiliumEgressGatewayPolicy` CRD (`cilium.io/v2`), found through the environment or
//! else installed by `cilium/crds.sh` (a no-op once cached) from the pinned
//! `github.com/cilium/cilium` module, as the module ships it. Only the API is served: Cilium's
//! agent and operator are not run.

use std::path::PathBuf;

use anyhow::{Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

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
