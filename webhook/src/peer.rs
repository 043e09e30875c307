//! What one peer (one source address) may hold: open connections, and admission requests being
//! read or reviewed.
//!
//! kube-apiserver calls from its own address (a control-plane node's, often on the host
//! network), a tenant's pods from theirs. Capping each address keeps one of them from taking
//! the connections and requests the others need; see webhook/README.md, "What limits a client".
//! No crate keys a limit by the peer of a raw TLS connection; this is a map of counters and
//! per-peer semaphores, each entry dropped with the peer's last connection.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections one address may have open; a further one is closed at once. kube-apiserver
/// speaks HTTP/2 to the webhook and needs a connection per
/// [`crate::server::MAX_CONCURRENT_STREAMS`] reviews in flight.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;
/// Admission requests one address may have being read or reviewed at once; further ones wait,
/// holding only their stream or connection.
pub const MAX_REQUESTS_PER_PEER: usize = 128;
/// TLS handshakes one address may have under way at once; further ones wait (within the
/// handshake timeout). A handshake is the costliest step of a connection: without this, hundreds
/// of connections re-opened at once by one tenant queue everyone's handshakes behind theirs.
pub const MAX_HANDSHAKES_PER_PEER: usize = 8;

/// The per-peer caps.
#[derive(Clone, Copy, Debug)]
pub struct PeerLimits {
    /// Open connections per address.
    pub connections: usize,
    /// Requests read or reviewed at once per address.
    pub requests: usize,
}

impl Default for PeerLimits {
    fn default() -> Self {
        Self {
            connections: MAX_CONNECTIONS_PER_PEER,
            requests: MAX_REQUESTS_PER_PEER,
        }
    }
}

/// Every peer with an open connection.
#[derive(Debug)]
pub struct Peers {
    limits: PeerLimits,
    open: Mutex<HashMap<IpAddr, Peer>>,
}

#[derive(Debug)]
struct Peer {
    connections: usize,
    requests: Arc<Semaphore>,
    handshakes: Arc<Semaphore>,
}

impl Peers {
    /// No peer yet.
    pub fn new(limits: PeerLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: Mutex::default(),
        })
    }

    /// Counts a new connection from `ip`; `None` when the address already has its share.
    pub fn connect(self: &Arc<Self>, ip: IpAddr) -> Option<PeerConnection> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let peer = open.entry(ip).or_insert_with(|| Peer {
            connections: 0,
            requests: Arc::new(Semaphore::new(self.limits.requests)),
            handshakes: Arc::new(Semaphore::new(MAX_HANDSHAKES_PER_PEER)),
        });
        if peer.connections >= self.limits.connections {
            return None;
        }
        peer.connections += 1;
        Some(PeerConnection {
            peers: Arc::clone(self),
            ip,
            requests: PeerRequests(Arc::clone(&peer.requests)),
            handshakes: Arc::clone(&peer.handshakes),
        })
    }

    /// Connections open from `ip`.
    pub fn connections(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&ip).map_or(0, |peer| peer.connections)
    }
}

/// One open connection of a peer; the count goes down when it is dropped.
#[derive(Debug)]
pub struct PeerConnection {
    peers: Arc<Peers>,
    ip: IpAddr,
    requests: PeerRequests,
    handshakes: Arc<Semaphore>,
}

impl PeerConnection {
    /// Waits for one of the peer's handshake permits, in order of arrival.
    pub async fn handshake(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.handshakes).acquire_owned().await.ok()
    }

    /// The peer's request share, for the requests of this connection.
    pub fn requests(&self) -> PeerRequests {
        self.requests.clone()
    }
}

impl Drop for PeerConnection {
    fn drop(&mut self) {
        let mut open = self
            .peers
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(peer) = open.get_mut(&self.ip) {
            peer.connections -= 1;
            if peer.connections == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A peer's share of requests, carried in each of its requests' extensions.
#[derive(Clone, Debug)]
pub struct PeerRequests(Arc<Semaphore>);

impl PeerRequests {
    /// Waits for one of the peer's request permits, in order of arrival.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.0).acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_address_has_its_own_connections_and_requests_and_is_forgotten_when_gone() {
        let peers = Peers::new(PeerLimits {
            connections: 2,
            requests: 1,
        });
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let first = peers.connect(a);
        let second = peers.connect(a);
        assert!(first.is_some() && second.is_some());
        assert!(
            peers.connect(a).is_none(),
            "a third connection from one address"
        );
        assert!(
            peers.connect(b).is_some(),
            "another address is not affected"
        );

        // The two connections of `a` share one request permit.
        let (Some(first), Some(second)) = (first, second) else {
            return;
        };
        let held = first.requests().acquire().await;
        assert!(held.is_some());
        let waiting = second.requests();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), waiting.acquire())
                .await
                .is_err()
        );
        drop(held);
        assert!(waiting.acquire().await.is_some());

        drop(first);
        assert_eq!(peers.connections(a), 1);
        assert!(
            peers.connect(a).is_some(),
            "a freed connection is available again"
        );
        drop(second);
        assert_eq!(peers.connections(a), 0);
        assert!(
            peers
                .open
                .lock()
                .map(|open| !open.contains_key(&a))
                .unwrap_or(false)
        );
    }
}
