//! The scale benchmark's EC2 part: moto behind the fault proxy metering EC2's token buckets, a
//! thousand instances, two reconciler replicas, and a failover move the moment the second leads.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use futures::{StreamExt, stream};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::watcher::{self, watcher};
use serde_json::{Value, json};

use super::{Row, annotated, assigned, handed_over, mib, wait_serving, wait_until};
use crate::ControlPlane;
use crate::bench::aws::{REGION, counts_json, delta, fleet, settle};
use crate::bench::{free_addr, peak_rss_bytes, wait_leading};
use crate::fakes::faultproxy::{Dialect, FaultProxy, RouteCounts, RouteMatch, Rule, TokenBuckets};
use crate::fakes::moto::MotoServer;
use crate::harness::controlplane::Supervised;
use crate::harness::e2e::EC2_MUTATIONS;
use crate::harness::e2e::local::{NAMESPACE, create_namespace, reconciler_command};

const IN_FLIGHT_REQUESTS: usize = 64;
/// Objects take addresses from here on; moto hands the instances theirs from the bottom.
const FIRST_OBJECT_OFFSET: u32 = 2048;

/// The EC2 part's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// Instances, each with its Node.
    pub nodes: usize,
    /// Objects, spread round-robin over the nodes.
    pub objects: usize,
    /// The proxy's latency per EC2 call, on top of the token buckets.
    pub latency: Duration,
    /// The longest wait for any one step.
    pub timeout: Duration,
}

/// EC2 calls by kind in one step, counted at the proxy.
fn reads_and_mutations(calls: &BTreeMap<String, RouteCounts>) -> (u64, u64) {
    calls.iter().fold((0, 0), |(reads, mutations), (route, c)| {
        if EC2_MUTATIONS.contains(&route.as_str()) {
            (reads, mutations + c.total())
        } else if route.starts_with("Describe") {
            (reads + c.total(), mutations)
        } else {
            (reads, mutations)
        }
    })
}

/// The calls since `before`, once the proxy has gone quiet, with their reads and mutations.
async fn calls_since(
    proxy: &FaultProxy,
    before: &BTreeMap<String, RouteCounts>,
) -> (BTreeMap<String, RouteCounts>, u64, u64) {
    settle(proxy).await;
    let calls = delta(&proxy.all_counts(), before);
    let (reads, mutations) = reads_and_mutations(&calls);
    (calls, reads, mutations)
}

/// One replica: its process and its metrics endpoint.
struct Replica {
    process: Supervised,
    metrics_url: String,
}

impl Replica {
    fn start(cp: &ControlPlane, proxy: &FaultProxy, pod: &str) -> Result<Self> {
        let metrics: SocketAddr = free_addr()?;
        let mut command =
            reconciler_command(cp, REGION, proxy.url(), metrics, cp.kubeconfig_path())?;
        command.env("POD_NAME", pod).env("RUST_LOG", "warn");
        if let Ok(extra) = std::env::var("BENCH_RECONCILER_ARGS") {
            command.args(extra.split_whitespace());
        }
        let log = cp.dir().join(format!("scale-{pod}.log"));
        Ok(Self {
            process: Supervised::spawn("cloudnet-reconciler", command, &log)?,
            metrics_url: format!("http://{metrics}/metrics"),
        })
    }
}

/// Runs the part and returns its rows and details.
pub async fn run(params: &Params) -> Result<(Vec<Row>, Value)> {
    ensure!(
        params.nodes > 0 && params.nodes <= 2000 && params.objects <= 6000,
        "the address plan holds up to 2,000 instances and 6,000 objects"
    );
    let cp = ControlPlane::start_with_crd().await?;
    let moto = MotoServer::start().await?;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await?;
    let client = cp.client().await?;
    create_namespace(&client, NAMESPACE).await?;
    let (network, _, names) = fleet(&moto, &client, params.nodes, "scale").await?;
    let first = u32::from(network.ipv4.network()) + FIRST_OBJECT_OFFSET;
    let ips: Vec<String> = (0..params.objects)
        .map(|i| IpAddr::from(Ipv4Addr::from(first + i as u32)).to_string())
        .collect();
    let mut homes: HashMap<String, String> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| (ip.clone(), names[i % params.nodes].clone()))
        .collect();

    proxy.set_token_buckets(TokenBuckets::ec2());
    proxy.set_rule(RouteMatch::Any, Rule::PASS.with_latency(params.latency));

    let nodes_api = Api::all(client.clone());
    let (node_cache, writer) = reflector::store();
    let node_watch = tokio::spawn(
        reflector(writer, watcher(nodes_api, watcher::Config::default()))
            .for_each(|_| std::future::ready(())),
    );
    let objects: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let (object_cache, writer) = reflector::store();
    let object_watch = tokio::spawn(
        reflector(writer, watcher(objects.clone(), watcher::Config::default()))
            .for_each(|_| std::future::ready(())),
    );
    node_cache.wait_until_ready().await?;
    object_cache.wait_until_ready().await?;

    // Step 1: the first replica leads and annotates every node.
    let mut rows = Vec::new();
    let mut steps = Vec::new();
    let before = proxy.all_counts();
    let spawned = Instant::now();
    let mut first = Replica::start(&cp, &proxy, "scale-a")?;
    let leading = wait_leading(&first.metrics_url, &mut first.process, params.timeout).await?;
    let all_annotated = wait_until(
        "nodes annotated",
        &mut first.process,
        params.timeout,
        || annotated(&node_cache, params.nodes),
    )
    .await?;
    let (calls, reads, _) = calls_since(&proxy, &before).await;
    rows.push(Row::new(
        "start to leadership",
        (leading - spawned).as_secs_f64(),
        "s",
    ));
    rows.push(
        Row::new(
            format!("leadership to all {} nodes annotated", params.nodes),
            (all_annotated - leading).as_secs_f64(),
            "s",
        )
        .target("<= 10")
        .before("95.8"),
    );
    rows.push(Row::new("EC2 reads until annotated", reads as f64, "calls").before("1,003"));
    steps.push(json!({"step": "annotate", "calls": counts_json(&calls)}));

    // Step 2: the objects, at API speed.
    let before = proxy.all_counts();
    let submitted = Instant::now();
    stream::iter(ips.iter())
        .for_each_concurrent(IN_FLIGHT_REQUESTS, |ip| {
            let objects = objects.clone();
            let object = CloudPrivateIPConfig::new(
                ip,
                CloudPrivateIPConfigSpec {
                    node: homes[ip].clone(),
                },
            );
            async move {
                if let Err(e) = objects.create(&PostParams::default(), &object).await {
                    eprintln!("create {ip}: {e}");
                }
            }
        })
        .await;
    let created = Instant::now();
    // The add in two parts: the API's (each object's finalizer and Pending status written, its
    // IP handed to its node's lane) and the cloud's (the lanes' calls, paced by EC2's bucket).
    let all_handed_over = wait_until(
        "objects handed to their lanes",
        &mut first.process,
        params.timeout,
        || handed_over(&object_cache, &homes),
    )
    .await?;
    let (_, handed_mutations) = reads_and_mutations(&delta(&proxy.all_counts(), &before));
    let all_assigned = wait_until(
        "objects assigned",
        &mut first.process,
        params.timeout,
        || assigned(&object_cache, &homes),
    )
    .await?;
    let (calls, reads, mutations) = calls_since(&proxy, &before).await;
    rows.push(
        Row::new(
            format!("{} objects: last create to all assigned", params.objects),
            (all_assigned - created).as_secs_f64(),
            "s",
        )
        .target("<= 200")
        .before("521.1"),
    );
    rows.push(Row::new(
        "add: last create to every IP handed to its lane",
        (all_handed_over - created).as_secs_f64(),
        "s",
    ));
    rows.push(Row::new(
        "add: EC2 mutating calls by then",
        handed_mutations as f64,
        "calls",
    ));
    rows.push(Row::new(
        format!("{} objects: creates took", params.objects),
        (created - submitted).as_secs_f64(),
        "s",
    ));
    rows.push(Row::new("add: EC2 reads", reads as f64, "calls").before("1,498"));
    rows.push(Row::new("add: EC2 mutating calls", mutations as f64, "calls").before("2,732"));
    steps.push(json!({"step": "add", "calls": counts_json(&calls)}));

    // Step 3: a standby waits; the leader leaves; a node's IPs move the moment the standby leads.
    let mut second = Replica::start(&cp, &proxy, "scale-b")?;
    wait_serving(&second.metrics_url, &mut second.process, params.timeout).await?;
    let first_rss = peak_rss_bytes(first.process.pid());
    let before = proxy.all_counts();
    first.process.terminate()?;
    let terminated = Instant::now();
    let took_over = wait_leading(&second.metrics_url, &mut second.process, params.timeout).await?;
    let (from, to) = (names[0].clone(), names[1 % params.nodes].clone());
    let moving: Vec<String> = ips
        .iter()
        .filter(|ip| homes[*ip] == from)
        .cloned()
        .collect();
    let issued = Instant::now();
    stream::iter(moving.iter())
        .for_each_concurrent(IN_FLIGHT_REQUESTS, |ip| {
            let objects = objects.clone();
            let patch = Patch::Merge(json!({ "spec": { "node": to } }));
            async move {
                if let Err(e) = objects.patch(ip, &PatchParams::default(), &patch).await {
                    eprintln!("move {ip}: {e}");
                }
            }
        })
        .await;
    for ip in &moving {
        homes.insert(ip.clone(), to.clone());
    }
    let moved = wait_until(
        "the failover move",
        &mut second.process,
        params.timeout,
        || assigned(&object_cache, &homes),
    )
    .await?;
    let (calls, reads, mutations) = calls_since(&proxy, &before).await;
    rows.push(Row::new(
        "SIGTERM to the standby leading",
        (took_over - terminated).as_secs_f64(),
        "s",
    ));
    rows.push(
        Row::new(
            format!(
                "failover move of {} IPs issued at takeover: converged",
                moving.len()
            ),
            (moved - issued).as_secs_f64(),
            "s",
        )
        .before("3.26")
        .target("<= 5"),
    );
    rows.push(Row::new("takeover: EC2 reads", reads as f64, "calls").before("378"));
    rows.push(Row::new(
        "takeover: EC2 mutating calls",
        mutations as f64,
        "calls",
    ));
    rows.push(Row::new(
        "first leader's peak RSS (VmHWM)",
        mib(first_rss),
        "MiB",
    ));
    rows.push(Row::new(
        "new leader's peak RSS (VmHWM)",
        mib(peak_rss_bytes(second.process.pid())),
        "MiB",
    ));
    steps.push(json!({"step": "takeover", "calls": counts_json(&calls)}));
    node_watch.abort();
    object_watch.abort();

    let details = json!({
        "nodes": params.nodes,
        "objects": params.objects,
        "latency_ms": params.latency.as_millis() as u64,
        "token_buckets": "EC2's (TokenBuckets::ec2)",
        "steps": steps,
    });
    Ok((rows, details))
}
