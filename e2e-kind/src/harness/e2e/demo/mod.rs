//! The main job on embedded defaults: the whole system started locally on one cloud (EC2 on
//! moto by default, GCE or Azure on the project's fakes, or real Keystone and Neutron), three VMs
//! and their nodes, then what a network plugin sees — node annotations, an assignment, a move and
//! a denied request (on AWS also a public address that follows the move) — and the system left
//! running for exploration until the caller says stop.

mod antrea;
mod aws;
#[cfg(feature = "azure")]
mod azure;
mod cilium;
#[cfg(feature = "gcp")]
mod gcp;
mod openstack;
mod public;

use std::future::Future;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use std::net::IpAddr;

use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, encode_name};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

use super::{Cluster, plugin};

const NODES: [&str; 3] = ["worker-a", "worker-b", "worker-c"];

/// The cloud the demo runs against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DemoCloud {
    /// EC2, served by moto.
    #[default]
    Aws,
    /// GCE, served by the project's schema-checked fake.
    #[cfg(feature = "gcp")]
    Gcp,
    /// OpenStack: real Keystone and Neutron from PyPI.
    OpenStack,
    /// Azure Resource Manager, served by the project's schema-checked fake.
    #[cfg(feature = "azure")]
    Azure,
}

impl FromStr for DemoCloud {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_uppercase().as_str() {
            "AWS" => Ok(Self::Aws),
            #[cfg(feature = "gcp")]
            "GCP" => Ok(Self::Gcp),
            "OPENSTACK" => Ok(Self::OpenStack),
            #[cfg(feature = "azure")]
            "AZURE" => Ok(Self::Azure),
            _ => bail!("the demo runs on AWS, GCP, Azure or OpenStack, not {s:?}"),
        }
    }
}

impl DemoCloud {
    fn describe(self) -> &'static str {
        match self {
            Self::Aws => "moto (EC2)",
            #[cfg(feature = "gcp")]
            Self::Gcp => "the GCE fake",
            Self::OpenStack => "Keystone and Neutron",
            #[cfg(feature = "azure")]
            Self::Azure => "the ARM fake",
        }
    }

    async fn start(self) -> Result<Cluster> {
        match self {
            Self::Aws => Cluster::start_local().await,
            #[cfg(feature = "gcp")]
            Self::Gcp => Cluster::start_local_with(Box::new(super::gce::Gce::start().await?)).await,
            Self::OpenStack => {
                let cloud = super::openstack::OpenStack::start(Default::default()).await?;
                Cluster::start_local_with(Box::new(cloud)).await
            }
            #[cfg(feature = "azure")]
            Self::Azure => {
                Cluster::start_local_with(Box::new(super::arm::Arm::start().await?)).await
            }
        }
    }

    async fn show(self, cluster: &Cluster) -> Result<()> {
        match self {
            Self::Aws => aws::show(cluster).await,
            #[cfg(feature = "gcp")]
            Self::Gcp => gcp::show(cluster).await,
            Self::OpenStack => openstack::show(cluster).await,
            #[cfg(feature = "azure")]
            Self::Azure => azure::show(cluster).await,
        }
    }
}

/// Whose objects the demo shows the reconciler acting on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DemoPlugin {
    /// A network plugin that writes CloudPrivateIPConfigs itself (OVN-Kubernetes' protocol).
    #[default]
    Own,
    /// Antrea's Egresses, through the reconciler's Antrea front end (docs/plugins/antrea.md).
    Antrea,
    /// An egress gateway for Cilium: the reconciler's gateway front end and the node agents
    /// (docs/plugins/cilium.md).
    Cilium,
}

impl FromStr for DemoPlugin {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "antrea" => Ok(Self::Antrea),
            "cilium" => Ok(Self::Cilium),
            _ => bail!("the demo's plugins: antrea, cilium (or none), not {s:?}"),
        }
    }
}

/// Runs the demo on `cloud` until `stop` resolves, then stops every process it started.
pub async fn run(cloud: DemoCloud, stop: impl Future<Output = ()>) -> Result<()> {
    run_with(cloud, DemoPlugin::Own, stop).await
}

/// Runs the demo of `plugin` on `cloud` until `stop` resolves, then stops every process it
/// started. Antrea's and Cilium's run on AWS only.
pub async fn run_with(
    cloud: DemoCloud,
    plugin: DemoPlugin,
    stop: impl Future<Output = ()>,
) -> Result<()> {
    if plugin != DemoPlugin::Own && cloud != DemoCloud::Aws {
        bail!("the {plugin:?} demo runs on AWS");
    }
    println!(
        "cloudnet demo: starting etcd, kube-apiserver, {} behind the fault proxy, \
         cloudnet-webhook and cloudnet-reconciler...",
        cloud.describe()
    );
    let mut stop = std::pin::pin!(stop);
    let start = async {
        match plugin {
            DemoPlugin::Own => cloud.start().await,
            DemoPlugin::Antrea | DemoPlugin::Cilium => {
                let flag = if plugin == DemoPlugin::Antrea {
                    antrea::FLAG
                } else {
                    cilium::FLAG
                };
                let moto = super::Moto::start("us-east-1")
                    .await?
                    .with_reconciler_flags([flag]);
                Cluster::start_local_with(Box::new(moto)).await
            }
        }
    };
    let cluster = tokio::select! {
        cluster = start => cluster?,
        () = &mut stop => return Ok(()),
    };
    // The node hosts of Cilium's demo run their agents until the end.
    let show = async {
        match plugin {
            DemoPlugin::Own => cloud.show(&cluster).await.map(|()| Vec::new()),
            DemoPlugin::Antrea => antrea::show(&cluster).await.map(|()| Vec::new()),
            DemoPlugin::Cilium => cilium::show(&cluster).await,
        }
    };
    let shown = tokio::select! {
        shown = show => shown,
        () = &mut stop => Ok(Vec::new()),
    };
    if shown.is_ok() {
        stop.await;
    }
    let shown = shown.map(drop);
    drop(cluster);
    println!(
        "\nstopped the reconciler, the webhook, {}, etcd and kube-apiserver",
        cloud.describe()
    );
    shown
}

/// Creates an object for each of `ips` on `node` and waits until all are assigned there.
pub(super) async fn assign(client: &Client, ips: &[IpAddr], node: &str) -> Result<()> {
    for ip in ips {
        plugin::create(client, &encode_name(*ip)?, node).await?;
    }
    for ip in ips {
        plugin::wait_assigned(client, &encode_name(*ip)?, node).await?;
    }
    Ok(())
}

/// Requests `node`'s own address `ip`, prints the webhook's denial and how many mutating cloud
/// calls (`calls`, in the cloud's words) it caused.
pub(super) async fn deny_node_ip(
    cluster: &Cluster,
    client: &Client,
    ip: IpAddr,
    node: &str,
    calls: &str,
) -> Result<()> {
    let before = cluster.cloud_mutations();
    let denied = plugin::create(client, &encode_name(ip)?, node).await;
    println!("{}", plugin::webhook_denial(denied)?);
    println!(
        "{calls} caused by it: {}",
        cluster.cloud_mutations().unwrap_or_default() - before.unwrap_or_default()
    );
    Ok(())
}

/// Prints what runs: the control plane, EC2 behind the proxy, and the two processes, the
/// reconciler with `flag`.
pub(super) fn running(local: &super::local::LocalSystem, flag: &str) {
    let [webhook_pid, reconciler_pid] = local.pids();
    println!(
        "running: kube-apiserver {}, EC2 (moto) {} behind the fault proxy {}, cloudnet-webhook \
         pid {webhook_pid}, cloudnet-reconciler pid {reconciler_pid} with {flag}",
        local.control_plane().server_url(),
        local.cloud_url(),
        local.proxy().url(),
    );
}

/// Prints how to explore the running demo from another terminal: the kubeconfig, `kubectl get
/// {get}`, `cloud` (how to reach the cloud) and the reconciler's metrics (`metrics`: what to look
/// for there, or nothing).
pub(super) fn explore(
    local: &super::local::LocalSystem,
    get: &str,
    cloud: &str,
    metrics: &str,
) -> Result<()> {
    let kubectl = crate::harness::controlplane::locate_binaries()?.kubectl;
    let metrics = if metrics.is_empty() {
        String::new()
    } else {
        format!(" ({metrics})")
    };
    println!(
        "\nExplore it from another terminal:\n  export KUBECONFIG={}\n  {} get {get}\n  {cloud}\n  \
         reconciler metrics: {}{metrics}\n\nPress Ctrl-C to stop; everything started here is stopped and removed.",
        local.control_plane().kubeconfig_path().display(),
        kubectl.display(),
        local.metrics_url(),
    );
    Ok(())
}

/// How to reach the demo's EC2 (moto behind the fault proxy), for [`explore`].
pub(super) fn ec2_hint(local: &super::local::LocalSystem) -> String {
    let url = local.cloud_url();
    format!(
        "EC2: {url} (any credentials), e.g. aws --endpoint-url {url} --region us-east-1 ec2 describe-network-interfaces"
    )
}

pub(super) fn step(what: &str) {
    println!("\n== {what}");
}

pub(super) async fn annotation(client: &Client, node: &str) -> Result<String> {
    let node = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(node
        .metadata
        .annotations
        .and_then(|mut a| a.remove(EGRESS_IPCONFIG_ANNOTATION))
        .unwrap_or_default())
}

pub(super) fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<()> {
    let local = cluster.local().context("the demo runs locally")?;
    println!("$ kubectl {}", args.join(" "));
    let status = local
        .control_plane()
        .kubectl()
        .args(args)
        .status()
        .context("running kubectl")?;
    if !status.success() {
        bail!("kubectl {} failed with {status}", args.join(" "));
    }
    Ok(())
}
