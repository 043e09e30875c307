//! A small certificate authority: one CA that issues serving and client certificates (ECDSA P-256).
//! Used by the webhook's certificate command and by the local control plane for tests and the demo.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A subject alternative name is neither an IP address nor a valid DNS name.
    #[error("invalid subject alternative name {name:?}: {source}")]
    InvalidName {
        /// The offending name.
        name: String,
        /// What rcgen reported.
        source: rcgen::Error,
    },
    /// Key generation or signing failed.
    #[error("certificate generation failed: {0}")]
    Generation(#[from] rcgen::Error),
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// TLS server (e.g. the webhook or kube-apiserver).
    Server,
    /// TLS client (e.g. an admin user authenticating to kube-apiserver).
    Client,
}

/// A certificate and its private key, PEM-encoded.
#[derive(Clone)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The PKCS#8 private key, PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    // The key is a credential: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// A leaf certificate request.
#[derive(Clone, Debug)]
pub struct LeafRequest<'a> {
    /// Subject common name (the user name, for client certificates).
    pub common_name: &'a str,
    /// Subject organisations (the groups, for client certificates).
    pub organizations: &'a [&'a str],
    /// Subject alternative names: IP addresses or DNS names.
    pub alt_names: &'a [&'a str],
    /// Server or client.
    pub usage: Usage,
    /// Lifetime from now.
    pub validity: Duration,
}

/// A self-signed certificate authority that can issue leaf certificates.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

impl CertificateAuthority {
    /// Creates a new CA valid for `validity` from now.
    pub fn generate(common_name: &str, validity: Duration) -> Result<Self, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, validity);
        let cert = params.self_signed(&key)?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
            key_pem,
        })
    }

    /// The CA certificate, PEM (what goes into a caBundle or a kubeconfig).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issues a leaf certificate signed by this CA, with a fresh key.
    pub fn issue(&self, request: &LeafRequest<'_>) -> Result<Issued, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(request.common_name, request.organizations);
        params.subject_alt_names = request
            .alt_names
            .iter()
            .map(|n| alt_name(n))
            .collect::<Result<_, _>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![match request.usage {
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, request.validity);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A key pair for signing tokens (e.g. service-account tokens), both halves PEM-encoded.
#[derive(Clone)]
pub struct SigningKey {
    /// The PKCS#8 private key, PEM.
    pub private_pem: String,
    /// The SubjectPublicKeyInfo public key, PEM.
    pub public_pem: String,
}

/// A fresh ECDSA P-256 signing key pair.
pub fn signing_key() -> Result<SigningKey, CertError> {
    let key = KeyPair::generate()?;
    Ok(SigningKey {
        private_pem: key.serialize_pem(),
        public_pem: key.public_key_pem(),
    })
}

fn name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    for org in organizations {
        dn.push(DnType::OrganizationName, *org);
    }
    dn
}

fn alt_name(name: &str) -> Result<SanType, CertError> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let dns = name.try_into().map_err(|source| CertError::InvalidName {
        name: name.to_string(),
        source,
    })?;
    Ok(SanType::DnsName(dns))
}

fn set_validity(params: &mut CertificateParams, validity: Duration) {
    // Back-date a little so a freshly issued certificate is valid on a peer whose clock lags.
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + validity;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_server_and_client_certificates_signed_by_the_ca() {
        let ca = CertificateAuthority::generate("test-ca", Duration::days(1)).unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let server = ca
            .issue(&LeafRequest {
                common_name: "webhook",
                organizations: &[],
                alt_names: &["127.0.0.1", "webhook.cloudnet.svc"],
                usage: Usage::Server,
                validity: Duration::days(1),
            })
            .unwrap();
        assert!(server.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(server.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_ne!(server.cert_pem, ca.cert_pem());
        assert!(!format!("{server:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn refuses_an_invalid_dns_name() {
        let ca = CertificateAuthority::generate("test-ca", Duration::days(1)).unwrap();
        let err = ca
            .issue(&LeafRequest {
                common_name: "x",
                organizations: &[],
                alt_names: &["caf\u{e9}.example"],
                usage: Usage::Server,
                validity: Duration::days(1),
            })
            .unwrap_err();
        assert!(err.to_string().contains("caf\u{e9}.example"), "{err}");
    }
}
