//! The process around the engine: the signals that end a run (SIGTERM, a changed credentials
//! Secret or CA ConfigMap) and the metrics endpoint. Leader election is [`crate::leader`].

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

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

/// Serves `/metrics` from `registry` on `address` until the process ends.
pub async fn serve_metrics(
    address: &str,
    registry: Arc<prometheus_client::registry::Registry>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let metrics = move || {
        let registry = Arc::clone(&registry);
        async move {
            let mut body = String::new();
            let status = match prometheus_client::encoding::text::encode(&mut body, &registry) {
                Ok(()) => axum::http::StatusCode::OK,
                Err(_) => axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            };
            let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            (
                status,
                [(axum::http::header::CONTENT_TYPE, content_type)],
                body,
            )
        }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(metrics));
    axum::serve(listener, app).await
}
