//! Builds the Kubernetes client and the cloud provider named by the flags.

use std::sync::Arc;

use cloudnet_kubeclient::Liveness;
use cloudnet_shared::Platform;
use kube::Client;
use kube::config::{Config, Kubeconfig};
use thiserror::Error;
use tower::limit::ConcurrencyLimitLayer;

use crate::cloud::CloudProvider;
#[cfg(feature = "memory-cloud")]
use crate::cloud::memory::{MemoryCloud, MemoryConfig, VmSpec};
use crate::outbound::proxy::{self, ProxyError};
use crate::process::{Flags, PlatformType};

/// The process could not be set up. Each cloud's set-up error keeps its cause as its source, so
/// the one-line report names it (a missing key file names the file and the OS error).
#[derive(Debug, Error)]
pub enum SetupError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// A proxy variable is unusable.
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    /// The platform's cloud was left out of this build.
    #[error("platform \"{0}\" is not supported by this build")]
    Platform(Platform),
    /// The AWS client could not be set up from the flags and the mounted files.
    #[cfg(feature = "aws")]
    #[error("AWS")]
    Aws(#[from] crate::cloud::aws::AwsSetupError),
    /// The Azure client could not be set up from the flags and the mounted files.
    #[cfg(feature = "azure")]
    #[error("Azure")]
    Azure(#[from] crate::cloud::azure::AzureSetupError),
    /// The GCP client could not be set up from the flags and the mounted files.
    #[cfg(feature = "gcp")]
    #[error("GCP")]
    Gcp(#[from] crate::cloud::gcp::GcpSetupError),
    /// The OpenStack client could not be set up from the flags and the mounted files.
    #[error("OpenStack")]
    OpenStack(#[from] crate::cloud::openstack::OpenStackSetupError),
}

/// Clients of one cluster: the engine's and leader election's, and the cluster's URL.
pub struct KubeClients {
    /// The engine's client, with at most `--api-concurrency` requests awaiting their response.
    ///
    /// There is no rate limit (client-go's 5 QPS default is what caps upstream): thousands of
    /// objects are limited only by the API server. The cap on requests in flight is what keeps a
    /// burst of reconciles from queueing thousands of requests (or, against an apiserver that
    /// speaks only HTTP/1.1, from opening a connection each).
    pub engine: Client,
    /// Leader election's own client (its own connection), without that cap: a renewal queued
    /// behind a burst of the engine's writes could miss the renew deadline and stop a healthy
    /// leader.
    pub election: Client,
    /// The API server's URL, which scopes the leader's process lock.
    pub cluster_url: String,
}

/// Clients from the kubeconfig of `flags`, or the in-cluster/default configuration when empty,
/// the engine's with at most `--api-concurrency` requests awaiting their response at once,
/// reaching kube-apiserver through the proxy the environment names for it (none when `NO_PROXY`
/// covers it), every request but a watch bounded by `--api-request-timeout` and every connection
/// pinged ([`cloudnet_kubeclient`]). Waits up to `--kubeconfig-wait` for the files the kubeconfig
/// names.
pub async fn kube_clients(flags: &Flags) -> Result<KubeClients, SetupError> {
    let rules = proxy::rules();
    proxy::check(rules)?;
    let err = |e: &(dyn std::error::Error + 'static)| {
        SetupError::Kubeconfig(cloudnet_shared::report::one_line(e))
    };
    let kubeconfig = flags.kubeconfig.as_str();
    // As kube-rs's `Config::infer`: the kubeconfig of `--kubeconfig`, else of `KUBECONFIG` or
    // ~/.kube/config, else the in-cluster configuration.
    let read = if kubeconfig.is_empty() {
        Kubeconfig::read()
    } else {
        Ok(Kubeconfig::read_from(kubeconfig).map_err(|e| err(&e))?)
    };
    if let Ok(kc) = &read {
        cloudnet_kubeclient::files::wait_for(
            &cloudnet_kubeclient::files::referenced(kc),
            flags.kubeconfig_wait,
        )
        .await
        .map_err(|e| err(&e))?;
    }
    let (mut config, own_proxy) = match read {
        Ok(kc) => crate::outbound::kubeconfig::config(kc).map_err(|e| err(&e))?,
        Err(no_kubeconfig) => match Config::incluster() {
            Ok(config) => (config, None),
            Err(e) => {
                return Err(SetupError::Kubeconfig(format!(
                    "no kubeconfig ({}) and no in-cluster configuration ({})",
                    cloudnet_shared::report::one_line(&no_kubeconfig),
                    cloudnet_shared::report::one_line(&e)
                )));
            }
        },
    };
    match own_proxy {
        Some(proxy) => {
            tracing::info!(apiserver = %config.cluster_url, %proxy, "reaching kube-apiserver through the kubeconfig's proxy-url");
            config.proxy_url = Some(proxy);
        }
        None => proxy::apply_to_kube(rules, &mut config),
    }
    let cluster_url = config.cluster_url.to_string();
    let liveness = Liveness::with_request_timeout(flags.api_request_timeout);
    let election = cloudnet_kubeclient::client(config.clone(), &liveness).map_err(|e| err(&e))?;
    let engine = cloudnet_kubeclient::builder(config, &liveness)
        .map_err(|e| err(&e))?
        .with_layer(&ConcurrencyLimitLayer::new(usize::from(
            flags.api_concurrency,
        )))
        .build();
    Ok(KubeClients {
        engine,
        election,
        cluster_url,
    })
}

/// The provider for `--platform-type`, reading the mounted credentials and CA files now (call it
/// once this process leads, so a standby that takes over reads the files as they are then).
/// `Memory` (hidden, for tests and benchmarks; only with the `memory-cloud` feature) creates a VM
/// for every `memory:///<instance>` providerID it is asked about.
pub async fn build(flags: &Flags) -> Result<Arc<dyn CloudProvider>, SetupError> {
    // Without the memory cloud the match has one arm; it stays a match for the builds with it.
    #[cfg_attr(
        not(feature = "memory-cloud"),
        allow(clippy::infallible_destructuring_match)
    )]
    let platform = match flags.platform_type {
        #[cfg(feature = "memory-cloud")]
        PlatformType::Memory => {
            return Ok(Arc::new(MemoryCloud::new(MemoryConfig {
                auto_vm: Some(VmSpec::ipv4(
                    std::net::Ipv4Addr::new(10, 255, 255, 254).into(),
                    1000,
                )),
                record_calls: false,
                latency: std::time::Duration::from_millis(flags.memory_latency_ms),
                ..MemoryConfig::default()
            })));
        }
        PlatformType::Cloud(platform) => platform,
    };
    match platform {
        #[cfg(feature = "aws")]
        Platform::Aws => Ok(aws(flags)?),
        #[cfg(feature = "gcp")]
        Platform::Gcp => Ok(gcp(flags).await?),
        Platform::OpenStack => Ok(openstack(flags)?),
        #[cfg(feature = "azure")]
        Platform::Azure => Ok(azure(flags).await?),
        // A cloud whose feature this build left out.
        #[allow(unreachable_patterns)]
        other => Err(SetupError::Platform(other)),
    }
}

#[cfg(feature = "aws")]
fn aws(flags: &Flags) -> Result<Arc<dyn CloudProvider>, crate::cloud::aws::AwsSetupError> {
    use crate::cloud::aws::{AwsProvider, AwsSettings};
    let endpoint = Some(flags.platform_api_url.as_str()).filter(|url| !url.is_empty());
    let ca_bundle = Some(std::path::Path::new(&flags.platform_aws_ca_override))
        .filter(|path| !path.as_os_str().is_empty());
    let mut settings = AwsSettings::load(
        &flags.secret_override,
        &flags.platform_region,
        endpoint,
        ca_bundle,
    )?;
    settings.pacing = flags.pacing();
    Ok(Arc::new(AwsProvider::new(&settings)?))
}

#[cfg(feature = "gcp")]
async fn gcp(flags: &Flags) -> Result<Arc<dyn CloudProvider>, crate::cloud::gcp::GcpSetupError> {
    use crate::cloud::gcp::{GcpProvider, GcpSettings};
    let mut settings = GcpSettings::new(&flags.platform_api_url);
    settings.pacing = flags.pacing();
    Ok(Arc::new(
        GcpProvider::from_secret_dir(&settings, &flags.secret_override).await?,
    ))
}

fn openstack(
    flags: &Flags,
) -> Result<Arc<dyn CloudProvider>, crate::cloud::openstack::OpenStackSetupError> {
    use crate::cloud::openstack::{OpenStackProvider, OpenStackSettings};
    let settings = OpenStackSettings::load(
        &flags.secret_override,
        &flags.config_override,
        Some(flags.platform_api_url.as_str()),
        flags.platform_openstack_max_address_pairs,
    )?;
    Ok(Arc::new(OpenStackProvider::new(&settings)?))
}

#[cfg(feature = "azure")]
async fn azure(
    flags: &Flags,
) -> Result<Arc<dyn CloudProvider>, crate::cloud::azure::AzureSetupError> {
    use crate::cloud::azure::{AzureProvider, AzureSettings};
    let api_url = Some(flags.platform_api_url.as_str()).filter(|url| !url.is_empty());
    let mut settings = AzureSettings::load(
        &flags.secret_override,
        &flags.platform_azure_environment,
        api_url,
    )
    .await?;
    settings.pacing = flags.pacing();
    Ok(Arc::new(AzureProvider::new(&settings)?))
}
