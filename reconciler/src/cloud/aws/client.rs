//! Building the EC2 client by hand: static credentials from the secret directory, our region and
//! endpoint, a rustls (ring) HTTP client trusting the configured CA bundle, SDK retries off (the
//! provider retries itself, re-reading state between attempts) and a timeout on every call.

use std::time::Duration;

use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use thiserror::Error;

use super::credentials::AwsCredentials;

/// Connection setup may take this long before a call counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the EC2 client could not be built.
#[derive(Debug, Error)]
pub enum ClientError {
    /// No region configured.
    #[error("no AWS region configured: set --platform-region")]
    NoRegion,
    /// The endpoint override is not an http(s) URL.
    #[error("--platform-api-url {0:?} is not an http:// or https:// URL")]
    BadEndpoint(String),
    /// The CA bundle holds no usable certificate.
    #[error("CA bundle {0}")]
    BadCaBundle(String),
    /// The TLS settings were refused.
    #[error("TLS settings: {0}")]
    Tls(String),
}

/// Where and how to reach EC2.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// The region (`us-east-1`).
    pub region: String,
    /// Endpoint override (`--platform-api-url`), e.g. a VPC endpoint or moto.
    pub endpoint: Option<String>,
    /// PEM CA bundle to trust instead of the system roots (`--platform-aws-ca-override`).
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// Upper bound of one call, connection included.
    pub call_timeout: Duration,
}

/// The EC2 client for `settings` and `credentials`.
pub fn build(
    settings: &ClientSettings,
    credentials: &AwsCredentials,
) -> Result<aws_sdk_ec2::Client, ClientError> {
    if settings.region.trim().is_empty() {
        return Err(ClientError::NoRegion);
    }
    let trust_store = match &settings.ca_bundle_pem {
        Some(pem) => {
            validate_bundle(pem)?;
            TrustStore::empty().with_pem_certificate(pem.clone())
        }
        None => TrustStore::default(),
    };
    let tls_context = TlsContext::builder()
        .with_trust_store(trust_store)
        .build()
        .map_err(|e| ClientError::Tls(e.to_string()))?;
    let http_client = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .tls_context(tls_context)
        .build_https();
    let credentials = Credentials::new(
        credentials.access_key_id.expose(),
        credentials.secret_access_key.expose(),
        credentials
            .session_token
            .as_ref()
            .map(|t| t.expose().to_owned()),
        None,
        "cloudnet-secret-dir",
    );
    let mut config = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(settings.region.trim().to_owned()))
        .credentials_provider(credentials)
        .http_client(http_client)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT.min(settings.call_timeout))
                .operation_attempt_timeout(settings.call_timeout)
                .operation_timeout(settings.call_timeout)
                .build(),
        );
    if let Some(endpoint) = &settings.endpoint {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ClientError::BadEndpoint(endpoint.clone()));
        }
        config = config.endpoint_url(endpoint.trim_end_matches('/'));
    }
    Ok(aws_sdk_ec2::Client::from_conf(config.build()))
}

/// The SDK panics on a bad PEM when it first connects; refuse it here, at start-up, instead.
fn validate_bundle(pem: &[u8]) -> Result<(), ClientError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ClientError::BadCaBundle(format!("is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(ClientError::BadCaBundle("holds no certificate".into()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| ClientError::BadCaBundle(format!("holds an unusable certificate: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::aws::credentials::Secret;

    fn credentials() -> AwsCredentials {
        AwsCredentials {
            access_key_id: Secret::new("AKID"),
            secret_access_key: Secret::new("secret"),
            session_token: None,
        }
    }

    fn settings() -> ClientSettings {
        ClientSettings {
            region: "us-east-1".into(),
            endpoint: Some("http://127.0.0.1:1".into()),
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
    }
}
