//! A fault proxy in front of kube-apiserver: a client (a reconciler) reaches the API through it
//! and the test scripts faults by method and path prefix: the answer to a request dropped after
//! the API server has carried it out ([`ApiFault::DropAnswer`]: the write lands, the client sees
//! its connection closed), a 409 Conflict in the API server's place without forwarding
//! ([`ApiFault::Conflict`]), a 500 in its place ([`ApiFault::ServerError`]), or the request held until the test lets it go ([`ApiFault::Hold`]).
//! Everything else, watches included, streams through unchanged.
//!
//! Why not the cloud [`super::faultproxy`]: it speaks plain HTTP to its upstream and buffers
//! answers; kube-apiserver takes only TLS with client certificates, and a watch's answer never
//! ends. Why not [`super::tcpcut`]: it sees bytes, not requests.
//!
//! TLS: the proxy serves kube-apiserver's own serving certificate (issued for 127.0.0.1 by the
//! control plane's CA), so a copy of the admin kubeconfig with only the server address changed
//! ([`crate::ControlPlane::kubeconfig_via`]) trusts it as it is. Toward kube-apiserver it presents
//! the admin client certificate, the same identity the client's kubeconfig names: the API server
//! then sees each request as the client would have sent it (same user and groups, same audit
//! trail), with no impersonation grant or headers to add. So it fronts admin-identity clients
//! only; a request carrying its own credentials (an `Authorization` header) would be carried out
//! as the admin, and is refused instead.
//!
//! Each request goes upstream on a connection of its own (HTTP/1.1): a dropped answer then closes
//! only that exchange, and a held request is independent of every other.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// What the proxy does to a request a rule selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiFault {
    /// Forward it, wait for the API server's whole answer (the write has landed), then close the
    /// client's connection without answering: a lost answer.
    DropAnswer,
    /// Answer 409 Conflict (reason `Conflict`) without forwarding.
    Conflict,
    /// Answer 500 Internal Server Error without forwarding: an API server failing for a moment.
    ServerError,
    /// Keep it at the proxy until [`ApiFaults::release_held`], then forward it, whether or not
    /// its client still waits (a request delayed in the network lands after its sender gave up).
    Hold,
}

/// One fault the proxy applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The request's method.
    pub method: Method,
    /// The request's path (no query).
    pub path: String,
    /// What was done to it.
    pub fault: ApiFault,
    /// The API server's answer to it, when it was forwarded and answered (a dropped answer, a
    /// held request once released).
    pub upstream: Option<StatusCode>,
}

/// The certificates the proxy needs: kube-apiserver's CA (to check it), the serving certificate
/// it shows its clients, and the client identity it shows kube-apiserver. All PEM.
#[derive(Clone, Debug)]
pub struct ApiTls {
    /// The CA that signed kube-apiserver's serving certificate.
    pub ca_pem: String,
    /// The certificate the proxy serves (kube-apiserver's own, valid for 127.0.0.1).
    pub serving_cert_pem: String,
    /// Key of `serving_cert_pem`.
    pub serving_key_pem: String,
    /// The client certificate presented to kube-apiserver (the admin's).
    pub client_cert_pem: String,
    /// Key of `client_cert_pem`.
    pub client_key_pem: String,
}

/// A running proxy on 127.0.0.1. Dropping it closes the port, every connection through it, and
/// drops the held requests unsent.
pub struct ApiFaults {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Debug)]
struct Rule {
    method: Method,
    path_prefix: String,
    fault: ApiFault,
    left: usize,
}

struct Shared {
    upstream: SocketAddr,
    connector: TlsConnector,
    rules: Mutex<Vec<Rule>>,
    applied: Mutex<Vec<Applied>>,
    /// Every request passed through unchanged, as (method, path).
    forwarded: Mutex<Vec<(Method, String)>>,
    held: Mutex<Vec<oneshot::Sender<()>>>,
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

impl ApiFaults {
    /// Binds a free port on 127.0.0.1 and forwards to kube-apiserver at `upstream`, on the
    /// calling tokio runtime.
    pub async fn start(upstream: SocketAddr, tls: &ApiTls) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut serving = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs(&tls.serving_cert_pem)?, key(&tls.serving_key_pem)?)
            .context("the proxy's serving certificate")?;
        // The upstream leg is HTTP/1.1; the client's leg speaks what it does.
        serving.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs(&tls.ca_pem)? {
            roots.add(cert).context("kube-apiserver's CA")?;
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs(&tls.client_cert_pem)?, key(&tls.client_key_pem)?)
            .context("the proxy's client certificate")?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the API fault proxy's port")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            connector: TlsConnector::from(Arc::new(client)),
            rules: Mutex::default(),
            applied: Mutex::default(),
            forwarded: Mutex::default(),
            held: Mutex::default(),
        });
        let acceptor = TlsAcceptor::from(Arc::new(serving));
        let accept = tokio::spawn(crate::fakes::serve::accept_loop(
            listener,
            Some(acceptor),
            {
                let shared = Arc::clone(&shared);
                move |request| receive(Arc::clone(&shared), request)
            },
        ));
        Ok(Self {
            addr,
            shared,
            accept,
        })
    }

    /// The address clients connect to (`https://` it).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Applies `fault` to the next `times` requests with `method` whose path starts with
    /// `path_prefix`. Rules apply in the order they were added; one used up no longer applies.
    pub fn inject(&self, method: Method, path_prefix: &str, fault: ApiFault, times: usize) {
        lock(&self.shared.rules).push(Rule {
            method,
            path_prefix: path_prefix.to_owned(),
            fault,
            left: times,
        });
    }

    /// Removes every rule not yet used up (held requests stay held).
    pub fn clear(&self) {
        lock(&self.shared.rules).clear();
    }

    /// Every fault applied so far, in order.
    pub fn applied(&self) -> Vec<Applied> {
        lock(&self.shared.applied).clone()
    }

    /// How many requests with `method` and a path starting with `path_prefix` passed through
    /// unchanged.
    pub fn forwarded(&self, method: &Method, path_prefix: &str) -> usize {
        lock(&self.shared.forwarded)
            .iter()
            .filter(|(m, p)| m == method && p.starts_with(path_prefix))
            .count()
    }

    /// How many requests are held now.
    pub fn held_now(&self) -> usize {
        lock(&self.shared.held).len()
    }

    /// Lets every held request go on to kube-apiserver; returns how many there were.
    pub fn release_held(&self) -> usize {
        let held = std::mem::take(&mut *lock(&self.shared.held));
        let count = held.len();
        for go in held {
            let _ = go.send(());
        }
        count
    }
}

impl std::fmt::Debug for ApiFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiFaults")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .finish_non_exhaustive()
    }
}

impl Drop for ApiFaults {
    fn drop(&mut self) {
        self.accept.abort();
        lock(&self.shared.held).clear();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Rules and records stay meaningful even if a holder panicked.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn certs(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("parsing a PEM certificate")
}

fn key(pem: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).context("parsing a PEM key")
}

impl Shared {
    /// The fault the first live rule matching the request applies, using one of its turns.
    fn take_fault(&self, method: &Method, path: &str) -> Option<ApiFault> {
        let mut rules = lock(&self.rules);
        let rule = rules
            .iter_mut()
            .find(|r| r.left > 0 && r.method == method && path.starts_with(&r.path_prefix))?;
        rule.left -= 1;
        Some(rule.fault)
    }

    fn record(&self, method: &Method, path: &str, fault: ApiFault, upstream: Option<StatusCode>) {
        lock(&self.applied).push(Applied {
            method: method.clone(),
            path: path.to_owned(),
            fault,
            upstream,
        });
    }
}

/// Returning an error makes hyper close the connection without an answer: a dropped answer.
async fn receive(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, std::io::Error> {
    if request.headers().contains_key(header::AUTHORIZATION) {
        return Ok(status_answer(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "the API fault proxy forwards as the admin identity only; this request carries credentials of its own",
        ));
    }
    let (parts, body) = request.into_parts();
    let (method, path) = (parts.method.clone(), parts.uri.path().to_owned());
    match shared.take_fault(&method, &path) {
        None => {
            lock(&shared.forwarded).push((method, path));
            let request = Request::from_parts(parts, body.boxed());
            let answer = send(&shared, request).await?;
            Ok(answer.map(BodyExt::boxed))
        }
        Some(fault @ ApiFault::Conflict) => {
            shared.record(&method, &path, fault, None);
            Ok(status_answer(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on {path}: the object has been modified; \
                     please apply your changes to the latest version and try again"
                ),
            ))
        }
        Some(fault @ ApiFault::ServerError) => {
            shared.record(&method, &path, fault, None);
            Ok(status_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error occurred: injected by the test's fault proxy",
            ))
        }
        Some(fault @ ApiFault::DropAnswer) => {
            let request = Request::from_parts(parts, body.boxed());
            let answer = send(&shared, request).await;
            let status = match answer {
                Ok(answer) => {
                    let status = answer.status();
                    // Read to the end: the API server has answered in full, then it is lost.
                    let _ = answer.into_body().collect().await;
                    Some(status)
                }
                Err(_) => None,
            };
            shared.record(&method, &path, fault, status);
            Err(std::io::Error::other("fault injected: answer dropped"))
        }
        Some(fault @ ApiFault::Hold) => {
            // Read whole now: the client may be gone by the time the request is let go.
            let body = body
                .collect()
                .await
                .map_err(std::io::Error::other)?
                .to_bytes();
            let (go, wait) = oneshot::channel();
            lock(&shared.held).push(go);
            let late = tokio::spawn(async move {
                // A proxy dropped meanwhile drops the sender too: the request is then lost.
                wait.await.ok()?;
                let answer = send(&shared, Request::from_parts(parts, full(body))).await;
                let answer = match answer {
                    Ok(answer) => {
                        let status = answer.status();
                        let body = answer.into_body().collect().await.ok()?.to_bytes();
                        shared.record(&method, &path, fault, Some(status));
                        Response::builder()
                            .status(status)
                            .header(header::CONTENT_TYPE, "application/json")
                            .body(full(body))
                            .ok()?
                    }
                    Err(_) => {
                        shared.record(&method, &path, fault, None);
                        return None;
                    }
                };
                Some(answer)
            });
            match late.await {
                Ok(Some(answer)) => Ok(answer),
                _ => Err(std::io::Error::other(
                    "held request dropped or not answered",
                )),
            }
        }
    }
}

/// Sends `request` to kube-apiserver on a connection of its own and returns the head of its
/// answer; the body streams (a watch for as long as it lasts).
async fn send(
    shared: &Shared,
    request: Request<ProxyBody>,
) -> Result<Response<Incoming>, std::io::Error> {
    let tcp = TcpStream::connect(shared.upstream).await?;
    tcp.set_nodelay(true)?;
    let server = ServerName::IpAddress(shared.upstream.ip().into());
    let tls = shared.connector.connect(server, tcp).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(std::io::Error::other)
}

/// A `Status` answer as kube-apiserver writes it.
fn status_answer(code: StatusCode, reason: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {},
        "code": code.as_u16(),
    });
    let mut answer = Response::new(full(Bytes::from(body.to_string())));
    *answer.status_mut() = code;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    answer
}

/// `bytes` as a body of the proxy's answers and forwarded requests.
fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes)
        .map_err(|never| -> hyper::Error { match never {} })
        .boxed()
}
