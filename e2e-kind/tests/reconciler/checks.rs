//! Checks the reconciler makes on its own, on the real control plane with the memory cloud and no
//! admission webhook: the node's capacity is re-checked before any cloud call, and every
//! transition is reported as a Kubernetes Event on the object.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::support::*;
use cloudnet_reconciler::cloud::memory::{MemoryCloud, MemoryConfig, Op, VmSpec};
use cloudnet_shared::{EGRESS_IPCONFIG_ANNOTATION, Platform};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

async fn wait_event(client: &Client, name: &str, type_: &str, reason: &str) {
    wait_until(
        Duration::from_secs(30),
        &format!("{type_} event {reason} for {name}"),
        || async move {
            events_about(client, name)
                .await
                .iter()
                .any(|(t, r, _)| t == type_ && r == reason)
        },
    )
    .await;
}

#[tokio::test]
async fn a_full_node_blocks_the_attach_before_any_cloud_call_and_transitions_emit_events() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(20));
    // Two addresses on the VM, one of them the unmanaged primary: room for one egress IP.
    add_node(&client, &cloud, "full", 2).await;
    let _task = start(client.clone(), &cloud, engine_config());
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until(
        Duration::from_secs(30),
        "node annotated with capacity 1",
        || {
            let nodes = nodes.clone();
            async move {
                nodes
                    .get("full")
                    .await
                    .ok()
                    .and_then(|n| n.annotations().get(EGRESS_IPCONFIG_ANNOTATION).cloned())
                    .is_some_and(|a| a.contains(r#""capacity":{"ip":1}"#))
            }
        },
    )
    .await;

    create(&client, "10.6.0.1", "full").await;
    wait_assigned(&client, "10.6.0.1", "full").await;
    wait_event(&client, "10.6.0.1", "Normal", "Attached").await;

    // Admitted anyway (no webhook here): the reconciler refuses before calling the cloud.
    create(&client, "10.6.0.2", "full").await;
    wait_until(
        Duration::from_secs(30),
        "capacity error on 10.6.0.2",
        || {
            let client = client.clone();
            async move {
                condition(&client, "10.6.0.2")
                    .await
                    .is_some_and(|(s, r, _, _)| s == "False" && r == "CloudResponseError")
            }
        },
    )
    .await;
    let (_, _, message, node) = condition(&client, "10.6.0.2").await.unwrap();
    assert_eq!(node, "full");
    assert!(
        message.contains("capacity")
            && message.contains("full")
            && message.contains("room for 1 egress IPs")
            && message.contains("1 come before this one"),
        "{message}"
    );
    wait_event(&client, "10.6.0.2", "Warning", "AttachBlocked").await;
    assert!(
        calls_for(&cloud, "10.6.0.2").is_empty(),
        "{:?}",
        cloud.calls()
    );
    assert!(cloud.owner_of("10.6.0.2".parse().unwrap()).is_none());

    // Room appears: the retried object is attached, and the detach was reported too.
    delete(&client, "10.6.0.1").await;
    wait_gone(&client, "10.6.0.1").await;
    wait_event(&client, "10.6.0.1", "Normal", "Detached").await;
    wait_assigned(&client, "10.6.0.2", "full").await;
    wait_event(&client, "10.6.0.2", "Normal", "Attached").await;
    assert_no_violations(&cloud);
}

/// kube-apiserver can complete a delete that raced with the write adding the finalizer
/// (kubernetes/kubernetes#77988), so an object can vanish while its IP is being attached. Here
/// the finalizer is stripped and the object deleted while the attach call is in flight, which
/// leaves the reconciler in the same place: its next status write finds no object.
#[tokio::test]
async fn an_object_that_vanishes_mid_attach_gets_its_ip_detached() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(400));
    add_node(&client, &cloud, "gone", 10).await;
    let _task = start(client.clone(), &cloud, engine_config());
    create(&client, "10.6.1.1", "gone").await;
    wait_until(
        Duration::from_secs(30),
        "attach of 10.6.1.1 in flight",
        || {
            let client = client.clone();
            async move {
                condition(&client, "10.6.1.1")
                    .await
                    .is_some_and(|(_, r, _, _)| r == "CloudResponsePending")
            }
        },
    )
    .await;
    let strip = serde_json::json!({ "metadata": { "finalizers": null } });
    objects(&client)
        .patch(
            "10.6.1.1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&strip),
        )
        .await
        .unwrap();
    delete(&client, "10.6.1.1").await;
    wait_gone(&client, "10.6.1.1").await;

    let ip = "10.6.1.1".parse().unwrap();
    wait_until(Duration::from_secs(30), "orphaned IP detached", || {
        let cloud = cloud.clone();
        async move {
            let detached = calls_for(&cloud, "10.6.1.1")
                .iter()
                .any(|(op, _)| *op == Op::Detach);
            detached && cloud.owner_of(ip).is_none()
        }
    })
    .await;
    let ops: Vec<Op> = calls_for(&cloud, "10.6.1.1")
        .into_iter()
        .map(|(op, _)| op)
        .collect();
    assert_eq!(ops, [Op::Attach, Op::Detach], "{:?}", cloud.calls());
    wait_event(&client, "10.6.1.1", "Warning", "OrphanDetached").await;
    assert_no_violations(&cloud);
}

/// Waits until object `ip` carries an Error condition; returns its message.
async fn wait_error(client: &Client, ip: &str) -> String {
    wait_until(
        Duration::from_secs(30),
        &format!("an error condition on {ip}"),
        || async move {
            condition(client, ip)
                .await
                .is_some_and(|(s, r, _, _)| s == "False" && r == "CloudResponseError")
        },
    )
    .await;
    condition(client, ip).await.unwrap().2
}

async fn created_at(client: &Client, ip: &str) -> Timestamp {
    objects(client)
        .get(ip)
        .await
        .unwrap()
        .metadata
        .creation_timestamp
        .unwrap()
        .0
}

/// Admission bypassed (no webhook here) and four IPs created at once for a node with room for
/// two: the reconciler attaches exactly the two oldest and blocks the other two before any
/// cloud call; when one of the attached goes, the next in line (oldest, then by name) gets it.
#[tokio::test]
async fn only_the_ips_over_the_limit_are_blocked_and_the_oldest_win() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(20));
    // Primary + two: room for two egress IPs, annotated before the reconciler starts so that
    // every reconcile sees the limit.
    add_node(&client, &cloud, "line", 3).await;
    let annotation = r#"[{"interface":"eth0","ifaddr":{"ipv4":"10.0.0.0/8"},"capacity":{"ip":2}}]"#;
    Api::<Node>::all(client.clone())
        .patch(
            "line",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": { "annotations": { EGRESS_IPCONFIG_ANNOTATION: annotation } }
            })),
        )
        .await
        .unwrap();
    // The oldest two have the larger names, so name order alone would pick the others.
    create(&client, "10.6.2.4", "line").await;
    create(&client, "10.6.2.3", "line").await;
    let older = created_at(&client, "10.6.2.3").await;
    // creationTimestamp has whole seconds: let the apiserver's (this machine's) clock move on.
    wait_until(Duration::from_secs(3), "the next second", || async move {
        Timestamp::now().as_second() > older.as_second()
    })
    .await;
    // 10.6.2.1 first: whether the two share a second or not, it is ahead of 10.6.2.2 (by name
    // in the same second, the usual case, by age otherwise).
    create(&client, "10.6.2.1", "line").await;
    create(&client, "10.6.2.2", "line").await;
    assert!(created_at(&client, "10.6.2.1").await > created_at(&client, "10.6.2.4").await);

    let _task = start(client.clone(), &cloud, engine_config());
    wait_assigned(&client, "10.6.2.4", "line").await;
    wait_assigned(&client, "10.6.2.3", "line").await;
    // 10.6.2.1 is third in line (same second as 10.6.2.2, smaller name), 10.6.2.2 fourth.
    for (ip, ahead) in [("10.6.2.1", 2), ("10.6.2.2", 3)] {
        let message = wait_error(&client, ip).await;
        assert!(
            message.contains("capacity")
                && message.contains("room for 2 egress IPs")
                && message.contains(&format!("and {ahead} come before this one")),
            "{ip}: {message}"
        );
        assert!(
            calls_for(&cloud, ip).is_empty(),
            "{ip}: {:?}",
            cloud.calls()
        );
    }

    // One slot frees: the next in line is 10.6.2.1 (same second as 10.6.2.2, smaller name).
    delete(&client, "10.6.2.4").await;
    wait_gone(&client, "10.6.2.4").await;
    wait_assigned(&client, "10.6.2.1", "line").await;
    wait_until(
        Duration::from_secs(30),
        "10.6.2.2 blocked behind the new order",
        || async {
            condition(&client, "10.6.2.2")
                .await
                .is_some_and(|(s, _, m, _)| {
                    s == "False" && m.contains("and 2 come before this one")
                })
        },
    )
    .await;
    assert!(
        calls_for(&cloud, "10.6.2.2").is_empty(),
        "{:?}",
        cloud.calls()
    );
    assert_no_violations(&cloud);
}

/// An IP moved away still occupies its source until it is detached: an IP created on the source
/// meanwhile waits (blocked, no cloud call) and is attached only after the detach.
#[tokio::test]
async fn an_ip_moving_away_occupies_its_source_until_detached() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(20));
    add_node(&client, &cloud, "src", 3).await;
    add_node(&client, &cloud, "dst", 10).await;
    let _task = start(client.clone(), &cloud, engine_config());
    wait_annotation(&client, "src", r#""capacity":{"ip":2}"#).await;
    create(&client, "10.6.3.1", "src").await;
    create(&client, "10.6.3.2", "src").await;
    wait_assigned(&client, "10.6.3.1", "src").await;
    wait_assigned(&client, "10.6.3.2", "src").await;

    // The detach stays in flight until the third IP has been blocked.
    let gate = cloud.hold_next(Op::Detach, "src");
    retarget(&client, "10.6.3.1", "dst").await;
    wait_until(
        Duration::from_secs(30),
        "10.6.3.1 detaching from src",
        || {
            let client = client.clone();
            async move {
                condition(&client, "10.6.3.1")
                    .await
                    .is_some_and(|(_, r, m, n)| {
                        r == "CloudResponsePending" && n == "src" && m.contains("detaching")
                    })
            }
        },
    )
    .await;
    create(&client, "10.6.3.3", "src").await;
    wait_event(&client, "10.6.3.3", "Warning", "AttachBlocked").await;
    let blocked = events_about(&client, "10.6.3.3").await;
    assert!(
        blocked
            .iter()
            .any(|(_, r, note)| r == "AttachBlocked" && note.contains("2 come before this one")),
        "{blocked:?}"
    );
    assert!(
        calls_for(&cloud, "10.6.3.3").is_empty(),
        "{:?}",
        cloud.calls()
    );

    gate.open();
    wait_assigned(&client, "10.6.3.1", "dst").await;
    wait_assigned(&client, "10.6.3.3", "src").await;
    // The new IP reached the cloud only after the moved one had left the source.
    let calls = cloud.calls();
    let position = |ip: &str, op: Op| {
        let ip = ip.parse().unwrap();
        calls
            .iter()
            .position(|c| c.op == op && c.ips.contains(&ip))
            .unwrap_or_else(|| panic!("no {op:?} of {ip}: {calls:?}"))
    };
    assert!(position("10.6.3.1", Op::Detach) < position("10.6.3.3", Op::Attach));
    assert_eq!(calls_for(&cloud, "10.6.3.3").len(), 1, "{calls:?}");
    assert_no_violations(&cloud);
}

/// A memory cloud that follows AWS's capacity model and reserved indices.
fn aws_like_cloud() -> MemoryCloud {
    MemoryCloud::new(MemoryConfig {
        latency: Duration::from_millis(20),
        platform: Some(Platform::Aws),
        ..MemoryConfig::default()
    })
}

/// Creates `ips` on `node` and checks each is blocked with an Error condition holding
/// `fragments`, and an `AttachBlocked` Event, without any cloud call.
async fn assert_blocked_before_the_cloud(
    client: &Client,
    cloud: &MemoryCloud,
    node: &str,
    cases: &[(&str, &[&str])],
) {
    for (ip, _) in cases {
        create(client, ip, node).await;
    }
    for (ip, fragments) in cases {
        let message = wait_error(client, ip).await;
        for fragment in *fragments {
            assert!(
                message.contains(fragment),
                "{ip}: {fragment:?} not in {message}"
            );
        }
        wait_event(client, ip, "Warning", "AttachBlocked").await;
        assert!(calls_for(cloud, ip).is_empty(), "{ip}: {:?}", cloud.calls());
    }
}

/// The reconciler repeats rule 4 from the node's annotation before the cloud call: an address
/// outside the node's subnet, or at an index the cloud reserves, never reaches the cloud.
#[tokio::test]
async fn subnet_and_reserved_index_are_rechecked_before_the_cloud_call() {
    let (_cp, client) = control_plane().await;
    let cloud = aws_like_cloud();
    let spec = VmSpec {
        capacity: cloudnet_shared::Capacity {
            ipv4: Some(10),
            ipv6: Some(10),
            ip: None,
        },
        ..VmSpec::ipv4("10.0.0.10".parse().unwrap(), 0)
    };
    cloud.add_vm("aws-v4", spec);
    create_node_object(&client, "aws-v4").await;
    let _task = start(client.clone(), &cloud, engine_config());
    wait_annotation(&client, "aws-v4", r#""capacity":{"ipv4":9,"ipv6":10}"#).await;
    assert_blocked_before_the_cloud(
        &client,
        &cloud,
        "aws-v4",
        &[
            (
                "10.0.0.2",
                &["address_index", "reserved by AWS", "10.0.0.0/8"],
            ),
            ("10.255.255.255", &["address_index", "the last address"]),
            (
                "192.168.7.7",
                &["address_index", "outside the node's subnet 10.0.0.0/8"],
            ),
        ],
    )
    .await;
    create(&client, "10.7.0.1", "aws-v4").await;
    wait_assigned(&client, "10.7.0.1", "aws-v4").await;
    assert_no_violations(&cloud);
}

/// With the platform AWS but an annotation carrying only the shared "ip" key (another cloud's
/// keys), the reconciler still limits the node by that key instead of reading it as unlimited.
#[tokio::test]
async fn another_clouds_capacity_key_still_limits_the_node_before_the_cloud_call() {
    let (_cp, client) = control_plane().await;
    let cloud = aws_like_cloud();
    // "ip" capacity 3 (primary + two) although the platform is AWS.
    cloud.add_vm("aws-ip", VmSpec::ipv4("10.0.0.10".parse().unwrap(), 3));
    create_node_object(&client, "aws-ip").await;
    let _task = start(client.clone(), &cloud, engine_config());
    // 3 less the unmanaged primary; before the fix the primary was not counted there either.
    wait_annotation(&client, "aws-ip", r#""capacity":{"ip":"#).await;
    for ip in ["10.7.0.1", "10.7.0.2"] {
        create(&client, ip, "aws-ip").await;
        wait_assigned(&client, ip, "aws-ip").await;
    }
    assert_blocked_before_the_cloud(
        &client,
        &cloud,
        "aws-ip",
        &[(
            "10.7.0.3",
            &[
                "room for 2 egress IPs",
                "capacity \"ip\"",
                "2 come before this one",
            ],
        )],
    )
    .await;
    assert_no_violations(&cloud);
}

/// A cloud's error text can run past the 1 KiB kube-apiserver allows an Event's note: the
/// warning is written with its note cut (on a character boundary), not dropped.
#[tokio::test]
async fn a_warning_with_a_cloud_error_longer_than_a_kibibyte_is_written_cut() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::ZERO);
    add_node(&client, &cloud, "long-error", 10).await;
    let text = format!("InvalidParameterValue: {}", "é".repeat(1500));
    cloud.fail_next(
        Op::Attach,
        Some("long-error"),
        1,
        cloudnet_reconciler::cloud::CloudError::permanent(text.clone()),
    );
    let _task = start(client.clone(), &cloud, engine_config());
    create(&client, "10.6.9.1", "long-error").await;
    wait_until(
        Duration::from_secs(30),
        "the warning carrying the cloud's long error",
        || async {
            events_about(&client, "10.6.9.1")
                .await
                .iter()
                .any(|(t, _, note)| t == "Warning" && note.contains("InvalidParameterValue"))
        },
    )
    .await;
    let events = events_about(&client, "10.6.9.1").await;
    let (_, _, note) = events
        .iter()
        .find(|(t, _, note)| t == "Warning" && note.contains("InvalidParameterValue"))
        .unwrap();
    assert!(note.len() <= 1024, "{} bytes", note.len());
    assert!(note.ends_with('…'), "{note}");
}
