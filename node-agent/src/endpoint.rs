//! The HTTP endpoint: `/metrics`, `/healthz` (the process runs) and `/readyz` (the caches have
//! listed once, so the agent acts on the API's picture), as the reconciler serves its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;
use prometheus_client::registry::Registry;

/// Whether the agent's caches have listed.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
}

impl Health {
    /// Records that every watch has listed once.
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}

/// The endpoint's routes.
pub fn router(registry: Arc<Registry>, health: Arc<Health>) -> axum::Router {
    let metrics = move || {
        let registry = Arc::clone(&registry);
        async move {
            let mut body = String::new();
            let status = match prometheus_client::encoding::text::encode(&mut body, &registry) {
                Ok(()) => StatusCode::OK,
                Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            (
                status,
                [(axum::http::header::CONTENT_TYPE, content_type)],
                body,
            )
        }
    };
    let readyz = move || {
        let ready = health.ready();
        async move {
            if ready {
                (StatusCode::OK, "synced")
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "caches not listed yet")
            }
        }
    };
    axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/readyz", axum::routing::get(readyz))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tower::ServiceExt as _;

    async fn get(router: &axum::Router, path: &str) -> (u16, String) {
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn ready_once_synced_and_metrics_named_with_the_prefix() {
        let mut registry = Registry::default();
        let metrics = crate::metrics::Metrics::register(&mut registry);
        metrics.heartbeat(Some(1.0));
        metrics.set_addresses(2, 1);
        let health = Arc::new(Health::default());
        let router = router(Arc::new(registry), Arc::clone(&health));
        assert_eq!(get(&router, "/healthz").await.0, 200);
        assert_eq!(get(&router, "/readyz").await.0, 503);
        health.set_synced();
        assert_eq!(get(&router, "/readyz").await.0, 200);
        let (status, body) = get(&router, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            body.contains("cloudnet_node_heartbeats_total{outcome=\"success\"} 1"),
            "{body}"
        );
        assert!(
            body.contains("cloudnet_node_egress_ips{state=\"no_device\"} 1"),
            "{body}"
        );
    }
}
