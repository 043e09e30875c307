//! Where Azure's endpoints come from, decided as upstream decides them (its `initCredentials`
//! with go-autorest's environments):
//!
//! * `--platform-api-url` set: Resource Manager is that URL, and the token authority and audience
//!   come from its metadata endpoint (`GET <url>/metadata/endpoints?api-version=1.0`:
//!   `authentication.loginEndpoint` and the first of `authentication.audiences`), whatever
//!   `--platform-azure-environment` says. This is how Azure Stack Hub, whose endpoints are the
//!   stamp's own, is reached: the network operator passes its ARM endpoint there.
//! * else `AzureStackCloud`: the JSON environment file named by `$AZURE_ENVIRONMENT_FILEPATH`
//!   (go-autorest's `resourceManagerEndpoint`, `activeDirectoryEndpoint`, `tokenAudience`).
//! * else one of the named public clouds.
//!
//! `AZURE_AUTHORITY_HOST` (the SDKs' variable) replaces the authority in every case.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use azure_core::{HttpClient, Method, Request, Url};
use backon::{BackoffBuilder, ExponentialBuilder};
use serde::Deserialize;
use thiserror::Error;

/// The variable naming Azure Stack Hub's environment file (go-autorest's).
pub const ENVIRONMENT_FILE_ENV: &str = "AZURE_ENVIRONMENT_FILEPATH";

/// The metadata endpoint's path under Resource Manager, with the version upstream asks for.
const METADATA_PATH: &str = "metadata/endpoints?api-version=1.0";

/// Attempts of the metadata read at start-up, the first included: a restarting Resource Manager
/// should not crash-loop the pod.
const METADATA_ATTEMPTS: usize = 4;

/// The endpoints of one Azure cloud.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Environment {
    /// Azure Resource Manager.
    pub resource_manager: Url,
    /// Microsoft Entra ID's (or the stamp's) token authority.
    pub authority_host: Url,
    /// The audience Resource Manager's tokens are asked for (scope `<audience>/.default`).
    pub token_audience: String,
}

/// The endpoints could not be found.
#[derive(Debug, Error)]
pub enum EnvironmentError {
    /// An unknown `--platform-azure-environment`.
    #[error(
        "unknown Azure environment {0:?}: expected AzurePublicCloud, AzureUSGovernmentCloud or \
         AzureChinaCloud, or AzureStackCloud with --platform-api-url or \
         $AZURE_ENVIRONMENT_FILEPATH"
    )]
    Unknown(String),
    /// `AzureStackCloud` without a way to learn its endpoints.
    #[error(
        "Azure environment AzureStackCloud needs --platform-api-url (its Resource Manager, whose \
         metadata endpoint names the rest) or $AZURE_ENVIRONMENT_FILEPATH (an environment file)"
    )]
    StackWithoutEndpoints,
    /// A URL that does not parse.
    #[error("{what} {value:?} is not a URL")]
    Url {
        /// Which endpoint.
        what: &'static str,
        /// The value given.
        value: String,
    },
    /// The environment file cannot be read or parsed.
    #[error("Azure environment file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The metadata endpoint did not answer usably.
    #[error("Azure Resource Manager metadata at {url}: {message}")]
    Metadata {
        /// The metadata URL.
        url: String,
        /// What went wrong.
        message: String,
    },
}

fn url(what: &'static str, value: &str) -> Result<Url, EnvironmentError> {
    Url::parse(value.trim()).map_err(|_| EnvironmentError::Url {
        what,
        value: value.to_owned(),
    })
}

/// The metadata endpoint's answer, as far as upstream reads it.
#[derive(Deserialize)]
struct Metadata {
    authentication: MetadataAuthentication,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetadataAuthentication {
    login_endpoint: String,
    #[serde(default)]
    audiences: Vec<String>,
}

/// go-autorest's environment file, as far as upstream uses it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvironmentFile {
    resource_manager_endpoint: String,
    active_directory_endpoint: String,
    #[serde(default)]
    token_audience: String,
}

/// Where the endpoints are to be found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Resource Manager at this URL; the rest from its metadata endpoint.
    Metadata(Url),
    /// An Azure Stack Hub environment file.
    File(PathBuf),
    /// A named public cloud.
    Named(Environment),
}

impl Environment {
    /// The token scope for Resource Manager.
    pub fn scope(&self) -> String {
        format!(
            "{}{}",
            self.token_audience.trim_end_matches('/'),
            azure_core::auth::DEFAULT_SCOPE_SUFFIX
        )
    }

    /// Resource Manager at `resource_manager` and tokens from `authority`, with Resource Manager's
    /// URL as the audience (tests and benchmarks: a local fake).
    pub fn at(resource_manager: &str, authority: &str) -> Result<Self, EnvironmentError> {
        let resource_manager = url("Resource Manager URL", resource_manager)?;
        Ok(Self {
            token_audience: resource_manager.as_str().to_owned(),
            resource_manager,
            authority_host: url("token authority", authority)?,
        })
    }

    /// The named public cloud `name` (go-autorest's names; empty is the public cloud).
    pub fn named(name: &str) -> Result<Self, EnvironmentError> {
        let (arm, login) = match name.trim().to_ascii_uppercase().as_str() {
            "" | "AZUREPUBLICCLOUD" | "AZURECLOUD" => (
                "https://management.azure.com/",
                "https://login.microsoftonline.com/",
            ),
            "AZUREUSGOVERNMENTCLOUD" | "AZUREUSGOVERNMENT" => (
                "https://management.usgovcloudapi.net/",
                "https://login.microsoftonline.us/",
            ),
            "AZURECHINACLOUD" => (
                "https://management.chinacloudapi.cn/",
                "https://login.chinacloudapi.cn/",
            ),
            "AZURESTACKCLOUD" => return Err(EnvironmentError::StackWithoutEndpoints),
            _ => return Err(EnvironmentError::Unknown(name.to_owned())),
        };
        Self::at(arm, login)
    }

    /// Where the endpoints of `name` are, given `--platform-api-url` and the environment file
    /// variable.
    pub fn source(
        name: &str,
        api_url: Option<&str>,
        environment_file: Option<&str>,
    ) -> Result<Source, EnvironmentError> {
        if let Some(api_url) = api_url.map(str::trim).filter(|u| !u.is_empty()) {
            return Ok(Source::Metadata(url("--platform-api-url", api_url)?));
        }
        if name.trim().eq_ignore_ascii_case("AzureStackCloud") {
            return environment_file
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(|f| Source::File(PathBuf::from(f)))
                .ok_or(EnvironmentError::StackWithoutEndpoints);
        }
        Self::named(name).map(Source::Named)
    }

    /// The environment of Resource Manager at `api_url`, from its metadata answer `body`.
    pub fn from_metadata(api_url: &Url, body: &[u8]) -> Result<Self, EnvironmentError> {
        let bad = |message: String| EnvironmentError::Metadata {
            url: metadata_url(api_url).to_string(),
            message,
        };
        let metadata: Metadata = serde_json::from_slice(&body[..body.len().min(64 * 1024)])
            .map_err(|e| bad(format!("unexpected answer: {e}")))?;
        let audience = metadata
            .authentication
            .audiences
            .into_iter()
            .find(|a| !a.trim().is_empty())
            .ok_or_else(|| bad("authentication.audiences is empty".into()))?;
        Ok(Self {
            resource_manager: api_url.clone(),
            authority_host: url(
                "authentication.loginEndpoint",
                &metadata.authentication.login_endpoint,
            )?,
            token_audience: audience,
        })
    }

    /// The environment described by the file `path` holding `text`.
    pub fn from_file_text(path: &Path, text: &str) -> Result<Self, EnvironmentError> {
        let file: EnvironmentFile =
            serde_json::from_str(text).map_err(|e| EnvironmentError::File {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        let resource_manager = url("resourceManagerEndpoint", &file.resource_manager_endpoint)?;
        let token_audience = if file.token_audience.trim().is_empty() {
            resource_manager.as_str().to_owned()
        } else {
            file.token_audience
        };
        Ok(Self {
            resource_manager,
            authority_host: url("activeDirectoryEndpoint", &file.active_directory_endpoint)?,
            token_audience,
        })
    }

    /// This environment with `authority` (`AZURE_AUTHORITY_HOST`) as the token authority.
    pub fn with_authority(mut self, authority: Option<&str>) -> Result<Self, EnvironmentError> {
        if let Some(authority) = authority.map(str::trim).filter(|a| !a.is_empty()) {
            self.authority_host = url("AZURE_AUTHORITY_HOST", authority)?;
        }
        Ok(self)
    }

    /// Finds the endpoints of `source`, reading the metadata endpoint through `http`.
    pub async fn load(
        source: Source,
        http: &Arc<dyn HttpClient>,
        timeout: Duration,
    ) -> Result<Self, EnvironmentError> {
        match source {
            Source::Named(environment) => Ok(environment),
            Source::File(path) => {
                let text = std::fs::read_to_string(&path).map_err(|e| EnvironmentError::File {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                Self::from_file_text(&path, &text)
            }
            Source::Metadata(api_url) => {
                let body = read_metadata(&api_url, http, timeout).await?;
                Self::from_metadata(&api_url, &body)
            }
        }
    }
}

/// `<api_url>/metadata/endpoints?api-version=1.0`, under the URL's own path.
fn metadata_url(api_url: &Url) -> Url {
    let base = api_url.as_str().trim_end_matches('/');
    Url::parse(&format!("{base}/{METADATA_PATH}")).unwrap_or_else(|_| api_url.clone())
}

/// The metadata endpoint's body; transport failures, 429 and 5xx are tried again a few times.
async fn read_metadata(
    api_url: &Url,
    http: &Arc<dyn HttpClient>,
    timeout: Duration,
) -> Result<bytes::Bytes, EnvironmentError> {
    let target = metadata_url(api_url);
    let failed = |message: String| EnvironmentError::Metadata {
        url: target.to_string(),
        message,
    };
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_times(METADATA_ATTEMPTS - 1)
        .build();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let request = Request::new(target.clone(), Method::Get);
        let answer = tokio::time::timeout(timeout, async {
            let response = http.execute_request(&request).await?;
            let status = u16::from(response.status());
            let body = response.into_body().collect().await?;
            Ok::<_, azure_core::Error>((status, body))
        })
        .await;
        let error = match answer {
            Ok(Ok((status, body))) if (200..300).contains(&status) => return Ok(body),
            Ok(Ok((status, _))) if status != 429 && status < 500 => {
                return Err(failed(format!("HTTP {status}")));
            }
            Ok(Ok((status, _))) => format!("HTTP {status}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {timeout:?}"),
        };
        let Some(delay) = delays.next() else {
            return Err(failed(error));
        };
        tracing::warn!(url = %target, %error, attempt, "reading Resource Manager's metadata; trying again");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn named_clouds_have_their_endpoints_and_stack_needs_more() {
        let public = Environment::named("").unwrap();
        assert_eq!(
            public.resource_manager.as_str(),
            "https://management.azure.com/"
        );
        assert_eq!(public.scope(), "https://management.azure.com/.default");
        assert_eq!(Environment::named("AzureCloud").unwrap(), public);
        let gov = Environment::named("AzureUSGovernmentCloud").unwrap();
        assert_eq!(
            gov.authority_host.as_str(),
            "https://login.microsoftonline.us/"
        );
        assert!(matches!(
            Environment::named("Mars"),
            Err(EnvironmentError::Unknown(_))
        ));
        assert!(matches!(
            Environment::source("AzureStackCloud", None, None),
            Err(EnvironmentError::StackWithoutEndpoints)
        ));
    }

    #[test]
    fn the_api_url_means_its_metadata_whatever_the_name_and_stack_reads_its_file() {
        for name in ["", "AzurePublicCloud", "AzureStackCloud"] {
            assert_eq!(
                Environment::source(
                    name,
                    Some("https://management.local.azurestack.external"),
                    Some("/f")
                )
                .unwrap(),
                Source::Metadata(
                    Url::parse("https://management.local.azurestack.external").unwrap()
                ),
                "{name}"
            );
        }
        assert_eq!(
            Environment::source("AzureStackCloud", Some(""), Some("/etc/azure/env.json")).unwrap(),
            Source::File("/etc/azure/env.json".into())
        );
        assert!(matches!(
            Environment::source("AzurePublicCloud", None, Some("/f")).unwrap(),
            Source::Named(_)
        ));
    }

    #[test]
    fn metadata_names_the_authority_and_the_audience() {
        let api = Url::parse("https://management.local.azurestack.external/").unwrap();
        let body = br#"{"galleryEndpoint":"https://gallery.local.azurestack.external/",
            "graphEndpoint":"https://graph.windows.net/",
            "authentication":{"loginEndpoint":"https://login.microsoftonline.com/",
            "audiences":["https://management.contoso.onmicrosoft.com/4c0b-stack"]}}"#;
        let env = Environment::from_metadata(&api, body).unwrap();
        assert_eq!(env.resource_manager, api);
        assert_eq!(
            env.authority_host.as_str(),
            "https://login.microsoftonline.com/"
        );
        assert_eq!(
            env.scope(),
            "https://management.contoso.onmicrosoft.com/4c0b-stack/.default"
        );
        assert_eq!(
            metadata_url(&api).as_str(),
            "https://management.local.azurestack.external/metadata/endpoints?api-version=1.0"
        );
        let err = Environment::from_metadata(
            &api,
            br#"{"authentication":{"loginEndpoint":"x","audiences":[]}}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("audiences"), "{err}");
        let overridden = env.with_authority(Some("http://127.0.0.1:9/")).unwrap();
        assert_eq!(overridden.authority_host.as_str(), "http://127.0.0.1:9/");
    }

    #[test]
    fn an_environment_file_gives_all_three_endpoints() {
        let text = r#"{"name":"AzureStackCloud",
            "resourceManagerEndpoint":"https://management.local.azurestack.external/",
            "activeDirectoryEndpoint":"https://login.microsoftonline.com/",
            "tokenAudience":"https://management.contoso.onmicrosoft.com/4c0b-stack"}"#;
        let env = Environment::from_file_text(Path::new("env.json"), text).unwrap();
        assert_eq!(
            env.resource_manager.as_str(),
            "https://management.local.azurestack.external/"
        );
        assert_eq!(
            env.token_audience,
            "https://management.contoso.onmicrosoft.com/4c0b-stack"
        );
        let err = Environment::from_file_text(Path::new("env.json"), "{}").unwrap_err();
        assert!(err.to_string().contains("env.json"), "{err}");
    }
}
