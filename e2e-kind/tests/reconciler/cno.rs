//! The reconciler with exactly the grants OpenShift's network operator (CNO) gives the upstream
//! controller (`e2e-kind/cno/rbac.yaml`), as that ServiceAccount, with the operator's own command
//! line: every permission the code needs is granted, the ones it lacks are optional and cost one
//! log line each, and objects are assigned, moved and released on EC2 (moto, allowing exactly the
//! operator's CredentialsRequest actions) with no other refusal in the log or from EC2. The Deployment's own shape (image path, mounts, policies) is run on the
//! one-node cluster (tests/cluster/node.rs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::{Dialect, EC2_CREDENTIALS_REQUEST, FaultProxy};
use cloudnet_e2e::harness::binaries;
use cloudnet_e2e::harness::controlplane::Supervised;
use cloudnet_e2e::harness::e2e::ec2::{addresses_of, create_network, run_instances};
use cloudnet_e2e::harness::e2e::{LocalCloud, Moto, ec2_client, local, plugin};
use cloudnet_e2e::{ControlPlane, crate_file};
use cloudnet_reconciler::controller::EVENT_NAMESPACE;
use cloudnet_reconciler::leader::LEASE_NAME;
use cloudnet_reconciler::rbac::{PERMISSIONS, Scope};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The operator's namespace and ServiceAccount for the controller.
const NAMESPACE: &str = "openshift-cloud-network-config-controller";
const ACCOUNT: &str = "cloud-network-config-controller";
/// The Secret the operator's Deployment names with `-secret-name`.
const SECRET: &str = "cloud-credentials";

async fn cno_account(cp: &ControlPlane) -> (Client, std::path::PathBuf) {
    cp.run_kubectl([
        "apply".into(),
        "-f".into(),
        crate_file("cno/rbac.yaml").into_os_string(),
    ])
    .unwrap();
    let admin = cp.client().await.unwrap();
    let path = local::service_account_kubeconfig(cp, &admin, NAMESPACE, ACCOUNT)
        .await
        .unwrap();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    (Client::try_from(config).unwrap(), path)
}

/// Whether the account of `client` may `verb` the permission's resource where the code uses it.
async fn allowed(client: &Client, scope: Scope, group: &str, resource: &str, verb: &str) -> bool {
    let namespace = match scope {
        Scope::Cluster => None,
        Scope::ControllerNamespace => Some(NAMESPACE.to_owned()),
        Scope::Events => Some(EVENT_NAMESPACE.to_owned()),
    };
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r.to_owned(), Some(s.to_owned())),
        None => (resource.to_owned(), None),
    };
    let name = match resource.as_str() {
        "leases" => Some(LEASE_NAME.to_owned()),
        "secrets" => Some(SECRET.to_owned()),
        _ => None,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource),
                subresource,
                verb: Some(verb.to_owned()),
                namespace,
                name,
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn with_the_operators_grants_and_command_line_objects_converge_and_nothing_is_refused() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let (account, kubeconfig) = cno_account(&cp).await;

    // Every permission the code uses is granted, except the optional ones.
    let mut missing = Vec::new();
    for p in PERMISSIONS {
        for verb in p.verbs {
            if !allowed(&account, p.scope, p.group, p.resource, verb).await {
                missing.push((p.optional, p.resource, *verb));
            }
        }
    }
    let required: Vec<_> = missing.iter().filter(|(optional, ..)| !optional).collect();
    assert!(
        required.is_empty(),
        "the operator does not grant {required:?}"
    );
    eprintln!("optional permissions the operator does not grant: {missing:?}");

    // The operator's arguments, empty values included; then what this harness needs instead of
    // a pod (a kubeconfig, the Secret's files, a free metrics port).
    let moto = Moto::start("eu-north-1").await.unwrap();
    let ec2 = ec2_client(moto.region(), moto.url()).unwrap();
    let network = create_network(&ec2, "10.0.0.0/16".parse().unwrap())
        .await
        .unwrap();
    let instances = run_instances(&ec2, &network, InstanceType::M5Large, 2)
        .await
        .unwrap();
    // EC2 allows exactly the operator's CredentialsRequest.
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .permit(EC2_CREDENTIALS_REQUEST)
        .start()
        .await
        .unwrap();
    let secret = cp.dir().join(SECRET);
    moto.write_credentials(&secret).unwrap();
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut command = Command::new(binaries::reconciler().unwrap());
    command
        .args(["-platform-type", "AWS"])
        .arg(format!("-platform-region={}", moto.region()))
        .arg(format!("-platform-api-url={}", proxy.url()))
        .arg("-platform-aws-ca-override=")
        .arg("-platform-azure-environment=")
        .args(["-secret-name", SECRET])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--secret-override")
        .arg(&secret)
        .arg(format!("--metrics-bind-address={metrics}"))
        .env("CONTROLLER_NAMESPACE", NAMESPACE)
        .env("CONTROLLER_NAME", ACCOUNT)
        .env("RELEASE_VERSION", "4.99.0-cloudnet-e2e")
        .env("RUST_LOG", "info");
    let log = cp.dir().join("reconciler-cno.log");
    let reconciler = Supervised::spawn("cloudnet-reconciler", command, &log).unwrap();

    let admin = cp.client().await.unwrap();
    let run = async {
        plugin::create_node(&admin, "cno-a", &instances[0]).await?;
        plugin::create_node(&admin, "cno-b", &instances[1]).await?;
        plugin::wait_annotation(&admin, "cno-a").await?;
        let ip = IpAddr::from(std::net::Ipv4Addr::from(
            u32::from(network.ipv4.network()) | (4 << 8) | 10,
        ));
        let name = ip.to_string();
        plugin::create(&admin, &name, "cno-a").await?;
        plugin::wait_assigned(&admin, &name, "cno-a").await?;
        anyhow::ensure!(addresses_of(&ec2, &instances[0].eni).await?.contains(&ip));
        plugin::retarget(&admin, &name, "cno-b").await?;
        plugin::wait_assigned(&admin, &name, "cno-b").await?;
        anyhow::ensure!(!addresses_of(&ec2, &instances[0].eni).await?.contains(&ip));
        anyhow::ensure!(addresses_of(&ec2, &instances[1].eni).await?.contains(&ip));
        plugin::delete(&admin, &name).await?;
        plugin::wait_gone(&admin, &name).await?;
        anyhow::ensure!(!addresses_of(&ec2, &instances[1].eni).await?.contains(&ip));
        Ok(())
    };
    if let Err(e) = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .unwrap()
    {
        panic!("{e:#}\n{}", reconciler.log_tail(60));
    }

    let refused: Vec<_> = proxy
        .all_counts()
        .into_iter()
        .filter(|(_, c)| c.unauthorized > 0)
        .collect();
    assert!(refused.is_empty(), "EC2 refused: {refused:?}");

    // Refusals in the log: the two optional permissions, once each, and nothing else.
    let text = std::fs::read_to_string(&log).unwrap();
    let refusals: Vec<&str> = text
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    let expected = ["Events are forbidden", "the lease cannot be watched"];
    let unexpected: Vec<&&str> = refusals
        .iter()
        .filter(|l| !expected.iter().any(|e| l.contains(e)))
        .collect();
    assert!(unexpected.is_empty(), "refusals: {unexpected:#?}");
    for e in expected {
        let count = refusals.iter().filter(|l| l.contains(e)).count();
        assert!(count <= 1, "{e:?} logged {count} times");
    }
    assert!(
        refusals.iter().any(|l| l.contains(expected[0])),
        "no Event was attempted: {refusals:#?}"
    );
}
