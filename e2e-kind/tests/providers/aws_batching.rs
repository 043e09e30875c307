#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Batching under a hostile EC2: 200 IPs over 20 instances, with the proxy adding 200 ms to every
//! call and throttling 20% of them. Every IP must land, and EC2 must see one mutating call per
//! node and family, not one per IP.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::e2e::ec2::{create_network, moto_settings, run_instances};
use cloudnet_reconciler::cloud::aws::{AwsProvider, AwsSettings, RetryPolicy, build_sdk_client};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{CloudProvider, CloudProviderExt, InstanceId, NodeTarget};

const REGION: &str = "sa-east-1";
const NODES: usize = 20;
const IPV4_PER_NODE: u8 = 5;
const IPV6_PER_NODE: u16 = 5;

/// The shared moto settings with the published pacing and more patient retries.
fn settings(endpoint: &str) -> AwsSettings {
    AwsSettings {
        retry: RetryPolicy {
            min_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(500),
            max_attempts: 12,
        },
        pacing: Pacing::PUBLISHED,
        ..moto_settings(endpoint, REGION)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_ips_on_twenty_nodes_converge_under_throttling_with_one_call_per_node_and_family()
 {
    let moto = MotoServer::shared().await.unwrap();
    let setup = settings(moto.url());
    let ec2 = build_sdk_client(&setup.client, &setup.credentials).unwrap();
    let network = create_network(&ec2, "10.1.0.0/16".parse().unwrap())
        .await
        .unwrap();
    let instances: Vec<String> = run_instances(&ec2, &network, InstanceType::M5Large, NODES as i32)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(instances.len(), NODES);

    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .seed(2024)
        .start()
        .await
        .unwrap();
    proxy.set_rule(
        RouteMatch::Any,
        Rule::PASS
            .with_latency(Duration::from_millis(200))
            .with_throttle(0.2),
    );
    let provider = Arc::new(AwsProvider::new(&settings(proxy.url())).unwrap());

    let mut work = Vec::new();
    for (n, instance) in instances.iter().enumerate() {
        let node = NodeTarget {
            node_name: format!("batch-node-{n}"),
            provider_id: format!("aws:///{REGION}a/{instance}"),
            instance: InstanceId(instance.clone()),
            internal_ips: Default::default(),
        };
        // Well past the instances' primary addresses, which moto hands out from the subnet start.
        let first = u32::from(network.ipv4.network()) + 1024 + n as u32 * u32::from(IPV4_PER_NODE);
        let mut ips: Vec<IpAddr> = (0..u32::from(IPV4_PER_NODE))
            .map(|i| IpAddr::V4(Ipv4Addr::from(first + i)))
            .collect();
        let mut v6 = network.ipv6.network().segments();
        v6[6] = n as u16 + 1;
        ips.extend((0..IPV6_PER_NODE).map(|i| {
            v6[7] = 0x10 + i;
            IpAddr::V6(v6.into())
        }));
        let provider = Arc::clone(&provider);
        work.push(tokio::spawn(async move {
            let outcome = provider.attach(&node, &ips).await;
            (node, ips, outcome)
        }));
    }

    let mut done = Vec::new();
    for task in work {
        done.push(task.await.unwrap());
    }
    // Faults off for the checks: they read the result, they are not part of the run.
    proxy.clear_rules();
    let counts = proxy.all_counts();
    let mut total = 0;
    for (node, ips, outcome) in done {
        outcome.unwrap_or_else(|e| panic!("{}: {e}", node.node_name));
        let attached = provider.egress_config(&node).await.unwrap().addresses;
        for ip in &ips {
            assert!(attached.contains(ip), "{ip} missing on {}", node.node_name);
        }
        total += ips.len();
    }
    assert_eq!(total, 200);

    let v4 = counts
        .get("AssignPrivateIpAddresses")
        .copied()
        .unwrap_or_default();
    let v6 = counts
        .get("AssignIpv6Addresses")
        .copied()
        .unwrap_or_default();
    // One (node, batch) pair per node; each pair costs at most one forwarded call per family.
    assert_eq!(v4.forwarded, NODES as u64, "{v4:?}");
    assert_eq!(v6.forwarded, NODES as u64, "{v6:?}");
    // Twenty nodes of one instance type: its limits are fetched once, not once per node.
    let types = counts
        .get("DescribeInstanceTypes")
        .copied()
        .unwrap_or_default();
    assert_eq!(types.forwarded, 1, "{types:?}");
    // All twenty in one subnet: its CIDRs are read once too, not once per attach batch.
    let subnets = counts.get("DescribeSubnets").copied().unwrap_or_default();
    assert_eq!(subnets.forwarded, 1, "{subnets:?}");
    let throttled: u64 = counts.values().map(|c| c.throttled).sum();
    assert!(throttled > 0, "the run must actually have been throttled");
    println!(
        "200 IPs on {NODES} nodes: {} IPv4 + {} IPv6 assign calls forwarded, {} + {} throttled; \
         {throttled} throttled calls in all; counts per route: {:?}",
        v4.forwarded, v6.forwarded, v4.throttled, v6.throttled, counts
    );
}
