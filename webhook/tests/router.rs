//! In-process tests of the HTTP router: well-formed reviews get the shared rules' verdict, and
//! malformed input gets a well-formed denial or a 4xx — never a panic, a 5xx or a hang.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::{ClusterSnapshot, EgressState, NodeInfo};
use cloudnet_webhook::budget::Budget;
use cloudnet_webhook::cache::ClusterCache;
use cloudnet_webhook::metrics::Metrics;
use cloudnet_webhook::router::{AppState, router};
use cloudnet_webhook::slots::Capacity;
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::{Value, json};
use tower::ServiceExt;

fn state() -> AppState {
    let mut snapshot = ClusterSnapshot::new();
    snapshot.upsert_node(NodeInfo {
        name: "worker-a".into(),
        addresses: vec!["10.0.0.10".parse().unwrap()],
        egress: EgressState::Missing,
    });
    AppState {
        cache: Arc::new(ClusterCache::synced(snapshot)),
        metrics: Arc::new(Metrics::new()),
        platform: Some(Platform::Aws),
        budget: Budget::default(),
        capacity: Capacity::default(),
    }
}

fn review(operation: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "6f3d5a29-1111-4222-8333-944455556666",
            "kind": {"group": "cloud.network.openshift.io", "version": "v1", "kind": "CloudPrivateIPConfig"},
            "resource": {"group": "cloud.network.openshift.io", "version": "v1", "resource": "cloudprivateipconfigs"},
            "name": name,
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": {
                "apiVersion": "cloud.network.openshift.io/v1",
                "kind": "CloudPrivateIPConfig",
                "metadata": {"name": name},
                "spec": {"node": node},
            },
            "oldObject": null,
            "dryRun": false,
        }
    })
}

async fn post(state: AppState, path: &str, body: impl Into<Body>) -> (StatusCode, Vec<u8>) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), router(state).oneshot(request))
        .await
        .expect("the router answers within 10 s")
        .unwrap();
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, body)
}

fn response_of(body: &[u8]) -> Value {
    let review: Value = serde_json::from_slice(body).expect("a JSON AdmissionReview");
    assert_eq!(review["kind"], "AdmissionReview");
    review["response"].clone()
}

#[tokio::test]
async fn valid_create_is_allowed_with_the_request_uid() {
    let (status, body) = post(
        state(),
        "/validate",
        review("CREATE", "10.0.0.20", "worker-a").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["uid"], "6f3d5a29-1111-4222-8333-944455556666");
    assert_eq!(response["allowed"], true);
    // The node carries no egress annotation yet: admitted, with a warning saying what was skipped.
    assert!(
        response["warnings"][0]
            .as_str()
            .unwrap()
            .contains("worker-a")
    );
}

#[tokio::test]
async fn a_node_ip_is_denied_naming_the_rule_and_counted() {
    let state = state();
    let (status, body) = post(
        state.clone(),
        "/validate",
        review("CREATE", "10.0.0.10", "worker-a").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("node_ip: ")
    );
    let metrics = state.metrics.encode().unwrap();
    assert!(
        metrics.contains(r#"cloudnet_webhook_requests_total{endpoint="validate",outcome="denied",rule="node_ip"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "cloudnet_webhook_request_duration_seconds_bucket{le=\"0.0001\",endpoint=\"validate\"}"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn another_clouds_annotation_keys_are_counted_warned_and_measured() {
    let mut snapshot = ClusterSnapshot::new();
    snapshot.upsert_node(NodeInfo {
        name: "worker-ip".into(),
        addresses: vec!["10.0.0.11".parse().unwrap()],
        egress: EgressState::from_annotation(Some(
            r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ip":1}}]"#,
        )),
    });
    snapshot.upsert_object("10.0.0.20", "worker-ip", "worker-ip");
    let state = AppState {
        cache: Arc::new(ClusterCache::synced(snapshot)),
        metrics: Arc::new(Metrics::new()),
        platform: Some(Platform::Aws),
        budget: Budget::default(),
        capacity: Capacity::default(),
    };
    let (_, body) = post(
        state.clone(),
        "/validate",
        review("CREATE", "10.0.0.21", "worker-ip").to_string(),
    )
    .await;
    let response = response_of(&body);
    // The "ip" key limits the node although --platform-type=AWS writes "ipv4"/"ipv6".
    assert_eq!(response["allowed"], false, "{response}");
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("capacity: "),
        "{response}"
    );
    assert!(
        response["warnings"][0]
            .as_str()
            .unwrap()
            .contains(r#"its capacity keys are "ip" but platform AWS writes"#),
        "{response}"
    );
    let metrics = state.metrics.encode().unwrap();
    assert!(
        metrics.contains(
            r#"cloudnet_webhook_platform_mismatches_total{platform="AWS",annotation_keys="ip"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn delete_is_allowed_even_for_an_invalid_name() {
    let (_, body) = post(
        state(),
        "/validate",
        review("DELETE", "010.1.2.3", "gone").to_string(),
    )
    .await;
    assert_eq!(response_of(&body)["allowed"], true);
}

#[tokio::test]
async fn mutate_patches_a_raw_ipv6_name_to_the_canonical_one() {
    let (status, body) = post(
        state(),
        "/mutate",
        review("CREATE", "fc00:f853:ccd:e793::54", "worker-a").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    // kube-core serialises the patch bytes as a JSON array of numbers, which kube-apiserver's
    // decoder accepts as readily as base64 (the integration test proves it); accept both.
    let patch: Vec<u8> = match &response["patch"] {
        Value::String(b64) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
        }
        other => serde_json::from_value(other.clone()).unwrap(),
    };
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(
        patch,
        json!([{"op": "replace", "path": "/metadata/name", "value": "fc00.f853.0ccd.e793.0000.0000.0000.0054"}])
    );
}

#[tokio::test]
async fn mutate_leaves_canonical_and_ipv4_names_alone() {
    for name in [
        "10.0.0.20",
        "010.0.0.20",
        "fc00.f853.0ccd.e793.0000.0000.0000.0054",
    ] {
        let (_, body) = post(
            state(),
            "/mutate",
            review("CREATE", name, "worker-a").to_string(),
        )
        .await;
        let response = response_of(&body);
        assert_eq!(response["allowed"], true, "{name}");
        assert!(response.get("patch").is_none(), "{name}: {response}");
    }
}

#[tokio::test]
async fn empty_body_is_a_400() {
    let (status, _) = post(state(), "/validate", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn truncated_json_is_a_400() {
    let full = review("CREATE", "10.0.0.20", "worker-a").to_string();
    let (status, body) = post(state(), "/validate", full[..full.len() / 2].to_owned()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("not an AdmissionReview"));
}

#[tokio::test]
async fn missing_uid_is_a_400() {
    let mut body = review("CREATE", "10.0.0.20", "worker-a");
    body["request"]["uid"] = json!("");
    let (status, _) = post(state(), "/validate", body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    body["request"].as_object_mut().unwrap().remove("uid");
    let (status, _) = post(state(), "/mutate", body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_review_without_request_is_a_400() {
    let (status, _) = post(
        state(),
        "/validate",
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn wrong_kind_gets_a_well_formed_bad_input_denial() {
    let mut body = review("CREATE", "10.0.0.20", "worker-a");
    body["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    let (status, out) = post(state(), "/validate", body.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&out);
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("bad_input: ")
    );
}

#[tokio::test]
async fn non_string_spec_node_gets_a_bad_input_denial() {
    let mut body = review("CREATE", "10.0.0.20", "worker-a");
    body["request"]["object"]["spec"]["node"] = json!(42);
    let (_, out) = post(state(), "/validate", body.to_string()).await;
    let response = response_of(&out);
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.node")
    );
}

#[tokio::test]
async fn a_10_mib_body_is_refused_with_413() {
    let (status, _) = post(state(), "/validate", vec![b' '; 10 * 1024 * 1024]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn unsynced_caches_fail_the_call_and_readyz() {
    let mut state = state();
    state.cache = Arc::new(ClusterCache::new());
    let (status, _) = post(
        state.clone(),
        "/validate",
        review("CREATE", "10.0.0.20", "worker-a").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let readyz = router(state)
        .oneshot(Request::get("/readyz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(readyz.status(), StatusCode::SERVICE_UNAVAILABLE);
    let readyz = router(self::state())
        .oneshot(Request::get("/readyz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(readyz.status(), StatusCode::OK);
}

/// Either a 4xx, or a 200 carrying a well-formed AdmissionReview response.
fn assert_well_formed(status: StatusCode, body: &[u8]) {
    if status == StatusCode::OK {
        let response = response_of(body);
        assert!(response["allowed"].is_boolean(), "{response}");
    } else {
        assert!(status.is_client_error(), "status {status}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_crash_or_5xx(bytes in proptest::collection::vec(any::<u8>(), 0..512), mutate in any::<bool>()) {
        let path = if mutate { "/mutate" } else { "/validate" };
        let (status, body) = runtime().block_on(post(state(), path, bytes));
        assert_well_formed(status, &body);
    }

    #[test]
    fn mangled_reviews_never_crash_or_5xx(
        cut in 0usize..2000,
        name in "\\PC{0,40}",
        node in prop_oneof![Just(json!("worker-a")), Just(json!(null)), Just(json!(7)), Just(json!(["x"])), "\\PC{0,20}".prop_map(Value::from)],
        operation in prop_oneof![Just("CREATE"), Just("UPDATE"), Just("DELETE"), Just("CONNECT"), Just("PATCH")],
    ) {
        let mut review = review(operation, &name, "");
        review["request"]["object"]["spec"]["node"] = node;
        let text = review.to_string();
        let body = text.as_bytes()[..cut.min(text.len())].to_vec();
        let (status, out) = runtime().block_on(post(state(), "/validate", body));
        assert_well_formed(status, &out);
    }
}

#[tokio::test]
async fn a_body_over_one_mebibyte_is_a_413_on_every_admission_path() {
    // Objects are under 1 KiB; a review of 1.5 MiB is abuse, not an object.
    let mut body = review("CREATE", "10.0.0.20", "worker-a");
    body["request"]["object"]["metadata"]["annotations"] =
        json!({"padding": "x".repeat(3 * 512 * 1024)});
    for path in [
        "/validate",
        "/mutate",
        "/validate-egressrouter",
        "/validate-nad",
    ] {
        let (status, _) = post(state(), path, body.to_string()).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
    }
}

#[tokio::test]
async fn mutate_answers_before_the_watch_caches_sync() {
    // /mutate renames IPv6 names and reads no cache, so it must not wait for one.
    let unsynced = AppState {
        cache: Arc::new(ClusterCache::new()),
        metrics: Arc::new(Metrics::new()),
        platform: Some(Platform::Aws),
        budget: Budget::default(),
        capacity: Capacity::default(),
    };
    let (status, body) = post(
        unsynced.clone(),
        "/mutate",
        review("CREATE", "fc00:f853:ccd:e793::54", "worker-a").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response_of(&body)["patchType"], "JSONPatch");
    let (status, _) = post(
        unsynced,
        "/validate",
        review("CREATE", "10.0.0.20", "worker-a").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// A request to `/validate` declaring a 4 KiB body that never comes.
fn stalled_request() -> Request<Body> {
    Request::post("/validate")
        .header("content-type", "application/json")
        .header("content-length", "4096")
        .body(Body::from_stream(futures::stream::pending::<
            Result<axum::body::Bytes, std::io::Error>,
        >()))
        .unwrap()
}

/// [`stalled_request`] sent to `app`.
fn stalled(app: &axum::Router) -> impl std::future::Future<Output = ()> + Unpin + use<> {
    let call = app.clone().oneshot(stalled_request());
    Box::pin(async move {
        let _ = call.await;
    })
}

#[tokio::test]
async fn a_valid_review_is_answered_while_more_requests_than_slots_stall_their_bodies() {
    use cloudnet_webhook::router::MAX_CONCURRENT_REQUESTS;
    let app = router(state());
    // Polled once, each is waiting for its body; none may hold a request slot meanwhile.
    let mut held = Vec::new();
    for _ in 0..MAX_CONCURRENT_REQUESTS + 88 {
        let mut request = stalled(&app);
        assert!(futures::poll!(&mut request).is_pending());
        held.push(request);
    }
    let valid = Request::post("/validate")
        .header("content-type", "application/json")
        .body(Body::from(
            review("CREATE", "10.0.0.20", "worker-a").to_string(),
        ))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(valid))
        .await
        .expect("a valid review waited for a slot held by a stalled body")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    for path in ["/healthz", "/readyz", "/metrics"] {
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            app.clone()
                .oneshot(Request::get(path).body(Body::empty()).unwrap()),
        )
        .await
        .unwrap_or_else(|_| panic!("{path} waited for an admission slot"))
        .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stalls_is_answered_408_at_its_deadline() {
    let app = router(state());
    let started = tokio::time::Instant::now();
    let response = app.oneshot(stalled_request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    let waited = started.elapsed();
    assert!(
        waited >= cloudnet_webhook::intake::BODY_READ_TIMEOUT
            && waited < cloudnet_webhook::router::REQUEST_TIMEOUT,
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn readyz_turns_503_once_every_request_slot_stays_held_and_200_when_one_frees() {
    let state = state();
    let requests = state.capacity.requests.clone();
    let app = router(state);
    let readyz = || async {
        app.clone()
            .oneshot(Request::get("/readyz").body(Body::empty()).unwrap())
            .await
            .unwrap()
            .status()
    };
    let mut held = Vec::new();
    for _ in 0..requests.total() {
        held.push(requests.acquire().await.unwrap());
    }
    assert_eq!(
        readyz().await,
        StatusCode::OK,
        "saturated only for a moment"
    );
    tokio::time::advance(cloudnet_webhook::slots::SATURATED_AFTER).await;
    assert_eq!(readyz().await, StatusCode::SERVICE_UNAVAILABLE);
    held.pop();
    assert_eq!(readyz().await, StatusCode::OK);
}
