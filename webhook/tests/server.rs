//! The TLS server over real loopback sockets: protocol versions, the graceful drain that lets
//! a request already in flight finish after shutdown begins, and the end of connections that sit
//! idle or have lived their maximum age (HTTP/2 answered with GOAWAY).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_certs::{CertificateAuthority, LeafRequest, Usage};
use cloudnet_shared::ClusterSnapshot;
use cloudnet_webhook::budget::Budget;
use cloudnet_webhook::cache::ClusterCache;
use cloudnet_webhook::metrics::Metrics;
use cloudnet_webhook::router::{AppState, router};
use cloudnet_webhook::server::{ConnectionLimits, serve_with};
use cloudnet_webhook::slots::Capacity;
use cloudnet_webhook::tls::{CertPaths, CertStore, server_config};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Server {
    addr: SocketAddr,
    ca: CertificateAuthority,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn start() -> Server {
    start_with(ConnectionLimits::default()).await
}

async fn start_with(limits: ConnectionLimits) -> Server {
    let ca = CertificateAuthority::generate("server-test-ca", time::Duration::days(1)).unwrap();
    let leaf = ca
        .issue(&LeafRequest {
            common_name: "webhook",
            organizations: &[],
            alt_names: &["127.0.0.1"],
            usage: Usage::Server,
            validity: time::Duration::days(1),
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = CertPaths {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    std::fs::write(&paths.cert, &leaf.cert_pem).unwrap();
    std::fs::write(&paths.key, &leaf.key_pem).unwrap();
    let store = Arc::new(CertStore::load(paths).unwrap());
    let tls = Arc::new(server_config(store).unwrap());
    let app = router(AppState {
        cache: Arc::new(ClusterCache::synced(ClusterSnapshot::new())),
        metrics: Arc::new(Metrics::new()),
        platform: None,
        budget: Budget::default(),
        capacity: Capacity::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(serve_with(
        listener,
        tls,
        app,
        async {
            let _ = stopped.await;
        },
        limits,
    ));
    Server {
        addr,
        ca,
        stop: Some(stop),
        done,
        _dir: dir,
    }
}

fn client_config(
    ca: &CertificateAuthority,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

async fn connect(
    server: &Server,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(server.addr).await?;
    tokio_rustls::TlsConnector::from(client_config(&server.ca, versions))
        .connect(ServerName::IpAddress(server.addr.ip().into()), tcp)
        .await
}

#[tokio::test]
async fn serves_tls_1_2_and_1_3() {
    let server = start().await;
    let v13 = connect(&server, &[&rustls::version::TLS13]).await.unwrap();
    assert_eq!(
        v13.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    let v12 = connect(&server, &[&rustls::version::TLS12]).await.unwrap();
    assert_eq!(
        v12.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_request_finish_then_stops() {
    let mut server = start().await;
    let mut stream = connect(&server, &[&rustls::version::TLS13]).await.unwrap();
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "cloud.network.openshift.io", "version": "v1", "kind": "CloudPrivateIPConfig"},
        "resource": {"group": "cloud.network.openshift.io", "version": "v1", "resource": "cloudprivateipconfigs"},
        "name": "10.0.0.9", "operation": "DELETE", "userInfo": {}, "dryRun": false}})
    .to_string();
    // `Expect: 100-continue` makes the server say when it starts reading the body: from then on
    // the request is in flight, and that is the moment to begin the shutdown.
    let head = format!(
        "POST /validate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let interim = read_until(&mut stream, b"\r\n\r\n").await;
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");

    server.stop.take().unwrap().send(()).unwrap();
    // Once shutdown has begun, new connections are refused...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while connect(&server, &[&rustls::version::TLS13]).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still accepting after shutdown"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...while the request in flight completes.
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await
    .expect("the response arrives")
    .unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains(r#""allowed":true"#), "{response}");
    tokio::time::timeout(Duration::from_secs(10), server.done)
        .await
        .expect("serve returns once drained")
        .unwrap();
}

async fn read_until(stream: &mut (impl AsyncReadExt + Unpin), end: &[u8]) -> String {
    let mut buffer = Vec::new();
    let mut byte = [0u8; 1];
    while !buffer.ends_with(end) {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte))
            .await
            .expect("the server answers")
            .unwrap();
        assert_eq!(
            n,
            1,
            "connection closed after {:?}",
            String::from_utf8_lossy(&buffer)
        );
        buffer.push(byte[0]);
    }
    String::from_utf8_lossy(&buffer).into_owned()
}

#[tokio::test]
async fn a_client_that_completes_tls_and_sends_nothing_is_disconnected() {
    let server = start().await;
    let mut idle = connect(&server, &[&rustls::version::TLS13]).await.unwrap();
    let mut buf = [0u8; 16];
    // The server must close the connection (EOF or an error) after its detection timeout.
    let closed = tokio::time::timeout(
        cloudnet_webhook::server::HEADER_READ_TIMEOUT + Duration::from_secs(5),
        idle.read(&mut buf),
    )
    .await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "connection still open: {closed:?}"
    );
}

/// An HTTP/2 client connection to `server`: the request sender and the connection's task, which
/// ends when the server closes the connection.
async fn h2_connect(
    server: &Server,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<axum::body::Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let mut config = (*client_config(&server.ca, &[&rustls::version::TLS13])).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::IpAddress(server.addr.ip().into()), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    (sender, tokio::spawn(connection))
}

async fn healthz(
    sender: &mut hyper::client::conn::http2::SendRequest<http_body_util::Empty<axum::body::Bytes>>,
    server: &Server,
) -> hyper::Result<hyper::StatusCode> {
    sender.ready().await?;
    let request = hyper::Request::get(format!("https://{}/healthz", server.addr))
        .body(http_body_util::Empty::new())
        .unwrap();
    Ok(sender.send_request(request).await?.status())
}

/// How long a test waits for the server to close a connection it should close.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn an_idle_http2_connection_is_closed() {
    let server = start_with(ConnectionLimits {
        idle_timeout: Duration::from_millis(300),
        max_age: Duration::from_secs(3600),
        ..ConnectionLimits::default()
    })
    .await;
    let (mut sender, connection) = h2_connect(&server).await;
    // In use for several idle timeouts: never closed meanwhile.
    let busy_until = std::time::Instant::now() + Duration::from_millis(1200);
    while std::time::Instant::now() < busy_until {
        assert_eq!(healthz(&mut sender, &server).await.unwrap(), 200);
    }
    assert!(!connection.is_finished());
    // HTTP/2 keep-alive pings do not count as use: the server ends the connection.
    let ended = tokio::time::timeout(CLOSE_WAIT, connection).await;
    assert!(
        ended.is_ok(),
        "idle connection still open after {CLOSE_WAIT:?}"
    );
}

#[tokio::test]
async fn a_busy_http2_connection_is_closed_at_its_maximum_age() {
    let server = start_with(ConnectionLimits {
        idle_timeout: Duration::from_secs(3600),
        max_age: Duration::from_millis(500),
        ..ConnectionLimits::default()
    })
    .await;
    let (mut sender, mut connection) = h2_connect(&server).await;
    let mut answered = 0;
    // Requests back to back, so the connection is never idle; every one sent before the
    // GOAWAY is answered, and the connection then ends.
    let ended = tokio::time::timeout(CLOSE_WAIT, async {
        loop {
            tokio::select! {
                ended = &mut connection => break ended,
                status = healthz(&mut sender, &server) => match status {
                    Ok(status) => {
                        assert_eq!(status, 200);
                        answered += 1;
                    }
                    // Refused after the GOAWAY: the connection is closing.
                    Err(_) => break (&mut connection).await,
                },
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "busy connection still open after {CLOSE_WAIT:?}"
    );
    assert!(answered > 0);
}

/// A TLS connection to `server` from the loopback address `from`.
async fn connect_from(
    server: &Server,
    from: std::net::IpAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(server.addr).await?;
    tokio_rustls::TlsConnector::from(client_config(&server.ca, &[&rustls::version::TLS13]))
        .connect(ServerName::IpAddress(server.addr.ip().into()), tcp)
        .await
}

#[tokio::test]
async fn an_address_past_its_share_of_connections_is_closed_and_others_are_served() {
    use cloudnet_webhook::peer::PeerLimits;
    let server = start_with(ConnectionLimits {
        peers: PeerLimits {
            connections: 2,
            requests: 1,
        },
        ..ConnectionLimits::default()
    })
    .await;
    let tenant = std::net::IpAddr::from([127, 0, 0, 2]);
    let _first = connect_from(&server, tenant).await.unwrap();
    let _second = connect_from(&server, tenant).await.unwrap();
    let third = tokio::time::timeout(CLOSE_WAIT, connect_from(&server, tenant))
        .await
        .expect("the third connection is closed at once");
    assert!(
        third.is_err(),
        "a third connection from one address was served"
    );
    let mut other = connect_from(&server, std::net::IpAddr::from([127, 0, 0, 3]))
        .await
        .unwrap();
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let head = read_until(&mut other, b"\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}
