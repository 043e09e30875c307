//! In-process tests of the egress-router endpoints: `/validate-egressrouter` and `/validate-nad`
//! answer with the shared rules' verdict, unrelated NetworkAttachmentDefinitions are allowed
//! whatever the caches' state, and no input makes them panic or answer 5xx.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cloudnet_shared::egress::RouterRef;
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

fn state_with(cache: ClusterCache) -> AppState {
    AppState {
        cache: Arc::new(cache),
        metrics: Arc::new(Metrics::new()),
        platform: Some(Platform::Aws),
        budget: Budget::default(),
        capacity: Capacity::default(),
    }
}

fn state() -> AppState {
    let mut snapshot = ClusterSnapshot::new();
    snapshot.upsert_node(NodeInfo {
        name: "worker-a".into(),
        addresses: vec!["192.168.3.5".parse().unwrap()],
        egress: EgressState::Missing,
    });
    let r2 = RouterRef::egress_router("other", "r2");
    snapshot
        .routers_mut()
        .upsert(r2.clone(), r2, vec!["192.168.3.30".parse().unwrap()]);
    state_with(ClusterCache::synced(snapshot))
}

fn admission(kind: (&str, &str, &str), operation: &str, object: Value) -> Value {
    let (group, kind, resource) = kind;
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c1d5a29-1111-4222-8333-944455556666",
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "name": object["metadata"]["name"].clone(),
            "namespace": "egress",
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": null,
            "dryRun": false,
        }
    })
}

const ROUTER: (&str, &str, &str) = (
    "network.operator.openshift.io",
    "EgressRouter",
    "egressrouters",
);
const NAD: (&str, &str, &str) = (
    "k8s.cni.cncf.io",
    "NetworkAttachmentDefinition",
    "network-attachment-definitions",
);

fn egress_router(ip: &str) -> Value {
    admission(
        ROUTER,
        "CREATE",
        json!({
            "apiVersion": "network.operator.openshift.io/v1",
            "kind": "EgressRouter",
            "metadata": {"name": "r1", "namespace": "egress"},
            "spec": {
                "mode": "Redirect",
                "networkInterface": {"macvlan": {"mode": "Bridge"}},
                "addresses": [{"ip": ip, "gateway": "192.168.3.1"}],
                "redirect": {"fallbackIP": "203.0.113.27"}
            }
        }),
    )
}

fn nad(config: &str) -> Value {
    admission(
        NAD,
        "CREATE",
        json!({
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "n1", "namespace": "egress"},
            "spec": {"config": config}
        }),
    )
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
    review["response"].clone()
}

async fn message(path: &str, review: Value) -> String {
    let (status, body) = post(state(), path, review.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 403);
    response["status"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_valid_egress_router_is_allowed() {
    let (status, body) = post(
        state(),
        "/validate-egressrouter",
        egress_router("192.168.3.10/24").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response_of(&body)["allowed"], true);
}

#[tokio::test]
async fn egress_router_rules_deny_with_their_messages() {
    assert_eq!(
        message("/validate-egressrouter", egress_router("192.168.3.10")).await,
        "egress_router_address: EgressRouter egress/r1: spec.addresses[0].ip \"192.168.3.10\" has no prefix length; write it in CIDR form with its network's prefix length, e.g. \"192.168.3.10/24\""
    );
    assert_eq!(
        message("/validate-egressrouter", egress_router("192.168.3.5/24")).await,
        "egress_router_conflict: EgressRouter egress/r1 uses 192.168.3.5, which is an address of node worker-a (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must not be taken by a router; pick an unused address of the router's network"
    );
    assert_eq!(
        message("/validate-egressrouter", egress_router("192.168.3.30/24")).await,
        "egress_router_conflict: EgressRouter egress/r1 uses 192.168.3.30, which EgressRouter other/r2 already uses; give each egress router its own address"
    );
    let mut wrong = egress_router("192.168.3.10/24");
    wrong["request"]["object"]["spec"]["addresses"] = json!("192.168.3.10/24");
    assert!(message("/validate-egressrouter", wrong).await.starts_with(
        "bad_input: the spec of EgressRouter egress/r1 is not an EgressRouter spec ("
    ));
}

#[tokio::test]
async fn an_egress_router_nad_is_denied_with_the_message_and_counted() {
    let state = state();
    let config = r#"{"cniVersion":"0.4.0","type":"egress-router","name":"n1","ip":{"addresses":["192.168.3.10/24"]},"podIP":{"a":{"addresses":["192.168.3.11/24"]}}}"#;
    let (status, body) = post(state.clone(), "/validate-nad", nad(config).to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        response_of(&body)["status"]["message"],
        "egress_router_cni: NetworkAttachmentDefinition egress/n1: spec.config: sets ip and podIP; set exactly one of ip, podIP and ipConfig"
    );
    let metrics = state.metrics.encode().unwrap();
    assert!(
        metrics.contains(r#"cloudnet_webhook_requests_total{endpoint="validate_nad",outcome="denied",rule="egress_router_cni"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn unrelated_nads_are_allowed_even_before_the_caches_sync() {
    let cold = state_with(ClusterCache::new());
    let macvlan =
        r#"{"cniVersion":"0.3.1","type":"macvlan","master":"eth0","ipam":{"type":"dhcp"}}"#;
    let (status, body) = post(cold.clone(), "/validate-nad", nad(macvlan).to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response_of(&body)["allowed"], true);
    // An egress-router one waits for the caches instead of being decided on empty ones.
    let ours = r#"{"type":"egress-router","ip":{"addresses":["192.168.3.10/24"]}}"#;
    let (status, _) = post(cold.clone(), "/validate-nad", nad(ours).to_string()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = post(
        cold,
        "/validate-egressrouter",
        egress_router("192.168.3.10/24").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_review_of_another_kind_is_bad_input() {
    let mut review = egress_router("192.168.3.10/24");
    review["request"]["kind"] =
        json!({"group": "k8s.cni.cncf.io", "version": "v1", "kind": "NetworkAttachmentDefinition"});
    assert_eq!(
        message("/validate-egressrouter", review).await,
        "bad_input: this endpoint reviews EgressRouter.network.operator.openshift.io only, but was sent a NetworkAttachmentDefinition.k8s.cni.cncf.io; limit the webhook configuration's rules to egressrouters"
    );
    let mut review = nad("{}");
    review["request"]["kind"] =
        json!({"group": "network.operator.openshift.io", "version": "v1", "kind": "EgressRouter"});
    assert!(message("/validate-nad", review).await.starts_with(
        "bad_input: this endpoint reviews NetworkAttachmentDefinition.k8s.cni.cncf.io only"
    ));
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

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::from),
        Just(Value::from("egress-router")),
        Just(Value::from("192.168.3.10/24")),
        "\\PC{0,12}".prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("ip".to_owned()),
                    Just("addresses".to_owned()),
                    Just("redirect".to_owned()),
                    Just("type".to_owned()),
                    "[a-zA-Z]{1,8}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_crash_or_5xx(bytes in proptest::collection::vec(any::<u8>(), 0..512), nad in any::<bool>()) {
        let path = if nad { "/validate-nad" } else { "/validate-egressrouter" };
        let (status, body) = runtime().block_on(post(state(), path, bytes));
        assert_well_formed(status, &body);
    }

    #[test]
    fn mangled_objects_never_crash_or_5xx(
        spec in json_value(),
        config in json_value(),
        operation in prop_oneof![Just("CREATE"), Just("UPDATE"), Just("DELETE"), Just("CONNECT")],
        cut in 0usize..3000,
    ) {
        let mut router = egress_router("192.168.3.10/24");
        router["request"]["operation"] = json!(operation);
        router["request"]["object"]["spec"] = spec.clone();
        router["request"]["oldObject"] = json!({"metadata": {"name": "r1"}, "spec": spec});
        let mut with_config = config.clone();
        if let Some(map) = with_config.as_object_mut() {
            map.insert("type".into(), "egress-router".into());
        }
        let mut nad_review = nad(&with_config.to_string());
        nad_review["request"]["operation"] = json!(operation);
        let mut odd = nad("");
        odd["request"]["object"]["spec"]["config"] = config;
        for (path, review) in [("/validate-egressrouter", router), ("/validate-nad", nad_review), ("/validate-nad", odd)] {
            let text = review.to_string();
            let (status, body) = runtime().block_on(post(state(), path, text.clone()));
            assert_well_formed(status, &body);
            prop_assert_eq!(status, StatusCode::OK);
            let cut = text.as_bytes()[..cut.min(text.len())].to_vec();
            let (status, body) = runtime().block_on(post(state(), path, cut));
            assert_well_formed(status, &body);
        }
    }
}
