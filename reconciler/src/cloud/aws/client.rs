//! Building the EC2 client by hand: credentials from the secret directory (fixed keys, or STS
//! web-identity credentials renewed before expiry), our region and endpoint, a rustls (ring)
//! HTTP client trusting the system roots, the cluster's trusted bundle and the configured CA
//! bundle (the STS client gets the same, so the endpoint and CA settings reach STS too), each
//! going through the proxy the environment names for its endpoint, SDK retries off for EC2 (the
//! provider retries itself, re-reading state between attempts) and a timeout on every call.

use std::time::Duration;

use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, IdentityCache, Region, SharedHttpClient};
use aws_smithy_http_client::Connector;
use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
use thiserror::Error;

use crate::outbound::{proxy, trust};

use super::credentials::{AwsCredentials, CredentialSource};
use super::web_identity::WebIdentityProvider;

/// Connection setup may take this long before a call counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long before the expiry the identity cache itself considers credentials stale; the web
/// identity provider already reports them early (`web_identity::REFRESH_MARGIN`).
const CACHE_BUFFER: Duration = Duration::from_secs(1);

/// Why the EC2 client could not be built.
#[derive(Debug, Error)]
pub enum ClientError {
    /// No region configured.
    #[error("no AWS region configured: set --platform-region")]
    NoRegion,
    /// The endpoint override is not an http(s) URL.
    #[error("--platform-api-url {0:?} is not an http:// or https:// URL")]
    BadEndpoint(String),
    /// The STS endpoint override is not an http(s) URL.
    #[error("the STS endpoint {0:?} is not an http:// or https:// URL")]
    BadStsEndpoint(String),
    /// A CA bundle (the configured one, or the cluster's) is unusable.
    #[error(transparent)]
    BadCaBundle(#[from] trust::TrustError),
    /// The TLS settings were refused.
    #[error("TLS settings: {0}")]
    Tls(String),
    /// The proxy for an endpoint was refused.
    #[error("proxy for {endpoint}: {reason}")]
    Proxy {
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
}

/// Where and how to reach EC2 (and STS, for web-identity credentials).
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// The region (`us-east-1`).
    pub region: String,
    /// Endpoint override (`--platform-api-url`), e.g. a VPC endpoint or moto; STS uses it too
    /// unless `sts_endpoint` is set.
    pub endpoint: Option<String>,
    /// STS endpoint override (`AWS_ENDPOINT_URL_STS`), for an `endpoint` that serves EC2 only.
    pub sts_endpoint: Option<String>,
    /// PEM CA bundle to trust besides the system roots (`--platform-aws-ca-override`).
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// Upper bound of one call, connection included.
    pub call_timeout: Duration,
}

/// The EC2 client for `settings` and `credentials`.
pub fn build(
    settings: &ClientSettings,
    credentials: &CredentialSource,
) -> Result<aws_sdk_ec2::Client, ClientError> {
    if settings.region.trim().is_empty() {
        return Err(ClientError::NoRegion);
    }
    let endpoint = endpoint(settings.endpoint.as_deref(), ClientError::BadEndpoint)?;
    let tls = tls_context(settings)?;
    let ec2_url = endpoint
        .clone()
        .unwrap_or_else(|| default_endpoint("ec2", &settings.region));
    let http_client = http_client(&tls, &ec2_url)?;
    let mut config = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(region(settings))
        .http_client(http_client.clone())
        .retry_config(RetryConfig::disabled())
        .timeout_config(timeouts(settings.call_timeout));
    config = match credentials {
        CredentialSource::Static(keys) => config.credentials_provider(static_credentials(keys)),
        CredentialSource::WebIdentity(identity) => {
            let sts = sts_client(settings, &tls)?;
            config
                .credentials_provider(WebIdentityProvider::new(sts, identity.clone()))
                .identity_cache(
                    IdentityCache::lazy()
                        .buffer_time(CACHE_BUFFER)
                        // The exchange is one STS call, bounded like every other call.
                        .load_timeout(settings.call_timeout)
                        .build(),
                )
        }
    };
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    Ok(aws_sdk_ec2::Client::from_conf(config.build()))
}

/// The STS client the web identity exchange goes through: same region, HTTP client (CA bundle)
/// and timeouts as EC2, at the STS override or else the EC2 endpoint override. STS's own retries
/// stay on: the exchange changes nothing, and a failed one fails the EC2 call waiting for it.
fn sts_client(
    settings: &ClientSettings,
    tls: &TlsContext,
) -> Result<aws_sdk_sts::Client, ClientError> {
    let endpoint = match &settings.sts_endpoint {
        Some(sts) => endpoint(Some(sts), ClientError::BadStsEndpoint)?,
        None => endpoint(settings.endpoint.as_deref(), ClientError::BadEndpoint)?,
    };
    let sts_url = endpoint
        .clone()
        .unwrap_or_else(|| default_endpoint("sts", &settings.region));
    let http_client = http_client(tls, &sts_url)?;
    let mut config = aws_sdk_sts::Config::builder()
        .behavior_version(aws_sdk_sts::config::BehaviorVersion::latest())
        .region(region(settings))
        .http_client(http_client)
        .retry_config(aws_sdk_sts::config::retry::RetryConfig::standard())
        .timeout_config(timeouts(settings.call_timeout));
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    Ok(aws_sdk_sts::Client::from_conf(config.build()))
}

fn region(settings: &ClientSettings) -> Region {
    Region::new(settings.region.trim().to_owned())
}

fn timeouts(call_timeout: Duration) -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT.min(call_timeout))
        .operation_attempt_timeout(call_timeout)
        .operation_timeout(call_timeout)
        .build()
}

/// `url` without a trailing slash, if it is an http(s) URL.
fn endpoint(
    url: Option<&str>,
    bad: fn(String) -> ClientError,
) -> Result<Option<String>, ClientError> {
    match url {
        None => Ok(None),
        Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
            Ok(Some(url.trim_end_matches('/').to_owned()))
        }
        Some(url) => Err(bad(url.to_owned())),
    }
}

/// The regional endpoint the SDK resolves for `service` when none is configured, to choose its
/// proxy by (the SDK's resolver is not exposed; the China partition has its own domain).
fn default_endpoint(service: &str, region: &str) -> String {
    let region = region.trim();
    let domain = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    format!("https://{service}.{region}.{domain}")
}

/// TLS trusting the system roots, the cluster's trusted bundle and the configured CA bundle.
fn tls_context(settings: &ClientSettings) -> Result<TlsContext, ClientError> {
    let custom = settings
        .ca_bundle_pem
        .as_deref()
        .map(|pem| ("--platform-aws-ca-override", pem));
    let bundles = trust::extra_bundles(custom)?;
    let trust_store = bundles
        .into_iter()
        .fold(TrustStore::default(), TrustStore::with_pem_certificate);
    TlsContext::builder()
        .with_trust_store(trust_store)
        .build()
        .map_err(|e| ClientError::Tls(e.to_string()))
}

/// The rustls HTTP client for `url`, through the proxy the environment names for it.
fn http_client(tls: &TlsContext, url: &str) -> Result<SharedHttpClient, ClientError> {
    let proxy = match proxy::for_url(proxy::rules(), url) {
        Some(proxy) => ProxyConfig::all(proxy.as_str()).map_err(|e| ClientError::Proxy {
            endpoint: url.to_owned(),
            reason: e.to_string(),
        })?,
        None => ProxyConfig::disabled(),
    };
    let tls = tls.clone();
    // As the SDK's own `build_https`, plus the proxy it has no switch for at this level.
    Ok(
        aws_smithy_http_client::Builder::new().build_with_connector_fn(
            move |settings, components| {
                let mut builder = Connector::builder();
                builder.set_connector_settings(settings.cloned());
                if let Some(components) = components {
                    builder.set_sleep_impl(components.sleep_impl());
                }
                builder
                    .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
                    .tls_context(tls.clone())
                    .proxy_config(proxy.clone())
                    .build()
            },
        ),
    )
}

fn static_credentials(keys: &AwsCredentials) -> Credentials {
    Credentials::new(
        keys.access_key_id.expose(),
        keys.secret_access_key.expose(),
        keys.session_token.as_ref().map(|t| t.expose().to_owned()),
        None,
        "cloudnet-secret-dir",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::aws::credentials::{Secret, WebIdentity};

    fn credentials() -> CredentialSource {
        CredentialSource::Static(AwsCredentials {
            access_key_id: Secret::new("AKID"),
            secret_access_key: Secret::new("secret"),
            session_token: None,
        })
    }

    fn web_identity() -> CredentialSource {
        CredentialSource::WebIdentity(WebIdentity {
            role_arn: "arn:aws:iam::123456789012:role/r".into(),
            token_file: "/nonexistent/token".into(),
            session_name: None,
            duration: None,
        })
    }

    fn settings() -> ClientSettings {
        ClientSettings {
            region: "us-east-1".into(),
            endpoint: Some("http://127.0.0.1:1".into()),
            sts_endpoint: None,
            ca_bundle_pem: None,
            call_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn bad_settings_are_refused_at_build_time() {
        let no_region = ClientSettings {
            region: " ".into(),
            ..settings()
        };
        assert!(matches!(
            build(&no_region, &credentials()),
            Err(ClientError::NoRegion)
        ));
        let bad_url = ClientSettings {
            endpoint: Some("ec2.local:443".into()),
            ..settings()
        };
        assert!(matches!(
            build(&bad_url, &credentials()),
            Err(ClientError::BadEndpoint(_))
        ));
        let bad_ca = ClientSettings {
            ca_bundle_pem: Some(b"not a certificate".to_vec()),
            ..settings()
        };
        assert!(matches!(
            build(&bad_ca, &credentials()),
            Err(ClientError::BadCaBundle(_))
        ));
        assert!(build(&settings(), &credentials()).is_ok());
        let bad_sts = ClientSettings {
            sts_endpoint: Some("sts.local".into()),
            ..settings()
        };
        assert!(matches!(
            build(&bad_sts, &web_identity()),
            Err(ClientError::BadStsEndpoint(_))
        ));
        assert!(build(&bad_sts, &credentials()).is_ok(), "keys need no STS");
        assert!(build(&settings(), &web_identity()).is_ok());
    }
}
