//! Slow clients against the webhook: many connections (HTTP/1.1) or streams (HTTP/2) that send
//! complete headers and a few bytes of a larger body, hold until the server answers or closes,
//! and open again; and a probe that sends valid reviews meanwhile and times their answers.
//!
//! All tokio tasks over loopback, so the load costs little beside the server on a 2-core machine.
//! The slow clients come from other loopback addresses (127.0.0.2 and up) than the probe
//! (127.0.0.1), as a tenant's pods do from kube-apiserver's.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

/// The protocol of a burst or a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// One request per connection at a time.
    Http1,
    /// Many streams per connection.
    Http2,
}

/// The shape of a burst of slow clients.
#[derive(Clone, Copy, Debug)]
pub struct Burst {
    /// HTTP/1.1 or HTTP/2.
    pub protocol: Protocol,
    /// Source addresses, 127.0.0.2 and up.
    pub peers: usize,
    /// Connections from each address.
    pub connections_per_peer: usize,
    /// Streams open at once on each HTTP/2 connection (1 for HTTP/1.1).
    pub streams_per_connection: usize,
    /// The `Content-Length` each request declares.
    pub declared: usize,
    /// The body bytes each request sends of it before stalling.
    pub sent: usize,
}

/// What a burst did.
#[derive(Clone, Copy, Debug, Default)]
pub struct BurstStats {
    /// Requests started (each one held a connection or a stream until answered or cut).
    pub requests: u64,
    /// Connections opened (re-opens included).
    pub connections: u64,
}

/// `tls` with the ALPN protocol of `protocol`.
pub fn with_alpn(tls: &ClientConfig, protocol: Protocol) -> Arc<ClientConfig> {
    let mut config = tls.clone();
    config.alpn_protocols = vec![match protocol {
        Protocol::Http1 => b"http/1.1".to_vec(),
        Protocol::Http2 => b"h2".to_vec(),
    }];
    Arc::new(config)
}

async fn open_tls(
    addr: SocketAddr,
    from: IpAddr,
    tls: Arc<ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(addr).await?;
    tcp.set_nodelay(true)?;
    Ok(tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await?)
}

/// Runs `burst` against `addr` until `until`: every connection or stream sends its headers and
/// `sent` bytes, waits for the server's answer or close, and starts again.
pub async fn hold(
    addr: SocketAddr,
    tls: &ClientConfig,
    burst: Burst,
    until: Instant,
) -> Result<BurstStats> {
    let tls = with_alpn(tls, burst.protocol);
    let requests = Arc::new(AtomicU64::new(0));
    let connections = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for peer in 0..burst.peers {
        let last = u8::try_from(peer + 2).context("at most 253 peers")?;
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
        for _ in 0..burst.connections_per_peer {
            let (tls, requests, connections) = (
                Arc::clone(&tls),
                Arc::clone(&requests),
                Arc::clone(&connections),
            );
            tasks.spawn(async move {
                while Instant::now() < until {
                    connections.fetch_add(1, Ordering::Relaxed);
                    let held = match burst.protocol {
                        Protocol::Http1 => hold_http1(addr, from, &tls, burst, &requests).await,
                        Protocol::Http2 => {
                            hold_http2(addr, from, &tls, burst, &requests, until).await
                        }
                    };
                    if held.is_err() {
                        // Refused or cut: open again, but not in a tight loop.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            });
        }
    }
    // Each task stops on its own at `until`, when its connection is answered or closed.
    let _ = tokio::time::timeout_at((until + Duration::from_secs(15)).into(), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    Ok(BurstStats {
        requests: requests.load(Ordering::Relaxed),
        connections: connections.load(Ordering::Relaxed),
    })
}

fn slow_head(declared: usize) -> String {
    format!(
        "POST /validate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
    )
}

/// One HTTP/1.1 connection: headers and the first bytes, then wait for the server.
async fn hold_http1(
    addr: SocketAddr,
    from: IpAddr,
    tls: &Arc<ClientConfig>,
    burst: Burst,
    requests: &AtomicU64,
) -> Result<()> {
    let mut stream = open_tls(addr, from, Arc::clone(tls)).await?;
    requests.fetch_add(1, Ordering::Relaxed);
    stream
        .write_all(slow_head(burst.declared).as_bytes())
        .await?;
    stream.write_all(&vec![b' '; burst.sent]).await?;
    stream.flush().await?;
    let mut buffer = [0u8; 1024];
    // Until the server answers and closes; bounded by the server's own deadlines.
    while stream.read(&mut buffer).await? > 0 {}
    Ok(())
}

type SlowBody = BoxBody<Bytes, Infallible>;

/// A body that sends `sent` bytes and then nothing, forever.
fn stalled_body(sent: usize) -> SlowBody {
    let first = futures::stream::once(async move {
        Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b' '; sent])))
    });
    BodyExt::boxed(StreamBody::new(first.chain(futures::stream::pending())))
}

/// One HTTP/2 connection with `streams_per_connection` slow streams, each re-opened when
/// answered or reset, until `until` or the connection ends.
async fn hold_http2(
    addr: SocketAddr,
    from: IpAddr,
    tls: &Arc<ClientConfig>,
    burst: Burst,
    requests: &Arc<AtomicU64>,
    until: Instant,
) -> Result<()> {
    let stream = open_tls(addr, from, Arc::clone(tls)).await?;
    let (sender, connection) = hyper::client::conn::http2::handshake::<_, _, SlowBody>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await?;
    let mut connection = tokio::spawn(connection);
    let mut streams = JoinSet::new();
    for _ in 0..burst.streams_per_connection {
        let (mut sender, requests) = (sender.clone(), Arc::clone(requests));
        streams.spawn(async move {
            while Instant::now() < until {
                sender.ready().await?;
                let request = hyper::Request::post(format!("https://{addr}/validate"))
                    .header("content-type", "application/json")
                    .header("content-length", burst.declared)
                    .body(stalled_body(burst.sent))?;
                requests.fetch_add(1, Ordering::Relaxed);
                // An answer (408 once the body deadline passes) or a reset: open another.
                if let Ok(response) = sender.send_request(request).await {
                    let _ = response.into_body().collect().await;
                }
            }
            anyhow::Ok(())
        });
    }
    tokio::select! {
        _ = &mut connection => {}
        () = async { while streams.join_next().await.is_some() {} } => {}
    }
    streams.abort_all();
    connection.abort();
    Ok(())
}

/// The probe's latencies, and its failures described.
#[derive(Clone, Debug, Default)]
pub struct ProbeStats {
    /// Time from sending (connection and TLS handshake included) to the whole answer.
    pub latencies: Vec<Duration>,
    /// Probes that failed or were not answered 200 with `allowed`, each described.
    pub failures: Vec<String>,
    /// How long each failed probe took to fail.
    pub failed_after: Vec<Duration>,
}

impl ProbeStats {
    /// The `q` quantile of the latencies.
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let at = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
        sorted.get(at).copied().unwrap_or_default()
    }

    /// The longest latency.
    pub fn max(&self) -> Duration {
        self.latencies.iter().max().copied().unwrap_or_default()
    }
}

/// Every `every` until `until`, posts `review` to `/validate` over a new connection from
/// 127.0.0.1 (as kube-apiserver's first call after a connection ends) and times the answer,
/// each bounded by `limit`.
pub async fn probe(
    addr: SocketAddr,
    tls: &ClientConfig,
    protocol: Protocol,
    review: Bytes,
    every: Duration,
    until: Instant,
    limit: Duration,
) -> ProbeStats {
    let tls = with_alpn(tls, protocol);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut probes = JoinSet::new();
    while Instant::now() < until {
        ticks.tick().await;
        let (tls, review) = (Arc::clone(&tls), review.clone());
        probes.spawn(async move {
            let sent = Instant::now();
            let answer =
                tokio::time::timeout(limit, review_once(addr, tls, protocol, review)).await;
            (sent.elapsed(), answer)
        });
    }
    let mut stats = ProbeStats::default();
    while let Some(done) = probes.join_next().await {
        if let Ok((latency, answer)) = &done
            && !matches!(answer, Ok(Ok((200, body))) if allowed(body))
        {
            stats.failed_after.push(*latency);
        }
        match done {
            Ok((latency, Ok(Ok((200, body))))) if allowed(&body) => stats.latencies.push(latency),
            Ok((latency, Ok(Ok((status, body))))) => stats.failures.push(format!(
                "{status} after {latency:?}: {}",
                String::from_utf8_lossy(&body)
            )),
            Ok((latency, Ok(Err(error)))) => stats
                .failures
                .push(format!("failed after {latency:?}: {error:#}")),
            Ok((latency, Err(_))) => stats.failures.push(format!("no answer within {latency:?}")),
            Err(error) => stats.failures.push(format!("probe task: {error}")),
        }
    }
    stats
}

fn allowed(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .is_ok_and(|review| review["response"]["allowed"] == true)
}

async fn review_once(
    addr: SocketAddr,
    tls: Arc<ClientConfig>,
    protocol: Protocol,
    review: Bytes,
) -> Result<(u16, Bytes)> {
    let stream = open_tls(addr, IpAddr::V4(Ipv4Addr::LOCALHOST), tls).await?;
    let request = hyper::Request::post(format!("https://{addr}/validate"))
        .header("content-type", "application/json")
        .body(Full::new(review))?;
    let response = match protocol {
        Protocol::Http1 => {
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            let (mut parts, body) = request.into_parts();
            parts.uri = "/validate".parse()?;
            parts
                .headers
                .insert("host", hyper::header::HeaderValue::from_static("127.0.0.1"));
            sender
                .send_request(hyper::Request::from_parts(parts, body))
                .await?
        }
        Protocol::Http2 => {
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await?;
            tokio::spawn(connection);
            sender.send_request(request).await?
        }
    };
    let status = response.status().as_u16();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}

/// The two bursts the issue names: 600 slow HTTP/1.1 clients from 10 addresses, and 20 HTTP/2
/// connections from 4 addresses each holding 32 streams (the server's cap), 640 in all, more
/// than the webhook's 512 request slots. Each sends headers and 10 bytes of a 4 KiB body.
pub const BURSTS: [Burst; 2] = [
    Burst {
        protocol: Protocol::Http1,
        peers: 10,
        connections_per_peer: 60,
        streams_per_connection: 1,
        declared: 4096,
        sent: 10,
    },
    Burst {
        protocol: Protocol::Http2,
        peers: 4,
        connections_per_peer: 5,
        streams_per_connection: 32,
        declared: 4096,
        sent: 10,
    },
];

/// Runs `burst` for `hold` while a valid `review` is sent every 100 ms on a new connection of
/// the burst's protocol from the first moment, each bounded by 15 s. The probe runs on a thread
/// and runtime of its own, so that its timings are the server's, not the load generator's queue.
pub async fn measure(
    addr: SocketAddr,
    tls: &Arc<ClientConfig>,
    burst: Burst,
    review: Bytes,
    hold_for: Duration,
) -> Result<(ProbeStats, BurstStats)> {
    let until = Instant::now() + hold_for;
    let load_tls = Arc::clone(tls);
    let slow = tokio::spawn(async move { hold(addr, &load_tls, burst, until).await });
    let probe_tls = Arc::clone(tls);
    let probes = tokio::task::spawn_blocking(move || -> Result<ProbeStats> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(runtime.block_on(probe(
            addr,
            &probe_tls,
            burst.protocol,
            review,
            Duration::from_millis(100),
            until,
            Duration::from_secs(15),
        )))
    })
    .await??;
    Ok((probes, slow.await??))
}
