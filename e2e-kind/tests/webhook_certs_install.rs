//! The webhook's manifests install without cert-manager: `certs/install-webhook-certs.sh` creates
//! the serving Secret and fills caBundle on every webhook of both configurations; the cert-manager
//! overlay renders with its Issuer, Certificate and CA-injection annotations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::e2e::binaries;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

#[tokio::test]
async fn install_script_creates_the_secret_and_sets_every_ca_bundle() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let manifests = cloudnet_e2e::crate_file("../manifests/webhook");
    cp.run_kubectl(["apply".as_ref(), "-k".as_ref(), manifests.as_os_str()])
        .unwrap();

    // kubectl() carries --kubeconfig; the script takes the binary and the config from the env.
    let kubectl = cp.kubectl();
    let args: Vec<_> = kubectl.get_args().map(|a| a.to_owned()).collect();
    let kubeconfig = args[1].clone();
    let script = cloudnet_e2e::crate_file("../certs/install-webhook-certs.sh");
    let run = std::process::Command::new("bash")
        .arg(script)
        .env(binaries::CERTS_ENV, binaries::certs().unwrap())
        .env("KUBECTL", kubectl.get_program())
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );

    let client = cp.client().await.unwrap();
    let secret = Api::<Secret>::namespaced(client.clone(), "cloudnet")
        .get("cloudnet-webhook-tls")
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let m = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("cloudnet-webhook")
        .await
        .unwrap();
    let v = Api::<ValidatingWebhookConfiguration>::all(client)
        .get("cloudnet-webhook")
        .await
        .unwrap();
    let mut bundles: Vec<_> = m
        .webhooks
        .unwrap()
        .into_iter()
        .map(|w| w.client_config.ca_bundle)
        .chain(
            v.webhooks
                .unwrap()
                .into_iter()
                .map(|w| w.client_config.ca_bundle),
        )
        .collect();
    assert_eq!(bundles.len(), 4);
    let first = bundles.pop().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first.0).contains("BEGIN CERTIFICATE"));
    assert!(bundles.iter().all(|b| b.as_ref() == Some(&first)));
}

#[test]
fn cert_manager_overlay_renders_issuer_certificate_and_injection() {
    let kubectl = std::path::PathBuf::from(std::env::var("CLOUDNET_CONTROLPLANE_BIN").unwrap())
        .join("kubectl");
    let out = std::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(cloudnet_e2e::crate_file(
            "../manifests/webhook-cert-manager",
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("kind: Issuer"));
    assert!(text.contains("kind: Certificate"));
    assert!(text.contains("secretName: cloudnet-webhook-tls"));
    assert_eq!(
        text.matches("cert-manager.io/inject-ca-from: cloudnet/cloudnet-webhook-tls")
            .count(),
        2
    );
}
