#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The whole system under a hostile EC2: with the fault proxy adding 200 ms to every call and
//! throttling 20% of them, 200 objects over 20 nodes all converge (and then all delete), and EC2
//! sees at most one mutating call per family and kind per (node, batch) pair the reconciler formed
//! — not one per IP. The pairs come from the reconciler's own metrics; the calls from the proxy.
//! Once converged, the capacity metrics show each node's ten IPs per family and no wait; at the
//! end every metric the shipped Grafana dashboard queries is on the reconciler's or the webhook's
//! `/metrics` (this run has cloud errors to show too).
//!
//! A test binary of its own: the faults apply to the whole system it starts.

use std::net::IpAddr;
use std::time::Duration;

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::{RouteMatch, Rule};
use cloudnet_e2e::harness::e2e::{Cluster, ec2, metrics, plugin, wait};
use cloudnet_shared::encode_name;
use futures::StreamExt;

const NODES: usize = 20;
const PER_FAMILY: usize = 5;
const CONVERGE: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_objects_on_twenty_nodes_converge_under_throttling_with_calls_per_batch_not_per_ip()
 {
    let cluster = tokio::task::spawn_blocking(|| Cluster::shared(module_path!()))
        .await
        .unwrap();
    let client = cluster.client().await.unwrap();
    let ec2 = cluster.ec2().unwrap();
    let network = ec2::create_network(&ec2, "10.1.0.0/16".parse().unwrap())
        .await
        .unwrap();
    let instances = ec2::run_instances(&ec2, &network, InstanceType::M5Large, NODES as i32)
        .await
        .unwrap();
    if let Some(proxy) = cluster.proxy() {
        proxy.set_rule(
            RouteMatch::Any,
            Rule::PASS
                .with_latency(Duration::from_millis(200))
                .with_throttle(0.2),
        );
    }

    let nodes: Vec<String> = (0..NODES).map(|n| format!("e2e-load-{n:02}")).collect();
    for (node, instance) in nodes.iter().zip(&instances) {
        plugin::create_node(&client, node, instance).await.unwrap();
    }
    for node in &nodes {
        plugin::wait_annotation(&client, node)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics()));
    }

    // Five IPv4 and five IPv6 addresses per node.
    let mut wanted: Vec<(IpAddr, usize)> = Vec::new();
    for n in 0..NODES {
        for i in 0..PER_FAMILY {
            let mut v4 = network.ipv4.broadcast().octets();
            v4[3] = (10 + n * PER_FAMILY + i) as u8;
            wanted.push((IpAddr::from(v4), n));
            let mut v6 = network.ipv6.network().segments();
            v6[6] = n as u16 + 1;
            v6[7] = 0x10 + i as u16;
            wanted.push((IpAddr::from(v6), n));
        }
    }
    assert_eq!(wanted.len(), 200);
    let mutations_before = cluster.ec2_mutations();
    futures::stream::iter(&wanted)
        .for_each_concurrent(16, |(ip, n)| {
            let client = client.clone();
            let node = nodes[*n].clone();
            async move {
                plugin::create(&client, &encode_name(*ip).unwrap(), &node)
                    .await
                    .unwrap();
            }
        })
        .await;
    cluster
        .wait_objects(&client, CONVERGE, "all 200 objects Assigned=True", |m| {
            m.len() == wanted.len() && m.values().all(|a| *a)
        })
        .await
        .unwrap();

    // The EC2 side: every IP on its own node's primary ENI.
    let enis: Vec<&str> = instances.iter().map(|i| i.eni.as_str()).collect();
    let on = ec2::addresses(&ec2, &enis).await.unwrap();
    for (ip, n) in &wanted {
        assert!(on[*n].1.contains(ip), "{ip} not on {}", instances[*n].eni);
    }
    if cluster.local().is_some() {
        assert_capacity_at_a_glance(cluster, &nodes).await;
    }
    let attach_counts = cluster.proxy().map(|p| p.all_counts());
    let attach_metrics = cluster.reconciler_metrics().await.unwrap();

    for (ip, _) in &wanted {
        plugin::delete(&client, &encode_name(*ip).unwrap())
            .await
            .unwrap();
    }
    cluster
        .wait_objects(&client, CONVERGE, "all 200 objects deleted", |m| {
            m.is_empty()
        })
        .await
        .unwrap();
    let on = ec2::addresses(&ec2, &enis).await.unwrap();
    for (ip, n) in &wanted {
        assert!(
            !on[*n].1.contains(ip),
            "{ip} still on {}",
            instances[*n].eni
        );
    }

    let (Some(proxy), Some(text), Some(before), Some(attach_counts), Some(attach_text)) = (
        cluster.proxy(),
        cluster.reconciler_metrics().await.unwrap(),
        mutations_before,
        attach_counts,
        attach_metrics,
    ) else {
        println!("no fault proxy on this cluster: call counts not checked");
        return;
    };
    proxy.clear_rules();
    assert_eq!(before, 0, "no mutation before the objects existed");
    let counts = proxy.all_counts();
    let forwarded = |route: &str| counts.get(route).map_or(0, |c| c.forwarded);
    let throttled: u64 = counts.values().map(|c| c.throttled).sum();
    let calls_metric = "cloudnet_cloud_call_duration_seconds_count";
    let ips_metric = "cloudnet_cloud_call_ips_total";
    // Every change (one node's batch) is one `apply`; the phases are apart in time.
    let attach_pairs = metrics::operation_count(&attach_text, calls_metric, "apply");
    let detach_pairs = metrics::operation_count(&text, calls_metric, "apply") - attach_pairs;
    let assign = |route: &str| attach_counts.get(route).map_or(0, |c| c.forwarded);
    let (assign_v4, assign_v6) = (
        assign("AssignPrivateIpAddresses"),
        assign("AssignIpv6Addresses"),
    );
    let (unassign_v4, unassign_v6) = (
        forwarded("UnassignPrivateIpAddresses"),
        forwarded("UnassignIpv6Addresses"),
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "200 objects on {NODES} nodes, 200 ms latency, 20% throttling (load {})\n\
         phase   (node,batch) pairs  IPs carried  IPv4 calls  IPv6 calls\n\
         attach  {attach_pairs:>18}  {:>11}  {assign_v4:>10}  {assign_v6:>10}\n\
         detach  {detach_pairs:>18}  {:>11}  {unassign_v4:>10}  {unassign_v6:>10}\n\
         throttled answers injected: {throttled}; per route: {counts:?}",
        load.trim(),
        metrics::operation_count(&text, ips_metric, "attach"),
        metrics::operation_count(&text, ips_metric, "detach"),
    );
    assert!(throttled > 0, "the run must actually have been throttled");
    // Each (node, batch) pair costs at most one forwarded call per family, however many IPs.
    assert!(assign_v4 <= attach_pairs && assign_v6 <= attach_pairs);
    assert!(unassign_v4 <= detach_pairs && unassign_v6 <= detach_pairs);
    assert!(
        attach_pairs < wanted.len() as u64 && detach_pairs < wanted.len() as u64,
        "batches must carry several IPs: {attach_pairs} attach and {detach_pairs} detach pairs"
    );

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cloudnet_e2e::crate_file(
            "../manifests/monitoring/base/dashboard.json",
        ))
        .unwrap(),
    )
    .unwrap();
    let webhook_text = cluster.webhook_metrics().await.unwrap().unwrap();
    let queried = metrics::dashboard_metrics(&dashboard);
    assert!(queried.len() >= 10, "{queried:?}");
    for metric in queried.iter().filter(|m| !metrics::is_gateway_metric(m)) {
        assert!(
            metrics::exposes(&text, metric) || metrics::exposes(&webhook_text, metric),
            "the dashboard queries {metric}, which neither binary exposes"
        );
    }
}

/// The leader's capacity metrics after convergence: every node holds its five IPs of each family
/// within what its m5.large interface offers, all 200 objects are CloudResponseSuccess, and none
/// waits. The node gauges follow the annotation's debounced recomputation: waited for.
async fn assert_capacity_at_a_glance(cluster: &Cluster, nodes: &[String]) {
    let room = |text: &str, metric: &str, node: &str, family: &str| {
        let (node, family) = (format!("node=\"{node}\""), format!("family=\"{family}\""));
        metrics::sum(text, metric, &[node.as_str(), family.as_str()])
    };
    let settled = wait::until(
        Duration::from_secs(60),
        "every node's used egress IPs to read 5 per family",
        || async move {
            let text = cluster.reconciler_metrics().await?.unwrap_or_default();
            Ok(nodes.iter().all(|node| {
                ["ipv4", "ipv6"].iter().all(|family| {
                    room(&text, "cloudnet_node_egress_ips_used", node, family) == PER_FAMILY as f64
                })
            }))
        },
    )
    .await;
    let text = cluster.reconciler_metrics().await.unwrap().unwrap();
    settled.unwrap_or_else(|e| panic!("{e:#}\n{text}"));
    for node in nodes {
        for family in ["ipv4", "ipv6"] {
            let capacity = room(&text, "cloudnet_node_egress_ips_capacity", node, family);
            assert!(
                capacity >= PER_FAMILY as f64,
                "{node} {family}: capacity {capacity}"
            );
        }
    }
    let success = ["reason=\"CloudResponseSuccess\""];
    assert_eq!(
        metrics::sum(&text, "cloudnet_ips_by_reason", &success),
        200.0,
        "{text}"
    );
    assert_eq!(
        metrics::sum(&text, "cloudnet_oldest_not_assigned_age_seconds", &[]),
        0.0
    );
}
