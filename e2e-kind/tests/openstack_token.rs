//! A Keystone token expiring between calls: the provider authenticates again, by itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use cloudnet_e2e::openstack::{OpenStackServers, Options};
use cloudnet_reconciler::cloud::openstack::{CloudConfig, OpenStackProvider, OpenStackSettings};
use cloudnet_reconciler::cloud::{CloudProvider, InstanceId, NodeTarget};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_replaced_without_failing_a_call() {
    let servers = OpenStackServers::start(Options {
        token_expiration_secs: 10,
        ..Options::default()
    })
    .await
    .unwrap();
    let api = servers.api(&servers.member).await.unwrap();
    let network = api
        .create("network", json!({"name": "token"}))
        .await
        .unwrap();
    let net = network["id"].as_str().unwrap();
    let subnet = api
        .create(
            "subnet",
            json!({"network_id": net, "ip_version": 4, "cidr": "10.9.0.0/24"}),
        )
        .await
        .unwrap();
    let server = "00000009-0000-4000-8000-000000000001";
    api.create(
        "port",
        json!({"network_id": net, "device_id": server, "device_owner": "compute:nova",
               "fixed_ips": [{"subnet_id": subnet["id"]}]}),
    )
    .await
    .unwrap();
    let cloud = OpenStackProvider::new(&OpenStackSettings {
        cloud: CloudConfig::parse(
            Path::new("clouds.yaml"),
            &servers.clouds_yaml(&servers.member),
        )
        .unwrap(),
        ca_pem: None,
        network_url: None,
        max_pairs: 10,
        call_timeout: Duration::from_secs(60),
    })
    .unwrap();
    let node = NodeTarget {
        node_name: "n".into(),
        provider_id: format!("openstack:///{server}"),
        instance: InstanceId(server.into()),
    };
    let first = Instant::now();
    cloud.egress_config(&node).await.unwrap();
    // Calls keep succeeding across at least one full token lifetime (two to be safe).
    while first.elapsed() < Duration::from_secs(25) {
        cloud.egress_config(&node).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
