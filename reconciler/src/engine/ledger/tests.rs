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
    let released = view.released_after(instance, add, remove, now);
    let write = Write {
        target,
        add: add.to_vec(),
        remove: remove.to_vec(),
        released,
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
    let mut free: Vec<&str> = view.free.iter().map(|(n, _)| n.as_str()).collect();
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
        Target::Free {
            name: "cloudnet-ledger-0".into(),
            version: "2".into()
        }
    );
    assert!(view.free.is_empty(), "reserved for i-2");
    assert!(matches!(
        view.target(&vm("i-3"), WINDOW),
        Target::New { .. }
    ));
    // A write that failed gives the page back; one that succeeded keeps it.
    view.unreserve(free.clone());
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
    let data = page_data("a", &[ip("10.0.0.5")], &[ip("fd00::1")]);
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
        BTreeMap::from([(a, 200), (b, later)])
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
        BTreeMap::new()
    );
}

#[test]
fn released_records_are_written_as_the_annotation_or_removed_when_none() {
    let write = |released: BTreeMap<IpAddr, u64>| Write {
        target: Target::New { name: "p".into() },
        add: Vec::new(),
        remove: Vec::new(),
        released,
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
        Target::Free {
            name: "cloudnet-ledger-2".into(),
            version: "7".into()
        }
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
