//! EgressPublicIP admission through the real kube-apiserver, registered from the shipped webhook
//! configuration (`egress::full`'s harness, webhook on AWS): a second binding of an egress IP
//! is refused with the webhook's message once its watch holds the first, GCP's ids are refused
//! naming Cloud NAT, a spec change is refused (by the CRD's own rule, before the webhook is
//! asked) while labels and status writes pass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use cloudnet_shared::public_ip::{EgressPublicIP, EgressPublicIPSpec, SPEC_IMMUTABLE};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::egress::{client, denial, dry_run, full};

const WAIT: Duration = Duration::from_secs(60);

fn binding(name: &str, private_ip: &str, public_ip: &str) -> EgressPublicIP {
    EgressPublicIP::new(
        name,
        EgressPublicIPSpec {
            private_ip: private_ip.into(),
            public_ip: public_ip.into(),
        },
    )
}

#[tokio::test]
async fn bindings_are_admitted_through_the_apiserver_by_the_shared_rules() {
    let api = Api::<EgressPublicIP>::all(client(full).await);
    api.create(
        &PostParams::default(),
        &binding("partner-a", "192.168.60.5", "eipalloc-0a0a0a0a"),
    )
    .await
    .unwrap();

    // The webhook learns the binding through its watch; until then a duplicate may pass a dry run.
    let duplicate = binding("partner-b", "192.168.60.5", "eipalloc-0b0b0b0b");
    let deadline = Instant::now() + WAIT;
    let message = loop {
        let result = api.create(&dry_run(), &duplicate).await;
        if result.is_err() {
            break denial(result);
        }
        assert!(Instant::now() < deadline, "the duplicate was never refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        message,
        "public_ip_conflict: EgressPublicIP partner-a already binds a public address to 192.168.60.5: an egress IP takes one public address; delete partner-a first to bind another"
    );

    let gcp = binding(
        "partner-c",
        "192.168.60.6",
        "projects/p/regions/us-central1/addresses/egress-1",
    );
    let message = denial(api.create(&dry_run(), &gcp).await);
    assert!(
        message.starts_with("public_ip_platform: publicIP"),
        "{message}"
    );
    assert!(message.contains("Cloud NAT"), "{message}");

    // kube-apiserver checks the CRD's rule before it calls a validating webhook, so the CRD
    // refuses it; the webhook's `public_ip_immutable` stands behind it
    // (webhook/tests/router_public_ip.rs).
    let moved = json!({"spec": {"privateIP": "192.168.60.7"}});
    match api
        .patch("partner-a", &PatchParams::default(), &Patch::Merge(&moved))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert!(status.message.contains(SPEC_IMMUTABLE), "{status:?}");
        }
        other => panic!("a spec change went through: {other:?}"),
    }
    let labelled = json!({"metadata": {"labels": {"team": "a"}}});
    api.patch(
        "partner-a",
        &PatchParams::default(),
        &Patch::Merge(&labelled),
    )
    .await
    .unwrap();
    let status = json!({"status": {"node": "worker-a"}});
    api.patch_status("partner-a", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}
