//! The `/validate-egressgateway` endpoint: an `EgressGateway` review through the shared rules
//! (`cloudnet_shared::rules::gateway`), with the Nodes, CloudPrivateIPConfigs, other gateways and
//! opted-in Antrea pools of the watch caches.

use cloudnet_shared::excerpt::excerpt;
use cloudnet_shared::gateway::{EgressGatewaySpec, GROUP};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::{ClusterSnapshot, Rule, Verdict, review_gateway};
use kube::core::DynamicObject;

use crate::admission::{Answer, Request, answer, deny};

/// The kind this endpoint reviews.
const KIND: &str = "EgressGateway";

/// Reviews one EgressGateway request.
pub fn validate(
    request: &Request,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Answer {
    let req = request.inner();
    if let Some(message) = request.other_kind(GROUP, KIND, "egressgateways") {
        return deny(req, Rule::BadInput, message, Vec::new());
    }
    if req.sub_resource.is_some() {
        // The reconciler's status writes carry no spec change.
        return answer(req, Verdict::allow());
    }
    let name = request.name();
    let new = match req.object.as_ref().map(spec).transpose() {
        Ok(new) => new,
        Err(error) => {
            let message = format!(
                "the spec of EgressGateway {:?} is unreadable ({error}); set spec.nodeSelector to a label selector and spec.egressIPs to a list of addresses",
                excerpt(name)
            );
            return deny(req, Rule::BadInput, message, Vec::new());
        }
    };
    // An unreadable old spec cannot match the new one: the gateway is then reviewed in full.
    let old = req.old_object.as_ref().and_then(|o| spec(o).ok());
    let verdict = review_gateway(
        request.operation(),
        name,
        new.as_ref(),
        old.as_ref(),
        cluster,
        platform,
    );
    answer(req, verdict)
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
