//! The process's HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) and the health it reports.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cloudnet_shared::CloudPrivateIPConfig;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::ListParams;
use kube::{Api, Client};

/// Longest wait between two attempts of the leader's first lists.
const LIST_RETRY_CAP: Duration = Duration::from_secs(10);

/// What the probes report. `/healthz` answers while the process runs; `/readyz` fails while this
/// process leads and its first lists of the current term have not yet succeeded, and while its
/// mounted credentials are not yet compared with the API's objects or differ from them. A standby
/// (never leader yet, or stepped down after losing the lease) is ready: it serves nothing, and a
/// failing readiness would stall rollouts on it without any benefit. Its body names the state.
#[derive(Debug, Default)]
pub(crate) struct Health {
    leading: AtomicBool,
    synced: AtomicBool,
    stale: AtomicBool,
    comparing: AtomicBool,
    /// The last term gave up: it could not load the attachment ledger.
    ledger_failed: AtomicBool,
}

impl Health {
    /// A process that reads mounted credentials: unready until it has compared them with the API's
    /// objects once, so that a replica started with stale files never reports ready meanwhile.
    pub(crate) fn comparing_mounts() -> Self {
        Self {
            comparing: AtomicBool::new(true),
            ..Self::default()
        }
    }

    /// Records whether this process waits for the kubelet to refresh its mounted credentials
    /// (it neither campaigns nor is ready meanwhile); either answer ends the first comparison.
    pub(crate) fn set_stale(&self, stale: bool) {
        self.stale.store(stale, Ordering::Release);
        self.comparing.store(false, Ordering::Release);
    }

    /// Records that this process leads from now on, with its caches to be listed anew.
    pub(crate) fn begin_term(&self) {
        self.synced.store(false, Ordering::Release);
        self.ledger_failed.store(false, Ordering::Release);
        self.leading.store(true, Ordering::Release);
    }

    /// Records that the term ending now could not load the attachment ledger: unready until a
    /// later term begins, so that a broken grant or namespace shows instead of a ready standby.
    pub(crate) fn set_ledger_failed(&self) {
        self.ledger_failed.store(true, Ordering::Release);
    }

    /// Records that this process no longer leads.
    pub(crate) fn end_term(&self) {
        self.leading.store(false, Ordering::Release);
        self.synced.store(false, Ordering::Release);
    }

    /// Records that the lists the engine's caches start from have succeeded.
    pub(crate) fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// Whether `/readyz` answers 200, and the state it names.
    pub(crate) fn readiness(&self) -> (bool, &'static str) {
        if self.comparing.load(Ordering::Acquire) {
            return (false, "comparing the mounted credentials with the API's");
        }
        if self.stale.load(Ordering::Acquire) {
            return (
                false,
                "mounted credentials differ from the API's; waiting for a refresh",
            );
        }
        if self.ledger_failed.load(Ordering::Acquire) {
            return (
                false,
                "standby: could not load the attachment ledger when leading; released the lease",
            );
        }
        match (
            self.leading.load(Ordering::Acquire),
            self.synced.load(Ordering::Acquire),
        ) {
            (false, _) => (true, "standby"),
            (true, true) => (true, "leading"),
            (true, false) => (false, "leading, caches not synced"),
        }
    }
}

/// Lists Nodes, CloudPrivateIPConfigs and the attachment ledger's ConfigMaps in `namespace` (one
/// item each) until all succeed, then marks `health` synced. These are the lists the engine
/// starts from: a leader whose client, token or RBAC cannot make them stays unready, so a
/// rollout of a broken configuration halts on it.
pub(crate) async fn mark_synced_when_listable(
    client: Client,
    namespace: String,
    health: Arc<Health>,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let ledger: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let objects: Api<CloudPrivateIPConfig> = Api::all(client);
    let params = ListParams::default().limit(1);
    let ledger_params = params.clone().labels(cloudnet_shared::ledger::LABEL);
    let mut wait = Duration::from_millis(100);
    loop {
        let listed = async {
            nodes.list_metadata(&params).await?;
            objects.list_metadata(&params).await?;
            ledger.list_metadata(&ledger_params).await
        };
        match listed.await.map(|_| ()) {
            Ok(()) => {
                tracing::info!("nodes, CloudPrivateIPConfigs and the ledger listed: ready");
                health.set_synced();
                return;
            }
            Err(e) => tracing::warn!(error = %e, "listing the watched resources failed; not ready"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LIST_RETRY_CAP);
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `address` until the process ends.
pub(crate) async fn serve(
    address: &str,
    registry: Arc<prometheus_client::registry::Registry>,
    health: Arc<Health>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    axum::serve(listener, router(registry, health)).await
}

/// The endpoint's routes.
pub(crate) fn router(
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
        let (ready, state) = health.readiness();
        async move {
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (status, state)
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

    #[test]
    fn a_term_that_could_not_load_the_ledger_leaves_the_replica_unready_until_the_next_term() {
        let health = Health::default();
        health.begin_term();
        health.set_synced();
        health.end_term();
        health.set_ledger_failed();
        assert!(!health.readiness().0, "{:?}", health.readiness());
        health.begin_term();
        assert_eq!(health.readiness(), (false, "leading, caches not synced"));
        health.set_synced();
        assert_eq!(health.readiness(), (true, "leading"));
    }

    #[tokio::test]
    async fn only_a_leader_without_its_first_lists_is_unready() {
        let health = Arc::new(Health::default());
        let router = router(Arc::default(), Arc::clone(&health));
        assert_eq!(status(&router, "/healthz").await, 200);
        assert_eq!(status(&router, "/readyz").await, 200, "standby");
        health.begin_term();
        assert_eq!(status(&router, "/readyz").await, 503, "leading, not synced");
        assert_eq!(status(&router, "/healthz").await, 200);
        health.set_synced();
        assert_eq!(status(&router, "/readyz").await, 200, "leading, synced");
        assert_eq!(status(&router, "/metrics").await, 200);
        // The lease lost: a standby again, ready; the next term lists anew before it is ready.
        health.end_term();
        assert_eq!(health.readiness(), (true, "standby"));
        health.begin_term();
        assert_eq!(
            status(&router, "/readyz").await,
            503,
            "a new term, not synced"
        );
        health.end_term();
        health.set_stale(true);
        assert_eq!(
            status(&router, "/readyz").await,
            503,
            "waiting for fresh mounts"
        );
        health.set_stale(false);
        assert_eq!(status(&router, "/readyz").await, 200);
    }

    #[test]
    fn a_process_reading_mounted_credentials_is_unready_until_it_compared_them() {
        let health = Health::comparing_mounts();
        assert_eq!(
            health.readiness(),
            (false, "comparing the mounted credentials with the API's")
        );
        health.set_stale(true);
        assert!(!health.readiness().0, "stale");
        health.set_stale(false);
        assert_eq!(health.readiness(), (true, "standby"));
        let health = Health::comparing_mounts();
        health.set_stale(false);
        assert!(health.readiness().0, "current at the first comparison");
    }
}
