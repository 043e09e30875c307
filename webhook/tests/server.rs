//! The TLS server over real loopback sockets: protocol versions, and the graceful drain that lets
//! a request already in flight finish after shutdown begins.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_certs::{CertificateAuthority, LeafRequest, Usage};
use cloudnet_shared::ClusterSnapshot;
use cloudnet_webhook::cache::ClusterCache;
use cloudnet_webhook::metrics::Metrics;
use cloudnet_webhook::router::{AppState, router};
use cloudnet_webhook::server::serve;
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
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(serve(listener, tls, app, async {
        let _ = stopped.await;
    }));
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
