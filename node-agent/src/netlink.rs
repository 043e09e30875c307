//! The host's side, through rtnetlink: read the links and addresses, add and remove the agent's
//! addresses, and hear when any address or link changes. The only module that knows netlink's
//! types; the rest sees [`crate::plan`]'s.

use std::net::IpAddr;

use futures::{FutureExt as _, Stream, StreamExt, TryStreamExt};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressProtocol,
};
use netlink_packet_route::link::LinkAttribute;
use rtnetlink::{Handle, MulticastGroup};
use thiserror::Error;

use crate::plan::{ADDRESS_PROTOCOL, Add, Host, HostAddress, Link};

/// A netlink request failed.
#[derive(Debug, Error)]
pub enum NetlinkError {
    /// The socket could not be opened or bound (no `NET_ADMIN`, no netlink in the sandbox).
    #[error("opening the netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The kernel refused or the connection failed.
    #[error("netlink {operation}: {source}")]
    Request {
        /// What was asked.
        operation: &'static str,
        /// The kernel's answer.
        #[source]
        source: rtnetlink::Error,
    },
}

/// `EEXIST`: the address is there already (the kernel refuses an exclusive add of it).
const EEXIST: i32 = 17;
/// `EADDRNOTAVAIL`: the address is gone already.
const EADDRNOTAVAIL: i32 = 99;

/// One rtnetlink connection in the network namespace it was opened in, subscribed to the address
/// and link notifications.
pub struct Netlink {
    handle: Handle,
    notifications: Box<dyn Stream<Item = ()> + Send + Sync + Unpin>,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink").finish_non_exhaustive()
    }
}

impl Netlink {
    /// Opens the connection in the calling thread's network namespace and spawns its driver on
    /// the current tokio runtime. The socket stays in that namespace for its life, whatever
    /// namespace the thread moves to later.
    pub fn connect() -> Result<Self, NetlinkError> {
        let (connection, handle, messages) = rtnetlink::new_multicast_connection(&[
            MulticastGroup::Ipv4Ifaddr,
            MulticastGroup::Ipv6Ifaddr,
            MulticastGroup::Link,
        ])
        .map_err(NetlinkError::Socket)?;
        tokio::spawn(connection);
        Ok(Self {
            handle,
            notifications: Box::new(messages.map(|_| ())),
        })
    }

    /// Resolves when an address or a link changed since the last call (its own changes
    /// included), once for a burst. Pending forever once the kernel's notifications stop (the
    /// periodic resync still runs).
    pub async fn changed(&mut self) {
        if self.notifications.next().await.is_none() {
            tracing::warn!("netlink notifications ended; repairs wait for the periodic resync");
            std::future::pending::<()>().await;
        }
        // The rest of the burst: one resync answers it all.
        while let Some(Some(())) = self.notifications.next().now_or_never() {}
    }

    /// Every link and address of the namespace.
    pub async fn host(&self) -> Result<Host, NetlinkError> {
        let links = self
            .handle
            .link()
            .get()
            .execute()
            .map_ok(|message| Link {
                index: message.header.index,
                name: message
                    .attributes
                    .iter()
                    .find_map(|attribute| match attribute {
                        LinkAttribute::IfName(name) => Some(name.clone()),
                        _ => None,
                    })
                    .unwrap_or_default(),
            })
            .try_collect()
            .await
            .map_err(|source| NetlinkError::Request {
                operation: "listing links",
                source,
            })?;
        let addresses = self
            .handle
            .address()
            .get()
            .execute()
            .try_filter_map(|message| std::future::ready(Ok(host_address(&message))))
            .try_collect()
            .await
            .map_err(|source| NetlinkError::Request {
                operation: "listing addresses",
                source,
            })?;
        Ok(Host { links, addresses })
    }

    /// Adds `add.ip` as a host address (/32, /128) on its device, marked as the agent's; IPv6
    /// without duplicate address detection, so it is usable at once (the cloud already
    /// guarantees it is this VM's). An address already there is success.
    pub async fn add(&self, add: &Add) -> Result<(), NetlinkError> {
        let prefix_len = host_prefix(add.ip);
        let mut request = self.handle.address().add(add.index, add.ip, prefix_len);
        let message = request.message_mut();
        message
            .attributes
            .push(AddressAttribute::Protocol(AddressProtocol::Other(
                ADDRESS_PROTOCOL,
            )));
        if add.ip.is_ipv6() {
            message.header.flags |= AddressHeaderFlags::Nodad;
            message
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        match request.execute().await {
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            other => other.map_err(|source| NetlinkError::Request {
                operation: "adding an address",
                source,
            }),
        }
    }

    /// Removes `address`. One already gone is success.
    pub async fn remove(&self, address: &HostAddress) -> Result<(), NetlinkError> {
        let message = match address.ip {
            IpAddr::V4(v4) => rtnetlink::AddressMessageBuilder::<std::net::Ipv4Addr>::new()
                .index(address.index)
                .address(v4, address.prefix_len)
                .build(),
            IpAddr::V6(v6) => rtnetlink::AddressMessageBuilder::<std::net::Ipv6Addr>::new()
                .index(address.index)
                .address(v6, address.prefix_len)
                .build(),
        };
        match self.handle.address().del(message).execute().await {
            Err(e) if errno(&e) == Some(EADDRNOTAVAIL) => Ok(()),
            other => other.map_err(|source| NetlinkError::Request {
                operation: "removing an address",
                source,
            }),
        }
    }
}

/// The prefix length of a single address of `ip`'s family.
pub fn host_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// The address a dump's message describes: IPv4's local address (`IFA_ADDRESS` is the peer's on
/// a point-to-point link), IPv6's address.
fn host_address(message: &AddressMessage) -> Option<HostAddress> {
    let mut local = None;
    let mut address = None;
    let mut ours = false;
    for attribute in &message.attributes {
        match attribute {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            AddressAttribute::Protocol(protocol) => {
                ours = u8::from(*protocol) == ADDRESS_PROTOCOL;
            }
            _ => {}
        }
    }
    Some(HostAddress {
        index: message.header.index,
        ip: local.or(address)?,
        prefix_len: message.header.prefix_len,
        ours,
    })
}

/// The errno of a kernel's refusal.
fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => Some(message.raw_code().abs()),
        _ => None,
    }
}
