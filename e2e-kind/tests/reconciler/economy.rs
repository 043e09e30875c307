//! Cloud-call economy on the real control plane with the memory cloud: object events (our own
//! status writes included) cost no cloud read, IPs created in a burst share one call per node,
//! a move of many IPs costs one call per node, and a failed call drops the cached view.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::support::*;
use cloudnet_reconciler::cloud::CloudError;
use cloudnet_reconciler::cloud::memory::{Call, MemoryCloud, MemoryConfig, Op};
use cloudnet_reconciler::controller::EngineConfig;
use futures::future::join_all;
use kube::Client;

/// The test engine, gathering long enough that a loaded machine's slower API writes do not
/// spread one burst over several calls (the assertions count calls, not time).
fn gathering_config() -> EngineConfig {
    EngineConfig {
        coalesce_window: Duration::from_secs(1),
        max_gather: Duration::from_secs(5),
        ..engine_config()
    }
}

/// Waits until every node in `names` carries the egress annotation.
async fn wait_annotated(client: &Client, names: &[&str]) {
    for name in names {
        wait_annotation(client, name, "").await;
    }
}

fn ips(node: usize, count: usize) -> Vec<String> {
    (1..=count)
        .map(|i| format!("10.{}.0.{i}", 10 + node))
        .collect()
}

#[tokio::test]
async fn object_events_cost_no_reads_and_a_burst_shares_one_call_per_node() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(50));
    let names = ["a", "b", "c"];
    for n in names {
        add_node(&client, &cloud, n, 100).await;
    }
    let _task = start(client.clone(), &cloud, gathering_config());
    wait_annotated(&client, &names).await;
    let reads = cloud.call_count(Op::EgressConfig);
    assert_eq!(reads, 3, "one read per new node: {:?}", cloud.calls());

    // Ten IPs per node, created at once.
    let all: Vec<(String, &str)> = names
        .iter()
        .enumerate()
        .flat_map(|(i, n)| ips(i, 10).into_iter().map(move |ip| (ip, *n)))
        .collect();
    join_all(all.iter().map(|(ip, n)| create(&client, ip, n))).await;
    for (ip, n) in &all {
        wait_assigned(&client, ip, n).await;
    }
    assert_eq!(
        cloud.call_count(Op::EgressConfig),
        reads,
        "the attach path and the annotation use the cached view: {:?}",
        cloud.calls()
    );
    let attaches = cloud.call_count(Op::Attach);
    assert!(
        attaches <= 2 * names.len() as u64,
        "{attaches} attach calls for 30 IPs on 3 nodes: {:?}",
        cloud.calls()
    );

    // Deleting them reads nothing either, and batches the same way.
    join_all(all.iter().map(|(ip, _)| delete(&client, ip))).await;
    for (ip, _) in &all {
        wait_gone(&client, ip).await;
    }
    assert_eq!(cloud.call_count(Op::EgressConfig), reads);
    let detaches = cloud.call_count(Op::Detach);
    assert!(
        detaches <= 2 * names.len() as u64,
        "{detaches} detach calls: {:?}",
        cloud.calls()
    );
    for n in names {
        assert!(cloud.attached_to(n).is_empty(), "{n}");
    }
    assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
}

#[tokio::test]
async fn a_move_of_many_ips_costs_one_call_per_node() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(50));
    for n in ["a", "b"] {
        add_node(&client, &cloud, n, 100).await;
    }
    let _task = start(client.clone(), &cloud, gathering_config());
    let moved = ips(0, 12);
    join_all(moved.iter().map(|ip| create(&client, ip, "a"))).await;
    for ip in &moved {
        wait_assigned(&client, ip, "a").await;
    }
    let before = cloud.calls().len();
    join_all(moved.iter().map(|ip| retarget(&client, ip, "b"))).await;
    for ip in &moved {
        wait_assigned(&client, ip, "b").await;
    }
    let after: Vec<_> = cloud.calls()[before..].to_vec();
    let detaches = after
        .iter()
        .filter(|c| c.op == Op::Detach && c.instance == "a")
        .count();
    let attaches = after
        .iter()
        .filter(|c| c.op == Op::Attach && c.instance == "b")
        .count();
    assert!(detaches <= 2 && attaches <= 2, "{after:?}");
    assert_eq!(cloud.attached_to("b").len(), 12);
    assert!(cloud.attached_to("a").is_empty());
    assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
}

#[tokio::test]
async fn on_a_cloud_without_etags_a_moves_new_vm_is_read_while_its_ips_leave_the_old() {
    let (_cp, client) = control_plane().await;
    // EC2's way: new additions cost a read of the interface unless the view is current.
    let cloud = MemoryCloud::new(MemoryConfig {
        latency: Duration::from_millis(50),
        reads_before_adding: true,
        ..MemoryConfig::default()
    });
    for n in ["a", "b"] {
        add_node(&client, &cloud, n, 100).await;
    }
    // A read counts as current for longer than any test takes: the assertions count reads,
    // not time.
    let config = EngineConfig {
        read_lately: Duration::from_secs(600),
        ..gathering_config()
    };
    let _task = start(client.clone(), &cloud, config);
    wait_annotated(&client, &["a", "b"]).await;
    let reads_of = |calls: &[Call], vm: &str| -> (usize, usize) {
        let of = |op| {
            calls
                .iter()
                .filter(|c| c.op == op && c.instance.split(',').any(|i| i == vm))
                .count()
        };
        (of(Op::EgressConfigs), of(Op::EgressConfig))
    };

    let before = cloud.calls().len();
    let moved = ips(0, 12);
    join_all(moved.iter().map(|ip| create(&client, ip, "a"))).await;
    for ip in &moved {
        wait_assigned(&client, ip, "a").await;
    }
    let created = cloud.calls()[before..].to_vec();
    let (_, in_calls) = reads_of(&created, "a");
    assert!(
        in_calls >= 1,
        "first attachments read the interface in their call: {created:?}"
    );

    let before = cloud.calls().len();
    join_all(moved.iter().map(|ip| retarget(&client, ip, "b"))).await;
    for ip in &moved {
        wait_assigned(&client, ip, "b").await;
    }
    let after = cloud.calls()[before..].to_vec();
    assert_eq!(
        reads_of(&after, "b"),
        (1, 0),
        "one read of the new VM for the whole move, ahead of it, and none in the attach call: \
         {after:?}"
    );
    let first = |op, vm: &str| after.iter().position(|c| c.op == op && c.instance == vm);
    assert!(
        first(Op::Attach, "b") > first(Op::EgressConfigs, "b"),
        "{after:?}"
    );
    assert_eq!(cloud.attached_to("b").len(), 12);
    assert!(cloud.attached_to("a").is_empty());
    assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
}

#[tokio::test]
async fn changes_use_the_annotations_view_until_a_call_fails() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::ZERO);
    add_node(&client, &cloud, "a", 100).await;
    let _task = start(client.clone(), &cloud, engine_config());
    wait_annotated(&client, &["a"]).await;
    assert_eq!(cloud.call_count(Op::EgressConfig), 1);
    create(&client, "10.20.0.1", "a").await;
    wait_assigned(&client, "10.20.0.1", "a").await;
    cloud.fail_next(
        Op::Attach,
        Some("a"),
        1,
        CloudError::retryable("connection reset"),
    );
    create(&client, "10.20.0.2", "a").await;
    wait_assigned(&client, "10.20.0.2", "a").await;
    let attaches: Vec<_> = cloud
        .calls()
        .into_iter()
        .filter(|c| c.op == Op::Attach && c.instance == "a")
        .collect();
    let views: Vec<bool> = attaches.iter().map(|c| c.with_view).collect();
    // The first change uses the view the annotation read; the one after the failure has none
    // (unless the annotation read it again in between, which is the one allowed read).
    assert_eq!(views.len(), 3, "{attaches:?}");
    assert_eq!(&views[..2], [true, true], "{attaches:?}");
    let reads = cloud.call_count(Op::EgressConfig);
    assert!(
        (views[2] && reads == 2) || (!views[2] && reads <= 2),
        "{attaches:?}, {reads} reads"
    );
}
