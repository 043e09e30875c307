//! A reconcile holds no slot while its IP waits for its VM's call: it hands the IP to the lane and
//! ends, and the lane's answer reconciles the object again. With one slot, an IP whose call hangs
//! must not hold up another object's attach. (The memory cloud counts a hung call as in flight
//! for good, so the retry after its deadline overlaps it there: these tests check only that no
//! IP is on two VMs.)

use std::time::Duration;

use cloudnet_reconciler::cloud::memory::{FaultAction, Op};
use cloudnet_reconciler::controller::EngineConfig;

use crate::support::*;

/// One reconcile at a time, and a hung call ends (with a retryable error) after 20 s: long
/// enough for another object to be assigned meanwhile on a loaded machine, short enough for the
/// hung one to be retried within the waits below.
fn one_slot() -> EngineConfig {
    EngineConfig {
        concurrency: 1,
        call_deadline: Duration::from_secs(20),
        ..engine_config()
    }
}

/// Asserts that object `ip`'s call is still under way.
async fn assert_pending(client: &kube::Client, ip: &str, why: &str) {
    let reason = condition(client, ip).await.map(|c| c.1);
    assert_eq!(reason.as_deref(), Some("CloudResponsePending"), "{why}");
}

/// Only that no IP is ever on two VMs (see the module's comment).
fn assert_never_on_two_vms(cloud: &cloudnet_reconciler::cloud::memory::MemoryCloud) {
    let twice: Vec<String> = cloud
        .violations()
        .into_iter()
        .filter(|v| !v.contains("overlap"))
        .collect();
    assert!(twice.is_empty(), "{twice:?}");
}

/// Waits until object `ip`'s condition says its call is under way.
async fn wait_pending(client: &kube::Client, ip: &str) {
    wait_until(
        Duration::from_secs(30),
        &format!("{ip}'s call under way"),
        || async move {
            condition(client, ip)
                .await
                .is_some_and(|(_, reason, _, _)| reason == "CloudResponsePending")
        },
    )
    .await;
}

#[tokio::test]
async fn an_attach_waiting_for_its_call_leaves_the_only_slot_to_other_objects() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::ZERO);
    add_node(&client, &cloud, "slot-a", 10).await;
    add_node(&client, &cloud, "slot-b", 10).await;
    cloud.inject(Op::Attach, Some("slot-a"), Some(1), FaultAction::Hang);
    let _task = start(client.clone(), &cloud, one_slot());
    create(&client, "10.9.1.1", "slot-a").await;
    wait_pending(&client, "10.9.1.1").await;
    create(&client, "10.9.1.2", "slot-b").await;
    wait_assigned(&client, "10.9.1.2", "slot-b").await;
    assert_pending(&client, "10.9.1.1", "the other object waited for this call").await;
    // The hung call fails at its deadline; the retry attaches the IP.
    wait_assigned(&client, "10.9.1.1", "slot-a").await;
    // The Event follows the status write.
    wait_until(
        Duration::from_secs(30),
        "AttachFailed, then Attached",
        || {
            let client = client.clone();
            async move {
                let reasons: Vec<String> = events_about(&client, "10.9.1.1")
                    .await
                    .into_iter()
                    .map(|(_, reason, _)| reason)
                    .collect();
                reasons.iter().any(|r| r == "AttachFailed")
                    && reasons.iter().any(|r| r == "Attached")
            }
        },
    )
    .await;
    assert_never_on_two_vms(&cloud);
}

#[tokio::test]
async fn a_detach_waiting_for_its_call_leaves_the_only_slot_to_other_objects() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::ZERO);
    add_node(&client, &cloud, "slot-c", 10).await;
    add_node(&client, &cloud, "slot-d", 10).await;
    let _task = start(client.clone(), &cloud, one_slot());
    create(&client, "10.9.2.1", "slot-c").await;
    wait_assigned(&client, "10.9.2.1", "slot-c").await;
    cloud.inject(Op::Detach, Some("slot-c"), Some(1), FaultAction::Hang);
    delete(&client, "10.9.2.1").await;
    wait_pending(&client, "10.9.2.1").await;
    create(&client, "10.9.2.2", "slot-d").await;
    wait_assigned(&client, "10.9.2.2", "slot-d").await;
    assert!(
        objects(&client)
            .get_opt("10.9.2.1")
            .await
            .unwrap()
            .is_some(),
        "the delete is held up by its hung call"
    );
    // The hung call fails at its deadline; the retry detaches the IP and the object goes.
    wait_gone(&client, "10.9.2.1").await;
    let ip = "10.9.2.1".parse().unwrap();
    assert_eq!(cloud.owner_of(ip), None);
    assert_never_on_two_vms(&cloud);
}
