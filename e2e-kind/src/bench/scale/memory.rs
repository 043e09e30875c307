//! The scale benchmark's memory-cloud part: the reconciler starts over thousands of Nodes, then
//! tens of thousands of objects arrive at API speed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::watcher::{self, watcher};
use serde_json::{Value, json};

use super::{Row, annotated, assigned, cloud_calls, mib, wait_until};
use crate::ControlPlane;
use crate::bench::{create_memory_nodes, free_addr, peak_rss_bytes, wait_leading};
use crate::harness::controlplane::Supervised;

/// Requests in flight while the fixtures are created.
const IN_FLIGHT_REQUESTS: usize = 64;

/// The memory part's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// Nodes (one memory VM each).
    pub nodes: usize,
    /// Objects, spread round-robin over the nodes.
    pub objects: usize,
    /// The memory cloud's latency per call.
    pub latency: Duration,
    /// The reconciler binary (built with the `memory-cloud` feature).
    pub reconciler_bin: PathBuf,
    /// The longest wait for any one step.
    pub timeout: Duration,
}

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256)
}

/// Runs the part and returns its rows and details.
pub async fn run(params: &Params) -> Result<(Vec<Row>, Value)> {
    ensure!(
        params.nodes > 0 && params.objects < 65536 * 200,
        "need at least one node and fewer objects than the address plan holds"
    );
    let cp = ControlPlane::start_with_crd().await?;
    let client = cp.client().await?;
    let names: Vec<String> = (0..params.nodes).map(|i| format!("scale-{i:05}")).collect();
    create_memory_nodes(&client, &names, IN_FLIGHT_REQUESTS).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let objects: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let (node_cache, writer) = reflector::store();
    let watch = reflector(writer, watcher(nodes, watcher::Config::default()));
    let node_watch = tokio::spawn(watch.for_each(|_| std::future::ready(())));
    let (object_cache, writer) = reflector::store();
    let watch = reflector(writer, watcher(objects.clone(), watcher::Config::default()));
    let object_watch = tokio::spawn(watch.for_each(|_| std::future::ready(())));
    node_cache.wait_until_ready().await?;
    object_cache.wait_until_ready().await?;

    // Step 1: the reconciler starts over the Nodes, leads, and annotates every one.
    let metrics_addr = free_addr()?;
    let metrics_url = format!("http://{metrics_addr}/metrics");
    let mut command = Command::new(&params.reconciler_bin);
    command
        .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
        .args([
            "--secret-name=bench",
            "--platform-type=Memory",
            "--controller-namespace=default",
            "--drift-period=0",
            "--log-format=json",
        ])
        .arg(format!(
            "--memory-latency-ms={}",
            params.latency.as_millis()
        ))
        .arg(format!("--metrics-bind-address={metrics_addr}"))
        .env("RUST_LOG", "warn");
    let spawned = Instant::now();
    let mut reconciler = Supervised::spawn(
        "cloudnet-reconciler",
        command,
        &cp.dir().join("scale-reconciler.log"),
    )?;
    let leading = wait_leading(&metrics_url, &mut reconciler, params.timeout).await?;
    let all_annotated = wait_until("nodes annotated", &mut reconciler, params.timeout, || {
        annotated(&node_cache, params.nodes)
    })
    .await?;
    let at_annotated = cloud_calls(&metrics_url).await?;

    // Step 2: the objects arrive at API speed; every one must end assigned on its node.
    let homes: HashMap<String, String> = (0..params.objects)
        .map(|i| (ip(i), names[i % params.nodes].clone()))
        .collect();
    let submitted = Instant::now();
    let failures = stream::iter(&homes)
        .map(|(ip, node)| {
            let objects = objects.clone();
            let object =
                CloudPrivateIPConfig::new(ip, CloudPrivateIPConfigSpec { node: node.clone() });
            async move {
                objects
                    .create(&PostParams::default(), &object)
                    .await
                    .is_err()
            }
        })
        .buffer_unordered(IN_FLIGHT_REQUESTS)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    ensure!(failures == 0, "{failures} objects could not be created");
    let created = Instant::now();
    let all_assigned = wait_until("objects assigned", &mut reconciler, params.timeout, || {
        assigned(&object_cache, &homes)
    })
    .await?;
    let at_assigned = cloud_calls(&metrics_url).await?;
    let rss = peak_rss_bytes(reconciler.pid());
    node_watch.abort();
    object_watch.abort();
    drop(reconciler);

    let per_ip = at_assigned.mutating / params.objects.max(1) as f64;
    let rows = vec![
        Row::new(
            "start to leadership",
            (leading - spawned).as_secs_f64(),
            "s",
        ),
        Row::new(
            format!("leadership to all {} nodes annotated", params.nodes),
            (all_annotated - leading).as_secs_f64(),
            "s",
        )
        .before("4.24"),
        Row::new(
            "cloud read calls until annotated",
            at_annotated.read_calls,
            "calls",
        )
        .before("7"),
        Row::new("VMs read until annotated", at_annotated.vms_read, "VMs"),
        Row::new(
            format!("{} objects: creates took", params.objects),
            (created - submitted).as_secs_f64(),
            "s",
        ),
        Row::new(
            "last create to every object assigned",
            (all_assigned - created).as_secs_f64(),
            "s",
        )
        .before("93.6"),
        Row::new(
            "add: cloud read calls",
            at_assigned.read_calls - at_annotated.read_calls,
            "calls",
        ),
        Row::new("add: mutating cloud calls per IP", per_ip, "calls").before("0.990"),
        Row::new("reconciler peak RSS (VmHWM)", mib(rss), "MiB")
            .target("<= 100")
            .before("104.9"),
    ];
    let details = json!({
        "nodes": params.nodes,
        "objects": params.objects,
        "latency_ms": params.latency.as_millis() as u64,
        "mutating_calls": at_assigned.mutating,
        "reconciler": params.reconciler_bin.display().to_string(),
    });
    Ok((rows, details))
}
