#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The whole system on GCP under a hostile GCE: with the fault proxy adding 200 ms to every call
//! and throttling 20% of them (429 `rateLimitExceeded`), 200 objects over 20 VMs all converge
//! (and then all delete), and GCE sees at most one `updateNetworkInterface` per (node, batch)
//! pair the reconciler formed — not one per IP. The pairs come from the reconciler's own
//! metrics; the PATCHes from the proxy.
//!
//! A test binary of its own: the faults apply to the whole system it starts.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use cloudnet_e2e::fakes::faultproxy::{RouteMatch, Rule};
use cloudnet_e2e::harness::e2e::gce::{GCE_MUTATION, Gce};
use cloudnet_e2e::harness::e2e::{Cluster, metrics, plugin};
use cloudnet_shared::encode_name;
use futures::StreamExt;

const NODES: usize = 20;
const PER_NODE: usize = 10;
const CONVERGE: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_objects_on_twenty_vms_converge_under_throttling_with_a_patch_per_batch_not_per_ip()
 {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::shared_with(module_path!(), || async {
            Cluster::start_local_with(Box::new(Gce::start().await?)).await
        })
    })
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let gce: &Gce = cluster.cloud().unwrap();
    let proxy = cluster.proxy().unwrap();
    proxy.set_rule(
        RouteMatch::Any,
        Rule::PASS
            .with_latency(Duration::from_millis(200))
            .with_throttle(0.2),
    );

    let nodes: Vec<String> = (0..NODES).map(|n| format!("gcp-load-{n:02}")).collect();
    for node in &nodes {
        let vm = gce.add_vm(node).unwrap();
        plugin::register_node(&client, node, &vm.provider_id(), IpAddr::V4(vm.network_ip))
            .await
            .unwrap();
    }
    for node in &nodes {
        plugin::wait_annotation(&client, node)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics()));
    }

    // Ten addresses per VM, each VM's in a /24 of its own.
    let base = u32::from(gce.range().network());
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
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let on = gce.aliases(&names);
    for (ip, n) in &wanted {
        assert!(on[*n].contains(ip), "{ip} not an alias of {}", nodes[*n]);
    }
    let attach_patches = proxy.counts(GCE_MUTATION).forwarded;
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
    let on = gce.aliases(&names);
    assert!(on.iter().all(BTreeSet::is_empty), "aliases left: {on:?}");

    let text = cluster.reconciler_metrics().await.unwrap().unwrap();
    let counts = proxy.all_counts();
    proxy.clear_rules();
    assert_eq!(before, 0, "no PATCH before the objects existed");
    let throttled: u64 = counts.values().map(|c| c.throttled).sum();
    let calls_metric = "cloudnet_cloud_call_duration_seconds_count";
    let attach_pairs = metrics::operation_count(&attach_text, calls_metric, "apply");
    let detach_pairs = metrics::operation_count(&text, calls_metric, "apply") - attach_pairs;
    let detach_patches = proxy.counts(GCE_MUTATION).forwarded - attach_patches;
    let reads: u64 = counts
        .iter()
        .filter(|(route, _)| route.as_str() == "instances.get")
        .map(|(_, c)| c.forwarded)
        .sum();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "200 objects on {NODES} VMs, 200 ms latency, 20% throttling (load {})\n\
         phase   (node,batch) pairs  PATCHes\n\
         attach  {attach_pairs:>18}  {attach_patches:>7}\n\
         detach  {detach_pairs:>18}  {detach_patches:>7}\n\
         instances.get forwarded: {reads}; throttled answers injected: {throttled}",
        load.trim(),
    );
    assert!(throttled > 0, "the run must actually have been throttled");
    assert!(
        attach_patches <= attach_pairs && detach_patches <= detach_pairs,
        "at most one PATCH per (node, batch) pair"
    );
    assert!(
        attach_pairs < wanted.len() as u64 && detach_pairs < wanted.len() as u64,
        "batches must carry several IPs: {attach_pairs} attach and {detach_pairs} detach pairs"
    );
    assert_eq!(gce.fake().violations(), Vec::<String>::new());
}
