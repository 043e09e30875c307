//! The whole process behind `main`: metrics endpoint, leader election, the cloud provider (built
//! only once this process leads), the engine behind the leadership fence, and the signals that
//! end a run (SIGTERM/SIGINT, changed credentials) with a drain, the lease's release and a clean
//! exit.

use std::sync::Arc;

use futures::FutureExt;
use thiserror::Error;

use crate::cloud::CloudProvider;
use crate::fence::FencedCloud;
use crate::flags::{Flags, LogFormat};
use crate::leader::record::{Timings, TimingsError};
use crate::leader::{self, Elector};
use crate::metrics::Metrics;
use crate::objects::EngineConfig;
use crate::process;
use crate::providers::{self, SetupError};
use crate::run;

/// Why the process ends with a failure.
#[derive(Debug, Error)]
pub enum AppError {
    /// The client or the cloud could not be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The leader election flags cannot work.
    #[error(transparent)]
    Timings(#[from] TimingsError),
    /// This process stopped leading while it was acting: no renewal succeeded within the renew
    /// deadline, or another replica took the lease. Its cloud calls stopped at that moment.
    #[error("lost the lease {}", leader::LEASE_NAME)]
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
/// which in-flight work is finished, the lease released and `Ok` returned (exit code 0).
pub async fn run_process(flags: Flags) -> Result<(), AppError> {
    let timings = Timings::new(
        flags.leader_elect_lease_duration,
        flags.leader_elect_renew_deadline,
        flags.leader_elect_retry_period,
    )?;
    let clients = providers::kube_clients(&flags.kubeconfig, flags.api_concurrency).await?;
    let client = clients.engine;
    let metrics = Arc::new(Metrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let health = Arc::new(process::Health::default());
    let address = flags.metrics_bind_address.clone();
    tokio::spawn({
        let health = Arc::clone(&health);
        async move {
            if let Err(e) = process::serve(&address, Arc::new(registry), health).await {
                tracing::error!(%address, error = %e, "metrics endpoint stopped");
            }
        }
    });

    let identity = leader::identity(
        std::env::var("POD_NAME").ok().as_deref(),
        std::env::var("HOSTNAME").ok().as_deref(),
        &flags.controller_name,
    );
    let signalled = process::signalled().boxed().shared();
    let ns = flags.controller_namespace.clone();
    let elector = Elector::new(
        clients.election,
        &clients.cluster_url,
        &ns,
        identity.clone(),
        timings,
    );
    let leadership = tokio::select! {
        leadership = elector.campaign() => leadership,
        signal = signalled.clone() => {
            tracing::info!(signal, "stopping while standing by");
            return Ok(());
        }
    };

    // Watched from before the files are read, so a change in between still ends the run.
    let credentials_changed = tokio::spawn({
        let (client, secret, config) = (
            client.clone(),
            flags.secret_name.clone(),
            flags.config_name.clone(),
        );
        async move { process::credentials_changed(client, &ns, &secret, &config).await }
    });
    // Read only now: a standby that takes over after a rotation uses the new files.
    let cloud = match providers::build(&flags).await {
        Ok(cloud) => cloud,
        Err(e) => {
            credentials_changed.abort();
            leadership.release().await;
            return Err(e.into());
        }
    };
    let fence = leadership.fence();
    health.set_leading(true);
    tokio::spawn(process::mark_synced_when_listable(
        client.clone(),
        Arc::clone(&health),
    ));
    metrics.leader.set(1);
    tokio::spawn({
        let (fence, metrics) = (fence.clone(), Arc::clone(&metrics));
        async move {
            fence.closed().await;
            metrics.leader.set(0);
        }
    });
    let cloud: Arc<dyn CloudProvider> = Arc::new(FencedCloud::new(cloud, fence.clone()));
    let stop = async move {
        tokio::select! {
            signal = signalled => tracing::info!(signal, "draining"),
            _ = credentials_changed => {
                tracing::info!("cloud credentials changed: draining, then exiting to reload them");
            }
        }
    };
    let config = EngineConfig {
        drift_period: flags.drift_period,
        coalesce_window: std::time::Duration::from_millis(flags.coalesce_window_ms),
        max_gather: std::time::Duration::from_millis(flags.batch_max_wait_ms),
        call_deadline: flags.cloud_call_deadline,
        concurrency: flags.concurrent_reconciles,
        api_requests: usize::from(flags.api_concurrency),
        namespace: flags.controller_namespace.clone(),
        orphan_grace: flags.orphan_grace.max(std::time::Duration::from_secs(1)),
        ..EngineConfig::default()
    };
    // The fence comes first: once it closes the engine is not polled again, and dropping it
    // aborts the lanes' calls (the fenced provider has already abandoned them).
    tokio::select! {
        biased;
        () = fence.closed() => {
            tracing::error!(
                lease = leader::LEASE_NAME,
                "stopped leading: cloud calls stopped, exiting so that the pod restarts as a standby"
            );
            Err(AppError::LostLease)
        }
        () = run::run(client, cloud, config, metrics, identity, stop) => {
            leadership.release().await;
            Ok(())
        }
    }
}
