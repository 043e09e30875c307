//! The `/validate-antrea-externalippool` and `/validate-antrea-egress` endpoints: Antrea's
//! objects through the shared rules (`cloudnet_shared::rules::antrea`), the pool's with the Nodes
//! and CloudPrivateIPConfigs of the snapshot, the Egress's with the opted-in pools of the watch
//! cache.

use cloudnet_shared::antrea::{EgressSpec, ExternalIPPool, GROUP};
use cloudnet_shared::excerpt::excerpt;
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::{ClusterSnapshot, Rule, Verdict, review_egress, review_pool};
use kube::core::DynamicObject;

use crate::admission::{Answer, Request, answer, deny};

/// Reviews one ExternalIPPool request.
pub fn validate_pool(
    request: &Request,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Answer {
    let req = request.inner();
    if let Some(message) = request.other_kind(GROUP, "ExternalIPPool", "externalippools") {
        return deny(req, Rule::BadInput, message, Vec::new());
    }
    if req.sub_resource.is_some() {
        // antrea-controller's status writes carry no spec change.
        return answer(req, Verdict::allow());
    }
    let name = request.name();
    let new = match req.object.as_ref().map(pool).transpose() {
        Ok(new) => new,
        Err(error) => {
            let message = format!(
                "ExternalIPPool {:?} is unreadable ({error}); write spec.ipRanges and spec.nodeSelector as Antrea's crd.antrea.io/v1beta1 defines them",
                excerpt(name)
            );
            return deny(req, Rule::BadInput, message, Vec::new());
        }
    };
    // An unreadable old object cannot match the new one: the pool is then reviewed in full.
    let old = req.old_object.as_ref().and_then(|o| pool(o).ok());
    let verdict = review_pool(
        request.operation(),
        name,
        new.as_ref(),
        old.as_ref(),
        cluster,
        platform,
    );
    answer(req, verdict)
}

/// Reviews one Egress request.
pub fn validate_egress(request: &Request, cluster: &ClusterSnapshot) -> Answer {
    let req = request.inner();
    if let Some(message) = request.other_kind(GROUP, "Egress", "egresses") {
        return deny(req, Rule::BadInput, message, Vec::new());
    }
    if req.sub_resource.is_some() {
        // The agents' status writes carry no spec change.
        return answer(req, Verdict::allow());
    }
    let name = request.name();
    let new = match req.object.as_ref().map(egress_spec).transpose() {
        Ok(new) => new,
        Err(error) => {
            let message = format!(
                "the spec of Egress {:?} is unreadable ({error}); write it as Antrea's crd.antrea.io/v1beta1 defines it",
                excerpt(name)
            );
            return deny(req, Rule::BadInput, message, Vec::new());
        }
    };
    let old = req.old_object.as_ref().and_then(|o| egress_spec(o).ok());
    let verdict = review_egress(
        request.operation(),
        name,
        new.as_ref(),
        old.as_ref(),
        |pool| cluster.antrea_pool(pool),
    );
    answer(req, verdict)
}

/// The object as a typed ExternalIPPool.
pub fn pool(object: &DynamicObject) -> Result<ExternalIPPool, serde_json::Error> {
    serde_json::to_value(object).and_then(serde_json::from_value)
}

/// The object's spec as a typed Egress spec (an absent spec reads as an empty one).
fn egress_spec(object: &DynamicObject) -> Result<EgressSpec, serde_json::Error> {
    match object.data.get("spec") {
        None | Some(serde_json::Value::Null) => Ok(EgressSpec::default()),
        Some(spec) => serde_json::from_value(spec.clone()),
    }
}
