//! The process around the engine: the signals that end a run (SIGTERM, a changed credentials
//! Secret or CA ConfigMap) and the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`). Leader
//! election is [`crate::leader`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cloudnet_shared::CloudPrivateIPConfig;
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

/// Longest wait between two attempts of the leader's first lists.
const LIST_RETRY_CAP: Duration = Duration::from_secs(10);

/// What the probes report. `/healthz` answers while the process runs; `/readyz` fails only while
/// this process leads and its first lists have not yet succeeded. A standby is ready: it serves
/// nothing, and a failing readiness would stall rollouts on it without any benefit.
#[derive(Debug, Default)]
pub struct Health {
    leading: AtomicBool,
    synced: AtomicBool,
}

impl Health {
    /// Records whether this process leads.
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Release);
    }

    /// Records that the lists the engine's caches start from have succeeded.
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        !self.leading.load(Ordering::Acquire) || self.synced.load(Ordering::Acquire)
    }
}

/// Lists Nodes and CloudPrivateIPConfigs (one item each) until both succeed, then marks `health`
/// synced. These are the lists the engine's caches start from: a leader whose client, token or
/// RBAC cannot make them stays unready, so a rollout of a broken configuration halts on it.
pub async fn mark_synced_when_listable(client: Client, health: Arc<Health>) {
    let nodes: Api<Node> = Api::all(client.clone());
    let objects: Api<CloudPrivateIPConfig> = Api::all(client);
    let params = ListParams::default().limit(1);
    let mut wait = Duration::from_millis(100);
    loop {
        let listed = nodes.list_metadata(&params).await.map(|_| ());
        let listed = match listed {
            Ok(()) => objects.list_metadata(&params).await.map(|_| ()),
            Err(e) => Err(e),
        };
        match listed {
            Ok(()) => {
                health.set_synced();
                return;
            }
            Err(e) => tracing::warn!(error = %e, "listing the watched resources failed; not ready"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LIST_RETRY_CAP);
    }
}

fn secret_fingerprint(secret: &Secret) -> BTreeMap<String, ByteString> {
    secret.data.clone().unwrap_or_default()
}

fn configmap_fingerprint(cm: &ConfigMap) -> BTreeMap<String, String> {
    cm.data.clone().unwrap_or_default()
}

/// Resolves with the signal's name when SIGTERM or SIGINT arrives.
pub async fn signalled() -> &'static str {
    let sigterm = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        () = sigterm => "SIGTERM",
    }
}

/// Resolves when the data of Secret `secret` or ConfigMap `configmap` in `namespace` changes
/// after it was first seen: the mounted files are stale, so the process should drain and exit.
pub async fn credentials_changed(client: Client, namespace: &str, secret: &str, configmap: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client, namespace);
    let secret_changed = first_change(secrets, secret, secret_fingerprint);
    let configmap_changed = first_change(configmaps, configmap, configmap_fingerprint);
    tokio::select! {
        () = secret_changed => tracing::info!(%secret, "credentials Secret changed"),
        () = configmap_changed => tracing::info!(%configmap, "cloud config ConfigMap changed"),
    }
}

async fn first_change<K, F, T>(api: Api<K>, name: &str, fingerprint: F)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(&K) -> T,
    T: PartialEq,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher::watcher(api, config)
        .default_backoff()
        .applied_objects();
    let mut stream = std::pin::pin!(stream);
    let mut seen: Option<T> = None;
    while let Some(event) = stream.next().await {
        let Ok(obj) = event else { continue };
        let now = fingerprint(&obj);
        match &seen {
            Some(before) if *before != now => return,
            _ => seen = Some(now),
        }
    }
    std::future::pending::<()>().await;
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `address` until the process ends.
pub async fn serve(
    address: &str,
    registry: Arc<prometheus_client::registry::Registry>,
    health: Arc<Health>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    axum::serve(listener, router(registry, health)).await
}

/// The endpoint's routes.
pub fn router(
    registry: Arc<prometheus_client::registry::Registry>,
    health: Arc<Health>,
) -> axum::Router {
    use axum::http::StatusCode;
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
                (StatusCode::OK, "ok")
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "leading, caches not synced",
                )
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
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tower::ServiceExt as _;

    async fn status(router: &axum::Router, path: &str) -> u16 {
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        router
            .clone()
            .oneshot(request)
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    #[tokio::test]
    async fn only_a_leader_without_its_first_lists_is_unready() {
        let health = Arc::new(Health::default());
        let router = router(Arc::default(), Arc::clone(&health));
        assert_eq!(status(&router, "/healthz").await, 200);
        assert_eq!(status(&router, "/readyz").await, 200, "standby");
        health.set_leading(true);
        assert_eq!(status(&router, "/readyz").await, 503, "leading, not synced");
        assert_eq!(status(&router, "/healthz").await, 200);
        health.set_synced();
        assert_eq!(status(&router, "/readyz").await, 200, "leading, synced");
        assert_eq!(status(&router, "/metrics").await, 200);
    }
}
