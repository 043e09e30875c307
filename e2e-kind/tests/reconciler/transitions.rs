//! The reconciler's state machine on the real control plane with the memory cloud: add, move,
//! delete, the three coalescing scenarios, the stuck finalizer, a node that appears later, a node
//! that vanished (with or without an attach recorded there), drift repair and the node annotation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::support::*;
use cloudnet_reconciler::cloud::memory::Op;
use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, FINALIZER};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

#[tokio::test]
async fn add_move_delete_and_coalescing_end_with_the_right_status_and_calls() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(300));
    for n in ["a", "b", "c"] {
        add_node(&client, &cloud, n, 50).await;
    }
    let _task = start(client.clone(), &cloud, engine_config());

    // Add: one attach; the finalizer and the instance record are on the object.
    create(&client, "10.1.0.1", "a").await;
    wait_assigned(&client, "10.1.0.1", "a").await;
    assert_eq!(calls_for(&cloud, "10.1.0.1"), [(Op::Attach, "a".into())]);
    let obj = objects(&client).get("10.1.0.1").await.unwrap();
    assert!(obj.finalizers().iter().any(|f| f == FINALIZER));
    let (status, reason, message, node) = condition(&client, "10.1.0.1").await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str(), node.as_str()),
        ("True", "CloudResponseSuccess", "a")
    );
    // Upstream's text for the event first (tooling matches it), ours after.
    assert_eq!(
        message,
        "IP address successfully added: 10.1.0.1 attached to node a"
    );
    let c = obj.assigned_condition().unwrap();
    assert_eq!(c.observed_generation, obj.metadata.generation);

    // Move: detach from A strictly before attaching to B.
    retarget(&client, "10.1.0.1", "b").await;
    wait_assigned(&client, "10.1.0.1", "b").await;
    assert_eq!(
        calls_for(&cloud, "10.1.0.1"),
        [
            (Op::Attach, "a".into()),
            (Op::Detach, "a".into()),
            (Op::Attach, "b".into())
        ]
    );
    let (_, _, message, _) = condition(&client, "10.1.0.1").await.unwrap();
    assert_eq!(
        message,
        "IP address successfully moved: 10.1.0.1 attached to node b"
    );

    // Delete: detach, then the finalizer goes and the object with it.
    delete(&client, "10.1.0.1").await;
    wait_gone(&client, "10.1.0.1").await;
    assert_eq!(
        calls_for(&cloud, "10.1.0.1").last(),
        Some(&(Op::Detach, "b".into()))
    );
    assert!(cloud.owner_of("10.1.0.1".parse().unwrap()).is_none());

    // Coalescing 1: A, then B and C while the attach to A is in flight: B is never touched.
    // The attach is held until the reconciler has seen C: it has once it acts on an object
    // created after (its watch delivers in order).
    let gate = cloud.hold_next(Op::Attach, "a");
    create(&client, "10.1.0.2", "a").await;
    wait_called(&cloud, "10.1.0.2", "attach to a in flight").await;
    retarget(&client, "10.1.0.2", "b").await;
    retarget(&client, "10.1.0.2", "c").await;
    create(&client, "10.1.0.9", "c").await;
    wait_called(&cloud, "10.1.0.9", "the reconciler past the retargets").await;
    gate.open();
    wait_assigned(&client, "10.1.0.2", "c").await;
    assert_eq!(
        calls_for(&cloud, "10.1.0.2"),
        [
            (Op::Attach, "a".into()),
            (Op::Detach, "a".into()),
            (Op::Attach, "c".into())
        ]
    );
    delete(&client, "10.1.0.9").await;
    wait_gone(&client, "10.1.0.9").await;

    // Coalescing 2: A assigned first, then B and C in quick succession.
    create(&client, "10.1.0.3", "a").await;
    wait_assigned(&client, "10.1.0.3", "a").await;
    retarget(&client, "10.1.0.3", "b").await;
    retarget(&client, "10.1.0.3", "c").await;
    wait_assigned(&client, "10.1.0.3", "c").await;
    let calls = calls_for(&cloud, "10.1.0.3");
    assert_eq!(calls.first(), Some(&(Op::Attach, "a".into())));
    assert_eq!(calls.last(), Some(&(Op::Attach, "c".into())));
    assert_eq!(
        calls.iter().filter(|(op, _)| *op == Op::Attach).count(),
        2,
        "{calls:?}"
    );

    // Coalescing 3: create on A and retarget at once: whatever the reconciler saw first, every
    // attach but the last is undone before the next, and the IP ends on C alone.
    create(&client, "10.1.0.4", "a").await;
    retarget(&client, "10.1.0.4", "b").await;
    retarget(&client, "10.1.0.4", "c").await;
    wait_assigned(&client, "10.1.0.4", "c").await;
    let calls = calls_for(&cloud, "10.1.0.4");
    for pair in calls.windows(2) {
        if pair[0].0 == Op::Attach {
            assert_eq!(pair[1], (Op::Detach, pair[0].1.clone()), "{calls:?}");
        }
    }
    assert_eq!(calls.last(), Some(&(Op::Attach, "c".into())));
    assert_eq!(
        cloud.owner_of("10.1.0.4".parse().unwrap()).as_deref(),
        Some("c")
    );
    assert_no_violations(&cloud);
}

#[tokio::test]
async fn stuck_finalizer_missing_node_vanished_node_drift_and_annotation() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(20));
    add_node(&client, &cloud, "x", 3).await;
    let config = cloudnet_reconciler::controller::EngineConfig {
        drift_period: Duration::from_millis(300),
        ..engine_config()
    };
    let _task = start(client.clone(), &cloud, config);

    // Node annotation: subnet and capacity minus the unmanaged primary address.
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until(Duration::from_secs(30), "node x annotated", || {
        let nodes = nodes.clone();
        async move {
            nodes.get("x").await.ok().and_then(|n| n.annotations().get(EGRESS_IPCONFIG_ANNOTATION).cloned())
                == Some(r#"[{"interface":"eth0","ifaddr":{"ipv4":"10.0.0.0/8","ipv6":"fd00::/64"},"capacity":{"ip":2}}]"#.to_owned())
        }
    })
    .await;

    // Stuck finalizer: an object with our finalizer and no status.node is released at once.
    create(&client, "10.2.0.1", "").await;
    objects(&client)
        .patch(
            "10.2.0.1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": [FINALIZER] } })),
        )
        .await
        .unwrap();
    delete(&client, "10.2.0.1").await;
    wait_gone(&client, "10.2.0.1").await;
    assert!(calls_for(&cloud, "10.2.0.1").is_empty());

    // Missing node: Error condition, then assigned once the node appears.
    create(&client, "10.2.0.2", "late").await;
    wait_until(
        Duration::from_secs(30),
        "error condition for the missing node",
        || {
            let client = client.clone();
            async move {
                condition(&client, "10.2.0.2")
                    .await
                    .is_some_and(|(s, r, m, _)| {
                        s == "False" && r == "CloudResponseError" && m.contains("late")
                    })
            }
        },
    )
    .await;
    add_node(&client, &cloud, "late", 10).await;
    wait_assigned(&client, "10.2.0.2", "late").await;

    // Vanished node: the Node object goes away, the IP is still detached from its VM.
    delete(&client, "10.2.0.2").await;
    create(&client, "10.2.0.3", "x").await;
    wait_assigned(&client, "10.2.0.3", "x").await;
    nodes.delete("x", &DeleteParams::default()).await.unwrap();
    delete(&client, "10.2.0.3").await;
    wait_gone(&client, "10.2.0.3").await;
    assert!(cloud.owner_of("10.2.0.3".parse().unwrap()).is_none());
    assert_eq!(
        calls_for(&cloud, "10.2.0.3").last(),
        Some(&(Op::Detach, "x".into()))
    );
    wait_gone(&client, "10.2.0.2").await;

    // Drift: an IP removed out of band is attached again.
    create(&client, "10.2.0.4", "late").await;
    wait_assigned(&client, "10.2.0.4", "late").await;
    cloud.remove_out_of_band("late", "10.2.0.4".parse().unwrap());
    wait_until(Duration::from_secs(30), "drift repaired", || {
        let cloud = cloud.clone();
        async move { cloud.owner_of("10.2.0.4".parse().unwrap()).as_deref() == Some("late") }
    })
    .await;
    assert_eq!(
        calls_for(&cloud, "10.2.0.4"),
        [(Op::Attach, "late".into()), (Op::Attach, "late".into())]
    );
    assert_no_violations(&cloud);
}

#[tokio::test]
async fn cloud_errors_are_reported_and_retried_until_success() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::ZERO);
    add_node(&client, &cloud, "e", 10).await;
    cloud.fail_next(
        Op::Attach,
        Some("e"),
        3,
        cloudnet_reconciler::cloud::CloudError::throttled("RequestLimitExceeded"),
    );
    let _task = start(client.clone(), &cloud, engine_config());
    create(&client, "10.3.0.1", "e").await;
    wait_assigned(&client, "10.3.0.1", "e").await;
    assert_eq!(cloud.call_count(Op::Attach), 4);
    assert_no_violations(&cloud);
}

#[tokio::test]
async fn a_vanished_node_never_attached_to_holds_up_neither_a_move_nor_a_delete() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "b", 10).await;
    // Adopted from the upstream controller: assigned to Node "gone", which no longer exists,
    // and no instance recorded (set up before the reconciler runs, as after a migration).
    for ip in ["10.8.0.3", "10.8.0.4"] {
        create(&client, ip, "gone").await;
        adopt(&client, ip, "gone").await;
    }
    let _task = start(client.clone(), &cloud, engine_config());

    // Refused before any cloud call: Node "ghost" does not exist, status.node names it. The
    // second IP comes from b, so it carries our finalizer and a record, but for b.
    create(&client, "10.8.0.2", "b").await;
    wait_assigned(&client, "10.8.0.2", "b").await;
    create(&client, "10.8.0.1", "ghost").await;
    retarget(&client, "10.8.0.2", "ghost").await;
    for ip in ["10.8.0.1", "10.8.0.2"] {
        wait_until(
            Duration::from_secs(30),
            &format!("{ip} refused on ghost"),
            || {
                let client = client.clone();
                async move {
                    condition(&client, ip)
                        .await
                        .is_some_and(|(s, _, _, node)| s == "False" && node == "ghost")
                }
            },
        )
        .await;
    }

    retarget(&client, "10.8.0.1", "b").await;
    retarget(&client, "10.8.0.3", "b").await;
    delete(&client, "10.8.0.2").await;
    delete(&client, "10.8.0.4").await;
    wait_assigned(&client, "10.8.0.1", "b").await;
    wait_assigned(&client, "10.8.0.3", "b").await;
    wait_gone(&client, "10.8.0.2").await;
    wait_gone(&client, "10.8.0.4").await;

    // No cloud call for the vanished nodes: the moved IPs were only attached to b.
    for ip in ["10.8.0.1", "10.8.0.3"] {
        assert_eq!(calls_for(&cloud, ip), [(Op::Attach, "b".into())], "{ip}");
    }
    assert_eq!(
        calls_for(&cloud, "10.8.0.2"),
        [(Op::Attach, "b".into()), (Op::Detach, "b".into())]
    );
    assert!(calls_for(&cloud, "10.8.0.4").is_empty());
    // Each skipped detach is reported, with the warning about another controller's IP.
    for ip in ["10.8.0.1", "10.8.0.2", "10.8.0.3", "10.8.0.4"] {
        wait_until(
            Duration::from_secs(30),
            &format!("DetachSkipped event for {ip}"),
            || {
                let client = client.clone();
                async move {
                    events_about(&client, ip).await.iter().any(|(t, r, note)| {
                        t == "Warning" && r == "DetachSkipped" && note.contains("may remain")
                    })
                }
            },
        )
        .await;
    }
    assert_no_violations(&cloud);
}
