//! Checks the reconciler makes on its own, on the real control plane with the memory cloud and no
//! admission webhook: the node's capacity is re-checked before any cloud call, and every
//! transition is reported as a Kubernetes Event on the object.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod reconciler_support;

use std::time::Duration;

use cloudnet_reconciler::cloud::memory::Op;
use cloudnet_shared::EGRESS_IPCONFIG_ANNOTATION;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use reconciler_support::*;

/// The events.k8s.io Events about object `name`, as (type, reason, note).
async fn events_for(client: &Client, name: &str) -> Vec<(String, String, String)> {
    // Cluster-scoped objects get their Events in `default`.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

async fn wait_event(client: &Client, name: &str, type_: &str, reason: &str) {
    wait_until(
        Duration::from_secs(30),
        &format!("{type_} event {reason} for {name}"),
        || async move {
            events_for(client, name)
                .await
                .iter()
                .any(|(t, r, _)| t == type_ && r == reason)
        },
    )
    .await;
}

#[tokio::test]
async fn a_full_node_blocks_the_attach_before_any_cloud_call_and_transitions_emit_events() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(20));
    // Two addresses on the VM, one of them the unmanaged primary: room for one egress IP.
    add_node(&client, &cloud, "full", 2).await;
    let _task = start(client.clone(), &cloud, engine_config());
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until(
        Duration::from_secs(30),
        "node annotated with capacity 1",
        || {
            let nodes = nodes.clone();
            async move {
                nodes
                    .get("full")
                    .await
                    .ok()
                    .and_then(|n| n.annotations().get(EGRESS_IPCONFIG_ANNOTATION).cloned())
                    .is_some_and(|a| a.contains(r#""capacity":{"ip":1}"#))
            }
        },
    )
    .await;

    create(&client, "10.6.0.1", "full").await;
    wait_assigned(&client, "10.6.0.1", "full").await;
    wait_event(&client, "10.6.0.1", "Normal", "Attached").await;

    // Admitted anyway (no webhook here): the reconciler refuses before calling the cloud.
    create(&client, "10.6.0.2", "full").await;
    wait_until(
        Duration::from_secs(30),
        "capacity error on 10.6.0.2",
        || {
            let client = client.clone();
            async move {
                condition(&client, "10.6.0.2")
                    .await
                    .is_some_and(|(s, r, _, _)| s == "False" && r == "CloudResponseError")
            }
        },
    )
    .await;
    let (_, _, message, node) = condition(&client, "10.6.0.2").await.unwrap();
    assert_eq!(node, "full");
    assert!(
        message.contains("capacity") && message.contains("full") && message.contains("1 of its 1"),
        "{message}"
    );
    wait_event(&client, "10.6.0.2", "Warning", "AttachBlocked").await;
    assert!(
        calls_for(&cloud, "10.6.0.2").is_empty(),
        "{:?}",
        cloud.calls()
    );
    assert!(cloud.owner_of("10.6.0.2".parse().unwrap()).is_none());

    // Room appears: the retried object is attached, and the detach was reported too.
    delete(&client, "10.6.0.1").await;
    wait_gone(&client, "10.6.0.1").await;
    wait_event(&client, "10.6.0.1", "Normal", "Detached").await;
    wait_assigned(&client, "10.6.0.2", "full").await;
    wait_event(&client, "10.6.0.2", "Normal", "Attached").await;
    assert_no_violations(&cloud);
}

/// kube-apiserver can complete a delete that raced with the write adding the finalizer
/// (kubernetes/kubernetes#77988), so an object can vanish while its IP is being attached. Here
/// the finalizer is stripped and the object deleted while the attach call is in flight, which
/// leaves the reconciler in the same place: its next status write finds no object.
#[tokio::test]
async fn an_object_that_vanishes_mid_attach_gets_its_ip_detached() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(400));
    add_node(&client, &cloud, "gone", 10).await;
    let _task = start(client.clone(), &cloud, engine_config());
    create(&client, "10.6.1.1", "gone").await;
    wait_until(
        Duration::from_secs(30),
        "attach of 10.6.1.1 in flight",
        || {
            let client = client.clone();
            async move {
                condition(&client, "10.6.1.1")
                    .await
                    .is_some_and(|(_, r, _, _)| r == "CloudResponsePending")
            }
        },
    )
    .await;
    let strip = serde_json::json!({ "metadata": { "finalizers": null } });
    objects(&client)
        .patch(
            "10.6.1.1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&strip),
        )
        .await
        .unwrap();
    delete(&client, "10.6.1.1").await;
    wait_gone(&client, "10.6.1.1").await;

    let ip = "10.6.1.1".parse().unwrap();
    wait_until(Duration::from_secs(30), "orphaned IP detached", || {
        let cloud = cloud.clone();
        async move {
            let detached = calls_for(&cloud, "10.6.1.1")
                .iter()
                .any(|(op, _)| *op == Op::Detach);
            detached && cloud.owner_of(ip).is_none()
        }
    })
    .await;
    let ops: Vec<Op> = calls_for(&cloud, "10.6.1.1")
        .into_iter()
        .map(|(op, _)| op)
        .collect();
    assert_eq!(ops, [Op::Attach, Op::Detach], "{:?}", cloud.calls());
    wait_event(&client, "10.6.1.1", "Warning", "OrphanDetached").await;
    assert_no_violations(&cloud);
}
