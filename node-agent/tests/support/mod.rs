//! A network namespace per test: a thread of its own that leaves the host's namespace with
//! `unshare(CLONE_NEWNET)` (safe in `nix`; the workspace denies `unsafe`), with a veth pair
//! `veth0`/`veth1` up in it, and its own current-thread tokio runtime, so that every task of the
//! test runs on that thread. Tests run as root here and in CI; the kernel has no `dummy` link
//! type, so the interfaces are veths.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use cloudnet_node::plan::{ADDRESS_PROTOCOL, HostAddress};
use futures::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressProtocol};
use nix::sched::{CloneFlags, setns, unshare};
use rtnetlink::{Handle, LinkUnspec, LinkVeth};

/// The test's namespace and the host's, to move the thread between them.
pub struct Netns {
    host: File,
    test: File,
}

impl Netns {
    /// Runs `f` with the thread in the test's namespace: sockets opened there stay there.
    pub fn inside<T>(&self, f: impl FnOnce() -> T) -> T {
        setns(&self.test, CloneFlags::CLONE_NEWNET).expect("entering the test's namespace");
        let out = f();
        setns(&self.host, CloneFlags::CLONE_NEWNET).expect("back to the host's namespace");
        out
    }
}

/// Runs `test` on a new thread in a new network namespace with `veth0`/`veth1` up and their
/// addresses (`veth0`: 10.0.0.10/24 and fd00::10/64; `veth1`: 10.0.1.10/24 and fd00:1::10/64),
/// then back in the host's namespace (for a client of the local kube-apiserver), with a netlink
/// handle into the test's namespace.
pub fn with_netns<F, Fut>(test: F)
where
    F: FnOnce(Netns, Handle) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let thread = std::thread::spawn(move || {
        let host = File::open("/proc/thread-self/ns/net").expect("the host's namespace");
        unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET): the tests run as root");
        let netns_file = File::open("/proc/thread-self/ns/net").expect("the test's namespace");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let (connection, handle, _) = rtnetlink::new_connection().unwrap();
            tokio::spawn(connection);
            setup_links(&handle).await;
            setns(&host, CloneFlags::CLONE_NEWNET).unwrap();
            test(
                Netns {
                    host,
                    test: netns_file,
                },
                handle,
            )
            .await;
        });
    });
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

async fn setup_links(handle: &Handle) {
    handle
        .link()
        .add(LinkVeth::new("veth0", "veth1").build())
        .execute()
        .await
        .unwrap();
    for (name, v4, v6) in [
        ("veth0", "10.0.0.10", "fd00::10"),
        ("veth1", "10.0.1.10", "fd00:1::10"),
    ] {
        let index = link_index(handle, name).await;
        handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .unwrap();
        add_plain(handle, index, v4.parse().unwrap(), 24).await;
        add_plain(handle, index, v6.parse().unwrap(), 64).await;
    }
    let lo = link_index(handle, "lo").await;
    handle
        .link()
        .set(LinkUnspec::new_with_index(lo).up().build())
        .execute()
        .await
        .unwrap();
}

/// The ifindex of `name`.
pub async fn link_index(handle: &Handle, name: &str) -> u32 {
    handle
        .link()
        .get()
        .match_name(name.to_owned())
        .execute()
        .try_next()
        .await
        .unwrap()
        .unwrap()
        .header
        .index
}

/// Adds `ip/prefix_len` without the agent's mark, as an admin or a DHCP client would.
pub async fn add_plain(handle: &Handle, index: u32, ip: IpAddr, prefix_len: u8) {
    let mut request = handle.address().add(index, ip, prefix_len);
    if ip.is_ipv6() {
        request
            .message_mut()
            .attributes
            .push(AddressAttribute::Flags(
                netlink_packet_route::address::AddressFlags::Nodad,
            ));
    }
    request.execute().await.unwrap();
}

/// Adds `ip` as the agent does, with its mark: what an earlier run of the agent left.
pub async fn add_marked(handle: &Handle, index: u32, ip: IpAddr) {
    let prefix_len = cloudnet_node::netlink::host_prefix(ip);
    let mut request = handle.address().add(index, ip, prefix_len);
    request
        .message_mut()
        .attributes
        .push(AddressAttribute::Protocol(AddressProtocol::Other(
            ADDRESS_PROTOCOL,
        )));
    request.execute().await.unwrap();
}

/// Removes `ip` from device `index`, as someone else would.
pub async fn remove(handle: &Handle, index: u32, ip: IpAddr) {
    let address = addresses(handle)
        .await
        .into_iter()
        .find(|a| a.ip == ip && a.index == index)
        .expect("the address to remove");
    let message = match address.ip {
        IpAddr::V4(v4) => rtnetlink::AddressMessageBuilder::<std::net::Ipv4Addr>::new()
            .index(index)
            .address(v4, address.prefix_len)
            .build(),
        IpAddr::V6(v6) => rtnetlink::AddressMessageBuilder::<std::net::Ipv6Addr>::new()
            .index(index)
            .address(v6, address.prefix_len)
            .build(),
    };
    handle.address().del(message).execute().await.unwrap();
}

/// Every address of the namespace `handle` reaches.
pub async fn addresses(handle: &Handle) -> Vec<HostAddress> {
    handle
        .address()
        .get()
        .execute()
        .try_filter_map(|message| async move {
            let mut ip = None;
            let mut local = None;
            let mut ours = false;
            for attribute in &message.attributes {
                match attribute {
                    AddressAttribute::Address(a) => ip = Some(*a),
                    AddressAttribute::Local(a) => local = Some(*a),
                    AddressAttribute::Protocol(p) => ours = u8::from(*p) == ADDRESS_PROTOCOL,
                    _ => {}
                }
            }
            Ok(local.or(ip).map(|ip| HostAddress {
                index: message.header.index,
                ip,
                prefix_len: message.header.prefix_len,
                ours,
            }))
        })
        .try_collect()
        .await
        .unwrap()
}

/// Waits until `condition` holds for the namespace's addresses, at most `within`; panics with
/// `what` and the addresses then.
pub async fn wait_for_addresses(
    handle: &Handle,
    what: &str,
    within: Duration,
    condition: impl Fn(&[HostAddress]) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let now = addresses(handle).await;
        if condition(&now) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{what} not within {within:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `ip` is on device `index` carrying the agent's mark, as a host address.
pub fn has_marked(addresses: &[HostAddress], index: u32, ip: IpAddr) -> bool {
    addresses.iter().any(|a| {
        a.ip == ip
            && a.index == index
            && a.ours
            && a.prefix_len == cloudnet_node::netlink::host_prefix(ip)
    })
}
