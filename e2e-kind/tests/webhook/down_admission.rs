//! With the webhook's configurations applied from the manifests and no webhook pod reachable
//! (a rollout, a drain, a crash), only spec changes of CloudPrivateIPConfigs are refused:
//! finalizer removals and label/annotation updates still pass, so deleting the webhook's pods
//! never blocks the reconciler's cleanup.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::{Duration, Instant};

use cloudnet_e2e::ControlPlane;

fn ok(output: &Output) -> bool {
    output.status.success()
}

fn patch(cp: &ControlPlane, name: &str, body: &str) -> Output {
    cp.kubectl()
        .args([
            "patch",
            "cloudprivateipconfig",
            name,
            "--type=merge",
            "-p",
            body,
        ])
        .output()
        .unwrap()
}

#[tokio::test]
async fn metadata_updates_pass_while_the_webhook_is_down_and_spec_changes_are_refused() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let name = "10.0.0.5";
    let object = format!(
        r#"{{"apiVersion":"cloud.network.openshift.io/v1","kind":"CloudPrivateIPConfig",
"metadata":{{"name":"{name}","finalizers":["cloudprivateipconfig.cloud.network.openshift.io/finalizer"]}},
"spec":{{"node":"node-a"}}}}"#
    );
    let path = std::env::temp_dir().join(format!("cpic-{}.json", std::process::id()));
    std::fs::write(&path, object).unwrap();
    cp.run_kubectl(["create".as_ref(), "-f".as_ref(), path.as_os_str()])
        .unwrap();
    let manifests = cloudnet_e2e::crate_file("../manifests/webhook");
    cp.run_kubectl(["apply".as_ref(), "-k".as_ref(), manifests.as_os_str()])
        .unwrap();

    // The apiserver loads webhook configurations asynchronously: wait until a spec change is
    // refused (the webhook has no endpoint), which proves the configurations are in force.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut flip = 0;
    loop {
        flip += 1;
        let node = if flip % 2 == 0 { "node-a" } else { "node-b" };
        let changed = patch(&cp, name, &format!(r#"{{"spec":{{"node":"{node}"}}}}"#));
        if !ok(&changed) {
            break;
        }
        assert!(Instant::now() < deadline, "spec changes still admitted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let labelled = patch(&cp, name, r#"{"metadata":{"labels":{"team":"net"}}}"#);
    assert!(
        ok(&labelled),
        "{}",
        String::from_utf8_lossy(&labelled.stderr)
    );
    let annotated = patch(&cp, name, r#"{"metadata":{"annotations":{"note":"x"}}}"#);
    assert!(
        ok(&annotated),
        "{}",
        String::from_utf8_lossy(&annotated.stderr)
    );
    let released = patch(&cp, name, r#"{"metadata":{"finalizers":null}}"#);
    assert!(
        ok(&released),
        "{}",
        String::from_utf8_lossy(&released.stderr)
    );
    let _ = std::fs::remove_file(&path);
}
