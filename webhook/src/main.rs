//! cloudnet-webhook: validating and mutating admission webhook for CloudPrivateIPConfig.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use cloudnet_webhook::cli::{Args, LogFormat};
use cloudnet_webhook::tls::CertPaths;
use cloudnet_webhook::{Settings, run};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[tokio::main]
async fn main() -> ExitCode {
    use std::io::IsTerminal as _;
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: in a pod, or piped into a file, escape codes garble the lines.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, in the log format the operator chose, naming every cause.
            let error = cloudnet_shared::report::one_line(e.as_ref());
            tracing::error!(%error, "cannot run");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let liveness = cloudnet_kubeclient::Liveness::with_request_timeout(args.api_request_timeout);
    let client = cloudnet_kubeclient::client(config, &liveness)?;
    let listener = tokio::net::TcpListener::bind(args.listen_address)
        .await
        .with_context(|| format!("binding {}", args.listen_address))?;
    tracing::info!(address = %args.listen_address, platform = ?args.platform_type, "serving");
    let settings = Settings {
        platform: args.platform_type,
        cert_paths: CertPaths {
            cert: args.tls_cert_file,
            key: args.tls_key_file,
        },
        cert_reload_interval: args.cert_reload_interval,
        cache_stale_after: args.cache_stale_after,
        ledger_namespace: args.ledger_namespace,
    };
    run(listener, client, settings, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM (what the kubelet sends) or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = terminate => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutdown requested; draining");
}
