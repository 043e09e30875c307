//! Temporary credentials for a web identity: STS `AssumeRoleWithWebIdentity`, with the token read
//! from its file at every exchange (projected service account tokens rotate), handed to the EC2
//! client as its credentials provider.
//!
//! The EC2 client's identity cache asks for new credentials when the ones it holds expire. We
//! report them as expiring [`REFRESH_MARGIN`] before STS's expiry (half their life when that is
//! shorter), so they are renewed while still valid, and a slow or failed exchange can be retried
//! before the old ones stop working.
//! See <https://docs.aws.amazon.com/STS/latest/APIReference/API_AssumeRoleWithWebIdentity.html>.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError as SdkCredentialsError;
use aws_credential_types::provider::{self, ProvideCredentials, future};
use aws_sdk_sts::error::{ProvideErrorMetadata, SdkError};
use thiserror::Error;

use super::credentials::WebIdentity;

/// How long before STS's expiry the credentials are renewed.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// Why no credentials came from STS. Names the role and the token file, never the token.
#[derive(Debug, Error)]
pub enum WebIdentityError {
    /// The token file could not be read.
    #[error("reading the web identity token file {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The token file is empty.
    #[error("the web identity token file {path} is empty")]
    EmptyToken {
        /// The file.
        path: PathBuf,
    },
    /// STS refused or could not be reached.
    #[error("STS AssumeRoleWithWebIdentity for {role_arn}: {reason}")]
    Sts {
        /// The role.
        role_arn: String,
        /// STS's error code and message, or what went wrong on the way.
        reason: String,
    },
}

/// Exchanges the web identity token for the role's credentials.
#[derive(Debug)]
pub struct WebIdentityProvider {
    sts: aws_sdk_sts::Client,
    identity: WebIdentity,
}

impl WebIdentityProvider {
    /// A provider asking `sts` for `identity`'s role.
    pub fn new(sts: aws_sdk_sts::Client, identity: WebIdentity) -> Self {
        Self { sts, identity }
    }

    async fn exchange(&self) -> Result<Credentials, WebIdentityError> {
        let path = &self.identity.token_file;
        let token =
            tokio::fs::read_to_string(path)
                .await
                .map_err(|source| WebIdentityError::Token {
                    path: path.clone(),
                    source,
                })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(WebIdentityError::EmptyToken { path: path.clone() });
        }
        let sts_error = |reason: String| WebIdentityError::Sts {
            role_arn: self.identity.role_arn.clone(),
            reason,
        };
        let session_name = self
            .identity
            .session_name
            .clone()
            .unwrap_or_else(default_session_name);
        let duration = self
            .identity
            .duration
            .map(|d| i32::try_from(d.as_secs()).unwrap_or(i32::MAX));
        let answer = self
            .sts
            .assume_role_with_web_identity()
            .role_arn(&self.identity.role_arn)
            .role_session_name(session_name)
            .web_identity_token(token)
            .set_duration_seconds(duration)
            .send()
            .await
            .map_err(|e| sts_error(reason(&e)))?;
        let issued = answer
            .credentials()
            .ok_or_else(|| sts_error("the answer holds no credentials".into()))?;
        let expires = SystemTime::try_from(*issued.expiration())
            .map_err(|_| sts_error("the credentials' expiry is out of range".into()))?;
        let now = SystemTime::now();
        tracing::info!(
            role = %self.identity.role_arn,
            valid_for = ?expires.duration_since(now).unwrap_or_default(),
            "assumed the web identity role"
        );
        Ok(Credentials::new(
            issued.access_key_id(),
            issued.secret_access_key(),
            Some(issued.session_token().to_owned()),
            Some(renew_at(now, expires)),
            "cloudnet-web-identity",
        ))
    }
}

impl ProvideCredentials for WebIdentityProvider {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(async move {
            self.exchange().await.map_err(|e| {
                // The failed EC2 call reports it (see `errors::classify`); no second log line.
                tracing::debug!(error = %e, "no AWS credentials from STS");
                SdkCredentialsError::provider_error(e)
            }) as provider::Result
        })
    }
}

/// When credentials that STS lets live until `expires` should be replaced, seen at `now`.
pub fn renew_at(now: SystemTime, expires: SystemTime) -> SystemTime {
    let life = expires.duration_since(now).unwrap_or_default();
    expires - REFRESH_MARGIN.min(life / 2)
}

/// Upstream's (the Go SDK's) name for a session nobody named: the time in nanoseconds.
fn default_session_name() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    nanos.to_string()
}

/// STS's error code and message, or what failed on the way; never the request.
fn reason<E: ProvideErrorMetadata>(error: &SdkError<E>) -> String {
    match error {
        SdkError::TimeoutError(_) => "timed out".into(),
        SdkError::DispatchFailure(_) => "could not reach the STS endpoint".into(),
        SdkError::ResponseError(_) => "unreadable answer from the STS endpoint".into(),
        SdkError::ConstructionFailure(_) => "could not build the request".into(),
        _ => match (error.code(), error.raw_response()) {
            (Some(code), _) => format!("{code}: {}", error.message().unwrap_or("no message")),
            (None, Some(raw)) => format!("HTTP {} without an error code", raw.status().as_u16()),
            (None, None) => "failed without an error code".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_renewed_before_they_expire() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        // (life granted by STS, renewed this long before expiry)
        let cases = [
            (hour, REFRESH_MARGIN),
            (Duration::from_secs(900), REFRESH_MARGIN),
            (Duration::from_secs(60), Duration::from_secs(30)),
            (Duration::from_secs(4), Duration::from_secs(2)),
            (Duration::ZERO, Duration::ZERO),
        ];
        for (life, early) in cases {
            assert_eq!(renew_at(now, now + life), now + life - early, "{life:?}");
        }
        // Already expired (a skewed clock): renew at once.
        assert_eq!(renew_at(now, now - hour), now - hour);
    }

    #[test]
    fn errors_name_the_file_and_the_role_never_the_token() {
        let error = WebIdentityError::Sts {
            role_arn: "arn:aws:iam::1:role/r".into(),
            reason: "InvalidIdentityToken: Incorrect token audience".into(),
        };
        assert!(
            error.to_string().contains("arn:aws:iam::1:role/r"),
            "{error}"
        );
        let error = WebIdentityError::EmptyToken {
            path: "/var/run/token".into(),
        };
        assert!(error.to_string().contains("/var/run/token"), "{error}");
    }
}
