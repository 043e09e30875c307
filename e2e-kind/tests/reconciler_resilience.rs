//! The reconciler survives being killed at random points, and two replicas never act together.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod reconciler_support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cloudnet_reconciler::cloud::CloudProvider;
use cloudnet_reconciler::cloud::memory::MemoryCloud;
use cloudnet_reconciler::fence::FencedCloud;
use cloudnet_reconciler::leader::record::Timings;
use cloudnet_reconciler::leader::{Elector, LEASE_NAME};
use cloudnet_reconciler::metrics::Metrics;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use reconciler_support::*;

#[tokio::test]
async fn killed_at_random_points_it_converges_without_leaks_or_double_attachment() {
    let seed: u64 = std::env::var("CLOUDNET_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("seed {seed} (rerun with CLOUDNET_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(15));
    let nodes = ["k1", "k2", "k3", "k4", "k5"];
    for n in nodes {
        add_node(&client, &cloud, n, 100).await;
    }
    let mut task = start(client.clone(), &cloud, engine_config());
    // name -> spec.node of the objects that should exist at the end.
    let mut want: BTreeMap<String, String> = BTreeMap::new();
    // What the test did, for the failure message.
    let mut journal: Vec<String> = Vec::new();
    for op in 0..100 {
        let pick = rng.random_range(0..10);
        let existing: Vec<String> = want.keys().cloned().collect();
        if existing.is_empty() || pick < 4 {
            let name = format!("10.4.{}.{}", op / 200, op % 200 + 10);
            let node = nodes[rng.random_range(0..nodes.len())];
            create(&client, &name, node).await;
            journal.push(format!(
                "op {op}  create {name} on {node}{}",
                cloud_calls(&cloud)
            ));
            want.insert(name, node.to_owned());
        } else if pick < 8 {
            let name = &existing[rng.random_range(0..existing.len())];
            let node = nodes[rng.random_range(0..nodes.len())];
            retarget(&client, name, node).await;
            journal.push(format!(
                "op {op}  move {name} to {node}{}",
                cloud_calls(&cloud)
            ));
            want.insert(name.clone(), node.to_owned());
        } else {
            let name = existing[rng.random_range(0..existing.len())].clone();
            delete(&client, &name).await;
            journal.push(format!("op {op}  delete {name}{}", cloud_calls(&cloud)));
            want.remove(&name);
        }
        if rng.random_range(0..8) == 0 {
            // Let some work get in flight, then kill the controller mid-way and restart it.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..60))).await;
            task.abort();
            let _ = task.await;
            journal.push(format!(
                "op {op}  controller killed and restarted{}",
                cloud_calls(&cloud)
            ));
            assert_no_violations(&cloud);
            task = start(client.clone(), &cloud, engine_config());
        }
    }
    for (name, node) in &want {
        wait_assigned(&client, name, node).await;
    }
    wait_until(Duration::from_secs(60), "deleted objects gone", || {
        let client = client.clone();
        let want = want.clone();
        async move {
            let names: Vec<String> = objects(&client)
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            names.iter().all(|n| want.contains_key(n))
        }
    })
    .await;
    let expected: BTreeMap<IpAddr, String> = want
        .iter()
        .map(|(name, node)| (name.parse().unwrap(), node.clone()))
        .collect();
    let attached = cloud.all_attached();
    if attached != expected {
        let wrong: Vec<String> = attached
            .keys()
            .chain(expected.keys())
            .filter(|ip| attached.get(*ip) != expected.get(*ip))
            .map(|ip| ip.to_string())
            .collect();
        let concerned = |line: &String| {
            line.contains("killed")
                || wrong
                    .iter()
                    .any(|ip| line.ends_with(ip.as_str()) || line.contains(&format!("{ip} ")))
        };
        let calls: Vec<String> = cloud
            .calls()
            .iter()
            .enumerate()
            .filter(|(_, c)| c.ips.iter().any(|ip| wrong.contains(&ip.to_string())))
            .map(|(i, c)| format!("call {i}: {:?} {} {:?}", c.op, c.instance, c.ips))
            .collect();
        panic!(
            "leaked or missing IPs {wrong:?}\ncloud: {attached:?}\nwanted: {expected:?}\nops:\n{}\ncloud calls:\n{}",
            journal
                .iter()
                .filter(|l| concerned(l))
                .cloned()
                .collect::<Vec<_>>()
                .join("\n"),
            calls.join("\n")
        );
    }
    assert_no_violations(&cloud);
    task.abort();
}

/// Where the cloud's call log stands, to place the test's operations among the calls.
fn cloud_calls(cloud: &MemoryCloud) -> String {
    format!(" (after cloud call {})", cloud.calls().len())
}

async fn holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    leases
        .get_opt(LEASE_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

/// One replica: campaigns, then runs the reconciler while it leads.
fn replica(
    client: Client,
    cloud: &MemoryCloud,
    identity: &str,
    running: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let cloud: Arc<dyn CloudProvider> = Arc::new(cloud.clone());
    let identity = identity.to_owned();
    tokio::spawn(async move {
        let timings = Timings::new(
            Duration::from_secs(3),
            Duration::from_secs(2),
            Duration::from_secs(1),
        )
        .unwrap();
        let leadership = Elector::new(client.clone(), "test", "default", identity.clone(), timings)
            .campaign()
            .await;
        running.store(true, Ordering::SeqCst);
        let fence = leadership.fence();
        tokio::select! {
            () = cloudnet_reconciler::run::run(
                client,
                Arc::new(FencedCloud::new(cloud, fence.clone())),
                engine_config(),
                Arc::new(Metrics::default()),
                identity,
                std::future::pending(),
            ) => {}
            () = fence.closed() => {}
        }
    })
}

#[tokio::test]
async fn two_replicas_one_acts_and_the_standby_finishes_after_the_leader_dies() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "h1", 50).await;
    add_node(&client, &cloud, "h2", 50).await;

    let (a_running, b_running) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let a = replica(client.clone(), &cloud, "replica-a", Arc::clone(&a_running));
    create(&client, "10.5.0.1", "h1").await;
    wait_assigned(&client, "10.5.0.1", "h1").await;
    assert_eq!(holder(&client).await.as_deref(), Some("replica-a"));

    let b = replica(client.clone(), &cloud, "replica-b", Arc::clone(&b_running));
    create(&client, "10.5.0.2", "h2").await;
    wait_assigned(&client, "10.5.0.2", "h2").await;
    assert!(a_running.load(Ordering::SeqCst));
    assert!(
        !b_running.load(Ordering::SeqCst),
        "the standby acted while the leader was alive"
    );
    assert_eq!(holder(&client).await.as_deref(), Some("replica-a"));

    a.abort();
    let _ = a.await;
    create(&client, "10.5.0.3", "h1").await;
    retarget(&client, "10.5.0.1", "h2").await;
    wait_assigned(&client, "10.5.0.3", "h1").await;
    wait_assigned(&client, "10.5.0.1", "h2").await;
    assert!(b_running.load(Ordering::SeqCst));
    assert_eq!(holder(&client).await.as_deref(), Some("replica-b"));
    assert_no_violations(&cloud);
    b.abort();
}
