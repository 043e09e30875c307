//! In-process tests of `/validate-antrea-externalippool` and `/validate-antrea-egress`: the
//! shared rules' verdicts with nodes and pools from the cache, IPv6 refused on GCP, warnings
//! passed on, status writes let through, 503 for an Egress while the pool watch has not listed,
//! and malformed objects denied, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cloudnet_shared::ClusterSnapshot;
use cloudnet_shared::NodeInfo;
use cloudnet_shared::antrea::{ExternalIPPool, ExternalIPPoolSpec, IpRange, OPT_IN_LABEL};
use cloudnet_shared::platform::Platform;
use cloudnet_webhook::budget::Budget;
use cloudnet_webhook::cache::ClusterCache;
use cloudnet_webhook::metrics::Metrics;
use cloudnet_webhook::router::{AppState, router};
use cloudnet_webhook::slots::Capacity;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::NodeAddress;
use serde_json::{Value, json};
use tower::ServiceExt;

const POOLS: &str = "/validate-antrea-externalippool";
const EGRESSES: &str = "/validate-antrea-egress";

/// Node `worker-a` (label `egress=yes`) in 10.0.0.0/24 with room for 4 IPs, and the opted-in
/// pool `egress-pool` of 10.0.0.100/30.
fn snapshot() -> ClusterSnapshot {
    let mut snapshot = ClusterSnapshot::new();
    let annotation =
        r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ip":4}}]"#;
    let addresses = [NodeAddress {
        type_: "InternalIP".into(),
        address: "10.0.0.10".into(),
    }];
    snapshot.upsert_node(NodeInfo::from_parts(
        "worker-a",
        Some(annotation),
        &addresses,
    ));
    snapshot.set_node_labels("worker-a", [("egress".to_owned(), "yes".to_owned())].into());
    let mut pool = ExternalIPPool::new(
        "egress-pool",
        ExternalIPPoolSpec {
            ip_ranges: vec![IpRange {
                cidr: "10.0.0.100/30".into(),
                ..IpRange::default()
            }],
            ..ExternalIPPoolSpec::default()
        },
    );
    pool.metadata.labels = Some([(OPT_IN_LABEL.to_owned(), "true".to_owned())].into());
    snapshot.upsert_antrea_pool(&pool);
    snapshot
}

fn state_on(platform: Platform, cache: ClusterCache) -> AppState {
    AppState {
        cache: Arc::new(cache),
        metrics: Arc::new(Metrics::new()),
        platform: Some(platform),
        budget: Budget::default(),
        capacity: Capacity::default(),
    }
}

fn state(platform: Platform) -> AppState {
    state_on(platform, ClusterCache::synced(snapshot()))
}

fn pool(ranges: Value, labelled: bool) -> Value {
    let labels = if labelled {
        json!({OPT_IN_LABEL: "true"})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "crd.antrea.io/v1beta1",
        "kind": "ExternalIPPool",
        "metadata": {"name": "new-pool", "labels": labels},
        "spec": {"ipRanges": ranges, "nodeSelector": {"matchLabels": {"egress": "yes"}}},
    })
}

fn egress(ip: &str) -> Value {
    json!({
        "apiVersion": "crd.antrea.io/v1beta1",
        "kind": "Egress",
        "metadata": {"name": "web"},
        "spec": {"appliedTo": {}, "egressIP": ip, "externalIPPool": "egress-pool"},
    })
}

fn review(kind: &str, resource: &str, operation: &str, object: Value, old: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "5d4c3b2a-1111-4222-8333-944455556666",
            "kind": {"group": "crd.antrea.io", "version": "v1beta1", "kind": kind},
            "resource": {"group": "crd.antrea.io", "version": "v1beta1", "resource": resource},
            "name": object["metadata"]["name"].clone(),
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

fn pool_review(object: Value) -> Value {
    review(
        "ExternalIPPool",
        "externalippools",
        "CREATE",
        object,
        Value::Null,
    )
}

fn egress_review(object: Value) -> Value {
    review("Egress", "egresses", "CREATE", object, Value::Null)
}

/// The HTTP status and the review's `response`.
async fn post(state: AppState, path: &str, review: Value) -> (StatusCode, Value) {
    let request = Request::post(path)
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

async fn denial(state: AppState, path: &str, review: Value) -> String {
    let (status, response) = post(state, path, review).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 403);
    response["status"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_pool_is_judged_against_the_cached_nodes_and_counted() {
    let state = state(Platform::Azure);
    let good = pool(json!([{"start": "10.0.0.100", "end": "10.0.0.103"}]), true);
    let (status, response) = post(state.clone(), POOLS, pool_review(good)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response["allowed"], true, "{response}");
    let big = pool(json!([{"cidr": "10.0.0.96/29"}]), true);
    let message = denial(state.clone(), POOLS, pool_review(big)).await;
    assert!(
        message.starts_with("capacity: ExternalIPPool new-pool holds 8 addresses, but the 1 nodes its nodeSelector picks can hold 4 egress IPs"),
        "{message}"
    );
    let metrics = state.metrics.encode().unwrap();
    for line in [
        r#"cloudnet_webhook_requests_total{endpoint="validate_antrea_externalippool",outcome="allowed",rule=""} 1"#,
        r#"cloudnet_webhook_requests_total{endpoint="validate_antrea_externalippool",outcome="denied",rule="capacity"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[tokio::test]
async fn ipv6_pools_are_refused_on_gcp_only() {
    let ranges = json!([{"start": "fd00::100", "end": "fd00::101"}]);
    let message = denial(
        state(Platform::Gcp),
        POOLS,
        pool_review(pool(ranges.clone(), true)),
    )
    .await;
    assert_eq!(
        message,
        "address_index: ExternalIPPool new-pool: ipRanges[0] (fd00::100-fd00::101) is IPv6, and GCP attaches only IPv4 egress IPs (alias IP ranges are IPv4 only); use IPv4 ranges"
    );
    // Elsewhere the node's missing IPv6 subnet is what refuses it.
    let message = denial(
        state(Platform::Azure),
        POOLS,
        pool_review(pool(ranges.clone(), true)),
    )
    .await;
    assert!(message.contains("the node has no IPv6 subnet"), "{message}");
    // Without the label nothing is checked.
    let (_, response) = post(
        state(Platform::Gcp),
        POOLS,
        pool_review(pool(ranges, false)),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn an_unchecked_pool_is_admitted_with_its_warning() {
    let mut far = pool(json!([{"cidr": "10.0.5.0/24"}]), true);
    far["spec"]["nodeSelector"] = json!({"matchLabels": {"egress": "later"}});
    let (_, response) = post(state(Platform::Aws), POOLS, pool_review(far)).await;
    assert_eq!(response["allowed"], true, "{response}");
    let warning = response["warnings"][0].as_str().unwrap();
    assert!(warning.contains("picks no node yet"), "{warning}");
}

#[tokio::test]
async fn an_egress_ip_is_judged_against_the_cached_pool_and_waits_for_its_watch() {
    let message = denial(
        state(Platform::Aws),
        EGRESSES,
        egress_review(egress("10.0.0.110")),
    )
    .await;
    assert_eq!(
        message,
        "antrea_egress_ip: Egress web: spec.egressIP 10.0.0.110 is outside ExternalIPPool egress-pool (10.0.0.100/30), whose IPs cloudnet attaches; pick an address in the pool's ranges, or leave the IP empty for Antrea to allocate one"
    );
    let (_, response) = post(
        state(Platform::Aws),
        EGRESSES,
        egress_review(egress("10.0.0.101")),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    // The agents' status writes pass whatever the spec says.
    let mut status = egress_review(egress("10.0.0.110"));
    status["request"]["subResource"] = json!("status");
    let (_, response) = post(state(Platform::Aws), EGRESSES, status).await;
    assert_eq!(response["allowed"], true, "{response}");
    // Before the pool watch has listed, the review is not decided from an empty cache.
    let unsynced = state_on(Platform::Aws, ClusterCache::new());
    let (status, _) = post(unsynced, EGRESSES, egress_review(egress("10.0.0.110"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn malformed_objects_and_other_kinds_are_denied_never_a_panic() {
    let broken = pool(json!([{"cidr": "not-a-cidr"}]), true);
    let message = denial(state(Platform::Aws), POOLS, pool_review(broken)).await;
    assert!(
        message.starts_with("bad_input: ExternalIPPool new-pool: ipRanges[0].cidr"),
        "{message}"
    );
    let mut wrong = pool(json!([]), true);
    wrong["spec"]["ipRanges"] = json!("10.0.0.0/24");
    let message = denial(state(Platform::Aws), POOLS, pool_review(wrong)).await;
    assert!(
        message.starts_with("bad_input: ExternalIPPool \"new-pool\" is unreadable"),
        "{message}"
    );
    let mut ips = egress("10.0.0.1");
    ips["spec"]["egressIPs"] = json!({"not": "a list"});
    let message = denial(state(Platform::Aws), EGRESSES, egress_review(ips)).await;
    assert!(
        message.starts_with("bad_input: the spec of Egress \"web\" is unreadable"),
        "{message}"
    );
    let message = denial(
        state(Platform::Aws),
        EGRESSES,
        pool_review(pool(json!([]), true)),
    )
    .await;
    assert!(
        message.contains("limit the webhook configuration's rules to egresses"),
        "{message}"
    );
}
