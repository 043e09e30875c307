//! The address loop against a real network namespace (veth pair, IPv4 and IPv6): adds with the
//! agent's mark on the device of the IP's subnet, never removes an address without the mark,
//! repairs an address someone removed, and converges at start with what an earlier run left.
//! The API's side is played through the loop's snapshot channel.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_node::converge::Converger;
use cloudnet_node::metrics::Metrics;
use cloudnet_node::netlink::Netlink;
use cloudnet_node::plan::{Attachment, Gateway, LabelPatch, NodeView, Snapshot};
use cloudnet_shared::{EgressIpConfig, IfAddr};
use support::{
    Netns, add_marked, add_plain, addresses, has_marked, link_index, remove, wait_for_addresses,
    with_netns,
};
use tokio::sync::watch;

const ME: &str = "node-a";
const LABEL: &str = "egress-gateway.cloudnet.io/web";
/// Generous for a loaded 2-core machine; the loop answers in milliseconds.
const WITHIN: Duration = Duration::from_secs(10);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Gateway `web` with 10.0.0.5 and fd00::5 (veth0's subnets), active on `active`, its objects
/// attached to this node and `Assigned` as `assigned` says.
fn snapshot(active: &str, assigned: bool) -> Snapshot {
    let ips = [ip("10.0.0.5"), ip("fd00::5")];
    Snapshot {
        node: NodeView {
            name: ME.into(),
            labels: BTreeMap::new(),
            egress: vec![EgressIpConfig {
                interface: "eni-0".into(),
                ifaddr: IfAddr::new(
                    Some("10.0.0.0/24".parse().unwrap()),
                    Some("fd00::/64".parse().unwrap()),
                ),
                capacity: Default::default(),
            }],
        },
        gateways: vec![Gateway {
            name: "web".into(),
            egress_ips: ips.to_vec(),
            active_node: Some(active.into()),
        }],
        attachments: ips
            .iter()
            .map(|&ip| {
                (
                    ip,
                    Attachment {
                        node: Some(ME.into()),
                        assigned,
                    },
                )
            })
            .collect(),
    }
}

struct Loop {
    snapshots: watch::Sender<Option<Arc<Snapshot>>>,
    labels: watch::Receiver<LabelPatch>,
    task: tokio::task::JoinHandle<()>,
}

impl Loop {
    /// The address loop over the test's namespace, starting from `first`.
    fn start(netns: &Netns, first: Option<Snapshot>) -> Self {
        let netlink = netns.inside(|| Netlink::connect().unwrap());
        let (snapshots, receiver) = watch::channel(first.map(Arc::new));
        let (labels_tx, labels) = watch::channel(LabelPatch::default());
        let converger = Converger::new(
            netlink,
            None,
            labels_tx,
            Arc::new(Metrics::default()),
            Duration::from_secs(1),
        );
        let task = tokio::spawn(converger.run(receiver));
        Self {
            snapshots,
            labels,
            task,
        }
    }

    fn publish(&self, snapshot: Snapshot) {
        self.snapshots.send_replace(Some(Arc::new(snapshot)));
    }

    async fn label_patch(&mut self, what: &str, f: impl Fn(&LabelPatch) -> bool) {
        let waited = tokio::time::timeout(WITHIN, self.labels.wait_for(|p| f(p)))
            .await
            .is_ok();
        assert!(
            waited,
            "{what} not within {WITHIN:?}: {:?}",
            *self.labels.borrow()
        );
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[test]
fn both_families_go_on_the_subnets_device_marked_and_usable_at_once_then_the_label() {
    with_netns(|netns, handle| async move {
        let veth0 = link_index(&handle, "veth0").await;
        let mut agent = Loop::start(&netns, Some(snapshot(ME, true)));
        wait_for_addresses(&handle, "both IPs marked on veth0", WITHIN, |now| {
            has_marked(now, veth0, ip("10.0.0.5")) && has_marked(now, veth0, ip("fd00::5"))
        })
        .await;
        // No duplicate address detection: the IPv6 address is not tentative, so it can be bound.
        netns.inside(|| {
            std::net::UdpSocket::bind("[fd00::5]:0").expect("fd00::5 usable at once");
        });
        agent
            .label_patch("the label set", |p| p.set.contains(LABEL))
            .await;
    });
}

#[test]
fn an_address_without_the_mark_is_never_removed() {
    with_netns(|netns, handle| async move {
        let veth0 = link_index(&handle, "veth0").await;
        add_plain(&handle, veth0, ip("10.0.0.50"), 32).await;
        // The desired IPv4 address is there already, unmarked: held, left alone.
        add_plain(&handle, veth0, ip("10.0.0.5"), 32).await;
        let agent = Loop::start(&netns, Some(snapshot(ME, true)));
        wait_for_addresses(&handle, "fd00::5 added", WITHIN, |now| {
            has_marked(now, veth0, ip("fd00::5"))
        })
        .await;
        let now = addresses(&handle).await;
        let copies: Vec<_> = now.iter().filter(|a| a.ip == ip("10.0.0.5")).collect();
        assert_eq!(copies.len(), 1, "{now:?}");
        assert!(!copies[0].ours, "{now:?}");
        // Moved away: only the agent's own address goes.
        agent.publish(snapshot("node-b", true));
        wait_for_addresses(&handle, "fd00::5 removed", WITHIN, |now| {
            !now.iter().any(|a| a.ip == ip("fd00::5"))
        })
        .await;
        let now = addresses(&handle).await;
        for kept in ["10.0.0.50", "10.0.0.5", "10.0.0.10", "fd00::10"] {
            assert!(now.iter().any(|a| a.ip == ip(kept)), "{kept}: {now:?}");
        }
    });
}

#[test]
fn an_address_someone_removed_is_back_within_a_second() {
    with_netns(|netns, handle| async move {
        let veth0 = link_index(&handle, "veth0").await;
        let _agent = Loop::start(&netns, Some(snapshot(ME, true)));
        wait_for_addresses(&handle, "both IPs added", WITHIN, |now| {
            has_marked(now, veth0, ip("10.0.0.5")) && has_marked(now, veth0, ip("fd00::5"))
        })
        .await;
        for removed in ["10.0.0.5", "fd00::5"] {
            remove(&handle, veth0, ip(removed)).await;
            let took = wait_for_addresses(&handle, "the removed IP back", WITHIN, |now| {
                has_marked(now, veth0, ip(removed))
            })
            .await;
            // The notification, not the 1 s resync, brings it back; 1 s leaves room for a
            // loaded machine.
            assert!(
                took < Duration::from_secs(1),
                "{removed} back after {took:?}"
            );
        }
    });
}

#[test]
fn start_converges_with_what_an_earlier_run_left() {
    with_netns(|netns, handle| async move {
        let veth0 = link_index(&handle, "veth0").await;
        let veth1 = link_index(&handle, "veth1").await;
        // An earlier run's: a gateway's IP since deleted, one on a device no longer the subnet's,
        // and a desired one.
        add_marked(&handle, veth0, ip("10.0.0.77")).await;
        add_marked(&handle, veth1, ip("fd00::5")).await;
        add_marked(&handle, veth0, ip("10.0.0.5")).await;
        let mut agent = Loop::start(&netns, Some(snapshot(ME, true)));
        wait_for_addresses(&handle, "converged", WITHIN, |now| {
            has_marked(now, veth0, ip("10.0.0.5"))
                && has_marked(now, veth0, ip("fd00::5"))
                && !now.iter().any(|a| a.ip == ip("10.0.0.77"))
                && !now
                    .iter()
                    .any(|a| a.index == veth1 && a.ip == ip("fd00::5"))
        })
        .await;
        agent
            .label_patch("the label set", |p| p.set.contains(LABEL))
            .await;
    });
}

#[test]
fn moved_away_the_label_goes_no_later_than_the_addresses() {
    with_netns(|netns, handle| async move {
        let veth0 = link_index(&handle, "veth0").await;
        let mut agent = Loop::start(&netns, Some(snapshot(ME, true)));
        agent
            .label_patch("the label set", |p| p.set.contains(LABEL))
            .await;
        // The labeller's patch as the node watch shows it, then the gateway moves.
        let mut moved = snapshot("node-b", true);
        moved.node.labels.insert(LABEL.into(), "active".into());
        agent.publish(moved);
        wait_for_addresses(&handle, "both IPs removed", WITHIN, |now| {
            !has_marked(now, veth0, ip("10.0.0.5")) && !has_marked(now, veth0, ip("fd00::5"))
        })
        .await;
        assert!(
            agent.labels.borrow().remove.contains(LABEL),
            "{:?}",
            *agent.labels.borrow()
        );
    });
}
