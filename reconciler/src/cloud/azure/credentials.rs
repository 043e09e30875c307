//! Azure credentials from the mounted secret directory (SPEC §2.5), read as upstream reads them:
//! each of `azure_client_id`, `azure_tenant_id`, `azure_client_secret`,
//! `azure_federated_token_file`, `azure_subscription_id` and `azure_resourcegroup` is a file in
//! the directory, falling back to the `AZURE_*` environment variable of the same name. A client
//! secret wins over a federated token file (workload identity, as the cloud credential operator
//! writes it in short-lived-token mode), as upstream's getAzureCredentials
//! (pkg/cloudprovider/azure.go) decides: the token file is used only when no secret is set.
//! Above both, as upstream: ARO-HCP's user-assigned identity file, when
//! `ARO_HCP_CLIENT_CREDENTIALS_PATH` names one (its client and tenant ids then come from it).
//! Unlike upstream, no usable credential is an error at start, not a process that runs with none.

use std::path::{Path, PathBuf};

use thiserror::Error;

pub use super::super::aws::Secret;

/// File (and, upper-cased, environment variable) holding the application (client) id.
pub const CLIENT_ID: &str = "azure_client_id";
/// File holding the tenant id.
pub const TENANT_ID: &str = "azure_tenant_id";
/// File holding the client secret.
pub const CLIENT_SECRET: &str = "azure_client_secret";
/// File holding the path of the federated (projected service account) token.
pub const FEDERATED_TOKEN_FILE: &str = "azure_federated_token_file";
/// File holding the subscription id.
pub const SUBSCRIPTION_ID: &str = "azure_subscription_id";
/// File holding the cluster's resource group.
pub const RESOURCE_GROUP: &str = "azure_resourcegroup";

/// How the provider gets its ARM tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AzureAuth {
    /// A service principal's client secret.
    ClientSecret(Secret),
    /// Workload identity: a federated token read afresh from this file at every exchange (it
    /// rotates).
    FederatedTokenFile(PathBuf),
    /// ARO-HCP's user-assigned identity: the managed identity service's credentials file (a
    /// certificate), read again when a token is needed ([`super::user_assigned`]).
    UserAssignedIdentity(PathBuf),
}

/// What the secret directory and the environment say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AzureCredentials {
    /// The application (client) id.
    pub client_id: String,
    /// The tenant id.
    pub tenant_id: String,
    /// The secret or the token file.
    pub auth: AzureAuth,
    /// The subscription, when given (the providerIDs carry it too).
    pub subscription_id: Option<String>,
    /// The cluster's resource group, when given (the providerIDs carry the VMs' own).
    pub resource_group: Option<String>,
}

/// The credentials could not be read or are incomplete.
#[derive(Debug, Error)]
pub enum CredentialsError {
    /// A file exists but cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A required value is in neither place.
    #[error(
        "no Azure credential can be built: {name} is missing (neither the file {dir}/{name} nor ${env} is set)"
    )]
    Missing {
        /// The file name.
        name: &'static str,
        /// The environment variable.
        env: String,
        /// The secret directory.
        dir: String,
    },
    /// ARO-HCP's identity file is unusable.
    #[error("{0} (named by ${env})", env = super::user_assigned::CREDENTIALS_PATH_ENV)]
    IdentityFile(#[from] super::user_assigned::IdentityFileError),
    /// Neither a secret nor a federated token file.
    #[error(
        "no Azure credential can be built: set {dir}/azure_client_secret (service principal) or {dir}/azure_federated_token_file (workload identity), or $AZURE_CLIENT_SECRET / $AZURE_FEDERATED_TOKEN_FILE"
    )]
    NoSecret {
        /// The secret directory.
        dir: String,
    },
}

/// Where a value came from; the environment is read through `env` so tests need not touch the
/// process environment.
fn lookup(
    dir: &Path,
    name: &'static str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, CredentialsError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let value = text.trim();
            if !value.is_empty() {
                return Ok(Some(value.to_owned()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(CredentialsError::Read { path, source }),
    }
    Ok(env(&name.to_ascii_uppercase())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty()))
}

impl AzureCredentials {
    /// Reads the credentials from `dir`, falling back to `env`.
    pub fn from_dir_and(
        dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, CredentialsError> {
        let missing = |name: &'static str| CredentialsError::Missing {
            name,
            env: name.to_ascii_uppercase(),
            dir: dir.display().to_string(),
        };
        let identity_file = env(super::user_assigned::CREDENTIALS_PATH_ENV)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty());
        if let Some(path) = identity_file {
            // Upstream reads this file at start to fail early; its ids are the identity's.
            let path = PathBuf::from(path);
            let identity = super::user_assigned::IdentityFile::read(&path)?;
            return Ok(Self {
                client_id: identity.client_id,
                tenant_id: identity.tenant_id,
                auth: AzureAuth::UserAssignedIdentity(path),
                subscription_id: lookup(dir, SUBSCRIPTION_ID, env)?,
                resource_group: lookup(dir, RESOURCE_GROUP, env)?,
            });
        }
        let token_file = lookup(dir, FEDERATED_TOKEN_FILE, env)?;
        let secret = lookup(dir, CLIENT_SECRET, env)?;
        let auth = match (secret, token_file) {
            (Some(secret), _) => AzureAuth::ClientSecret(Secret::new(secret)),
            (None, Some(file)) => AzureAuth::FederatedTokenFile(PathBuf::from(file)),
            (None, None) => {
                return Err(CredentialsError::NoSecret {
                    dir: dir.display().to_string(),
                });
            }
        };
        Ok(Self {
            client_id: lookup(dir, CLIENT_ID, env)?.ok_or_else(|| missing(CLIENT_ID))?,
            tenant_id: lookup(dir, TENANT_ID, env)?.ok_or_else(|| missing(TENANT_ID))?,
            auth,
            subscription_id: lookup(dir, SUBSCRIPTION_ID, env)?,
            resource_group: lookup(dir, RESOURCE_GROUP, env)?,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::HashMap;

    use super::*;

    fn write(dir: &Path, name: &str, value: &str) {
        std::fs::write(dir.join(name), value).unwrap();
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn files_win_over_the_environment_and_are_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), CLIENT_ID, "app-from-file\n");
        write(dir.path(), TENANT_ID, "tenant");
        write(dir.path(), CLIENT_SECRET, "s3cret\n");
        let creds = AzureCredentials::from_dir_and(
            dir.path(),
            &env(&[
                ("AZURE_CLIENT_ID", "app-from-env"),
                ("AZURE_RESOURCEGROUP", "rg-env"),
            ]),
        )
        .unwrap();
        assert_eq!(creds.client_id, "app-from-file");
        assert_eq!(creds.auth, AzureAuth::ClientSecret(Secret::new("s3cret")));
        assert_eq!(creds.resource_group.as_deref(), Some("rg-env"));
        assert!(!format!("{creds:?}").contains("s3cret"));
    }

    #[test]
    fn a_client_secret_wins_over_a_federated_token_file_as_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let vars = [
            ("AZURE_CLIENT_ID", "app"),
            ("AZURE_TENANT_ID", "tenant"),
            ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token"),
        ];
        // The token file alone: workload identity.
        let creds = AzureCredentials::from_dir_and(dir.path(), &env(&vars)).unwrap();
        assert_eq!(
            creds.auth,
            AzureAuth::FederatedTokenFile("/var/run/token".into())
        );
        // Both: the secret, as upstream's getAzureCredentials (pkg/cloudprovider/azure.go)
        // takes the token file only when the secret is blank.
        write(dir.path(), CLIENT_SECRET, "s3cret");
        let creds = AzureCredentials::from_dir_and(dir.path(), &env(&vars)).unwrap();
        assert_eq!(creds.auth, AzureAuth::ClientSecret(Secret::new("s3cret")));
    }

    #[test]
    fn aro_hcps_identity_file_wins_over_a_secret_and_brings_its_own_ids() {
        use base64::Engine;
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), CLIENT_ID, "app-from-secret");
        write(dir.path(), TENANT_ID, "tenant-from-secret");
        write(dir.path(), CLIENT_SECRET, "s3cret");
        write(dir.path(), SUBSCRIPTION_ID, "sub");
        let pfx = include_bytes!("../../../../e2e-kind/azure/aro-hcp-identity.pfx");
        let file = dir.path().join("identity.json");
        let json = serde_json::json!({
            "authentication_endpoint": "https://login.microsoftonline.com/",
            "client_id": "identity-app",
            "tenant_id": "identity-tenant",
            "client_secret": base64::engine::general_purpose::STANDARD.encode(pfx),
            "not_before": "2026-01-01T00:00:00Z",
        });
        std::fs::write(&file, json.to_string()).unwrap();
        let path = file.display().to_string();
        let vars = [("ARO_HCP_CLIENT_CREDENTIALS_PATH", path.as_str())];
        let creds = AzureCredentials::from_dir_and(dir.path(), &env(&vars)).unwrap();
        assert_eq!(creds.auth, AzureAuth::UserAssignedIdentity(file.clone()));
        assert_eq!(creds.client_id, "identity-app");
        assert_eq!(creds.tenant_id, "identity-tenant");
        assert_eq!(creds.subscription_id.as_deref(), Some("sub"));
        // Blank: the secret, as upstream ignores an empty variable.
        let creds = AzureCredentials::from_dir_and(
            dir.path(),
            &env(&[("ARO_HCP_CLIENT_CREDENTIALS_PATH", " ")]),
        )
        .unwrap();
        assert_eq!(creds.auth, AzureAuth::ClientSecret(Secret::new("s3cret")));
        // Set but unreadable: an error naming the variable, not a fallback to the secret.
        let missing = [(
            "ARO_HCP_CLIENT_CREDENTIALS_PATH",
            "/nonexistent/identity.json",
        )];
        let err = AzureCredentials::from_dir_and(dir.path(), &env(&missing)).unwrap_err();
        assert!(
            err.to_string().contains("ARO_HCP_CLIENT_CREDENTIALS_PATH"),
            "{err}"
        );
    }

    #[test]
    fn no_credential_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = AzureCredentials::from_dir_and(dir.path(), &env(&[])).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("no Azure credential can be built"), "{text}");
        assert!(
            text.contains("azure_client_secret") && text.contains("AZURE_FEDERATED_TOKEN_FILE")
        );
        write(dir.path(), CLIENT_SECRET, "s");
        let err = AzureCredentials::from_dir_and(dir.path(), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("azure_client_id"), "{err}");
        assert!(!err.to_string().contains("\"s\""));
    }
}
