//! The reconciler process in a hosted control plane's shape (HyperShift's managed Deployment),
//! against the real kube-apiserver: a kubeconfig whose `certificate-authority` and `tokenFile`
//! are files (the token minted for the guest ServiceAccount by a sidecar, which may write it
//! after the controller starts, and rotates it), the network operator's grants plus HyperShift's
//! core/v1 `events` get/create and no `events.k8s.io`, and credentials that exist only as mounted
//! files (no Secret of that name in the API).
//!
//! The process is this test binary re-executed (process.rs's `reconciler_process_entry`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::{assigned_within, create, create_node_object, wait_until};
use cloudnet_e2e::harness::controlplane::Supervised;
use cloudnet_e2e::{ControlPlane, crate_file};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Secret};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};

/// The network operator's namespace and ServiceAccount (e2e-kind/cno/rbac.yaml), standing for
/// the guest cluster's.
const NAMESPACE: &str = "openshift-cloud-network-config-controller";
const ACCOUNT: &str = "cloud-network-config-controller";

/// HyperShift's grant of Events to the guest ServiceAccount: core/v1 get and create, cluster-wide.
const HOSTED_EVENTS: &str = r#"{
  "apiVersion": "v1", "kind": "List", "items": [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": "cloud-network-config-controller-events"},
     "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["get", "create"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": "cloud-network-config-controller-events"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                 "name": "cloud-network-config-controller-events"},
     "subjects": [{"kind": "ServiceAccount", "name": "cloud-network-config-controller",
                   "namespace": "openshift-cloud-network-config-controller"}]}
  ]
}"#;

/// A control plane with the CRD, the operator's grants and HyperShift's Events grant.
async fn hosted_cluster() -> (ControlPlane, Client) {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    cp.run_kubectl([
        "apply".into(),
        "-f".into(),
        crate_file("cno/rbac.yaml").into_os_string(),
    ])
    .unwrap();
    let events = cp.dir().join("hosted-events.json");
    std::fs::write(&events, HOSTED_EVENTS).unwrap();
    cp.run_kubectl(["apply".into(), "-f".into(), events.into_os_string()])
        .unwrap();
    let admin = cp.client().await.unwrap();
    (cp, admin)
}

/// A token of the guest ServiceAccount bound to Secret `holder` (created now in the namespace):
/// deleting the Secret revokes the token, as the token minter's old tokens are.
async fn bound_token(admin: &Client, holder: &str) -> String {
    cloudnet_e2e::harness::controlplane::bound_token(admin, NAMESPACE, ACCOUNT, holder, 3600)
        .await
        .unwrap()
}

/// Replaces `path` in one step, as the token minter and the kubelet do.
fn write_atomically(path: &Path, content: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Where the hosted shape's files are: the kubeconfig (written now), and the CA and token files
/// it names (written by the test, when it chooses).
struct Files {
    kubeconfig: PathBuf,
    ca: PathBuf,
    token: PathBuf,
}

impl Files {
    fn new(cp: &ControlPlane, name: &str) -> Self {
        let dir = cp.dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let files = Self {
            kubeconfig: dir.join("kubeconfig"),
            ca: dir.join("ca.crt"),
            token: dir.join("token"),
        };
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "guest", "cluster": {
                "server": cp.server_url(),
                "certificate-authority": files.ca,
            }}],
            "users": [{"name": "controller", "user": {"tokenFile": files.token}}],
            "contexts": [{"name": "guest", "context": {"cluster": "guest", "user": "controller"}}],
            "current-context": "guest",
        });
        std::fs::write(&files.kubeconfig, kubeconfig.to_string()).unwrap();
        files
    }

    fn write(&self, cp: &ControlPlane, token: &str) {
        write_atomically(&self.ca, cp.ca_pem().as_bytes());
        write_atomically(&self.token, token.as_bytes());
    }
}

/// The reconciler as the managed Deployment runs it (memory cloud, the guest namespace).
struct Hosted {
    process: Supervised,
}

impl Hosted {
    fn start(cp: &ControlPlane, name: &'static str, kubeconfig: &Path, more: &[String]) -> Self {
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut args = vec![
            format!("-kubeconfig={}", kubeconfig.display()),
            "-secret-name=cloud-network-config-controller-creds".into(),
            "-platform-type=Memory".into(),
            format!("--controller-namespace={NAMESPACE}"),
            "--drift-period=0".into(),
            format!("--metrics-bind-address={metrics}"),
        ];
        args.extend_from_slice(more);
        let mut command = crate::process::entry_command(&args);
        command.env("RUST_LOG", "info");
        let log = cp.dir().join(format!("{name}.log"));
        Self {
            process: Supervised::spawn(name, command, &log).unwrap(),
        }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.process.exited() {
            panic!(
                "the reconciler exited: {status}\n{}",
                self.process.log_tail(40)
            );
        }
    }

    /// Waits until the log has a line containing `text`, the process running meanwhile.
    async fn wait_log(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.process.log_tail(200).contains(text) {
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "no {text:?} in the log\n{}",
                self.process.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn a_token_file_written_after_the_start_is_waited_for() {
    let (cp, admin) = hosted_cluster().await;
    let files = Files::new(&cp, "late-token");
    let mut reconciler = Hosted::start(&cp, "hosted-late-token", &files.kubeconfig, &[]);
    reconciler
        .wait_log("waiting for the files the kubeconfig names")
        .await;
    // The sidecar's first token comes a few seconds after the start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    reconciler.assert_running();
    files.write(&cp, &bound_token(&admin, "late-token-holder").await);
    create_node_object(&admin, "hosted-late").await;
    create(&admin, "10.41.0.1", "hosted-late").await;
    assigned_within(
        &admin,
        &mut reconciler.process,
        "10.41.0.1",
        "hosted-late",
        Duration::from_secs(60),
    )
    .await;
}

#[tokio::test]
async fn a_rotation_that_revokes_the_old_token_is_survived() {
    let (cp, admin) = hosted_cluster().await;
    let files = Files::new(&cp, "rotation");
    files.write(&cp, &bound_token(&admin, "token-holder-1").await);
    let mut reconciler = Hosted::start(&cp, "hosted-rotation", &files.kubeconfig, &[]);
    create_node_object(&admin, "hosted-rotation").await;
    create(&admin, "10.41.1.1", "hosted-rotation").await;
    assigned_within(
        &admin,
        &mut reconciler.process,
        "10.41.1.1",
        "hosted-rotation",
        Duration::from_secs(60),
    )
    .await;

    // The minter writes a new token, then the old one's bound object goes: it is revoked.
    write_atomically(
        &files.token,
        bound_token(&admin, "token-holder-2").await.as_bytes(),
    );
    Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
        .delete("token-holder-1", &DeleteParams::default())
        .await
        .unwrap();
    create(&admin, "10.41.1.2", "hosted-rotation").await;
    // kube-rs alone would send the revoked token until its once-a-minute re-read.
    let took = assigned_within(
        &admin,
        &mut reconciler.process,
        "10.41.1.2",
        "hosted-rotation",
        Duration::from_secs(15),
    )
    .await;
    eprintln!("after a rotation revoking the old token, the next object was Assigned in {took:?}");
    let log = std::fs::read_to_string(cp.dir().join("hosted-rotation.log")).unwrap();
    assert!(
        log.contains("the token file changed"),
        "{}",
        reconciler.process.log_tail(40)
    );
}

#[tokio::test]
async fn events_go_through_core_v1_where_only_core_events_are_granted() {
    let (cp, admin) = hosted_cluster().await;
    let files = Files::new(&cp, "events");
    files.write(&cp, &bound_token(&admin, "events-token-holder").await);
    let mut reconciler = Hosted::start(&cp, "hosted-events", &files.kubeconfig, &[]);
    create_node_object(&admin, "hosted-events").await;
    create(&admin, "10.41.2.1", "hosted-events").await;
    assigned_within(
        &admin,
        &mut reconciler.process,
        "10.41.2.1",
        "hosted-events",
        Duration::from_secs(60),
    )
    .await;
    let events: Api<CoreEvent> = Api::namespaced(admin.clone(), "default");
    wait_until(
        Duration::from_secs(30),
        "a core/v1 Event about the object",
        || {
            let events = events.clone();
            async move {
                events
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|e| e.involved_object.name.as_deref() == Some("10.41.2.1"))
            }
        },
    )
    .await;
    // The process logs the switch once kube-apiserver has answered the create, which the list
    // above can see first.
    let log_path = cp.dir().join("hosted-events.log");
    wait_until(
        Duration::from_secs(30),
        "the switch to core/v1 logged",
        || {
            let log_path = log_path.clone();
            async move {
                std::fs::read_to_string(&log_path)
                    .is_ok_and(|log| log.contains("writing Events through core/v1"))
            }
        },
    )
    .await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        !log.contains("Events are forbidden"),
        "{}",
        reconciler.process.log_tail(40)
    );
}

/// The credentials exist only as mounted files (the guest API has no Secret of that name): a
/// change of the files drains and exits 0 as a changed Secret does, so the new ones are loaded.
#[tokio::test]
async fn changed_credential_files_restart_the_process_where_no_object_is_readable() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let secret = cp.dir().join("mounted-credentials");
    std::fs::create_dir_all(&secret).unwrap();
    write_atomically(&secret.join("aws_access_key_id"), b"AKIDFIRST");
    write_atomically(&secret.join("aws_secret_access_key"), b"first-secret");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let args = [
        format!("-kubeconfig={}", cp.kubeconfig_path().display()),
        "-secret-name=cloud-network-config-controller-creds".into(),
        "-platform-type=AWS".into(),
        "-platform-region=us-east-1".into(),
        // No call is made: nothing is to be attached.
        "-platform-api-url=http://127.0.0.1:9".into(),
        format!("-secret-override={}", secret.display()),
        format!(
            "-config-override={}",
            cp.dir().join("no-cloud-config").display()
        ),
        "--controller-namespace=default".into(),
        "--drift-period=0".into(),
        "--credentials-poll-period=1".into(),
        format!("--metrics-bind-address={metrics}"),
    ];
    let mut command = crate::process::entry_command(&args);
    command.env("RUST_LOG", "info");
    let mut reconciler = Hosted {
        process: Supervised::spawn("hosted-files", command, &cp.dir().join("hosted-files.log"))
            .unwrap(),
    };
    reconciler
        .wait_log("nodes, CloudPrivateIPConfigs and the ledger listed: ready")
        .await;
    write_atomically(&secret.join("aws_secret_access_key"), b"rotated-secret");
    let status = reconciler
        .process
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        status.success(),
        "{status}\n{}",
        reconciler.process.log_tail(40)
    );
    assert!(
        reconciler.process.log_tail(40).contains("changed on disk"),
        "{}",
        reconciler.process.log_tail(40)
    );
}
