//! The Antrea front end against a real kube-apiserver with Antrea's CRDs and the memory cloud,
//! the reconciler in process beside it. The test plays antrea-controller (the allocation) and
//! the agent (its status writes, exactly as Antrea writes them: `cloudnet_e2e::harness::e2e::antrea`).
//! An Egress of an opted-in pool gets its IP attached on `status.egressNode`, moved on Antrea's
//! failover, parked when no node can take it, detached when the Egress, its IP or its pool's
//! opt-in goes; Egresses of other pools and other owners' objects are never touched; a restart
//! mid-move plans the same move again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use cloudnet_e2e::harness::e2e::antrea;
use cloudnet_reconciler::cloud::memory::Op;
use cloudnet_reconciler::frontend::{OWNER_LABEL, SOURCE_ANNOTATION};
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::CloudPrivateIPConfig;
use cloudnet_shared::antrea::{Egress, ExternalIPPool};
use kube::api::{ApiResource, DeleteParams, DynamicObject};
use kube::runtime::events::Reporter;
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use crate::support::*;

/// How long a step may take on a loaded machine (a failure bound).
const STEP: Duration = Duration::from_secs(30);

/// Starts the Antrea front end as a task, reporting to `metrics`.
fn front_end_with(client: &Client, metrics: &Arc<Metrics>) -> JoinHandle<()> {
    let reporter = Reporter {
        controller: "cloudnet-reconciler".into(),
        instance: Some("antrea-tests".into()),
    };
    tokio::spawn(cloudnet_reconciler::frontend::antrea::run(
        client.clone(),
        reporter,
        Arc::clone(metrics),
        std::future::pending(),
    ))
}

/// Starts the Antrea front end as a task.
fn front_end(client: &Client) -> JoinHandle<()> {
    front_end_with(client, &Arc::new(Metrics::default()))
}

/// Waits until Egress `egress` has an Event of `reason`, and returns its note.
async fn wait_event(client: &Client, egress: &str, reason: &str) -> String {
    let found = std::sync::Mutex::new(String::new());
    wait_until(
        STEP,
        &format!("Event {reason} on Egress {egress}"),
        || async {
            let note = events_about(client, egress)
                .await
                .into_iter()
                .find(|(_, r, _)| r == reason)
                .map(|(_, _, note)| note);
            let told = note.is_some();
            if let Some(note) = note {
                *found.lock().unwrap() = note;
            }
            told
        },
    )
    .await;
    found.into_inner().unwrap()
}

/// Waits until object `ip` is aimed at `node` (empty: parked).
async fn wait_spec_node(client: &Client, ip: &str, node: &str) {
    let api = objects(client);
    wait_until(STEP, &format!("{ip} aimed at {node:?}"), || {
        let api = api.clone();
        async move {
            api.get_opt(ip)
                .await
                .ok()
                .flatten()
                .is_some_and(|o| o.spec.node == node)
        }
    })
    .await;
}

async fn world() -> (
    cloudnet_e2e::ControlPlane,
    Client,
    cloudnet_reconciler::cloud::memory::MemoryCloud,
) {
    let (cp, client) = control_plane().await;
    antrea::install_crds(&client).await.unwrap();
    let cloud = cloud(Duration::from_millis(20));
    for node in ["a", "b"] {
        add_node(&client, &cloud, node, 10).await;
    }
    (cp, client, cloud)
}

#[tokio::test]
async fn an_egress_ip_follows_antreas_node_is_parked_without_one_and_goes_with_the_egress() {
    let (_cp, client, cloud) = world().await;
    let _reconciler = start(client.clone(), &cloud, engine_config());
    let _front = front_end(&client);
    antrea::create_pool(&client, "cloud", "10.0.0.0/24", true)
        .await
        .unwrap();
    antrea::create_egress(&client, "web", "cloud")
        .await
        .unwrap();
    let ip = "10.0.0.50";
    antrea::allocate(&client, "web", ip).await.unwrap();
    antrea::agent_writes(&client, "web", "a", ip).await.unwrap();
    wait_assigned(&client, ip, "a").await;
    let attached = wait_event(&client, "web", "Attached").await;
    assert_eq!(
        attached,
        "egress IP 10.0.0.50 attached to node a's interface in the cloud"
    );
    let object = objects(&client).get(ip).await.unwrap();
    assert_eq!(
        object.labels().get(OWNER_LABEL).map(String::as_str),
        Some("antrea")
    );
    assert_eq!(
        object
            .annotations()
            .get(SOURCE_ANNOTATION)
            .map(String::as_str),
        Some("Egress/web")
    );

    // Antrea's failover: the new holder writes its own name over the old one.
    antrea::agent_writes(&client, "web", "b", ip).await.unwrap();
    wait_assigned(&client, ip, "b").await;
    let moved = wait_event(&client, "web", "Moved").await;
    assert_eq!(
        moved,
        "egress IP 10.0.0.50 moved from node a to node b in the cloud"
    );
    assert_eq!(
        calls_for(&cloud, ip),
        [
            (Op::Attach, "a".into()),
            (Op::Detach, "a".into()),
            (Op::Attach, "b".into())
        ]
    );

    // No node can take it: parked, detached in the cloud, kept for the next node.
    antrea::agent_writes(&client, "web", "", ip).await.unwrap();
    wait_spec_node(&client, ip, "").await;
    wait_until(STEP, "the IP detached from b", || {
        let detached = calls_for(&cloud, ip).last() == Some(&(Op::Detach, "b".into()));
        async move { detached }
    })
    .await;
    wait_event(&client, "web", "Detached").await;
    antrea::agent_writes(&client, "web", "a", ip).await.unwrap();
    wait_assigned(&client, ip, "a").await;

    // The Egress deleted (nobody writes its status then): the object goes, the IP is detached.
    Api::<Egress>::all(client.clone())
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&client, ip).await;
    assert_eq!(
        calls_for(&cloud, ip).last(),
        Some(&(Op::Detach, "a".into()))
    );
}

#[tokio::test]
async fn only_opted_in_pools_count_and_an_ip_change_or_opt_out_removes_the_old_object() {
    let (_cp, client, cloud) = world().await;
    let _reconciler = start(client.clone(), &cloud, engine_config());
    let _front = front_end(&client);
    antrea::create_pool(&client, "cloud", "10.0.0.0/24", true)
        .await
        .unwrap();
    antrea::create_pool(&client, "on-prem", "10.0.1.0/24", false)
        .await
        .unwrap();
    antrea::create_egress(&client, "web", "cloud")
        .await
        .unwrap();
    antrea::create_egress(&client, "lab", "on-prem")
        .await
        .unwrap();
    antrea::allocate(&client, "web", "10.0.0.60").await.unwrap();
    antrea::allocate(&client, "lab", "10.0.1.60").await.unwrap();
    antrea::agent_writes(&client, "lab", "a", "10.0.1.60")
        .await
        .unwrap();
    antrea::agent_writes(&client, "web", "a", "10.0.0.60")
        .await
        .unwrap();
    wait_assigned(&client, "10.0.0.60", "a").await;
    assert!(
        objects(&client)
            .get_opt("10.0.1.60")
            .await
            .unwrap()
            .is_none(),
        "an Egress of a pool not opted in got an object"
    );

    // The IP changed (the admin edits spec.egressIP; the agent then holds the new one).
    antrea::allocate(&client, "web", "10.0.0.61").await.unwrap();
    antrea::agent_writes(&client, "web", "a", "10.0.0.61")
        .await
        .unwrap();
    wait_assigned(&client, "10.0.0.61", "a").await;
    wait_gone(&client, "10.0.0.60").await;

    // The pool's opt-in removed: cloudnet lets go of its Egresses' IPs.
    antrea::set_opt_in(&client, "cloud", false).await.unwrap();
    wait_gone(&client, "10.0.0.61").await;
    assert_eq!(
        calls_for(&cloud, "10.0.0.61").last(),
        Some(&(Op::Detach, "a".into()))
    );
}

#[tokio::test]
async fn another_owners_object_of_the_same_ip_is_never_changed_or_deleted() {
    let (_cp, client, cloud) = world().await;
    let _reconciler = start(client.clone(), &cloud, engine_config());
    // OVN-Kubernetes' (or an admin's) object of the IP, on node b.
    create(&client, "10.0.0.70", "b").await;
    wait_assigned(&client, "10.0.0.70", "b").await;
    let metrics = Arc::new(Metrics::default());
    let _front = front_end_with(&client, &metrics);
    antrea::create_pool(&client, "cloud", "10.0.0.0/24", true)
        .await
        .unwrap();
    antrea::egress_held_on(&client, "web", "cloud", "10.0.0.70", "a")
        .await
        .unwrap();
    // A marker that the front end has planned since: another Egress's object appears.
    antrea::egress_held_on(&client, "db", "cloud", "10.0.0.71", "a")
        .await
        .unwrap();
    wait_assigned(&client, "10.0.0.71", "a").await;
    let theirs = objects(&client).get("10.0.0.70").await.unwrap();
    assert_eq!(theirs.spec.node, "b", "retargeted another owner's object");
    assert!(theirs.labels().get(OWNER_LABEL).is_none());
    let held = wait_event(&client, "web", "IPHeldByAnother").await;
    assert!(
        held.starts_with(
            "CloudPrivateIPConfig 10.0.0.70 exists and is a network plugin's or an admin's"
        ),
        "{held}"
    );
    wait_until(STEP, "the clash counted", || {
        let counted = metrics
            .exposition()
            .contains("cloudnet_front_end_clashes{front_end=\"antrea\"} 1\n");
        async move { counted }
    })
    .await;
    assert!(
        metrics.exposition().contains(
            "cloudnet_front_end_writes_total{front_end=\"antrea\",step=\"create\",outcome=\"success\"} 1\n"
        ),
        "{}",
        metrics.exposition()
    );
    // Deleting the Egress leaves it alone too.
    Api::<Egress>::all(client.clone())
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    Api::<Egress>::all(client.clone())
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&client, "10.0.0.71").await;
    assert!(
        objects(&client)
            .get_opt("10.0.0.70")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_front_end_restarted_mid_failover_rebuilds_its_view_from_the_api_alone() {
    let (_cp, client, cloud) = world().await;
    let _reconciler = start(client.clone(), &cloud, engine_config());
    let front = front_end(&client);
    antrea::create_pool(&client, "cloud", "10.0.0.0/24", true)
        .await
        .unwrap();
    antrea::egress_held_on(&client, "web", "cloud", "10.0.0.80", "a")
        .await
        .unwrap();
    wait_assigned(&client, "10.0.0.80", "a").await;
    // The front end dies; Antrea fails over meanwhile; a new one starts with empty caches.
    front.abort();
    let _ = front.await;
    antrea::agent_writes(&client, "web", "b", "10.0.0.80")
        .await
        .unwrap();
    let _front = front_end(&client);
    wait_assigned(&client, "10.0.0.80", "b").await;
    let all: Vec<CloudPrivateIPConfig> = objects(&client)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert_eq!(
        all.len(),
        1,
        "nothing doubled: {:?}",
        all.iter().map(|o| o.name_any()).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_full_node_is_told_on_the_egress_as_capacity_reached() {
    let (_cp, client, cloud) = world().await;
    add_node(&client, &cloud, "small", 1).await;
    let _reconciler = start(client.clone(), &cloud, engine_config());
    // The reconciler checks capacity from the annotation before any call.
    wait_annotation(&client, "small", "capacity").await;
    let _front = front_end(&client);
    antrea::create_pool(&client, "cloud", "10.0.0.0/24", true)
        .await
        .unwrap();
    for (egress, ip) in [("web", "10.0.0.90"), ("db", "10.0.0.91")] {
        antrea::egress_held_on(&client, egress, "cloud", ip, "small")
            .await
            .unwrap();
    }
    // Whichever the node has no room for is told so on its own Egress.
    let full = std::sync::Mutex::new(None);
    wait_until(STEP, "CapacityReached on web or db", || async {
        for egress in ["web", "db"] {
            if let Some((kind, _, note)) = events_about(&client, egress)
                .await
                .into_iter()
                .find(|(_, reason, _)| reason == "CapacityReached")
            {
                *full.lock().unwrap() = Some((egress, kind, note));
                return true;
            }
        }
        false
    })
    .await;
    let (egress, kind, note) = full.into_inner().unwrap().unwrap();
    assert_eq!(kind, "Warning");
    let ip = if egress == "web" {
        "10.0.0.90"
    } else {
        "10.0.0.91"
    };
    assert!(
        note.starts_with(&format!("egress IP {ip}: ")) && note.contains("capacity"),
        "{note}"
    );
}

/// Objects shaped as Antrea's documentation writes them (an Egress with both selectors, a
/// static IP, a pool and a bandwidth limit; a dual-stack one; pools of ranges and of a CIDR with
/// a node selector and subnet information) are admitted by the CRDs the tests install and read
/// back whole: nothing pruned, so the model carries every field Antrea's API documents.
#[tokio::test]
async fn antreas_documented_objects_are_admitted_and_kept_whole_by_the_crds() {
    let (_cp, client) = control_plane().await;
    antrea::install_crds(&client).await.unwrap();
    let pools = [
        serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "ExternalIPPool",
            "metadata": {"name": "prod-external-ip-pool"},
            "spec": {
                "ipRanges": [{"start": "10.10.0.2", "end": "10.10.0.10"}, {"cidr": "10.10.1.0/28"}],
                "nodeSelector": {
                    "matchLabels": {"network-role": "egress-gateway"},
                    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]
                }
            }
        }),
        serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "ExternalIPPool",
            "metadata": {"name": "vlan-pool"},
            "spec": {
                "ipRanges": [{"start": "10.10.20.2", "end": "10.10.20.20"}],
                "subnetInfo": {"gateway": "10.10.20.1", "prefixLength": 24, "vlan": 20},
                "nodeSelector": {}
            }
        }),
    ];
    let egresses = [
        serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "Egress",
            "metadata": {"name": "egress-prod-web"},
            "spec": {
                "appliedTo": {
                    "namespaceSelector": {"matchLabels": {"env": "prod"}},
                    "podSelector": {"matchLabels": {"role": "web"}}
                },
                "egressIP": "10.10.0.8",
                "externalIPPool": "prod-external-ip-pool",
                "bandwidth": {"rate": "10M", "burst": "20M"}
            }
        }),
        serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "Egress",
            "metadata": {"name": "egress-dual-stack"},
            "spec": {
                "appliedTo": {"podSelector": {"matchLabels": {"app": "dual"}}},
                "egressIPs": ["10.10.1.3", "fd00:10::3"],
                "externalIPPools": ["prod-external-ip-pool", "prod-external-ip-pool-v6"]
            }
        }),
    ];
    // Sent and read as plain JSON: the model's own serialisation must not fill anything in.
    for (resource, objects) in [
        (ApiResource::erase::<ExternalIPPool>(&()), &pools[..]),
        (ApiResource::erase::<Egress>(&()), &egresses[..]),
    ] {
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        for sent in objects {
            let object: DynamicObject = serde_json::from_value(sent.clone()).unwrap();
            let name = object.name_any();
            api.create(&Default::default(), &object).await.unwrap();
            let read = api.get(&name).await.unwrap();
            assert_eq!(
                read.data["spec"], sent["spec"],
                "{} {name} read back otherwise",
                resource.kind
            );
            // And the model reads it.
            let whole = serde_json::to_value(&read).unwrap();
            let modelled = if resource.kind == "Egress" {
                serde_json::from_value::<Egress>(whole).map(drop)
            } else {
                serde_json::from_value::<ExternalIPPool>(whole).map(drop)
            };
            assert!(modelled.is_ok(), "{name}: {modelled:?}");
        }
    }
}
