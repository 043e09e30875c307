//! AWS credentials from the mounted secret directory (SPEC §2.5), read as upstream reads them:
//! a shared `credentials` file, when present, wins; its `[default]` profile holds either keys
//! (`aws_access_key_id`, `aws_secret_access_key`, optional `aws_session_token`) or an STS
//! web-identity role (`role_arn` + `web_identity_token_file`, optional `role_session_name`), as
//! the cloud credential operator writes it in STS mode. Without that file, the two files
//! `aws_access_key_id` and `aws_secret_access_key` hold the keys. Nothing here ever prints a
//! secret; the token file is only named, and read afresh at every exchange (it rotates).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

/// File holding the access key id.
pub const ACCESS_KEY_FILE: &str = "aws_access_key_id";
/// File holding the secret access key.
pub const SECRET_KEY_FILE: &str = "aws_secret_access_key";
/// Shared credentials file; when present it wins over the two key files.
pub const SHARED_FILE: &str = "credentials";

/// A value that must never reach a log, an event or a status message.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for handing to the SDK only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Static AWS credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsCredentials {
    /// The access key id (not secret on its own, but kept out of logs anyway).
    pub access_key_id: Secret,
    /// The secret access key.
    pub secret_access_key: Secret,
    /// A session token, from a shared file with temporary credentials.
    pub session_token: Option<Secret>,
}

/// An IAM role assumed with a web identity token (`AssumeRoleWithWebIdentity`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebIdentity {
    /// The role's ARN (`arn:aws:iam::<account>:role/<name>`).
    pub role_arn: String,
    /// The file holding the token (a projected service account token); read at every exchange.
    pub token_file: PathBuf,
    /// The role session name; `None` lets each exchange name itself, as upstream does.
    pub session_name: Option<String>,
    /// The session length to ask STS for; `None` takes the role's default (one hour).
    pub duration: Option<Duration>,
}

/// Where the provider's credentials come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialSource {
    /// Fixed keys.
    Static(AwsCredentials),
    /// Temporary keys from STS for a web identity, renewed before they expire.
    WebIdentity(WebIdentity),
}

impl From<AwsCredentials> for CredentialSource {
    fn from(credentials: AwsCredentials) -> Self {
        Self::Static(credentials)
    }
}

impl From<WebIdentity> for CredentialSource {
    fn from(identity: WebIdentity) -> Self {
        Self::WebIdentity(identity)
    }
}

/// Why no credentials could be read. Names files and keys, never their contents.
#[derive(Debug, Error)]
pub enum CredentialsError {
    /// Neither layout is present.
    #[error(
        "no AWS credentials in {dir}: expected a {SHARED_FILE} file, or files {ACCESS_KEY_FILE} and {SECRET_KEY_FILE}"
    )]
    Missing {
        /// The directory searched.
        dir: PathBuf,
    },
    /// Only one of the two key files is present.
    #[error("AWS credentials in {dir}: {present} is present but {missing} is not")]
    Incomplete {
        /// The directory searched.
        dir: PathBuf,
        /// The file found.
        present: &'static str,
        /// The file not found.
        missing: &'static str,
    },
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file or key is empty or absent.
    #[error("AWS credentials in {path}: {what} is missing or empty")]
    Empty {
        /// The file.
        path: PathBuf,
        /// The key or file that is empty.
        what: &'static str,
    },
    /// The profile asks for a way of getting credentials this controller does not implement.
    #[error(
        "AWS credentials in {path}: [default] sets {key}, which is not supported; use keys, or role_arn with web_identity_token_file"
    )]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The key that asks for it.
        key: &'static str,
    },
}

impl CredentialSource {
    /// Reads the credentials from the mounted secret directory `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, CredentialsError> {
        let shared = dir.join(SHARED_FILE);
        if shared.is_file() {
            return parse_shared(&read(&shared)?, &shared);
        }
        let access = dir.join(ACCESS_KEY_FILE);
        let secret = dir.join(SECRET_KEY_FILE);
        match (access.is_file(), secret.is_file()) {
            (true, true) => Ok(Self::Static(AwsCredentials {
                access_key_id: read_value(&access, ACCESS_KEY_FILE)?,
                secret_access_key: read_value(&secret, SECRET_KEY_FILE)?,
                session_token: None,
            })),
            (true, false) => Err(CredentialsError::Incomplete {
                dir: dir.to_path_buf(),
                present: ACCESS_KEY_FILE,
                missing: SECRET_KEY_FILE,
            }),
            (false, true) => Err(CredentialsError::Incomplete {
                dir: dir.to_path_buf(),
                present: SECRET_KEY_FILE,
                missing: ACCESS_KEY_FILE,
            }),
            (false, false) => Err(CredentialsError::Missing {
                dir: dir.to_path_buf(),
            }),
        }
    }
}

fn read(path: &Path) -> Result<String, CredentialsError> {
    std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_value(path: &Path, what: &'static str) -> Result<Secret, CredentialsError> {
    let value = read(path)?.trim().to_owned();
    if value.is_empty() {
        return Err(CredentialsError::Empty {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(Secret(value))
}

/// The keys of the default profile of a shared credentials or config file.
#[derive(Debug, Default)]
struct Profile {
    access_key_id: Option<Secret>,
    secret_access_key: Option<Secret>,
    session_token: Option<Secret>,
    role_arn: Option<String>,
    web_identity_token_file: Option<String>,
    role_session_name: Option<String>,
    /// The first key naming a source we do not implement.
    unsupported: Option<&'static str>,
}

/// Keys of the other ways the SDKs get credentials from a profile.
const UNSUPPORTED_KEYS: &[&str] = &[
    "source_profile",
    "credential_source",
    "credential_process",
    "sso_session",
    "sso_start_url",
];

/// Reads the `[default]` profile (`[profile default]` in a config file) of `text`.
fn default_profile(text: &str) -> Profile {
    let mut in_default = false;
    let mut profile = Profile::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let section = section.trim();
            in_default = section == "default"
                || section.strip_prefix("profile").is_some_and(|rest| {
                    rest.starts_with(char::is_whitespace) && rest.trim() == "default"
                });
            continue;
        }
        if !in_default {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if value.is_empty() {
            continue;
        }
        match key {
            "aws_access_key_id" => profile.access_key_id = Some(Secret::new(value)),
            "aws_secret_access_key" => profile.secret_access_key = Some(Secret::new(value)),
            "aws_session_token" => profile.session_token = Some(Secret::new(value)),
            "role_arn" => profile.role_arn = Some(value.to_owned()),
            "web_identity_token_file" => profile.web_identity_token_file = Some(value.to_owned()),
            "role_session_name" => profile.role_session_name = Some(value.to_owned()),
            other => {
                if let Some(key) = UNSUPPORTED_KEYS.iter().find(|k| **k == other) {
                    profile.unsupported.get_or_insert(key);
                }
            }
        }
    }
    profile
}

/// The credentials the default profile of the shared file at `path` describes. Keys win over a
/// web identity, as in the Go SDK upstream uses; a role to assume with those keys, or any other
/// source, is refused rather than silently ignored.
fn parse_shared(text: &str, path: &Path) -> Result<CredentialSource, CredentialsError> {
    let profile = default_profile(text);
    let unsupported = |key| CredentialsError::Unsupported {
        path: path.to_path_buf(),
        key,
    };
    let empty = |what| CredentialsError::Empty {
        path: path.to_path_buf(),
        what,
    };
    if let Some(key) = profile.unsupported {
        return Err(unsupported(key));
    }
    if profile.access_key_id.is_some() || profile.secret_access_key.is_some() {
        if profile.role_arn.is_some() && profile.web_identity_token_file.is_none() {
            return Err(unsupported("role_arn together with keys (AssumeRole)"));
        }
        return Ok(CredentialSource::Static(AwsCredentials {
            access_key_id: profile
                .access_key_id
                .ok_or_else(|| empty("[default] aws_access_key_id"))?,
            secret_access_key: profile
                .secret_access_key
                .ok_or_else(|| empty("[default] aws_secret_access_key"))?,
            session_token: profile.session_token,
        }));
    }
    match (profile.role_arn, profile.web_identity_token_file) {
        (Some(role_arn), Some(token_file)) => Ok(CredentialSource::WebIdentity(WebIdentity {
            role_arn,
            token_file: PathBuf::from(token_file),
            session_name: profile.role_session_name,
            duration: None,
        })),
        (None, Some(_)) => Err(empty("[default] role_arn (web_identity_token_file is set)")),
        (Some(_), None) => Err(empty("[default] web_identity_token_file (role_arn is set)")),
        (None, None) => Err(empty(
            "[default] aws_access_key_id and aws_secret_access_key, or role_arn and web_identity_token_file,",
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cloudnet-aws-creds-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, content) in files {
            std::fs::write(dir.join(name), content).unwrap();
        }
        dir
    }

    fn keys(source: CredentialSource) -> AwsCredentials {
        match source {
            CredentialSource::Static(keys) => keys,
            CredentialSource::WebIdentity(w) => panic!("expected keys, got {w:?}"),
        }
    }

    #[test]
    fn key_files_are_read_and_trimmed() {
        let dir = dir_with(&[
            (ACCESS_KEY_FILE, "AKIDEXAMPLE\n"),
            (SECRET_KEY_FILE, "s3cr3t\n"),
        ]);
        let creds = keys(CredentialSource::from_dir(&dir).unwrap());
        assert_eq!(creds.access_key_id.expose(), "AKIDEXAMPLE");
        assert_eq!(creds.secret_access_key.expose(), "s3cr3t");
        assert_eq!(creds.session_token, None);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn shared_file_default_profile_is_used() {
        let text = "[other]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n\
                    [default]\n# comment\naws_access_key_id = AKIDDEFAULT\n\
                    aws_secret_access_key=defaultsecret\naws_session_token = tok\n";
        let dir = dir_with(&[(SHARED_FILE, text)]);
        let creds = keys(CredentialSource::from_dir(&dir).unwrap());
        assert_eq!(creds.access_key_id.expose(), "AKIDDEFAULT");
        assert_eq!(creds.secret_access_key.expose(), "defaultsecret");
        assert_eq!(
            creds.session_token.as_ref().map(Secret::expose),
            Some("tok")
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_shared_file_wins_over_the_key_files() {
        let dir = dir_with(&[
            (ACCESS_KEY_FILE, "AKIDFILES"),
            (SECRET_KEY_FILE, "filesecret"),
            (
                SHARED_FILE,
                "[default]\naws_access_key_id = AKIDSHARED\naws_secret_access_key = sharedsecret\n",
            ),
        ]);
        let creds = keys(CredentialSource::from_dir(&dir).unwrap());
        assert_eq!(creds.access_key_id.expose(), "AKIDSHARED");
        assert_eq!(creds.secret_access_key.expose(), "sharedsecret");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_web_identity_profile_names_the_role_and_the_token_file() {
        // As the cloud credential operator writes it in STS mode, beside stale key files.
        let text = "[default]\nsts_regional_endpoints = regional\n\
                    role_arn = arn:aws:iam::123456789012:role/egress\n\
                    web_identity_token_file = /var/run/secrets/openshift/serviceaccount/token\n";
        let dir = dir_with(&[
            (SHARED_FILE, text),
            (ACCESS_KEY_FILE, "AKIDSTALE"),
            (SECRET_KEY_FILE, "stale"),
        ]);
        let source = CredentialSource::from_dir(&dir).unwrap();
        assert_eq!(
            source,
            CredentialSource::WebIdentity(WebIdentity {
                role_arn: "arn:aws:iam::123456789012:role/egress".into(),
                token_file: "/var/run/secrets/openshift/serviceaccount/token".into(),
                session_name: None,
                duration: None,
            })
        );
        let text = "[profile default]\nrole_arn = arn:aws:iam::1:role/r\n\
                    web_identity_token_file = /t\nrole_session_name = cloudnet\n";
        let dir2 = dir_with(&[(SHARED_FILE, text)]);
        let CredentialSource::WebIdentity(identity) = CredentialSource::from_dir(&dir2).unwrap()
        else {
            panic!("expected a web identity");
        };
        assert_eq!(identity.session_name.as_deref(), Some("cloudnet"));
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(dir2);
    }

    #[test]
    fn incomplete_or_unsupported_profiles_are_refused_by_key() {
        let cases = [
            (
                "[default]\nrole_arn = arn:aws:iam::1:role/r\n",
                "web_identity_token_file",
            ),
            ("[default]\nweb_identity_token_file = /t\n", "role_arn"),
            (
                "[default]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = base\n",
                "source_profile",
            ),
            (
                "[default]\ncredential_process = /bin/creds\n",
                "credential_process",
            ),
            (
                "[default]\naws_access_key_id = AKIDX\naws_secret_access_key = x\n\
                 role_arn = arn:aws:iam::1:role/r\n",
                "AssumeRole",
            ),
            (
                "[other]\naws_access_key_id = AKIDOTHER\n",
                "aws_access_key_id",
            ),
        ];
        for (text, named) in cases {
            let dir = dir_with(&[(SHARED_FILE, text)]);
            let err = CredentialSource::from_dir(&dir).unwrap_err().to_string();
            assert!(err.contains(named), "{text:?}: {err}");
            assert!(
                !err.contains("AKIDX") && !err.contains("AKIDOTHER"),
                "{err}"
            );
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn missing_or_partial_credentials_are_named_without_contents() {
        let dir = dir_with(&[]);
        let err = CredentialSource::from_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("no AWS credentials"), "{err}");
        let _ = std::fs::remove_dir_all(dir);

        let dir = dir_with(&[(ACCESS_KEY_FILE, "AKIDEXAMPLE")]);
        let err = CredentialSource::from_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("aws_secret_access_key is not"), "{err}");
        assert!(!err.contains("AKIDEXAMPLE"), "{err}");
        let _ = std::fs::remove_dir_all(dir);

        let dir = dir_with(&[(SHARED_FILE, "[default]\naws_access_key_id = AKIDONLY\n")]);
        let err = CredentialSource::from_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("aws_secret_access_key is missing"), "{err}");
        assert!(!err.contains("AKIDONLY"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn secrets_never_print() {
        let creds = AwsCredentials {
            access_key_id: Secret::new("AKIDEXAMPLE"),
            secret_access_key: Secret::new("s3cr3t"),
            session_token: Some(Secret::new("tok3n")),
        };
        let shown = format!("{creds:?} {}", creds.secret_access_key);
        for secret in ["AKIDEXAMPLE", "s3cr3t", "tok3n"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
}
