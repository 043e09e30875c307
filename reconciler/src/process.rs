//! The process around the engine: leader election on upstream's Lease, and the signals that end
//! a run (SIGTERM, a changed credentials Secret or CA ConfigMap).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use thiserror::Error;
use tokio::sync::watch;

/// Upstream's Lease name: holding it keeps an upstream replica passive during a migration.
pub const LEASE_NAME: &str = "cloud-network-config-controller-lock";

/// Leader election failed.
#[derive(Debug, Error)]
pub enum LeaderError {
    /// The lease could not be read or written.
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    /// The lease manager stopped.
    #[error("leader election stopped")]
    Stopped,
}

/// Lease timings.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTimings {
    /// Lease validity without renewal.
    pub duration: Duration,
    /// Renew when this much of the lease is left.
    pub grace: Duration,
}

/// A held (or wanted) lease: `is_leader` turns true when acquired and false when lost.
pub struct Leadership {
    /// Leadership state; dropping it releases the lease.
    pub is_leader: watch::Receiver<bool>,
}

impl Leadership {
    /// Campaigns for the lease in `namespace` as `identity` and returns once this replica leads.
    pub async fn acquire(
        client: Client,
        namespace: &str,
        identity: &str,
        timings: LeaseTimings,
    ) -> Result<Self, LeaderError> {
        let params = LeaseParams::new(
            identity,
            timings.duration.as_secs().max(1),
            timings.grace.as_secs().max(1),
        );
        let manager = LeaseManager::new(
            client,
            LEASE_NAME,
            namespace,
            params,
            LeaseCreateMode::AutoCreate,
        )
        .await?;
        let (mut is_leader, _task) = manager.watch().await;
        is_leader
            .wait_for(|leading| *leading)
            .await
            .map_err(|_| LeaderError::Stopped)?;
        tracing::info!(%identity, lease = LEASE_NAME, "became leader");
        Ok(Self { is_leader })
    }

    /// Resolves when leadership is lost.
    pub async fn lost(&mut self) {
        let _ = self.is_leader.wait_for(|leading| !*leading).await;
    }
}

/// A holder identity as client-go builds it: host name plus a random suffix.
pub fn identity(name: &str) -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| name.to_owned());
    format!("{host}_{:016x}", rand::random::<u64>())
}

fn secret_fingerprint(secret: &Secret) -> BTreeMap<String, ByteString> {
    secret.data.clone().unwrap_or_default()
}

fn configmap_fingerprint(cm: &ConfigMap) -> BTreeMap<String, String> {
    cm.data.clone().unwrap_or_default()
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
