//! The whole system on this machine: control plane, a cloud ([`LocalCloud`]: moto, or a fake)
//! behind the fault proxy, and the webhook and the reconciler as separate processes, wired as a cluster would wire them: each runs with a
//! token of its own ServiceAccount, bound to the roles of the shipped manifests, so a permission
//! missing there fails the suite.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use super::cloud::{LocalCloud, aws_flags, write_aws_credentials};
use super::wait;
use crate::bench::webhook::load::{Connection, client_config};
use crate::fakes::faultproxy::FaultProxy;
use crate::harness::binaries;
use crate::harness::controlplane::{ControlPlane, Supervised};
use crate::harness::webhook::{
    SecretDir, register_webhooks, serving_cert, test_ca, webhook_command,
};
use hyper::body::Bytes;

/// Namespace of the reconciler's Lease, Secret and ConfigMap, as `manifests/reconciler` has it.
pub const NAMESPACE: &str = "cloudnet-system";
/// The reconciler's ServiceAccount in [`NAMESPACE`].
pub const RECONCILER_ACCOUNT: &str = "cloudnet-reconciler";
/// Namespace and ServiceAccount of the webhook, as `manifests/webhook` has them.
pub const WEBHOOK_ACCOUNT: (&str, &str) = ("cloudnet", "cloudnet-webhook");
/// The shipped manifests that make the processes' identities: namespaces, ServiceAccounts and
/// roles, applied unchanged (paths relative to `e2e-kind/`).
const RBAC_MANIFESTS: [&str; 4] = [
    "../manifests/webhook/namespace.yaml",
    "../manifests/webhook/rbac.yaml",
    "../manifests/reconciler/base/namespace.yaml",
    "../manifests/reconciler/base/rbac.yaml",
];
/// Lifetime of the processes' tokens: longer than any run of the suite.
const TOKEN_SECONDS: i64 = 24 * 3600;
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
    /// Where the webhook serves, and the CA its certificate verifies against.
    webhook_endpoint: (SocketAddr, String),
    proxy: FaultProxy,
    cloud: Box<dyn LocalCloud>,
    metrics: SocketAddr,
    cp: ControlPlane,
}

impl LocalSystem {
    /// Starts everything in front of `cloud` and returns once the webhook demonstrably reviews
    /// requests.
    pub async fn start(cloud: Box<dyn LocalCloud>) -> Result<Self> {
        let cp = ControlPlane::start_with_crd().await?;
        let proxy = cloud.proxy_builder().start().await?;
        let client = cp.client().await?;
        apply_rbac(&cp)?;
        let (namespace, account) = WEBHOOK_ACCOUNT;
        let webhook_kubeconfig = service_account_kubeconfig(&cp, &client, namespace, account)
            .await
            .context("the webhook's kubeconfig")?;
        let (mut webhook, webhook_endpoint) =
            start_webhook(&cp, &client, cloud.as_ref(), &webhook_kubeconfig).await?;
        wait_until_reviewed(&client, &mut webhook).await?;
        let reconciler_kubeconfig =
            service_account_kubeconfig(&cp, &client, NAMESPACE, RECONCILER_ACCOUNT)
                .await
                .context("the reconciler's kubeconfig")?;
        let metrics = free_addr()?;
        let reconciler = Supervised::spawn(
            "cloudnet-reconciler",
            cloud_reconciler_command(
                &cp,
                cloud.as_ref(),
                proxy.url(),
                metrics,
                &reconciler_kubeconfig,
            )?,
            &cp.dir().join("reconciler.log"),
        )?;
        Ok(Self {
            reconciler,
            webhook,
            webhook_endpoint,
            proxy,
            cloud,
            metrics,
            cp,
        })
    }

    /// The control plane.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.cp
    }

    /// The fault proxy the reconciler reaches the cloud through.
    pub fn proxy(&self) -> &FaultProxy {
        &self.proxy
    }

    /// The cloud behind the proxy.
    pub fn cloud(&self) -> &dyn LocalCloud {
        self.cloud.as_ref()
    }

    /// The cloud's own URL (moto's, or the fake's).
    pub fn cloud_url(&self) -> &str {
        self.cloud.url()
    }

    /// Process ids of the webhook and the reconciler.
    pub fn pids(&self) -> [u32; 2] {
        [self.webhook.pid(), self.reconciler.pid()]
    }

    /// The reconciler's Prometheus endpoint.
    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.metrics)
    }

    /// The webhook's metrics text, read over its TLS port as Prometheus would.
    pub async fn webhook_metrics(&self) -> Result<String> {
        let (addr, ca) = &self.webhook_endpoint;
        let mut connection = Connection::open(*addr, client_config(ca)?).await?;
        let (status, body) = connection.request("GET", "/metrics", Bytes::new()).await?;
        if status != 200 {
            bail!("the webhook's /metrics answered {status}");
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
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

/// Applies the namespaces, ServiceAccounts and roles of the shipped manifests to `cp`.
pub fn apply_rbac(cp: &ControlPlane) -> Result<()> {
    apply(cp, &RBAC_MANIFESTS).context("applying the RBAC manifests")
}

/// `kubectl apply --server-side` of the crate-relative `manifests`.
fn apply(cp: &ControlPlane, manifests: &[&str]) -> Result<()> {
    let mut args: Vec<std::ffi::OsString> =
        ["apply", "--server-side", "--field-manager=cloudnet-e2e"]
            .map(Into::into)
            .into();
    for manifest in manifests {
        args.push("-f".into());
        args.push(crate::crate_file(manifest).into());
    }
    cp.run_kubectl(args)?;
    Ok(())
}

/// Applies the Antrea front end's grants as shipped (the component
/// `manifests/reconciler/overlays/antrea`), for a reconciler run with `--front-end antrea`.
pub fn apply_antrea_rbac(cp: &ControlPlane) -> Result<()> {
    apply(cp, &["../manifests/reconciler/overlays/antrea/rbac.yaml"])
        .context("applying the Antrea front end's grants")
}

/// Applies the egress gateway component's grants (`manifests/reconciler/overlays/egress-gateway`).
pub fn apply_gateway_rbac(cp: &ControlPlane) -> Result<()> {
    apply(
        cp,
        &["../manifests/reconciler/overlays/egress-gateway/rbac.yaml"],
    )
    .context("applying the egress gateway front end's grants")
}

/// Creates namespace `name` (the benchmark's reconciler runs as admin, without the RBAC).
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

/// Writes a kubeconfig for `cp` holding a token of ServiceAccount `namespace/name` (from the
/// TokenRequest API, as the kubelet gets a pod's) and returns its path.
pub async fn service_account_kubeconfig(
    cp: &ControlPlane,
    admin: &Client,
    namespace: &str,
    name: &str,
) -> Result<PathBuf> {
    let request = TokenRequest {
        // No audiences: the apiserver's own, which is what it accepts.
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let response = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token of {namespace}/{name}"))?;
    let token = response
        .status
        .map(|s| s.token)
        .context("the TokenRequest has no status")?;
    let ca = base64::engine::general_purpose::STANDARD.encode(cp.ca_pem());
    let user = format!("system:serviceaccount:{namespace}:{name}");
    // JSON is YAML: any kubeconfig reader takes it.
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "local",
            "cluster": { "server": cp.server_url(), "certificate-authority-data": ca },
        }],
        "users": [{ "name": user, "user": { "token": token } }],
        "contexts": [{ "name": name, "context": { "cluster": "local", "user": user } }],
        "current-context": name,
    });
    let path = cp.dir().join(format!("kubeconfig-{namespace}-{name}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&kubeconfig)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Runs `cloudnet-webhook` as its ServiceAccount (`kubeconfig`) with a serving certificate from a
/// fresh CA, and registers it with kube-apiserver by URL, with that CA as caBundle.
async fn start_webhook(
    cp: &ControlPlane,
    client: &Client,
    cloud: &dyn LocalCloud,
    kubeconfig: &Path,
) -> Result<(Supervised, (SocketAddr, String))> {
    let ca = test_ca("cloudnet-e2e-webhook-ca")?;
    let certs = SecretDir::create(&cp.dir().join("webhook-tls"), &serving_cert(&ca)?)?;
    let addr = free_addr()?;
    let mut command = webhook_command(addr, &certs, kubeconfig)?;
    command
        .arg(format!("--platform-type={}", cloud.platform()))
        .args(cloud.webhook_flags());
    let webhook = Supervised::spawn("cloudnet-webhook", command, &cp.dir().join("webhook.log"))?;
    register_webhooks(client, WEBHOOK_NAME, addr, ca.cert_pem()).await?;
    Ok((webhook, (addr, ca.cert_pem().to_owned())))
}

/// The reconciler's command line as a cluster would run it against EC2 at `ec2_url`, acting with
/// `kubeconfig`; the credentials directory is written into the control plane's directory.
pub(crate) fn reconciler_command(
    cp: &ControlPlane,
    region: &str,
    ec2_url: &str,
    metrics: SocketAddr,
    kubeconfig: &Path,
) -> Result<Command> {
    let secret = cp.dir().join("cloud-credentials");
    write_aws_credentials(&secret)?;
    command_with(
        "AWS",
        aws_flags(region, ec2_url),
        &secret,
        metrics,
        kubeconfig,
    )
}

/// The reconciler's command line as a cluster would run it with upstream's flags against
/// `cloud` at `api_url` (the proxy), acting with `kubeconfig`, with credentials laid out like the
/// mounted Secret in the control plane's directory.
pub fn cloud_reconciler_command(
    cp: &ControlPlane,
    cloud: &dyn LocalCloud,
    api_url: &str,
    metrics: SocketAddr,
    kubeconfig: &Path,
) -> Result<Command> {
    let secret = cp.dir().join("cloud-credentials");
    cloud.write_credentials(&secret)?;
    let flags = cloud.reconciler_flags(api_url);
    let mut command = command_with(cloud.platform(), flags, &secret, metrics, kubeconfig)?;
    command.envs(cloud.reconciler_env());
    Ok(command)
}

fn command_with(
    platform: &str,
    cloud_flags: Vec<String>,
    secret: &Path,
    metrics: SocketAddr,
    kubeconfig: &Path,
) -> Result<Command> {
    let mut command = Command::new(binaries::reconciler()?);
    command
        .arg("--secret-name=cloud-credentials")
        .arg(format!("--platform-type={platform}"))
        .args(cloud_flags)
        .arg("--secret-override")
        .arg(secret)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg(format!("--metrics-bind-address={metrics}"))
        .env("CONTROLLER_NAMESPACE", NAMESPACE)
        .env("CONTROLLER_NAME", "cloudnet-e2e-reconciler");
    Ok(command)
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
