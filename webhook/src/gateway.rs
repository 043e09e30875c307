//! The `/validate-egressgateway` endpoint: an `EgressGateway` review through the shared rules
//! (`cloudnet_shared::rules::gateway`), with the Nodes, CloudPrivateIPConfigs, other gateways and
//! opted-in Antrea pools of the watch caches.

use cloudnet_shared::excerpt::excerpt;
use cloudnet_shared::gateway::{EgressGatewaySpec, GROUP};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::{ClusterSnapshot, review_gateway};
use kube::core::DynamicObject;

use crate::admission::{Answer, Request, review_spec};

/// The kind this endpoint reviews.
const KIND: &str = "EgressGateway";

/// Reviews one EgressGateway request.
pub fn validate(
    request: &Request,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Answer {
    let name = request.name();
    let read = |o: &DynamicObject| {
        spec(o).map_err(|error| {
            format!(
                "the spec of EgressGateway {:?} is unreadable ({error}); set spec.nodeSelector to a label selector and spec.egressIPs to a list of addresses",
                excerpt(name)
            )
        })
    };
    review_spec(
        request,
        (GROUP, KIND, "egressgateways"),
        read,
        |operation, name, new, old| review_gateway(operation, name, new, old, cluster, platform),
    )
}

/// The object's spec as the rules read it.
fn spec(object: &DynamicObject) -> Result<EgressGatewaySpec, serde_json::Error> {
    let spec = object.data.get("spec").cloned().unwrap_or_default();
    serde_json::from_value(spec)
}

/// The object's `spec.egressIPs` as written, for the watch cache: all a gateway's claim is.
pub fn egress_ips(object: &DynamicObject) -> Result<Vec<String>, serde_json::Error> {
    match object
        .data
        .get("spec")
        .and_then(|spec| spec.get("egressIPs"))
    {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(ips) => serde_json::from_value(ips.clone()),
    }
}
