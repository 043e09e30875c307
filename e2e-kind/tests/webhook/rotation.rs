//! Rotating the webhook's serving certificate through a Secret-style symlink swap, while
//! kube-apiserver streams admissions at it, fails no admission.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cloudnet_certs::Issued;
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::webhook::{
    SecretDir, register_webhooks, serves_cert_from, serving_cert, test_ca,
};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use cloudnet_webhook::Settings;
use cloudnet_webhook::tls::CertPaths;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

const WAIT: Duration = Duration::from_secs(60);
const STREAMS: usize = 4;

fn object(name: &str) -> CloudPrivateIPConfig {
    CloudPrivateIPConfig {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CloudPrivateIPConfigSpec {
            node: String::new(),
        },
        status: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_under_load_fails_no_admission() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let client = cp.client().await.unwrap();
    let old_ca = test_ca("rotation-old-ca").unwrap();
    let new_ca = test_ca("rotation-new-ca").unwrap();
    let old_pair = serving_cert(&old_ca).unwrap();
    let mut secret = SecretDir::create(&cp.dir().join("webhook-tls"), &old_pair).unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let settings = Settings {
        platform: None,
        cert_paths: CertPaths {
            cert: secret.cert_path(),
            key: secret.key_path(),
        },
        cert_reload_interval: Duration::from_millis(100),
        cache_stale_after: cloudnet_webhook::freshness::STALE_AFTER,
        ledger_namespace: "cloudnet-system".into(),
    };
    tokio::spawn(cloudnet_webhook::run(
        listener,
        client.clone(),
        settings,
        std::future::pending(),
    ));
    // The caBundle trusts both CAs, as it would during a CA rollover.
    let bundle = format!("{}{}", old_ca.cert_pem(), new_ca.cert_pem());
    register_webhooks(&client, "cloudnet-webhook-rotation", addr, &bundle)
        .await
        .unwrap();

    let api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    // Wait until the webhook reviews requests (its denial of a leading-zero name proves it).
    let deadline = Instant::now() + WAIT;
    loop {
        match api.create(&dry, &object("010.1.0.1")).await {
            Err(kube::Error::Api(s)) if s.message.contains("name_encoding") => break,
            other => assert!(
                Instant::now() < deadline,
                "webhook never took effect: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut streams = Vec::new();
    for stream in 0..STREAMS {
        let (api, stop, admitted) = (api.clone(), stop.clone(), admitted.clone());
        streams.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let name = format!("10.{}.{}.{}", 10 + stream, (i / 250) % 250, 1 + i % 250);
                match api
                    .create(
                        &PostParams {
                            dry_run: true,
                            ..Default::default()
                        },
                        &object(&name),
                    )
                    .await
                {
                    Ok(_) => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.push(e.to_string()),
                }
            }
            failures
        }));
    }
    let wait_admitted = |at_least: usize| {
        let admitted = admitted.clone();
        async move {
            let deadline = Instant::now() + WAIT;
            while admitted.load(Ordering::Relaxed) < at_least {
                assert!(Instant::now() < deadline, "admissions stalled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_admitted(50).await;

    // A torn rotation (new certificate, old key) must be ignored: the old pair keeps serving.
    let new_pair = serving_cert(&new_ca).unwrap();
    secret
        .rotate(&Issued {
            cert_pem: new_pair.cert_pem.clone(),
            key_pem: old_pair.key_pem.clone(),
        })
        .unwrap();
    let seen = admitted.load(Ordering::Relaxed);
    wait_admitted(seen + 50).await;
    assert!(
        serves_cert_from(addr, old_ca.cert_pem().as_bytes()).await,
        "a mismatched pair replaced the good one"
    );

    // The real rotation.
    secret.rotate(&new_pair).unwrap();
    let deadline = Instant::now() + WAIT;
    while !serves_cert_from(addr, new_ca.cert_pem().as_bytes()).await {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !serves_cert_from(addr, old_ca.cert_pem().as_bytes()).await,
        "the old certificate is still served"
    );
    let seen = admitted.load(Ordering::Relaxed);
    wait_admitted(seen + 100).await;

    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for stream in streams {
        failures.extend(stream.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} failed admissions: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(admitted.load(Ordering::Relaxed) >= 200);
}
