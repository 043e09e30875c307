//! Nothing cloudnet did not attach is taken over or detached (SPEC §2.3): an address another
//! controller or tool put on a node's interface, and the node's own, on the real control plane
//! with the memory cloud and with the AWS provider on moto behind the fault proxy (IPv4 and
//! IPv6).
//!
//! How the finding was reproduced: an object created with `spec.node: ""` (so admission's
//! node-IP rule passes), another tool assigning the address to node A's interface, then
//! `spec.node: A` (updates skip that rule): the object went `Assigned=True` with no call, and
//! its delete unassigned the other tool's address.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::e2e::ec2::{addresses, create_network, moto_settings, run_instances};
use cloudnet_e2e::harness::e2e::plugin::register_node;
use cloudnet_reconciler::cloud::aws::{AwsProvider, build_sdk_client};
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::encode_name;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::support::*;

/// How an attach refused as foreign reads: upstream's failure text, then ours.
const REFUSED: &str = "Error processing cloud assignment request, err: foreign address:";

/// Waits until object `ip` reports the foreign refusal on `node`, and returns its message.
async fn wait_refused(client: &Client, ip: &str, node: &str) -> String {
    wait_until(
        Duration::from_secs(30),
        &format!("{ip} refused as foreign on {node}"),
        || async move {
            condition(client, ip)
                .await
                .is_some_and(|(status, reason, message, at)| {
                    status == "False"
                        && reason == "CloudResponseError"
                        && message.starts_with(REFUSED)
                        && at == node
                })
        },
    )
    .await;
    condition(client, ip).await.unwrap().2
}

/// Asserts a Warning Event `reason` about object `ip` says `fragment`, waiting for it: Events
/// are written after the status, on their own (a full `make test` once read none yet).
async fn assert_event(client: &Client, ip: &str, reason: &str, fragment: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let events = events_about(client, ip).await;
        let found = events
            .iter()
            .any(|(kind, r, note)| kind == "Warning" && r == reason && note.contains(fragment));
        if found {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Warning {reason} saying {fragment:?} about {ip}: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_address_another_tool_put_on_the_node_is_refused_and_survives_the_objects_delete() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "a", 10).await;
    let _task = start(client.clone(), &cloud, engine_config());
    wait_annotation(&client, "a", "\"interface\"").await;

    let ip = "10.1.0.7";
    create(&client, ip, "").await;
    cloud.add_out_of_band("a", ip.parse().unwrap());
    retarget(&client, ip, "a").await;
    let message = wait_refused(&client, ip, "a").await;
    assert!(
        message.contains("did not attach it"),
        "the message says why: {message}"
    );
    assert_event(&client, ip, "ForeignAddress", "foreign address").await;
    assert!(
        calls_for(&cloud, ip).is_empty(),
        "{:?}",
        calls_for(&cloud, ip)
    );
    assert!(ledger_entries(&client, ip).await.is_empty());

    delete(&client, ip).await;
    wait_gone(&client, ip).await;
    assert_eq!(
        cloud.owner_of(ip.parse().unwrap()).as_deref(),
        Some("a"),
        "the other tool's address stays"
    );
    assert!(
        calls_for(&cloud, ip).is_empty(),
        "{:?}",
        calls_for(&cloud, ip)
    );
    assert_event(&client, ip, "DetachSkipped", "another controller or tool").await;

    // Once the other tool has let go, the object is attached as any other.
    let ip = "10.1.0.8";
    create(&client, ip, "").await;
    cloud.add_out_of_band("a", ip.parse().unwrap());
    retarget(&client, ip, "a").await;
    wait_refused(&client, ip, "a").await;
    cloud.remove_out_of_band("a", ip.parse().unwrap());
    // The refusal is retried no sooner than 30 s (the cloud's refusals' floor).
    wait_until(Duration::from_secs(90), "attached once free", || async {
        objects(&client)
            .get_opt(ip)
            .await
            .ok()
            .flatten()
            .is_some_and(|o| o.is_assigned())
    })
    .await;
    assert_eq!(
        calls_for(&cloud, ip).len(),
        1,
        "{:?}",
        calls_for(&cloud, ip)
    );
    assert_no_violations(&cloud);
}

#[tokio::test]
async fn the_nodes_own_address_is_never_attached_nor_detached_whatever_the_ledger_says() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "a", 10).await;
    // A page an earlier version wrote when it took the node's own address over.
    let own = "10.0.0.1";
    let pages: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let page = ConfigMap {
        metadata: ObjectMeta {
            name: Some("cloudnet-ledger-0".into()),
            labels: Some(BTreeMap::from([(
                cloudnet_reconciler::engine::ledger::LABEL.into(),
                "v1".into(),
            )])),
            annotations: Some(BTreeMap::from([(
                cloudnet_reconciler::engine::ledger::INSTANCE_ANNOTATION.into(),
                "a".into(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(own.into(), "a".into())])),
        ..ConfigMap::default()
    };
    pages.create(&PostParams::default(), &page).await.unwrap();
    create(&client, own, "a").await;
    adopt(&client, own, "a").await;
    let _task = start(client.clone(), &cloud, engine_config());

    delete(&client, own).await;
    wait_gone(&client, own).await;
    assert!(
        calls_for(&cloud, own).is_empty(),
        "{:?}",
        calls_for(&cloud, own)
    );
    assert_event(&client, own, "DetachSkipped", "node's own address").await;
    wait_until(Duration::from_secs(10), "the stale record gone", || async {
        ledger_entries(&client, own).await.is_empty()
    })
    .await;

    // Aimed at the node afresh (admission lets a move through): refused, no call.
    create(&client, own, "").await;
    retarget(&client, own, "a").await;
    let message = wait_refused(&client, own, "a").await;
    assert!(message.contains("node's own address"), "{message}");
    assert!(
        calls_for(&cloud, own).is_empty(),
        "{:?}",
        calls_for(&cloud, own)
    );
}

/// The finding on EC2 as moto serves it, every call counted at the fault proxy: the other
/// tool's IPv4 and IPv6 addresses are refused with no mutating call, and survive the deletes.
#[tokio::test]
async fn on_ec2_another_tools_ipv4_and_ipv6_addresses_are_neither_taken_over_nor_unassigned() {
    const REGION: &str = "me-south-1";
    let (_cp, client) = control_plane().await;
    let moto = MotoServer::shared().await.unwrap();
    let direct = moto_settings(moto.url(), REGION);
    let ec2 = build_sdk_client(&direct.client, &direct.credentials).unwrap();
    let network = create_network(&ec2, "10.0.0.0/16".parse().unwrap())
        .await
        .unwrap();
    let instance = run_instances(&ec2, &network, InstanceType::M5Large, 1)
        .await
        .unwrap()
        .remove(0);
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    let provider = AwsProvider::new(&moto_settings(proxy.url(), REGION)).unwrap();
    register_node(&client, "a", &instance.provider_id(), instance.primary_ipv4)
        .await
        .unwrap();
    let _task = tokio::spawn(cloudnet_reconciler::controller::run(
        client.clone(),
        Arc::new(provider),
        engine_config(),
        Arc::new(Metrics::default()),
        "test".into(),
        std::future::pending(),
    ));
    wait_annotation(&client, "a", "\"interface\"").await;

    let [a, b, c, _] = network.ipv4.network().octets();
    let v4 = IpAddr::from([a, b, c, 77]);
    let mut segments = network.ipv6.network().segments();
    segments[7] = 0x77;
    let v6 = IpAddr::from(segments);
    let names = [encode_name(v4).unwrap(), encode_name(v6).unwrap()];
    for name in &names {
        create(&client, name, "").await;
    }
    ec2.assign_private_ip_addresses()
        .network_interface_id(&instance.eni)
        .private_ip_addresses(v4.to_string())
        .send()
        .await
        .unwrap();
    ec2.assign_ipv6_addresses()
        .network_interface_id(&instance.eni)
        .ipv6_addresses(v6.to_string())
        .send()
        .await
        .unwrap();
    let mutations = || {
        proxy.forwarded_where(|route| route.starts_with("Assign") || route.starts_with("Unassign"))
    };
    for name in &names {
        retarget(&client, name, "a").await;
    }
    for name in &names {
        wait_refused(&client, name, "a").await;
        assert_event(&client, name, "ForeignAddress", "did not attach it").await;
        assert!(ledger_entries(&client, name).await.is_empty());
    }
    assert_eq!(mutations(), 0, "{:?}", proxy.all_counts());

    for name in &names {
        delete(&client, name).await;
    }
    for name in &names {
        wait_gone(&client, name).await;
    }
    assert_eq!(mutations(), 0, "{:?}", proxy.all_counts());
    let on_eni = addresses(&ec2, &[instance.eni.as_str()]).await.unwrap();
    for ip in [v4, v6] {
        assert!(on_eni[0].1.contains(&ip), "{ip} was taken off: {on_eni:?}");
    }
}
