//! A keep-alive HTTPS load generator for the webhook, and the latency arithmetic of the benchmark.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// A TLS client configuration trusting only `ca_pem`, speaking HTTP/1.1.
pub fn client_config(ca_pem: &str) -> Result<Arc<ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One keep-alive HTTP/1.1 connection over TLS.
pub struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Connection {
    /// Connects and completes the TLS handshake.
    pub async fn open(addr: SocketAddr, tls: Arc<ClientConfig>) -> Result<Self> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        Self::over(addr, tcp, tls).await
    }

    /// [`Self::open`] from the source address `from`, as a client on another host would.
    pub async fn open_from(
        addr: SocketAddr,
        from: std::net::IpAddr,
        tls: Arc<ClientConfig>,
    ) -> Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(from, 0))?;
        let tcp = socket.connect(addr).await?;
        Self::over(addr, tcp, tls).await
    }

    async fn over(
        addr: SocketAddr,
        tcp: tokio::net::TcpStream,
        tls: Arc<ClientConfig>,
    ) -> Result<Self> {
        tcp.set_nodelay(true)?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(Self { sender })
    }

    /// Sends one request and returns the status and body.
    pub async fn request(&mut self, method: &str, path: &str, body: Bytes) -> Result<(u16, Bytes)> {
        self.sender.ready().await?;
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// What the client saw during one load phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientStats {
    /// Requests answered with 200.
    pub requests: u64,
    /// Requests that failed or got another status.
    pub errors: u64,
    /// Wall-clock length of the phase.
    pub seconds: f64,
    /// Requests per second.
    pub throughput: f64,
    /// Client-side latency percentiles, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// 99.9th percentile, microseconds.
    pub p999_us: u64,
}

/// Posts `bodies` round-robin to `path` over `connections` keep-alive connections for `duration`.
pub async fn drive(
    addr: SocketAddr,
    tls: Arc<ClientConfig>,
    path: &'static str,
    bodies: Arc<Vec<Bytes>>,
    connections: usize,
    duration: Duration,
) -> Result<ClientStats> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for worker in 0..connections {
        let (tls, bodies) = (Arc::clone(&tls), Arc::clone(&bodies));
        tasks.push(tokio::spawn(async move {
            let mut connection = Connection::open(addr, tls).await?;
            let mut latencies = Vec::with_capacity(1 << 16);
            let mut errors = 0u64;
            let mut i = worker * 7919;
            while Instant::now() < deadline {
                let body = bodies[i % bodies.len()].clone();
                i += 1;
                let sent = Instant::now();
                match connection.request("POST", path, body).await {
                    Ok((200, _)) => latencies.push(sent.elapsed().as_micros() as u64),
                    Ok(_) | Err(_) => errors += 1,
                }
            }
            anyhow::Ok((latencies, errors))
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (l, e) = task.await??;
        latencies.extend(l);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Ok(ClientStats {
        requests: latencies.len() as u64,
        errors,
        seconds,
        throughput: latencies.len() as f64 / seconds,
        p50_us: at(0.50),
        p99_us: at(0.99),
        p999_us: at(0.999),
    })
}

/// Cumulative histogram buckets `(upper bound in seconds, count)` of one endpoint, from a
/// Prometheus text exposition.
pub fn histogram(metrics: &str, endpoint: &str) -> Vec<(f64, u64)> {
    let label = format!("endpoint=\"{endpoint}\"");
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("cloudnet_webhook_request_duration_seconds_bucket{") && l.contains(&label)
        })
        .filter_map(|line| {
            let le = line.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = line.rsplit(' ').next()?.parse().ok()?;
            Some((bound, count))
        })
        .collect()
}

/// The `q` quantile of the observations between two cumulative histograms, in seconds,
/// interpolated linearly within the bucket (as Prometheus' `histogram_quantile` does).
pub fn quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> Result<f64> {
    if before.len() != after.len() && !before.is_empty() {
        bail!("histograms with different buckets");
    }
    let delta: Vec<(f64, u64)> = after
        .iter()
        .enumerate()
        .map(|(i, (le, n))| (*le, n - before.get(i).map_or(0, |b| b.1)))
        .collect();
    let total = delta.last().map(|b| b.1).context("empty histogram")?;
    if total == 0 {
        bail!("no observations");
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for (le, count) in delta {
        if count as f64 >= rank {
            if le.is_infinite() {
                return Ok(lower.0);
            }
            let within = (rank - lower.1 as f64) / (count - lower.1).max(1) as f64;
            return Ok(lower.0 + (le - lower.0) * within);
        }
        lower = (le, count);
    }
    Ok(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_the_bucket_of_the_rank() {
        let text = "cloudnet_webhook_request_duration_seconds_bucket{le=\"0.0001\",endpoint=\"validate\"} 50\n\
                    cloudnet_webhook_request_duration_seconds_bucket{le=\"0.0002\",endpoint=\"validate\"} 90\n\
                    cloudnet_webhook_request_duration_seconds_bucket{le=\"+Inf\",endpoint=\"validate\"} 100\n\
                    cloudnet_webhook_request_duration_seconds_bucket{le=\"0.0001\",endpoint=\"mutate\"} 7\n";
        let after = histogram(text, "validate");
        assert_eq!(after.len(), 3);
        let p50 = quantile(&[], &after, 0.5).unwrap();
        assert!((p50 - 0.0001).abs() < 1e-9, "{p50}");
        let p70 = quantile(&[], &after, 0.7).unwrap();
        assert!((p70 - 0.00015).abs() < 1e-9, "{p70}");
        // Beyond the last finite bucket the answer is that bucket's bound.
        assert!((quantile(&[], &after, 0.99).unwrap() - 0.0002).abs() < 1e-9);
        let before = vec![(0.0001, 50), (0.0002, 50), (f64::INFINITY, 50)];
        assert!((quantile(&before, &after, 0.5).unwrap() - 0.0002 + 0.0000375).abs() < 1e-6);
    }
}
