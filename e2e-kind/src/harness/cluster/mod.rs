//! A one-node cluster, as close to kind as a machine without a container engine's registry
//! allows: the local control plane (etcd, kube-apiserver) plus kube-scheduler,
//! kube-controller-manager and a kubelet built from the same pinned Kubernetes module, over a
//! private containerd (Debian's containerd, runc and CNI plugins). Images are imported from OCI
//! archives, never pulled; the sandbox image is a static `pause` of this repository.
//!
//! The settings that make a kubelet run in this sandbox (cgroup v1, no CAP_SYS_RESOURCE, a low
//! open-files hard limit) are those of `shared/docs/kubelet-local.md`.
//!
//! One such cluster at a time on a machine: it owns host ports (the hostNetwork pods'), a bridge
//! and NAT rules, so [`NodeCluster::start`] takes a machine-wide lock for its lifetime.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::Api;

use crate::harness::controlplane::{ControlPlane, Supervised, cache_root, free_ports};
use crate::harness::e2e::wait;

/// Environment variable naming the directory holding kubelet, kube-scheduler and
/// kube-controller-manager (`e2e-kind/controlplane/build.sh node` prints it).
pub const NODE_BIN_ENV: &str = "CLOUDNET_NODE_BIN";
/// Environment variable naming the directory of the OCI archives (`e2e-kind/cluster/images.sh`).
pub const IMAGES_DIR_ENV: &str = "CLOUDNET_IMAGES_DIR";
/// The label the test overlays select their pods' node by; the suite's own Nodes (no kubelet)
/// lack it, so no pod is ever scheduled onto them.
pub const NODE_LABEL: &str = "cloudnet.test/node=real";
/// The sandbox image's reference, as `images.sh` tags it.
const PAUSE_IMAGE: &str = "localhost/cloudnet-pause:dev";
/// The node's pod network (the bridge CNI's subnet); hostNetwork pods do not use it.
const POD_SUBNET: &str = "10.244.77.0/24";
/// The host as pods on [`POD_SUBNET`] reach it: the bridge's own address (host-local's gateway,
/// the subnet's first). A host service listening on it or on 0.0.0.0 is reachable from pods.
pub const HOST_FROM_PODS: &str = "10.244.77.1";
/// Where the kubelet writes containers' logs (its default `podLogsDir`).
const POD_LOGS_DIR: &str = "/var/log/pods";
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const CONTAINERD_TIMEOUT: Duration = Duration::from_secs(60);
const COMMANDS: [&str; 6] = ["containerd", "ctr", "runc", "iptables", "ip", "mount"];

/// What this machine lacks for a one-node cluster, one line each; empty when it can run one.
pub fn missing_requirements() -> Vec<String> {
    let mut missing = Vec::new();
    // The effective uid from /proc: geteuid would need `unsafe`, which the workspace denies.
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
        })
        .unwrap_or_default();
    if uid != "0" {
        missing.push(format!(
            "root (effective uid is {uid}): containerd, runc and the kubelet mount and create namespaces"
        ));
    }
    for command in COMMANDS {
        if which(command).is_none() {
            missing.push(format!(
                "`{command}` on PATH (Debian packages containerd, runc, iptables, iproute2: `e2e-kind/cluster/packages.sh node`)"
            ));
        }
    }
    if !Path::new("/usr/lib/cni/bridge").is_file() {
        missing.push("/usr/lib/cni/bridge (Debian package containernetworking-plugins)".to_owned());
    }
    if !Path::new("/sys/fs/cgroup").is_dir() {
        missing.push("a mounted /sys/fs/cgroup".to_owned());
    }
    match (std::env::var_os(NODE_BIN_ENV), std::env::var_os(IMAGES_DIR_ENV)) {
        (Some(_), Some(_)) => {}
        _ => missing.push(format!(
            "{NODE_BIN_ENV} and {IMAGES_DIR_ENV} (`make test` sets both; `make images` builds the images)"
        )),
    }
    missing
}

fn which(command: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(command))
        .find(|p| p.is_file())
}

/// A running one-node cluster. Dropping it stops the node's processes and containers and removes
/// its bridge, NAT rules and mounts, then the control plane.
#[derive(Debug)]
pub struct NodeCluster {
    kubelet: Option<Supervised>,
    scheduler: Option<Supervised>,
    controller_manager: Option<Supervised>,
    containerd: Option<Supervised>,
    control_plane: Option<ControlPlane>,
    dir: PathBuf,
    socket: PathBuf,
    bridge: String,
    node_name: String,
    nat_rules: Vec<Vec<String>>,
    _lock: File,
}

impl NodeCluster {
    /// Starts the control plane, containerd, the kubelet, scheduler and controller-manager, imports
    /// the archives of [`IMAGES_DIR_ENV`] and waits for the Node to be Ready.
    pub async fn start() -> Result<Self> {
        let node_bin = PathBuf::from(
            std::env::var_os(NODE_BIN_ENV).with_context(|| format!("{NODE_BIN_ENV} is not set"))?,
        );
        let images = PathBuf::from(
            std::env::var_os(IMAGES_DIR_ENV)
                .with_context(|| format!("{IMAGES_DIR_ENV} is not set"))?,
        );
        let lock = tokio::task::spawn_blocking(machine_lock).await??;
        let control_plane = ControlPlane::start_with_crd().await?;
        let dir = cache_root()
            .join("node")
            .join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("containerd.sock");
        let bridge = format!("cnb{}", std::process::id() % 1_000_000);
        let node_name = format!("cloudnet-node-{}", std::process::id());
        let mut cluster = Self {
            kubelet: None,
            scheduler: None,
            controller_manager: None,
            containerd: None,
            control_plane: Some(control_plane),
            dir,
            socket,
            bridge,
            node_name,
            nat_rules: Vec::new(),
            _lock: lock,
        };
        cluster.start_containerd().await?;
        for image in [
            "cloudnet-pause",
            "cloudnet-webhook",
            "cloudnet-reconciler",
            "cloudnet-node",
        ] {
            cluster.import(&images.join(format!("{image}.oci.tar")))?;
        }
        cluster.start_components(&node_bin)?;
        cluster.wait_node_ready().await?;
        Ok(cluster)
    }

    /// The control plane (admin kubeconfig, kubectl).
    pub fn control_plane(&self) -> &ControlPlane {
        self.control_plane
            .as_ref()
            .unwrap_or_else(|| unreachable!("the control plane lives as long as the cluster"))
    }

    /// The name of the one real Node.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The last lines of every node process's log, for failure messages.
    pub fn diagnostics(&self) -> String {
        [
            &self.containerd,
            &self.kubelet,
            &self.scheduler,
            &self.controller_manager,
        ]
        .into_iter()
        .flatten()
        .map(|p| p.log_tail(30))
        .collect::<Vec<_>>()
        .join("\n")
    }

    /// `helm install` (or `helm upgrade`: `verb`) of charts/cloudnet into `namespace` with the
    /// values file `values` (relative to `e2e-kind/`), its placeholders `@APISERVER_PORT@` and
    /// `@MOTO_URL@` replaced.
    pub fn release_chart(
        &self,
        verb: &str,
        values: &str,
        namespace: &str,
        moto_url: &str,
    ) -> Result<()> {
        let cp = self.control_plane();
        let port = cp
            .server_url()
            .rsplit(':')
            .next()
            .context("the apiserver's URL has a port")?
            .to_owned();
        let text = std::fs::read_to_string(crate::crate_file(values))
            .with_context(|| format!("reading {values}"))?;
        let text = fill_placeholders(
            values,
            text,
            &[("@APISERVER_PORT@", &port), ("@MOTO_URL@", moto_url)],
        )?;
        let file = self.dir.join(values.replace('/', "_"));
        std::fs::write(&file, text)?;
        crate::harness::helm::Helm::locate()?.release(
            verb,
            cp.kubeconfig_path(),
            namespace,
            &file,
        )?;
        Ok(())
    }

    /// `kubectl apply` of the kustomization `dir` (relative to `e2e-kind/`), with each
    /// placeholder of `values` replaced in the rendered output.
    pub fn apply_rendered(&self, dir: &str, values: &[(&str, &str)]) -> Result<()> {
        let cp = self.control_plane();
        let rendered =
            cp.run_kubectl(["kustomize".into(), crate::crate_file(dir).into_os_string()])?;
        let text = fill_placeholders(dir, String::from_utf8(rendered)?, values)?;
        let file = self.dir.join(format!("{}.yaml", dir.replace('/', "_")));
        std::fs::write(&file, text)?;
        cp.run_kubectl(["apply".into(), "-f".into(), file.into_os_string()])?;
        Ok(())
    }

    /// `kubectl apply` of the manifest file `file` (relative to `e2e-kind/`) as it is.
    pub fn apply_file(&self, file: &str) -> Result<()> {
        self.control_plane().run_kubectl([
            "apply".into(),
            "-f".into(),
            crate::crate_file(file).into_os_string(),
        ])?;
        Ok(())
    }

    /// The directory on this machine of `pod`'s emptyDir volume `volume`, as the kubelet lays it
    /// out: what a container sees at the volume's mount path.
    pub fn empty_dir(&self, pod: &Pod, volume: &str) -> Result<PathBuf> {
        let uid = pod.metadata.uid.as_deref().context("pod has no uid")?;
        Ok(self
            .dir
            .join("kubelet")
            .join("pods")
            .join(uid)
            .join("volumes")
            .join("kubernetes.io~empty-dir")
            .join(volume))
    }

    /// The host PID of the first process of the container whose CRI id is `container_id`
    /// (`containerd://<id>` as a pod's status gives it, or the bare id).
    pub fn container_pid(&self, container_id: &str) -> Result<u32> {
        let id = container_id.trim_start_matches("containerd://");
        let tasks = output(
            Command::new("ctr")
                .arg("--address")
                .arg(&self.socket)
                .args(["-n", "k8s.io", "tasks", "ls"]),
        )?;
        let pid = tasks
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                Some((fields.next()?, fields.next()?))
            })
            .find(|(task, _)| *task == id)
            .with_context(|| format!("containerd runs no task {id}"))?
            .1;
        Ok(pid.parse()?)
    }

    /// Routes `Service` `namespace/name`'s ClusterIP port `port` to `target` (host:port) with a
    /// DNAT rule, as kube-proxy would; the apiserver calls webhooks at the ClusterIP.
    pub async fn route_service(
        &mut self,
        namespace: &str,
        name: &str,
        port: u16,
        target: &str,
    ) -> Result<()> {
        let client = self.control_plane().client().await?;
        let service = Api::<Service>::namespaced(client, namespace)
            .get(name)
            .await?;
        let ip = service
            .spec
            .and_then(|s| s.cluster_ip)
            .with_context(|| format!("service {namespace}/{name} has no ClusterIP"))?;
        let rule: Vec<String> = [
            "OUTPUT",
            "-d",
            &format!("{ip}/32"),
            "-p",
            "tcp",
            "--dport",
            &port.to_string(),
            "-j",
            "DNAT",
            "--to-destination",
            target,
            "-m",
            "comment",
            "--comment",
            &format!("cloudnet-test-{}", std::process::id()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        run(Command::new("iptables")
            .args(["-t", "nat", "-A"])
            .args(&rule))?;
        self.nat_rules.push(rule);
        Ok(())
    }

    /// What container `container` of `pod` has logged, read where the kubelet writes it
    /// (its default `podLogsDir`): kube-apiserver cannot reach this kubelet for `pods/log`, since
    /// the node's name does not resolve. CRI's line prefix (time, stream, tag) is kept.
    pub fn container_log(&self, pod: &Pod, container: &str) -> Result<String> {
        let meta = &pod.metadata;
        let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid)
        else {
            bail!("pod has no namespace, name or uid");
        };
        let dir = Path::new(POD_LOGS_DIR)
            .join(format!("{namespace}_{name}_{uid}"))
            .join(container);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .collect();
        files.sort();
        let mut text = String::new();
        for file in files {
            text.push_str(&std::fs::read_to_string(&file)?);
        }
        Ok(text)
    }

    /// The node's own address (hostNetwork pods have it as their pod IP), as the kubelet reports.
    pub async fn node_ip(&self) -> Result<String> {
        let client = self.control_plane().client().await?;
        let node = Api::<Node>::all(client).get(&self.node_name).await?;
        node.status
            .and_then(|s| s.addresses)
            .and_then(|a| a.into_iter().find(|a| a.type_ == "InternalIP"))
            .map(|a| a.address)
            .context("the node reports no InternalIP")
    }

    async fn start_containerd(&mut self) -> Result<()> {
        let dir = self.dir.clone();
        let default = output(Command::new("containerd").args(["config", "default"]))?;
        let spec = self.base_runtime_spec()?;
        let cni_conf = dir.join("cni");
        std::fs::create_dir_all(&cni_conf)?;
        // Exact default values of containerd 1.6's `config default`, each replaced once; the
        // socket before its directory.
        let config = default
            .replace("\"/run/containerd/containerd.sock\"", &quoted(&self.socket))
            .replace("\"/var/lib/containerd\"", &quoted(&dir.join("root")))
            .replace("\"/run/containerd\"", &quoted(&dir.join("state")))
            .replace("\"/opt/containerd\"", &quoted(&dir.join("opt")))
            .replace("\"/opt/cni/bin\"", "\"/usr/lib/cni\"")
            .replace("\"/etc/cni/net.d\"", &quoted(&cni_conf))
            // Without it the sandbox asks for a lower oom_score_adj (needs CAP_SYS_RESOURCE)
            // and runc fails with "can't get final child's PID from pipe: EOF".
            .replace(
                "restrict_oom_score_adj = false",
                "restrict_oom_score_adj = true",
            )
            .replace(
                "sandbox_image = \"registry.k8s.io/pause:3.6\"",
                &format!("sandbox_image = \"{PAUSE_IMAGE}\""),
            )
            .replace(
                "base_runtime_spec = \"\"",
                &format!("base_runtime_spec = {}", quoted(&spec)),
            );
        if !config.contains(&*self.socket.to_string_lossy()) || !config.contains(PAUSE_IMAGE) {
            bail!("containerd's default configuration is not the expected 1.6 one");
        }
        let config_path = dir.join("containerd.toml");
        std::fs::write(&config_path, config)?;
        std::fs::write(
            cni_conf.join("10-cloudnet.conflist"),
            serde_json::to_string_pretty(&serde_json::json!({
                "cniVersion": "0.4.0",
                "name": "cloudnet-test",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": self.bridge,
                        "isGateway": true,
                        "ipMasq": false,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_SUBNET}]],
                            "dataDir": dir.join("ipam"),
                        }
                    },
                    {"type": "loopback"}
                ]
            }))?,
        )?;
        let mut command = Command::new("containerd");
        command.arg("--config").arg(&config_path);
        self.containerd = Some(Supervised::spawn(
            "containerd",
            command,
            &dir.join("containerd.log"),
        )?);
        let socket = self.socket.clone();
        let answered = wait::until(CONTAINERD_TIMEOUT, "containerd to answer", || {
            let alive = self.check_alive();
            let version = Command::new("ctr")
                .arg("--address")
                .arg(&socket)
                .arg("version")
                .output();
            async move {
                alive?;
                Ok(version?.status.success())
            }
        })
        .await;
        answered.map_err(|e| anyhow!("{e:#}\n{}", self.diagnostics()))
    }

    /// `ctr oci spec` with RLIMIT_NOFILE at the host's hard limit: the default (1048576) is
    /// above it here, and runc cannot raise a limit without CAP_SYS_RESOURCE.
    fn base_runtime_spec(&self) -> Result<PathBuf> {
        let spec = output(Command::new("ctr").args(["oci", "spec"]))?;
        let mut spec: serde_json::Value = serde_json::from_str(&spec)?;
        let hard = nofile_hard_limit()?;
        let rlimits = spec
            .pointer_mut("/process/rlimits")
            .and_then(|r| r.as_array_mut())
            .context("`ctr oci spec` has no process.rlimits")?;
        for limit in rlimits.iter_mut() {
            if limit["type"] == "RLIMIT_NOFILE" {
                limit["hard"] = hard.into();
                limit["soft"] = hard.into();
            }
        }
        let path = self.dir.join("base-runtime-spec.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
        Ok(path)
    }

    fn import(&self, archive: &Path) -> Result<()> {
        run(Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive))
        .with_context(|| format!("importing {}", archive.display()))
    }

    fn start_components(&mut self, node_bin: &Path) -> Result<()> {
        let cp = self.control_plane();
        let kubeconfig = cp.kubeconfig_path().to_path_buf();
        let ca = self.dir.join("ca.crt");
        std::fs::write(&ca, cp.ca_pem())?;
        let [kubelet_port, kubelet_healthz, scheduler_port, kcm_port] = free_ports()?;
        let config = self.dir.join("kubelet.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
containerRuntimeEndpoint: unix://{socket}
address: 127.0.0.1
port: {kubelet_port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {kubelet_healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
# A shared machine's disk may be nearly full; the test must not be evicted for it, nor its
# imported images collected (they cannot be pulled back).
evictionHard: {{memory.available: 1Mi, nodefs.available: 1Mi, nodefs.inodesFree: '1', imagefs.available: 1Mi}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# Secret volumes are refreshed at a pod's periodic sync (1 min by default); a rotation test waits
# on it, so it runs every 10 s here.
syncFrequency: 10s
",
                socket = self.socket.display(),
                ca = ca.display(),
            ),
        )?;
        let mut kubelet = Command::new(node_bin.join("kubelet"));
        kubelet
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--root-dir={}", self.dir.join("kubelet").display()))
            .arg(format!(
                "--cert-dir={}",
                self.dir.join("kubelet-pki").display()
            ))
            .arg(format!("--hostname-override={}", self.node_name))
            .arg(format!("--node-labels={NODE_LABEL}"))
            .arg("--v=1");
        let kubelet = Supervised::spawn("kubelet", kubelet, &self.dir.join("kubelet.log"))?;

        let mut scheduler = component(
            &node_bin.join("kube-scheduler"),
            &kubeconfig,
            scheduler_port,
        );
        scheduler.arg("--leader-elect=false");
        let scheduler =
            Supervised::spawn("kube-scheduler", scheduler, &self.dir.join("scheduler.log"))?;

        let mut kcm = component(
            &node_bin.join("kube-controller-manager"),
            &kubeconfig,
            kcm_port,
        );
        kcm.arg("--leader-elect=false")
            // Publishes kube-root-ca.crt into every namespace, for the pods' projected token.
            .arg(format!("--root-ca-file={}", ca.display()));
        let kcm = Supervised::spawn(
            "kube-controller-manager",
            kcm,
            &self.dir.join("controller-manager.log"),
        )?;
        self.kubelet = Some(kubelet);
        self.scheduler = Some(scheduler);
        self.controller_manager = Some(kcm);
        Ok(())
    }

    async fn wait_node_ready(&mut self) -> Result<()> {
        let nodes = Api::<Node>::all(self.control_plane().client().await?);
        let name = self.node_name.clone();
        let ready = wait::until(READY_TIMEOUT, &format!("node {name} Ready"), || {
            let alive = self.check_alive();
            let (nodes, name) = (nodes.clone(), name.clone());
            async move {
                alive?;
                Ok(nodes
                    .get_opt(&name)
                    .await?
                    .and_then(|n| n.status)
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
            }
        })
        .await;
        ready.map_err(|e| anyhow!("{e:#}\n{}", self.diagnostics()))
    }

    /// An error with its log's tail if a node process has exited.
    fn check_alive(&mut self) -> Result<()> {
        for process in [
            &mut self.containerd,
            &mut self.kubelet,
            &mut self.scheduler,
            &mut self.controller_manager,
        ]
        .into_iter()
        .flatten()
        {
            if let Some(exit) = process.exited() {
                bail!(
                    "a node process exited with {exit}\n{}",
                    process.log_tail(40)
                );
            }
        }
        Ok(())
    }

    /// Stops every container the kubelet started (their shims outlive containerd otherwise).
    fn remove_containers(&self) {
        let ctr = |args: &[&str]| {
            Command::new("ctr")
                .arg("--address")
                .arg(&self.socket)
                .args(["-n", "k8s.io"])
                .args(args)
                .output()
        };
        let Ok(tasks) = ctr(&["tasks", "ls", "-q"]) else {
            return;
        };
        for id in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
            let _ = ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for id in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
            while ctr(&["tasks", "delete", id]).is_ok_and(|o| !o.status.success())
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Unmounts everything under the node's directory, deepest first; whether none remains.
    fn unmount_all(&self) -> bool {
        let prefix = self.dir.to_string_lossy().into_owned();
        let mounted = || -> Vec<String> {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
                .filter(|m| m.starts_with(&prefix))
                .collect()
        };
        let mut points = mounted();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let _ = Command::new("umount").arg("-l").arg(&point).output();
        }
        mounted().is_empty()
    }
}

impl Drop for NodeCluster {
    fn drop(&mut self) {
        // The kubelet first, or it restarts what is being removed.
        self.kubelet.take();
        self.scheduler.take();
        self.controller_manager.take();
        self.remove_containers();
        self.containerd.take();
        for rule in &self.nat_rules {
            let _ = Command::new("iptables")
                .args(["-t", "nat", "-D"])
                .args(rule)
                .output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        // A directory with a mount left in it is kept: removing it would reach into the mount.
        if self.unmount_all() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        self.control_plane.take();
    }
}

/// `text` (from `source`) with each placeholder of `values` replaced; an error if one is left.
fn fill_placeholders(source: &str, mut text: String, values: &[(&str, &str)]) -> Result<String> {
    for (placeholder, value) in values {
        text = text.replace(placeholder, value);
    }
    if let Some(name) = unfilled_placeholder(&text) {
        bail!("{source}: placeholder @{name}@ has no value");
    }
    Ok(text)
}

/// The first `@NAME@` (capitals and underscores between two `@`) left in `text`.
fn unfilled_placeholder(text: &str) -> Option<&str> {
    let parts: Vec<&str> = text.split('@').collect();
    parts
        .get(1..parts.len().saturating_sub(1))?
        .iter()
        .copied()
        .find(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
}

/// Held for the cluster's lifetime: one one-node cluster on the machine at a time. Blocking.
fn machine_lock() -> Result<File> {
    let path = std::env::temp_dir().join("cloudnet-node-cluster.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

fn nofile_hard_limit() -> Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("no open-files line in /proc/self/limits")?;
    let hard = line
        .split_whitespace()
        .nth(4)
        .context("no hard open-files limit")?;
    Ok(match hard {
        "unlimited" => 1_048_576,
        n => n.parse()?,
    })
}

/// kube-scheduler or kube-controller-manager: the admin kubeconfig for everything, serving on
/// 127.0.0.1:`port`.
fn component(binary: &Path, kubeconfig: &Path, port: u16) -> Command {
    let mut command = Command::new(binary);
    for flag in [
        "kubeconfig",
        "authentication-kubeconfig",
        "authorization-kubeconfig",
    ] {
        command.arg(format!("--{flag}={}", kubeconfig.display()));
    }
    command
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={port}"));
    command
}

fn quoted(path: &Path) -> String {
    format!("\"{}\"", path.display())
}

fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn run(command: &mut Command) -> Result<()> {
    output(command).map(drop)
}

#[cfg(test)]
mod tests {
    use super::unfilled_placeholder;

    #[test]
    fn placeholders_left_in_a_rendering_are_found() {
        assert_eq!(
            unfilled_placeholder("a: @MOTO_URL@\nb: x"),
            Some("MOTO_URL")
        );
        assert_eq!(unfilled_placeholder("mail: a@b.c, d@e.f"), None);
        assert_eq!(unfilled_placeholder("x: @@ y: @ONE@"), Some("ONE"));
        assert_eq!(unfilled_placeholder("done"), None);
    }
}
