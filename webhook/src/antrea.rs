//! The `/validate-antrea-externalippool` and `/validate-antrea-egress` endpoints: Antrea's
//! objects through the shared rules (`cloudnet_shared::rules::antrea`), the pool's with the Nodes
//! and CloudPrivateIPConfigs of the snapshot, the Egress's with the opted-in pools of the watch
//! cache.

use cloudnet_shared::antrea::{EgressSpec, ExternalIPPool, GROUP};
use cloudnet_shared::excerpt::excerpt;
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::{ClusterSnapshot, review_egress, review_pool};
use kube::core::DynamicObject;

use crate::admission::{Answer, Request, review_spec};

/// Reviews one ExternalIPPool request.
pub fn validate_pool(
    request: &Request,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Answer {
    let name = request.name();
    let read = |o: &DynamicObject| {
        pool(o).map_err(|error| {
            format!(
                "ExternalIPPool {:?} is unreadable ({error}); write spec.ipRanges and spec.nodeSelector as Antrea's crd.antrea.io/v1beta1 defines them",
                excerpt(name)
            )
        })
    };
    review_spec(
        request,
        (GROUP, "ExternalIPPool", "externalippools"),
        read,
        |operation, name, new, old| review_pool(operation, name, new, old, cluster, platform),
    )
}

/// Reviews one Egress request.
pub fn validate_egress(request: &Request, cluster: &ClusterSnapshot) -> Answer {
    let name = request.name();
    let read = |o: &DynamicObject| {
        egress_spec(o).map_err(|error| {
            format!(
                "the spec of Egress {:?} is unreadable ({error}); write it as Antrea's crd.antrea.io/v1beta1 defines it",
                excerpt(name)
            )
        })
    };
    review_spec(
        request,
        (GROUP, "Egress", "egresses"),
        read,
        |operation, name, new, old| {
            review_egress(operation, name, new, old, |pool| cluster.antrea_pool(pool))
        },
    )
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
