//! cloudnet-node: the node agent of cloudnet's egress gateways (docs/node-agent.md).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use cloudnet_node::endpoint::{self, Health};
use cloudnet_node::flags::{Flags, LogFormat};
use cloudnet_node::metrics::Metrics;
use cloudnet_node::netlink::Netlink;
use cloudnet_node::{Settings, run};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The first kernel that keeps an address's `IFA_PROTO`, the mark the agent knows its own
/// addresses by: on an older one the mark is dropped and the agent could never remove them.
const MIN_KERNEL: (u32, u32) = (5, 18);

fn main() -> ExitCode {
    use std::io::IsTerminal as _;
    let flags = Flags::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: in a pod, or piped into a file, escape codes garble the lines.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match flags.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    // One thread: the agent waits on the API server and the kernel, and computes little.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(agent(flags)),
        Err(e) => Err(anyhow::Error::new(e).context("building the async runtime")),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, in the log format the operator chose, naming every cause.
            let error = cloudnet_shared::report::one_line(e.as_ref());
            tracing::error!(%error, "cannot run");
            ExitCode::FAILURE
        }
    }
}

async fn agent(flags: Flags) -> anyhow::Result<()> {
    check_kernel()?;
    let config = match &flags.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let client = cloudnet_kubeclient::client(config, &cloudnet_kubeclient::Liveness::default())?;
    let netlink = Netlink::connect()?;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = Arc::new(Health::default());
    let listener = tokio::net::TcpListener::bind(&flags.metrics_address)
        .await
        .with_context(|| format!("binding {}", flags.metrics_address))?;
    let router = endpoint::router(Arc::new(registry), Arc::clone(&health));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
    let settings = Settings {
        node: flags.node_name,
        lease_namespace: flags.lease_namespace,
        heartbeat_interval: flags.heartbeat_interval,
        lease_duration_seconds: flags.lease_duration_seconds,
        interface: flags.interface,
    };
    run(
        client,
        netlink,
        settings,
        metrics,
        health,
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// Refuses a kernel older than [`MIN_KERNEL`].
fn check_kernel() -> anyhow::Result<()> {
    let uname = nix::sys::utsname::uname().context("reading the kernel's version")?;
    let release = uname.release().to_string_lossy().into_owned();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if version < MIN_KERNEL {
        bail!(
            "kernel {release} does not keep an address's IFA_PROTO, by which the agent knows the addresses it added; {}.{} or later is needed",
            MIN_KERNEL.0,
            MIN_KERNEL.1
        );
    }
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
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
