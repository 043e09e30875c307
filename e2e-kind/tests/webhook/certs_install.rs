//! The webhook's manifests install without cert-manager: `certs/install-webhook-certs.sh` creates
//! the serving Secret and fills caBundle on every webhook of both configurations; the cert-manager
//! overlay renders with its root CA, CA Issuer, serving Certificate and CA-injection annotations;
//! and rotating with the script while kube-apiserver sends creates every 100 ms refuses none.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use cloudnet_certs::Issued;
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::binaries;
use cloudnet_e2e::harness::controlplane::Supervised;
use cloudnet_e2e::harness::e2e::wait;
use cloudnet_e2e::harness::webhook::{
    SecretDir, register_webhooks, serves_cert_from, webhook_command,
};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

const WAIT: Duration = Duration::from_secs(60);
/// How late the test's stand-in for kubelet brings a changed Secret into the pod's volume: real
/// kubelets take up to a minute or two; a few seconds cover dozens of creates.
const KUBELET_LAG: Duration = Duration::from_secs(3);

#[tokio::test]
async fn install_script_creates_the_secret_and_sets_every_ca_bundle() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let manifests = cloudnet_e2e::crate_file("../manifests/webhook");
    cp.run_kubectl(["apply".as_ref(), "-k".as_ref(), manifests.as_os_str()])
        .unwrap();

    run_install_script(&cp);

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
    // One mutating entry and seven validating ones (CloudPrivateIPConfig, EgressRouter,
    // NetworkAttachmentDefinition, EgressPublicIP, Antrea's ExternalIPPool and Egress,
    // EgressGateway).
    assert_eq!(bundles.len(), 8);
    let first = bundles.pop().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first.0).contains("BEGIN CERTIFICATE"));
    assert!(bundles.iter().all(|b| b.as_ref() == Some(&first)));
}

#[test]
fn cert_manager_overlay_renders_issuer_certificate_and_injection() {
    let text = cloudnet_e2e::harness::controlplane::locate_binaries()
        .unwrap()
        .kustomize(&cloudnet_e2e::crate_file(
            "../manifests/webhook-cert-manager",
        ))
        .unwrap();
    assert_eq!(text.matches("\nkind: Issuer\n").count(), 2);
    assert_eq!(text.matches("\nkind: Certificate\n").count(), 2);
    // A root that keeps its key, and a CA Issuer from it for the serving certificate.
    assert!(text.contains("isCA: true"));
    assert!(text.contains("rotationPolicy: Never"));
    assert!(text.contains("ca:\n    secretName: cloudnet-webhook-ca"));
    assert!(text.contains("secretName: cloudnet-webhook-tls"));
    // caBundle comes from the root, which a serving certificate's renewal leaves alone.
    assert_eq!(
        text.matches("cert-manager.io/inject-ca-from: cloudnet/cloudnet-webhook-ca")
            .count(),
        2
    );
    assert!(!text.contains("inject-ca-from: cloudnet/cloudnet-webhook-tls"));
}

/// Runs `certs/install-webhook-certs.sh` against `cp`, with the serving certificate also valid
/// for 127.0.0.1 (where the test's webhook listens).
fn run_install_script(cp: &ControlPlane) {
    // kubectl() carries --kubeconfig; the script takes the binary and the config from the env.
    let kubectl = cp.kubectl();
    let args: Vec<_> = kubectl.get_args().map(|a| a.to_owned()).collect();
    let wrapper = cp.dir().join("certs-with-loopback-san");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec '{}' --extra-san 127.0.0.1 \"$@\"\n",
            binaries::certs().unwrap().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let run = std::process::Command::new("bash")
        .arg(cloudnet_e2e::crate_file(
            "../certs/install-webhook-certs.sh",
        ))
        .env(binaries::CERTS_ENV, &wrapper)
        .env("KUBECTL", kubectl.get_program())
        .env("KUBECONFIG", &args[1])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}

/// The serving pair in the Secret now, and its resourceVersion.
async fn secret_pair(secrets: &Api<Secret>) -> (Issued, String) {
    let secret = secrets.get("cloudnet-webhook-tls").await.unwrap();
    let data = secret.data.unwrap();
    let text = |key: &str| String::from_utf8(data[key].0.clone()).unwrap();
    (
        Issued {
            cert_pem: text("tls.crt"),
            key_pem: text("tls.key"),
        },
        secret.metadata.resource_version.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_with_the_install_script_refuses_no_admission() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let client = cp.client().await.unwrap();
    cp.run_kubectl(["create", "namespace", "cloudnet"]).unwrap();
    // The configurations the script patches, pointing at this test's webhook by URL.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    register_webhooks(&client, "cloudnet-webhook", addr, "")
        .await
        .unwrap();
    run_install_script(&cp);

    // The pod's Secret volume, kept in step by the test as kubelet would, a few seconds late.
    let secrets = Api::<Secret>::namespaced(client.clone(), "cloudnet");
    let (pair, mut version) = secret_pair(&secrets).await;
    let mut volume = SecretDir::create(&cp.dir().join("webhook-tls"), &pair).unwrap();
    let mut command = webhook_command(addr, &volume, cp.kubeconfig_path()).unwrap();
    command.arg("--cert-reload-interval=1s");
    let webhook =
        Supervised::spawn("cloudnet-webhook", command, &cp.dir().join("webhook.log")).unwrap();

    let api = Api::<CloudPrivateIPConfig>::all(client.clone());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe = CloudPrivateIPConfig::new(
        "010.0.0.99",
        CloudPrivateIPConfigSpec {
            node: String::new(),
        },
    );
    wait::until(WAIT, "the webhook to review requests", || async {
        let result = api.create(&dry_run, &probe).await;
        Ok(matches!(&result, Err(kube::Error::Api(s)) if s.message.contains("name_encoding")))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", webhook.log_tail(30)));

    // Creates every 100 ms, through kube-apiserver and the webhook, for the whole rotation.
    let stop = Arc::new(AtomicBool::new(false));
    let (admitted, refusals) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let creates = tokio::spawn({
        let (api, stop) = (api.clone(), Arc::clone(&stop));
        let (admitted, refusals) = (Arc::clone(&admitted), Arc::clone(&refusals));
        async move {
            let mut refused = Vec::new();
            let mut ticks = tokio::time::interval(Duration::from_millis(100));
            for i in 0u32.. {
                ticks.tick().await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = format!("10.20.{}.{}", i / 250, 1 + i % 250);
                let object = CloudPrivateIPConfig::new(
                    &name,
                    CloudPrivateIPConfigSpec {
                        node: String::new(),
                    },
                );
                match api.create(&dry_run, &object).await {
                    Ok(_) => admitted.fetch_add(1, Ordering::Relaxed),
                    Err(error) => {
                        refused.push(error.to_string());
                        refusals.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            refused
        }
    });

    run_install_script(&cp);
    let (new_pair, new_version) = secret_pair(&secrets).await;
    assert_ne!(new_version, version, "the script replaced the Secret");
    version = new_version;
    // kubelet's refresh lag, shortened: the pod serves the old pair meanwhile.
    tokio::time::sleep(KUBELET_LAG).await;
    volume.rotate(&new_pair).unwrap();
    let new_ca = secrets
        .get("cloudnet-webhook-tls")
        .await
        .unwrap()
        .data
        .unwrap()["ca.crt"]
        .0
        .clone();
    wait::until(WAIT, "the webhook to serve the new certificate", || async {
        Ok(serves_cert_from(addr, &new_ca).await)
    })
    .await
    .unwrap();
    // And some more creates against the new pair (counted, not timed: a loaded machine makes
    // each create slower), or the first refusal.
    let enough = (admitted.load(Ordering::Relaxed) + 15).max(30);
    wait::until(WAIT, "15 more creates against the new pair", || async {
        Ok(admitted.load(Ordering::Relaxed) >= enough || refusals.load(Ordering::Relaxed) > 0)
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    let refused = creates.await.unwrap();
    let admitted = admitted.load(Ordering::Relaxed);
    assert!(
        refused.is_empty(),
        "{} of {} creates refused during the rotation: {:?}",
        refused.len(),
        admitted as usize + refused.len(),
        refused.first()
    );
    assert!(admitted >= enough, "only {admitted} creates ran");
    let _ = version;
}
