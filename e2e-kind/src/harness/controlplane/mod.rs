//! A real local Kubernetes control plane: etcd and kube-apiserver on free 127.0.0.1 ports, with
//! generated certificates, an admin kubeconfig and the CloudPrivateIPConfig CRD.

mod binaries;
mod pki;
mod process;
mod rundir;
mod tokens;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, Config};

pub use binaries::{BIN_DIR_ENV, Binaries, locate as locate_binaries};
pub use process::Supervised;
pub use rundir::cache_root;
pub use tokens::bound_token;

use crate::fakes::apifaults::{ApiFaults, ApiTls};
use pki::{ADMIN_USER, Pki};
use rundir::RunDir;

/// How long kube-apiserver may take to report ready on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the CRD may take to become established.
const CRD_TIMEOUT: Duration = Duration::from_secs(60);
/// Start attempts: a port picked as free can be taken by a parallel test before we bind it.
const START_ATTEMPTS: usize = 3;
/// Field manager for everything the harness applies.
pub const FIELD_MANAGER: &str = "cloudnet-e2e";

/// A running etcd + kube-apiserver pair. Dropping it stops both and removes its files.
#[derive(Debug)]
pub struct ControlPlane {
    // Field order is drop order: the apiserver goes before the etcd it talks to.
    apiserver: Supervised,
    etcd: Supervised,
    server_url: String,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    restart: Restart,
    pki: Pki,
    binaries: Binaries,
    dir: RunDir,
}

impl ControlPlane {
    /// Starts a fresh control plane of its own (CRD not yet installed).
    pub async fn start() -> Result<Self> {
        let binaries = tokio::task::spawn_blocking(binaries::locate).await??;
        let dir = RunDir::create()?;
        let pki = Pki::generate(dir.path())?;
        let mut last_error = None;
        for attempt in 1..=START_ATTEMPTS {
            match start_processes(&binaries, dir.path(), &pki, attempt).await {
                Ok(started) => {
                    return Ok(Self {
                        apiserver: started.apiserver,
                        etcd: started.etcd,
                        server_url: started.server_url,
                        kubeconfig: started.kubeconfig,
                        kubeconfig_path: started.kubeconfig_path,
                        restart: started.restart,
                        pki,
                        binaries,
                        dir,
                    });
                }
                Err(StartError::PortTaken(e)) => last_error = Some(e),
                Err(StartError::Fatal(e)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow!("control plane did not start")))
    }

    /// Starts a fresh control plane and installs the CRD.
    pub async fn start_with_crd() -> Result<Self> {
        let cp = Self::start().await?;
        cp.install_crd().await?;
        Ok(cp)
    }

    /// One control plane with the CRD, shared by every test of this test binary. Tests that share
    /// it must use object names no other test uses. Its processes die with the test process.
    pub async fn shared() -> Result<&'static Self> {
        static SHARED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();
        SHARED.get_or_try_init(Self::start_with_crd).await
    }

    /// The admin kubeconfig with kube-apiserver's address replaced by `forwarder`'s, written as
    /// `name` in the run directory.
    pub fn kubeconfig_via(&self, forwarder: std::net::SocketAddr, name: &str) -> Result<PathBuf> {
        let text = std::fs::read_to_string(&self.kubeconfig_path)?;
        let path = self.dir().join(name);
        std::fs::write(
            &path,
            text.replace(&self.server_url, &format!("https://{forwarder}")),
        )?;
        Ok(path)
    }

    /// An admin client reaching kube-apiserver through `forwarder` (a proxy in front of it),
    /// bound to the calling tokio runtime.
    pub async fn client_via(&self, forwarder: std::net::SocketAddr) -> Result<Client> {
        let mut kubeconfig = self.kubeconfig.clone();
        for named in &mut kubeconfig.clusters {
            if let Some(cluster) = &mut named.cluster {
                cluster.server = Some(format!("https://{forwarder}"));
            }
        }
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// A fault proxy in front of kube-apiserver ([`ApiFaults`]) and an admin kubeconfig `name`
    /// (in the run directory) that reaches the API through it.
    pub async fn api_faults(&self, name: &str) -> Result<(ApiFaults, PathBuf)> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
        };
        let tls = ApiTls {
            ca_pem: self.pki.ca_pem.clone(),
            serving_cert_pem: read(&self.pki.serving_cert)?,
            serving_key_pem: read(&self.pki.serving_key)?,
            client_cert_pem: read(&self.pki.admin_cert)?,
            client_key_pem: read(&self.pki.admin_key)?,
        };
        let proxy = ApiFaults::start(self.apiserver_addr()?, &tls).await?;
        let kubeconfig = self.kubeconfig_via(proxy.addr(), name)?;
        Ok((proxy, kubeconfig))
    }

    /// kube-apiserver's address (host and port of [`Self::server_url`]).
    pub fn apiserver_addr(&self) -> Result<std::net::SocketAddr> {
        Ok(self.server_url.trim_start_matches("https://").parse()?)
    }

    /// A new client with admin rights, bound to the calling tokio runtime.
    pub async fn client(&self) -> Result<Client> {
        let config =
            Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
                .await?;
        Ok(Client::try_from(config)?)
    }

    /// Applies the CloudPrivateIPConfig CRD and waits until it is established.
    pub async fn install_crd(&self) -> Result<()> {
        let client = self.client().await?;
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let crd = cloudnet_shared::crd();
        let name = crd.metadata.name.clone().context("the CRD has a name")?;
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .context("applying the CRD")?;
        tokio::time::timeout(
            CRD_TIMEOUT,
            await_condition(api, &name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} not established within {CRD_TIMEOUT:?}"))??;
        Ok(())
    }

    /// The apiserver URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// Path of an admin kubeconfig file, valid while this control plane lives.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The CA that signed the apiserver's serving certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// A `kubectl` command already pointed at this control plane.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(&self.binaries.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig_path);
        command
    }

    /// Runs kubectl with `args` against this control plane: its stdout, or an error carrying its
    /// stderr when it fails.
    pub fn run_kubectl<I, S>(&self, args: I) -> Result<Vec<u8>>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let output = self
            .kubectl()
            .args(args)
            .output()
            .context("running kubectl")?;
        if !output.status.success() {
            bail!(
                "kubectl failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(output.stdout)
    }

    /// Process ids of etcd and kube-apiserver.
    pub fn pids(&self) -> [u32; 2] {
        [self.etcd.pid(), self.apiserver.pid()]
    }

    /// Stops kube-apiserver (SIGKILL), leaving etcd and its data: from now on every request is
    /// refused, as during a control-plane outage, until [`Self::start_apiserver`].
    pub fn stop_apiserver(&mut self) {
        self.apiserver.stop();
    }

    /// Starts kube-apiserver again on the same port and data, and waits until it is ready.
    pub async fn start_apiserver(&mut self) -> Result<()> {
        let command = apiserver_command(
            &self.binaries,
            self.dir.path(),
            &self.pki,
            self.restart.client_port,
            self.restart.api_port,
        );
        self.apiserver = Supervised::spawn("kube-apiserver", command, &self.restart.log)?;
        wait_ready(&self.kubeconfig, &mut self.etcd, &mut self.apiserver)
            .await
            .with_context(|| self.apiserver.log_tail(40))
    }

    /// The run directory holding certificates, logs and etcd data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

enum StartError {
    PortTaken(anyhow::Error),
    Fatal(anyhow::Error),
}

struct Started {
    etcd: Supervised,
    apiserver: Supervised,
    server_url: String,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    restart: Restart,
}

/// What starting kube-apiserver again takes: its log and ports.
#[derive(Debug)]
struct Restart {
    log: PathBuf,
    client_port: u16,
    api_port: u16,
}

async fn start_processes(
    binaries: &Binaries,
    dir: &Path,
    pki: &Pki,
    attempt: usize,
) -> Result<Started, StartError> {
    let [client_port, peer_port, api_port] = free_ports().map_err(StartError::Fatal)?;
    let etcd_dir = dir.join(format!("etcd-{attempt}"));
    let mut etcd = Command::new(&binaries.etcd);
    etcd.arg("--name=default")
        .arg(format!("--data-dir={}", etcd_dir.display()))
        .arg(format!(
            "--listen-client-urls=http://127.0.0.1:{client_port}"
        ))
        .arg(format!(
            "--advertise-client-urls=http://127.0.0.1:{client_port}"
        ))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
        ))
        .arg(format!(
            "--initial-cluster=default=http://127.0.0.1:{peer_port}"
        ))
        // Test data need not survive a power cut; fsync dominates etcd latency on shared disks.
        .arg("--unsafe-no-fsync")
        .arg("--log-level=warn");
    let mut etcd = Supervised::spawn("etcd", etcd, &dir.join(format!("etcd-{attempt}.log")))
        .map_err(StartError::Fatal)?;

    let apiserver_log = dir.join(format!("kube-apiserver-{attempt}.log"));
    let mut apiserver = Supervised::spawn(
        "kube-apiserver",
        apiserver_command(binaries, dir, pki, client_port, api_port),
        &apiserver_log,
    )
    .map_err(StartError::Fatal)?;

    let server_url = format!("https://127.0.0.1:{api_port}");
    let kubeconfig_path = dir.join("kubeconfig");
    let kubeconfig_text = kubeconfig_yaml(&server_url, pki);
    std::fs::write(&kubeconfig_path, &kubeconfig_text)
        .context("writing the kubeconfig")
        .map_err(StartError::Fatal)?;
    let kubeconfig = Kubeconfig::from_yaml(&kubeconfig_text)
        .context("parsing the generated kubeconfig")
        .map_err(StartError::Fatal)?;

    match wait_ready(&kubeconfig, &mut etcd, &mut apiserver).await {
        Ok(()) => Ok(Started {
            etcd,
            apiserver,
            server_url,
            kubeconfig,
            kubeconfig_path,
            restart: Restart {
                log: apiserver_log,
                client_port,
                api_port,
            },
        }),
        Err(e) => {
            let logs = format!("{}\n{}", etcd.log_tail(20), apiserver.log_tail(40));
            let error = e.context(logs.clone());
            if logs.contains("address already in use") {
                Err(StartError::PortTaken(error))
            } else {
                Err(StartError::Fatal(error))
            }
        }
    }
}

/// kube-apiserver serving on `api_port`, backed by the etcd on `etcd_port`.
fn apiserver_command(
    binaries: &Binaries,
    dir: &Path,
    pki: &Pki,
    client_port: u16,
    api_port: u16,
) -> Command {
    let mut apiserver = Command::new(&binaries.kube_apiserver);
    apiserver
        .arg(format!("--etcd-servers=http://127.0.0.1:{client_port}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--advertise-address=127.0.0.1")
        .arg(format!("--secure-port={api_port}"))
        .arg(format!("--cert-dir={}", dir.display()))
        .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
        .arg(format!(
            "--tls-private-key-file={}",
            pki.serving_key.display()
        ))
        .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
        .arg("--authorization-mode=RBAC")
        .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
        .arg(format!(
            "--service-account-key-file={}",
            pki.service_account_pub.display()
        ))
        .arg(format!(
            "--service-account-signing-key-file={}",
            pki.service_account_key.display()
        ))
        .arg("--service-cluster-ip-range=10.96.0.0/16")
        // No controller-manager runs, so no ServiceAccount would ever be created for pods; and no
        // kubelet exists to reconcile the `kubernetes` Service endpoints.
        .arg("--disable-admission-plugins=ServiceAccount")
        .arg("--endpoint-reconciler-type=none")
        .arg("--allow-privileged=true")
        .arg("--profiling=false");
    apiserver
}

/// Polls `/readyz` until it answers `ok`, a process exits, or the timeout passes.
async fn wait_ready(
    kubeconfig: &Kubeconfig,
    etcd: &mut Supervised,
    apiserver: &mut Supervised,
) -> Result<()> {
    let config =
        Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = etcd.exited() {
            bail!("etcd exited early with {status}");
        }
        if let Some(status) = apiserver.exited() {
            bail!("kube-apiserver exited early with {status}");
        }
        let request = http::Request::get("/readyz").body(Vec::new())?;
        let answer = match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => body,
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            bail!("kube-apiserver not ready within {READY_TIMEOUT:?}; last answer: {answer}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn kubeconfig_yaml(server_url: &str, pki: &Pki) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: cloudnet-local
  cluster:
    server: {server_url}
    certificate-authority: {ca}
users:
- name: {ADMIN_USER}
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: cloudnet-local
  context:
    cluster: cloudnet-local
    user: {ADMIN_USER}
current-context: cloudnet-local
",
        ca = pki.ca_cert.display(),
        cert = pki.admin_cert.display(),
        key = pki.admin_key.display(),
    )
}

/// `N` distinct free ports on 127.0.0.1.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    // Hold all the listeners at once so the kernel hands out different ports.
    let mut listeners = Vec::with_capacity(N);
    for _ in 0..N {
        listeners.push(TcpListener::bind("127.0.0.1:0")?);
    }
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}
