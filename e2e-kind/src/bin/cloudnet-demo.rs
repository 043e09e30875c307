//! The main job on embedded defaults: a real local control plane with the CloudPrivateIPConfig CRD
//! and a few sample objects, shown as `kubectl get` shows them, running until Ctrl-C.

use anyhow::{Context, Result, bail};
use cloudnet_e2e::ControlPlane;
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::signal::unix::{SignalKind, signal};

/// Sample objects: an IPv4 and an IPv6 egress IP on two nodes, and one attached nowhere yet.
const SAMPLES: &[(&str, &str)] = &[
    ("10.0.128.10", "worker-a"),
    ("10.0.128.11", "worker-b"),
    ("fc00.f853.0ccd.e793.0000.0000.0000.0054", "worker-a"),
    ("10.0.128.12", ""),
];

#[tokio::main]
async fn main() -> Result<()> {
    println!("cloudnet demo: starting etcd and kube-apiserver (the first run builds them)...");
    let cp = ControlPlane::start_with_crd().await?;
    println!(
        "control plane ready at {} with the CloudPrivateIPConfig CRD",
        cp.server_url()
    );

    let api: Api<CloudPrivateIPConfig> = Api::all(cp.client().await?);
    for (ip, node) in SAMPLES {
        let object = CloudPrivateIPConfig {
            metadata: ObjectMeta {
                name: Some((*ip).to_string()),
                ..Default::default()
            },
            spec: CloudPrivateIPConfigSpec {
                node: (*node).to_string(),
            },
            status: None,
        };
        api.create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating CloudPrivateIPConfig {ip}"))?;
    }

    println!("\n$ kubectl get cloudprivateipconfigs");
    let shown = cp
        .kubectl()
        .args(["get", "cloudprivateipconfigs"])
        .status()
        .context("running kubectl")?;
    if !shown.success() {
        bail!("kubectl get failed with {shown}");
    }
    println!(
        "\nExplore it from another terminal:\n  export KUBECONFIG={}\n  {} get cloudprivateipconfigs -o yaml\n\nPress Ctrl-C to stop; everything started here is stopped and removed.",
        cp.kubeconfig_path().display(),
        cloudnet_e2e::controlplane::locate_binaries()?
            .kubectl
            .display(),
    );

    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    let dir = cp.dir().to_path_buf();
    drop(cp);
    println!(
        "\nstopped etcd and kube-apiserver, removed {}",
        dir.display()
    );
    Ok(())
}
