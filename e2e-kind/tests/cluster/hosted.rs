#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The controller as OpenShift's network operator deploys it on a hosted control plane
//! (HyperShift), on the one-node cluster: e2e-kind/hosted with only the image swapped
//! (e2e-kind/cluster/overlay/hosted). The cluster plays both sides: the management cluster's
//! hosted-control-plane namespace `clusters-hosted`, where the controller runs with the
//! operator's `/bin/bash -c` command, no ServiceAccount token and the credentials as mounted files;
//! and the guest cluster's namespace `openshift-cloud-network-config-controller`, whose
//! ServiceAccount (the operator's common RBAC plus HyperShift's Events grant) the controller acts
//! as through a kubeconfig whose `tokenFile` a token-minter stand-in writes and rotates.
//!
//! One test, in order (a one-node cluster per machine): the script waits for the token and execs
//! the controller; assign, move and release against EC2 (moto behind the fault proxy); a token
//! rotation whose old token is revoked; a rotation of the mounted credentials files.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::{Dialect, EC2_CREDENTIALS_REQUEST, FaultProxy};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::cluster::NodeCluster;
use cloudnet_e2e::harness::e2e::{self, ec2, metrics, plugin, wait};
use cloudnet_shared::encode_name;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::json;

use crate::support::{
    ORIGINAL_KEY, POD_TIMEOUT, ROTATED_KEY, ROTATION_BOUND, forwarders_from_pods, operator_values,
    wait_available,
};

/// The management cluster's hosted-control-plane namespace (e2e-kind/hosted/management.yaml).
const MANAGEMENT: &str = "clusters-hosted";
/// The guest cluster's namespace of the controller: its ServiceAccount, Lease and ledger.
const GUEST: &str = "openshift-cloud-network-config-controller";
/// The Deployment, the guest ServiceAccount and the container's app label.
const NAME: &str = "cloud-network-config-controller";
/// The emptyDir holding the kubeconfig and its token file.
const API_ACCESS_VOLUME: &str = "hosted-cluster-api-access";
/// The management cluster's credentials Secret (mounted only; the guest API has none).
const CREDENTIALS: &str = "cloud-network-config-controller-creds";
/// A new object converges within this after a token rotation that revoked the old token.
const TOKEN_ROTATION_BOUND: Duration = Duration::from_secs(30);
/// An Event is written within this of what it reports.
const EVENT_BOUND: Duration = Duration::from_secs(60);
/// The command's own wait (30 tries of `sleep 1`) plus a start on a loaded machine.
const EXEC_BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_network_operators_hosted_control_plane_deployment_runs_with_cloudnets_image() {
    if !crate::support::machine_can_run_a_node() {
        return;
    }
    let moto = MotoServer::start().await.unwrap();
    let node = NodeCluster::start().await.unwrap();
    let client = node.control_plane().client().await.unwrap();
    if let Err(e) = run(&node, &client, moto.url()).await {
        panic!("{e:#}\n{}", node.diagnostics());
    }
}

async fn run(node: &NodeCluster, client: &Client, moto_url: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let ec2 = e2e::ec2_client("us-east-1", moto_url)?;
    let network = ec2::create_network(&ec2, "10.0.0.0/16".parse()?).await?;
    let mut instances = ec2::run_instances(&ec2, &network, InstanceType::M5Large, 2).await?;
    let (a, b) = (instances.remove(0), instances.remove(0));
    plugin::create_node(client, "hosted-a", &a).await?;
    plugin::create_node(client, "hosted-b", &b).await?;
    let v4 = |host: u8| {
        let mut octets = network.ipv4.broadcast().octets();
        octets[3] = host;
        IpAddr::from(octets)
    };

    // EC2 behind the fault proxy (it counts calls per access key and refuses a revoked one),
    // reached from the pod network through forwarders on the host, as is kube-apiserver.
    let proxy = FaultProxy::builder(moto_url, Dialect::Ec2Query)
        .permit(EC2_CREDENTIALS_REQUEST)
        .start()
        .await?;
    let (ec2_forwarder, api_forwarder) = forwarders_from_pods(node, proxy.addr()).await?;

    // The guest: the operator's namespace, ServiceAccount and grants, unchanged.
    node.apply_file("cno/rbac.yaml")?;
    // The management side's Secrets, as HyperShift writes them: the guest API server's CA and
    // the cloud credentials.
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": MANAGEMENT}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), MANAGEMENT);
    let root_ca: Secret = serde_json::from_value(json!({
        "metadata": {"name": "root-ca", "namespace": MANAGEMENT},
        "stringData": {"ca.crt": node.control_plane().ca_pem()},
    }))?;
    secrets.create(&PostParams::default(), &root_ca).await?;
    let credentials: Secret = serde_json::from_value(json!({
        "metadata": {"name": CREDENTIALS, "namespace": MANAGEMENT},
        "stringData": {
            "aws_access_key_id": ORIGINAL_KEY,
            "aws_secret_access_key": "cloudnet-e2e-secret",
        }
    }))?;
    secrets.create(&PostParams::default(), &credentials).await?;

    let values = operator_values(
        &ec2_forwarder,
        &[(
            "@KUBERNETES_SERVICE_URL@",
            format!(
                "https://kubernetes.default.svc:{}",
                api_forwarder.addr().port()
            ),
        )],
    );
    let values: Vec<(&str, &str)> = values.iter().map(|(k, v)| (*k, v.as_str())).collect();
    node.apply_rendered("cluster/overlay/hosted", &values)?;

    // The command's loop runs in bash until the token appears; then the same process is the
    // controller (exec, not a child), with the operator's arguments.
    let pod = running_controller(client).await?;
    let api_access = node.empty_dir(&pod, API_ACCESS_VOLUME)?;
    let token_file = api_access.join("token");
    anyhow::ensure!(
        api_access.join("kubeconfig").is_file(),
        "the init container wrote no kubeconfig in {}",
        api_access.display()
    );
    anyhow::ensure!(!token_file.exists(), "a token exists before any was minted");
    let waiting = process_of(node, &pod)?;
    anyhow::ensure!(
        waiting.exe.ends_with("/bash"),
        "before the token the container runs {:?}, not the command's bash loop",
        waiting.exe
    );
    let mut minter = TokenMinter::new(client.clone(), token_file);
    let minted = Instant::now();
    minter.mint().await?;
    let controller = wait::found(EXEC_BOUND, "the script to exec the controller", || {
        let found = process_of(node, &pod);
        async move { Ok(found?.filter_exec()) }
    })
    .await?;
    let exec_after = minted.elapsed();
    anyhow::ensure!(
        controller.pid == waiting.pid,
        "the controller is pid {}, not the script's {} (it was not exec'd)",
        controller.pid,
        waiting.pid
    );
    anyhow::ensure!(
        controller.argv.first().map(String::as_str)
            == Some("/usr/bin/cloud-network-config-controller")
            && controller
                .argv
                .windows(2)
                .any(|w| w == ["-kubeconfig", "/var/run/secrets/hosted_cluster/kubeconfig"]),
        "the controller runs as {:?}",
        controller.argv
    );
    wait_available(client, MANAGEMENT, NAME).await?;

    // Assign, move and release, acting as the guest ServiceAccount.
    let acting = Instant::now();
    plugin::wait_annotation(client, "hosted-a").await?;
    plugin::wait_annotation(client, "hosted-b").await?;
    let ip = v4(50);
    let name = encode_name(ip)?;
    plugin::create(client, &name, "hosted-a").await?;
    plugin::wait_assigned(client, &name, "hosted-a").await?;
    let assigned = acting.elapsed();
    anyhow::ensure!(ec2::addresses_of(&ec2, &a.eni).await?.contains(&ip));
    let moving = Instant::now();
    plugin::retarget(client, &name, "hosted-b").await?;
    plugin::wait_assigned(client, &name, "hosted-b").await?;
    let moved = moving.elapsed();
    anyhow::ensure!(!ec2::addresses_of(&ec2, &a.eni).await?.contains(&ip));
    anyhow::ensure!(ec2::addresses_of(&ec2, &b.eni).await?.contains(&ip));
    let releasing = Instant::now();
    plugin::delete(client, &name).await?;
    plugin::wait_gone(client, &name).await?;
    let released = releasing.elapsed();
    anyhow::ensure!(!ec2::addresses_of(&ec2, &b.eni).await?.contains(&ip));

    // Events reach the guest through core/v1, the one Events API HyperShift grants.
    let events = Api::<CoreEvent>::namespaced(client.clone(), "default");
    wait::until(EVENT_BOUND, "a core/v1 Event about the object", || {
        let (events, name) = (events.clone(), name.clone());
        async move {
            let list = events.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|e| e.involved_object.name.as_deref() == Some(name.as_str())))
        }
    })
    .await?;

    // The Lease and the ledger are the guest's, in the guest namespace; nothing of them in the
    // management namespace.
    let lease = Api::<Lease>::namespaced(client.clone(), GUEST)
        .get("cloud-network-config-controller-lock")
        .await?;
    anyhow::ensure!(
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| !h.is_empty()),
        "nobody holds the guest's Lease"
    );
    let ledger = ListParams::default().labels("cloudnet.io/ledger");
    let guest_ledger = Api::<ConfigMap>::namespaced(client.clone(), GUEST)
        .list(&ledger)
        .await?;
    let management_ledger = Api::<ConfigMap>::namespaced(client.clone(), MANAGEMENT)
        .list(&ledger)
        .await?;
    anyhow::ensure!(
        !guest_ledger.items.is_empty() && management_ledger.items.is_empty(),
        "ledger ConfigMaps: {} in {GUEST}, {} in {MANAGEMENT}",
        guest_ledger.items.len(),
        management_ledger.items.len()
    );

    // Metrics are scraped in the hosted-control-plane namespace, at the pod.
    let pod_ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or_else(|| anyhow::anyhow!("the controller pod has no IP"))?;
    let exposition = metrics::scrape(&format!("http://{pod_ip}:9090/metrics")).await?;
    anyhow::ensure!(
        exposition.contains("cloudnet_"),
        "the pod's metrics endpoint shows no cloudnet metric"
    );

    // A token rotation whose old token is revoked (its bound Secret deleted, which kube-apiserver
    // checks on every request): the next object is assigned with the new one.
    let rotating = Instant::now();
    let old_token = minter.mint().await?;
    wait::until(TOKEN_ROTATION_BOUND, "the old token to be refused", || {
        let old_token = old_token.clone();
        async move { refused(node, &old_token).await }
    })
    .await?;
    let ip = v4(51);
    let name = encode_name(ip)?;
    plugin::create(client, &name, "hosted-a").await?;
    plugin::wait_assigned_within(client, &name, "hosted-a", TOKEN_ROTATION_BOUND).await?;
    let after_token_rotation = rotating.elapsed();
    anyhow::ensure!(ec2::addresses_of(&ec2, &a.eni).await?.contains(&ip));
    let (restarts_after_token, _) = controller_containers(client).await?;
    anyhow::ensure!(
        restarts_after_token == 0,
        "the controller restarted {restarts_after_token} times through the token rotation"
    );

    // A rotation of the credentials, which only the mounted files show (the guest API has no
    // Secret of that name): EC2 takes only the new key from the moment the Secret changes.
    proxy.accept_only_key(Some(ROTATED_KEY));
    proxy.reset_key_counts();
    let rotating = Instant::now();
    secrets
        .patch(
            CREDENTIALS,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {
                "aws_access_key_id": ROTATED_KEY,
                "aws_secret_access_key": "cloudnet-e2e-secret-rotated",
            }})),
        )
        .await?;
    // Nothing is asked of EC2 meanwhile, so no refusal can end the run: only the files can. The
    // reload is the drain and exit of a Secret change, one restart, which runs the command's
    // script again (the token is there: it execs at once).
    wait::until(
        ROTATION_BOUND,
        "the controller to reload the new files",
        || async { Ok(controller_containers(client).await? == (1, 1)) },
    )
    .await?;
    let reloaded = rotating.elapsed();
    let ip = v4(52);
    let name = encode_name(ip)?;
    plugin::create(client, &name, "hosted-a").await?;
    plugin::wait_assigned_within(client, &name, "hosted-a", ROTATION_BOUND).await?;
    let after_credentials_rotation = rotating.elapsed();
    let counts = proxy.key_counts();
    let old = counts.get(ORIGINAL_KEY).copied().unwrap_or_default();
    let new = counts.get(ROTATED_KEY).copied().unwrap_or_default();
    anyhow::ensure!(old.accepted == 0, "a call with the old key got through");
    anyhow::ensure!(new.accepted > 0, "no call with the new key: {counts:?}");
    anyhow::ensure!(ec2::addresses_of(&ec2, &a.eni).await?.contains(&ip));
    let (restarts_after_credentials, _) = controller_containers(client).await?;
    anyhow::ensure!(
        restarts_after_credentials == 1,
        "{restarts_after_credentials} restarts; the reload is one exit"
    );

    eprintln!(
        "hosted control plane: exec'd {exec_after:?} after the first token; assigned {assigned:?} \
         after start (annotations included), moved in {moved:?}, released in {released:?}; \
         after a token rotation revoking the old one a new object was Assigned in \
         {after_token_rotation:?} ({restarts_after_token} container restarts); after a \
         credentials-file rotation the controller reloaded in {reloaded:?} and a new object was \
         Assigned in {after_credentials_rotation:?} (old key {old:?}, new key \
         {new:?}, {restarts_after_credentials} container restarts); scenario took {:?}",
        started.elapsed()
    );
    Ok(())
}

/// Stands in for HyperShift's token-minter sidecar: mints tokens of the guest ServiceAccount with
/// the TokenRequest API and writes each to the kubeconfig's `tokenFile` in the pod's emptyDir,
/// truncating the file in place as the minter does. Unlike the minter, it binds each token to a
/// Secret of its own, so that minting the next one can revoke the last (by deleting its Secret)
/// and prove the controller runs on the file's new token, not a remembered one.
struct TokenMinter {
    client: Client,
    file: PathBuf,
    minted: u32,
    binding: Option<String>,
    token: Option<String>,
}

impl TokenMinter {
    fn new(client: Client, file: PathBuf) -> Self {
        Self {
            client,
            file,
            minted: 0,
            binding: None,
            token: None,
        }
    }

    /// Writes a new token (600 s, the shortest kube-apiserver issues), revokes the previous one
    /// and returns it (empty at the first call).
    async fn mint(&mut self) -> anyhow::Result<String> {
        self.minted += 1;
        let binding = format!("hosted-token-{}", self.minted);
        let token = cloudnet_e2e::harness::controlplane::bound_token(
            &self.client,
            GUEST,
            NAME,
            &binding,
            600,
        )
        .await?;
        std::fs::write(&self.file, &token)?;
        if let Some(previous) = self.binding.replace(binding) {
            Api::<Secret>::namespaced(self.client.clone(), GUEST)
                .delete(&previous, &DeleteParams::default())
                .await?;
        }
        Ok(self.token.replace(token).unwrap_or_default())
    }
}

/// Whether kube-apiserver refuses `token` (401).
async fn refused(node: &NodeCluster, token: &str) -> anyhow::Result<bool> {
    let cp = node.control_plane();
    let kubeconfig: Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "guest", "cluster": {
            "server": cp.server_url(),
            "certificate-authority-data": base64_encode(cp.ca_pem().as_bytes()),
        }}],
        "users": [{"name": "old", "user": {"token": token}}],
        "contexts": [{"name": "old", "context": {"cluster": "guest", "user": "old"}}],
        "current-context": "old",
    }))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    match Api::<Node>::all(client).list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 401 => Ok(true),
        _ => Ok(false),
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The container's first process as the host sees it.
#[derive(Debug)]
struct Process {
    pid: u32,
    exe: String,
    argv: Vec<String>,
}

impl Process {
    /// Itself once it runs the reconciler's binary.
    fn filter_exec(self) -> Option<Self> {
        self.exe.ends_with("/cloudnet-reconciler").then_some(self)
    }
}

/// The first process of `pod`'s controller container.
fn process_of(node: &NodeCluster, pod: &Pod) -> anyhow::Result<Process> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == "controller"))
        .and_then(|c| c.container_id.clone())
        .ok_or_else(|| anyhow::anyhow!("the controller container has no id"))?;
    let pid = node.container_pid(&id)?;
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let exe = std::fs::read_link(proc.join("exe"))?
        .to_string_lossy()
        .into_owned();
    let argv = std::fs::read(proc.join("cmdline"))?
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Ok(Process { pid, exe, argv })
}

/// The controller's pod once its controller container runs (the init container has written the
/// kubeconfig).
async fn running_controller(client: &Client) -> anyhow::Result<Pod> {
    let pods = Api::<Pod>::namespaced(client.clone(), MANAGEMENT);
    let selector = format!("app={NAME}");
    wait::found(POD_TIMEOUT, "the controller container to run", || {
        let (pods, selector) = (pods.clone(), selector.clone());
        async move {
            let list = pods.list(&ListParams::default().labels(&selector)).await?;
            Ok(list.items.into_iter().find(|pod| {
                pod.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.iter().find(|c| c.name == "controller"))
                    .and_then(|c| c.state.as_ref())
                    .is_some_and(|s| s.running.is_some())
            }))
        }
    })
    .await
}

/// The controller containers' restarts, summed, and how many of them run.
async fn controller_containers(client: &Client) -> anyhow::Result<(i32, usize)> {
    let pods = Api::<Pod>::namespaced(client.clone(), MANAGEMENT)
        .list(&ListParams::default().labels(&format!("app={NAME}")))
        .await?;
    let containers: Vec<_> = pods
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .collect();
    Ok((
        containers.iter().map(|c| c.restart_count).sum(),
        containers
            .iter()
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .count(),
    ))
}
