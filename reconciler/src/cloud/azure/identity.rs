//! Workload identity that follows a rotating token file.
//!
//! `azure_identity::WorkloadIdentityCredential` reads the federated token once, when it is made;
//! the projected service-account token in that file is rotated by the kubelet (hourly), so a
//! credential made at start would fail its first exchange after the rotation. This one reads the
//! file at every exchange and keeps the access token until shortly before it expires.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::{AccessToken, TokenCredential};
use azure_core::error::{Error, ErrorKind};
use azure_core::{HttpClient, Url};
use tokio::sync::Mutex;

/// How long before its expiry an access token is replaced.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// A workload-identity credential reading its federated token from a file.
#[derive(Debug)]
pub struct FederatedFileCredential {
    http: Arc<dyn HttpClient>,
    authority: Url,
    tenant_id: String,
    client_id: String,
    token_file: PathBuf,
    cached: Mutex<Option<(String, AccessToken)>>,
}

impl FederatedFileCredential {
    /// A credential exchanging the token in `token_file` at `authority` for `tenant_id`.
    pub fn new(
        http: Arc<dyn HttpClient>,
        authority: Url,
        tenant_id: String,
        client_id: String,
        token_file: PathBuf,
    ) -> Self {
        Self {
            http,
            authority,
            tenant_id,
            client_id,
            token_file,
            cached: Mutex::new(None),
        }
    }
}

#[async_trait::async_trait]
impl TokenCredential for FederatedFileCredential {
    async fn get_token(&self, scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let key = scopes.join(" ");
        let mut cached = self.cached.lock().await;
        if let Some((scope, token)) = cached.as_ref() {
            let left = token.expires_on.unix_timestamp() - now_unix();
            if *scope == key && left > i64::try_from(REFRESH_MARGIN.as_secs()).unwrap_or(0) {
                return Ok(token.clone());
            }
        }
        let assertion = tokio::fs::read_to_string(&self.token_file)
            .await
            .map_err(|e| {
                Error::with_message(ErrorKind::Credential, || {
                    format!(
                        "reading the federated token file {}: {e}",
                        self.token_file.display()
                    )
                })
            })?;
        let answer = azure_identity::federated_credentials_flow::perform(
            Arc::clone(&self.http),
            &self.client_id,
            assertion.trim(),
            scopes,
            &self.tenant_id,
            &self.authority,
        )
        .await?;
        let expires_in = Duration::from_secs(answer.expires_in);
        let expires_on = time::OffsetDateTime::now_utc() + expires_in;
        let token = AccessToken::new(answer.access_token().secret().to_owned(), expires_on);
        *cached = Some((key, token.clone()));
        Ok(token)
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        *self.cached.lock().await = None;
        Ok(())
    }
}

fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}
