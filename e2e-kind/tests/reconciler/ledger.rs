//! The attachment ledger on the real control plane with the memory cloud: every attach is
//! recorded in the controller's namespace before its call, and the orphan sweep releases what no
//! object claims any more: an object forced out while its IP was attached, a release the
//! process was killed in the middle of, and a late attach landing after its IP was released
//! with drift checks off. Two pages of one VM are merged when loaded, and a page taken over
//! starts empty. Faults injected at the API ([`ApiFaults`](cloudnet_e2e::fakes::apifaults)): a
//! page create whose answer is lost leaves one page, a conflict is read again and applied once,
//! and a paused leader's late write does not land after a standby took over.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::fakes::apifaults::{ApiFault, ApiFaults};
use cloudnet_reconciler::cloud::memory::{FaultAction, MemoryCloud, Op};
use cloudnet_reconciler::controller::EngineConfig;
use cloudnet_reconciler::engine::ledger::{INSTANCE_ANNOTATION, LABEL};
use cloudnet_shared::ledger::{RELEASED_ANNOTATION, parse_released};
use http::{Method, StatusCode};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};

/// Writes ledger page `name` in `default` (the tests' controller namespace) as a controller
/// would have left it: naming VM `instance` (none: no annotation) and holding `data`.
async fn put_page(client: &Client, name: &str, instance: Option<&str>, data: &[(&str, &str)]) {
    let page = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(LABEL.to_owned(), "v1".to_owned())].into()),
            annotations: instance.map(|i| [(INSTANCE_ANNOTATION.to_owned(), i.to_owned())].into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &page)
        .await
        .unwrap();
}

/// Waits for the sweep's Warning Event `OrphanReleased` about `ip` on node `node`.
async fn wait_orphan_released(client: &Client, node: &str, ip: &str) {
    wait_until(
        Duration::from_secs(30),
        "an OrphanReleased Event on the node",
        || {
            let client = client.clone();
            async move {
                events_about(&client, node)
                    .await
                    .iter()
                    .any(|(t, r, note)| {
                        t == "Warning" && r == "OrphanReleased" && note.contains(ip)
                    })
            }
        },
    )
    .await;
}

/// The names of the ledger pages naming VM `instance`.
async fn pages_of(client: &Client, instance: &str) -> Vec<String> {
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels(LABEL))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| {
            cm.annotations()
                .get(INSTANCE_ANNOTATION)
                .map(String::as_str)
                == Some(instance)
        })
        .map(|cm| cm.name_any())
        .collect()
}

/// A control plane, the memory cloud at 10 ms per call, and node "a" (capacity 10) on it.
async fn one_node() -> (ControlPlane, Client, MemoryCloud) {
    let (cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    add_node(&client, &cloud, "a", 10).await;
    (cp, client, cloud)
}

/// The test engine with a one-second orphan grace.
fn sweeping_config() -> EngineConfig {
    EngineConfig {
        orphan_grace: Duration::from_secs(1),
        ..engine_config()
    }
}

#[tokio::test]
async fn an_ip_whose_object_was_forced_out_is_released_by_the_sweep() {
    let (_cp, client, cloud) = one_node().await;
    let _task = start(client.clone(), &cloud, sweeping_config());
    create(&client, "10.9.0.1", "a").await;
    wait_assigned(&client, "10.9.0.1", "a").await;
    assert_eq!(
        ledger_entries(&client, "10.9.0.1").await,
        [("a".to_owned(), "a".to_owned())]
    );

    force_delete(&client, "10.9.0.1").await;
    wait_gone(&client, "10.9.0.1").await;
    wait_until(Duration::from_secs(30), "the orphan released", || {
        let cloud = cloud.clone();
        async move { cloud.owner_of("10.9.0.1".parse().unwrap()).is_none() }
    })
    .await;
    wait_until(Duration::from_secs(30), "the entry removed", || {
        let client = client.clone();
        async move { ledger_entries(&client, "10.9.0.1").await.is_empty() }
    })
    .await;
    wait_orphan_released(&client, "a", "10.9.0.1").await;
    assert_eq!(
        calls_for(&cloud, "10.9.0.1"),
        [(Op::Attach, "a".into()), (Op::Detach, "a".into())]
    );
    assert_no_violations(&cloud);
}

/// kube-apiserver failing the sweep's Warning once (a 500): the Event is written on a retry
/// instead of being lost (it is written once, and it is the one an admin looks for). Found when a
/// full `make test` lost it under load.
#[tokio::test]
async fn an_orphan_released_warning_the_api_fails_once_is_written_on_a_retry() {
    let (_cp, client, faults, through_faults, cloud) = faulty().await;
    let _task = start(through_faults.clone(), &cloud, sweeping_config());
    let ip = "10.9.7.1";
    create(&client, ip, "a").await;
    wait_assigned(&client, ip, "a").await;
    // The assignment's own Event first, so that the fault meets the sweep's Warning.
    wait_until(Duration::from_secs(30), "the assignment's Event", || {
        let client = client.clone();
        async move { !events_about(&client, ip).await.is_empty() }
    })
    .await;
    faults.inject(Method::POST, EVENTS, ApiFault::ServerError, 1);
    force_delete(&client, ip).await;
    wait_gone(&client, ip).await;
    wait_orphan_released(&client, "a", ip).await;
    let applied = faults.applied();
    assert_eq!(applied.len(), 1, "the 500 was answered once: {applied:?}");
}

#[tokio::test]
async fn a_release_the_process_was_killed_in_is_finished_by_its_successor() {
    let (_cp, client, cloud) = one_node().await;
    let task = start(client.clone(), &cloud, sweeping_config());
    create(&client, "10.9.0.2", "a").await;
    wait_assigned(&client, "10.9.0.2", "a").await;

    // The sweep's detach never answers, and the process dies in the middle of it.
    cloud.inject(Op::Detach, Some("a"), Some(1), FaultAction::Hang);
    force_delete(&client, "10.9.0.2").await;
    wait_until(Duration::from_secs(30), "the release in flight", || {
        let cloud = cloud.clone();
        async move { cloud.faults_left() == 0 }
    })
    .await;
    task.abort();
    let _ = task.await;
    assert_eq!(
        cloud.owner_of("10.9.0.2".parse().unwrap()).as_deref(),
        Some("a")
    );
    assert_eq!(ledger_entries(&client, "10.9.0.2").await.len(), 1);

    let _task = start(client.clone(), &cloud, sweeping_config());
    wait_until(Duration::from_secs(30), "the successor's release", || {
        let (client, cloud) = (client.clone(), cloud.clone());
        async move {
            cloud.owner_of("10.9.0.2".parse().unwrap()).is_none()
                && ledger_entries(&client, "10.9.0.2").await.is_empty()
        }
    })
    .await;
    assert_no_violations(&cloud);
}

#[tokio::test]
async fn the_first_writes_of_many_vms_at_once_go_to_their_own_pages_without_a_failure() {
    let (_cp, client) = control_plane().await;
    let cloud = cloud(Duration::from_millis(10));
    let nodes: Vec<String> = (0..16).map(|i| format!("n{i}")).collect();
    for node in &nodes {
        add_node(&client, &cloud, node, 10).await;
    }
    let _task = start(client.clone(), &cloud, sweeping_config());
    let ips: Vec<String> = (0..nodes.len())
        .map(|i| format!("10.9.1.{}", i + 1))
        .collect();
    futures::future::join_all(
        ips.iter()
            .zip(&nodes)
            .map(|(ip, node)| create(&client, ip, node)),
    )
    .await;
    for (ip, node) in ips.iter().zip(&nodes) {
        wait_assigned(&client, ip, node).await;
        assert_eq!(
            ledger_entries(&client, ip).await,
            [(node.clone(), node.clone())]
        );
    }
    // A page name two VMs raced for would have failed some batches before their calls.
    for ip in &ips {
        let events = events_about(&client, ip).await;
        assert!(
            events.iter().all(|(t, _, _)| t == "Normal"),
            "{ip}: {events:?}"
        );
    }
    assert_eq!(cloud.call_count(Op::Attach), nodes.len() as u64);
    assert_no_violations(&cloud);
}

/// Two pages naming one VM, as a create whose answer was lost left them: loaded, they are merged
/// into one, so that the release of an IP both recorded leaves no page still holding it (which
/// the next term's sweep would report as an orphan, `OrphanReleased`, after every leader
/// change).
#[tokio::test]
async fn two_pages_of_one_vm_are_merged_when_loaded_and_a_release_leaves_none_holding_the_ip() {
    let (_cp, client, cloud) = one_node().await;
    put_page(
        &client,
        "cloudnet-ledger-0",
        Some("a"),
        &[("10.9.2.1", "a")],
    )
    .await;
    put_page(
        &client,
        "cloudnet-ledger-1",
        Some("a"),
        &[("10.9.2.1", "a"), ("10.9.2.2", "a")],
    )
    .await;
    let _task = start(client.clone(), &cloud, sweeping_config());
    for ip in ["10.9.2.1", "10.9.2.2"] {
        create(&client, ip, "a").await;
        wait_assigned(&client, ip, "a").await;
    }
    assert_eq!(
        pages_of(&client, "a").await.len(),
        1,
        "the second page was not merged"
    );
    delete(&client, "10.9.2.1").await;
    wait_gone(&client, "10.9.2.1").await;
    assert_eq!(
        ledger_entries(&client, "10.9.2.1").await,
        [],
        "a page still records the released IP"
    );
    assert_eq!(
        ledger_entries(&client, "10.9.2.2").await,
        [("a".to_owned(), "a".to_owned())]
    );
    assert_eq!(cloud.owner_of("10.9.2.1".parse().unwrap()), None);
    assert_no_violations(&cloud);
}

/// A free page (no VM named) still holding a key is taken over by the next VM without it: the
/// page starts empty, and nothing of what it held is ever put on the new VM's record.
#[tokio::test]
async fn a_page_taken_over_by_another_vm_starts_empty() {
    let (_cp, client, cloud) = one_node().await;
    put_page(
        &client,
        "cloudnet-ledger-0",
        None,
        &[("10.9.3.7", "old-node")],
    )
    .await;
    let _task = start(client.clone(), &cloud, sweeping_config());
    create(&client, "10.9.3.1", "a").await;
    wait_assigned(&client, "10.9.3.1", "a").await;
    assert_eq!(pages_of(&client, "a").await, ["cloudnet-ledger-0"]);
    assert_eq!(
        ledger_entries(&client, "10.9.3.7").await,
        [],
        "the previous holder's key stayed on the page taken over"
    );
    assert_no_violations(&cloud);
}

/// With drift checks off (`--drift-period 0`), an attach held in a network that lands after its
/// object was deleted and its IP released (the worst moment: nothing reads that VM again) is
/// still found by the sweep, which reads the VMs it released IPs from, and detached.
#[tokio::test]
async fn a_late_attach_landing_after_the_release_is_swept_with_drift_checks_off() {
    let (_cp, client, cloud) = one_node().await;
    let config = sweeping_config();
    assert!(config.drift_period.is_zero());
    let _task = start(client.clone(), &cloud, config);
    let ip = "10.9.4.1";
    create(&client, ip, "a").await;
    wait_assigned(&client, ip, "a").await;
    delete(&client, ip).await;
    wait_gone(&client, ip).await;
    assert!(ledger_entries(&client, ip).await.is_empty());
    assert_eq!(cloud.owner_of(ip.parse().unwrap()), None);

    // The held attach lands.
    cloud.add_out_of_band("a", ip.parse().unwrap());
    wait_until(
        Duration::from_secs(30),
        "the sweep to detach the late IP",
        || {
            let cloud = cloud.clone();
            async move { cloud.owner_of(ip.parse().unwrap()).is_none() }
        },
    )
    .await;
    wait_orphan_released(&client, "a", ip).await;
    assert_eq!(
        calls_for(&cloud, ip),
        [
            (Op::Attach, "a".into()),
            (Op::Detach, "a".into()),
            (Op::Detach, "a".into())
        ]
    );
}

/// Where the ledger pages are written (`POST` creates one, `PATCH <path>/<name>` writes one).
const PAGES: &str = "/api/v1/namespaces/default/configmaps";

/// Where the reconciler writes Events (cluster-scoped objects' go to `default`).
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// Ledger page `name`: its `data` and the IPs (object names) of its released records.
async fn page(client: &Client, name: &str) -> (BTreeMap<String, String>, Vec<String>) {
    let page = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .unwrap();
    let released = page
        .annotations()
        .get(RELEASED_ANNOTATION)
        .map(|value| parse_released(value).into_keys().collect())
        .unwrap_or_default();
    (page.data.unwrap_or_default(), released)
}

/// `data` of a page recording `ips` as attached to node `node`.
fn recording(ips: &[&str], node: &str) -> BTreeMap<String, String> {
    ips.iter()
        .map(|ip| ((*ip).to_owned(), node.to_owned()))
        .collect()
}

/// A control plane; a fault proxy in front of its API; admin clients straight to the API and
/// through the proxy (for the reconciler); the memory cloud with VM and Node `a`.
async fn faulty() -> (ControlPlane, Client, ApiFaults, Client, MemoryCloud) {
    let (cp, client, cloud) = one_node().await;
    let (faults, _) = cp.api_faults("kubeconfig-faults").await.unwrap();
    let through_faults = cp.client_via(faults.addr()).await.unwrap();
    (cp, client, faults, through_faults, cloud)
}

/// A page create whose answer is lost at the API (the page lands; the reconciler sees its
/// connection closed): the retry meets that page (a conflict) and writes there instead of making
/// a second one, so one page holds the VM's IPs, a release leaves none holding the IP, and the
/// next term's sweep (after a restart) releases only what was really orphaned.
#[tokio::test]
async fn a_page_create_whose_answer_is_lost_leaves_one_page_and_no_spurious_orphan() {
    let (_cp, client, faults, through_faults, cloud) = faulty().await;
    faults.inject(Method::POST, PAGES, ApiFault::DropAnswer, 1);
    let task = start(through_faults.clone(), &cloud, sweeping_config());
    let (released, orphan) = ("10.9.5.1", "10.9.5.2");
    create(&client, released, "a").await;
    wait_assigned(&client, released, "a").await;
    let applied = faults.applied();
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(
        applied[0].upstream,
        Some(StatusCode::CREATED),
        "the page create whose answer was dropped landed"
    );
    let pages = pages_of(&client, "a").await;
    assert_eq!(pages.len(), 1, "the retry wrote a second page: {pages:?}");
    create(&client, orphan, "a").await;
    wait_assigned(&client, orphan, "a").await;
    delete(&client, released).await;
    wait_gone(&client, released).await;
    assert_eq!(ledger_entries(&client, released).await, []);

    // A leader change: the process ends, an object is forced out while nobody leads, and the
    // next term loads the ledger and sweeps.
    task.abort();
    let _ = task.await;
    force_delete(&client, orphan).await;
    let _task = start(through_faults, &cloud, sweeping_config());
    wait_orphan_released(&client, "a", orphan).await;
    wait_until(
        Duration::from_secs(30),
        "the orphan's entry removed",
        || {
            let client = client.clone();
            async move { ledger_entries(&client, orphan).await.is_empty() }
        },
    )
    .await;
    let events = events_about(&client, "a").await;
    assert!(
        !events
            .iter()
            .any(|(_, r, note)| r == "OrphanReleased" && note.contains(released)),
        "the released IP was swept as an orphan: {events:?}"
    );
    assert_eq!(pages_of(&client, "a").await, pages);
    let (data, _) = page(&client, &pages[0]).await;
    assert_eq!(data, BTreeMap::new());
    assert_eq!(
        calls_for(&cloud, released),
        [(Op::Attach, "a".into()), (Op::Detach, "a".into())]
    );
    assert_no_violations(&cloud);
}

/// A 409 answered at the API in place of a page write (a record, then a release): the page is
/// read again and the write applied once, and the page holds exactly what the objects say.
#[tokio::test]
async fn a_conflict_on_a_page_write_is_read_again_and_applied_once() {
    let (_cp, client, faults, through_faults, cloud) = faulty().await;
    let _task = start(through_faults, &cloud, sweeping_config());
    let (first, second) = ("10.9.6.1", "10.9.6.2");
    create(&client, first, "a").await;
    wait_assigned(&client, first, "a").await;
    let name = pages_of(&client, "a").await.remove(0);
    let path = format!("{PAGES}/{name}");
    assert_eq!(faults.forwarded(&Method::PATCH, &path), 0);

    faults.inject(Method::PATCH, &path, ApiFault::Conflict, 1);
    create(&client, second, "a").await;
    wait_assigned(&client, second, "a").await;
    assert_eq!(faults.applied().len(), 1, "{:?}", faults.applied());
    assert_eq!(
        faults.forwarded(&Method::PATCH, &path),
        1,
        "the record was not applied exactly once"
    );
    assert!(
        faults.forwarded(&Method::GET, &path) >= 1,
        "the page was not read again"
    );
    assert_eq!(
        page(&client, &name).await,
        (recording(&[first, second], "a"), vec![])
    );

    faults.inject(Method::PATCH, &path, ApiFault::Conflict, 1);
    delete(&client, first).await;
    wait_gone(&client, first).await;
    assert_eq!(faults.applied().len(), 2, "{:?}", faults.applied());
    assert_eq!(
        faults.forwarded(&Method::PATCH, &path),
        2,
        "the release was not applied exactly once"
    );
    assert_eq!(
        page(&client, &name).await,
        (recording(&[second], "a"), vec![first.to_owned()])
    );
    assert_eq!(pages_of(&client, "a").await, [name]);
    assert_eq!(cloud.call_count(Op::Attach), 2);
    assert_eq!(cloud.call_count(Op::Detach), 1);
    assert_no_violations(&cloud);
}

/// A leader paused (SIGSTOP) with a page write on the wire (held at the API), while a standby
/// takes the Lease, sees the object of that write deleted and records another IP on the same
/// VM: when the old leader runs again (SIGCONT) and its write meets the new leader's page (a
/// conflict), it stops as deposed instead of reading the page again and re-applying. The page
/// holds what the new leader wrote, and the old leader calls neither the API's pages again nor
/// the cloud.
#[tokio::test]
async fn a_paused_leaders_late_page_write_does_not_land_after_a_standby_took_over() {
    use crate::leadership::{NODE, World, calls};
    let world = World::create("ap-southeast-3").await;
    let (proxy_a, proxy_b) = (world.proxy().await, world.proxy().await);
    let (faults, kubeconfig_a) = world.cp.api_faults("kubeconfig-a").await.unwrap();
    let secrets = world.secret_dir("secret", "AKIDLEADERSHIP");
    let (a, holder_a, mut b) = world
        .leader_and_standby(&kubeconfig_a, proxy_a.url(), proxy_b.url(), &secrets)
        .await;
    // The leader's first read of the VM is answered before it is paused: a request it had
    // handed to its HTTP connection before the pause would reach EC2 after it, which no fence
    // can take back, and the count below would take it for a call of the deposed leader.
    wait_annotation(&world.client, NODE, "\"interface\"").await;

    // The leader's first page write (the create of the VM's page) stays on the wire.
    faults.inject(Method::POST, PAGES, ApiFault::Hold, 1);
    // In the VM's subnet, 10.0.0.0/20.
    let (late, kept) = ("10.0.14.1", "10.0.14.2");
    create(&world.client, late, NODE).await;
    wait_until(
        Duration::from_secs(60),
        "the leader's page write held",
        || std::future::ready(faults.held_now() == 1),
    )
    .await;
    a.process.signal("STOP").unwrap();
    delete(&world.client, late).await;
    world.wait_takeover(&holder_a).await;
    wait_gone(&world.client, late).await;
    create(&world.client, kept, NODE).await;
    assigned_within(
        &world.client,
        &mut b.process,
        kept,
        NODE,
        Duration::from_secs(60),
    )
    .await;
    let pages: Vec<ConfigMap> = Api::<ConfigMap>::namespaced(world.client.clone(), "default")
        .list(&ListParams::default().labels(LABEL))
        .await
        .unwrap()
        .items;
    assert_eq!(pages.len(), 1);
    let name = pages[0].name_any();
    let new_leaders = page(&world.client, &name).await;
    assert_eq!(new_leaders.0, recording(&[kept], NODE));

    // The held write reaches kube-apiserver now (the new leader's page is there: 409), then
    // the old leader runs again.
    let cloud_a = calls(&proxy_a);
    assert_eq!(faults.release_held(), 1);
    wait_until(Duration::from_secs(30), "the held write answered", || {
        std::future::ready(faults.applied().iter().any(|f| f.upstream.is_some()))
    })
    .await;
    assert_eq!(
        faults.applied()[0].upstream,
        Some(StatusCode::CONFLICT),
        "{:?}",
        faults.applied()
    );
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases/";
    let campaigned = faults.forwarded(&Method::GET, LEASES);
    a.process.signal("CONT").unwrap();
    // Back, it stops leading and campaigns again as a standby (twice: a few retry periods in
    // which a late retry of its write would have been sent).
    wait_until(
        Duration::from_secs(60),
        "the old leader to stand by and campaign",
        || {
            std::future::ready(
                a.process.log_tail(200).contains("stopped leading")
                    && faults.forwarded(&Method::GET, LEASES) >= campaigned + 2,
            )
        },
    )
    .await;
    assert_eq!(
        faults.forwarded(&Method::PATCH, PAGES) + faults.forwarded(&Method::POST, PAGES),
        0,
        "the deposed leader wrote a page again\n{}",
        a.process.log_tail(60)
    );
    assert_eq!(
        page(&world.client, &name).await,
        new_leaders,
        "the deposed leader's write landed"
    );
    assert_eq!(ledger_entries(&world.client, late).await, []);
    assert_eq!(
        calls(&proxy_a),
        cloud_a,
        "the deposed leader called the cloud: {:?}",
        proxy_a.all_counts()
    );
    assert_eq!(
        proxy_a.counts("AssignPrivateIpAddresses").total(),
        0,
        "the old leader attached the held write's IP"
    );
    assert_ne!(world.holder().await, holder_a);
    b.assert_running();
}

/// A delete whose finalizer release kube-apiserver failed (a 500) after the IP was detached: the
/// retry finds the IP released by this controller from that node's VM lately and releases the
/// finalizer without a `DetachSkipped` warning (nothing went wrong). Found in traces of
/// `make bench-aws`, where a second reconcile after a delete warned so for 6-21 of 200 objects.
#[tokio::test]
async fn a_delete_retried_after_the_detach_warns_of_nothing() {
    let (_cp, client, faults, through_faults, cloud) = faulty().await;
    let _task = start(through_faults.clone(), &cloud, sweeping_config());
    let ip = "10.9.8.1";
    let object = format!("/apis/cloud.network.openshift.io/v1/cloudprivateipconfigs/{ip}");
    create(&client, ip, "a").await;
    wait_assigned(&client, ip, "a").await;
    // The delete's status write is held, so that the 500 meets the finalizer release after it
    // (rules match by prefix: the status path starts with the object's).
    faults.inject(
        Method::PATCH,
        &format!("{object}/status"),
        ApiFault::Hold,
        1,
    );
    delete(&client, ip).await;
    wait_until(Duration::from_secs(30), "the status write held", || {
        let held = faults.held_now();
        async move { held == 1 }
    })
    .await;
    faults.inject(Method::PATCH, &object, ApiFault::ServerError, 1);
    assert_eq!(faults.release_held(), 1);
    wait_gone(&client, ip).await;
    let applied = faults.applied();
    assert_eq!(applied.len(), 2, "{applied:?}");
    assert_eq!(applied[1].path, object, "the 500 met the finalizer release");
    assert_eq!(
        calls_for(&cloud, ip),
        [(Op::Attach, "a".into()), (Op::Detach, "a".into())]
    );
    wait_until(Duration::from_secs(30), "the Detached Event", || {
        let client = client.clone();
        async move {
            events_about(&client, ip)
                .await
                .iter()
                .any(|(_, reason, _)| reason == "Detached")
        }
    })
    .await;
    let warnings: Vec<_> = events_about(&client, ip)
        .await
        .into_iter()
        .filter(|(t, _, _)| t == "Warning")
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_no_violations(&cloud);
}
