//! EgressPublicIP's CRD and who may write it, on a real kube-apiserver: the generated manifest
//! installs and is served with its status subresource and its bounds; no object cloudnet ships
//! (kustomize or any chart rendering) grants a write on `egresspublicips` but the reconciler's
//! patch of their finalizer and status, so by default only cluster admins write bindings; the
//! webhook's account lists and watches them (docs/public-ips.md, "Who may write it"); the CRD
//! itself keeps spec immutable, with no webhook answering.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::helm::Helm;
use cloudnet_shared::public_ip::{
    EgressPublicIP, EgressPublicIPSpec, EgressPublicIPStatus, SPEC_IMMUTABLE,
};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

fn binding(name: &str, private_ip: &str) -> EgressPublicIP {
    EgressPublicIP::new(
        name,
        EgressPublicIPSpec {
            private_ip: private_ip.into(),
            public_ip: "eipalloc-0123456789abcdef0".into(),
        },
    )
}

/// Waits until `user` may `verb` bindings (the authorizer's informers hold the grant).
async fn granted_once(client: &kube::Client, user: &str, verb: &str, subresource: Option<&str>) {
    let what = format!("{user} allowed to {verb} egresspublicips {subresource:?}");
    crate::support::wait_until(std::time::Duration::from_secs(30), &what, || {
        allowed(client, user, verb, subresource)
    })
    .await;
}

/// Whether `user` (a ServiceAccount's, or a plain authenticated user) may `verb` bindings.
async fn allowed(client: &kube::Client, user: &str, verb: &str, subresource: Option<&str>) -> bool {
    let groups = match user.strip_prefix("system:serviceaccount:") {
        Some(account) => {
            let namespace = account.split(':').next().unwrap();
            vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_owned(),
            ]
        }
        None => vec!["system:authenticated".to_owned()],
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(groups),
            resource_attributes: Some(ResourceAttributes {
                group: Some("cloudnet.io".into()),
                resource: Some("egresspublicips".into()),
                subresource: subresource.map(str::to_owned),
                verb: Some(verb.into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

#[tokio::test]
async fn the_crd_is_served_and_only_cluster_admins_may_write_bindings() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let kubectl = |args: &[&str], path: &str| {
        let path = cloudnet_e2e::crate_file(path);
        cp.run_kubectl(args.iter().map(OsStr::new).chain([path.as_os_str()]))
            .unwrap()
    };
    kubectl(&["apply", "-f"], "../manifests/public-ips/");
    cp.run_kubectl(
        [
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/egresspublicips.cloudnet.io",
        ]
        .map(OsStr::new),
    )
    .unwrap();
    // The webhook's account and roles, not its registration: no webhook serves here.
    kubectl(&["apply", "-f"], "../manifests/webhook/namespace.yaml");
    kubectl(&["apply", "-f"], "../manifests/webhook/rbac.yaml");
    kubectl(&["apply", "-k"], "../manifests/reconciler/overlays/aws");

    // Served as the types say, status a subresource of its own.
    let client = cp.client().await.unwrap();
    let api = Api::<EgressPublicIP>::all(client.clone());
    let created = api
        .create(&PostParams::default(), &binding("partner-a", "10.0.0.5"))
        .await
        .unwrap();
    assert_eq!(created.spec.private_ip, "10.0.0.5");
    let status = json!({"status": EgressPublicIPStatus {
        node: "worker-a".into(),
        interface: "eni-0a1b2c3d".into(),
        conditions: Vec::new(),
        observed_generation: created.metadata.generation,
        ..EgressPublicIPStatus::default()
    }});
    let written = api
        .patch_status("partner-a", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(written.status.unwrap().node, "worker-a");
    assert_eq!(
        written.spec, created.spec,
        "a status write leaves spec alone"
    );
    let oversized = api
        .create(
            &PostParams::default(),
            &binding("partner-b", &"1".repeat(40)),
        )
        .await
        .unwrap_err();
    assert!(
        oversized.to_string().contains("spec.privateIP"),
        "the schema bounds privateIP: {oversized}"
    );
    let table = cp
        .run_kubectl(["get", "egresspublicips", "-o", "wide"].map(OsStr::new))
        .unwrap();
    let table = String::from_utf8(table).unwrap();
    for column in ["PRIVATE", "PUBLIC", "NODE", "ASSOCIATED", "REASON"] {
        assert!(table.contains(column), "{table}");
    }

    let webhook = "system:serviceaccount:cloudnet:cloudnet-webhook";
    let reconciler = "system:serviceaccount:cloudnet-system:cloudnet-reconciler";
    // kube-apiserver's authorizer learns roles and bindings through its informers, a moment
    // after they are applied: a grant is waited for; a refusal is asked once the grants are seen.
    for verb in ["list", "watch"] {
        granted_once(&client, webhook, verb, None).await;
    }
    for user in [webhook, "alice"] {
        for verb in WRITES {
            assert!(!allowed(&client, user, verb, None).await, "{user} {verb}");
        }
        for verb in ["update", "patch"] {
            assert!(
                !allowed(&client, user, verb, Some("status")).await,
                "{user} {verb} status"
            );
        }
    }
    // The reconciler's controller watches bindings, patches their finalizer (the webhook keeps
    // spec immutable) and their status, and neither creates, replaces nor deletes one.
    for (verb, subresource, granted) in [
        ("list", None, true),
        ("watch", None, true),
        ("patch", None, true),
        ("patch", Some("status"), true),
        ("update", Some("status"), false),
        ("create", None, false),
        ("update", None, false),
        ("delete", None, false),
        ("deletecollection", None, false),
    ] {
        if granted {
            granted_once(&client, reconciler, verb, subresource).await;
        } else {
            assert!(
                !allowed(&client, reconciler, verb, subresource).await,
                "reconciler {verb} {subresource:?}"
            );
        }
    }
}

/// Issue 52: kube-apiserver itself refuses a change of a binding's spec, by the CRD's rule, with
/// no webhook registered (as when the webhook is down or not installed); status, labels and
/// finalizers still change, and so does nothing else.
#[tokio::test]
async fn without_a_webhook_kube_apiserver_refuses_a_spec_change_and_takes_status_and_metadata() {
    let cp = ControlPlane::shared().await.unwrap();
    let manifest = cloudnet_e2e::crate_file("../manifests/public-ips/");
    cp.run_kubectl([OsStr::new("apply"), OsStr::new("-f"), manifest.as_os_str()])
        .unwrap();
    cp.run_kubectl(
        [
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/egresspublicips.cloudnet.io",
        ]
        .map(OsStr::new),
    )
    .unwrap();
    let api = Api::<EgressPublicIP>::all(cp.client().await.unwrap());
    let name = "immutable-spec";
    let created = api
        .create(&PostParams::default(), &binding(name, "10.0.0.6"))
        .await
        .unwrap();

    let refused = |answer: Result<EgressPublicIP, kube::Error>, what: &str| match answer {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{what}: {status:?}");
            assert!(
                status.message.contains(SPEC_IMMUTABLE),
                "{what}: {status:?}"
            );
        }
        other => panic!("{what}: a spec change went through: {other:?}"),
    };
    let patched = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"privateIP": "10.0.0.7"}})),
        )
        .await;
    refused(patched, "a patch of spec.privateIP");
    let mut replaced = created.clone();
    replaced.spec.public_ip = "eipalloc-0123456789abcdef1".into();
    refused(
        api.replace(name, &PostParams::default(), &replaced).await,
        "a replace with another spec.publicIP",
    );

    // What the reconciler and an admin write beside spec goes through.
    let finalizer = "cloudnet.io/egress-public-ip";
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}, "finalizers": [finalizer]}})),
    )
    .await
    .unwrap();
    let status = json!({"status": EgressPublicIPStatus {
        node: "worker-a".into(),
        association_id: "eipassoc-0a1b2c3d".into(),
        ..EgressPublicIPStatus::default()
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let mut same_spec = api.get(name).await.unwrap();
    same_spec
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("team".into(), "b".into());
    api.replace(name, &PostParams::default(), &same_spec)
        .await
        .unwrap();
    let now = api.get(name).await.unwrap();
    assert_eq!(now.spec, created.spec);
    assert_eq!(now.status.unwrap().node, "worker-a");
    assert_eq!(now.metadata.labels.unwrap()["team"], "b");

    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    api.delete(name, &Default::default()).await.unwrap();
}

/// Every rule of a Role or ClusterRole in `objects` that lets its subject write bindings, but
/// the reconciler's `patch` (its finalizer and status; the webhook keeps spec immutable).
fn writes_to_bindings(objects: &[Value]) -> Vec<String> {
    let covers = |list: &Value, want: &[&str]| {
        list.as_array()
            .is_some_and(|l| l.iter().any(|v| want.iter().any(|w| v == *w)))
    };
    objects
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("Role" | "ClusterRole")))
        .flat_map(|o| {
            o["rules"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |rule| (o["metadata"]["name"].clone(), rule))
        })
        .filter(|(name, rule)| {
            let reconcilers = name.as_str() == Some("cloudnet-reconciler");
            let writes: Vec<&str> = WRITES
                .iter()
                .copied()
                .chain(["*"])
                .filter(|verb| !(reconcilers && *verb == "patch"))
                .collect();
            covers(&rule["apiGroups"], &["cloudnet.io", "*"])
                && covers(
                    &rule["resources"],
                    &["egresspublicips", "egresspublicips/status", "*"],
                )
                && covers(&rule["verbs"], &writes)
        })
        .map(|(name, rule)| format!("{name}: {rule}"))
        .collect()
}

#[test]
fn no_shipped_role_grants_a_write_on_bindings() {
    let helm = Helm::locate().unwrap();
    for set in [
        &[][..],
        &["openshift.enabled=true"][..],
        &["cloud=Azure", "webhook.certManager.enabled=true"][..],
    ] {
        let objects = helm.template(set).unwrap();
        assert!(
            objects.iter().any(|o| o["kind"] == "ClusterRole"),
            "{set:?} renders roles"
        );
        assert_eq!(
            writes_to_bindings(&objects),
            Vec::<String>::new(),
            "{set:?}"
        );
    }
    // The check itself finds a grant.
    let granted = json!({"kind": "ClusterRole", "metadata": {"name": "x"}, "rules": [
        {"apiGroups": ["cloudnet.io"], "resources": ["egresspublicips"], "verbs": ["get", "patch"]}
    ]});
    assert_eq!(writes_to_bindings(&[granted]).len(), 1);
    let reconciler = json!({"kind": "ClusterRole", "metadata": {"name": "cloudnet-reconciler"}, "rules": [
        {"apiGroups": ["cloudnet.io"], "resources": ["egresspublicips"], "verbs": ["patch"]},
        {"apiGroups": ["cloudnet.io"], "resources": ["egresspublicips"], "verbs": ["patch", "delete"]}
    ]});
    assert_eq!(writes_to_bindings(&[reconciler]).len(), 1);
}
