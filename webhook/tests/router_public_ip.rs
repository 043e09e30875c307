//! In-process tests of `/validate-egresspublicip`: the shared rules' verdicts with the other
//! bindings from the cache, the status subresource and metadata updates let through, 503 while
//! the EgressPublicIP cache is not synced, and malformed specs denied, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cloudnet_shared::ClusterSnapshot;
use cloudnet_shared::platform::Platform;
use cloudnet_shared::public_ip::EgressPublicIPSpec;
use cloudnet_webhook::budget::Budget;
use cloudnet_webhook::cache::ClusterCache;
use cloudnet_webhook::metrics::Metrics;
use cloudnet_webhook::router::{AppState, router};
use cloudnet_webhook::slots::Capacity;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const PATH: &str = "/validate-egresspublicip";
const EIP: &str = "eipalloc-0123456789abcdef0";

fn state_on(platform: Option<Platform>, cache: ClusterCache) -> AppState {
    AppState {
        cache: Arc::new(cache),
        metrics: Arc::new(Metrics::new()),
        platform,
        budget: Budget::default(),
        capacity: Capacity::default(),
    }
}

/// AWS, with binding `taken` of 10.0.0.9 to eipalloc-…9 already in the cache.
fn state(platform: Platform) -> AppState {
    let mut snapshot = ClusterSnapshot::new();
    snapshot.public_ips_mut().upsert(
        "taken",
        &EgressPublicIPSpec {
            private_ip: "10.0.0.9".into(),
            public_ip: "eipalloc-99999999".into(),
        },
    );
    state_on(Some(platform), ClusterCache::synced(snapshot))
}

fn binding(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "cloudnet.io/v1alpha1",
        "kind": "EgressPublicIP",
        "metadata": {"name": name},
        "spec": spec,
    })
}

fn review(operation: &str, object: Value, old: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "5d4c3b2a-1111-4222-8333-944455556666",
            "kind": {"group": "cloudnet.io", "version": "v1alpha1", "kind": "EgressPublicIP"},
            "resource": {"group": "cloudnet.io", "version": "v1alpha1", "resource": "egresspublicips"},
            "name": object["metadata"]["name"].clone(),
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

fn create(private_ip: &str, public_ip: &str) -> Value {
    review(
        "CREATE",
        binding(
            "b1",
            json!({"privateIP": private_ip, "publicIP": public_ip}),
        ),
        Value::Null,
    )
}

/// The HTTP status and the review's `response`.
async fn post(state: AppState, review: Value) -> (StatusCode, Value) {
    let request = Request::post(PATH)
        .header("content-type", "application/json")
        .body(Body::from(review.to_string()))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), router(state).oneshot(request))
        .await
        .expect("the router answers within 10 s")
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let answer =
        serde_json::from_slice::<Value>(&body).map_or(Value::Null, |r| r["response"].clone());
    (status, answer)
}

async fn denial(state: AppState, review: Value) -> String {
    let (status, response) = post(state, review).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 403);
    response["status"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_valid_binding_is_allowed_and_counted() {
    let state = state(Platform::Aws);
    let (status, response) = post(state.clone(), create("10.0.0.5", EIP)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["uid"], "5d4c3b2a-1111-4222-8333-944455556666");
    let metrics = state.metrics.encode().unwrap();
    assert!(
        metrics.contains(r#"cloudnet_webhook_requests_total{endpoint="validate_egresspublicip",outcome="allowed",rule=""} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_second_binding_of_a_private_ip_or_public_address_is_denied_naming_the_first() {
    let state = state(Platform::Aws);
    assert_eq!(
        denial(state.clone(), create("10.0.0.9", EIP)).await,
        "public_ip_conflict: EgressPublicIP taken already binds a public address to 10.0.0.9: an egress IP takes one public address; delete taken first to bind another"
    );
    assert_eq!(
        denial(state.clone(), create("10.0.0.5", "eipalloc-99999999")).await,
        "public_ip_conflict: EgressPublicIP taken already binds eipalloc-99999999 to an egress IP: a public address follows one egress IP; delete taken first to move it"
    );
    let metrics = state.metrics.encode().unwrap();
    assert!(
        metrics.contains(r#"cloudnet_webhook_requests_total{endpoint="validate_egresspublicip",outcome="denied",rule="public_ip_conflict"} 2"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn each_field_and_the_cloud_are_checked_with_their_rules() {
    let message = denial(state(Platform::Aws), create("10.0.0.05", EIP)).await;
    assert_eq!(
        message,
        "public_ip_private: privateIP \"10.0.0.05\" is not an IP address in canonical form: use \"10.0.0.5\""
    );
    let message = denial(state(Platform::OpenStack), create("10.0.0.5", EIP)).await;
    assert!(
        message.starts_with("public_ip_id: publicIP \"eipalloc-0123456789abcdef0\" is AWS's kind of id, but the cluster runs on OpenStack"),
        "{message}"
    );
    let message = denial(state(Platform::Gcp), create("10.0.0.5", EIP)).await;
    assert!(
        message.starts_with("public_ip_platform: GCP cannot bind"),
        "{message}"
    );
    assert!(
        message.contains("Cloud NAT with reserved addresses"),
        "{message}"
    );
}

#[tokio::test]
async fn status_writes_and_metadata_updates_pass_but_a_spec_change_does_not() {
    let state = state(Platform::Aws);
    let old = binding(
        "taken",
        json!({"privateIP": "10.0.0.9", "publicIP": "eipalloc-99999999"}),
    );
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let (_, response) = post(state.clone(), review("UPDATE", relabelled, old.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");

    let mut status_write = review("UPDATE", old.clone(), old.clone());
    status_write["request"]["subResource"] = json!("status");
    status_write["request"]["object"]["spec"] = json!("garbage");
    let (_, response) = post(state.clone(), status_write).await;
    assert_eq!(response["allowed"], true, "{response}");

    let moved = binding(
        "taken",
        json!({"privateIP": "10.0.0.10", "publicIP": "eipalloc-99999999"}),
    );
    let message = denial(state, review("UPDATE", moved, old)).await;
    assert!(
        message.starts_with("public_ip_immutable: the spec of EgressPublicIP taken cannot change"),
        "{message}"
    );
}

#[tokio::test]
async fn malformed_specs_and_other_kinds_get_bad_input_denials() {
    for spec in [
        json!({"privateIP": 10, "publicIP": EIP}),
        json!({"privateIP": "10.0.0.5"}),
        json!("x"),
        Value::Null,
    ] {
        let message = denial(
            state(Platform::Aws),
            review("CREATE", binding("b1", spec.clone()), Value::Null),
        )
        .await;
        assert!(
            message.starts_with("bad_input: the spec of EgressPublicIP \"b1\" is unreadable"),
            "{spec}: {message}"
        );
    }
    let mut other = create("10.0.0.5", EIP);
    other["request"]["kind"] = json!({"group": "cloud.network.openshift.io", "version": "v1", "kind": "CloudPrivateIPConfig"});
    let message = denial(state(Platform::Aws), other).await;
    assert!(
        message.contains("limit the webhook configuration's rules to egresspublicips"),
        "{message}"
    );
}

#[tokio::test]
async fn an_unsynced_binding_cache_fails_the_call_with_503() {
    let (status, _) = post(
        state_on(Some(Platform::Aws), ClusterCache::new()),
        create("10.0.0.5", EIP),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}
