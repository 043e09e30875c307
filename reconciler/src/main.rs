//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use cloudnet_reconciler::flags::{Flags, LogFormat, normalize_args};
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_reconciler::objects::EngineConfig;
use cloudnet_reconciler::process::{self, Leadership, LeaseTimings};
use cloudnet_reconciler::{providers, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(normalize_args(std::env::args()));
    init_logs(flags.log_format);
    let client = providers::kube_client(&flags.kubeconfig).await?;
    let cloud = providers::build(&flags).await?;
    let metrics = Arc::new(Metrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let address = flags.metrics_bind_address.clone();
    tokio::spawn(async move { process::serve_metrics(&address, Arc::new(registry)).await });

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
        ..EngineConfig::default()
    };
    tokio::select! {
        () = run::run(client, cloud, config, metrics, identity, stop) => Ok(()),
        () = leadership.lost() => Err(anyhow::anyhow!("lost the lease {}", process::LEASE_NAME)),
    }
    .context("reconciler")
}

async fn sigterm() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
