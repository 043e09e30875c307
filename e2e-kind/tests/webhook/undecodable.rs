//! One CloudPrivateIPConfig the webhook cannot decode into its type (stored under a looser CRD,
//! as upstream's or an older schema allowed) does not keep the webhook's caches, and with them
//! `/readyz` and `/validate`, unsynced forever: the caches sync, and the object's name and nodes
//! are still indexed from what can be read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::e2e::wait;
use cloudnet_webhook::cache::{self, ClusterCache};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::{conditions, wait::await_condition};
use serde_json::json;

const SYNC: Duration = Duration::from_secs(30);

/// The project's CRD with its schema opened up, so the apiserver stores what the type refuses.
fn schemaless_crd() -> CustomResourceDefinition {
    let mut crd = cloudnet_shared::crd();
    for version in &mut crd.spec.versions {
        let schema = version.schema.as_mut().unwrap();
        schema.open_api_v3_schema = Some(JSONSchemaProps {
            type_: Some("object".into()),
            x_kubernetes_preserve_unknown_fields: Some(true),
            ..JSONSchemaProps::default()
        });
        version.additional_printer_columns = None;
    }
    crd
}

#[tokio::test]
async fn an_undecodable_object_does_not_keep_the_caches_unsynced() {
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.client().await.unwrap();
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = schemaless_crd();
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(
        &name,
        &PatchParams::apply("cloudnet-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        SYNC,
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await
    .unwrap()
    .unwrap();

    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cloud.network.openshift.io", "v1", "CloudPrivateIPConfig"),
        "cloudprivateipconfigs",
    );
    let objects = Api::<DynamicObject>::all_with(client.clone(), &resource);
    for (ip, spec) in [
        ("10.0.0.7", json!({ "node": "n1" })),
        // A number where the type has a string.
        ("10.0.0.8", json!({ "node": 8 })),
        // Not even an object.
        ("10.0.0.9", json!("n2")),
    ] {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cloud.network.openshift.io/v1",
            "kind": "CloudPrivateIPConfig",
            "metadata": { "name": ip },
            "spec": spec,
        }))
        .unwrap();
        wait::until(SYNC, "the CRD to serve creates", || {
            let (objects, object) = (&objects, &object);
            async move { Ok(objects.create(&PostParams::default(), object).await.is_ok()) }
        })
        .await
        .unwrap();
    }

    let cache = Arc::new(ClusterCache::new());
    let watches = tokio::spawn(cache::run(client, Arc::clone(&cache), "cloudnet-system"));
    let synced = wait::until(SYNC, "the webhook's caches to sync", || {
        let ready = cache.is_ready();
        async move { Ok(ready) }
    })
    .await;
    watches.abort();
    synced.unwrap();
    let snapshot = cache.read();
    assert_eq!(snapshot.object_node("10.0.0.7"), Some("n1"));
    // Still managed: its name is an egress IP, whatever its spec says.
    for ip in ["10.0.0.8", "10.0.0.9"] {
        assert!(snapshot.has_object(ip), "{ip}");
    }
}
