//! The TLS accept loop: rustls handshake, HTTP/1.1 or HTTP/2 by ALPN, limits against slow or
//! abusive clients (per connection here, per peer in `peer.rs`, per request in `intake.rs`), an
//! end to idle and old connections, and a graceful drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::peer::{PeerLimits, PeerRequests, Peers};
pub use crate::slots::MAX_CONNECTIONS;
use crate::slots::Slots;

/// A client must finish the TLS handshake within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// An HTTP/1.1 client must send its request headers within this time.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// What a connection may buffer of a request that waits for the memory budget (`budget.rs`):
/// HTTP/1.1's read buffer, and HTTP/2's flow-control windows (hyper's default is 1 MiB per
/// connection, so a few hundred connections could buffer hundreds of megabytes unread). Headers
/// and reviews fit many times over; a large body just takes more window updates.
pub const CONNECTION_BUFFER_BYTES: u32 = 32 * 1024;

/// Streams per HTTP/2 connection. A stream holds no request slot while its body arrives
/// (`intake.rs`), but its peer's share and up to a small body's bytes; kube-apiserver opens
/// another connection when it needs more streams.
pub const MAX_CONCURRENT_STREAMS: u32 = 32;
/// Streams a client may open and reset before being answered; a low bound is what defeats the
/// "rapid reset" attack (CVE-2023-44487).
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// How long in-flight requests may take to finish after shutdown begins.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// A connection without a request for this long is closed. kube-apiserver keeps idle
/// connections to a webhook for 90 s; HTTP/2 keep-alive pings do not count as use, or a client
/// that only pings would hold a connection slot forever.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// A connection older than this is closed gracefully (HTTP/2: GOAWAY, in-flight streams finish;
/// HTTP/1.1: after the current response), so kube-apiserver's long-lived connections spread
/// over the replicas again after a rollout or a scale-up instead of staying on the oldest pod.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// How long a connection may live, and how many one server and one peer may have.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// Idle time after which a connection is closed.
    pub idle_timeout: Duration,
    /// Age after which a connection is closed.
    pub max_age: Duration,
    /// The connection slots (shared with `/readyz`, which reports their saturation).
    pub connections: Slots,
    /// What one peer may hold.
    pub peers: PeerLimits,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            idle_timeout: IDLE_TIMEOUT,
            max_age: MAX_CONNECTION_AGE,
            connections: crate::slots::connection_slots(),
            peers: PeerLimits::default(),
        }
    }
}

/// Serves `app` over TLS on `listener` until `shutdown` completes, then drains open connections.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, tls, app, shutdown, ConnectionLimits::default()).await;
}

/// [`serve`] with connection lifetimes other than the defaults.
pub async fn serve_with(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
    limits: ConnectionLimits,
) {
    let acceptor = TlsAcceptor::from(tls);
    let builder = Arc::new(connection_builder());
    let (stopping, stop) = watch::channel(false);
    let peers = Peers::new(limits.peers);
    // A connection holds a slot until its task ends, so the drain waits for the slots.
    let slots = limits.connections.clone();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            () = &mut shutdown => break,
            slot = slots.acquire() => match slot {
                Some(slot) => slot,
                None => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Typically EMFILE: back off briefly instead of spinning on the error.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(from_peer) = peers.connect(peer.ip()) else {
            // Closed before the handshake costs anything; the slot is free again at once.
            tracing::debug!(%peer, "connection refused: the address has its share open");
            continue;
        };
        // Admission latency matters more than batching small writes.
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let builder = Arc::clone(&builder);
        let app = app.clone();
        let stop = stop.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let handshake = async {
                let _turn = from_peer.handshake().await;
                acceptor.accept(stream).await
            };
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            // hyper's protocol detection waits for bytes with no timeout of its own: a client
            // that completes TLS and sends nothing would hold a connection slot forever.
            let mut tls = tokio::io::BufReader::new(tls);
            match tokio::time::timeout(HEADER_READ_TIMEOUT, tls.fill_buf()).await {
                Ok(Ok(first)) if !first.is_empty() => {}
                Ok(Ok(_)) => return,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "connection failed before a request");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "no request within {HEADER_READ_TIMEOUT:?}");
                    return;
                }
            }
            let activity = Arc::new(Activity::new());
            let service = TowerToHyperService::new(tracked(
                app,
                Arc::clone(&activity),
                peer,
                from_peer.requests(),
            ));
            let connection = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(error) = drive(connection, &activity, &limits, stop).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    tracing::info!(connections = slots.held(), "draining connections");
    if !slots.all_free_within(DRAIN_TIMEOUT).await {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
}

/// Requests in flight on one connection, and when the last one ended.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    last_done: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            last_done: Mutex::new(Instant::now()),
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// When the connection will have been idle for `timeout`, if nothing starts meanwhile;
    /// `None` while a request is in flight.
    fn idle_deadline(&self, timeout: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = *self
            .last_done
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(last + timeout)
    }
}

/// One request in flight; its end is the connection's latest activity.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self
            .0
            .last_done
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `app`, recording each request's span on `activity` and giving it the peer's address and
/// request share.
fn tracked(
    app: Router,
    activity: Arc<Activity>,
    peer: SocketAddr,
    share: PeerRequests,
) -> impl tower::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    tower::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        let in_flight = activity.begin();
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        request.extensions_mut().insert(share.clone());
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await;
            drop(in_flight);
            response
        }
    })
}

/// Runs `connection` to its end, closing it gracefully when the server stops, when it has been
/// idle for the idle timeout, or when it reaches its maximum age.
async fn drive<I, S>(
    connection: auto::Connection<'_, I, S, TokioExecutor>,
    activity: &Activity,
    limits: &ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    auto::Connection<'static, I, S, TokioExecutor>:
        Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming> + Send,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    S::ResBody: Send,
    <S::ResBody as hyper::body::Body>::Data: Send,
{
    let mut connection = std::pin::pin!(connection.into_owned());
    let max_age = tokio::time::sleep(limits.max_age);
    let mut max_age = std::pin::pin!(max_age);
    loop {
        // Rechecked whenever it passes: a request may have come and gone meanwhile.
        let idle_check = activity
            .idle_deadline(limits.idle_timeout)
            .unwrap_or_else(|| Instant::now() + limits.idle_timeout);
        let reason = tokio::select! {
            result = connection.as_mut() => return result,
            _ = stop.wait_for(|stopping| *stopping) => "shutting down",
            () = &mut max_age => "maximum age reached",
            () = tokio::time::sleep_until(idle_check) => {
                match activity.idle_deadline(limits.idle_timeout) {
                    Some(deadline) if deadline <= Instant::now() => "idle",
                    _ => continue,
                }
            }
        };
        tracing::debug!(reason, "closing the connection");
        connection.as_mut().graceful_shutdown();
        return connection.await;
    }
}

fn connection_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true)
        .max_buf_size(CONNECTION_BUFFER_BYTES as usize);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .initial_stream_window_size(CONNECTION_BUFFER_BYTES)
        .initial_connection_window_size(CONNECTION_BUFFER_BYTES)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(1024)
        .max_header_list_size(64 * 1024)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    builder
}
