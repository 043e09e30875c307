//! The CAs every client trusts: the image's system roots, plus the cluster's trusted bundle when
//! it is mounted (OpenShift injects it at [`TRUSTED_CA_BUNDLE`]: the proxy's CA and any custom
//! PKI), plus a cloud's own custom CA (`--platform-aws-ca-override`, OpenStack's `cacert`). A
//! custom CA is added to the roots, never substituted for them: a cloud's token endpoint or a
//! TLS-intercepting proxy is signed by another CA than a private API endpoint.

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use thiserror::Error;

/// Where OpenShift mounts the cluster's trusted CA bundle (the network operator's
/// `trusted-ca-bundle` ConfigMap, key `ca-bundle.crt`, as `tls-ca-bundle.pem`).
pub const TRUSTED_CA_BUNDLE: &str = "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem";

/// Environment variable naming another path for the trusted bundle (tests, other layouts).
pub const TRUSTED_CA_BUNDLE_ENV: &str = "CLOUDNET_TRUSTED_CA_BUNDLE";

/// A CA bundle that cannot be used.
#[derive(Debug, Error)]
pub enum TrustError {
    /// The file exists but cannot be read.
    #[error("reading the CA bundle {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The bundle holds no usable certificate.
    #[error("the CA bundle {what} {reason}")]
    Unusable {
        /// Which bundle.
        what: String,
        /// What is wrong.
        reason: String,
    },
}

/// The path of the cluster's trusted bundle.
pub fn trusted_bundle_path() -> PathBuf {
    std::env::var_os(TRUSTED_CA_BUNDLE_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(TRUSTED_CA_BUNDLE), PathBuf::from)
}

/// The extra CAs for this process's clients, PEM, each checked: the cluster's trusted bundle
/// when it is there, then `custom` (a cloud's own CA, named `custom_name` in errors).
pub fn extra_bundles(custom: Option<(&str, &[u8])>) -> Result<Vec<Vec<u8>>, TrustError> {
    let mut bundles = Vec::new();
    let path = trusted_bundle_path();
    if let Some(pem) = read_if_present(&path)? {
        if pem.trim_ascii().is_empty() {
            // Mounted, but nothing to add: the cluster trusts no CA beyond the usual ones.
            tracing::debug!(bundle = %path.display(), "the cluster's CA bundle is empty");
            return with_custom(bundles, custom);
        }
        certificates(&path.display().to_string(), &pem)?;
        tracing::info!(bundle = %path.display(), "trusting the cluster's CA bundle beside the system roots");
        bundles.push(pem);
    }
    with_custom(bundles, custom)
}

fn with_custom(
    mut bundles: Vec<Vec<u8>>,
    custom: Option<(&str, &[u8])>,
) -> Result<Vec<Vec<u8>>, TrustError> {
    if let Some((name, pem)) = custom {
        certificates(name, pem)?;
        bundles.push(pem.to_vec());
    }
    Ok(bundles)
}

/// The system roots plus `bundles` (as [`extra_bundles`] returns them).
pub fn roots(bundles: &[Vec<u8>]) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        // One unreadable system certificate must not cost the others.
        let _ = roots.add(cert);
    }
    for pem in bundles {
        for cert in CertificateDer::pem_slice_iter(pem).flatten() {
            let _ = roots.add(cert);
        }
    }
    roots
}

/// The certificates of `pem`, refusing a bundle with none or with one rustls cannot use (the
/// clients would otherwise fail, or panic, only at their first connection).
pub fn certificates(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let unusable = |reason: String| TrustError::Unusable {
        what: what.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unusable(format!("is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(unusable("holds no certificate".into()));
    }
    let mut store = RootCertStore::empty();
    for cert in &certs {
        store
            .add(cert.clone())
            .map_err(|e| unusable(format!("holds an unusable certificate: {e}")))?;
    }
    Ok(certs)
}

fn read_if_present(path: &Path) -> Result<Option<Vec<u8>>, TrustError> {
    match std::fs::read(path) {
        Ok(pem) => Ok(Some(pem)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TrustError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}
