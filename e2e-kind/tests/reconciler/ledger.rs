//! The attachment ledger on the real control plane with the memory cloud: every attach is
//! recorded in the controller's namespace before its call, and the orphan sweep releases what no
//! object claims any more: an object forced out while its IP was attached, a release the
//! process was killed in the middle of, and a late attach landing after its IP was released
//! with drift checks off. Two pages of one VM are merged when loaded, and a page taken over
//! starts empty.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::support::*;
use cloudnet_reconciler::cloud::memory::{FaultAction, Op};
use cloudnet_reconciler::controller::EngineConfig;
use cloudnet_reconciler::engine::ledger::{INSTANCE_ANNOTATION, LABEL};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};

/// Writes ledger page `name` in `default` (the tests' controller namespace) as a controller
/// would have left it: naming VM `instance` (none: no annotation) and holding `data`.
async fn put_page(client: &Client, name: &str, instance: Option<&str>, data: &[(&str, &str)]) {
    let page = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(LABEL.to_owned(), "v1".to_owned())].into()),
            annotations: instance.map(|i| [(INSTANCE_ANNOTATION.to_owned(), i.to_owned())].into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &page)
        .await
        .unwrap();
}

/// Waits for the sweep's Warning Event `OrphanReleased` about `ip` on node `node`.
async fn wait_orphan_released(client: &Client, node: &str, ip: &str) {
    wait_until(
        Duration::from_secs(30),
        "an OrphanReleased Event on the node",
        || {
            let client = client.clone();
            async move {
                events_about(&client, node)
                    .await
                    .iter()
                    .any(|(t, r, note)| {
                        t == "Warning" && r == "OrphanReleased" && note.contains(ip)
                    })
            }
        },
    )
    .await;
}

/// The names of the ledger pages naming VM `instance`.
async fn pages_of(client: &Client, instance: &str) -> Vec<String> {
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels(LABEL))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| {
            cm.annotations()
                .get(INSTANCE_ANNOTATION)
                .map(String::as_str)
                == Some(instance)
        })
        .map(|cm| cm.name_any())
        .collect()
}

/// The test engine with a one-second orphan grace.
fn sweeping_config() -> EngineConfig {
    EngineConfig {
        orphan_grace: Duration::from_secs(1),
        ..engine_config()
    }
}

#[tokio::test]
async fn an_ip_whose_object_was_forced_out_is_released_by_the_sweep() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "a", 10).await;
    let _task = start(client.clone(), &cloud, sweeping_config());
    create(&client, "10.9.0.1", "a").await;
    wait_assigned(&client, "10.9.0.1", "a").await;
    assert_eq!(
        ledger_entries(&client, "10.9.0.1").await,
        [("a".to_owned(), "a".to_owned())]
    );

    force_delete(&client, "10.9.0.1").await;
    wait_gone(&client, "10.9.0.1").await;
    wait_until(Duration::from_secs(30), "the orphan released", || {
        let cloud = cloud.clone();
        async move { cloud.owner_of("10.9.0.1".parse().unwrap()).is_none() }
    })
    .await;
    wait_until(Duration::from_secs(30), "the entry removed", || {
        let client = client.clone();
        async move { ledger_entries(&client, "10.9.0.1").await.is_empty() }
    })
    .await;
    wait_orphan_released(&client, "a", "10.9.0.1").await;
    assert_eq!(
        calls_for(&cloud, "10.9.0.1"),
        [(Op::Attach, "a".into()), (Op::Detach, "a".into())]
    );
    assert_no_violations(&cloud);
}

#[tokio::test]
async fn a_release_the_process_was_killed_in_is_finished_by_its_successor() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "a", 10).await;
    let task = start(client.clone(), &cloud, sweeping_config());
    create(&client, "10.9.0.2", "a").await;
    wait_assigned(&client, "10.9.0.2", "a").await;

    // The sweep's detach never answers, and the process dies in the middle of it.
    cloud.inject(Op::Detach, Some("a"), Some(1), FaultAction::Hang);
    force_delete(&client, "10.9.0.2").await;
    wait_until(Duration::from_secs(30), "the release in flight", || {
        let cloud = cloud.clone();
        async move { cloud.faults_left() == 0 }
    })
    .await;
    task.abort();
    let _ = task.await;
    assert_eq!(
        cloud.owner_of("10.9.0.2".parse().unwrap()).as_deref(),
        Some("a")
    );
    assert_eq!(ledger_entries(&client, "10.9.0.2").await.len(), 1);

    let _task = start(client.clone(), &cloud, sweeping_config());
    wait_until(Duration::from_secs(30), "the successor's release", || {
        let (client, cloud) = (client.clone(), cloud.clone());
        async move {
            cloud.owner_of("10.9.0.2".parse().unwrap()).is_none()
                && ledger_entries(&client, "10.9.0.2").await.is_empty()
        }
    })
    .await;
    assert_no_violations(&cloud);
}

#[tokio::test]
async fn the_first_writes_of_many_vms_at_once_go_to_their_own_pages_without_a_failure() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    let nodes: Vec<String> = (0..16).map(|i| format!("n{i}")).collect();
    for node in &nodes {
        add_node(&client, &cloud, node, 10).await;
    }
    let _task = start(client.clone(), &cloud, sweeping_config());
    let ips: Vec<String> = (0..nodes.len())
        .map(|i| format!("10.9.1.{}", i + 1))
        .collect();
    futures::future::join_all(
        ips.iter()
            .zip(&nodes)
            .map(|(ip, node)| create(&client, ip, node)),
    )
    .await;
    for (ip, node) in ips.iter().zip(&nodes) {
        wait_assigned(&client, ip, node).await;
        assert_eq!(
            ledger_entries(&client, ip).await,
            [(node.clone(), node.clone())]
        );
    }
    // A page name two VMs raced for would have failed some batches before their calls.
    for ip in &ips {
        let events = events_about(&client, ip).await;
        assert!(
            events.iter().all(|(t, _, _)| t == "Normal"),
            "{ip}: {events:?}"
        );
    }
    assert_eq!(cloud.call_count(Op::Attach), nodes.len() as u64);
    assert_no_violations(&cloud);
}

/// Two pages naming one VM, as a create whose answer was lost left them: loaded, they are merged
/// into one, so that the release of an IP both recorded leaves no page still holding it (which
/// the next term's sweep would report as an orphan, `OrphanReleased`, after every leader
/// change).
#[tokio::test]
async fn two_pages_of_one_vm_are_merged_when_loaded_and_a_release_leaves_none_holding_the_ip() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "a", 10).await;
    put_page(
        &client,
        "cloudnet-ledger-0",
        Some("a"),
        &[("10.9.2.1", "a")],
    )
    .await;
    put_page(
        &client,
        "cloudnet-ledger-1",
        Some("a"),
        &[("10.9.2.1", "a"), ("10.9.2.2", "a")],
    )
    .await;
    let _task = start(client.clone(), &cloud, sweeping_config());
    for ip in ["10.9.2.1", "10.9.2.2"] {
        create(&client, ip, "a").await;
        wait_assigned(&client, ip, "a").await;
    }
    assert_eq!(
        pages_of(&client, "a").await.len(),
        1,
        "the second page was not merged"
    );
    delete(&client, "10.9.2.1").await;
    wait_gone(&client, "10.9.2.1").await;
    assert_eq!(
        ledger_entries(&client, "10.9.2.1").await,
        [],
        "a page still records the released IP"
    );
    assert_eq!(
        ledger_entries(&client, "10.9.2.2").await,
        [("a".to_owned(), "a".to_owned())]
    );
    assert_eq!(cloud.owner_of("10.9.2.1".parse().unwrap()), None);
    assert_no_violations(&cloud);
}

/// A free page (no VM named) still holding a key is taken over by the next VM without it: the
/// page starts empty, and nothing of what it held is ever put on the new VM's record.
#[tokio::test]
async fn a_page_taken_over_by_another_vm_starts_empty() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "a", 10).await;
    put_page(
        &client,
        "cloudnet-ledger-0",
        None,
        &[("10.9.3.7", "old-node")],
    )
    .await;
    let _task = start(client.clone(), &cloud, sweeping_config());
    create(&client, "10.9.3.1", "a").await;
    wait_assigned(&client, "10.9.3.1", "a").await;
    assert_eq!(pages_of(&client, "a").await, ["cloudnet-ledger-0"]);
    assert_eq!(
        ledger_entries(&client, "10.9.3.7").await,
        [],
        "the previous holder's key stayed on the page taken over"
    );
    assert_no_violations(&cloud);
}

/// With drift checks off (`--drift-period 0`), an attach held in a network that lands after its
/// object was deleted and its IP released (the worst moment: nothing reads that VM again) is
/// still found by the sweep, which reads the VMs it released IPs from, and detached.
#[tokio::test]
async fn a_late_attach_landing_after_the_release_is_swept_with_drift_checks_off() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "a", 10).await;
    let config = sweeping_config();
    assert!(config.drift_period.is_zero());
    let _task = start(client.clone(), &cloud, config);
    let ip = "10.9.4.1";
    create(&client, ip, "a").await;
    wait_assigned(&client, ip, "a").await;
    delete(&client, ip).await;
    wait_gone(&client, ip).await;
    assert!(ledger_entries(&client, ip).await.is_empty());
    assert_eq!(cloud.owner_of(ip.parse().unwrap()), None);

    // The held attach lands.
    cloud.add_out_of_band("a", ip.parse().unwrap());
    wait_until(
        Duration::from_secs(30),
        "the sweep to detach the late IP",
        || {
            let cloud = cloud.clone();
            async move { cloud.owner_of(ip.parse().unwrap()).is_none() }
        },
    )
    .await;
    wait_orphan_released(&client, "a", ip).await;
    assert_eq!(
        calls_for(&cloud, ip),
        [
            (Op::Attach, "a".into()),
            (Op::Detach, "a".into()),
            (Op::Detach, "a".into())
        ]
    );
}
