//! Shared helpers of the reconciler integration tests: a private control plane, the memory cloud,
//! the reconciler running in-process as a task, and condition waits with deadlines.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudnet_e2e::ControlPlane;
use cloudnet_reconciler::cloud::memory::{MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};
use cloudnet_reconciler::controller::EngineConfig;
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::{
    CloudPrivateIPConfig, CloudPrivateIPConfigSpec, EGRESS_IPCONFIG_ANNOTATION, decode_name,
};
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeSpec};
use k8s_openapi::api::events::v1::Event;
use kube::api::{
    DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

/// Fast retries so tests converge quickly.
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        backoff_base: Duration::from_millis(50),
        backoff_cap: Duration::from_millis(500),
        drift_period: Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// A memory cloud with `latency` per call.
pub fn cloud(latency: Duration) -> MemoryCloud {
    MemoryCloud::new(MemoryConfig {
        latency,
        ..MemoryConfig::default()
    })
}

/// Starts the reconciler as a task; abort the handle to kill it.
pub fn start(client: Client, cloud: &MemoryCloud, config: EngineConfig) -> JoinHandle<()> {
    // Logs of a failing test are shown with its output; RUST_LOG picks the level.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cloud = Arc::new(cloud.clone());
    tokio::spawn(cloudnet_reconciler::controller::run(
        client,
        cloud,
        config,
        Arc::new(Metrics::default()),
        "test".into(),
        std::future::pending(),
    ))
}

/// A private control plane with the CRD, and an admin client.
pub async fn control_plane() -> (ControlPlane, Client) {
    let cp = ControlPlane::start_with_crd().await.expect("control plane");
    let client = cp.client().await.expect("client");
    (cp, client)
}

/// Creates Node `name` backed by memory VM `name` (capacity `capacity`, primary `10.0.0.1`).
pub async fn add_node(client: &Client, cloud: &MemoryCloud, name: &str, capacity: i64) {
    cloud.add_vm(name, VmSpec::ipv4("10.0.0.1".parse().unwrap(), capacity));
    create_node_object(client, name).await;
}

/// Creates only the Node object (its VM must exist or be added separately).
pub async fn create_node_object(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id(name)),
            ..NodeSpec::default()
        }),
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

/// The objects API.
pub fn objects(client: &Client) -> Api<CloudPrivateIPConfig> {
    Api::all(client.clone())
}

/// Creates object `ip` aimed at `node`.
pub async fn create(client: &Client, ip: &str, node: &str) {
    let obj = CloudPrivateIPConfig::new(ip, CloudPrivateIPConfigSpec { node: node.into() });
    objects(client)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
}

/// Sets `spec.node` of object `ip`.
pub async fn retarget(client: &Client, ip: &str, node: &str) {
    objects(client)
        .patch(
            ip,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "node": node } })),
        )
        .await
        .unwrap();
}

/// Deletes object `ip`.
pub async fn delete(client: &Client, ip: &str) {
    objects(client)
        .delete(ip, &DeleteParams::default())
        .await
        .unwrap();
}

/// Polls `check` every 20 ms until it holds; panics with `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until object `ip` is assigned to `node` (spec = status = node, Assigned=True).
pub async fn wait_assigned(client: &Client, ip: &str, node: &str) {
    let api = objects(client);
    wait_until(
        Duration::from_secs(30),
        &format!("{ip} assigned to {node}"),
        || {
            let api = api.clone();
            async move {
                api.get_opt(ip)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|o| o.is_assigned() && o.spec.node == node)
            }
        },
    )
    .await;
}

/// Waits up to `bound` until object `ip` is Assigned to `node`, failing with `process`'s log
/// tail if it exits or the bound passes; returns how long it took.
pub async fn assigned_within(
    client: &Client,
    process: &mut cloudnet_e2e::harness::controlplane::Supervised,
    ip: &str,
    node: &str,
    bound: Duration,
) -> Duration {
    let start = Instant::now();
    let api = objects(client);
    loop {
        let done = api
            .get_opt(ip)
            .await
            .ok()
            .flatten()
            .is_some_and(|o| o.is_assigned() && o.spec.node == node);
        if done {
            return start.elapsed();
        }
        if let Some(status) = process.exited() {
            panic!("the reconciler exited: {status}\n{}", process.log_tail(40));
        }
        assert!(
            start.elapsed() < bound,
            "{ip} not Assigned to {node} within {bound:?}\n{}",
            process.log_tail(200)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until object `ip` no longer exists.
pub async fn wait_gone(client: &Client, ip: &str) {
    let api = objects(client);
    wait_until(Duration::from_secs(30), &format!("{ip} deleted"), || {
        let api = api.clone();
        async move { matches!(api.get_opt(ip).await, Ok(None)) }
    })
    .await;
}

/// The condition (status, reason, message) and status.node of object `ip`.
pub async fn condition(client: &Client, ip: &str) -> Option<(String, String, String, String)> {
    let obj = objects(client).get_opt(ip).await.ok().flatten()?;
    let c = obj.assigned_condition()?;
    Some((
        c.status.clone(),
        c.reason.clone(),
        c.message.clone(),
        obj.status_node().unwrap_or_default().to_owned(),
    ))
}

/// Makes object `ip` look as the upstream controller left it: our finalizer on, `status.node`
/// naming `node` with `Assigned=True`, and nothing in the ledger.
pub async fn adopt(client: &Client, ip: &str, node: &str) {
    cloudnet_e2e::harness::e2e::plugin::shape_as_upstream(client, ip, node)
        .await
        .unwrap();
}

/// The events.k8s.io Events about object `name`, as (type, reason, note).
pub async fn events_about(client: &Client, name: &str) -> Vec<(String, String, String)> {
    // Cluster-scoped objects get their Events in `default`.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// The mutating calls that carried `ip`, as (operation, instance).
pub fn calls_for(cloud: &MemoryCloud, ip: &str) -> Vec<(Op, String)> {
    let ip: IpAddr = decode_name(ip).unwrap();
    cloud
        .calls()
        .into_iter()
        .filter(|c| c.op.is_mutation() && c.ips.contains(&ip))
        .map(|c| (c.op, c.instance))
        .collect()
}

/// Waits until the memory cloud has seen a mutating call carrying `ip` (`what`: why it matters).
pub async fn wait_called(cloud: &MemoryCloud, ip: &str, what: &str) {
    wait_until(Duration::from_secs(30), what, || {
        std::future::ready(!calls_for(cloud, ip).is_empty())
    })
    .await;
}

/// Asserts the memory cloud never saw an IP on two VMs or overlapping calls on one VM.
pub fn assert_no_violations(cloud: &MemoryCloud) {
    assert!(
        cloud.violations().is_empty(),
        "cloud invariant violated: {:?}",
        cloud.violations()
    );
}

/// Waits until node `name`'s egress annotation contains `fragment`.
pub async fn wait_annotation(client: &Client, name: &str, fragment: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until(
        Duration::from_secs(30),
        &format!("node {name} annotated with {fragment}"),
        || {
            let nodes = nodes.clone();
            async move {
                nodes
                    .get(name)
                    .await
                    .ok()
                    .and_then(|n| n.annotations().get(EGRESS_IPCONFIG_ANNOTATION).cloned())
                    .is_some_and(|a| a.contains(fragment))
            }
        },
    )
    .await;
}

/// Where the attachment ledger (its ConfigMaps in `default`, the tests' controller namespace)
/// records object `ip`: (instance, node) for each page naming it.
pub async fn ledger_entries(client: &Client, ip: &str) -> Vec<(String, String)> {
    use cloudnet_reconciler::engine::ledger::{INSTANCE_ANNOTATION, LABEL};
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    configmaps
        .list(&ListParams::default().labels(LABEL))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| {
            let node = cm.data.as_ref()?.get(ip)?.clone();
            let instance = cm.annotations().get(INSTANCE_ANNOTATION)?.clone();
            Some((instance, node))
        })
        .collect()
}

/// Removes every finalizer from object `ip` and deletes it: what an admin forcing a stuck
/// object out does, and what kube-apiserver's delete race (kubernetes/kubernetes#77988) leaves.
/// The running reconciler puts its finalizer back on an object that is not deleting, and would
/// then detach the IP itself: the delete is conditional on the version without the finalizer,
/// and both are tried again when the finalizer came back first.
pub async fn force_delete(client: &Client, ip: &str) {
    let api = objects(client);
    for _ in 0..100 {
        let patched = api
            .patch(
                ip,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
            )
            .await
            .unwrap();
        let unchanged = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: patched.resource_version(),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(ip, &unchanged).await {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => panic!("deleting {ip}: {e}"),
        }
    }
    panic!("{ip}: the finalizer came back before each of 100 deletes");
}
