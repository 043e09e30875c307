//! The serving certificate: TLS 1.2/1.3 only, reloaded from disk without a restart.
//!
//! Kubernetes Secret mounts replace files by swapping a `..data` symlink to a new directory, so
//! the files are re-read by path (following symlinks) on an interval rather than watched by inode.
//! A new pair is swapped in only when both files parse and the key matches the certificate; a
//! half-written or mismatched pair keeps the old one serving, so a rotation never fails a handshake.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::crypto::ring;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why a certificate pair could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not valid PEM of the expected kind.
    #[error("parsing {path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The pair does not fit together or rustls refused it.
    #[error("certificate {cert} and key {key} do not form a usable pair: {source}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls reported.
        source: rustls::Error,
    },
}

/// Where the serving certificate and key live.
#[derive(Clone, Debug)]
pub struct CertPaths {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// How long before expiry the webhook starts warning about its certificate.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// Whether a certificate valid until `not_after` should be warned about at `now` (Unix seconds).
pub fn expires_soon(now: i64, not_after: i64) -> bool {
    let warning = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
    not_after.saturating_sub(now) <= warning
}

/// The certificate currently served; cheap to read on every handshake.
#[derive(Debug)]
pub struct CertStore {
    paths: CertPaths,
    current: ArcSwap<CertifiedKey>,
    /// The PEM bytes last loaded, to skip re-parsing an unchanged pair.
    loaded: std::sync::Mutex<(Vec<u8>, Vec<u8>)>,
}

impl CertStore {
    /// Loads the pair at `paths`; fails when it is unusable.
    pub fn load(paths: CertPaths) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = read_pair(&paths)?;
        let key = certified_key(&paths, &cert_pem, &key_pem)?;
        Ok(Self {
            paths,
            current: ArcSwap::from_pointee(key),
            loaded: std::sync::Mutex::new((cert_pem, key_pem)),
        })
    }

    /// Re-reads the files; swaps in the new pair if it changed and is usable.
    /// Returns whether a new certificate is now served.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = read_pair(&self.paths)?;
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(false);
        }
        let key = certified_key(&self.paths, &cert_pem, &key_pem)?;
        self.current.store(Arc::new(key));
        *loaded = (cert_pem, key_pem);
        Ok(true)
    }

    /// The served leaf certificate's notAfter in Unix seconds; `None` if it cannot be parsed.
    pub fn not_after(&self) -> Option<i64> {
        let key = self.current();
        let leaf = key.cert.first()?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
        Some(cert.validity().not_after.timestamp())
    }

    /// The certificate served right now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// Reloads every `interval` for as long as the task runs; failures keep the old pair.
    pub async fn reload_every(self: Arc<Self>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let store = Arc::clone(&self);
            // File reads block; keep them off the runtime's worker threads.
            match tokio::task::spawn_blocking(move || store.reload()).await {
                Ok(Ok(true)) => {
                    tracing::info!(cert = %self.paths.cert.display(), "serving certificate reloaded")
                }
                Ok(Ok(false)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, "serving certificate not reloaded; keeping the current one");
                }
                Err(error) => tracing::warn!(%error, "certificate reload task failed"),
            }
        }
    }
}

/// Resolves every handshake to the store's current certificate.
#[derive(Debug)]
pub struct StoreResolver(pub Arc<CertStore>);

impl ResolvesServerCert for StoreResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// A rustls server configuration: TLS 1.2 and 1.3 only, HTTP/2 and HTTP/1.1 by ALPN.
pub fn server_config(store: Arc<CertStore>) -> Result<ServerConfig, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(StoreResolver(store)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn read_pair(paths: &CertPaths) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    Ok((read(&paths.cert)?, read(&paths.key)?))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certified_key(
    paths: &CertPaths,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<CertifiedKey, TlsError> {
    let parse = |path: &Path, detail: String| TlsError::Parse {
        path: path.to_owned(),
        detail,
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| parse(&paths.cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(parse(&paths.cert, "no certificate found".into()));
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| parse(&paths.key, e.to_string()))?;
    let pair = |source| TlsError::Pair {
        cert: paths.cert.clone(),
        key: paths.key.clone(),
        source,
    };
    // from_der checks that the key matches the leaf, which is what makes a torn rotation harmless.
    CertifiedKey::from_der(chain, key, &ring::default_provider()).map_err(pair)
}
