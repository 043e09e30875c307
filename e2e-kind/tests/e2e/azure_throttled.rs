#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The whole system on Azure under a hostile Resource Manager: with the fault proxy adding 200 ms
//! to every ARM call and throttling 20% of them (429 `TooManyRequests`/`RetryableError` with
//! `Retry-After`), 200 objects over 20 VMs all converge (and then all delete), and ARM sees at
//! most one NIC PUT per (node, batch) pair the reconciler formed — not one per IP. The pairs come
//! from the reconciler's own metrics; the PUTs from the proxy.
//!
//! A test binary of its own: the faults apply to the whole system it starts.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use cloudnet_e2e::fakes::faultproxy::{RouteMatch, Rule};
use cloudnet_e2e::harness::e2e::arm::{Arm, ArmVm, is_nic_put};
use cloudnet_e2e::harness::e2e::{Cluster, metrics, plugin};
use cloudnet_shared::encode_name;
use futures::StreamExt;

const NODES: usize = 20;
const PER_NODE: usize = 10;
const CONVERGE: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_objects_on_twenty_vms_converge_under_throttling_with_a_put_per_batch_not_per_ip()
 {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::shared_with(module_path!(), || async {
            Cluster::start_local_with(Box::new(Arm::start().await?)).await
        })
    })
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let arm: &Arm = cluster.cloud().unwrap();
    let proxy = cluster.proxy().unwrap();
    proxy.set_rule(
        RouteMatch::Any,
        Rule::PASS
            .with_latency(Duration::from_millis(200))
            .with_throttle(0.2),
    );

    let nodes: Vec<String> = (0..NODES).map(|n| format!("az-load-{n:02}")).collect();
    let mut vms: Vec<ArmVm> = Vec::new();
    for node in &nodes {
        let vm = arm.add_vm(node).unwrap();
        plugin::register_node(
            &client,
            node,
            &vm.ids.provider_id,
            IpAddr::V4(vm.primary_ip),
        )
        .await
        .unwrap();
        vms.push(vm);
    }
    for node in &nodes {
        plugin::wait_annotation(&client, node)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics()));
    }

    // Ten addresses per VM, each VM's in a /24 of its own.
    let base = u32::from(arm.range().network());
    let wanted: Vec<(IpAddr, usize)> = (0..NODES)
        .flat_map(|n| {
            (0..PER_NODE).map(move |i| {
                let ip = base | ((n as u32 + 1) << 8) | (10 + i as u32);
                (IpAddr::V4(Ipv4Addr::from(ip)), n)
            })
        })
        .collect();
    assert_eq!(wanted.len(), 200);
    let before = cluster.cloud_mutations().unwrap();
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
    let puts = || -> u64 {
        proxy
            .all_counts()
            .iter()
            .filter(|(route, _)| is_nic_put(route))
            .map(|(_, c)| c.forwarded)
            .sum()
    };
    let refs: Vec<&ArmVm> = vms.iter().collect();
    let on = arm.addresses(&refs);
    for (ip, n) in &wanted {
        assert!(on[*n].contains(ip), "{ip} not on the NIC of {}", nodes[*n]);
    }
    let attach_puts = puts();
    let attach_text = cluster.reconciler_metrics().await.unwrap().unwrap();

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
    let on = arm.addresses(&refs);
    assert!(on.iter().all(BTreeSet::is_empty), "addresses left: {on:?}");

    let text = cluster.reconciler_metrics().await.unwrap().unwrap();
    let counts = proxy.all_counts();
    proxy.clear_rules();
    assert_eq!(before, 0, "no PUT before the objects existed");
    let throttled: u64 = counts.values().map(|c| c.throttled).sum();
    let calls_metric = "cloudnet_cloud_call_duration_seconds_count";
    let attach_pairs = metrics::operation_count(&attach_text, calls_metric, "apply");
    let detach_pairs = metrics::operation_count(&text, calls_metric, "apply") - attach_pairs;
    let detach_puts = puts() - attach_puts;
    let reads: u64 = counts
        .iter()
        .filter(|(route, _)| {
            route.starts_with("GET ")
                && route.contains("/providers/Microsoft.Network/networkInterfaces/")
        })
        .map(|(_, c)| c.forwarded)
        .sum();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "200 objects on {NODES} VMs, 200 ms latency, 20% throttling (load {})\n\
         phase   (node,batch) pairs  NIC PUTs\n\
         attach  {attach_pairs:>18}  {attach_puts:>7}\n\
         detach  {detach_pairs:>18}  {detach_puts:>7}\n\
         NIC GETs forwarded: {reads}; throttled answers injected: {throttled}",
        load.trim(),
    );
    assert!(throttled > 0, "the run must actually have been throttled");
    assert!(
        attach_puts <= attach_pairs && detach_puts <= detach_pairs,
        "at most one PUT per (node, batch) pair"
    );
    assert!(
        attach_pairs < wanted.len() as u64 && detach_pairs < wanted.len() as u64,
        "batches must carry several IPs: {attach_pairs} attach and {detach_pairs} detach pairs"
    );
    assert_eq!(arm.fake().schema_violations(), Vec::<String>::new());
}
