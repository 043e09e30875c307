//! The mounted credentials: `clouds.yaml` (cloud entry `openstack`) and the CA bundle.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

/// The cloud entry of `clouds.yaml` the provider reads (as upstream does).
pub const CLOUD_NAME: &str = "openstack";

/// The credentials file in the secret directory.
pub const CLOUDS_FILE: &str = "clouds.yaml";

/// The CA bundle in the secret directory.
pub const SECRET_CA_FILE: &str = "cacert";

/// The CA bundle in the cloud-config directory, used when the secret holds none.
pub const CONFIG_CA_FILE: &str = "ca-bundle.pem";

/// Why the credentials could not be loaded. Never carries a secret.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `clouds.yaml` is not valid YAML of the expected shape.
    #[error("{}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A required field is missing or the auth type is unknown.
    #[error("{}: cloud \"openstack\": {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// A secret string whose `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the request body only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// A name or an id, as Keystone accepts either for users, projects and domains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameOrId {
    /// Referenced by id.
    Id(String),
    /// Referenced by name (within a domain, for users and projects).
    Name(String),
}

/// How the provider authenticates at Keystone v3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// A user's password, scoped to a project.
    Password {
        /// The user.
        user: NameOrId,
        /// The user's domain (when the user is named).
        user_domain: Option<NameOrId>,
        /// The password.
        password: Secret,
        /// The project the token is scoped to.
        project: NameOrId,
        /// The project's domain (when the project is named).
        project_domain: Option<NameOrId>,
    },
    /// An application credential (its scope is fixed at creation).
    ApplicationCredential {
        /// The credential.
        credential: NameOrId,
        /// Its owner, required when the credential is named.
        user: Option<(NameOrId, Option<NameOrId>)>,
        /// The secret.
        secret: Secret,
    },
}

/// One cloud of `clouds.yaml`, as the provider needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudConfig {
    /// Keystone's URL (with or without the `/v3` suffix).
    pub auth_url: String,
    /// The credentials.
    pub auth: Auth,
    /// The catalog region to take endpoints from (any when absent).
    pub region: Option<String>,
    /// The catalog interface: `public` (default), `internal` or `admin`.
    pub interface: String,
    /// Whether to verify TLS certificates (`verify: false` in clouds.yaml turns it off).
    pub verify: bool,
}

#[derive(Deserialize)]
struct CloudsFile {
    #[serde(default)]
    clouds: HashMap<String, RawCloud>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RawCloud {
    auth: RawAuth,
    auth_type: Option<String>,
    region_name: Option<String>,
    interface: Option<String>,
    endpoint_type: Option<String>,
    verify: Option<bool>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RawAuth {
    auth_url: Option<String>,
    username: Option<String>,
    user_id: Option<String>,
    password: Option<Secret>,
    project_name: Option<String>,
    project_id: Option<String>,
    tenant_name: Option<String>,
    tenant_id: Option<String>,
    user_domain_name: Option<String>,
    user_domain_id: Option<String>,
    project_domain_name: Option<String>,
    project_domain_id: Option<String>,
    domain_name: Option<String>,
    domain_id: Option<String>,
    application_credential_id: Option<String>,
    application_credential_name: Option<String>,
    application_credential_secret: Option<Secret>,
}

fn pick(id: Option<String>, name: Option<String>) -> Option<NameOrId> {
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
    nonempty(id)
        .map(NameOrId::Id)
        .or_else(|| nonempty(name).map(NameOrId::Name))
}

impl CloudConfig {
    /// The `openstack` cloud of `<secret_dir>/clouds.yaml`.
    pub fn load(secret_dir: &Path) -> Result<Self, ConfigError> {
        let path = secret_dir.join(CLOUDS_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&path, &text)
    }

    /// The `openstack` cloud of `text`, read from `path` (named in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let file: CloudsFile = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let invalid = |message: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            message: message.to_owned(),
        };
        let mut clouds = file.clouds;
        let cloud = clouds
            .remove(CLOUD_NAME)
            .ok_or_else(|| invalid("no such cloud under `clouds:`"))?;
        let raw = cloud.auth;
        let auth_url = raw
            .auth_url
            .filter(|u| !u.is_empty())
            .ok_or_else(|| invalid("auth.auth_url is missing"))?;
        let domain = pick(raw.domain_id.clone(), raw.domain_name.clone());
        let user_domain = pick(raw.user_domain_id, raw.user_domain_name).or_else(|| domain.clone());
        let project_domain = pick(raw.project_domain_id, raw.project_domain_name).or(domain);
        let user = pick(raw.user_id, raw.username);
        let auth_type = cloud.auth_type.unwrap_or_else(|| {
            if raw.application_credential_secret.is_some() {
                "v3applicationcredential".into()
            } else {
                "password".into()
            }
        });
        let auth = match auth_type.as_str() {
            "password" | "v3password" => Auth::Password {
                user: user.ok_or_else(|| invalid("auth.username or auth.user_id is missing"))?,
                user_domain,
                password: raw
                    .password
                    .ok_or_else(|| invalid("auth.password is missing"))?,
                project: pick(
                    raw.project_id.or(raw.tenant_id),
                    raw.project_name.or(raw.tenant_name),
                )
                .ok_or_else(|| invalid("auth.project_name or auth.project_id is missing"))?,
                project_domain,
            },
            "v3applicationcredential" | "applicationcredential" => {
                let credential = pick(
                    raw.application_credential_id,
                    raw.application_credential_name,
                )
                .ok_or_else(|| {
                    invalid(
                        "auth.application_credential_id or \
                                 auth.application_credential_name is missing",
                    )
                })?;
                if matches!(credential, NameOrId::Name(_)) && user.is_none() {
                    return Err(invalid(
                        "a named application credential needs auth.username or auth.user_id",
                    ));
                }
                Auth::ApplicationCredential {
                    credential,
                    user: user.map(|u| (u, user_domain)),
                    secret: raw
                        .application_credential_secret
                        .ok_or_else(|| invalid("auth.application_credential_secret is missing"))?,
                }
            }
            other => {
                return Err(invalid(&format!(
                    "auth_type {other:?} is not supported (password, v3applicationcredential)"
                )));
            }
        };
        let interface = cloud
            .interface
            .or(cloud.endpoint_type)
            .map(|i| i.trim_end_matches("URL").to_ascii_lowercase())
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| "public".into());
        Ok(Self {
            auth_url,
            auth,
            region: cloud.region_name.filter(|r| !r.is_empty()),
            interface,
            verify: cloud.verify.unwrap_or(true),
        })
    }
}

/// The CA bundle to trust: `<secret_dir>/cacert`, else `<config_dir>/ca-bundle.pem`; `None` when
/// neither exists or the one found is empty (an empty file means "no custom CA", not an error).
pub fn load_ca(secret_dir: &Path, config_dir: &Path) -> Result<Option<Vec<u8>>, ConfigError> {
    for path in [
        secret_dir.join(SECRET_CA_FILE),
        config_dir.join(CONFIG_CA_FILE),
    ] {
        match std::fs::read(&path) {
            Ok(pem) if pem.iter().all(u8::is_ascii_whitespace) => return Ok(None),
            Ok(pem) => return Ok(Some(pem)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ConfigError::Read { path, source }),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn parse(text: &str) -> Result<CloudConfig, ConfigError> {
        CloudConfig::parse(Path::new("clouds.yaml"), text)
    }

    #[test]
    fn password_auth_with_names_and_domains() {
        let cloud = parse(
            "clouds:\n  other:\n    auth: {auth_url: http://x}\n  openstack:\n    auth:\n      \
             auth_url: https://keystone.example:5000/v3\n      username: egress\n      \
             password: s3cret\n      project_name: cluster\n      user_domain_name: Default\n      \
             project_domain_id: default\n    region_name: RegionTwo\n    interface: internal\n",
        )
        .unwrap();
        assert_eq!(cloud.auth_url, "https://keystone.example:5000/v3");
        assert_eq!(cloud.region.as_deref(), Some("RegionTwo"));
        assert_eq!(cloud.interface, "internal");
        assert!(cloud.verify);
        assert_eq!(
            cloud.auth,
            Auth::Password {
                user: NameOrId::Name("egress".into()),
                user_domain: Some(NameOrId::Name("Default".into())),
                password: "s3cret".into(),
                project: NameOrId::Name("cluster".into()),
                project_domain: Some(NameOrId::Id("default".into())),
            }
        );
        assert!(!format!("{cloud:?}").contains("s3cret"));
    }

    #[test]
    fn application_credential_by_id_needs_no_user_and_defaults_to_public() {
        let cloud = parse(
            "clouds:\n  openstack:\n    auth_type: v3applicationcredential\n    auth:\n      \
             auth_url: http://127.0.0.1:5000\n      application_credential_id: abc123\n      \
             application_credential_secret: shh\n    verify: false\n",
        )
        .unwrap();
        assert_eq!(cloud.interface, "public");
        assert!(!cloud.verify);
        assert_eq!(
            cloud.auth,
            Auth::ApplicationCredential {
                credential: NameOrId::Id("abc123".into()),
                user: None,
                secret: "shh".into(),
            }
        );
        assert!(!format!("{cloud:?}").contains("shh"));
    }

    #[test]
    fn missing_pieces_are_named() {
        let cases = [
            ("clouds: {}\n", "no such cloud"),
            (
                "clouds:\n  openstack:\n    auth: {username: u}\n",
                "auth_url",
            ),
            (
                "clouds:\n  openstack:\n    auth: {auth_url: http://k, username: u, project_name: p}\n",
                "auth.password",
            ),
            (
                "clouds:\n  openstack:\n    auth_type: v3applicationcredential\n    auth: \
                 {auth_url: http://k, application_credential_name: n, application_credential_secret: s}\n",
                "needs auth.username",
            ),
            (
                "clouds:\n  openstack:\n    auth_type: token\n    auth: {auth_url: http://k}\n",
                "not supported",
            ),
        ];
        for (text, needle) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        assert!(matches!(
            parse("clouds: [").unwrap_err(),
            ConfigError::Parse { .. }
        ));
    }

    #[test]
    fn ca_from_the_secret_then_the_config_dir_and_an_empty_file_means_none() {
        let secret = tempdir("secret");
        let config = tempdir("config");
        assert_eq!(load_ca(&secret, &config).unwrap(), None);
        std::fs::write(config.join(CONFIG_CA_FILE), "config-pem").unwrap();
        assert_eq!(
            load_ca(&secret, &config).unwrap().as_deref(),
            Some(&b"config-pem"[..])
        );
        std::fs::write(secret.join(SECRET_CA_FILE), "secret-pem").unwrap();
        assert_eq!(
            load_ca(&secret, &config).unwrap().as_deref(),
            Some(&b"secret-pem"[..])
        );
        std::fs::write(secret.join(SECRET_CA_FILE), "\n").unwrap();
        assert_eq!(load_ca(&secret, &config).unwrap(), None);
        std::fs::remove_dir_all(secret).unwrap();
        std::fs::remove_dir_all(config).unwrap();
    }

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "cloudnet-openstack-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
