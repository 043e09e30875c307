//! The attachment ledger on the real control plane with the memory cloud: every attach is
//! recorded in the controller's namespace before its call, and the orphan sweep releases what no
//! object claims any more: an object forced out while its IP was attached, and a release the
//! process was killed in the middle of.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::support::*;
use cloudnet_reconciler::cloud::memory::{FaultAction, Op};
use cloudnet_reconciler::controller::EngineConfig;

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
    wait_until(Duration::from_secs(30), "an Event on the node", || {
        let client = client.clone();
        async move {
            events_about(&client, "a").await.iter().any(|(t, r, note)| {
                t == "Warning" && r == "OrphanReleased" && note.contains("10.9.0.1")
            })
        }
    })
    .await;
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
