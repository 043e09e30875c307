#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A node's host side for the egress gateway story: a network namespace of its own with a veth
//! pair (`eth0`, the node's interface, and its peer; the machines' kernel has no `dummy` link
//! type), and the real node agent (`cloudnet-node`, in process through its library) whose netlink
//! socket is opened in that namespace, as the DaemonSet's is in the host's.
//!
//! The namespace is anonymous: a short-lived thread leaves the test's namespace with
//! `unshare(CLONE_NEWNET)` and hands back a descriptor of its new one; the namespace lives as long
//! as that descriptor and the sockets opened in it, all of which close with the test (its
//! runtime), even on a panic. Nothing is named under `/run/netns`, so nothing can leak. Each
//! socket is opened on a thread of its own that enters the namespace (`setns`) and ends, so no
//! thread of the test's runtime ever changes namespace. The e2e tier runs as root.
//!
//! `harness::node_host` does the same for `make bench-gateway`; the story needs what it does not
//! give: the node's address in each family (an IPv6 egress IP goes on the device with an address
//! in the IPv6 subnet), and the agent's readiness and metrics, by which it knows a returning agent
//! has converged.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::IpAddr;
use std::sync::Arc;

use cloudnet_e2e::harness::e2e::local::NAMESPACE;
use cloudnet_node::endpoint::Health;
use cloudnet_node::metrics::Metrics;
use cloudnet_node::netlink::{Netlink, host_prefix};
use cloudnet_node::plan::ADDRESS_PROTOCOL;
use cloudnet_node::{Settings, run};
use futures::TryStreamExt;
use nix::sched::{CloneFlags, setns, unshare};
use prometheus_client::registry::Registry;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::{Handle, LinkUnspec, LinkVeth};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The node's interface in its namespace.
pub const DEVICE: &str = "eth0";

/// A node's network namespace with [`DEVICE`] up and holding the node's own addresses.
pub struct NodeNetns {
    namespace: File,
    /// A connection into the namespace, for the test's reads.
    handle: Handle,
    /// The ifindex of [`DEVICE`].
    device: u32,
}

impl NodeNetns {
    /// A new namespace whose [`DEVICE`] holds `addresses` (the node's own, with their subnet's
    /// prefix length), as a cloud's DHCP client would have put them: unmarked.
    pub async fn new(addresses: &[(IpAddr, u8)]) -> Self {
        let namespace = std::thread::spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET): the e2e tier runs as root");
            File::open("/proc/thread-self/ns/net").expect("the new namespace")
        })
        .join()
        .unwrap();
        let handle = inside(&namespace, || {
            let (connection, handle, _) = rtnetlink::new_connection().unwrap();
            tokio::spawn(connection);
            handle
        });
        handle
            .link()
            .add(LinkVeth::new(DEVICE, "peer0").build())
            .execute()
            .await
            .unwrap();
        for name in ["lo", DEVICE, "peer0"] {
            let index = link_index(&handle, name).await;
            handle
                .link()
                .set(LinkUnspec::new_with_index(index).up().build())
                .execute()
                .await
                .unwrap();
        }
        let device = link_index(&handle, DEVICE).await;
        for &(ip, prefix_len) in addresses {
            let mut request = handle.address().add(device, ip, prefix_len);
            if ip.is_ipv6() {
                request
                    .message_mut()
                    .attributes
                    .push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            request.execute().await.unwrap();
        }
        Self {
            namespace,
            handle,
            device,
        }
    }

    /// The addresses on [`DEVICE`] that carry the agent's mark (`IFA_PROTO`) as host addresses
    /// (/32, /128): what the agent put there.
    pub async fn marked(&self) -> BTreeSet<IpAddr> {
        self.addresses()
            .await
            .into_iter()
            .filter(|&(ip, prefix_len, marked)| marked && prefix_len == host_prefix(ip))
            .map(|(ip, _, _)| ip)
            .collect()
    }

    /// Every address on [`DEVICE`]: the IP, its prefix length, and whether the agent's mark is
    /// on it.
    pub async fn addresses(&self) -> Vec<(IpAddr, u8, bool)> {
        let device = self.device;
        self.handle
            .address()
            .get()
            .execute()
            .try_filter_map(|message| async move {
                if message.header.index != device {
                    return Ok(None);
                }
                let (mut ip, mut local, mut marked) = (None, None, false);
                for attribute in &message.attributes {
                    match attribute {
                        AddressAttribute::Address(a) => ip = Some(*a),
                        AddressAttribute::Local(a) => local = Some(*a),
                        AddressAttribute::Protocol(p) => marked = u8::from(*p) == ADDRESS_PROTOCOL,
                        _ => {}
                    }
                }
                Ok(local
                    .or(ip)
                    .map(|ip| (ip, message.header.prefix_len, marked)))
            })
            .try_collect()
            .await
            .unwrap()
    }
}

/// Runs `f` on a thread of its own inside `namespace`, within the test's runtime (a socket's
/// driver spawned there runs on the runtime; the socket stays in the namespace it was opened in).
fn inside<T: Send>(namespace: &File, f: impl FnOnce() -> T + Send) -> T {
    let runtime = tokio::runtime::Handle::current();
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                setns(namespace, CloneFlags::CLONE_NEWNET).expect("entering the node's namespace");
                let _runtime = runtime.enter();
                f()
            })
            .join()
            .unwrap()
    })
}

async fn link_index(handle: &Handle, name: &str) -> u32 {
    handle
        .link()
        .get()
        .match_name(name.to_owned())
        .execute()
        .try_next()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no link {name}"))
        .header
        .index
}

/// The node agent of one node, running in process over that node's namespace, with the
/// DaemonSet's defaults (a heartbeat every second, `leaseDurationSeconds` 3), its Lease in
/// [`NAMESPACE`]. Stopping it is SIGTERM's: addresses and label stay as they are.
pub struct Agent {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    health: Arc<Health>,
    registry: Registry,
}

impl Agent {
    /// Starts `node`'s agent with `client`, its netlink in `netns`.
    pub fn start(client: &kube::Client, netns: &NodeNetns, node: &str) -> Self {
        let netlink = inside(&netns.namespace, || Netlink::connect().unwrap());
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let health = Arc::new(Health::default());
        let settings = Settings {
            node: node.to_owned(),
            lease_namespace: NAMESPACE.to_owned(),
            heartbeat_interval: std::time::Duration::from_secs(1),
            lease_duration_seconds: 3,
            interface: None,
        };
        let (stop, stopped) = oneshot::channel();
        let agent = tokio::spawn(run(
            client.clone(),
            netlink,
            settings,
            metrics,
            Arc::clone(&health),
            async move {
                let _ = stopped.await;
            },
        ));
        let node = node.to_owned();
        let task = tokio::spawn(async move {
            agent
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("the agent of {node} stopped on its own: {e}"));
        });
        Self {
            stop,
            task,
            health,
            registry,
        }
    }

    /// Whether its watches have listed (its `/readyz`).
    pub fn ready(&self) -> bool {
        self.health.ready()
    }

    /// The value of sample `sample` (name and labels as exposed, e.g.
    /// `cloudnet_node_gateways`) on its `/metrics`, if exposed.
    pub fn sample(&self, sample: &str) -> Option<f64> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == sample).then(|| value.parse().ok())?
        })
    }

    /// Stops it as SIGTERM does.
    pub async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap();
    }
}
