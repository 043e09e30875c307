//! A TCP forwarder with a cut switch, to partition one client from a server (a reconciler from
//! kube-apiserver) while everything else keeps talking to it.
//!
//! A cut behaves like a network partition, not like a dead server: nothing is refused or reset.
//! Open connections stop relaying in both directions and new connections are accepted but not
//! connected through, so the client sees requests that never get an answer, as it would if a
//! switch or a firewall dropped its packets. Bytes read just before the cut are held, and a
//! [`TcpCut::restore`] lets everything flow again.
//!
//! A hole ([`TcpCut::open_hole`], [`TcpCut::close_hole`]) is the same outage, except that every
//! connection open before or during it stays dead for good (as one through a load balancer or
//! an apiserver that went away): only connections made after the hole carry bytes again.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A running forwarder (on 127.0.0.1 unless started elsewhere). Dropping it closes the port and every relayed connection.
#[derive(Debug)]
pub struct TcpCut {
    addr: SocketAddr,
    open: watch::Sender<Link>,
    accept: JoinHandle<()>,
}

/// What passes: nothing while closed; while open, only connections of the current generation.
#[derive(Clone, Copy, Debug)]
struct Link {
    open: bool,
    generation: u64,
}

impl Link {
    fn carries(self, born: u64) -> bool {
        self.open && self.generation == born
    }
}

impl TcpCut {
    /// Binds a free port on 127.0.0.1 and relays every connection to `upstream`, on the calling
    /// tokio runtime.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        Self::start_on(IpAddr::from([127, 0, 0, 1]), upstream).await
    }

    /// As [`Self::start`], listening on `ip` (`0.0.0.0`: reachable from a one-node cluster's
    /// pod network, whose pods see the host at [`crate::harness::cluster::HOST_FROM_PODS`]).
    pub async fn start_on(ip: IpAddr, upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind((ip, 0))
            .await
            .context("binding the forwarder port")?;
        let addr = listener.local_addr()?;
        let (open, _) = watch::channel(Link {
            open: true,
            generation: 0,
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, open.subscribe()));
        Ok(Self { addr, open, accept })
    }

    /// The address clients connect to instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding: from now on no byte passes in either direction, on open connections or
    /// new ones, until [`Self::restore`].
    pub fn cut(&self) {
        self.open.send_modify(|link| link.open = false);
    }

    /// Forwards again, held bytes first.
    pub fn restore(&self) {
        self.open.send_modify(|link| link.open = true);
    }

    /// Stops forwarding as [`Self::cut`] does, for good on every connection open now or made
    /// before [`Self::close_hole`].
    pub fn open_hole(&self) {
        self.open.send_modify(|link| {
            link.open = false;
            link.generation += 1;
        });
    }

    /// Forwards new connections again; those of before stay dead.
    pub fn close_hole(&self) {
        self.open.send_modify(|link| {
            link.open = true;
            link.generation += 1;
        });
    }
}

impl Drop for TcpCut {
    fn drop(&mut self) {
        // The accept task owns the connection tasks; aborting it drops (and aborts) them all.
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, open: watch::Receiver<Link>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let born = open.borrow().generation;
        connections.spawn(relay(client, upstream, open.clone(), born));
    }
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    mut open: watch::Receiver<Link>,
    born: u64,
) {
    // A connection made during a cut waits, as a SYN into a partition would be retried.
    if open.wait_for(|link| link.carries(born)).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, open.clone(), born),
        pump(server_read, client_write, open, born),
    );
}

/// Copies `from` to `to` while the link carries this connection's generation; an end of stream
/// is passed on as a half-close.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut open: watch::Receiver<Link>,
    born: u64,
) {
    let mut buf = vec![0_u8; 16 * 1024];
    loop {
        if open.wait_for(|link| link.carries(born)).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            cut = open.wait_for(|link| !link.carries(born)) => {
                if cut.is_err() {
                    return;
                }
                continue;
            }
        };
        // A cut that came while these bytes were being read holds them too.
        if open.wait_for(|link| link.carries(born)).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    /// An echo server: every connection gets its bytes back.
    pub(crate) async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Option<Vec<u8>> {
        stream.write_all(message).await.unwrap();
        let mut answer = vec![0_u8; message.len()];
        // Absence can only be shown by waiting a while: 300 ms is ages on loopback.
        tokio::time::timeout(Duration::from_millis(300), stream.read_exact(&mut answer))
            .await
            .ok()
            .map(|read| {
                read.unwrap();
                answer
            })
    }

    #[tokio::test]
    async fn a_cut_holds_bytes_of_open_and_new_connections_until_restored() {
        let forwarder = TcpCut::start(echo_server().await).await.unwrap();
        let mut open = TcpStream::connect(forwarder.addr()).await.unwrap();
        assert_eq!(
            round_trip(&mut open, b"before").await.as_deref(),
            Some(&b"before"[..])
        );

        forwarder.cut();
        assert_eq!(round_trip(&mut open, b"during").await, None);
        // A new connection is accepted (no refusal, no reset) but goes nowhere.
        let mut late = TcpStream::connect(forwarder.addr()).await.unwrap();
        assert_eq!(round_trip(&mut late, b"late").await, None);

        forwarder.restore();
        let mut held = vec![0_u8; 6];
        open.read_exact(&mut held).await.unwrap();
        assert_eq!(&held, b"during");
        let mut held = vec![0_u8; 4];
        late.read_exact(&mut held).await.unwrap();
        assert_eq!(&held, b"late");
    }

    #[tokio::test]
    async fn a_hole_kills_the_connections_of_before_and_during_it_for_good() {
        let forwarder = TcpCut::start(echo_server().await).await.unwrap();
        let mut before = TcpStream::connect(forwarder.addr()).await.unwrap();
        assert!(round_trip(&mut before, b"up").await.is_some());
        forwarder.open_hole();
        assert_eq!(round_trip(&mut before, b"hole").await, None);
        let mut during = TcpStream::connect(forwarder.addr()).await.unwrap();
        assert_eq!(round_trip(&mut during, b"held").await, None);
        forwarder.close_hole();
        assert_eq!(round_trip(&mut before, b"dead").await, None);
        assert_eq!(round_trip(&mut during, b"dead").await, None);
        let mut after = TcpStream::connect(forwarder.addr()).await.unwrap();
        assert_eq!(
            round_trip(&mut after, b"after").await.as_deref(),
            Some(&b"after"[..])
        );
    }
}
