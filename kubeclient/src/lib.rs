//! The Kubernetes client of the reconciler and the webhook.
//!
//! Built here rather than by kube-rs's `ClientBuilder::try_from(Config)`, whose client speaks
//! HTTP/1.1 with no request timeout and no liveness check: a connection to a remote API server
//! (a hosted control plane behind a load balancer, konnectivity, a rolling apiserver) that stops
//! answering would hold each request on it forever. This one keeps kube-rs's layers (base URI,
//! retry of 429/503/504, authentication, extra headers, tracing) and changes three things:
//!
//! - HTTP/2 (ALPN, HTTP/1.1 still offered) with keep-alive pings, idle or not: a connection whose
//!   ping is not answered within [`Liveness::ping_timeout`] is closed, its requests and watches
//!   fail, and they are retried on a new connection. Pings, not TCP keep-alive: a proxy or a
//!   forwarder in the path answers TCP probes for a peer that is gone.
//! - Every request but a watch has a deadline ([`Liveness::request_timeout`]) for its whole
//!   exchange, body included; a watch is a long poll and is cut only by the pings. Connecting
//!   (TCP, proxy tunnel and TLS) has its own bound, [`Liveness::connect_timeout`].
//! - A kubeconfig's `tokenFile` is read again whenever the file changes ([`token`]), not once a
//!   minute: a rotation that revokes the old token at once costs no failed request.
//!
//! The waits for the files a kubeconfig names ([`files`]) and the watches' backoff
//! ([`watch_backoff`]) live here too, so both servers follow the same rules.

pub mod files;
mod timeout;
mod token;

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{ClientBuilder, ConfigExt as _};
use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher::ExponentialBackoff;
use thiserror::Error;
use tower::util::{BoxCloneSyncService, BoxService};
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

pub use timeout::{ResponseBody, TimedOut};

/// How the client notices an API server that stopped answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// Longest a request other than a watch may take, its response body included.
    pub request_timeout: Duration,
    /// Quiet time on a connection after which it is pinged.
    pub ping_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    pub ping_timeout: Duration,
    /// Longest a new connection may take to be ready (TCP, proxy tunnel, TLS).
    pub connect_timeout: Duration,
}

/// The request timeout of the upstream controller (and the flags' default).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for Liveness {
    /// A dead connection is closed within 10 s of its last answer; a new one gets 5 s to connect,
    /// which a healthy apiserver, even a remote one, needs a fraction of.
    fn default() -> Self {
        Self {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            ping_interval: Duration::from_secs(5),
            ping_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl Liveness {
    /// The defaults with `request_timeout`.
    pub fn with_request_timeout(request_timeout: Duration) -> Self {
        Self {
            request_timeout,
            ..Self::default()
        }
    }
}

/// The client could not be built from the configuration.
#[derive(Debug, Error)]
pub enum BuildError {
    /// kube-rs refused part of the configuration (TLS, authentication, headers).
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The proxy's scheme is not one a tunnel can use.
    #[error("proxy {0}: only http:// proxies are supported (CONNECT over plain HTTP)")]
    ProxyScheme(String),
}

/// The service stack under a [`kube::Client`] of [`builder`].
pub type Stack =
    BoxService<http::Request<kube::client::Body>, http::Response<ResponseBody>, BoxError>;

/// A client for `config` (its `proxy_url` included) checked as `liveness` says.
pub fn client(config: kube::Config, liveness: &Liveness) -> Result<kube::Client, BuildError> {
    Ok(builder(config, liveness)?.build())
}

/// As [`client`], for a caller that adds layers of its own (a concurrency limit).
pub fn builder(
    mut config: kube::Config,
    liveness: &Liveness,
) -> Result<ClientBuilder<Stack>, BuildError> {
    // kube-rs would read the token file once a minute; ours reads it when it changes. An inline
    // token wins over the file, as in kube-rs and client-go.
    let token_file = match config.auth_info.token {
        Some(_) => None,
        None => config.auth_info.token_file.take(),
    };
    let tcp = tcp_connector(config.proxy_url.take())?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name.clone().try_into().map_err(|e| {
            kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_all_versions().wrap_connector(tcp);
    let connector = ConnectTimeout {
        inner: https,
        timeout: liveness.connect_timeout,
    };
    let hyper = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(liveness.ping_interval)
        .http2_keep_alive_timeout(liveness.ping_timeout)
        .http2_keep_alive_while_idle(true)
        .build::<_, kube::client::Body>(connector);

    let default_namespace = config.default_namespace.clone();
    let service = ServiceBuilder::new()
        .layer(timeout::RequestTimeoutLayer::new(liveness.request_timeout))
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .option_layer(token_file.map(token::TokenFileLayer::new))
        .layer(config.extra_headers_layer()?)
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .map_err(BoxError::from)
        .service(hyper);
    Ok(ClientBuilder::new(
        BoxService::new(service),
        default_namespace,
    ))
}

/// A connector whose connections (TCP, tunnel, TLS) fail after `timeout`. tower's `Timeout` is
/// not `Unpin`, which hyper-util's client asks of a connector's future.
#[derive(Clone, Debug)]
struct ConnectTimeout<C> {
    inner: C,
    timeout: Duration,
}

impl<C> tower::Service<http::Uri> for ConnectTimeout<C>
where
    C: tower::Service<http::Uri> + Send,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, destination: http::Uri) -> Self::Future {
        let timeout = self.timeout;
        let connecting = self.inner.call(destination);
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(format!("connecting to kube-apiserver took over {timeout:?}").into()),
            }
        })
    }
}

/// The TCP connection to the API server: direct, or through an HTTP CONNECT tunnel.
type TcpConnector = BoxCloneSyncService<http::Uri, TokioIo<tokio::net::TcpStream>, BoxError>;

fn tcp_connector(proxy: Option<http::Uri>) -> Result<TcpConnector, BuildError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    Ok(match proxy {
        None => BoxCloneSyncService::new(http.map_err(BoxError::from)),
        Some(proxy) if proxy.scheme_str() == Some("http") => {
            BoxCloneSyncService::new(tunnel(proxy, http).map_err(BoxError::from))
        }
        Some(proxy) => return Err(BuildError::ProxyScheme(proxy.to_string())),
    })
}

/// An HTTP CONNECT tunnel through `proxy` over `inner`, with the proxy's `user:password@` (if
/// any) sent as `Proxy-Authorization` (hyper-util's matcher percent-decodes and encodes them).
pub fn tunnel<C>(proxy: http::Uri, inner: C) -> Tunnel<C> {
    let (proxy, auth) = proxy_credentials(proxy);
    let tunnel = Tunnel::new(proxy, inner);
    match auth {
        Some(auth) => tunnel.with_auth(auth),
        None => tunnel,
    }
}

/// The proxy without its `user:password@`, and those as a `Proxy-Authorization` value.
pub fn proxy_credentials(proxy: http::Uri) -> (http::Uri, Option<http::HeaderValue>) {
    if proxy.authority().is_none_or(|a| !a.as_str().contains('@')) {
        return (proxy, None);
    }
    // The matcher needs a destination to intercept; every destination gets the same proxy.
    let any = http::Uri::from_static("https://destination.invalid");
    match Matcher::builder()
        .all(proxy.to_string())
        .build()
        .intercept(&any)
    {
        Some(intercept) => (intercept.uri().clone(), intercept.basic_auth().cloned()),
        None => (proxy, None),
    }
}

/// Backoff between a watch's failed attempts: client-go's start (0.8 s, doubling) but at most
/// 2 s (4 s with jitter, which adds up to the delay again) apart instead of 30, so a watch is
/// back within seconds of an API server's return after a long outage (an attempt that started
/// while it was unreachable first waits out [`Liveness::connect_timeout`]); reset after two quiet
/// minutes as kube-rs's default is.
pub fn watch_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(800))
        .with_max_delay(WATCH_BACKOFF_CAP)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(ExponentialBackoff::from(builder), Duration::from_secs(120))
}

/// The longest wait between two attempts of a watch, before jitter.
pub const WATCH_BACKOFF_CAP: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn proxy_credentials_are_taken_out_of_the_url() {
        let (proxy, auth) =
            proxy_credentials("http://cloud%40net:p%3Ass@proxy:3128".parse().unwrap());
        assert_eq!(proxy.authority().unwrap().as_str(), "proxy:3128");
        // base64("cloud@net:p:ss")
        assert_eq!(auth.unwrap(), "Basic Y2xvdWRAbmV0OnA6c3M=");
        let (proxy, auth) = proxy_credentials("http://proxy:3128".parse().unwrap());
        assert_eq!(
            (proxy.to_string(), auth),
            ("http://proxy:3128/".to_owned(), None)
        );
    }

    #[test]
    fn watches_back_off_at_most_a_few_seconds_apart() {
        let delays: Vec<Duration> = watch_backoff().take(12).collect();
        assert!(delays[0] < Duration::from_secs(2), "{delays:?}");
        // Jitter adds up to the delay again.
        assert!(
            delays.iter().all(|d| *d <= 2 * WATCH_BACKOFF_CAP),
            "{delays:?}"
        );
    }

    #[tokio::test]
    async fn a_socks_proxy_is_refused_with_its_cause() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("socks5://proxy:1080".parse().unwrap());
        let err = builder(config, &Liveness::default()).err().unwrap();
        assert!(err.to_string().contains("only http://"), "{err}");
    }
}
