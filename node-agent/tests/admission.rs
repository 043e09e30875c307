//! The agent's manifests against a real kube-apiserver: kubectl applies them, and with a token bound to a pod on node-a (as the kubelet
//! mounts one) the agent's ServiceAccount may write node-a's egress-gateway labels and the Lease
//! `cloudnet-node-node-a`, and nothing else: not another label, not an annotation, not another
//! node, not another node's Lease, not with a token bound to no node. (The policy's type-check
//! report is written by kube-controller-manager, which this control plane does not run; an
//! expression that failed would refuse the allowed writes too, under `failurePolicy: Fail`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cloudnet_e2e::harness::controlplane::{ControlPlane, bound_token};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

const NAMESPACE: &str = "cloudnet-system";
const ACCOUNT: &str = "cloudnet-node";

fn manifests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/node-agent")
}

async fn create<K>(api: &Api<K>, value: serde_json::Value) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

/// A token of the agent's ServiceAccount bound to `pod`, as the kubelet's projected volume holds.
async fn pod_token(admin: &Client, pod: &Pod) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create_token_request(ACCOUNT, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .unwrap()
}

/// A client of `cp` authenticated by `token` alone.
async fn client_with(cp: &ControlPlane, token: &str, name: &str) -> Client {
    let ca = cp.dir().join(format!("{name}-ca.pem"));
    std::fs::write(&ca, cp.ca_pem()).unwrap();
    let kubeconfig = format!(
        "apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: '{server}', certificate-authority: '{ca}'}}}}]
users: [{{name: u, user: {{token: '{token}'}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
",
        server = cp.server_url(),
        ca = ca.display(),
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

async fn patch_labels(
    client: &Client,
    node: &str,
    labels: serde_json::Value,
) -> kube::Result<Node> {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": labels}})),
        )
        .await
}

async fn beat(client: &Client, node: &str) -> kube::Result<()> {
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": format!("cloudnet-node-{node}"), "namespace": NAMESPACE},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 3},
    });
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), NAMESPACE)
        .patch(
            &format!("cloudnet-node-{node}"),
            &PatchParams::apply("cloudnet-node").force(),
            &Patch::Apply(&lease),
        )
        .await
        .map(|_| ())
}

fn denied<T: std::fmt::Debug>(outcome: kube::Result<T>, what: &str) {
    match outcome {
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn the_agent_writes_only_its_own_nodes_labels_and_lease() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client().await.unwrap();
    create(
        &Api::<Namespace>::all(admin.clone()),
        serde_json::json!({"metadata": {"name": NAMESPACE}}),
    )
    .await;
    cp.run_kubectl([
        OsStr::new("apply"),
        OsStr::new("-k"),
        manifests().as_os_str(),
    ])
    .unwrap();

    for node in ["node-a", "node-b"] {
        create(
            &Api::<Node>::all(admin.clone()),
            serde_json::json!({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}),
        )
        .await;
    }
    let pod = create(
        &Api::<Pod>::namespaced(admin.clone(), NAMESPACE),
        serde_json::json!({
            "metadata": {"name": "cloudnet-node-a"},
            "spec": {
                "nodeName": "node-a", "serviceAccountName": ACCOUNT,
                "containers": [{"name": "agent", "image": "quay.io/cloudnet/cloudnet-node:0.1.0"}],
            },
        }),
    )
    .await;
    let agent = client_with(&cp, &pod_token(&admin, &pod).await, "agent").await;

    // RBAC and the policy come into force shortly after the apply: the agent may label its own
    // node, and not another.
    let deadline = Instant::now() + Duration::from_secs(30);
    let web =
        |value: serde_json::Value| serde_json::json!({"egress-gateway.cloudnet.io/web": value});
    loop {
        let own = patch_labels(&agent, "node-a", web("active".into()))
            .await
            .is_ok();
        let other = patch_labels(&agent, "node-b", web("active".into()))
            .await
            .is_ok();
        if other {
            patch_labels(&admin, "node-b", web(serde_json::Value::Null))
                .await
                .unwrap();
        }
        if own && !other {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "RBAC and the policy never came into force"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let labelled = patch_labels(
        &agent,
        "node-a",
        serde_json::json!({"egress-gateway.cloudnet.io/web": "active"}),
    )
    .await
    .unwrap();
    assert_eq!(
        labelled.metadata.labels.unwrap()["egress-gateway.cloudnet.io/web"],
        "active"
    );
    patch_labels(
        &agent,
        "node-a",
        serde_json::json!({"egress-gateway.cloudnet.io/web": null}),
    )
    .await
    .unwrap();
    beat(&agent, "node-a").await.unwrap();
    beat(&agent, "node-a").await.unwrap();

    denied(
        patch_labels(
            &agent,
            "node-a",
            serde_json::json!({"node-role.kubernetes.io/gateway": ""}),
        )
        .await,
        "another label",
    );
    denied(
        patch_labels(
            &agent,
            "node-a",
            serde_json::json!({"kubernetes.io/hostname": null}),
        )
        .await,
        "removing another label",
    );
    denied(
        Api::<Node>::all(agent.clone())
            .patch(
                "node-a",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"a": "b"}}})),
            )
            .await,
        "an annotation",
    );
    denied(
        Api::<Node>::all(agent.clone())
            .patch(
                "node-a",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
            )
            .await,
        "the spec",
    );
    denied(
        patch_labels(
            &agent,
            "node-b",
            serde_json::json!({"egress-gateway.cloudnet.io/web": "active"}),
        )
        .await,
        "another node",
    );
    denied(beat(&agent, "node-b").await, "another node's Lease");

    // A token bound to no pod names no node.
    let unbound = bound_token(&admin, NAMESPACE, ACCOUNT, "unbound-holder", 600)
        .await
        .unwrap();
    let unbound = client_with(&cp, &unbound, "unbound").await;
    denied(beat(&unbound, "node-a").await, "a token of no node");
}
