//! The whole agent (heartbeat, watches, labeller, address loop) against a real kube-apiserver,
//! its netlink in a network namespace of the test's (veth pair, IPv4 and IPv6). The test plays
//! the reconciler: it writes the gateway's `status.activeNode` and the CloudPrivateIPConfigs'
//! status as the leader and the attach path would.
//!
//! Here rather than in the e2e crate's reconciler tier: the agent is a crate of its own, and the
//! tier's binary would otherwise link the agent's netlink stack into every reconciler test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudnet_e2e::harness::controlplane::{ControlPlane, FIELD_MANAGER};
use cloudnet_node::endpoint::Health;
use cloudnet_node::metrics::Metrics;
use cloudnet_node::netlink::Netlink;
use cloudnet_node::{Settings, run};
use cloudnet_shared::CloudPrivateIPConfig;
use cloudnet_shared::gateway::EgressGateway;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};
use support::{Netns, add_marked, addresses, has_marked, link_index, with_netns};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a step may take on a loaded machine (a failure bound).
const STEP: Duration = Duration::from_secs(30);
const NAMESPACE: &str = "cloudnet-system";
const ME: &str = "node-a";
const LABEL: &str = "egress-gateway.cloudnet.io/web";
const V6_NAME: &str = "fd00.0000.0000.0000.0000.0000.0000.0005";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + STEP;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn apply_gateway_crd(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = cloudnet_shared::gateway::crd();
    let name = crd.metadata.name.clone().unwrap();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        STEP,
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .unwrap()
    .unwrap();
}

async fn create<K>(api: &Api<K>, value: serde_json::Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

async fn set_active(client: &Client, node: &str) {
    Api::<EgressGateway>::all(client.clone())
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"activeNode": node}})),
        )
        .await
        .unwrap();
}

/// Writes the objects' status as the reconciler's attach path does.
async fn set_assigned(client: &Client, status: &str, reason: &str) {
    let api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    for name in ["10.0.0.5", V6_NAME] {
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {
                "node": ME,
                "conditions": [{
                    "type": "Assigned", "status": status, "reason": reason, "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1,
                }],
            }})),
        )
        .await
        .unwrap();
    }
}

async fn label(client: &Client) -> Option<String> {
    let node = Api::<Node>::all(client.clone()).get(ME).await.unwrap();
    node.metadata.labels?.get(LABEL).cloned()
}

async fn renew_time(client: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get_opt("cloudnet-node-node-a")
        .await
        .unwrap()?;
    let spec = lease.spec?;
    assert_eq!(spec.holder_identity.as_deref(), Some(ME));
    assert_eq!(spec.lease_duration_seconds, Some(3));
    Some(serde_json::to_string(&spec.renew_time?).unwrap())
}

/// Waits for two renewals of the heartbeat Lease after now: the agent runs, and has had a
/// resync period at least since.
async fn two_heartbeats(client: &Client) {
    let deadline = Instant::now() + STEP;
    let mut last = renew_time(client).await;
    let mut renewals = 0;
    while renewals < 2 {
        assert!(
            Instant::now() < deadline,
            "the heartbeat was not renewed twice"
        );
        let now = renew_time(client).await;
        if now.is_some() && now != last {
            renewals += 1;
            last = now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Agent {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    health: Arc<Health>,
}

impl Agent {
    async fn start(netns: &Netns, cp: &ControlPlane) -> Self {
        let netlink = netns.inside(|| Netlink::connect().unwrap());
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(cp.kubeconfig_path()).unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        let client =
            cloudnet_kubeclient::client(config, &cloudnet_kubeclient::Liveness::default()).unwrap();
        let settings = Settings {
            node: ME.into(),
            lease_namespace: NAMESPACE.into(),
            heartbeat_interval: Duration::from_millis(500),
            lease_duration_seconds: 3,
            interface: None,
        };
        let (stop, stopped) = oneshot::channel();
        let health = Arc::new(Health::default());
        let task = tokio::spawn(run(
            client,
            netlink,
            settings,
            Arc::new(Metrics::default()),
            Arc::clone(&health),
            async move {
                let _ = stopped.await;
            },
        ));
        let task = tokio::spawn(async move { task.await.unwrap().unwrap() });
        Self { stop, task, health }
    }

    /// Stops it as SIGTERM does.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap();
    }
}

#[test]
fn the_agent_puts_the_ips_on_after_the_cloud_and_labels_after_the_interface() {
    with_netns(|netns, handle| async move {
        let cp = ControlPlane::start_with_crd().await.unwrap();
        let admin = cp.client().await.unwrap();
        apply_gateway_crd(&admin).await;
        create(
            &Api::<Namespace>::all(admin.clone()),
            serde_json::json!({"metadata": {"name": NAMESPACE}}),
        )
        .await;
        let annotation = r#"[{"interface":"eni-0","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd00::/64"},"capacity":{"ip":10}}]"#;
        for node in [ME, "node-b"] {
            create(
                &Api::<Node>::all(admin.clone()),
                serde_json::json!({"metadata": {"name": node, "annotations": {
                    "cloud.network.openshift.io/egress-ipconfig": annotation,
                }}}),
            )
            .await;
        }
        create(
            &Api::<EgressGateway>::all(admin.clone()),
            serde_json::json!({
                "apiVersion": "cloudnet.io/v1alpha1", "kind": "EgressGateway",
                "metadata": {"name": "web"},
                "spec": {"nodeSelector": {}, "egressIPs": ["10.0.0.5", "fd00::5"]},
            }),
        )
        .await;
        set_active(&admin, ME).await;
        for name in ["10.0.0.5", V6_NAME] {
            create(
                &Api::<CloudPrivateIPConfig>::all(admin.clone()),
                serde_json::json!({
                    "apiVersion": "cloud.network.openshift.io/v1", "kind": "CloudPrivateIPConfig",
                    "metadata": {"name": name, "labels": {"cloudnet.io/front-end": "egress-gateway"}},
                    "spec": {"node": ME},
                }),
            )
            .await;
        }
        set_assigned(&admin, "Unknown", "CloudResponsePending").await;
        let veth0 = link_index(&handle, "veth0").await;
        let both = |now: &[cloudnet_node::plan::HostAddress]| {
            has_marked(now, veth0, ip("10.0.0.5")) && has_marked(now, veth0, ip("fd00::5"))
        };

        // The cloud has not attached the IPs yet: the agent beats, and adds nothing.
        let agent = Agent::start(&netns, &cp).await;
        wait_until("the caches listed", || async { agent.health.ready() }).await;
        two_heartbeats(&admin).await;
        let now = addresses(&handle).await;
        assert!(!now.iter().any(|a| a.ours), "{now:?}");
        assert_eq!(label(&admin).await, None);

        // Attached: the addresses, then the label.
        set_assigned(&admin, "True", "CloudResponseSuccess").await;
        wait_until("the label", || async {
            let labelled = label(&admin).await.as_deref() == Some("active");
            if labelled {
                let now = addresses(&handle).await;
                assert!(both(&now), "labelled before the addresses were on: {now:?}");
            }
            labelled
        })
        .await;

        // Stopped as by SIGTERM: nothing is taken away.
        agent.stop().await;
        assert!(both(&addresses(&handle).await));
        assert_eq!(label(&admin).await.as_deref(), Some("active"));

        // Restarted with a stale address of an earlier run: converges from the API alone.
        add_marked(&handle, veth0, ip("10.0.0.77")).await;
        let agent = Agent::start(&netns, &cp).await;
        wait_until("the stale address removed", || async {
            let now = addresses(&handle).await;
            !now.iter().any(|a| a.ip == ip("10.0.0.77"))
        })
        .await;
        assert!(both(&addresses(&handle).await));

        // Moved to another node: the label and the addresses go.
        set_active(&admin, "node-b").await;
        wait_until("the addresses removed", || async {
            let now = addresses(&handle).await;
            !now.iter().any(|a| a.ours)
        })
        .await;
        wait_until("the label removed", || async {
            label(&admin).await.is_none()
        })
        .await;
        let now = addresses(&handle).await;
        assert!(
            now.iter().any(|a| a.ip == ip("10.0.0.10")),
            "the node's own address stays: {now:?}"
        );
        agent.stop().await;
    });
}
