//! The egress gateway front end against a real kube-apiserver with the EgressGateway CRD and the
//! memory cloud, the reconciler in process beside it. The test plays the node agents: each
//! renews its heartbeat Lease while "alive", and labels its node once the gateway's IPs are
//! attached there (as `cloudnet-node` does after putting them on its interface).
//! A gateway is active on the first eligible node by name, fails over when that node's agent
//! falls silent or the node is cordoned, never flaps back, parks its IPs with no node eligible,
//! takes stale active labels off, and its IPs go with it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudnet_e2e::harness::e2e::metrics as e2e_metrics;
use cloudnet_reconciler::cloud::memory::Op;
use cloudnet_reconciler::frontend::OWNER_LABEL;
use cloudnet_reconciler::frontend::gateway::{self, Settings};
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::gateway::{EgressGateway, active_label, lease_name};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::support::*;

/// How long a step may take on a loaded machine (a failure bound).
const STEP: Duration = Duration::from_secs(30);
/// The Leases' namespace.
const LEASES: &str = "default";
/// The heartbeat timeout the front end runs with: fifty renewals of the agents this test plays,
/// more than the default (3 s), so that a loaded machine that holds up the agents' writes for
/// seconds never fails a node over by mistake (the exact call sequence below would show it).
const TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the gateway front end as a task.
fn front_end(client: &Client, metrics: &Arc<Metrics>) -> JoinHandle<()> {
    let reporter = Reporter {
        controller: "cloudnet-reconciler".into(),
        instance: Some("gateway-tests".into()),
    };
    tokio::spawn(gateway::run(
        client.clone(),
        reporter,
        Arc::clone(metrics),
        Settings {
            lease_namespace: LEASES.into(),
            heartbeat_timeout: TIMEOUT,
        },
        std::future::pending(),
    ))
}

/// The agents of the nodes in the set renew their Leases every 200 ms.
fn agents(client: &Client, alive: &Arc<Mutex<BTreeSet<String>>>) -> JoinHandle<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASES);
    let alive = Arc::clone(alive);
    tokio::spawn(async move {
        loop {
            let nodes: Vec<String> = alive.lock().unwrap().iter().cloned().collect();
            for node in nodes {
                let lease = Lease {
                    metadata: kube::api::ObjectMeta {
                        name: Some(lease_name(&node)),
                        namespace: Some(LEASES.into()),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(node.clone()),
                        lease_duration_seconds: Some(3),
                        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                        ..LeaseSpec::default()
                    }),
                };
                let _ = leases
                    .patch(
                        &lease_name(&node),
                        &PatchParams::apply("gateway-tests").force(),
                        &Patch::Apply(&lease),
                    )
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

async fn install_crd(client: &Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.create(&PostParams::default(), &cloudnet_shared::gateway::crd())
        .await
        .unwrap();
    wait_until(STEP, "the EgressGateway CRD served", || {
        let api = Api::<EgressGateway>::all(client.clone());
        async move { api.list(&ListParams::default().limit(1)).await.is_ok() }
    })
    .await;
}

/// A Node backed by a memory VM, labelled `role=gw`, Ready.
async fn gateway_node(
    client: &Client,
    cloud: &cloudnet_reconciler::cloud::memory::MemoryCloud,
    name: &str,
) {
    add_node(client, cloud, name, 10).await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"role": "gw"}}})),
        )
        .await
        .unwrap();
    set_ready(client, name, true).await;
}

async fn set_ready(client: &Client, name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    Api::<Node>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Ready", "status": status, "reason": "Test",
                "lastHeartbeatTime": "2026-11-29T00:00:00Z",
                "lastTransitionTime": "2026-11-29T00:00:00Z"
            }]}})),
        )
        .await
        .unwrap();
}

async fn create_gateway(client: &Client, name: &str, ips: &[&str]) {
    let gateway: EgressGateway = serde_json::from_value(json!({
        "apiVersion": "cloudnet.io/v1alpha1", "kind": "EgressGateway",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"role": "gw"}}, "egressIPs": ips},
    }))
    .unwrap();
    Api::<EgressGateway>::all(client.clone())
        .create(&PostParams::default(), &gateway)
        .await
        .unwrap();
}

/// The gateway's active node and Ready reason.
async fn gateway_state(client: &Client, name: &str) -> (String, String) {
    let gateway = Api::<EgressGateway>::all(client.clone())
        .get(name)
        .await
        .unwrap();
    (
        gateway.active_node().unwrap_or_default().to_owned(),
        gateway
            .ready_condition()
            .map(|c| c.reason.clone())
            .unwrap_or_default(),
    )
}

async fn wait_gateway(client: &Client, name: &str, node: &str, reason: &str) {
    wait_until(
        STEP,
        &format!("gateway {name} active on {node:?}, {reason}"),
        || async move { gateway_state(client, name).await == (node.to_owned(), reason.to_owned()) },
    )
    .await;
}

async fn labels_of(client: &Client, node: &str) -> std::collections::BTreeMap<String, String> {
    Api::<Node>::all(client.clone())
        .get(node)
        .await
        .unwrap()
        .labels()
        .clone()
}

/// Plays `node`'s agent: the active label of `gateway` on it.
async fn agent_labels(client: &Client, node: &str, gateway: &str) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {active_label(gateway): "active"}}})),
        )
        .await
        .unwrap();
}

async fn wait_unlabelled(client: &Client, node: &str, gateway: &str) {
    wait_until(
        STEP,
        &format!("{gateway}'s active label off {node}"),
        || async move {
            !labels_of(client, node)
                .await
                .contains_key(&active_label(gateway))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_fails_over_when_its_agent_falls_silent_or_its_node_is_cordoned_and_never_flaps_back()
 {
    let (_cp, client) = control_plane().await;
    install_crd(&client).await;
    let cloud = cloud(Duration::from_millis(20));
    for node in ["a", "b", "c"] {
        gateway_node(&client, &cloud, node).await;
    }
    let alive = Arc::new(Mutex::new(BTreeSet::from(["a".to_owned(), "b".to_owned()])));
    let _agents = agents(&client, &alive);
    let _reconciler = start(client.clone(), &cloud, engine_config());
    let metrics = Arc::new(Metrics::default());
    let _front = front_end(&client, &metrics);
    let ip = "10.0.0.70";
    create_gateway(&client, "web", &[ip]).await;

    // c has no agent: a, the first eligible by name.
    wait_assigned(&client, ip, "a").await;
    wait_gateway(&client, "web", "a", "Pending").await;
    let object = objects(&client).get(ip).await.unwrap();
    assert_eq!(
        object.labels().get(OWNER_LABEL).map(String::as_str),
        Some("egress-gateway")
    );
    agent_labels(&client, "a", "web").await;
    wait_gateway(&client, "web", "a", "Ready").await;
    // A label on a node that is not active (an old view) is taken off.
    agent_labels(&client, "b", "web").await;
    wait_unlabelled(&client, "b", "web").await;

    // a's agent falls silent: b within the timeout, a's label off.
    alive.lock().unwrap().remove("a");
    wait_assigned(&client, ip, "b").await;
    wait_gateway(&client, "web", "b", "Pending").await;
    wait_unlabelled(&client, "a", "web").await;
    agent_labels(&client, "b", "web").await;
    wait_gateway(&client, "web", "b", "Ready").await;
    let changed = events_about(&client, "web").await;
    assert!(
        changed
            .iter()
            .any(|(_, reason, note)| reason == "ActiveNodeChanged"
                && note.contains("a → b")
                && note.contains("has not renewed its Lease cloudnet-node-a")),
        "{changed:?}"
    );
    let exposition = metrics.exposition();
    assert!(
        exposition.contains("cloudnet_egress_gateway_failovers_total{gateway=\"web\"} 1"),
        "{exposition}"
    );
    // The failover's time is observed once the Ready status is written, after the test's read.
    wait_until(STEP, "the failover's time observed", || {
        let text = metrics.exposition();
        async move { text.contains("cloudnet_egress_gateway_failover_seconds_count 1") }
    })
    .await;

    // a comes back: eligible again, but b stays.
    alive.lock().unwrap().insert("a".into());
    wait_until(STEP, "a eligible again", || {
        let text = metrics.exposition();
        async move { text.contains("cloudnet_egress_gateway_eligible_nodes{gateway=\"web\"} 2") }
    })
    .await;
    assert_eq!(
        gateway_state(&client, "web").await.0,
        "b",
        "no flapping back"
    );
    // Every gateway metric the shipped dashboard queries has series now (the e2e tier's check of
    // the dashboard runs no gateway).
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cloudnet_e2e::crate_file(
            "../manifests/monitoring/base/dashboard.json",
        ))
        .unwrap(),
    )
    .unwrap();
    let exposition = metrics.exposition();
    let queried: Vec<String> = e2e_metrics::dashboard_metrics(&dashboard)
        .into_iter()
        .filter(|m| e2e_metrics::is_gateway_metric(m))
        .collect();
    assert!(queried.len() >= 4, "{queried:?}");
    for metric in &queried {
        assert!(
            e2e_metrics::exposes(&exposition, metric),
            "the dashboard queries {metric}, which the gateway front end does not expose"
        );
    }

    // b cordoned: back to a.
    Api::<Node>::all(client.clone())
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    wait_assigned(&client, ip, "a").await;
    wait_gateway(&client, "web", "a", "Pending").await;
    assert_eq!(
        calls_for(&cloud, ip),
        [
            (Op::Attach, "a".into()),
            (Op::Detach, "a".into()),
            (Op::Attach, "b".into()),
            (Op::Detach, "b".into()),
            (Op::Attach, "a".into()),
        ]
    );

    // The gateway deleted: its IP goes.
    Api::<EgressGateway>::all(client.clone())
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&client, ip).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_eligible_node_the_ip_is_parked_and_the_gateway_says_why() {
    let (_cp, client) = control_plane().await;
    install_crd(&client).await;
    let cloud = cloud(Duration::from_millis(20));
    gateway_node(&client, &cloud, "a").await;
    let alive = Arc::new(Mutex::new(BTreeSet::from(["a".to_owned()])));
    let _agents = agents(&client, &alive);
    let _reconciler = start(client.clone(), &cloud, engine_config());
    let _front = front_end(&client, &Arc::new(Metrics::default()));
    let ip = "10.0.0.71";
    create_gateway(&client, "db", &[ip]).await;
    wait_assigned(&client, ip, "a").await;

    set_ready(&client, "a", false).await;
    wait_gateway(&client, "db", "", "NoEligibleNode").await;
    wait_until(STEP, "the IP parked and detached from a", || {
        let detached = calls_for(&cloud, ip).last() == Some(&(Op::Detach, "a".into()));
        let client = client.clone();
        async move {
            detached
                && objects(&client)
                    .get(ip)
                    .await
                    .is_ok_and(|o| o.spec.node.is_empty())
        }
    })
    .await;
    // The Event follows the status write, which the park need not wait for.
    wait_until(STEP, "a NoEligibleNode Warning saying NotReady", || {
        let client = client.clone();
        async move {
            events_about(&client, "db")
                .await
                .iter()
                .any(|(kind, reason, note)| {
                    kind == "Warning" && reason == "NoEligibleNode" && note.contains("NotReady")
                })
        }
    })
    .await;

    set_ready(&client, "a", true).await;
    wait_assigned(&client, ip, "a").await;
}
