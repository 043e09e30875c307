//! ARO-HCP's user-assigned identity: when `ARO_HCP_CLIENT_CREDENTIALS_PATH` names a file, upstream
//! authenticates with it alone (msi-dataplane's `NewUserAssignedIdentityCredential`), and so does
//! this module.
//!
//! The file is the managed identity service's `UserAssignedIdentityCredentials` JSON:
//! `client_id`, `tenant_id`, `authentication_endpoint` (the token authority, possibly regional),
//! `not_before`, and `client_secret`, the base64 of a certificate with its private key (PKCS#12
//! without a password, or PEM). Tokens are asked for as a certificate credential does: a JWT
//! client assertion signed with the key (RS256), its header carrying the certificate's SHA-1
//! thumbprint (`x5t`) and chain (`x5c`, upstream's `SendCertificateChain`), posted to
//! `<authentication_endpoint>/<tenant>/oauth2/v2.0/token`. The file is rotated in place: it is
//! read again whenever a token is needed, and a credential whose `not_before` is newer than the
//! one in use replaces it (upstream's reloader, which watches the file, keeps the same rule).
//!
//! Why the assertion is signed here: azure_identity's certificate credential (feature
//! `client_certificate`) links OpenSSL, which the static images do not carry; ring (already
//! built for rustls) signs the PKCS#8 key that `p12-keystore` yields, and the JWT around it is
//! two base64 JSON parts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::{AccessToken, TokenCredential};
use azure_core::error::{Error, ErrorKind};
use azure_core::{HttpClient, Url};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use thiserror::Error;
use tokio::sync::Mutex;

/// The variable naming the credentials file (upstream's).
pub const CREDENTIALS_PATH_ENV: &str = "ARO_HCP_CLIENT_CREDENTIALS_PATH";

/// How long before its expiry an access token is replaced.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// How long a client assertion is valid (MSAL's ten minutes).
const ASSERTION_LIFETIME: Duration = Duration::from_secs(600);

/// Why the credentials file cannot be used.
#[derive(Debug, Error)]
pub enum IdentityFileError {
    /// The file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not the credentials JSON, or lacks a field.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the secret itself).
        message: String,
    },
}

/// The file as the managed identity service writes it (the fields upstream reads).
#[derive(Deserialize)]
struct CredentialsJson {
    client_id: Option<String>,
    tenant_id: Option<String>,
    client_secret: Option<String>,
    authentication_endpoint: Option<String>,
    not_before: Option<String>,
}

/// One version of the credentials file, ready to sign with.
pub struct IdentityFile {
    /// The identity's application (client) id.
    pub client_id: String,
    /// Its tenant.
    pub tenant_id: String,
    /// Where its tokens come from.
    pub authority: Url,
    /// When this certificate became valid, as the file says (RFC 3339).
    pub not_before: Option<time::OffsetDateTime>,
    key: RsaKeyPair,
    /// The chain's DER, leaf first.
    chain: Vec<Vec<u8>>,
}

impl std::fmt::Debug for IdentityFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityFile")
            .field("client_id", &self.client_id)
            .field("tenant_id", &self.tenant_id)
            .field("authority", &self.authority.as_str())
            .field("not_before", &self.not_before)
            .finish_non_exhaustive()
    }
}

impl IdentityFile {
    /// Reads and checks the file at `path`.
    pub fn read(path: &Path) -> Result<Self, IdentityFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| IdentityFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Checks the file `path` holding `text`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, IdentityFileError> {
        let invalid = |message: String| IdentityFileError::Invalid {
            path: path.to_owned(),
            message,
        };
        let json: CredentialsJson = serde_json::from_str(text)
            .map_err(|e| invalid(format!("not the identity's credentials JSON: {e}")))?;
        let required = |value: Option<String>, name: &str| {
            value
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| invalid(format!("{name} is missing")))
        };
        let client_id = required(json.client_id, "client_id")?;
        let tenant_id = required(json.tenant_id, "tenant_id")?;
        let endpoint = required(json.authentication_endpoint, "authentication_endpoint")?;
        let secret = required(json.client_secret, "client_secret")?;
        let authority = Url::parse(&endpoint)
            .map_err(|_| invalid(format!("authentication_endpoint {endpoint:?} is not a URL")))?;
        let not_before = json
            .not_before
            .filter(|v| !v.trim().is_empty())
            .map(|v| {
                time::OffsetDateTime::parse(
                    v.trim(),
                    &time::format_description::well_known::Rfc3339,
                )
                .map_err(|e| invalid(format!("not_before {v:?}: {e}")))
            })
            .transpose()?;
        let bundle = STANDARD
            .decode(secret.as_bytes())
            .map_err(|_| invalid("client_secret is not base64".into()))?;
        let (key, chain) = certificate_and_key(&bundle).map_err(invalid)?;
        Ok(Self {
            client_id,
            tenant_id,
            authority,
            not_before,
            key,
            chain,
        })
    }

    /// The token endpoint of this identity.
    pub fn token_url(&self) -> Result<Url, String> {
        self.authority
            .join(&format!("/{}/oauth2/v2.0/token", self.tenant_id))
            .map_err(|e| format!("token URL for tenant {}: {e}", self.tenant_id))
    }

    /// A client assertion for `audience` (the token endpoint), valid from `now`.
    pub fn assertion(&self, audience: &str, now: time::OffsetDateTime) -> Result<String, String> {
        let leaf = self.chain.first().ok_or("no certificate")?;
        let thumbprint = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, leaf);
        let header = serde_json::json!({
            "alg": "RS256",
            "typ": "JWT",
            "x5t": URL_SAFE_NO_PAD.encode(thumbprint.as_ref()),
            "x5c": self.chain.iter().map(|c| STANDARD.encode(c)).collect::<Vec<_>>(),
        });
        let rng = SystemRandom::new();
        let mut id = [0u8; 16];
        rng.fill(&mut id)
            .map_err(|_| "no randomness for the assertion id")?;
        let issued = now.unix_timestamp();
        let lifetime = i64::try_from(ASSERTION_LIFETIME.as_secs()).unwrap_or(600);
        let claims = serde_json::json!({
            "aud": audience,
            "iss": self.client_id,
            "sub": self.client_id,
            "jti": id.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "nbf": issued,
            "iat": issued,
            "exp": issued + lifetime,
        });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &rng, signed.as_bytes(), &mut signature)
            .map_err(|_| "signing the client assertion failed")?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }
}

/// The RSA key and certificate chain (leaf first) in `bundle`: PEM, or PKCS#12 without a
/// password (as azidentity's `ParseCertificates` takes them).
fn certificate_and_key(bundle: &[u8]) -> Result<(RsaKeyPair, Vec<Vec<u8>>), String> {
    if bundle.windows(11).any(|w| w == b"-----BEGIN ") {
        let chain: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(bundle)
            .filter_map(Result::ok)
            .map(|c| c.as_ref().to_vec())
            .collect();
        let key = PrivateKeyDer::from_pem_slice(bundle)
            .map_err(|_| "client_secret holds no PEM private key".to_owned())?;
        let key = match &key {
            PrivateKeyDer::Pkcs8(der) => RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()),
            PrivateKeyDer::Pkcs1(der) => RsaKeyPair::from_der(der.secret_pkcs1_der()),
            _ => return Err("client_secret's private key is not RSA".into()),
        }
        .map_err(|e| format!("client_secret's private key: {e}"))?;
        if chain.is_empty() {
            return Err("client_secret holds no PEM certificate".into());
        }
        return Ok((key, chain));
    }
    let store =
        p12_keystore::KeyStore::from_pkcs12(bundle, "", p12_keystore::Pkcs12ImportPolicy::Relaxed)
            .map_err(|e| {
                format!("client_secret is neither PEM nor a PKCS#12 without password: {e}")
            })?;
    let (_, chain) = store
        .private_key_chain()
        .ok_or("client_secret's PKCS#12 holds no private key")?;
    let key = RsaKeyPair::from_pkcs8(chain.key().as_der())
        .map_err(|e| format!("client_secret's private key: {e}"))?;
    let certs: Vec<Vec<u8>> = chain.certs().iter().map(|c| c.as_der().to_vec()).collect();
    if certs.is_empty() {
        return Err("client_secret's PKCS#12 holds no certificate for its key".into());
    }
    Ok((key, certs))
}

/// A token credential over the credentials file at `path`.
#[derive(Debug)]
pub struct UserAssignedIdentityCredential {
    http: Arc<dyn HttpClient>,
    path: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    identity: Option<Arc<IdentityFile>>,
    token: Option<(String, AccessToken)>,
}

impl UserAssignedIdentityCredential {
    /// A credential reading `path`, starting from `identity` (the file as read at start).
    pub fn new(http: Arc<dyn HttpClient>, path: PathBuf, identity: IdentityFile) -> Self {
        Self {
            http,
            path,
            state: Mutex::new(State {
                identity: Some(Arc::new(identity)),
                token: None,
            }),
        }
    }

    /// The identity to sign with: the file as it is now if its certificate is newer than the one
    /// in use (or none is), else the one in use.
    fn current(&self, state: &mut State) -> Result<Arc<IdentityFile>, Error> {
        match (IdentityFile::read(&self.path), state.identity.as_ref()) {
            (Ok(fresh), Some(used)) if !is_newer(&fresh, used) => Ok(Arc::clone(used)),
            (Ok(fresh), _) => {
                let fresh = Arc::new(fresh);
                state.identity = Some(Arc::clone(&fresh));
                Ok(fresh)
            }
            (Err(e), Some(used)) => {
                tracing::warn!(error = %e, "re-reading ARO-HCP's identity credentials failed; keeping the ones in use");
                Ok(Arc::clone(used))
            }
            (Err(e), None) => Err(Error::with_message(ErrorKind::Credential, || e.to_string())),
        }
    }
}

/// Whether `fresh` replaces `used`: its `not_before` is later (upstream's rule).
fn is_newer(fresh: &IdentityFile, used: &IdentityFile) -> bool {
    match (fresh.not_before, used.not_before) {
        (Some(fresh), Some(used)) => fresh > used,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[async_trait::async_trait]
impl TokenCredential for UserAssignedIdentityCredential {
    async fn get_token(&self, scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let key = scopes.join(" ");
        let mut state = self.state.lock().await;
        if let Some((scope, token)) = state.token.as_ref() {
            let left = token.expires_on.unix_timestamp()
                - time::OffsetDateTime::now_utc().unix_timestamp();
            if *scope == key && left > i64::try_from(REFRESH_MARGIN.as_secs()).unwrap_or(0) {
                return Ok(token.clone());
            }
        }
        let identity = self.current(&mut state)?;
        let credential = |message: String| Error::with_message(ErrorKind::Credential, || message);
        let url = identity.token_url().map_err(credential)?;
        let assertion = identity
            .assertion(url.as_str(), time::OffsetDateTime::now_utc())
            .map_err(credential)?;
        // The certificate credential's request is the federated one's with our own assertion.
        let answer = azure_identity::federated_credentials_flow::perform(
            Arc::clone(&self.http),
            &identity.client_id,
            &assertion,
            scopes,
            &identity.tenant_id,
            &identity.authority,
        )
        .await?;
        let expires_on = time::OffsetDateTime::now_utc() + Duration::from_secs(answer.expires_in);
        let token = AccessToken::new(answer.access_token().secret().to_owned(), expires_on);
        state.token = Some((key, token.clone()));
        Ok(token)
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        self.state.lock().await.token = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The test identity's certificate and key as Azure's managed identity service issues
    /// them: PKCS#12, no password, RC2/3DES with a SHA-1 MAC (see `e2e-kind/azure/README.md`).
    const PFX: &[u8] = include_bytes!("../../../../e2e-kind/azure/aro-hcp-identity.pfx");
    const CERT: &[u8] = include_bytes!("../../../../e2e-kind/azure/aro-hcp-identity.crt.der");

    fn file(secret: &str, not_before: &str) -> String {
        serde_json::json!({
            "authentication_endpoint": "https://login.microsoftonline.com/",
            "client_id": "11111111-0000-0000-0000-000000000001",
            "tenant_id": "22222222-0000-0000-0000-000000000002",
            "client_secret": secret,
            "not_before": not_before,
            "not_after": "2099-01-01T00:00:00Z",
            "renew_after": "2098-01-01T00:00:00Z",
            "cannot_renew_after": "2099-01-01T00:00:00Z",
            "object_id": "33333333-0000-0000-0000-000000000003",
        })
        .to_string()
    }

    fn decode(part: &str) -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn a_legacy_pkcs12_identity_signs_an_assertion_with_its_thumbprint_and_chain() {
        let text = file(&STANDARD.encode(PFX), "2026-01-01T00:00:00Z");
        let identity = IdentityFile::parse(Path::new("creds.json"), &text).unwrap();
        assert_eq!(identity.client_id, "11111111-0000-0000-0000-000000000001");
        let url = identity.token_url().unwrap();
        assert_eq!(
            url.as_str(),
            "https://login.microsoftonline.com/22222222-0000-0000-0000-000000000002/oauth2/v2.0/token"
        );
        let now = time::OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let jwt = identity.assertion(url.as_str(), now).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header = decode(parts[0]);
        assert_eq!(header["alg"], "RS256");
        let thumbprint = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, CERT);
        assert_eq!(header["x5t"], URL_SAFE_NO_PAD.encode(thumbprint.as_ref()));
        assert_eq!(header["x5c"][0], STANDARD.encode(CERT));
        let claims = decode(parts[1]);
        assert_eq!(claims["aud"], url.as_str());
        assert_eq!(claims["iss"], identity.client_id.as_str());
        assert_eq!(claims["sub"], identity.client_id.as_str());
        assert_eq!(claims["exp"], 1_800_000_600);
        assert!(!format!("{identity:?}").contains(&STANDARD.encode(PFX)[..40]));
    }

    #[test]
    fn a_newer_not_before_replaces_the_identity_in_use_and_an_older_does_not() {
        let secret = STANDARD.encode(PFX);
        let at = |t: &str| IdentityFile::parse(Path::new("c"), &file(&secret, t)).unwrap();
        let used = at("2026-01-01T00:00:00Z");
        assert!(is_newer(&at("2026-02-01T00:00:00Z"), &used));
        assert!(!is_newer(&at("2026-01-01T00:00:00Z"), &used));
        assert!(!is_newer(&at("2025-12-01T00:00:00Z"), &used));
    }

    #[test]
    fn a_broken_file_names_what_is_wrong_and_never_the_secret() {
        for (text, expected) in [
            ("{}".to_owned(), "client_id is missing"),
            ("not json".to_owned(), "not the identity's credentials JSON"),
            (
                file("!!!not-base64!!!", "2026-01-01T00:00:00Z"),
                "not base64",
            ),
            (
                file(&STANDARD.encode(b"garbage"), "2026-01-01T00:00:00Z"),
                "neither PEM nor",
            ),
            (file(&STANDARD.encode(PFX), "yesterday"), "not_before"),
        ] {
            let err = IdentityFile::parse(Path::new("creds.json"), &text).unwrap_err();
            let message = err.to_string();
            assert!(message.contains(expected), "{message}");
            assert!(message.contains("creds.json"), "{message}");
            assert!(!message.contains("!!!not-base64"), "{message}");
        }
    }
}
