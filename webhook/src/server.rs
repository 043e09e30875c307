//! The TLS accept loop: rustls handshake, HTTP/1.1 or HTTP/2 by ALPN, limits against slow or
//! abusive clients, and a graceful drain on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// A client must finish the TLS handshake within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// An HTTP/1.1 client must send its request headers within this time.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at once; further clients wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 1024;
/// Streams per HTTP/2 connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 128;
/// Streams a client may open and reset before being answered; a low bound is what defeats the
/// "rapid reset" attack (CVE-2023-44487).
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// How long in-flight requests may take to finish after shutdown begins.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `app` over TLS on `listener` until `shutdown` completes, then drains open connections.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let builder = Arc::new(connection_builder());
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
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
        // Admission latency matters more than batching small writes.
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let builder = Arc::clone(&builder);
        let service = TowerToHyperService::new(app.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
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
            let connection = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!(connections = graceful.count(), "draining connections");
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
}

fn connection_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true)
        .max_buf_size(64 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(1024)
        .max_header_list_size(64 * 1024)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    builder
}
