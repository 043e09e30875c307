//! The ledger's page arithmetic (loading pages, where a write goes, releases and their window)
//! and the in-memory ledger.

use super::*;

const WINDOW: u64 = cloudnet_shared::ledger::RECENT_RELEASE_WINDOW.as_secs();

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn vm(id: &str) -> InstanceId {
    InstanceId(id.to_owned())
}

fn page(name: &str, instance: Option<&str>, entries: &[(&str, &str)]) -> ConfigMap {
    let mut cm = new_page(name, &vm(instance.unwrap_or_default()), Map::new());
    if instance.is_none() {
        cm.metadata.annotations = None;
    }
    cm.metadata.resource_version = Some("7".into());
    cm.data = Some(
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    cm
}

/// Commits a write of `add` and `remove` to `target` at time 0.
fn commit(
    view: &mut View,
    instance: &InstanceId,
    node: &str,
    target: Target,
    version: String,
    add: &[IpAddr],
    remove: &[IpAddr],
) {
    commit_at(view, instance, node, target, version, add, remove, 0);
}

/// Commits a write of `add` and `remove` to `target` at `now`.
#[allow(clippy::too_many_arguments)]
fn commit_at(
    view: &mut View,
    instance: &InstanceId,
    node: &str,
    target: Target,
    version: String,
    add: &[IpAddr],
    remove: &[IpAddr],
    now: u64,
) {
    let (released, dropped) = view.released_after(instance, add, remove, now);
    let write = Write {
        target,
        add: add.to_vec(),
        remove: remove.to_vec(),
        released,
        dropped,
    };
    view.commit(instance, node, write, version);
}

fn target(node: &str, instance: &str) -> NodeTarget {
    NodeTarget {
        node_name: node.into(),
        provider_id: String::new(),
        instance: vm(instance),
        internal_ips: Default::default(),
    }
}

#[test]
fn pages_load_into_ips_free_pages_and_the_next_name() {
    let mut view = View::default();
    view.load(
        &page(
            "cloudnet-ledger-3",
            Some("i-1"),
            &[("10.0.0.5", "a"), ("10.0.0.6", "a")],
        ),
        0,
    );
    view.load(&page("cloudnet-ledger-1", Some("i-2"), &[]), 0);
    view.load(&page("cloudnet-ledger-x", None, &[("10.0.0.7", "b")]), 0);
    view.load(
        &page("cloudnet-ledger-4", Some("i-3"), &[("not-an-ip", "c")]),
        0,
    );
    assert_eq!(view.by_ip.len(), 2);
    assert!(view.holds(ip("10.0.0.5"), &vm("i-1"), Some("a")));
    assert!(!view.holds(ip("10.0.0.5"), &vm("i-1"), Some("b")));
    // The two IPs of one page share one placement.
    let (a, b) = (
        &view.by_ip[&ip("10.0.0.5")][0],
        &view.by_ip[&ip("10.0.0.6")][0],
    );
    assert!(Arc::ptr_eq(a, b));
    let mut free: Vec<&str> = view.free.iter().map(|f| f.name.as_str()).collect();
    free.sort_unstable();
    assert_eq!(
        free,
        [
            "cloudnet-ledger-1",
            "cloudnet-ledger-4",
            "cloudnet-ledger-x"
        ]
    );
    assert_eq!(view.next_index, 5);
}

#[test]
fn writes_go_to_the_vms_page_else_a_free_one_else_a_new_one() {
    let mut view = View::default();
    let new = view.target(&vm("i-1"), 0);
    assert_eq!(
        new,
        Target::New {
            name: "cloudnet-ledger-0".into()
        }
    );
    let add = [ip("10.0.0.5")];
    commit(&mut view, &vm("i-1"), "a", new, "1".into(), &add, &[]);
    assert_eq!(
        view.target(&vm("i-1"), 0),
        Target::Page {
            name: "cloudnet-ledger-0".into(),
            version: "1".into()
        }
    );
    // Two VMs' first writes at once reserve two names, not one.
    let (second, third) = (view.target(&vm("i-2"), 0), view.target(&vm("i-3"), 0));
    assert_eq!(
        (second, third),
        (
            Target::New {
                name: "cloudnet-ledger-1".into()
            },
            Target::New {
                name: "cloudnet-ledger-2".into()
            }
        )
    );
    // The last IP released: the page keeps its released record for the window, then is
    // free, and the next VM takes it over.
    let page = view.target(&vm("i-1"), 0);
    commit(&mut view, &vm("i-1"), "", page, "2".into(), &[], &add);
    assert!(view.by_ip.is_empty());
    assert!(matches!(
        view.target(&vm("i-4"), WINDOW - 1),
        Target::New { .. }
    ));
    let free = view.target(&vm("i-2"), WINDOW);
    assert_eq!(
        free,
        Target::Free(Free {
            name: "cloudnet-ledger-0".into(),
            version: "2".into(),
            stale: Vec::new(),
        })
    );
    assert!(view.free.is_empty(), "reserved for i-2");
    assert!(matches!(
        view.target(&vm("i-3"), WINDOW),
        Target::New { .. }
    ));
    // A write that was refused gives the page back; one that succeeded keeps it.
    view.unreserve(&vm("i-2"), free.clone(), true);
    assert_eq!(view.free.len(), 1);
    let free = view.target(&vm("i-2"), WINDOW);
    commit(
        &mut view,
        &vm("i-2"),
        "b",
        free,
        "3".into(),
        &[ip("10.0.0.9")],
        &[],
    );
    assert!(view.free.is_empty());
    assert!(view.holds(ip("10.0.0.9"), &vm("i-2"), Some("b")));
}

#[test]
fn an_ip_may_be_recorded_on_two_vms_and_each_release_removes_its_own() {
    let mut view = View::default();
    for (instance, node) in [("i-1", "a"), ("i-2", "b")] {
        let t = view.target(&vm(instance), 0);
        commit(
            &mut view,
            &vm(instance),
            node,
            t,
            "1".into(),
            &[ip("10.0.0.5")],
            &[],
        );
    }
    assert_eq!(view.by_ip[&ip("10.0.0.5")].len(), 2);
    assert_eq!(
        view.held(&vm("i-1"), &[ip("10.0.0.5"), ip("10.0.0.6")]),
        [ip("10.0.0.5")]
    );
    let t = view.target(&vm("i-1"), 0);
    commit(
        &mut view,
        &vm("i-1"),
        "",
        t,
        "2".into(),
        &[],
        &[ip("10.0.0.5")],
    );
    assert!(view.holds(ip("10.0.0.5"), &vm("i-2"), Some("b")));
    assert!(!view.holds(ip("10.0.0.5"), &vm("i-1"), None));
}

#[test]
fn a_page_write_sets_additions_and_removes_with_null() {
    let data = page_data("a", &[ip("10.0.0.5")], &[ip("fd00::1")], &[]);
    assert_eq!(
        Value::Object(data),
        json!({
            "10.0.0.5": "a",
            "fd00.0000.0000.0000.0000.0000.0000.0001": null,
        })
    );
}

#[test]
fn a_release_is_recorded_with_its_time_and_pruned_on_a_later_write_after_the_window() {
    let mut view = View::default();
    let (a, b, c) = (ip("10.0.0.5"), ip("10.0.0.6"), ip("10.0.0.7"));
    let t = view.target(&vm("i-1"), 100);
    commit_at(
        &mut view,
        &vm("i-1"),
        "n",
        t,
        "1".into(),
        &[a, b, c],
        &[],
        100,
    );
    let t = view.target(&vm("i-1"), 200);
    commit_at(&mut view, &vm("i-1"), "", t, "2".into(), &[], &[a], 200);
    assert_eq!(view.recently_released(200), [(a, vm("i-1"), 200)]);
    // A later release keeps the earlier record while it is recent.
    let later = 200 + WINDOW - 1;
    assert_eq!(
        view.released_after(&vm("i-1"), &[], &[b], later),
        (BTreeMap::from([(a, 200), (b, later)]), 0)
    );
    // After the window the next write drops it; readers ignore it before that write.
    assert!(view.recently_released(200 + WINDOW).is_empty());
    let t = view.target(&vm("i-1"), 200 + WINDOW);
    commit_at(
        &mut view,
        &vm("i-1"),
        "",
        t,
        "3".into(),
        &[],
        &[b],
        200 + WINDOW,
    );
    assert_eq!(
        view.pages[&vm("i-1")].released,
        BTreeMap::from([(b, 200 + WINDOW)])
    );
    // Attached again to the same VM: that write drops the IP's record.
    assert_eq!(
        view.released_after(&vm("i-1"), &[b], &[], 200 + WINDOW),
        (BTreeMap::new(), 0)
    );
}

#[test]
fn released_records_are_written_as_the_annotation_or_removed_when_none() {
    let write = |released: BTreeMap<IpAddr, u64>| Write {
        target: Target::New { name: "p".into() },
        add: Vec::new(),
        remove: Vec::new(),
        released,
        dropped: 0,
    };
    assert_eq!(write(BTreeMap::new()).released_value(), Value::Null);
    assert_eq!(
        write(BTreeMap::from([(ip("10.0.0.5"), 7), (ip("fd00::1"), 9)])).released_value(),
        Value::from(r#"{"10.0.0.5":7,"fd00.0000.0000.0000.0000.0000.0000.0001":9}"#)
    );
}

#[test]
fn a_page_of_only_released_records_loads_as_its_vms_until_they_expire() {
    let mut cm = page("cloudnet-ledger-2", Some("i-1"), &[]);
    cm.metadata.annotations.get_or_insert_default().insert(
        RELEASED_ANNOTATION.into(),
        r#"{"10.0.0.5":1000,"10.0.0.6":10,"bad":1000}"#.into(),
    );
    let mut view = View::default();
    view.load(&cm, 1000);
    assert!(view.free.is_empty());
    assert!(view.by_ip.is_empty(), "released IPs are not attached ones");
    assert_eq!(
        view.recently_released(1000),
        [(ip("10.0.0.5"), vm("i-1"), 1000)],
        "the expired and the malformed record are left out"
    );
    // Its VM writes to it; another VM gets a new page while the record is recent...
    assert!(matches!(view.target(&vm("i-1"), 1000), Target::Page { .. }));
    assert!(matches!(view.target(&vm("i-2"), 1000), Target::New { .. }));
    // ...and takes it over once the record expired.
    assert_eq!(
        view.target(&vm("i-3"), 1000 + WINDOW),
        Target::Free(Free {
            name: "cloudnet-ledger-2".into(),
            version: "7".into(),
            stale: Vec::new(),
        })
    );
    // Loaded after the window: free at once.
    let mut view = View::default();
    view.load(&cm, 1000 + WINDOW);
    assert_eq!(view.free.len(), 1);
}

#[tokio::test]
async fn an_in_memory_ledger_records_and_releases() {
    let ledger = Ledger::in_memory(Arc::default());
    let t = target("a", "i-1");
    ledger
        .record(&t, &[ip("10.0.0.5"), ip("10.0.0.6")])
        .await
        .unwrap();
    assert_eq!(ledger.instance(ip("10.0.0.5"), "a"), Some(vm("i-1")));
    assert_eq!(ledger.instance(ip("10.0.0.5"), "b"), None);
    ledger.release(&vm("i-1"), &[ip("10.0.0.5")]).await.unwrap();
    assert_eq!(ledger.instance(ip("10.0.0.5"), "a"), None);
    assert_eq!(ledger.len(), 1);
    let released = ledger.recently_released();
    assert_eq!(released.len(), 1);
    assert_eq!(
        (released[0].0, &released[0].1),
        (ip("10.0.0.5"), &vm("i-1"))
    );
}

#[test]
fn two_pages_naming_one_vm_load_as_its_page_and_a_second_to_merge() {
    let mut view = View::default();
    view.load(
        &page("cloudnet-ledger-0", Some("i-1"), &[("10.0.0.5", "a")]),
        0,
    );
    view.load(
        &page("cloudnet-ledger-1", Some("i-1"), &[("10.0.0.6", "a")]),
        0,
    );
    assert_eq!(
        view.target(&vm("i-1"), 0),
        Target::Page {
            name: "cloudnet-ledger-0".into(),
            version: "7".into()
        }
    );
    let second: Vec<&str> = view.duplicates[&vm("i-1")]
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(second, ["cloudnet-ledger-1"]);
    // Both pages' IPs are the VM's meanwhile.
    assert!(view.holds(ip("10.0.0.5"), &vm("i-1"), Some("a")));
    assert!(view.holds(ip("10.0.0.6"), &vm("i-1"), Some("a")));
    // The first page read again stays first, its second still second.
    view.load(
        &page(
            "cloudnet-ledger-0",
            Some("i-1"),
            &[("10.0.0.5", "a"), ("10.0.0.6", "a")],
        ),
        0,
    );
    assert_eq!(view.pages[&vm("i-1")].name, "cloudnet-ledger-0");
    assert_eq!(view.duplicates[&vm("i-1")].len(), 1);
    assert_eq!(view.pages[&vm("i-1")].entries, 2);
    // Emptied by the merge and read again: free, and the VM has one page.
    view.load(&page("cloudnet-ledger-1", None, &[]), 0);
    assert!(view.duplicates.is_empty());
    assert_eq!(view.free.len(), 1);
    assert_eq!(view.pages.len(), 1);
}

#[test]
fn a_write_whose_answer_was_lost_goes_to_the_same_page_next_time() {
    let mut view = View::default();
    let new = view.target(&vm("i-1"), 0);
    assert_eq!(
        new,
        Target::New {
            name: "cloudnet-ledger-0".into()
        }
    );
    // No answer: the page may exist now, so the next write creates the same name (a conflict
    // then reads it), never a second page.
    view.unreserve(&vm("i-1"), new.clone(), false);
    assert_eq!(view.target(&vm("i-1"), 0), new);
    // Refused: the name is left, and the next write takes a new one.
    view.unreserve(&vm("i-1"), new, true);
    assert_eq!(
        view.target(&vm("i-1"), 0),
        Target::New {
            name: "cloudnet-ledger-1".into()
        }
    );
    // A free page taken over without an answer stays the VM's, not anyone else's.
    let mut view = View::default();
    view.load(&page("cloudnet-ledger-3", None, &[]), 0);
    let free = view.target(&vm("i-1"), 0);
    assert!(matches!(free, Target::Free(_)));
    view.unreserve(&vm("i-1"), free.clone(), false);
    assert!(view.free.is_empty());
    assert!(matches!(view.target(&vm("i-2"), 0), Target::New { .. }));
    assert_eq!(view.target(&vm("i-1"), 0), free);
    // The page read (the write had landed): the VM's page from now on.
    view.load(
        &page("cloudnet-ledger-3", Some("i-1"), &[("10.0.0.5", "a")]),
        0,
    );
    assert!(view.uncertain.is_empty());
    assert!(matches!(view.target(&vm("i-1"), 0), Target::Page { .. }));
}

#[test]
fn a_page_taken_over_starts_empty() {
    let mut view = View::default();
    // Left by hand, or by a page whose annotation was lost: keys, but no VM.
    view.load(
        &page(
            "cloudnet-ledger-0",
            None,
            &[("10.0.0.7", "b"), ("junk", "x")],
        ),
        0,
    );
    let taken = view.target(&vm("i-2"), 0);
    let Target::Free(free) = &taken else {
        panic!("{taken:?}");
    };
    let data = page_data("a", &[ip("10.0.0.7"), ip("10.0.0.9")], &[], &free.stale);
    assert_eq!(
        Value::Object(data),
        json!({ "10.0.0.7": "a", "10.0.0.9": "a", "junk": null })
    );
    // A page of a VM with a key that is no IP: the key goes when the page is taken over.
    let mut view = View::default();
    view.load(
        &page(
            "cloudnet-ledger-0",
            Some("i-1"),
            &[("10.0.0.5", "a"), ("junk", "x")],
        ),
        0,
    );
    let t = view.target(&vm("i-1"), 0);
    commit(
        &mut view,
        &vm("i-1"),
        "",
        t,
        "8".into(),
        &[],
        &[ip("10.0.0.5")],
    );
    let taken = view.target(&vm("i-2"), WINDOW);
    let Target::Free(free) = taken else {
        panic!("{taken:?}");
    };
    assert_eq!(free.stale, ["junk"]);
}

#[test]
fn released_records_are_capped_dropping_the_oldest_first() {
    let mut view = View {
        cap: 3,
        ..View::default()
    };
    let ips: Vec<IpAddr> = (1..=5).map(|i| ip(&format!("10.0.0.{i}"))).collect();
    let t = view.target(&vm("i-1"), 0);
    commit_at(&mut view, &vm("i-1"), "a", t, "1".into(), &ips, &[], 0);
    for (at, released) in ips.iter().enumerate() {
        let t = view.target(&vm("i-1"), at as u64);
        commit_at(
            &mut view,
            &vm("i-1"),
            "",
            t,
            "2".into(),
            &[],
            &[*released],
            at as u64,
        );
    }
    assert_eq!(
        view.pages[&vm("i-1")].released,
        BTreeMap::from([(ips[2], 2), (ips[3], 3), (ips[4], 4)])
    );
    let (_, dropped) = view.released_after(&vm("i-1"), &[], &[ip("10.0.1.1")], 9);
    assert_eq!(dropped, 1);
}

#[tokio::test]
async fn churn_of_thousands_of_ipv6_addresses_keeps_a_page_under_the_annotation_limit() {
    let metrics = Arc::new(Metrics::default());
    let ledger = Ledger::in_memory(Arc::clone(&metrics));
    let t = target("a", "i-1");
    let churned = 3000;
    for batch in 0..(churned / 250) {
        let ips: Vec<IpAddr> = (0..250)
            .map(|i| ip(&format!("fd00::{:x}", batch * 250 + i + 1)))
            .collect();
        ledger.record(&t, &ips).await.unwrap();
        ledger.release(&vm("i-1"), &ips).await.unwrap();
    }
    let view = ledger.view();
    let page = &view.pages[&vm("i-1")];
    assert_eq!(page.released.len(), RELEASED_CAP);
    let write = Write {
        target: Target::New { name: "p".into() },
        add: Vec::new(),
        remove: Vec::new(),
        released: page.released.clone(),
        dropped: 0,
    };
    let Value::String(annotation) = write.released_value() else {
        panic!("no annotation");
    };
    assert!(annotation.len() < 128 * 1024, "{} bytes", annotation.len());
    assert_eq!(
        metrics.ledger_released_dropped.get(),
        (churned - RELEASED_CAP) as u64
    );
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_writes_nothing() {
    let (keeper, fence) = crate::engine::fence::FenceKeeper::new(
        tokio::time::Instant::now() + std::time::Duration::from_secs(5),
    );
    let ledger = Ledger::with(None, View::default(), Arc::default(), Some(fence));
    let t = target("a", "i-1");
    ledger.record(&t, &[ip("10.0.0.5")]).await.unwrap();
    keeper.close();
    let error = ledger.record(&t, &[ip("10.0.0.6")]).await.unwrap_err();
    assert!(matches!(error, LedgerError::Deposed), "{error}");
    assert_eq!(ledger.instance(ip("10.0.0.6"), "a"), None);
    let error = ledger
        .release(&vm("i-1"), &[ip("10.0.0.5")])
        .await
        .unwrap_err();
    assert!(matches!(error, LedgerError::Deposed), "{error}");
    assert_eq!(ledger.instance(ip("10.0.0.5"), "a"), Some(vm("i-1")));
}

#[tokio::test]
async fn the_per_vm_write_locks_are_freed_once_their_writes_end() {
    let ledger = Arc::new(Ledger::in_memory(Arc::default()));
    let writes = (0..50).map(|i| {
        let ledger = Arc::clone(&ledger);
        async move {
            let t = target(&format!("n{}", i % 10), &format!("i-{}", i % 10));
            let ips = [ip(&format!("10.0.1.{i}"))];
            ledger.record(&t, &ips).await.unwrap();
            ledger.release(&t.instance, &ips).await.unwrap();
        }
    });
    futures::future::join_all(writes).await;
    assert_eq!(ledger.locked(), 0);
    assert_eq!(ledger.len(), 0);
}
