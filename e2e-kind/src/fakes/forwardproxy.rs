//! A forward proxy as a cluster-wide proxy is: HTTP `CONNECT` tunnels and absolute-form plain
//! HTTP requests, counting the connections it makes per target (`host:port`), so a test can
//! prove that a client went through it and to where.
//!
//! Hosts under [`TEST_DOMAIN`] resolve, for the proxy only, to 127.0.0.1: a client given such a
//! URL can reach it through the proxy and in no other way, so a converged object proves that
//! every call went through the proxy. Written here because no crate offers a small counting proxy
//! to embed in a test.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Hosts under this domain (RFC 2606 reserves `.test`) resolve to 127.0.0.1 at the proxy.
pub const TEST_DOMAIN: &str = "cloudnet.test";

/// Longest request head the proxy reads.
const MAX_HEAD: usize = 64 * 1024;

/// A running proxy on 127.0.0.1. Dropping it closes the port and every relayed connection.
#[derive(Debug)]
pub struct ForwardProxy {
    addr: SocketAddr,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
    accept: JoinHandle<()>,
}

impl ForwardProxy {
    /// Binds a free port on 127.0.0.1 and serves on the calling tokio runtime.
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy port")?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Mutex::new(BTreeMap::new()));
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&counts)));
        Ok(Self {
            addr,
            counts,
            accept,
        })
    }

    /// The proxy URL, `http://127.0.0.1:<port>`, for `HTTP(S)_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections made so far, per target `host:port`.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Connections made so far to `target` (`host:port`).
    pub fn count(&self, target: &str) -> u64 {
        self.counts().get(target).copied().unwrap_or(0)
    }
}

impl Drop for ForwardProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// `host.<TEST_DOMAIN>:port` as a name a client can only reach through the proxy.
pub fn test_host(name: &str) -> String {
    format!("{name}.{TEST_DOMAIN}")
}

async fn accept_loop(listener: TcpListener, counts: Arc<Mutex<BTreeMap<String, u64>>>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let counts = Arc::clone(&counts);
        connections.spawn(async move {
            if let Err(e) = serve(client, &counts).await {
                tracing::debug!(error = %e, "proxy connection failed");
            }
        });
    }
}

async fn serve(mut client: TcpStream, counts: &Mutex<BTreeMap<String, u64>>) -> Result<()> {
    let (head, rest) = read_head(&mut client).await?;
    let text = String::from_utf8_lossy(&head).into_owned();
    let first = text.lines().next().unwrap_or_default().to_owned();
    let mut parts = first.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let mut upstream = match connect(target, counts).await {
            Ok(upstream) => upstream,
            Err(e) => {
                client
                    .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                    .await?;
                return Err(e);
            }
        };
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        upstream.write_all(&rest).await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        return Ok(());
    }
    // Absolute form: `GET http://host:port/path HTTP/1.1`, sent on in origin form.
    let Some(after_scheme) = target.strip_prefix("http://") else {
        client
            .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            .await?;
        bail!("not a proxy request: {first}");
    };
    let (authority, path) = match after_scheme.find('/') {
        Some(i) => (&after_scheme[..i], &after_scheme[i..]),
        None => (after_scheme, "/"),
    };
    let authority = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let mut upstream = connect(&authority, counts).await?;
    let head = text.replacen(&first, &format!("{method} {path} {version}"), 1);
    upstream.write_all(head.as_bytes()).await?;
    upstream.write_all(&rest).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Connects to `target` (`host:port`), counting it; test hosts go to 127.0.0.1.
async fn connect(target: &str, counts: &Mutex<BTreeMap<String, u64>>) -> Result<TcpStream> {
    let (host, port) = target
        .rsplit_once(':')
        .context("the target names no port")?;
    let port: u16 = port.parse().context("the target's port")?;
    *counts
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(target.to_ascii_lowercase())
        .or_default() += 1;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let test_domain = format!(".{TEST_DOMAIN}");
    let stream = if host.to_ascii_lowercase().ends_with(&test_domain) {
        TcpStream::connect(("127.0.0.1", port)).await
    } else {
        TcpStream::connect((host, port)).await
    };
    stream.with_context(|| format!("connecting to {target}"))
}

/// The request head (through the blank line) and whatever was read past it.
async fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0_u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            bail!("request head too long");
        }
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            bail!("connection closed before the request head ended");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    use crate::fakes::tcpcut::tests::echo_server;

    #[tokio::test]
    async fn connect_tunnels_to_test_hosts_and_counts_them() {
        let port = echo_server().await.port();
        let proxy = ForwardProxy::start().await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let target = format!("{}:{port}", test_host("echo"));
        stream
            .write_all(
                format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\nhello").as_bytes(),
            )
            .await
            .unwrap();
        let mut answer = vec![0_u8; "HTTP/1.1 200 Connection established\r\n\r\nhello".len()];
        stream.read_exact(&mut answer).await.unwrap();
        assert!(
            answer.ends_with(b"\r\n\r\nhello"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert_eq!(proxy.count(&target), 1);
    }

    #[tokio::test]
    async fn absolute_form_requests_are_sent_on_in_origin_form() {
        let port = echo_server().await.port();
        let proxy = ForwardProxy::start().await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let target = format!("{}:{port}", test_host("plain"));
        stream
            .write_all(
                format!("GET http://{target}/x?y HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let expected = format!("GET /x?y HTTP/1.1\r\nHost: {target}\r\n\r\n");
        let mut echoed = vec![0_u8; expected.len()];
        stream.read_exact(&mut echoed).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&echoed), expected);
        assert_eq!(proxy.counts().len(), 1);
    }
}
