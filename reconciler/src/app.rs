//! The whole process behind `main`: metrics endpoint, leader election, the engine, and the
//! signals that end a run (SIGTERM/SIGINT, changed credentials) with a drain and a clean exit.

use std::sync::Arc;

use thiserror::Error;

use crate::flags::{Flags, LogFormat};
use crate::metrics::Metrics;
use crate::objects::EngineConfig;
use crate::process::{self, LeaderError, Leadership, LeaseTimings};
use crate::providers::{self, SetupError};
use crate::run;

/// Why the process ends with a failure.
#[derive(Debug, Error)]
pub enum AppError {
    /// The client or the cloud could not be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// Leader election failed.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// Another replica took the lease while this one was acting.
    #[error("lost the lease {}", process::LEASE_NAME)]
    LostLease,
}

/// Installs the log subscriber (a second call is a no-op, for tests running several processes'
/// entry points).
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Runs the reconciler as configured by `flags` until a signal or a credentials change, after
/// which in-flight work is finished and `Ok` is returned (exit code 0).
pub async fn run_process(flags: Flags) -> Result<(), AppError> {
    let client = providers::kube_client(&flags.kubeconfig, flags.api_concurrency).await?;
    let cloud = providers::build(&flags).await?;
    let metrics = Arc::new(Metrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let address = flags.metrics_bind_address.clone();
    tokio::spawn(async move {
        if let Err(e) = process::serve_metrics(&address, Arc::new(registry)).await {
            tracing::error!(%address, error = %e, "metrics endpoint stopped");
        }
    });

    let identity = process::identity(&flags.controller_name);
    let timings = LeaseTimings {
        duration: flags.leader_elect_lease_duration,
        grace: flags
            .leader_elect_lease_duration
            .saturating_sub(flags.leader_elect_renew_deadline),
    };
    let ns = flags.controller_namespace.clone();
    let mut leadership = Leadership::acquire(client.clone(), &ns, &identity, timings).await?;
    let stop = {
        let client = client.clone();
        let (secret, config) = (flags.secret_name.clone(), flags.config_name.clone());
        async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
                () = sigterm() => tracing::info!("SIGTERM: draining"),
                () = process::credentials_changed(client, &ns, &secret, &config) => {
                    tracing::info!("cloud credentials changed: draining, then exiting to reload them");
                }
            }
        }
    };
    let config = EngineConfig {
        drift_period: flags.drift_period,
        coalesce_window: std::time::Duration::from_millis(flags.coalesce_window_ms),
        concurrency: flags.concurrent_reconciles,
        ..EngineConfig::default()
    };
    tokio::select! {
        () = run::run(client, cloud, config, metrics, identity, stop) => Ok(()),
        () = leadership.lost() => Err(AppError::LostLease),
    }
}

async fn sigterm() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}
