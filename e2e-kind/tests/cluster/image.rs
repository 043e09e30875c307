#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The reconciler image runs the network operator's hosted-control-plane command unchanged: the
//! `/bin/bash -c` script of e2e-kind/hosted/controller.yaml, run in the image's own files (its
//! layers unpacked from `make images`' OCI archive, entered with `chroot` as the image's user and
//! with its environment), finds its shell, `sleep` and `date` there. Without the token it gives up
//! after its 30 tries with the `date -Iseconds` line; with it, its process becomes the controller.
//! The one-node cluster test (hosted.rs) runs the same command under containerd and runc.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cloudnet_e2e::harness::cluster::IMAGES_DIR_ENV;
use cloudnet_e2e::harness::e2e::wait;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::Value;

/// The script's own 30 tries of `sleep 1`, plus a loaded machine.
const GIVE_UP_BOUND: Duration = Duration::from_secs(120);
const EXEC_BOUND: Duration = Duration::from_secs(30);
const TOKEN: &str = "var/run/secrets/hosted_cluster/token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_image_runs_the_hosted_control_plane_command_unchanged() {
    if !crate::support::machine_can_run_a_node() {
        return;
    }
    let archive = PathBuf::from(std::env::var_os(IMAGES_DIR_ENV).unwrap())
        .join("cloudnet-reconciler.oci.tar");
    let dir = std::env::temp_dir().join(format!("cloudnet-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (without, with) = (dir.join("without-token"), dir.join("with-token"));
    let env = unpack(&archive, &without).unwrap();
    unpack(&archive, &with).unwrap();
    let command = hosted_command().unwrap();

    // Without the token (started first, runs meanwhile): 30 tries of `sleep 1`, then `date -Iseconds` on
    // the line that says so, and exit 1.
    let started = Instant::now();
    let (giving_up_env, giving_up_command) = (env.clone(), command.clone());
    let gave_up = tokio::task::spawn_blocking(move || {
        enter(&without, &giving_up_env, &giving_up_command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
    });

    // With the token, and a kubeconfig naming an API server that accepts connections and never
    // answers (so that the controller stays up while it is looked at): the script's process
    // becomes the reconciler, with the operator's arguments.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::create_dir_all(with.join(TOKEN).parent().unwrap()).unwrap();
    std::fs::write(with.join(TOKEN), "token").unwrap();
    std::fs::write(
        with.join("var/run/secrets/hosted_cluster/kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: default, cluster: {{server: 'https://{}'}}}}]\n\
             users: [{{name: admin, user: {{tokenFile: /var/run/secrets/hosted_cluster/token}}}}]\n\
             contexts: [{{name: default, context: {{cluster: default, user: admin}}}}]\n\
             current-context: default\n",
            silent.local_addr().unwrap()
        ),
    )
    .unwrap();
    let mut running = enter(&with, &env, &command)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = running.id();
    let execed = wait::found(EXEC_BOUND, "the script to exec the controller", || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
        let argv = std::fs::read(format!("/proc/{pid}/cmdline"));
        async move {
            let exe = exe?.to_string_lossy().into_owned();
            // Mid-exec the new executable shows before the new argv does: an empty cmdline is
            // read again.
            let argv = argv?;
            Ok(
                (exe.ends_with("/usr/local/bin/cloudnet-reconciler") && !argv.is_empty())
                    .then_some(argv),
            )
        }
    })
    .await;
    let _ = running.kill();
    let _ = running.wait();
    drop(silent);
    let argv: Vec<String> = execed
        .unwrap()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert_eq!(
        argv.iter().take(3).collect::<Vec<_>>(),
        [
            "/usr/bin/cloud-network-config-controller",
            "-platform-type",
            "AWS"
        ]
    );
    assert!(
        argv.windows(2)
            .any(|w| w == ["-secret-name", "cloud-network-config-controller-creds"]),
        "{argv:?}"
    );

    // The give-up, started first.
    let out = tokio::time::timeout(GIVE_UP_BOUND, gave_up)
        .await
        .expect("the script gives up within its bound")
        .unwrap()
        .unwrap();
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout {stdout:?}, stderr {stderr:?}"
    );
    assert!(
        stderr.is_empty(),
        "a command is missing from the image: {stderr}"
    );
    let line = stdout.trim_end();
    let (date, message) = line.split_once(" - ").unwrap_or_default();
    assert!(is_iso_seconds(date), "not `date -Iseconds`: {line:?}");
    assert_eq!(message, "Hosted cluster token not found");
    assert!(
        elapsed >= Duration::from_secs(30),
        "gave up after {elapsed:?}"
    );
    eprintln!("without a token the command gave up after {elapsed:?}: {line}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `chroot` into `root` as the image's user, with its environment only, running `command`.
fn enter(root: &Path, env: &[(String, String)], command: &[String]) -> Command {
    // By path: the child's environment (the image's) has no PATH that finds it.
    let binary = ["/usr/sbin/chroot", "/usr/bin/chroot", "/sbin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("chroot");
    let mut chroot = Command::new(binary);
    chroot
        .arg("--userspec=65532:65532")
        .arg(root)
        .args(command)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env(
            "CONTROLLER_NAMESPACE",
            "openshift-cloud-network-config-controller",
        )
        .env("CONTROLLER_NAME", "cloud-network-config-controller")
        .stdin(Stdio::null());
    chroot
}

/// The controller container's command in e2e-kind/hosted/controller.yaml, with the values the
/// cluster test gives its placeholders.
fn hosted_command() -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(cloudnet_e2e::crate_file("hosted/controller.yaml"))?
        .replace("@PLATFORM_TYPE@", "AWS")
        .replace("@PLATFORM_REGION@", "us-east-1")
        .replace("@PLATFORM_API_URL@", "http://127.0.0.1:9")
        .replace("@RELEASE_VERSION@", "4.99.0-cloudnet-e2e");
    let deployment: Deployment = serde_saphyr::from_str(&text)?;
    deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().find(|c| c.name == "controller"))
        .and_then(|c| c.command)
        .ok_or_else(|| anyhow::anyhow!("no controller command in hosted/controller.yaml"))
}

/// Unpacks the image of the OCI archive `archive` into `root` (its layers in order) and returns
/// its configured environment.
fn unpack(archive: &Path, root: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let layout = root.with_extension("oci");
    std::fs::create_dir_all(&layout)?;
    std::fs::create_dir_all(root)?;
    tar(archive, &layout)?;
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let json = |path: PathBuf| -> anyhow::Result<Value> {
        Ok(serde_json::from_slice(&std::fs::read(path)?)?)
    };
    let index = json(layout.join("index.json"))?;
    let manifest =
        json(blob(index["manifests"][0]["digest"].as_str().ok_or_else(
            || anyhow::anyhow!("index.json names no manifest"),
        )?))?;
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        let digest = layer["digest"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("a layer has no digest"))?;
        tar(&blob(digest), root)?;
    }
    let config =
        json(blob(manifest["config"]["digest"].as_str().ok_or_else(
            || anyhow::anyhow!("the manifest names no config"),
        )?))?;
    anyhow::ensure!(
        config["config"]["User"] == "65532:65532",
        "the image's user is {}",
        config["config"]["User"]
    );
    Ok(config["config"]["Env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str()?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

fn tar(archive: &Path, into: &Path) -> anyhow::Result<()> {
    let out = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "tar -xf {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Whether `text` is a time as `date -Iseconds` prints it: `2026-11-27T17:51:09+00:00`.
fn is_iso_seconds(text: &str) -> bool {
    let shape = "dddd-dd-ddTdd:dd:dd+dd:dd";
    text.len() == shape.len()
        && text.chars().zip(shape.chars()).all(|(c, s)| match s {
            'd' => c.is_ascii_digit(),
            '+' => c == '+' || c == '-',
            _ => c == s,
        })
}
