//! The `/validate-egresspublicip` endpoint: an `EgressPublicIP` review through the shared rules
//! (`cloudnet_shared::rules::public_ip`), with the other bindings from the watch cache.

use cloudnet_shared::platform::Platform;
use cloudnet_shared::public_ip::{EgressPublicIPSpec, GROUP};
use cloudnet_shared::rules::{ClusterSnapshot, review_public_ip};
use kube::core::DynamicObject;

use crate::admission::{Answer, Request, review_spec};

/// The kind this endpoint reviews.
const KIND: &str = "EgressPublicIP";

/// Reviews one EgressPublicIP request.
pub fn validate(
    request: &Request,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Answer {
    let name = request.name();
    review_spec(
        request,
        (GROUP, KIND, "egresspublicips"),
        |o| spec(name, o),
        |operation, name, new, old| {
            review_public_ip(operation, name, new, old, cluster.public_ips(), platform)
        },
    )
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
