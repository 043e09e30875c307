//! Keystone's and Neutron's error answers → [`CloudError`].

use serde::Deserialize;

use crate::cloud::{CloudError, ErrorKind};

/// Neutron's error body: `{"NeutronError": {"type": …, "message": …, "detail": …}}`.
#[derive(Debug, Default, Deserialize)]
struct NeutronBody {
    #[serde(rename = "NeutronError")]
    error: Option<NeutronError>,
}

#[derive(Debug, Default, Deserialize)]
struct NeutronError {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    message: String,
}

/// Keystone's error body: `{"error": {"code": …, "title": …, "message": …}}`.
#[derive(Debug, Default, Deserialize)]
struct KeystoneBody {
    error: Option<KeystoneError>,
}

#[derive(Debug, Default, Deserialize)]
struct KeystoneError {
    #[serde(default)]
    title: String,
    #[serde(default)]
    message: String,
}

/// An API's failed answer: status, Neutron's error type (empty for other bodies) and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Neutron's exception name (`IpAddressAlreadyAllocated`, …), empty when the body had none.
    pub kind: String,
    /// The cloud's message, or a short excerpt of the body.
    pub message: String,
}

impl ApiError {
    /// The error in `body` answered with `status`.
    pub fn from_body(status: u16, body: &[u8]) -> Self {
        if let Ok(NeutronBody { error: Some(e), .. }) = serde_json::from_slice::<NeutronBody>(body)
        {
            return Self {
                status,
                kind: e.kind,
                message: e.message,
            };
        }
        if let Ok(KeystoneBody { error: Some(e) }) = serde_json::from_slice::<KeystoneBody>(body) {
            return Self {
                status,
                kind: e.title,
                message: e.message,
            };
        }
        let text = String::from_utf8_lossy(body);
        let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        Self {
            status,
            kind: String::new(),
            message: text.chars().take(200).collect(),
        }
    }

    /// How the engine should treat it, with `what` (the call) in the message.
    pub fn into_cloud(self, what: &str) -> CloudError {
        let kind = match self.status {
            404 => ErrorKind::NotFound,
            // 413 is Neutron's historical "over limit"; 429 the current one.
            413 | 429 => ErrorKind::Throttled,
            // A stale revision (If-Match): re-read and try again.
            412 => ErrorKind::Conflict,
            // 401 after a fresh token, 5xx and the like.
            408 | 500..=599 => ErrorKind::Retryable,
            _ => ErrorKind::Permanent,
        };
        let hint = match (self.status, self.kind.as_str()) {
            (403, _) => {
                "; the credentials' project must own the network (or its role must allow \
                 fixed IPs and allowed-address-pairs on it)"
            }
            (401, _) => "; Keystone refused the credentials from clouds.yaml",
            _ => "",
        };
        let name = if self.kind.is_empty() {
            String::new()
        } else {
            format!(" {}", self.kind)
        };
        CloudError::new(
            kind,
            format!("{what}: HTTP {}{name}: {}{hint}", self.status, self.message),
        )
    }
}

/// A request that got no answer (connection refused, TLS failure, timeout): retryable.
pub fn transport(what: &str, error: &dyn std::fmt::Display) -> CloudError {
    CloudError::retryable(format!("{what}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutron_bodies_keep_their_type_and_map_by_status() {
        let e = ApiError::from_body(
            409,
            br#"{"NeutronError": {"type": "IpAddressAlreadyAllocated", "message": "IP address 10.0.0.5 already allocated in subnet s", "detail": ""}}"#,
        );
        assert_eq!(e.kind, "IpAddressAlreadyAllocated");
        let c = e.into_cloud("creating port");
        assert_eq!(c.kind, ErrorKind::Permanent);
        assert!(c.message.contains("IpAddressAlreadyAllocated"), "{c}");
        assert!(c.message.contains("10.0.0.5"), "{c}");

        let stale = ApiError::from_body(
            412,
            br#"{"NeutronError": {"type": "RevisionNumberConstraintFailed", "message": "Constrained to 1, but current revision is 2", "detail": ""}}"#,
        );
        assert_eq!(stale.into_cloud("x").kind, ErrorKind::Conflict);
        for (status, kind) in [
            (404, ErrorKind::NotFound),
            (400, ErrorKind::Permanent),
            (429, ErrorKind::Throttled),
            (413, ErrorKind::Throttled),
            (503, ErrorKind::Retryable),
            (500, ErrorKind::Retryable),
        ] {
            assert_eq!(ApiError::from_body(status, b"").into_cloud("x").kind, kind);
        }
    }

    #[test]
    fn keystone_bodies_policy_denials_and_plain_text_are_explained() {
        let e = ApiError::from_body(
            401,
            br#"{"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}"#,
        );
        assert_eq!(e.kind, "Unauthorized");
        let c = e.into_cloud("authenticating");
        assert_eq!(c.kind, ErrorKind::Permanent);
        assert!(c.message.contains("clouds.yaml"), "{c}");

        let denied = ApiError::from_body(
            403,
            br#"{"NeutronError": {"type": "PolicyNotAuthorized", "message": "(rule:create_port:fixed_ips:ip_address) is disallowed by policy", "detail": ""}}"#,
        )
        .into_cloud("creating port");
        assert_eq!(denied.kind, ErrorKind::Permanent);
        assert!(denied.message.contains("must own the network"), "{denied}");

        let html = ApiError::from_body(502, b"<html>\n  Bad   gateway</html>");
        assert_eq!(html.message, "<html> Bad gateway</html>");
    }
}
