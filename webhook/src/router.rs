//! The HTTP routes: thin handlers over [`crate::admission`], plus health, readiness and metrics.
//! Built without any network so tests can drive it with `tower::ServiceExt::oneshot`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use cloudnet_shared::EGRESS_IPCONFIG_ANNOTATION;
use cloudnet_shared::excerpt::excerpt;
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::MismatchedNode;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::TimeoutLayer;

use crate::admission::{self, Answer};
pub use crate::budget::BODY_LIMIT_BYTES;
use crate::budget::Budget;
use crate::cache::ClusterCache;
use crate::intake::{Intake, admit};
use crate::metrics::{Endpoint, Metrics, Outcome};
use crate::slots::Capacity;
pub use crate::slots::MAX_CONCURRENT_REQUESTS;
/// A request not answered in this time gets 503, well inside the webhook's 5 s apiserver timeout
/// plus slack, so a stalled client cannot hold a slot forever.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What every handler needs.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The watch caches.
    pub cache: Arc<ClusterCache>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// The cloud named by the flag; without it, the one the Nodes' providerIDs name (enables
    /// the address-index rule and per-family capacity).
    pub platform: Option<Platform>,
    /// The body bytes admission requests may hold at once.
    pub budget: Budget,
    /// The request and connection slots, whose saturation `/readyz` reports.
    pub capacity: Capacity,
}

impl AppState {
    /// The cloud whose rules apply: the flag's, else the one the Nodes' providerIDs name.
    fn platform(&self) -> Option<Platform> {
        self.platform.or_else(|| self.cache.platform())
    }
}

/// The webhook's router.
///
/// The request limits (a peer's share, body size and read deadline, the bytes under review at
/// once, requests at once, time) cover the admission paths only: probes and metrics must answer
/// while a flood of reviews holds every slot, or the kubelet would restart (liveness) or unlist
/// (readiness) a webhook that is merely busy, turning load into an outage. `/readyz` reports a
/// saturation that lasts (see [`readyz`]).
pub fn router(state: AppState) -> Router {
    let intake = Intake {
        budget: state.budget.clone(),
        slots: state.capacity.requests.clone(),
        small_reads: state.capacity.small_reads.clone(),
    };
    Router::new()
        .route("/validate", post(validate))
        .route("/mutate", post(mutate))
        .route("/validate-egressrouter", post(validate_egress_router))
        .route("/validate-nad", post(validate_nad))
        .route("/validate-egresspublicip", post(validate_public_ip))
        .route(
            "/validate-antrea-externalippool",
            post(validate_antrea_pool),
        )
        .route("/validate-antrea-egress", post(validate_antrea_egress))
        .route("/validate-egressgateway", post(validate_gateway))
        .route_layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        // The body is read before a request slot is taken (intake.rs).
        .route_layer(middleware::from_fn_with_state(intake, admit))
        .route_layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            REQUEST_TIMEOUT,
        ))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(CatchPanicLayer::new())
        .with_state(state)
}

async fn validate(State(state): State<AppState>, body: Bytes) -> Response {
    handle(&state, Endpoint::Validate, &body)
}

async fn mutate(State(state): State<AppState>, body: Bytes) -> Response {
    handle(&state, Endpoint::Mutate, &body)
}

async fn validate_egress_router(State(state): State<AppState>, body: Bytes) -> Response {
    handle(&state, Endpoint::ValidateEgressRouter, &body)
}

async fn validate_nad(State(state): State<AppState>, body: Bytes) -> Response {
    handle(&state, Endpoint::ValidateNad, &body)
}

async fn validate_public_ip(State(state): State<AppState>, body: Bytes) -> Response {
    handle(&state, Endpoint::ValidatePublicIp, &body)
}

async fn validate_antrea_pool(State(state): State<AppState>, body: Bytes) -> Response {
    handle(&state, Endpoint::ValidateAntreaPool, &body)
}

async fn validate_antrea_egress(State(state): State<AppState>, body: Bytes) -> Response {
    handle(&state, Endpoint::ValidateAntreaEgress, &body)
}

async fn validate_gateway(State(state): State<AppState>, body: Bytes) -> Response {
    handle(&state, Endpoint::ValidateGateway, &body)
}

fn not_ready(what: &'static str) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, what).into_response()
}

/// A review the caches cannot decide now: counted, and answered 503 so that failurePolicy decides.
fn unavailable(state: &AppState, endpoint: Endpoint, why: &'static str) -> Response {
    state.metrics.record(endpoint, Outcome::Unavailable, None);
    not_ready(why)
}

fn handle(state: &AppState, endpoint: Endpoint, body: &[u8]) -> Response {
    let started = Instant::now();
    // /mutate reads no cache and unrelated NetworkAttachmentDefinitions are answered whatever
    // the caches' state; only the paths that read the snapshot wait for it.
    let reads_caches = matches!(
        endpoint,
        Endpoint::Validate
            | Endpoint::ValidateEgressRouter
            | Endpoint::ValidatePublicIp
            | Endpoint::ValidateAntreaPool
            | Endpoint::ValidateGateway
    );
    if reads_caches && let Some(why) = state.cache.not_ready() {
        // Deciding on empty or stale caches would refuse every object as "node not found", or
        // admit what the cluster has since changed; failing the call instead lets failurePolicy
        // decide and makes the cause obvious.
        return unavailable(state, endpoint, why);
    }
    let request = match admission::parse(body) {
        Ok(request) => request,
        Err(error) => {
            state.metrics.record(endpoint, Outcome::Rejected, None);
            tracing::debug!(endpoint = endpoint.as_str(), %error, "malformed admission request");
            return (StatusCode::BAD_REQUEST, error.to_string()).into_response();
        }
    };
    let answer = match endpoint {
        Endpoint::Validate => {
            let snapshot = state.cache.read();
            admission::validate(
                &request,
                &snapshot,
                state.platform(),
                state.cache.gateways_ready(),
            )
        }
        Endpoint::Mutate => admission::mutate(&request),
        Endpoint::ValidateEgressRouter => {
            if !state.cache.routers_ready() {
                return unavailable(
                    state,
                    endpoint,
                    "egress-router watch caches not synced yet, or stale",
                );
            }
            admission::validate_egress_router(&request, &state.cache.read())
        }
        Endpoint::ValidateNad => match admission::unrelated_nad(&request) {
            Some(answer) => answer,
            None if !(state.cache.is_ready() && state.cache.routers_ready()) => {
                return unavailable(state, endpoint, "watch caches not synced yet, or stale");
            }
            None => admission::validate_nad(&request, &state.cache.read(), state.platform()),
        },
        Endpoint::ValidatePublicIp => {
            if !state.cache.public_ips_ready() {
                return unavailable(
                    state,
                    endpoint,
                    "EgressPublicIP watch cache not synced yet, or stale",
                );
            }
            crate::public_ip::validate(&request, &state.cache.read(), state.platform())
        }
        // The pool's rules read Nodes and CloudPrivateIPConfigs only: the gate above.
        Endpoint::ValidateAntreaPool => {
            crate::antrea::validate_pool(&request, &state.cache.read(), state.platform())
        }
        // An Egress's rule reads the opted-in pools only, so it waits for their watch alone.
        Endpoint::ValidateAntreaEgress => {
            if !state.cache.antrea_pools_ready() {
                return unavailable(
                    state,
                    endpoint,
                    "ExternalIPPool watch cache not synced yet, or stale",
                );
            }
            crate::antrea::validate_egress(&request, &state.cache.read())
        }
        // A gateway's claims read the other gateways and the opted-in pools besides the Nodes
        // and CloudPrivateIPConfigs of the gate above: deciding before those watches have listed
        // would admit a clash.
        Endpoint::ValidateGateway => {
            if !(state.cache.gateways_ready() && state.cache.antrea_pools_ready()) {
                return unavailable(
                    state,
                    endpoint,
                    "EgressGateway or ExternalIPPool watch cache not synced yet, or stale",
                );
            }
            crate::gateway::validate(&request, &state.cache.read(), state.platform())
        }
    };
    let Answer {
        review,
        outcome,
        rule,
        mismatch,
    } = answer;
    if let Some(MismatchedNode { node, mismatch }) = mismatch {
        state.metrics.record_mismatch(mismatch);
        tracing::warn!(
            node = %node,
            platform = mismatch.platform.as_str(),
            annotation_keys = mismatch.keys_label(),
            name = %excerpt(request.name()),
            "node annotation {EGRESS_IPCONFIG_ANNOTATION}: {mismatch}"
        );
    }
    if outcome != Outcome::Allowed {
        tracing::info!(
            endpoint = endpoint.as_str(),
            uid = %excerpt(request.uid()),
            name = %excerpt(request.name()),
            operation = request.operation().as_str(),
            dry_run = request.dry_run(),
            outcome = outcome.as_str(),
            rule = rule.map(|r| r.as_str()),
            "admission decision"
        );
    }
    let response = match serde_json::to_vec(&review) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(error) => {
            tracing::error!(%error, "serialising the admission response failed");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    state
        .metrics
        .record(endpoint, outcome, rule.map(|r| r.as_str()));
    state
        .metrics
        .observe_duration(endpoint, started.elapsed().as_secs_f64());
    response
}

/// Not ready while the caches cannot decide, or while every request or connection slot has
/// been held for [`crate::slots::SATURATED_AFTER`] with none coming free.
///
/// Saturation is reported because kube-apiserver reaches the webhook through its Service, which
/// sends new connections only to ready endpoints: a replica that cannot take a review drops out
/// and the calls go to one that can. A replica merely busy (slots turning over) stays listed. If
/// every replica is saturated the Service has no endpoint and kube-apiserver fails the call at
/// once (failurePolicy decides) instead of after timeoutSeconds: the same answer, sooner, and
/// visible in the endpoints. Liveness stays 200: a restart would drop the reviews in flight.
async fn readyz(State(state): State<AppState>) -> Response {
    let why = state
        .cache
        .not_ready()
        .or_else(|| state.capacity.saturated(tokio::time::Instant::now()));
    match why {
        None => "ok".into_response(),
        Some(why) => not_ready(why),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    state.metrics.set_caches_ready(state.cache.is_ready());
    match state.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
