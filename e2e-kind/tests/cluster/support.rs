//! What the cluster tier's scenarios share: the bounds, the keys moto is given, waiting on a
//! Deployment, and the forwarders through which pods reach the host.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use cloudnet_e2e::fakes::tcpcut::TcpCut;
use cloudnet_e2e::harness::cluster::{self, NodeCluster};
use cloudnet_e2e::harness::e2e::wait;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, Client};

/// How long a pod may take to be scheduled, started and ready on a loaded 2-core machine.
pub const POD_TIMEOUT: Duration = Duration::from_secs(180);
/// The access key the cloud credentials start with (moto takes any).
pub const ORIGINAL_KEY: &str = "AKIDCLOUDNETE2E";
/// The access key a rotation writes.
pub const ROTATED_KEY: &str = "AKIDCLOUDNETE2EROTATED";
/// A new object converges within this after a rotation: the leader's drain and restart, then the
/// kubelet's refresh of the Secret volume (one pod sync, 10 s here), on a loaded 2-core machine.
pub const ROTATION_BOUND: Duration = Duration::from_secs(120);

/// Whether this machine can run a one-node cluster (and unpack and enter the images); if not,
/// prints what it lacks, and the test skips.
pub fn machine_can_run_a_node() -> bool {
    let missing = cluster::missing_requirements();
    if !missing.is_empty() {
        eprintln!(
            "SKIPPED: this machine cannot run a one-node cluster; it lacks:\n  {}",
            missing.join("\n  ")
        );
    }
    missing.is_empty()
}

/// Waits until Deployment `namespace/name` has all its replicas updated and available.
pub async fn wait_available(client: &Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace);
    wait::until(
        POD_TIMEOUT,
        &format!("deployment {namespace}/{name} available"),
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get(name).await?;
                let want = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                let status = d.status.unwrap_or_default();
                Ok(status.available_replicas.unwrap_or(0) >= want
                    && status.updated_replicas.unwrap_or(0) >= want)
            }
        },
    )
    .await
}

/// The network operator's template values that both of its fixtures take (e2e-kind/cno,
/// e2e-kind/hosted), for AWS at `ec2` (a forwarder the pods reach on the host), followed by
/// `extra`.
pub fn operator_values(
    ec2: &TcpCut,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let host = cluster::HOST_FROM_PODS;
    let mut values = vec![
        ("@PLATFORM_TYPE@", "AWS".to_owned()),
        ("@PLATFORM_REGION@", "us-east-1".to_owned()),
        (
            "@PLATFORM_API_URL@",
            format!("http://{host}:{}", ec2.addr().port()),
        ),
        ("@RELEASE_VERSION@", "4.99.0-cloudnet-e2e".to_owned()),
        ("@HOST_FROM_PODS@", host.to_owned()),
    ];
    values.extend_from_slice(extra);
    values
}

/// Forwarders on every host address through which pods reach `ec2` and kube-apiserver on the
/// host, in that order.
pub async fn forwarders_from_pods(
    node: &NodeCluster,
    ec2: SocketAddr,
) -> anyhow::Result<(TcpCut, TcpCut)> {
    let any = IpAddr::from([0, 0, 0, 0]);
    let apiserver: SocketAddr = node
        .control_plane()
        .server_url()
        .trim_start_matches("https://")
        .parse()?;
    Ok((
        TcpCut::start_on(any, ec2).await?,
        TcpCut::start_on(any, apiserver).await?,
    ))
}
