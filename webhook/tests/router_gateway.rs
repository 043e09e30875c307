//! In-process tests of `/validate-egressgateway` and of the gateway rule on `/validate`: the
//! shared rules' verdicts with the nodes, objects, gateways and pools of the cache, warnings
//! passed on, status writes let through, 503 before the watches have listed, malformed
//! gateways denied, never a panic; and a CloudPrivateIPConfig created for a gateway's IP refused
//! unless it is the gateway front end's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cloudnet_shared::antrea::{ExternalIPPool, ExternalIPPoolSpec, IpRange};
use cloudnet_shared::gateway::FRONT_END;
use cloudnet_shared::platform::Platform;
use cloudnet_shared::{ClusterSnapshot, FRONT_END_LABEL, NodeInfo};
use cloudnet_webhook::admission;
use cloudnet_webhook::budget::Budget;
use cloudnet_webhook::cache::ClusterCache;
use cloudnet_webhook::metrics::Metrics;
use cloudnet_webhook::router::{AppState, router};
use cloudnet_webhook::slots::Capacity;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::NodeAddress;
use serde_json::{Value, json};
use tower::ServiceExt;

const GATEWAYS: &str = "/validate-egressgateway";

/// Node `worker-a` (label `gateway=yes`) in 10.0.0.0/24, gateway `db` holding 10.0.0.120, the
/// opted-in pool `egress-pool` of 10.0.0.128/28, and a plugin's CloudPrivateIPConfig 10.0.0.150.
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
    snapshot.set_node_labels(
        "worker-a",
        [("gateway".to_owned(), "yes".to_owned())].into(),
    );
    snapshot.gateways_mut().upsert("db", ["10.0.0.120"]);
    let pool = ExternalIPPool::new(
        "egress-pool",
        ExternalIPPoolSpec {
            ip_ranges: vec![IpRange {
                cidr: "10.0.0.128/28".into(),
                ..IpRange::default()
            }],
            ..ExternalIPPoolSpec::default()
        },
    );
    snapshot.upsert_antrea_pool(&pool);
    snapshot.upsert_object("10.0.0.150", "worker-a", "worker-a");
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

fn gateway(ips: &[&str]) -> Value {
    json!({
        "apiVersion": "cloudnet.io/v1alpha1",
        "kind": "EgressGateway",
        "metadata": {"name": "web"},
        "spec": {"nodeSelector": {"matchLabels": {"gateway": "yes"}}, "egressIPs": ips},
    })
}

fn review(operation: &str, object: Value, old: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7e4d3c2b-1111-4222-8333-944455556666",
            "kind": {"group": "cloudnet.io", "version": "v1alpha1", "kind": "EgressGateway"},
            "resource": {"group": "cloudnet.io", "version": "v1alpha1", "resource": "egressgateways"},
            "name": object["metadata"]["name"].clone(),
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

fn create(object: Value) -> Value {
    review("CREATE", object, Value::Null)
}

/// A CREATE review of CloudPrivateIPConfig `name` with `labels`.
fn object_review(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "8f5e4d3c-1111-4222-8333-944455556666",
            "kind": {"group": "cloud.network.openshift.io", "version": "v1", "kind": "CloudPrivateIPConfig"},
            "resource": {"group": "cloud.network.openshift.io", "version": "v1", "resource": "cloudprivateipconfigs"},
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": {
                "apiVersion": "cloud.network.openshift.io/v1",
                "kind": "CloudPrivateIPConfig",
                "metadata": {"name": name, "labels": labels},
                "spec": {"node": "worker-a"},
            },
            "oldObject": null,
            "dryRun": false,
        }
    })
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
async fn a_gateway_is_judged_against_the_cached_cluster_and_counted() {
    let state = state(Platform::Aws);
    let (status, response) = post(state.clone(), GATEWAYS, create(gateway(&["10.0.0.100"]))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response["allowed"], true, "{response}");
    // (IP, the start of the refusal)
    let table = [
        (
            "10.0.0.100 ",
            "egress_gateway_ip: EgressGateway web: egressIPs[0] \"10.0.0.100 \" is not an IP address in canonical form",
        ),
        (
            "10.0.0.10",
            "node_ip: EgressGateway web: egressIPs[0] 10.0.0.10 is an address of node worker-a",
        ),
        (
            "10.0.1.5",
            "address_index: EgressGateway web: egressIPs[0] 10.0.1.5 cannot be attached by AWS to node worker-a",
        ),
        (
            "10.0.0.120",
            "egress_gateway_conflict: EgressGateway web: egressIPs[0] 10.0.0.120 is an egress IP of EgressGateway db already",
        ),
        (
            "10.0.0.130",
            "egress_gateway_conflict: EgressGateway web: egressIPs[0] 10.0.0.130 lies in Antrea ExternalIPPool egress-pool",
        ),
        (
            "10.0.0.150",
            "egress_gateway_conflict: EgressGateway web: egressIPs[0] 10.0.0.150 is held by CloudPrivateIPConfig 10.0.0.150, on node worker-a,",
        ),
    ];
    for (ip, start) in table {
        let message = denial(state.clone(), GATEWAYS, create(gateway(&[ip]))).await;
        assert!(message.starts_with(start), "{ip}: {message}");
    }
    let metrics = state.metrics.encode().unwrap();
    for line in [
        r#"cloudnet_webhook_requests_total{endpoint="validate_egressgateway",outcome="allowed",rule=""} 1"#,
        r#"cloudnet_webhook_requests_total{endpoint="validate_egressgateway",outcome="denied",rule="egress_gateway_conflict"} 3"#,
        r#"cloudnet_webhook_requests_total{endpoint="validate_egressgateway",outcome="denied",rule="node_ip"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[tokio::test]
async fn ipv6_gateways_are_refused_on_gcp_and_unchecked_ones_warned() {
    let message = denial(
        state(Platform::Gcp),
        GATEWAYS,
        create(gateway(&["fd00::100"])),
    )
    .await;
    assert_eq!(
        message,
        "address_index: EgressGateway web: egressIPs[0] fd00::100 is IPv6, and GCP attaches only IPv4 egress IPs (alias IP ranges are IPv4 only); use IPv4 addresses"
    );
    let mut later = gateway(&["10.0.5.100"]);
    later["spec"]["nodeSelector"] = json!({"matchLabels": {"gateway": "later"}});
    let (_, response) = post(state(Platform::Aws), GATEWAYS, create(later)).await;
    assert_eq!(response["allowed"], true, "{response}");
    let warning = response["warnings"][0].as_str().unwrap();
    assert!(warning.contains("picks no node yet"), "{warning}");
}

#[tokio::test]
async fn status_writes_and_unchanged_specs_pass_and_unsynced_caches_answer_503() {
    // A gateway whose IP is now another's: the reconciler's status write and a label change pass.
    let taken = gateway(&["10.0.0.120"]);
    let mut status = review("UPDATE", taken.clone(), taken.clone());
    status["request"]["subResource"] = json!("status");
    let (_, response) = post(state(Platform::Aws), GATEWAYS, status).await;
    assert_eq!(response["allowed"], true, "{response}");
    let mut labelled = taken.clone();
    labelled["metadata"]["labels"] = json!({"team": "payments"});
    let (_, response) = post(
        state(Platform::Aws),
        GATEWAYS,
        review("UPDATE", labelled, taken),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    // Before the watches have listed, the review is not decided from an empty cache.
    let unsynced = state_on(Platform::Aws, ClusterCache::new());
    let (status, _) = post(unsynced, GATEWAYS, create(gateway(&["10.0.0.100"]))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn malformed_gateways_and_other_kinds_are_denied_never_a_panic() {
    let mut broken = gateway(&[]);
    broken["spec"]["egressIPs"] = json!("10.0.0.100");
    let message = denial(state(Platform::Aws), GATEWAYS, create(broken)).await;
    assert!(
        message.starts_with("bad_input: the spec of EgressGateway \"web\" is unreadable"),
        "{message}"
    );
    let mut operator = gateway(&["10.0.0.100"]);
    operator["spec"]["nodeSelector"] =
        json!({"matchExpressions": [{"key": "gateway", "operator": "Gt", "values": ["1"]}]});
    let message = denial(state(Platform::Aws), GATEWAYS, create(operator)).await;
    assert!(
        message.starts_with("bad_input: EgressGateway web: spec.nodeSelector cannot be read"),
        "{message}"
    );
    let mut wrong = create(gateway(&["10.0.0.100"]));
    wrong["request"]["kind"] =
        json!({"group": "cloudnet.io", "version": "v1alpha1", "kind": "EgressPublicIP"});
    let message = denial(state(Platform::Aws), GATEWAYS, wrong).await;
    assert!(
        message.contains("limit the webhook configuration's rules to egressgateways"),
        "{message}"
    );
}

#[tokio::test]
async fn a_cloudprivateipconfig_for_a_gateways_ip_needs_the_gateway_front_ends_label() {
    let message = denial(
        state(Platform::Aws),
        "/validate",
        object_review("10.0.0.120", json!({})),
    )
    .await;
    assert!(
        message.starts_with("egress_gateway_conflict: cannot create CloudPrivateIPConfig 10.0.0.120: 10.0.0.120 is an egress IP of EgressGateway db"),
        "{message}"
    );
    let ours = json!({FRONT_END_LABEL: FRONT_END});
    let (_, response) = post(
        state(Platform::Aws),
        "/validate",
        object_review("10.0.0.120", ours),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    // Before the gateway watch has listed, the check is skipped with a warning.
    let request = admission::parse(
        object_review("10.0.0.120", json!({}))
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let answer = admission::validate(&request, &snapshot(), Some(Platform::Aws), false);
    let response = answer.review.response.unwrap();
    assert!(response.allowed, "{:?}", response.result);
    let warnings = response.warnings.unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("the webhook has not listed the EgressGateways yet")),
        "{warnings:?}"
    );
}
