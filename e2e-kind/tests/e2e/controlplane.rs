//! The local control plane serves the CRD exactly as a cluster would.

// Test code: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use cloudnet_e2e::ControlPlane;
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec, CloudPrivateIPConfigStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

fn object(name: &str, node: &str) -> CloudPrivateIPConfig {
    CloudPrivateIPConfig {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: CloudPrivateIPConfigSpec {
            node: node.to_string(),
        },
        status: None,
    }
}

fn assigned(status: &str, reason: &str) -> Condition {
    Condition {
        type_: "Assigned".into(),
        status: status.into(),
        reason: reason.into(),
        message: "attached by the test".into(),
        observed_generation: Some(1),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

async fn api() -> Api<CloudPrivateIPConfig> {
    let cp = ControlPlane::shared().await.expect("control plane starts");
    let client: Client = cp.client().await.expect("admin client");
    Api::all(client)
}

#[tokio::test]
async fn crd_is_installed_and_served_cluster_scoped() {
    let api = api().await;
    let list = api.list(&Default::default()).await.expect("list is served");
    assert!(list.items.iter().all(|o| o.metadata.namespace.is_none()));

    let cp = ControlPlane::shared().await.unwrap();
    let output = cp
        .kubectl()
        .args([
            "api-resources",
            "--api-group=cloud.network.openshift.io",
            "-o",
            "wide",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("cloudprivateipconfigs"))
        .unwrap_or_else(|| panic!("resource not listed:\n{text}"));
    assert!(line.contains("false"), "must not be namespaced: {line}");
    assert!(line.contains("CloudPrivateIPConfig"), "{line}");
}

#[tokio::test]
async fn ipv4_and_expanded_ipv6_names_are_accepted() {
    let api = api().await;
    for name in ["10.0.128.10", "fc00.f853.0ccd.e793.0000.0000.0000.0054"] {
        let created = api
            .create(&PostParams::default(), &object(name, "worker-a"))
            .await
            .unwrap_or_else(|e| panic!("{name} refused: {e}"));
        assert_eq!(created.spec.node, "worker-a");
        let read = api.get(name).await.unwrap();
        assert_eq!(read.metadata.uid, created.metadata.uid);
    }
}

#[tokio::test]
async fn names_that_are_not_an_ip_are_rejected_by_the_schema() {
    let api = api().await;
    for name in [
        "not-an-ip",
        "10.0.128.300",
        "fc00.f853.ccd.e793.0.0.0.55",
        "FC00.F853.0CCD.E793.0000.0000.0000.0056",
        "fc00.f853.0ccd.e793.0000.0000.0057",
    ] {
        let err = api
            .create(&PostParams::default(), &object(name, "worker-a"))
            .await
            .expect_err(name);
        match err {
            kube::Error::Api(status) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                assert!(
                    status.message.contains("metadata.name"),
                    "{name}: {}",
                    status.message
                );
            }
            other => panic!("{name}: unexpected error {other}"),
        }
    }
}

/// kube-apiserver's `format: ipv4` parses leniently, so a leading-zero name is stored and would be a
/// second name for 10.0.128.12. Only the webhook's name-encoding rule (SPEC §3 rule 1) refuses it.
#[tokio::test]
async fn leading_zero_ipv4_passes_the_schema_so_admission_must_refuse_it() {
    let api = api().await;
    let created = api
        .create(&PostParams::default(), &object("010.0.128.12", "worker-a"))
        .await;
    assert!(
        created.is_ok(),
        "the schema now refuses leading zeros: {created:?}"
    );
}

#[tokio::test]
async fn status_is_written_only_through_the_status_subresource() {
    let api = api().await;
    let name = "10.0.128.20";
    let mut with_status = object(name, "worker-a");
    with_status.status = Some(CloudPrivateIPConfigStatus {
        node: "worker-a".into(),
        conditions: vec![assigned("True", "CloudResponseSuccess")],
    });
    let created = api
        .create(&PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(created.status, None, "create must drop status");

    // A patch of the main resource leaves status alone.
    let patched = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": "worker-b"}, "status": {"node": "worker-b"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.node, "worker-b");
    assert_eq!(patched.status, None, "main resource must not write status");

    let status = json!({"status": {"node": "worker-b", "conditions": [assigned("Unknown", "CloudResponsePending")]}});
    let patched = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    let status = patched.status.expect("status written");
    assert_eq!(status.node, "worker-b");
    assert_eq!(status.conditions[0].reason, "CloudResponsePending");

    // The subresource validates conditions as upstream does.
    let bad = json!({"status": {"node": "worker-b", "conditions": [{"type": "Assigned", "status": "Maybe", "reason": "x", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    let err = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(bad))
        .await
        .expect_err("an invalid condition status is refused");
    assert!(err.to_string().contains("Unsupported value"), "{err}");
}

#[tokio::test]
async fn server_side_dry_run_validates_without_persisting() {
    let api = api().await;
    let name = "10.0.128.30";
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answered = api.create(&dry, &object(name, "worker-a")).await.unwrap();
    assert_eq!(answered.metadata.name.as_deref(), Some(name));
    assert!(
        api.get_opt(name).await.unwrap().is_none(),
        "dry run persisted the object"
    );

    let err = api
        .create(&dry, &object("not-an-ip-dry-run", "worker-a"))
        .await
        .expect_err("dry run still validates");
    assert!(err.to_string().contains("metadata.name"), "{err}");
}

#[tokio::test]
async fn finalizer_holds_deletion_until_removed() {
    let api = api().await;
    let name = "10.0.128.40";
    let mut obj = object(name, "worker-a");
    obj.metadata.finalizers = Some(vec![cloudnet_shared::FINALIZER.to_string()]);
    api.create(&PostParams::default(), &obj).await.unwrap();
    api.delete(name, &DeleteParams::default()).await.unwrap();
    let held = api
        .get(name)
        .await
        .expect("still there while the finalizer is on");
    assert!(held.metadata.deletion_timestamp.is_some());

    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.get_opt(name).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "object not removed after its finalizer went"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
