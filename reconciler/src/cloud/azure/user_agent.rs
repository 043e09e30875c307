//! The application part of every Azure call's `User-Agent`, as upstream sets it through the Go
//! SDK's `Telemetry.ApplicationID`: `<application> <SDK's own agent>`.
//!
//! Upstream's value is its own name, `cloud-network-config-controller`, which the Go SDK cuts to
//! 24 characters (`cloud-network-config-con`); Azure's activity log and support attribute calls
//! to the application by it. The calls made here are cloudnet's, so they carry cloudnet's name
//! and version instead of claiming to be upstream's: someone chasing a throttled subscription or
//! an unexpected NIC write finds the program that made it. The Rust SDK's builders offer no
//! application id, so the one HTTP client every Azure call goes through (Resource Manager through
//! the SDK and raw, and the token requests) adds it.

use std::sync::Arc;

use azure_core::headers::USER_AGENT;
use azure_core::{HttpClient, Request, Response};

/// The application id: cloudnet's name and version, within the Go SDK's 24 characters and
/// without spaces, as Azure's convention for it asks.
pub const APPLICATION_ID: &str = concat!("cloudnet/", env!("CARGO_PKG_VERSION"));

/// An HTTP client that puts [`APPLICATION_ID`] before the `User-Agent` a request carries.
#[derive(Debug)]
pub struct WithApplicationId(pub Arc<dyn HttpClient>);

/// The `User-Agent` for a request that carried `agent`.
pub fn user_agent(agent: Option<&str>) -> String {
    match agent.map(str::trim).filter(|a| !a.is_empty()) {
        Some(agent) => format!("{APPLICATION_ID} {agent}"),
        None => APPLICATION_ID.to_owned(),
    }
}

#[async_trait::async_trait]
impl HttpClient for WithApplicationId {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
        let mut request = request.clone();
        let agent = user_agent(request.headers().get_optional_str(&USER_AGENT));
        request.insert_header(USER_AGENT, agent);
        self.0.execute_request(&request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_application_id_leads_the_sdks_agent_and_fits_azures_limit() {
        assert!(APPLICATION_ID.len() <= 24 && !APPLICATION_ID.contains(' '));
        assert_eq!(user_agent(None), APPLICATION_ID);
        assert_eq!(
            user_agent(Some(
                "azsdk-rust-azure_mgmt_network/0.21.0 (1.95; linux; x86_64)"
            )),
            format!("{APPLICATION_ID} azsdk-rust-azure_mgmt_network/0.21.0 (1.95; linux; x86_64)")
        );
    }
}
