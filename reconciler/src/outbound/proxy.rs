//! The proxy of each destination, by [`cloudnet_shared::proxy::ProxyRules`] read once from the
//! environment, applied to every client: kube-rs (whose kubeconfig loader parses `NO_PROXY` by
//! rules of its own, so [`super::kubeconfig`] builds its configuration, and whose in-cluster
//! configuration ignores the environment),
//! the AWS SDK (which reads no environment unless told), reqwest (GCP's PATCH, Azure) through a
//! custom proxy, and the OpenStack client through [`ProxyConnector`].
//!
//! [`ProxyConnector`] is written here because hyper-util's `Tunnel` sends every destination
//! through one proxy: the choice per destination (Neutron's URL comes from Keystone's catalog at
//! run time) is the part no crate offers for a plain hyper client.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use cloudnet_shared::proxy::ProxyRules;
use hyper::Uri;
use hyper::rt::{Read, Write};
use thiserror::Error;
use tower::{Service, ServiceExt as _};

/// A proxy variable this process cannot use.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("proxy {url:?} (from HTTP_PROXY/HTTPS_PROXY): {reason}")]
pub struct ProxyError {
    /// The value.
    pub(crate) url: String,
    /// What is wrong with it.
    pub(crate) reason: String,
}

/// The rules of this process's environment, read on first use.
pub(crate) fn rules() -> &'static ProxyRules {
    static RULES: OnceLock<ProxyRules> = OnceLock::new();
    RULES.get_or_init(|| ProxyRules::from_vars(|name| std::env::var(name).ok()))
}

/// Refuses proxy URLs that no client here can use, so a typo stops the start with its cause
/// instead of failing every call: `http://host:port`, optionally with `user:password@`.
pub(crate) fn check(rules: &ProxyRules) -> Result<(), ProxyError> {
    for url in rules.proxies() {
        let bad = |reason: &str| ProxyError {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// proxies are supported (CONNECT over plain HTTP)",
            ));
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(bad("no host"));
        }
    }
    Ok(())
}

/// The proxy for a request to `url`, or `None` to connect directly.
pub(crate) fn for_uri(rules: &ProxyRules, url: &Uri) -> Option<Uri> {
    let proxy = rules.proxy_for(url.scheme_str()?, url.host()?, url.port_u16())?;
    proxy.parse().ok()
}

/// The proxy for a request to `url` (a URL string, as reqwest's custom proxies see it).
// Its callers are the EC2, GCE and Azure clients: a build with none of them has no use for it.
#[cfg_attr(
    not(any(feature = "aws", feature = "gcp", feature = "azure")),
    allow(dead_code)
)]
pub(crate) fn for_url(rules: &ProxyRules, url: &str) -> Option<String> {
    let uri: Uri = url.parse().ok()?;
    for_uri(rules, &uri).map(|proxy| proxy.to_string())
}

/// Sets kube-rs's proxy for the apiserver by these rules.
pub(crate) fn apply_to_kube(rules: &ProxyRules, config: &mut kube::Config) {
    config.proxy_url = for_uri(rules, &config.cluster_url);
    if let Some(proxy) = &config.proxy_url {
        tracing::info!(apiserver = %config.cluster_url, %proxy, "reaching kube-apiserver through a proxy");
    }
}

/// A connector that reaches each destination directly or through an HTTP CONNECT tunnel, as the
/// rules say for it. TLS, when the destination's scheme asks for it, goes on top (hyper-rustls
/// wraps this), so a tunnel carries the destination's own TLS end to end.
#[derive(Clone, Debug)]
pub(crate) struct ProxyConnector<C> {
    inner: C,
    rules: &'static ProxyRules,
}

impl<C> ProxyConnector<C> {
    /// `inner` (which must accept any scheme: `HttpConnector::enforce_http(false)`) behind the
    /// process's rules.
    pub(crate) fn new(inner: C) -> Self {
        Self {
            inner,
            rules: rules(),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<C> Service<Uri> for ProxyConnector<C>
where
    C: Service<Uri> + Clone + Send + 'static,
    C::Future: Send + 'static,
    C::Response: Read + Write + Unpin + Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        // The clone that was polled ready serves this call; a fresh one waits for the next.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        match for_uri(self.rules, &destination) {
            Some(proxy) => Box::pin(async move {
                // hyper-util's tunnel assumes port 443 when the URL names none.
                let destination = with_port(destination)?;
                cloudnet_kubeclient::tunnel(proxy, inner)
                    .oneshot(destination)
                    .await
                    .map_err(Into::into)
            }),
            None => Box::pin(async move { inner.oneshot(destination).await.map_err(Into::into) }),
        }
    }
}

/// `url` with its scheme's default port written out.
fn with_port(url: Uri) -> Result<Uri, BoxError> {
    if url.port_u16().is_some() {
        return Ok(url);
    }
    let port = if url.scheme_str() == Some("http") {
        80
    } else {
        443
    };
    let host = url.host().ok_or("the URL has no host")?;
    let authority = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut parts = url.into_parts();
    parts.authority = Some(authority.parse()?);
    Ok(Uri::from_parts(parts)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn rules(vars: &[(&str, &str)]) -> ProxyRules {
        ProxyRules::from_pairs(vars)
    }

    #[test]
    fn unusable_proxies_are_refused_with_their_cause() {
        assert!(check(&rules(&[])).is_ok());
        assert!(check(&rules(&[("HTTPS_PROXY", "http://user:pw@proxy:3128")])).is_ok());
        let socks = check(&rules(&[("HTTPS_PROXY", "socks5://proxy:1080")])).unwrap_err();
        assert!(socks.reason.contains("only http://"), "{socks}");
        assert!(check(&rules(&[("HTTP_PROXY", "http://bad host:1")])).is_err());
    }

    #[test]
    fn the_apiserver_and_tunnel_destinations_follow_the_rules() {
        let r = rules(&[
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("NO_PROXY", "api-int.example:6443"),
        ]);
        let mut config = kube::Config::new("https://api-int.example:6443".parse().unwrap());
        config.proxy_url = Some("http://stale:1".parse().unwrap());
        apply_to_kube(&r, &mut config);
        assert_eq!(config.proxy_url, None);
        let mut config = kube::Config::new("https://api.example:6443".parse().unwrap());
        apply_to_kube(&r, &mut config);
        assert_eq!(config.proxy_url.unwrap().to_string(), "http://proxy:3128/");
        assert_eq!(
            for_url(&r, "https://neutron.example:9696/v2.0/ports").as_deref(),
            Some("http://proxy:3128/")
        );
        assert_eq!(
            with_port("http://keystone.example/v3".parse().unwrap()).unwrap(),
            "http://keystone.example:80/v3"
        );
        assert_eq!(
            with_port("https://[fd00::1]/x".parse().unwrap()).unwrap(),
            "https://[fd00::1]:443/x"
        );
    }
}
