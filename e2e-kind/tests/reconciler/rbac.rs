//! What the shipped roles grant the reconciler's ServiceAccount, as kube-apiserver itself reports
//! it to a token of that account (SelfSubjectRulesReview), is exactly what the code uses
//! (`cloudnet_reconciler::rbac::PERMISSIONS`): a permission missing or extra fails here. The
//! by-name grants really admit the field-selected lists and watches the code makes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::e2e::local::{self, NAMESPACE, RECONCILER_ACCOUNT};
use cloudnet_reconciler::controller::EVENT_NAMESPACE;
use cloudnet_reconciler::leader::LEASE_NAME;
use cloudnet_reconciler::rbac::{
    ANTREA_PERMISSIONS, GATEWAY_PERMISSIONS, PERMISSIONS, Permission, Scope,
};
use k8s_openapi::api::authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The Secret and ConfigMap names the manifests pass in `--secret-name` and `--config-name`.
const SECRET: &str = "cloud-credentials";
const CONFIG: &str = "kube-cloud-config";

/// API groups every authenticated user may use on itself (system:basic-user and friends).
const SELF_REVIEW_GROUPS: [&str; 2] = ["authorization.k8s.io", "authentication.k8s.io"];

type Grant = (String, String, String, Vec<String>);

async fn client_of(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

async fn granted(client: &Client, namespace: &str) -> BTreeSet<Grant> {
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.to_owned()),
        },
        ..SelfSubjectRulesReview::default()
    };
    let review = Api::<SelfSubjectRulesReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let status = review.status.unwrap();
    assert!(!status.incomplete, "{status:?}");
    let mut out = BTreeSet::new();
    for rule in status.resource_rules {
        for group in rule.api_groups.iter().flatten() {
            if SELF_REVIEW_GROUPS.contains(&group.as_str()) {
                continue;
            }
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    let mut names = rule.resource_names.clone().unwrap_or_default();
                    names.sort();
                    out.insert((group.clone(), resource.clone(), verb.clone(), names));
                }
            }
        }
    }
    out
}

/// What the account is granted in `namespace` once it holds at least `expected`: kube-apiserver's
/// authorizer learns roles and bindings through its informers, a moment after they are applied.
/// The caller compares it with `expected` exactly, so a grant missing for 30 s or one too many
/// fails.
async fn granted_once(
    client: &Client,
    namespace: &str,
    expected: &BTreeSet<Grant>,
) -> BTreeSet<Grant> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = granted(client, namespace).await;
        if got.is_superset(expected) || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn used(scopes: &[Scope]) -> BTreeSet<Grant> {
    used_of(PERMISSIONS, scopes)
}

fn used_of(permissions: &[Permission], scopes: &[Scope]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for p in permissions.iter().filter(|p| scopes.contains(&p.scope)) {
        let names = match (p.by_name, p.resource) {
            (false, _) => vec![],
            (true, "leases") => vec![LEASE_NAME.to_owned()],
            (true, "secrets") => vec![SECRET.to_owned()],
            (true, other) => panic!("no name known for {other}"),
        };
        for verb in p.verbs {
            out.insert((
                p.group.to_owned(),
                p.resource.to_owned(),
                (*verb).to_owned(),
                names.clone(),
            ));
        }
    }
    out
}

/// A client holding a token of the reconciler's ServiceAccount on `cp`, once the shipped roles
/// (and those of `more`, e.g. a front end's component) are applied.
async fn reconciler_client(
    cp: &ControlPlane,
    more: fn(&ControlPlane) -> anyhow::Result<()>,
) -> Client {
    local::apply_rbac(cp).unwrap();
    more(cp).unwrap();
    let admin = cp.client().await.unwrap();
    let path = local::service_account_kubeconfig(cp, &admin, NAMESPACE, RECONCILER_ACCOUNT)
        .await
        .unwrap();
    client_of(&path).await
}

#[tokio::test]
async fn the_reconcilers_account_may_do_exactly_what_its_code_does() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let client = reconciler_client(&cp, |_| Ok(())).await;

    for (namespace, scopes) in [
        (NAMESPACE, &[Scope::Cluster, Scope::ControllerNamespace][..]),
        (EVENT_NAMESPACE, &[Scope::Cluster, Scope::Events][..]),
        ("kube-public", &[Scope::Cluster][..]),
    ] {
        let expected = used(scopes);
        assert_eq!(
            granted_once(&client, namespace, &expected).await,
            expected,
            "{namespace}"
        );
    }

    // Granted by name, a list (and so the watch after it) selecting that name is allowed, and
    // one that does not select it is refused.
    let by_name = |name: &str| ListParams::default().fields(&format!("metadata.name={name}"));
    let forbidden = |e: kube::Error| matches!(e, kube::Error::Api(s) if s.code == 403);
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    secrets.list(&by_name(SECRET)).await.unwrap();
    assert!(forbidden(
        secrets.list(&ListParams::default()).await.unwrap_err()
    ));
    assert!(forbidden(
        secrets.list(&by_name("other")).await.unwrap_err()
    ));
    // The attachment ledger's ConfigMaps: listed, created and patched by any name there, and
    // never deleted; nowhere else.
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE);
    configmaps.list(&by_name(CONFIG)).await.unwrap();
    configmaps.list(&ListParams::default()).await.unwrap();
    let page = ConfigMap {
        metadata: ObjectMeta {
            name: Some("cloudnet-ledger-rbac".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    configmaps
        .create(&PostParams::default(), &page)
        .await
        .unwrap();
    assert!(forbidden(
        configmaps
            .delete("cloudnet-ledger-rbac", &DeleteParams::default())
            .await
            .unwrap_err()
    ));
    let elsewhere = Api::<ConfigMap>::namespaced(client.clone(), "kube-public");
    assert!(forbidden(
        elsewhere.list(&ListParams::default()).await.unwrap_err()
    ));
    let leases = Api::<Lease>::namespaced(client, NAMESPACE);
    leases.list(&by_name(LEASE_NAME)).await.unwrap();
    assert!(forbidden(
        leases.list(&ListParams::default()).await.unwrap_err()
    ));
    // The watches that follow those lists are authorized the same way.
    let watch_by_name =
        |name: &str| WatchParams::default().fields(&format!("metadata.name={name}"));
    drop(secrets.watch(&watch_by_name(SECRET), "0").await.unwrap());
    drop(leases.watch(&watch_by_name(LEASE_NAME), "0").await.unwrap());
    let unselected = secrets.watch(&WatchParams::default(), "0").await;
    assert!(forbidden(unselected.err().unwrap()));
}

#[tokio::test]
async fn the_antrea_component_adds_exactly_what_the_antrea_front_end_uses() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let client = reconciler_client(&cp, local::apply_antrea_rbac).await;
    for (namespace, scopes) in [
        (NAMESPACE, &[Scope::Cluster, Scope::ControllerNamespace][..]),
        (EVENT_NAMESPACE, &[Scope::Cluster, Scope::Events][..]),
    ] {
        let mut expected = used(scopes);
        expected.extend(used_of(ANTREA_PERMISSIONS, scopes));
        assert_eq!(
            granted_once(&client, namespace, &expected).await,
            expected,
            "{namespace}"
        );
    }
}

#[tokio::test]
async fn the_egress_gateway_component_adds_exactly_what_the_gateway_front_end_uses() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let client = reconciler_client(&cp, local::apply_gateway_rbac).await;
    for (namespace, scopes) in [
        (NAMESPACE, &[Scope::Cluster, Scope::ControllerNamespace][..]),
        (EVENT_NAMESPACE, &[Scope::Cluster, Scope::Events][..]),
    ] {
        let mut expected = used(scopes);
        expected.extend(used_of(GATEWAY_PERMISSIONS, scopes));
        assert_eq!(
            granted_once(&client, namespace, &expected).await,
            expected,
            "{namespace}"
        );
    }
}
