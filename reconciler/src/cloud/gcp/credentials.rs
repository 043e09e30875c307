//! GCP credentials as upstream reads them, first found wins:
//! `<secret dir>/workload_identity_config.json` (an external account, e.g. workload identity
//! federation), `<secret dir>/service_account.json`, then the file `$GOOGLE_APPLICATION_CREDENTIALS`
//! names. The JSON's `type` picks the kind. A missing `universe_domain` is set to
//! `googleapis.com`: without it the client would ask the metadata server, which a pod on a
//! cluster without GCE metadata access cannot reach. Contents are never logged.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use google_cloud_auth::credentials::Credentials;
use thiserror::Error;

/// External account (workload identity) configuration in the secret directory.
pub const WORKLOAD_IDENTITY_FILE: &str = "workload_identity_config.json";
/// Service account key in the secret directory.
pub const SERVICE_ACCOUNT_FILE: &str = "service_account.json";
/// The variable naming a credentials file when the secret directory has none.
pub const ENV_VAR: &str = "GOOGLE_APPLICATION_CREDENTIALS";
/// The universe set when the file names none.
pub const DEFAULT_UNIVERSE: &str = "googleapis.com";

/// Why no credentials could be built.
#[derive(Debug, Error)]
pub enum CredentialsError {
    /// None of the places held a file.
    #[error("no GCP credentials found; tried {}", .tried.join(", "))]
    NotFound {
        /// Each place and why it did not serve.
        tried: Vec<String>,
    },
    /// A file was there but could not be read.
    #[error("reading GCP credentials {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file was there but is not a credentials JSON we can use.
    #[error("GCP credentials {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the file's contents).
        reason: String,
    },
}

/// A credentials file found, with its JSON (universe domain already set).
#[derive(Clone)]
pub struct CredentialsFile {
    /// Where it was found.
    pub path: PathBuf,
    /// Its `type`.
    pub kind: String,
    json: serde_json::Value,
}

impl std::fmt::Debug for CredentialsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialsFile")
            .field("path", &self.path)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl CredentialsFile {
    /// The first credentials file in upstream's order: the two files in `secret_dir`, then the
    /// file `env` (the value of `$GOOGLE_APPLICATION_CREDENTIALS`, passed in so tests need not
    /// touch the process environment) names.
    pub fn find(secret_dir: &Path, env: Option<&OsStr>) -> Result<Self, CredentialsError> {
        let mut tried = Vec::new();
        for name in [WORKLOAD_IDENTITY_FILE, SERVICE_ACCOUNT_FILE] {
            let path = secret_dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => return Self::parse(path, &bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    tried.push(format!("{} (absent)", path.display()));
                }
                Err(source) => return Err(CredentialsError::Read { path, source }),
            }
        }
        match env.filter(|v| !v.is_empty()) {
            None => tried.push(format!("${ENV_VAR} (unset)")),
            Some(value) => {
                let path = PathBuf::from(value);
                match std::fs::read(&path) {
                    Ok(bytes) => return Self::parse(path, &bytes),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        tried.push(format!("${ENV_VAR}={} (absent)", path.display()));
                    }
                    Err(source) => return Err(CredentialsError::Read { path, source }),
                }
            }
        }
        Err(CredentialsError::NotFound { tried })
    }

    fn parse(path: PathBuf, bytes: &[u8]) -> Result<Self, CredentialsError> {
        let invalid = |reason: &str| CredentialsError::Invalid {
            path: path.clone(),
            reason: reason.to_owned(),
        };
        let mut json: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|_| invalid("not valid JSON"))?;
        let object = json
            .as_object_mut()
            .ok_or_else(|| invalid("not a JSON object"))?;
        let kind = object
            .get("type")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| invalid("no \"type\" field"))?
            .to_owned();
        if !matches!(
            kind.as_str(),
            "service_account" | "external_account" | "authorized_user"
        ) {
            return Err(invalid(&format!(
                "type {kind:?} is not one of service_account, external_account, authorized_user"
            )));
        }
        object
            .entry("universe_domain")
            .or_insert_with(|| DEFAULT_UNIVERSE.into());
        Ok(Self { path, kind, json })
    }

    /// The universe domain the file (or our default) names.
    pub fn universe_domain(&self) -> Option<&str> {
        self.json["universe_domain"].as_str()
    }

    /// Credentials for the client library; call it within a Tokio runtime (the library spawns
    /// its token cache at once).
    pub fn build(&self) -> Result<Credentials, CredentialsError> {
        use google_cloud_auth::credentials::{external_account, service_account, user_account};
        let json = self.json.clone();
        let built = match self.kind.as_str() {
            "service_account" => service_account::Builder::new(json).build(),
            "external_account" => external_account::Builder::new(json).build(),
            _ => user_account::Builder::new(json).build(),
        };
        built.map_err(|e| CredentialsError::Invalid {
            path: self.path.clone(),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn write(dir: &Path, name: &str, json: &serde_json::Value) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, json.to_string()).unwrap();
        path
    }

    fn external() -> serde_json::Value {
        serde_json::json!({"type": "external_account", "audience": "a",
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "token_url": "https://sts.googleapis.com/v1/token",
            "credential_source": {"file": "/var/run/secrets/token"}})
    }

    fn user() -> serde_json::Value {
        serde_json::json!({"type": "authorized_user", "client_id": "c",
            "client_secret": "s", "refresh_token": "r"})
    }

    #[test]
    fn workload_identity_wins_over_service_account_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let env_file = write(dir.path(), "env.json", &user());
        write(dir.path(), SERVICE_ACCOUNT_FILE, &user());
        write(dir.path(), WORKLOAD_IDENTITY_FILE, &external());
        let found = CredentialsFile::find(dir.path(), Some(env_file.as_os_str())).unwrap();
        assert_eq!(found.path, dir.path().join(WORKLOAD_IDENTITY_FILE));
        assert_eq!(found.kind, "external_account");
    }

    #[test]
    fn service_account_file_comes_before_the_env_var() {
        let dir = tempfile::tempdir().unwrap();
        let env_file = write(dir.path(), "env.json", &external());
        write(dir.path(), SERVICE_ACCOUNT_FILE, &user());
        let found = CredentialsFile::find(dir.path(), Some(env_file.as_os_str())).unwrap();
        assert_eq!(found.path, dir.path().join(SERVICE_ACCOUNT_FILE));
    }

    // Building credentials starts their token cache, a Tokio task.
    #[tokio::test]
    async fn the_env_var_is_the_last_resort() {
        let dir = tempfile::tempdir().unwrap();
        let env_file = write(dir.path(), "env.json", &user());
        let found = CredentialsFile::find(dir.path(), Some(env_file.as_os_str())).unwrap();
        assert_eq!(found.path, env_file);
        assert!(found.build().is_ok());
    }

    #[test]
    fn nothing_found_names_every_place_tried() {
        let dir = tempfile::tempdir().unwrap();
        let e = CredentialsFile::find(dir.path(), None)
            .unwrap_err()
            .to_string();
        for part in [WORKLOAD_IDENTITY_FILE, SERVICE_ACCOUNT_FILE, ENV_VAR] {
            assert!(e.contains(part), "{e} should name {part}");
        }
        let missing = dir.path().join("nope.json");
        let e = CredentialsFile::find(dir.path(), Some(missing.as_os_str()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.json"), "{e}");
    }

    #[test]
    fn universe_domain_is_added_when_missing_and_kept_when_set() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), SERVICE_ACCOUNT_FILE, &user());
        let found = CredentialsFile::find(dir.path(), None).unwrap();
        assert_eq!(found.universe_domain(), Some(DEFAULT_UNIVERSE));
        let mut own = user();
        own["universe_domain"] = "example.test".into();
        write(dir.path(), SERVICE_ACCOUNT_FILE, &own);
        let found = CredentialsFile::find(dir.path(), None).unwrap();
        assert_eq!(found.universe_domain(), Some("example.test"));
    }

    #[test]
    fn a_broken_file_is_an_error_not_a_fall_through() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(WORKLOAD_IDENTITY_FILE), "{not json").unwrap();
        write(dir.path(), SERVICE_ACCOUNT_FILE, &user());
        let e = CredentialsFile::find(dir.path(), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(WORKLOAD_IDENTITY_FILE) && e.contains("not valid JSON"),
            "{e}"
        );
        std::fs::write(
            dir.path().join(WORKLOAD_IDENTITY_FILE),
            r#"{"type":"x","private_key":"SECRET"}"#,
        )
        .unwrap();
        let e = CredentialsFile::find(dir.path(), None)
            .unwrap_err()
            .to_string();
        assert!(!e.contains("SECRET"), "{e}");
    }
}
