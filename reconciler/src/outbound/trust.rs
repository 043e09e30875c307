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
pub(crate) const TRUSTED_CA_BUNDLE_ENV: &str = "CLOUDNET_TRUSTED_CA_BUNDLE";

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
pub(crate) fn trusted_bundle_path() -> PathBuf {
    std::env::var_os(TRUSTED_CA_BUNDLE_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(TRUSTED_CA_BUNDLE), PathBuf::from)
}

/// The extra CAs for this process's clients, PEM, each checked: the cluster's trusted bundle
/// when it is there, then `custom` (a cloud's own CA, named `custom_name` in errors).
pub(crate) fn extra_bundles(custom: Option<(&str, &[u8])>) -> Result<Vec<Vec<u8>>, TrustError> {
    let mut bundles = Vec::new();
    let path = trusted_bundle_path();
    if let Some(pem) = read_if_present(&path)? {
        if pem.trim_ascii().is_empty() {
            // Mounted, but nothing to add: the cluster trusts no CA beyond the usual ones.
            tracing::debug!(bundle = %path.display(), "the cluster's CA bundle is empty");
            return with_custom(bundles, custom);
        }
        let usable = usable_entries(&path.display().to_string(), &pem)?;
        tracing::info!(bundle = %path.display(), "trusting the cluster's CA bundle beside the system roots");
        bundles.push(usable);
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
pub(crate) fn roots(bundles: &[Vec<u8>]) -> RootCertStore {
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
pub(crate) fn certificates(
    what: &str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TrustError> {
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

/// The certificates of the cluster's bundle that rustls can use, as PEM, each one it cannot
/// (a bad copy and paste into the cluster's trusted CA ConfigMap) skipped with a warning naming
/// the entry and its lines: the bundle is shared by every workload of the cluster, and one bad
/// entry must not stop the reconciler at every election. A bundle with no usable certificate at
/// all is refused, as a bundle with none is.
fn usable_entries(what: &str, pem: &[u8]) -> Result<Vec<u8>, TrustError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let text = String::from_utf8_lossy(pem);
    let mut usable = String::new();
    let (mut entries, mut skipped) = (0_usize, 0_usize);
    let mut open: Option<(usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        let number = number + 1;
        match (&mut open, line.trim()) {
            (None, BEGIN) => open = Some((number, format!("{BEGIN}\n"))),
            (None, _) => {}
            (Some((first, block)), END) => {
                block.push_str(END);
                block.push('\n');
                entries += 1;
                let checked = CertificateDer::from_pem_slice(block.as_bytes())
                    .map_err(|e| format!("not valid PEM: {e}"))
                    .and_then(|cert| {
                        RootCertStore::empty()
                            .add(cert)
                            .map_err(|e| format!("unusable: {e}"))
                    });
                match checked {
                    Ok(()) => usable.push_str(block),
                    Err(error) => {
                        skipped += 1;
                        tracing::warn!(
                            bundle = what,
                            entry = entries,
                            lines = %format!("{first}-{number}"),
                            %error,
                            "skipping a certificate of the CA bundle that cannot be used; the others are trusted"
                        );
                    }
                }
                open = None;
            }
            (Some((_, block)), line) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    if entries == skipped {
        let reason = if entries == 0 {
            "holds no certificate".to_owned()
        } else {
            format!("holds no usable certificate ({skipped} skipped)")
        };
        return Err(TrustError::Unusable {
            what: what.to_owned(),
            reason,
        });
    }
    Ok(usable.into_bytes())
}

/// Every certificate of `bundles` (as [`extra_bundles`] returns them), each bundle checked as
/// [`certificates`] checks it: for the HTTP clients that take DER certificates (Azure's and
/// GCP's reqwest).
#[cfg(any(feature = "azure", feature = "gcp"))]
pub(crate) fn bundle_certificates(
    bundles: &[Vec<u8>],
) -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let mut out = Vec::new();
    for (i, pem) in bundles.iter().enumerate() {
        out.extend(certificates(&format!("CA bundle {}", i + 1), pem)?);
    }
    Ok(out)
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

/// The variable rustls-native-certs (and OpenSSL) take the system roots from instead of the
/// platform's locations.
pub(crate) const SSL_CERT_FILE: &str = "SSL_CERT_FILE";

/// What [`export_for_foreign_clients`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum ForeignRoots {
    /// No cluster bundle is mounted (or it is empty or unusable: the clients we build report
    /// that themselves): the foreign clients' system roots are all there is to trust.
    NoBundle,
    /// `SSL_CERT_FILE` was set already, and is left as the operator set it.
    AlreadySet,
    /// `SSL_CERT_FILE` now names an in-memory file holding the system roots and the bundle.
    Exported {
        /// The path set (`/proc/self/fd/N`).
        path: String,
        /// Certificates in it.
        certificates: usize,
    },
    /// The merged roots could not be put where a path reaches them; nothing was changed.
    Unavailable(String),
}

/// Makes the clients the process cannot configure trust the cluster's bundle too.
///
/// The google-cloud crates build their own reqwest clients (the Compute calls, the OAuth
/// exchange) and take neither a client nor a TLS configuration; reqwest 0.13 verifies with
/// rustls-platform-verifier, which on Linux loads its roots with rustls-native-certs on every
/// client build, and that reads `SSL_CERT_FILE` *instead of* the system locations. So when the
/// cluster's bundle is mounted and `SSL_CERT_FILE` is unset, it is set to a file holding the
/// system roots (as they load now) followed by the bundle: the same trust [`roots`] gives our
/// own clients. The file is a memfd reached through `/proc/self/fd`: the image's root file
/// system is not writable (a random UID, no /tmp in a scratch image), and the bundle is read
/// once, as our own clients read it at their build.
///
/// # Safety
///
/// Sets an environment variable: no other thread may be running (call it before the runtime
/// is built).
#[allow(unsafe_code)]
pub unsafe fn export_for_foreign_clients() -> ForeignRoots {
    let bundles = match extra_bundles(None) {
        Ok(bundles) if !bundles.is_empty() => bundles,
        _ => return ForeignRoots::NoBundle,
    };
    if std::env::var_os(SSL_CERT_FILE).is_some() {
        tracing::info!(
            "SSL_CERT_FILE is set: the google-cloud clients trust only the certificates it names, not the cluster's bundle"
        );
        return ForeignRoots::AlreadySet;
    }
    let (pem, certificates) = merged_pem(&bundles);
    let path = match in_memory_file(&pem) {
        Ok(path) => path,
        Err(e) => {
            let reason = format!("cannot hold the merged roots in memory: {e}");
            tracing::warn!(%reason, "the google-cloud clients trust the system roots only");
            return ForeignRoots::Unavailable(reason);
        }
    };
    // SAFETY: the caller guarantees that no other thread runs, so none reads the environment.
    unsafe { std::env::set_var(SSL_CERT_FILE, &path) };
    tracing::info!(
        %path, certificates,
        "SSL_CERT_FILE names the system roots and the cluster's bundle, for the clients the process cannot configure"
    );
    ForeignRoots::Exported { path, certificates }
}

/// The system roots as rustls-native-certs loads them now, then `bundles`, as one PEM text.
fn merged_pem(bundles: &[Vec<u8>]) -> (String, usize) {
    use base64::Engine as _;
    let native = rustls_native_certs::load_native_certs();
    let mut pem = String::new();
    for cert in &native.certs {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let encoded = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        for line in encoded.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    let mut count = native.certs.len();
    for bundle in bundles {
        count += CertificateDer::pem_slice_iter(bundle).flatten().count();
        pem.push_str(&String::from_utf8_lossy(bundle));
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
    }
    (pem, count)
}

/// Holds `text` in a memfd kept open for the process's life and returns its `/proc/self/fd`
/// path, checked readable.
fn in_memory_file(text: &str) -> std::io::Result<String> {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    static KEPT: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    let fd = rustix::fs::memfd_create("cloudnet-trusted-roots", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(text.as_bytes())?;
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    if std::fs::read(&path)?.len() != text.len() {
        return Err(std::io::Error::other(format!("{path} reads back short")));
    }
    KEPT.set(file)
        .map_err(|_| std::io::Error::other("the merged roots were exported already"))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_malformed_certificate_in_the_clusters_bundle_is_skipped_and_the_others_kept() {
        let pem = |name| {
            cloudnet_certs::CertificateAuthority::generate(name, time::Duration::days(1))
                .unwrap()
                .cert_pem()
                .to_owned()
        };
        let (first, last) = (pem("first"), pem("last"));
        // Valid base64 of bytes that are no certificate, then base64 that is not even that.
        let garbage =
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
        let broken = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        let bundle = format!("{first}{garbage}# a comment\n{broken}{last}");
        let usable = usable_entries("bundle", bundle.as_bytes()).unwrap();
        let kept = certificates("usable", &usable).unwrap();
        assert_eq!(
            kept,
            [
                certificates("first", first.as_bytes()).unwrap().remove(0),
                certificates("last", last.as_bytes()).unwrap().remove(0)
            ]
        );
        let none = usable_entries("bundle", garbage.as_bytes()).unwrap_err();
        assert!(
            none.to_string()
                .contains("no usable certificate (1 skipped)"),
            "{none}"
        );
        let empty = usable_entries("bundle", b"# nothing\n").unwrap_err();
        assert!(
            empty.to_string().contains("holds no certificate"),
            "{empty}"
        );
    }

    #[test]
    fn the_merged_roots_hold_the_system_roots_and_the_bundle_readable_by_path() {
        let ca =
            cloudnet_certs::CertificateAuthority::generate("injected", time::Duration::days(1))
                .unwrap();
        let bundle = ca.cert_pem().as_bytes().to_vec();
        let der = certificates("test", &bundle).unwrap().remove(0);
        let (pem, count) = merged_pem(std::slice::from_ref(&bundle));
        let system = rustls_native_certs::load_native_certs().certs;
        assert_eq!(count, system.len() + 1);
        let path = in_memory_file(&pem).unwrap();
        // What rustls-native-certs reads from SSL_CERT_FILE: every certificate, the bundle's last.
        let read: Vec<_> = CertificateDer::pem_file_iter(&path)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(read.len(), count);
        assert_eq!(read.last().unwrap(), &der);
        assert_eq!(read[..system.len()], system[..]);
    }
}
