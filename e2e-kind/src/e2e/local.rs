//! The whole system on this machine: control plane, moto behind the fault proxy, and the webhook
//! and the reconciler as separate processes, wired as a cluster would wire them.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use super::{binaries, wait};
use crate::controlplane::{ControlPlane, Supervised};
use crate::faultproxy::{Dialect, FaultProxy};
use crate::moto::MotoServer;
use crate::webhook_bench::{SecretDir, register_webhooks, serving_cert, test_ca};

/// Namespace of the reconciler's Lease (upstream's controller namespace).
pub const NAMESPACE: &str = "openshift-cloud-network-config-controller";
/// Name of the webhook configurations the suite registers.
const WEBHOOK_NAME: &str = "cloudnet-e2e";
/// How long each component may take to come up on a loaded machine.
const READY: Duration = Duration::from_secs(120);

/// The running local system. Dropping it stops every process.
#[derive(Debug)]
pub struct LocalSystem {
    // Field order is drop order: the reconciler and webhook stop before the cloud and the API.
    reconciler: Supervised,
    webhook: Supervised,
    proxy: FaultProxy,
    moto: MotoServer,
    metrics: SocketAddr,
    cp: ControlPlane,
}

impl LocalSystem {
    /// Starts everything and returns once the webhook demonstrably reviews requests.
    pub async fn start(region: &str) -> Result<Self> {
        let cp = ControlPlane::start_with_crd().await?;
        let moto = MotoServer::start().await?;
        let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
            .seed(5)
            .start()
            .await?;
        let client = cp.client().await?;
        create_namespace(&client, NAMESPACE).await?;
        let mut webhook = start_webhook(&cp, &client).await?;
        wait_until_reviewed(&client, &mut webhook).await?;
        let metrics = free_addr()?;
        let reconciler = start_reconciler(&cp, region, proxy.url(), metrics)?;
        Ok(Self {
            reconciler,
            webhook,
            proxy,
            moto,
            metrics,
            cp,
        })
    }

    /// The control plane.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.cp
    }

    /// The fault proxy the reconciler reaches EC2 through.
    pub fn proxy(&self) -> &FaultProxy {
        &self.proxy
    }

    /// moto's own URL.
    pub fn moto_url(&self) -> &str {
        self.moto.url()
    }

    /// Process ids of the webhook and the reconciler.
    pub fn pids(&self) -> [u32; 2] {
        [self.webhook.pid(), self.reconciler.pid()]
    }

    /// The reconciler's Prometheus endpoint.
    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.metrics)
    }

    /// The last lines of the webhook's and the reconciler's logs.
    pub fn log_tails(&self) -> String {
        format!(
            "--- webhook log ---\n{}\n--- reconciler log ---\n{}",
            self.webhook.log_tail(30),
            self.reconciler.log_tail(60)
        )
    }
}

pub(crate) async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// Runs `cloudnet-webhook` with a serving certificate from a fresh CA and registers it with
/// kube-apiserver by URL, with that CA as caBundle.
async fn start_webhook(cp: &ControlPlane, client: &Client) -> Result<Supervised> {
    let ca = test_ca("cloudnet-e2e-webhook-ca")?;
    let certs = SecretDir::create(&cp.dir().join("webhook-tls"), &serving_cert(&ca)?)?;
    let addr = free_addr()?;
    let mut command = Command::new(binaries::webhook()?);
    command
        .arg("--platform-type=AWS")
        .arg(format!("--listen-address={addr}"))
        .arg("--tls-cert-file")
        .arg(certs.cert_path())
        .arg("--tls-key-file")
        .arg(certs.key_path())
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path());
    let webhook = Supervised::spawn("cloudnet-webhook", command, &cp.dir().join("webhook.log"))?;
    register_webhooks(client, WEBHOOK_NAME, addr, ca.cert_pem()).await?;
    Ok(webhook)
}

/// Runs `cloudnet-reconciler` with upstream's flags, EC2 at the proxy, credentials from a
/// directory laid out like the mounted Secret.
fn start_reconciler(
    cp: &ControlPlane,
    region: &str,
    ec2_url: &str,
    metrics: SocketAddr,
) -> Result<Supervised> {
    Supervised::spawn(
        "cloudnet-reconciler",
        reconciler_command(cp, region, ec2_url, metrics)?,
        &cp.dir().join("reconciler.log"),
    )
}

/// The reconciler's command line as a cluster would run it (see [`start_reconciler`]); the
/// credentials directory is written into the control plane's directory.
pub(crate) fn reconciler_command(
    cp: &ControlPlane,
    region: &str,
    ec2_url: &str,
    metrics: SocketAddr,
) -> Result<Command> {
    let secret = cp.dir().join("cloud-credentials");
    write_credentials(&secret)?;
    let mut command = Command::new(binaries::reconciler()?);
    command
        .arg("--secret-name=cloud-credentials")
        .arg("--platform-type=AWS")
        .arg(format!("--platform-region={region}"))
        .arg(format!("--platform-api-url={ec2_url}"))
        .arg("--secret-override")
        .arg(&secret)
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .arg(format!("--metrics-bind-address={metrics}"))
        .env("CONTROLLER_NAMESPACE", NAMESPACE)
        .env("CONTROLLER_NAME", "cloudnet-e2e-reconciler");
    Ok(command)
}

fn write_credentials(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("aws_access_key_id"), "AKIDCLOUDNETE2E")?;
    std::fs::write(dir.join("aws_secret_access_key"), "cloudnet-e2e-secret")?;
    Ok(())
}

/// kube-apiserver picks webhook configurations up asynchronously: poll a dry-run create that
/// only the webhook refuses (the CRD's `format: ipv4` accepts leading zeros).
async fn wait_until_reviewed(client: &Client, webhook: &mut Supervised) -> Result<()> {
    let api = Api::<CloudPrivateIPConfig>::all(client.clone());
    let probe = CloudPrivateIPConfig::new(
        "010.0.0.99",
        CloudPrivateIPConfigSpec {
            node: "no-such-node".into(),
        },
    );
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait::until(READY, "the webhook to review requests", || {
        let (api, probe, dry_run) = (&api, &probe, &dry_run);
        let exited = webhook.exited();
        async move {
            if let Some(status) = exited {
                bail!("cloudnet-webhook exited: {status}");
            }
            let result = api.create(dry_run, probe).await;
            Ok(matches!(&result, Err(kube::Error::Api(s)) if s.message.contains("name_encoding")))
        }
    })
    .await
    .with_context(|| webhook.log_tail(30))
}

/// A free 127.0.0.1 port: bound, read, released for the child to bind.
fn free_addr() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}
