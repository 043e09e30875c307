//! cloudnet-webhook: the validating and mutating admission webhook for `CloudPrivateIPConfig`.
//!
//! A thin TLS server over the shared admission rules: kube-apiserver posts an AdmissionReview,
//! the handler looks the cluster up in in-memory watch caches, asks `cloudnet_shared::review`,
//! and answers. See `webhook/README.md` for flags, endpoints and metrics.

pub mod admission;
pub mod antrea;
pub mod budget;
pub mod cache;
pub mod cli;
pub mod deleted;
pub mod freshness;
pub mod gateway;
pub mod intake;
pub mod ledger;
pub mod metrics;
pub mod peer;
pub mod platform;
pub mod public_ip;
pub mod router;
pub mod server;
pub mod slots;
pub mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_shared::platform::Platform;
use tokio::net::TcpListener;

use crate::budget::Budget;
use crate::cache::ClusterCache;
use crate::metrics::Metrics;
use crate::router::AppState;
use crate::slots::Capacity;
use crate::tls::{CertPaths, CertStore};

/// What a running webhook needs besides its listener and client.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The cloud, when known.
    pub platform: Option<Platform>,
    /// The serving certificate files.
    pub cert_paths: CertPaths,
    /// How often the certificate files are re-read.
    pub cert_reload_interval: Duration,
    /// How long a failing watch or an unreachable kube-apiserver is tolerated before the webhook
    /// stops deciding from its caches (not ready).
    pub cache_stale_after: Duration,
    /// The namespace of the reconciler's attachment ledger.
    pub ledger_namespace: String,
}

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The serving certificate could not be loaded.
    #[error(transparent)]
    Certificate(#[from] tls::TlsError),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// Runs the webhook on `listener` until `shutdown` completes, then drains in-flight requests.
///
/// The certificate is loaded before anything is served, so a missing or broken pair fails
/// start-up instead of every handshake.
pub async fn run(
    listener: TcpListener,
    client: kube::Client,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let store = Arc::new(CertStore::load(settings.cert_paths.clone())?);
    let tls = Arc::new(tls::server_config(Arc::clone(&store))?);
    let cache = Arc::new(
        ClusterCache::with_bounds(deleted::RECENT_DELETE_WINDOW, settings.cache_stale_after)
            .with_platform_flag(settings.platform),
    );
    let metrics = Arc::new(Metrics::new());
    let capacity = Capacity::default();
    let limits = server::ConnectionLimits {
        connections: capacity.connections.clone(),
        ..server::ConnectionLimits::default()
    };
    let state = AppState {
        cache: Arc::clone(&cache),
        metrics: Arc::clone(&metrics),
        platform: settings.platform,
        budget: Budget::default(),
        capacity,
    };
    let expiry = tokio::spawn(watch_expiry(
        Arc::clone(&store),
        metrics,
        settings.cert_reload_interval,
    ));
    let reloader = tokio::spawn(store.reload_every(settings.cert_reload_interval));
    let ledger_namespace = settings.ledger_namespace.clone();
    let watches = tokio::spawn(async move {
        cache::run(client, cache, &ledger_namespace).await;
    });
    server::serve_with(listener, tls, router::router(state), shutdown, limits).await;
    reloader.abort();
    expiry.abort();
    watches.abort();
    Ok(())
}

/// Exports the served certificate's expiry and warns while it is within `tls::EXPIRY_WARNING`;
/// rechecked at the reload interval, so a renewed pair clears the warning.
async fn watch_expiry(store: Arc<tls::CertStore>, metrics: Arc<Metrics>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval.max(Duration::from_secs(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned_for = None;
    loop {
        ticker.tick().await;
        let Some(not_after) = store.not_after() else {
            continue;
        };
        metrics.set_certificate_expiry(not_after);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        // Once per certificate, not on every tick.
        if tls::expires_soon(now, not_after) && warned_for != Some(not_after) {
            warned_for = Some(not_after);
            tracing::warn!(
                not_after,
                days_left = (not_after - now) / 86_400,
                "serving certificate expires soon; renew it (certs/README.md)"
            );
        }
    }
}
