//! HTTPS to Keystone and Neutron: one rustls client (trusting the system roots, the cluster's
//! trusted bundle and `cacert`; each destination through the proxy the environment names for it),
//! Keystone v3 tokens (password or application credential) re-issued before they expire or when
//! Neutron answers 401, and the Neutron endpoint from the token's catalog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::{Value, json};
use thiserror::Error;

use super::config::{Auth, CloudConfig, NameOrId, Secret};
use super::errors::{ApiError, transport};
use crate::cloud::CloudError;
use crate::outbound::proxy::ProxyConnector;
use crate::outbound::trust;

/// Why the HTTPS client could not be built.
#[derive(Debug, Error)]
pub enum ClientError {
    /// A CA bundle (`cacert`, or the cluster's) is unusable.
    #[error(transparent)]
    CaBundle(#[from] trust::TrustError),
    /// rustls refused the configuration.
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// A finished HTTP exchange.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// `X-Subject-Token`, on Keystone's token answers.
    pub subject_token: Option<String>,
    /// The whole body.
    pub body: Bytes,
}

impl Answer {
    /// Whether the status is 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as `T`, or a permanent error naming `what`.
    pub fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T, CloudError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| CloudError::retryable(format!("{what}: unexpected answer: {e}")))
    }

    /// The answer as an error, for a non-2xx status.
    pub fn error(&self, what: &str) -> CloudError {
        ApiError::from_body(self.status, &self.body).into_cloud(what)
    }

    /// The parsed error, for a non-2xx status.
    pub fn api_error(&self) -> ApiError {
        ApiError::from_body(self.status, &self.body)
    }
}

/// A plain HTTP(S) client with a per-request timeout.
#[derive(Clone, Debug)]
pub struct Http {
    client: Client<hyper_rustls::HttpsConnector<ProxyConnector<HttpConnector>>, Full<Bytes>>,
    timeout: Duration,
}

impl Http {
    /// A client trusting the system roots, the cluster's bundle and `ca_pem` (`cacert`).
    pub fn new(ca_pem: Option<&[u8]>, timeout: Duration) -> Result<Self, ClientError> {
        let bundles = trust::extra_bundles(ca_pem.map(|pem| ("cacert", pem)))?;
        let roots = trust::roots(&bundles);
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(ProxyConnector::new(http));
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
        })
    }

    /// One request; `what` names it in errors. Transport failures and timeouts are retryable.
    pub async fn send(
        &self,
        what: &str,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Answer, CloudError> {
        let mut request = Request::builder()
            .method(method)
            .uri(url)
            .header("accept", "application/json")
            .header("user-agent", "cloudnet-reconciler");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = match body {
            Some(value) => {
                request = request.header("content-type", "application/json");
                Full::new(Bytes::from(value.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        let request = request
            .body(body)
            .map_err(|e| CloudError::permanent(format!("{what}: bad request: {e}")))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| transport(what, &error_chain(&e)))?;
            let status = response.status().as_u16();
            let subject_token = response
                .headers()
                .get("x-subject-token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| transport(what, &e))?
                .to_bytes();
            Ok::<Answer, CloudError>(Answer {
                status,
                subject_token,
                body,
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                CloudError::retryable(format!("{what}: no answer within {:?}", self.timeout))
            })?
    }
}

/// The error and its sources, which is where hyper keeps the useful part.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// An issued token, the Neutron endpoint of its catalog and when to stop using it.
#[derive(Debug)]
pub struct Token {
    value: Secret,
    /// Neutron's base URL (ending in `/v2.0`).
    pub network_url: String,
    renew_at: Instant,
}

#[derive(Deserialize)]
struct TokenBody {
    token: TokenInfo,
}

#[derive(Deserialize)]
struct TokenInfo {
    issued_at: Option<String>,
    expires_at: Option<String>,
    #[serde(default)]
    catalog: Vec<CatalogEntry>,
}

#[derive(Deserialize)]
struct CatalogEntry {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    endpoints: Vec<Endpoint>,
}

#[derive(Deserialize)]
struct Endpoint {
    interface: String,
    region_id: Option<String>,
    region: Option<String>,
    url: String,
}

/// Keystone v3 session: hands out a valid token, re-authenticating when needed.
#[derive(Debug)]
pub struct Session {
    http: Http,
    cloud: CloudConfig,
    /// Neutron's URL from `--platform-api-url`, used instead of the catalog's.
    network_override: Option<String>,
    token: tokio::sync::Mutex<Option<Arc<Token>>>,
}

impl Session {
    /// A session for `cloud`; nothing is sent until the first call.
    pub fn new(http: Http, cloud: CloudConfig, network_override: Option<String>) -> Self {
        Self {
            http,
            cloud,
            network_override: network_override.map(|u| neutron_base(&u)),
            token: tokio::sync::Mutex::new(None),
        }
    }

    /// A token that is not about to expire, issued now if needed (one caller authenticates while
    /// the others wait for its token).
    pub async fn token(&self) -> Result<Arc<Token>, CloudError> {
        let mut slot = self.token.lock().await;
        if let Some(token) = slot.as_ref()
            && Instant::now() < token.renew_at
        {
            return Ok(Arc::clone(token));
        }
        let token = Arc::new(self.authenticate().await?);
        *slot = Some(Arc::clone(&token));
        Ok(token)
    }

    /// Drops `stale` (Neutron refused it), unless another caller replaced it already.
    pub async fn invalidate(&self, stale: &Arc<Token>) {
        let mut slot = self.token.lock().await;
        if slot.as_ref().is_some_and(|t| Arc::ptr_eq(t, stale)) {
            *slot = None;
        }
    }

    /// One Neutron request on `path` (after `/v2.0`), re-authenticating once on 401.
    pub async fn neutron(
        &self,
        what: &str,
        method: Method,
        path: &str,
        extra: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Answer, CloudError> {
        let mut retried = false;
        loop {
            let token = self.token().await?;
            let url = format!("{}{path}", token.network_url);
            let mut headers: Vec<(&str, &str)> = vec![("x-auth-token", token.value.expose())];
            headers.extend_from_slice(extra);
            let answer = self
                .http
                .send(what, method.clone(), &url, &headers, body)
                .await?;
            if answer.status == 401 && !retried {
                tracing::info!(what, "Neutron refused the token; authenticating again");
                self.invalidate(&token).await;
                retried = true;
                continue;
            }
            return Ok(answer);
        }
    }

    async fn authenticate(&self) -> Result<Token, CloudError> {
        let url = format!("{}/auth/tokens", keystone_v3(&self.cloud.auth_url));
        let body = auth_body(&self.cloud.auth);
        let sent = Instant::now();
        let answer = self
            .http
            .send(
                "authenticating at Keystone",
                Method::POST,
                &url,
                &[],
                Some(&body),
            )
            .await?;
        if !answer.ok() {
            return Err(answer.error("authenticating at Keystone"));
        }
        let value = answer.subject_token.clone().ok_or_else(|| {
            CloudError::retryable("authenticating at Keystone: no X-Subject-Token in the answer")
        })?;
        let info = answer
            .json::<TokenBody>("authenticating at Keystone")?
            .token;
        let network_url = match &self.network_override {
            Some(url) => url.clone(),
            None => network_endpoint(&info.catalog, &self.cloud)?,
        };
        // Keystone's clock decides the lifetime; ours only counts it from when we asked.
        let lifetime = match (info.issued_at.as_deref(), info.expires_at.as_deref()) {
            (Some(issued), Some(expires)) => match (epoch_secs(issued), epoch_secs(expires)) {
                (Some(i), Some(e)) if e > i => Duration::from_secs_f64(e - i),
                _ => Duration::from_secs(3600),
            },
            _ => Duration::from_secs(3600),
        };
        let margin = (lifetime / 5).min(Duration::from_secs(60));
        tracing::info!(?lifetime, network = %network_url, "authenticated at Keystone");
        Ok(Token {
            value: Secret::from(value.as_str()),
            network_url,
            renew_at: sent + lifetime - margin,
        })
    }
}

/// Keystone's v3 base from a clouds.yaml `auth_url` (with or without `/v3`).
fn keystone_v3(auth_url: &str) -> String {
    let base = auth_url.trim_end_matches('/');
    if base.ends_with("/v3") {
        base.to_owned()
    } else {
        format!("{base}/v3")
    }
}

/// Neutron's `/v2.0` base from a catalog or override URL (which usually omits the version).
fn neutron_base(url: &str) -> String {
    let base = url.trim_end_matches('/');
    if base.ends_with("/v2.0") {
        base.to_owned()
    } else {
        format!("{base}/v2.0")
    }
}

fn network_endpoint(catalog: &[CatalogEntry], cloud: &CloudConfig) -> Result<String, CloudError> {
    let region_matches = |e: &Endpoint| match &cloud.region {
        None => true,
        Some(r) => e.region_id.as_ref() == Some(r) || e.region.as_ref() == Some(r),
    };
    catalog
        .iter()
        .filter(|entry| entry.kind == "network")
        .flat_map(|entry| &entry.endpoints)
        .find(|e| e.interface == cloud.interface && region_matches(e))
        .map(|e| neutron_base(&e.url))
        .ok_or_else(|| {
            CloudError::permanent(format!(
                "Keystone's catalog has no network endpoint with interface {:?}{}",
                cloud.interface,
                cloud
                    .region
                    .as_ref()
                    .map(|r| format!(" in region {r:?}"))
                    .unwrap_or_default()
            ))
        })
}

fn name_or_id(value: &NameOrId, domain: Option<&NameOrId>) -> Value {
    match value {
        NameOrId::Id(id) => json!({ "id": id }),
        NameOrId::Name(name) => {
            let domain = match domain {
                Some(NameOrId::Id(id)) => json!({ "id": id }),
                Some(NameOrId::Name(name)) => json!({ "name": name }),
                None => json!({ "id": "default" }),
            };
            json!({ "name": name, "domain": domain })
        }
    }
}

/// The body of `POST /v3/auth/tokens`.
fn auth_body(auth: &Auth) -> Value {
    match auth {
        Auth::Password {
            user,
            user_domain,
            password,
            project,
            project_domain,
        } => {
            let mut user = name_or_id(user, user_domain.as_ref());
            user["password"] = json!(password.expose());
            json!({ "auth": {
                "identity": { "methods": ["password"], "password": { "user": user } },
                "scope": { "project": name_or_id(project, project_domain.as_ref()) },
            }})
        }
        Auth::ApplicationCredential {
            credential,
            user,
            secret,
        } => {
            let mut cred = match credential {
                NameOrId::Id(id) => json!({ "id": id }),
                NameOrId::Name(name) => json!({ "name": name }),
            };
            cred["secret"] = json!(secret.expose());
            if let (NameOrId::Name(_), Some((user, domain))) = (credential, user) {
                cred["user"] = name_or_id(user, domain.as_ref());
            }
            json!({ "auth": { "identity": {
                "methods": ["application_credential"],
                "application_credential": cred,
            }}})
        }
    }
}

/// Seconds since the epoch of Keystone's `2026-11-23T16:05:08.000000Z`.
fn epoch_secs(text: &str) -> Option<f64> {
    let text = text.trim().trim_end_matches('Z');
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let s = t.next()?.parse::<f64>().ok()?;
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let whole = days * 86_400 + h * 3_600 + min * 60;
    // Seconds since 1970 stay far below 2^52, where f64 starts to round.
    #[allow(clippy::cast_precision_loss)]
    let whole = whole as f64;
    Some(whole + s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn keystone_timestamps_parse_to_epoch_seconds() {
        assert_eq!(epoch_secs("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(
            epoch_secs("2000-03-01T00:00:10.500000Z"),
            Some(951_868_810.5)
        );
        let issued = epoch_secs("2026-12-31T23:59:55.000000Z").unwrap();
        let expires = epoch_secs("2027-01-01T00:00:05.000000Z").unwrap();
        assert!((expires - issued - 10.0).abs() < 1e-6);
        assert_eq!(epoch_secs("yesterday"), None);
    }

    #[test]
    fn urls_get_their_version_once() {
        assert_eq!(keystone_v3("http://k:5000"), "http://k:5000/v3");
        assert_eq!(keystone_v3("http://k:5000/v3/"), "http://k:5000/v3");
        assert_eq!(neutron_base("http://n:9696/"), "http://n:9696/v2.0");
        assert_eq!(neutron_base("http://n:9696/v2.0"), "http://n:9696/v2.0");
    }

    #[test]
    fn catalog_endpoint_follows_interface_and_region() {
        let catalog: Vec<CatalogEntry> = serde_json::from_value(json!([
            {"type": "identity", "endpoints": [{"interface": "public", "region_id": "R1", "url": "http://k"}]},
            {"type": "network", "endpoints": [
                {"interface": "public", "region_id": "R1", "url": "http://public-r1:9696"},
                {"interface": "internal", "region_id": "R1", "url": "http://internal-r1:9696"},
                {"interface": "public", "region_id": "R2", "region": "R2", "url": "http://public-r2:9696/"},
            ]},
        ]))
        .unwrap();
        let cloud = |interface: &str, region: Option<&str>| CloudConfig {
            auth_url: "http://k".into(),
            auth: Auth::ApplicationCredential {
                credential: NameOrId::Id("i".into()),
                user: None,
                secret: "s".into(),
            },
            region: region.map(str::to_owned),
            interface: interface.into(),
            verify: true,
        };
        assert_eq!(
            network_endpoint(&catalog, &cloud("public", Some("R2"))).unwrap(),
            "http://public-r2:9696/v2.0"
        );
        assert_eq!(
            network_endpoint(&catalog, &cloud("internal", None)).unwrap(),
            "http://internal-r1:9696/v2.0"
        );
        let err = network_endpoint(&catalog, &cloud("admin", Some("R1"))).unwrap_err();
        assert!(err.message.contains("\"admin\""), "{err}");
    }

    #[test]
    fn auth_bodies_have_keystones_shape() {
        let body = auth_body(&Auth::Password {
            user: NameOrId::Name("u".into()),
            user_domain: Some(NameOrId::Name("Default".into())),
            password: "p".into(),
            project: NameOrId::Id("pid".into()),
            project_domain: None,
        });
        assert_eq!(
            body,
            json!({"auth": {
                "identity": {"methods": ["password"], "password": {"user": {
                    "name": "u", "domain": {"name": "Default"}, "password": "p"}}},
                "scope": {"project": {"id": "pid"}},
            }})
        );
        let body = auth_body(&Auth::ApplicationCredential {
            credential: NameOrId::Name("c".into()),
            user: Some((NameOrId::Id("uid".into()), None)),
            secret: "s".into(),
        });
        assert_eq!(
            body,
            json!({"auth": {"identity": {"methods": ["application_credential"],
                "application_credential": {"name": "c", "secret": "s", "user": {"id": "uid"}}}}})
        );
    }
}
