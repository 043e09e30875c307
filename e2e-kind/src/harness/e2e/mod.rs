//! The end-to-end suite's support: a [`Cluster`] that is either the whole system started locally
//! (control plane, a cloud behind the fault proxy, the webhook and the reconciler as separate
//! processes) or an existing cluster given by `CLOUDNET_E2E_KUBECONFIG` where the webhook and the
//! reconciler are deployed (EC2 only), plus the network plugin's moves and the EC2-side reads.

#[cfg(feature = "azure")]
pub mod antrea;
pub mod arm;
pub mod cloud;
pub mod demo;
pub mod ec2;
pub mod gateway;
#[cfg(feature = "gcp")]
pub mod gce;
pub mod local;
pub mod metrics;
pub mod openstack;
pub mod plugin;
pub mod public_ips;
pub mod wait;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use cloudnet_reconciler::cloud::aws::{AwsCredentials, ClientSettings, Secret, build_sdk_client};
use kube::Client;
use kube::api::ListParams;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use crate::fakes::faultproxy::{FaultProxy, RouteCounts};
pub use cloud::{EC2_MUTATIONS, LocalCloud, Moto};
pub use local::LocalSystem;
pub use openstack::OpenStack;

/// Kubeconfig of an existing cluster to run against instead of the local system.
pub const KUBECONFIG_ENV: &str = "CLOUDNET_E2E_KUBECONFIG";
/// With [`KUBECONFIG_ENV`]: the EC2 endpoint the deployed reconciler uses, reachable from here.
pub const EC2_URL_ENV: &str = "CLOUDNET_E2E_EC2_URL";
/// With [`KUBECONFIG_ENV`]: the region the deployed reconciler uses (default `us-east-1`).
pub const REGION_ENV: &str = "CLOUDNET_E2E_REGION";
/// Region of the local system.
const LOCAL_REGION: &str = "us-east-1";

/// The system under test.
#[derive(Debug)]
pub struct Cluster {
    target: Target,
    region: String,
    ec2_url: String,
}

#[derive(Debug)]
enum Target {
    Local(Box<LocalSystem>),
    External(PathBuf),
}

impl Cluster {
    /// One cluster per `key` on EC2 (moto, or the cluster named by [`KUBECONFIG_ENV`]); see
    /// [`Self::shared_with`].
    pub fn shared(key: &'static str) -> &'static Cluster {
        Self::shared_with(key, Self::start)
    }

    /// One cluster per `key` (a test module passes its `module_path!()`: the modules of one test
    /// binary use different clouds and settings), started by `start` on a runtime of its own (the
    /// fault proxy and the process supervision must outlive each test's runtime), for the life of
    /// the test binary; the first caller's `start` wins. Blocking: call it through
    /// `spawn_blocking`. Panics when the system cannot start, with the reason.
    pub fn shared_with<F, Fut>(key: &'static str, start: F) -> &'static Cluster
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Cluster>>,
    {
        static SHARED: Mutex<BTreeMap<&'static str, &'static OnceLock<Cluster>>> =
            Mutex::new(BTreeMap::new());
        let cell: &'static OnceLock<Cluster> = SHARED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_insert_with(|| Box::leak(Box::new(OnceLock::new())));
        cell.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = tx.send(Err(anyhow::Error::from(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let _ = tx.send(start().await);
                    std::future::pending::<()>().await;
                });
            });
            match rx.recv_timeout(Duration::from_secs(600)) {
                Ok(Ok(cluster)) => cluster,
                Ok(Err(e)) => panic!("the end-to-end system did not start: {e:#}"),
                Err(e) => panic!("the end-to-end system did not start in time: {e}"),
            }
        })
    }

    /// Starts the local system, or connects to the cluster named by [`KUBECONFIG_ENV`].
    pub async fn start() -> Result<Self> {
        match std::env::var_os(KUBECONFIG_ENV) {
            Some(path) => Ok(Self {
                target: Target::External(PathBuf::from(path)),
                region: std::env::var(REGION_ENV).unwrap_or_else(|_| LOCAL_REGION.into()),
                ec2_url: std::env::var(EC2_URL_ENV)
                    .with_context(|| format!("{KUBECONFIG_ENV} needs {EC2_URL_ENV}"))?,
            }),
            None => Self::start_local().await,
        }
    }

    /// Starts the local system on EC2 (moto), whatever the environment says.
    pub async fn start_local() -> Result<Self> {
        Self::start_local_with(Box::new(Moto::start(LOCAL_REGION).await?)).await
    }

    /// Starts the local system in front of `cloud`.
    pub async fn start_local_with(cloud: Box<dyn LocalCloud>) -> Result<Self> {
        let local = LocalSystem::start(cloud).await?;
        Ok(Self {
            ec2_url: local.cloud_url().to_owned(),
            target: Target::Local(Box::new(local)),
            region: LOCAL_REGION.into(),
        })
    }

    /// A new admin client (one per test runtime).
    pub async fn client(&self) -> Result<Client> {
        match &self.target {
            Target::Local(local) => local.control_plane().client().await,
            Target::External(path) => {
                let kubeconfig = Kubeconfig::read_from(path)?;
                let config =
                    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                        .await?;
                Ok(Client::try_from(config)?)
            }
        }
    }

    /// An EC2 client straight to the cloud (not through the proxy: the suite's own reads are
    /// neither faulted nor counted).
    pub fn ec2(&self) -> Result<aws_sdk_ec2::Client> {
        ec2_client(&self.region, &self.ec2_url)
    }

    /// An EC2 client that sees EC2 as the reconciler does, through the fault proxy (terminated
    /// instances included), when the system is local.
    pub fn ec2_through_proxy(&self) -> Result<Option<aws_sdk_ec2::Client>> {
        let Some(proxy) = self.proxy() else {
            return Ok(None);
        };
        ec2_client(&self.region, proxy.url()).map(Some)
    }

    /// The fault proxy in front of EC2, when the system is local.
    pub fn proxy(&self) -> Option<&FaultProxy> {
        match &self.target {
            Target::Local(local) => Some(local.proxy()),
            Target::External(_) => None,
        }
    }

    /// The local system, if this is one.
    pub fn local(&self) -> Option<&LocalSystem> {
        match &self.target {
            Target::Local(local) => Some(local),
            Target::External(_) => None,
        }
    }

    /// EC2 mutating calls forwarded by the proxy so far, when the system is local.
    pub fn ec2_mutations(&self) -> Option<u64> {
        self.cloud_mutations()
    }

    /// The cloud's mutating calls forwarded by the proxy so far, when the system is local.
    pub fn cloud_mutations(&self) -> Option<u64> {
        let local = self.local()?;
        let cloud = local.cloud();
        Some(
            local
                .proxy()
                .forwarded_where(|route| cloud.is_mutation(route)),
        )
    }

    /// The local cloud as its concrete type (a test's own fake), when the system is local.
    pub fn cloud<C: LocalCloud>(&self) -> Option<&C> {
        self.local()?.cloud().as_any().downcast_ref()
    }

    /// Calls per EC2 action seen by the proxy so far, when the system is local.
    pub fn ec2_counts(&self, action: &str) -> Option<RouteCounts> {
        self.proxy().map(|p| p.counts(action))
    }

    /// The reconciler's metrics text, when the system is local.
    pub async fn reconciler_metrics(&self) -> Result<Option<String>> {
        match self.local() {
            Some(local) => Ok(Some(metrics::scrape(&local.metrics_url()).await?)),
            None => Ok(None),
        }
    }

    /// The webhook's metrics text, when the system is local.
    pub async fn webhook_metrics(&self) -> Result<Option<String>> {
        match self.local() {
            Some(local) => Ok(Some(local.webhook_metrics().await?)),
            None => Ok(None),
        }
    }

    /// Waits up to `timeout` until the objects (name → `Assigned=True`) satisfy `done`; the error
    /// carries the processes' log tails.
    pub async fn wait_objects(
        &self,
        client: &Client,
        timeout: Duration,
        what: &str,
        done: impl Fn(&BTreeMap<String, bool>) -> bool,
    ) -> Result<()> {
        let api = plugin::objects(client);
        wait::until(timeout, what, || {
            let api = api.clone();
            let done = &done;
            async move {
                let list = api.list(&ListParams::default()).await?;
                let assigned: BTreeMap<String, bool> = list
                    .items
                    .iter()
                    .map(|o| (o.metadata.name.clone().unwrap_or_default(), o.is_assigned()))
                    .collect();
                Ok(done(&assigned))
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.diagnostics()))
    }

    /// The last lines of the webhook's and the reconciler's logs, for failure messages.
    pub fn diagnostics(&self) -> String {
        self.local().map(LocalSystem::log_tails).unwrap_or_default()
    }
}

/// Credentials for moto (it accepts any); a real cloud's come from the environment.
/// An EC2 client for `region` at `endpoint` with the suite's credentials (moto takes any).
pub fn ec2_client(region: &str, endpoint: &str) -> Result<aws_sdk_ec2::Client> {
    let settings = ClientSettings {
        region: region.to_owned(),
        endpoint: Some(endpoint.to_owned()),
        sts_endpoint: None,
        ca_bundle_pem: None,
        call_timeout: Duration::from_secs(30),
    };
    Ok(build_sdk_client(&settings, &test_credentials().into())?)
}

fn test_credentials() -> AwsCredentials {
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    AwsCredentials {
        access_key_id: Secret::new(var("AWS_ACCESS_KEY_ID", "AKIDCLOUDNETE2E")),
        secret_access_key: Secret::new(var("AWS_SECRET_ACCESS_KEY", "cloudnet-e2e-secret")),
        session_token: None,
    }
}
