//! AWS credentials from the mounted secret directory (SPEC §2.5): the files
//! `aws_access_key_id` and `aws_secret_access_key`, or a shared `credentials` INI file whose
//! `[default]` profile holds the same keys. Nothing here ever prints a secret.

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// File holding the access key id.
pub const ACCESS_KEY_FILE: &str = "aws_access_key_id";
/// File holding the secret access key.
pub const SECRET_KEY_FILE: &str = "aws_secret_access_key";
/// Shared credentials file, used when the two key files are absent.
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

/// Why no credentials could be read. Names files and keys, never their contents.
#[derive(Debug, Error)]
pub enum CredentialsError {
    /// Neither layout is present.
    #[error(
        "no AWS credentials in {dir}: expected files {ACCESS_KEY_FILE} and {SECRET_KEY_FILE}, or a {SHARED_FILE} file"
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
}

impl AwsCredentials {
    /// Reads the credentials from the mounted secret directory `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, CredentialsError> {
        let access = dir.join(ACCESS_KEY_FILE);
        let secret = dir.join(SECRET_KEY_FILE);
        match (access.is_file(), secret.is_file()) {
            (true, true) => Ok(Self {
                access_key_id: read_value(&access, ACCESS_KEY_FILE)?,
                secret_access_key: read_value(&secret, SECRET_KEY_FILE)?,
                session_token: None,
            }),
            (true, false) | (false, true) => {
                let (present, missing) = if access.is_file() {
                    (ACCESS_KEY_FILE, SECRET_KEY_FILE)
                } else {
                    (SECRET_KEY_FILE, ACCESS_KEY_FILE)
                };
                Err(CredentialsError::Incomplete {
                    dir: dir.to_path_buf(),
                    present,
                    missing,
                })
            }
            (false, false) => {
                let shared = dir.join(SHARED_FILE);
                if !shared.is_file() {
                    return Err(CredentialsError::Missing {
                        dir: dir.to_path_buf(),
                    });
                }
                let text = read(&shared)?;
                parse_shared(&text, &shared)
            }
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

/// The `[default]` profile of a shared credentials file.
fn parse_shared(text: &str, path: &Path) -> Result<AwsCredentials, CredentialsError> {
    let mut in_default = false;
    let (mut access, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_default = section.trim() == "default";
            continue;
        }
        if !in_default {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        if value.is_empty() {
            continue;
        }
        match key.trim() {
            "aws_access_key_id" => access = Some(Secret::new(value)),
            "aws_secret_access_key" => secret = Some(Secret::new(value)),
            "aws_session_token" => token = Some(Secret::new(value)),
            _ => {}
        }
    }
    let empty = |what| CredentialsError::Empty {
        path: path.to_path_buf(),
        what,
    };
    Ok(AwsCredentials {
        access_key_id: access.ok_or_else(|| empty("[default] aws_access_key_id"))?,
        secret_access_key: secret.ok_or_else(|| empty("[default] aws_secret_access_key"))?,
        session_token: token,
    })
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

    #[test]
    fn key_files_are_read_and_trimmed() {
        let dir = dir_with(&[
            (ACCESS_KEY_FILE, "AKIDEXAMPLE\n"),
            (SECRET_KEY_FILE, "s3cr3t\n"),
        ]);
        let creds = AwsCredentials::from_dir(&dir).unwrap();
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
        let creds = AwsCredentials::from_dir(&dir).unwrap();
        assert_eq!(creds.access_key_id.expose(), "AKIDDEFAULT");
        assert_eq!(creds.secret_access_key.expose(), "defaultsecret");
        assert_eq!(
            creds.session_token.as_ref().map(Secret::expose),
            Some("tok")
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn missing_or_partial_credentials_are_named_without_contents() {
        let dir = dir_with(&[]);
        let err = AwsCredentials::from_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("no AWS credentials"), "{err}");
        let _ = std::fs::remove_dir_all(dir);

        let dir = dir_with(&[(ACCESS_KEY_FILE, "AKIDEXAMPLE")]);
        let err = AwsCredentials::from_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("aws_secret_access_key is not"), "{err}");
        assert!(!err.contains("AKIDEXAMPLE"), "{err}");
        let _ = std::fs::remove_dir_all(dir);

        let dir = dir_with(&[(SHARED_FILE, "[default]\naws_access_key_id = AKIDONLY\n")]);
        let err = AwsCredentials::from_dir(&dir).unwrap_err().to_string();
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
