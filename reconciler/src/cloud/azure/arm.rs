//! The raw ARM calls beside the SDK, each on the SDK's own HTTP client and token credential:
//!
//! * the NIC PUT: the SDK's `network_interfaces::create_or_update` sends no `If-Match` (it has no
//!   way to set one), so concurrent writers would overwrite each other, and its poller follows
//!   only `Azure-AsyncOperation`, sleeps 30 s when no `Retry-After` comes, and turns a `Failed`
//!   operation into "Long running operation failed" without ARM's error text. The PUT and the
//!   operation polling are therefore sent here, honouring `Retry-After` and keeping the error.
//! * the VM GET: one typed request for the network profile, instead of the compute crate, whose
//!   single API package is some 55,000 generated lines for this one call.

use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::TokenCredential;
use azure_core::headers::HeaderName;
use azure_core::{HttpClient, Method, Request, Url};
use bytes::Bytes;
use serde::Deserialize;

use super::super::CloudError;
use super::errors::{self, ArmError};

/// The network API version (the SDK's one package).
pub const NETWORK_API_VERSION: &str = "2024-03-01";
/// The compute API version of the VM GET.
pub const COMPUTE_API_VERSION: &str = "2024-07-01";

/// One ARM answer, read whole.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The body.
    pub body: Bytes,
    /// `Retry-After`, as sent.
    pub retry_after: Option<String>,
    /// `Azure-AsyncOperation`: the operation's status URL.
    pub async_operation: Option<String>,
    /// `Location`: the other long-running-operation protocol's status URL.
    pub location: Option<String>,
}

impl Answer {
    /// Whether the status is 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The error of a non-2xx answer, classified.
    pub fn error(&self, operation: &str, resource: &str) -> CloudError {
        errors::classify(
            operation,
            resource,
            self.status,
            ArmError::from_body(&self.body).as_ref(),
        )
    }
}

/// ARM over the SDK's HTTP client, with bearer tokens for `scope`.
#[derive(Clone, Debug)]
pub struct Arm {
    /// The HTTP client (shared with the SDK's pipeline).
    pub http: Arc<dyn HttpClient>,
    /// The token credential (shared with the SDK).
    pub credential: Arc<dyn TokenCredential>,
    /// Resource Manager's base URL.
    pub endpoint: Url,
    /// The token scope (`<endpoint>/.default`).
    pub scope: String,
    /// Bound on one call.
    pub timeout: Duration,
}

impl Arm {
    /// `path` under the endpoint, with `api-version`.
    pub fn url(&self, path: &str, api_version: &str) -> Result<Url, CloudError> {
        let mut url = self.endpoint.clone();
        let base = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{base}{path}"));
        url.query_pairs_mut()
            .append_pair("api-version", api_version);
        Ok(url)
    }

    /// The URL of a list's next page (`nextLink`), refused unless Resource Manager itself
    /// serves it: the bearer token goes with the request.
    pub fn next_page(&self, link: &str, what: &str) -> Result<Url, CloudError> {
        let url = Url::parse(link)
            .map_err(|e| CloudError::retryable(format!("GET {what}: bad nextLink: {e}")))?;
        if url.origin() != self.endpoint.origin() {
            return Err(CloudError::permanent(format!(
                "GET {what}: the nextLink leaves Resource Manager ({})",
                url.origin().ascii_serialization()
            )));
        }
        Ok(url)
    }

    /// A bearer token, as a header value.
    async fn bearer(&self, what: &str) -> Result<String, CloudError> {
        let token = self
            .credential
            .get_token(&[self.scope.as_str()])
            .await
            .map_err(|e| errors::from_sdk("token for", what, &e))?;
        Ok(format!("Bearer {}", token.token.secret()))
    }

    /// One call, bounded by the timeout; transport failures are retryable errors.
    pub async fn call(
        &self,
        method: Method,
        url: Url,
        body: Option<Bytes>,
        if_match: Option<&str>,
        what: &str,
    ) -> Result<Answer, CloudError> {
        let mut request = Request::new(url, method);
        request.insert_header("authorization", self.bearer(what).await?);
        if let Some(body) = body {
            request.insert_header("content-type", "application/json");
            request.set_body(body);
        }
        if let Some(etag) = if_match {
            request.insert_header("if-match", etag.to_owned());
        }
        let send = async {
            let response = self.http.execute_request(&request).await?;
            let status = u16::from(response.status());
            let header = |name: &'static str| {
                response
                    .headers()
                    .get_optional_string(&HeaderName::from_static(name))
            };
            let retry_after = header("retry-after");
            let async_operation = header("azure-asyncoperation");
            let location = header("location");
            let body = response.into_body().collect().await?;
            Ok::<_, azure_core::Error>(Answer {
                status,
                body,
                retry_after,
                async_operation,
                location,
            })
        };
        match tokio::time::timeout(self.timeout, send).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(errors::from_sdk("calling ARM for", what, &e)),
            Err(_) => Err(CloudError::retryable(format!(
                "calling ARM for {what}: no answer within {:?}",
                self.timeout
            ))),
        }
    }
}

/// The parts of a VM the provider reads.
#[derive(Debug, Default, Deserialize)]
pub struct VirtualMachine {
    /// Its properties.
    #[serde(default)]
    pub properties: Option<VmProperties>,
}

/// A VM's properties (only the network profile).
#[derive(Debug, Default, Deserialize)]
pub struct VmProperties {
    /// The NICs.
    #[serde(rename = "networkProfile", default)]
    pub network_profile: Option<NetworkProfile>,
}

/// A VM's network profile.
#[derive(Debug, Default, Deserialize)]
pub struct NetworkProfile {
    /// The NIC references.
    #[serde(rename = "networkInterfaces", default)]
    pub network_interfaces: Vec<NicReference>,
}

/// One NIC reference of a VM.
#[derive(Debug, Default, Deserialize)]
pub struct NicReference {
    /// The NIC's resource id.
    #[serde(default)]
    pub id: String,
    /// Whether it is the primary NIC.
    #[serde(default)]
    pub properties: Option<NicReferenceProperties>,
}

/// A NIC reference's properties.
#[derive(Debug, Default, Deserialize)]
pub struct NicReferenceProperties {
    /// Primary flag.
    #[serde(default)]
    pub primary: Option<bool>,
}

impl VirtualMachine {
    /// The primary NIC's id: the one marked primary, or the only one.
    pub fn primary_nic(&self) -> Option<&str> {
        let nics = &self
            .properties
            .as_ref()?
            .network_profile
            .as_ref()?
            .network_interfaces;
        the_primary(nics, |n| {
            n.properties
                .as_ref()
                .and_then(|p| p.primary)
                .unwrap_or(false)
        })
        .map(|nic| nic.id.as_str())
        .filter(|id| !id.is_empty())
    }
}

/// Of a VM's NICs, the one `marked` primary, or the only one; several with none marked: none
/// (upstream fell back to the first listed, which this reconciler refuses to guess).
pub fn the_primary<T>(nics: &[T], marked: impl Fn(&T) -> bool) -> Option<&T> {
    match (nics.iter().find(|n| marked(n)), nics) {
        (Some(nic), _) | (None, [nic]) => Some(nic),
        _ => None,
    }
}

/// An asynchronous operation's status document.
#[derive(Debug, Default, Deserialize)]
pub struct OperationStatus {
    /// `InProgress`, `Succeeded`, `Failed` or `Canceled`.
    #[serde(default)]
    pub status: String,
    /// The error of a failed operation.
    #[serde(default)]
    pub error: Option<ArmError>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_primary_nic_is_the_marked_one_or_the_only_one() {
        let vm: VirtualMachine = serde_json::from_str(
            r#"{"properties":{"networkProfile":{"networkInterfaces":[
                {"id":"/a","properties":{"primary":false}},{"id":"/b","properties":{"primary":true}}]}}}"#,
        )
        .unwrap();
        assert_eq!(vm.primary_nic(), Some("/b"));
        let one: VirtualMachine = serde_json::from_str(
            r#"{"properties":{"networkProfile":{"networkInterfaces":[{"id":"/only"}]}}}"#,
        )
        .unwrap();
        assert_eq!(one.primary_nic(), Some("/only"));
        let two: VirtualMachine = serde_json::from_str(
            r#"{"properties":{"networkProfile":{"networkInterfaces":[{"id":"/a"},{"id":"/b"}]}}}"#,
        )
        .unwrap();
        assert_eq!(two.primary_nic(), None);
        assert_eq!(VirtualMachine::default().primary_nic(), None);
    }

    #[test]
    fn an_operation_status_carries_the_error() {
        let s: OperationStatus = serde_json::from_str(
            r#"{"status":"Failed","error":{"code":"PrivateIPAddressIsAllocated","message":"in use"}}"#,
        )
        .unwrap();
        assert_eq!(s.status, "Failed");
        assert_eq!(s.error.unwrap().code, "PrivateIPAddressIsAllocated");
    }
}
