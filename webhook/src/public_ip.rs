//! The `/validate-egresspublicip` endpoint: an `EgressPublicIP` review through the shared rules
//! (`cloudnet_shared::rules::public_ip`), with the other bindings from the watch cache.

use cloudnet_shared::platform::Platform;
use cloudnet_shared::public_ip::{EgressPublicIPSpec, GROUP};
use cloudnet_shared::rules::{ClusterSnapshot, Rule, review_public_ip};
use kube::core::DynamicObject;

use crate::admission::{Answer, Request, answer, deny};

/// The kind this endpoint reviews.
const KIND: &str = "EgressPublicIP";

/// Reviews one EgressPublicIP request.
pub fn validate(
    request: &Request,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Answer {
    let req = request.inner();
    if let Some(message) = request.other_kind(GROUP, KIND, "egresspublicips") {
        return deny(req, Rule::BadInput, message, Vec::new());
    }
    if req.sub_resource.is_some() {
        // The reconciler's status writes carry no spec change.
        return answer(req, cloudnet_shared::rules::Verdict::allow());
    }
    let name = request.name();
    let new = match req.object.as_ref().map(|o| spec(name, o)).transpose() {
        Ok(new) => new,
        Err(message) => return deny(req, Rule::BadInput, message, Vec::new()),
    };
    // An unreadable old spec cannot match the new one: the change is then reviewed in full.
    let old = req.old_object.as_ref().and_then(|o| spec(name, o).ok());
    let verdict = review_public_ip(
        request.operation(),
        name,
        new.as_ref(),
        old.as_ref(),
        cluster.public_ips(),
        platform,
    );
    answer(req, verdict)
}

/// `spec` as the rules read it.
pub fn spec(name: &str, object: &DynamicObject) -> Result<EgressPublicIPSpec, String> {
    let spec = object.data.get("spec").cloned().unwrap_or_default();
    serde_json::from_value(spec).map_err(|error| {
        format!(
            "the spec of EgressPublicIP {:?} is unreadable ({error}); set spec.privateIP and spec.publicIP, both strings",
            cloudnet_shared::excerpt::excerpt(name)
        )
    })
}
