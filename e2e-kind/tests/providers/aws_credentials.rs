#![allow(clippy::unwrap_used, clippy::expect_used)]
//! AWS credentials as upstream reads them, against moto's EC2 and STS (one server serves both):
//! the shared `credentials` file wins over the key files, and a web-identity profile in it is
//! exchanged at STS (through the same endpoint override and CA bundle as EC2) for the role's
//! temporary credentials, renewed before they expire.
//!
//! moto files the temporary keys of `arn:aws:iam::<account>:role/…` under that account and keeps
//! EC2 state per account, so a provider finds an instance created with the role's credentials
//! only if its own calls are signed with them too. Each test uses a region and account of its own.

use std::path::Path;
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule, ServerTls};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::e2e::ec2::{create_network, moto_settings, run_instances};
use cloudnet_reconciler::cloud::aws::{
    AwsProvider, AwsSettings, ClientSettings, CredentialSource, RetryPolicy, WebIdentity,
    build_sdk_client,
};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{CloudProvider, ErrorKind, InstanceId, NodeTarget};

/// What the token file holds: must never show in a message.
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.cloudnet-test-token.c2lnbmF0dXJl";
const STS_ACTION: &str = "AssumeRoleWithWebIdentity";

/// A token file in `dir` and a web identity for a role of `account`.
fn web_identity(dir: &Path, account: &str, duration: Option<Duration>) -> WebIdentity {
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    WebIdentity {
        role_arn: format!("arn:aws:iam::{account}:role/cloudnet-egress"),
        token_file,
        session_name: Some("cloudnet-test".into()),
        duration,
    }
}

/// The shared moto settings with `credentials`, a CA bundle, the published pacing and few
/// retries (a refusal is what these tests wait for).
fn settings(
    endpoint: &str,
    region: &str,
    ca_bundle_pem: Option<Vec<u8>>,
    credentials: CredentialSource,
) -> AwsSettings {
    let base = moto_settings(endpoint, region);
    AwsSettings {
        client: ClientSettings {
            ca_bundle_pem,
            ..base.client
        },
        credentials,
        retry: RetryPolicy {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
            max_attempts: 3,
        },
        pacing: Pacing::PUBLISHED,
    }
}

/// An instance created in moto with `credentials` (so in their account); its node and ENI.
async fn instance(
    moto: &MotoServer,
    region: &str,
    credentials: CredentialSource,
) -> (NodeTarget, String) {
    let settings = settings(moto.url(), region, None, credentials);
    let ec2 = build_sdk_client(&settings.client, &settings.credentials).unwrap();
    let network = create_network(&ec2, "10.0.0.0/16".parse().unwrap())
        .await
        .unwrap();
    let instance = run_instances(&ec2, &network, InstanceType::M5Large, 1)
        .await
        .unwrap()
        .remove(0);
    let node = NodeTarget {
        node_name: "node-sts".into(),
        provider_id: instance.provider_id(),
        instance: InstanceId(instance.id.clone()),
        internal_ips: Default::default(),
    };
    (node, instance.eni)
}

/// The shared file as the cloud credential operator writes it in STS mode.
fn sts_profile(identity: &WebIdentity) -> String {
    format!(
        "[default]\nsts_regional_endpoints = regional\nrole_arn = {}\nweb_identity_token_file = {}\n",
        identity.role_arn,
        identity.token_file.display()
    )
}

#[tokio::test]
async fn a_web_identity_profile_in_the_shared_file_wins_over_key_files_and_signs_ec2_calls() {
    let region = "eu-south-1";
    let moto = MotoServer::shared().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let identity = web_identity(dir.path(), "111111111111", None);
    let (node, eni) = instance(moto, region, identity.clone().into()).await;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    // Stale key files beside the shared file: they would sign for moto's default account.
    std::fs::write(dir.path().join("credentials"), sts_profile(&identity)).unwrap();
    std::fs::write(dir.path().join("aws_access_key_id"), "AKIDSTALEKEYFILE").unwrap();
    std::fs::write(dir.path().join("aws_secret_access_key"), "stale-secret").unwrap();

    let loaded = AwsSettings::load(dir.path(), region, Some(proxy.url()), None).unwrap();
    assert_eq!(
        loaded.credentials,
        CredentialSource::WebIdentity(WebIdentity {
            session_name: None,
            ..identity.clone()
        })
    );
    let provider = AwsProvider::new(&loaded).unwrap();
    let egress = provider.egress_config(&node).await.unwrap();
    assert_eq!(
        egress.interface, eni,
        "the role's account holds the instance"
    );
    provider.egress_config(&node).await.unwrap();
    assert_eq!(
        proxy.counts(STS_ACTION).forwarded,
        1,
        "the role's credentials are kept between calls"
    );

    // STS failing: the call fails naming the role, never the token.
    let failing = AwsProvider::new(&loaded).unwrap();
    proxy.set_rule(
        RouteMatch::exact(STS_ACTION),
        Rule::PASS.with_server_error(1.0),
    );
    let error = failing.egress_config(&node).await.unwrap_err();
    println!("STS failing: {error}");
    assert_eq!(error.kind, ErrorKind::Permanent, "{error}");
    assert!(error.message.contains("no AWS credentials"), "{error}");
    assert!(error.message.contains(&identity.role_arn), "{error}");
    assert!(!error.message.contains(TOKEN), "{error}");
}

#[tokio::test]
async fn web_identity_credentials_are_renewed_before_they_expire_reading_the_token_each_time() {
    let region = "af-south-1";
    let moto = MotoServer::shared().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // STS grants 4 s (real STS: at least 15 min; moto takes what it is asked for).
    let life = Duration::from_secs(4);
    let identity = web_identity(dir.path(), "222222222222", Some(life));
    let (node, _) = instance(moto, region, identity.clone().into()).await;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    let provider = AwsProvider::new(&settings(
        proxy.url(),
        region,
        None,
        identity.clone().into(),
    ))
    .unwrap();

    // Calls keep going while the credentials are renewed twice: each exchange comes before the
    // credentials of the one before expire (moto would accept expired ones: the times tell).
    let start = Instant::now();
    let mut exchanges: Vec<Instant> = Vec::new();
    while exchanges.len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "credentials not renewed: {} exchanges",
            exchanges.len()
        );
        provider.egress_config(&node).await.unwrap();
        let seen = proxy.counts(STS_ACTION).forwarded as usize;
        exchanges.resize(seen, Instant::now());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gaps: Vec<Duration> = exchanges.windows(2).map(|w| w[1] - w[0]).collect();
    let calls = proxy.counts("DescribeInstances").forwarded;
    println!("{calls} EC2 calls; STS exchanges {gaps:?} apart, credentials valid {life:?}");
    for gap in &gaps {
        assert!(*gap < life, "renewed after expiry: {gaps:?}");
        assert!(*gap > life / 8, "renewed long before it was due: {gaps:?}");
    }

    // The token is read at every exchange: without its file, the next renewal fails.
    std::fs::remove_file(&identity.token_file).unwrap();
    let error = loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the renewal never failed"
        );
        match provider.egress_config(&node).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(error) => break error,
        }
    };
    println!("token file gone: {error}");
    assert!(
        error
            .message
            .contains(&identity.token_file.display().to_string()),
        "{error}"
    );
    assert!(!error.message.contains(TOKEN), "{error}");
}

#[tokio::test]
async fn the_sts_exchange_uses_the_custom_endpoint_and_ca_bundle() {
    let region = "ap-east-1";
    let moto = MotoServer::shared().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let identity = web_identity(dir.path(), "333333333333", None);
    let (node, eni) = instance(moto, region, identity.clone().into()).await;
    let ca = cloudnet_certs::CertificateAuthority::generate("sts-test-ca", time::Duration::days(1))
        .unwrap();
    let leaf = ca
        .issue(&cloudnet_certs::LeafRequest {
            common_name: "aws.local",
            organizations: &[],
            alt_names: &["127.0.0.1", "localhost"],
            usage: cloudnet_certs::Usage::Server,
            validity: time::Duration::days(1),
        })
        .unwrap();
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .tls(ServerTls {
            cert_pem: leaf.cert_pem.clone(),
            key_pem: leaf.key_pem.clone(),
        })
        .start()
        .await
        .unwrap();

    let trusted = settings(
        proxy.url(),
        region,
        Some(ca.cert_pem().as_bytes().to_vec()),
        identity.clone().into(),
    );
    let egress = AwsProvider::new(&trusted)
        .unwrap()
        .egress_config(&node)
        .await
        .unwrap();
    assert_eq!(egress.interface, eni);
    assert_eq!(
        proxy.counts(STS_ACTION).forwarded,
        1,
        "STS went to the endpoint override"
    );

    // Without the bundle STS is not trusted either, and no EC2 call goes out unsigned.
    proxy.reset_counts();
    let untrusted = settings(proxy.url(), region, None, identity.clone().into());
    let error = AwsProvider::new(&untrusted)
        .unwrap()
        .egress_config(&node)
        .await
        .unwrap_err();
    println!("STS not trusted: {error}");
    assert!(
        error.message.contains("could not reach the STS endpoint"),
        "{error}"
    );
    assert_eq!(
        proxy.all_counts().values().map(|c| c.total()).sum::<u64>(),
        0
    );
}
