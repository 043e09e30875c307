//! The whole process behind `main`: metrics endpoint, leader election, and one leadership term
//! after another. A term builds the cloud provider (only once this process leads), runs the
//! engine behind the leadership fence, and ends either with the process (SIGTERM/SIGINT, changed
//! credentials: a drain, the lease's release and a clean exit) or with the lease lost (an
//! apiserver outage, a partition, another replica's takeover): then the engine is dropped, every
//! cloud call has already stopped at the fence, and the process campaigns again. It never exits
//! for a lost lease: a pod that exits on every outage ends in CrashLoopBackOff, with a growing
//! back-off, exactly when egress IPs are needed again.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::Shared;
use kube::runtime::events::Reporter;
use thiserror::Error;
use tokio_util::task::AbortOnDropHandle;

use super::providers::{self, KubeClients, SetupError};
use crate::cloud::CloudProvider;
use crate::cloud::reread::RereadOnRefusal;
use crate::controller::{self, Ended, EngineConfig};
use crate::engine::FencedCloud;
use crate::engine::fence::Fence;
use crate::frontend;
use crate::leader::record::{Timings, TimingsError};
use crate::leader::{self, Elector, Leadership};
use crate::metrics::Metrics;
use crate::mount::{self, Baseline, Freshness, Mounts};
use crate::process::flags::FrontEndKind;
use crate::process::{self, Flags, Health, LogFormat};

/// Why the process ends with a failure.
#[derive(Debug, Error)]
pub enum AppError {
    /// The client or the cloud could not be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The leader election flags cannot work.
    #[error("leader election: {0}")]
    Timings(#[from] TimingsError),
}

/// Installs the log subscriber (a second call is a no-op, for tests running several processes'
/// entry points). Text logs are coloured only when stdout is a terminal: in a pod, or piped into a
/// file, escape codes would only garble the lines.
pub fn init_logs(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// How often a replica whose mounted credentials are stale looks again.
const MOUNT_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// What ended a leadership term.
enum Term {
    /// A signal or a credentials change: the work was drained and the lease released.
    Stopped,
    /// The lease was lost; the engine is gone and no cloud call runs.
    Lost,
    /// Elected with mounted credentials older than the API's: the lease was released at once.
    Stale,
    /// The attachment ledger could not be loaded in time: the lease was released so that
    /// another replica (or the upstream controller) can lead.
    NoLedger,
}

/// What every term shares.
struct Replica {
    flags: Flags,
    clients: KubeClients,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    identity: String,
    signalled: Shared<futures::future::BoxFuture<'static, &'static str>>,
    /// The credentials Secret and cloud-config ConfigMap, and where they are mounted.
    mounts: Mounts,
}

/// Runs the reconciler as configured by `flags` until a signal or a credentials change, after
/// which in-flight work is finished, the lease released and `Ok` returned (exit code 0).
pub async fn run_process(flags: Flags) -> Result<(), AppError> {
    let timings = Timings::new(
        flags.leader_elect_lease_duration,
        flags.leader_elect_renew_deadline,
        flags.leader_elect_retry_period,
    )?;
    let clients = providers::kube_clients(&flags).await?;
    let metrics = Arc::new(Metrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let health = Arc::new(if flags.platform_type.reads_files() {
        Health::comparing_mounts()
    } else {
        Health::default()
    });
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
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        platform = %flags.platform_type,
        namespace = %flags.controller_namespace,
        %identity,
        apiserver = %clients.cluster_url,
        lease = ?timings.lease,
        renew_deadline = ?timings.renew_deadline,
        retry = ?timings.retry,
        "starting: campaigning for the lease"
    );
    let replica = Replica {
        mounts: Mounts {
            namespace: flags.controller_namespace.clone(),
            secret: flags.secret_name.clone(),
            secret_dir: flags.secret_override.clone(),
            configmap: flags.config_name.clone(),
            configmap_dir: flags.config_override.clone(),
        },
        flags,
        clients,
        metrics,
        health,
        identity,
        signalled: process::signalled().boxed().shared(),
    };
    loop {
        if !replica.wait_for_current_mounts().await {
            return Ok(());
        }
        let elector = Elector::new(
            replica.clients.election.clone(),
            &replica.clients.cluster_url,
            &replica.flags.controller_namespace,
            replica.identity.clone(),
            timings,
        );
        let leadership = tokio::select! {
            leadership = elector.campaign() => leadership,
            signal = replica.signalled.clone() => {
                tracing::info!(signal, "stopping while standing by");
                return Ok(());
            }
        };
        match replica.lead(leadership).await? {
            Term::Stopped => return Ok(()),
            Term::Lost => {
                replica.metrics.leader_lost.inc();
            }
            Term::Stale => {}
            Term::NoLedger => {
                // A lease duration aside, so that a standby takes the released lease first.
                tokio::select! {
                    () = tokio::time::sleep(timings.lease) => {}
                    signal = replica.signalled.clone() => {
                        tracing::info!(signal, "stopping after a term without the ledger");
                        return Ok(());
                    }
                }
            }
        };
    }
}

impl Replica {
    /// Waits while the mounted credentials differ from the API's objects (the kubelet refreshes
    /// a volume a minute or two after a rotation): such a replica neither campaigns nor is
    /// ready. Returns `false` when a signal ends the process meanwhile.
    async fn wait_for_current_mounts(&self) -> bool {
        if !self.flags.platform_type.reads_files() {
            return true;
        }
        let mounts = &self.mounts;
        let mut told = None;
        loop {
            match mount::freshness(&self.clients.engine, mounts).await.0 {
                Freshness::Current => break,
                Freshness::Unknown(why) => {
                    tracing::warn!(%why, "cannot compare the mounted credentials with the API's; campaigning");
                    break;
                }
                Freshness::Stale(what) => {
                    self.health.set_stale(true);
                    if told.as_ref() != Some(&what) {
                        tracing::warn!(
                            object = %what,
                            "the mounted files differ from the object: waiting for the kubelet to \
                             refresh them before campaigning"
                        );
                        told = Some(what);
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(MOUNT_POLL) => {}
                signal = self.signalled.clone() => {
                    tracing::info!(signal, "stopping while waiting for the mounted credentials");
                    return false;
                }
            }
        }
        if told.is_some() {
            tracing::info!("the mounted files match the objects now");
        }
        self.health.set_stale(false);
        true
    }

    /// One leadership term: the provider built from the files as they are now, the engine behind
    /// the fence, until the process stops or the lease is lost.
    async fn lead(&self, leadership: Leadership) -> Result<Term, AppError> {
        let client = &self.clients.engine;
        // The files as loaded are the baseline of the change detector: a rotation between this
        // read and the watch's first answer still ends the run.
        let loaded = if self.flags.platform_type.reads_files() {
            match mount::freshness(client, &self.mounts).await {
                (Freshness::Stale(what), _) => {
                    tracing::warn!(
                        object = %what,
                        "elected with mounted files older than the object: releasing the lease"
                    );
                    leadership.release().await;
                    return Ok(Term::Stale);
                }
                (_, loaded) => Some(loaded),
            }
        } else {
            None
        };
        let baseline = loaded.clone().map_or(Baseline::FirstSeen, Baseline::Loaded);
        let credentials_changed = AbortOnDropHandle::new(tokio::spawn({
            let client = client.clone();
            let mounts = self.mounts.clone();
            let poll = self.flags.credentials_poll_period;
            async move { mount::changed(client, &mounts, baseline, poll).await }
        }));
        // Read only now: a standby that takes over after a rotation uses the new files.
        let cloud = match providers::build(&self.flags).await {
            Ok(cloud) => cloud,
            Err(e) => {
                leadership.release().await;
                return Err(e.into());
            }
        };
        // A refusal by the cloud (revoked keys) with files newer than those loaded restarts too.
        let (cloud, mut refused_with_new_files) = match loaded {
            Some(loaded) => {
                let (cloud, changed) = RereadOnRefusal::new(cloud, self.mounts.clone(), loaded);
                (Arc::new(cloud) as Arc<dyn CloudProvider>, changed)
            }
            None => (cloud, tokio::sync::watch::channel(false).1),
        };
        let fence = leadership.fence();
        self.health.begin_term();
        let _synced = AbortOnDropHandle::new(tokio::spawn(process::mark_synced_when_listable(
            client.clone(),
            self.flags.controller_namespace.clone(),
            Arc::clone(&self.health),
        )));
        self.metrics.leader.set(1);
        let cloud: Arc<dyn CloudProvider> = Arc::new(FencedCloud::new(cloud, fence.clone()));
        let signalled = self.signalled.clone();
        let stop = async move {
            tokio::select! {
                signal = signalled => tracing::info!(signal, "draining"),
                _ = credentials_changed => {
                    tracing::info!("cloud credentials changed: draining, then exiting to reload them");
                }
                Ok(_) = refused_with_new_files.wait_for(|changed| *changed) => {
                    tracing::info!("draining, then exiting to load the new credentials");
                }
            }
        };
        let engine = controller::run_term(
            client.clone(),
            cloud,
            self.engine_config(&fence),
            Arc::clone(&self.metrics),
            self.identity.clone(),
            stop,
        );
        // The front ends write objects only while this replica leads: aborted with the term.
        let _front_ends = AbortOnDropHandle::new(tokio::spawn(front_ends(
            client.clone(),
            Arc::clone(&self.metrics),
            self.identity.clone(),
            self.flags.front_end.clone(),
            frontend::gateway::Settings {
                lease_namespace: self
                    .flags
                    .node_lease_namespace
                    .clone()
                    .unwrap_or_else(|| self.flags.controller_namespace.clone()),
                heartbeat_timeout: std::time::Duration::from_millis(
                    self.flags.heartbeat_timeout_ms,
                ),
            },
        )));
        // The fence comes first: once it closes the engine is not polled again, and dropping it
        // aborts the lanes' calls (the fenced provider has already abandoned them).
        let term = tokio::select! {
            biased;
            () = fence.closed() => {
                tracing::warn!(
                    lease = leader::LEASE_NAME,
                    "stopped leading: cloud calls stopped; standing by and campaigning again"
                );
                drop(leadership);
                Term::Lost
            }
            ended = engine => {
                leadership.release().await;
                match ended {
                    Ended::Stopped => Term::Stopped,
                    Ended::LedgerUnavailable(cause) => {
                        tracing::error!(
                            error = %cause,
                            lease = leader::LEASE_NAME,
                            "released the lease: the attachment ledger could not be loaded; \
                             standing by a lease duration, then campaigning again"
                        );
                        self.health.set_ledger_failed();
                        Term::NoLedger
                    }
                }
            }
        };
        self.health.end_term();
        self.metrics.leader.set(0);
        self.metrics.end_term();
        Ok(term)
    }

    fn engine_config(&self, fence: &Fence) -> EngineConfig {
        let flags = &self.flags;
        EngineConfig {
            fence: Some(fence.clone()),
            // Derived, not a flag: a leader that cannot load the ledger within a lease duration
            // gives way, as one that cannot renew the lease would.
            ledger_deadline: flags.leader_elect_lease_duration,
            drift_period: flags.drift_period,
            coalesce_window: std::time::Duration::from_millis(flags.coalesce_window_ms),
            max_gather: std::time::Duration::from_millis(flags.batch_max_wait_ms),
            call_deadline: flags.cloud_call_deadline,
            concurrency: flags.concurrent_reconciles,
            api_requests: usize::from(flags.api_concurrency),
            namespace: flags.controller_namespace.clone(),
            orphan_grace: flags.orphan_grace,
            ..EngineConfig::default()
        }
    }
}

/// The enabled front ends, run together until the term aborts them.
async fn front_ends(
    client: kube::Client,
    metrics: Arc<Metrics>,
    identity: String,
    kinds: Vec<FrontEndKind>,
    gateway: frontend::gateway::Settings,
) {
    let reporter = Reporter {
        controller: controller::CONTROLLER_NAME.into(),
        instance: Some(identity),
    };
    let runs = kinds.into_iter().map(|kind| match kind {
        FrontEndKind::Antrea => frontend::antrea::run(
            client.clone(),
            reporter.clone(),
            Arc::clone(&metrics),
            std::future::pending(),
        )
        .boxed(),
        FrontEndKind::EgressGateway => frontend::gateway::run(
            client.clone(),
            reporter.clone(),
            Arc::clone(&metrics),
            gateway.clone(),
            std::future::pending(),
        )
        .boxed(),
    });
    futures::future::join_all(runs).await;
}
