//! ARM answers → [`CloudError`]: the HTTP status and ARM's error code decide the kind; the code
//! and message (never a header or a token) make the text shown on the object.

use std::time::Duration;

use serde::Deserialize;

use super::super::{CloudError, ErrorKind};

/// ARM's error envelope: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Default, Deserialize)]
pub struct ArmErrorBody {
    /// The error.
    #[serde(default)]
    pub error: Option<ArmError>,
}

/// One ARM error.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ArmError {
    /// ARM's code (`PrivateIPAddressIsAllocated`, `AnotherOperationInProgress`, ...).
    #[serde(default)]
    pub code: String,
    /// Its human text.
    #[serde(default)]
    pub message: String,
}

impl ArmError {
    /// The error of an ARM error body, if it has one.
    pub fn from_body(body: &[u8]) -> Option<Self> {
        serde_json::from_slice::<ArmErrorBody>(body)
            .ok()
            .and_then(|b| b.error)
    }
}

/// Codes that mean "try again later", whatever the status.
const RETRYABLE_CODES: [&str; 5] = [
    "AnotherOperationInProgress",
    "RetryableError",
    "InternalServerError",
    "OperationPreempted",
    "CanceledAndSupersededDueToAnotherOperation",
];

/// Codes that mean "slow down".
const THROTTLED_CODES: [&str; 3] = [
    "TooManyRequests",
    "SubscriptionRequestsThrottled",
    "ResourceCollectionRequestsThrottled",
];

/// The error for an ARM answer of `status` with `error`, from `operation` on `resource`.
pub fn classify(
    operation: &str,
    resource: &str,
    status: u16,
    error: Option<&ArmError>,
) -> CloudError {
    let code = error.map(|e| e.code.as_str()).unwrap_or_default();
    let text = match error {
        Some(e) if !e.code.is_empty() => format!(
            "{operation} {resource}: {} ({status}): {}",
            e.code, e.message
        ),
        _ => format!("{operation} {resource}: HTTP {status}"),
    };
    let kind = if status == 429 || THROTTLED_CODES.contains(&code) {
        ErrorKind::Throttled
    } else if RETRYABLE_CODES.contains(&code) {
        ErrorKind::Retryable
    } else {
        match status {
            404 => ErrorKind::NotFound,
            // A stale If-Match: re-read and try again.
            412 => ErrorKind::Conflict,
            408 | 500..=599 => ErrorKind::Retryable,
            // 409 without a retryable code is a conflict with the resource's state.
            _ => ErrorKind::Permanent,
        }
    };
    CloudError::new(kind, text)
}

/// The error of an asynchronous operation that ended `Failed` or `Canceled`, with ARM's text.
pub fn operation_failed(resource: &str, status: &str, error: Option<&ArmError>) -> CloudError {
    let text = match error {
        Some(e) => format!(
            "updating {resource}: the operation ended {status}: {}: {}",
            e.code, e.message
        ),
        None => format!("updating {resource}: the operation ended {status} without an error"),
    };
    let code = error.map(|e| e.code.as_str()).unwrap_or_default();
    let kind = if status.eq_ignore_ascii_case("Canceled")
        || RETRYABLE_CODES.contains(&code)
        || THROTTLED_CODES.contains(&code)
    {
        ErrorKind::Retryable
    } else {
        ErrorKind::Permanent
    };
    CloudError::new(kind, text)
}

/// An error from the SDK's pipeline (GETs): HTTP errors by status and code, the rest (I/O,
/// decoding, tokens) by their kind.
pub fn from_sdk(operation: &str, resource: &str, error: &azure_core::Error) -> CloudError {
    if let Some(http) = error.as_http_error() {
        let arm = ArmError {
            code: http.error_code().unwrap_or_default().to_owned(),
            message: http.error_message().unwrap_or_default().to_owned(),
        };
        return classify(operation, resource, u16::from(http.status()), Some(&arm));
    }
    match error.kind() {
        azure_core::error::ErrorKind::HttpResponse { status, error_code } => {
            let arm = error_code.as_ref().map(|code| ArmError {
                code: code.clone(),
                message: String::new(),
            });
            classify(operation, resource, u16::from(*status), arm.as_ref())
        }
        // Token errors: a wrong secret stays wrong, but the message says which step failed.
        azure_core::error::ErrorKind::Credential => CloudError::permanent(format!(
            "{operation} {resource}: getting an ARM token failed: {}",
            first_line(error)
        )),
        azure_core::error::ErrorKind::DataConversion => CloudError::retryable(format!(
            "{operation} {resource}: undecodable answer: {}",
            first_line(error)
        )),
        _ => CloudError::retryable(format!("{operation} {resource}: {}", first_line(error))),
    }
}

/// The first line of an error's text: the SDK's full text can carry response headers and bodies.
fn first_line(error: &dyn std::fmt::Display) -> String {
    let text = error.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.chars().take(300).collect()
}

/// ARM's `Retry-After` (seconds; ARM does not send dates), capped so a bogus value cannot
/// stall a node's lane.
pub fn retry_after(value: Option<&str>, cap: Duration) -> Option<Duration> {
    let secs: u64 = value?.trim().parse().ok()?;
    Some(Duration::from_secs(secs).min(cap))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn arm(code: &str) -> ArmError {
        ArmError {
            code: code.into(),
            message: format!("{code} happened"),
        }
    }

    #[test]
    fn statuses_and_codes_map_to_what_the_engine_does() {
        let kind = |status, code: &str| classify("PUT", "nic0", status, Some(&arm(code))).kind;
        assert_eq!(kind(429, "TooManyRequests"), ErrorKind::Throttled);
        assert_eq!(kind(429, "RetryableError"), ErrorKind::Throttled);
        assert_eq!(
            kind(409, "AnotherOperationInProgress"),
            ErrorKind::Retryable
        );
        assert_eq!(kind(412, "PreconditionFailed"), ErrorKind::Conflict);
        assert_eq!(kind(503, "ServiceUnavailable"), ErrorKind::Retryable);
        assert_eq!(kind(404, "NotFound"), ErrorKind::NotFound);
        assert_eq!(
            kind(400, "PrivateIPAddressIsAllocated"),
            ErrorKind::Permanent
        );
        assert_eq!(kind(400, "QuotaExceeded"), ErrorKind::Permanent);
        assert_eq!(kind(403, "AuthorizationFailed"), ErrorKind::Permanent);
        assert_eq!(classify("GET", "vm", 500, None).kind, ErrorKind::Retryable);
    }

    #[test]
    fn the_text_carries_code_and_message() {
        let e = classify(
            "PUT",
            "nic0",
            400,
            Some(&arm("PrivateIPAddressIsAllocated")),
        );
        assert_eq!(
            e.message,
            "PUT nic0: PrivateIPAddressIsAllocated (400): PrivateIPAddressIsAllocated happened"
        );
        let body = br#"{"error":{"code":"InUse","message":"taken"}}"#;
        assert_eq!(ArmError::from_body(body).unwrap().code, "InUse");
        assert!(ArmError::from_body(b"<html>").is_none());
    }

    #[test]
    fn a_failed_operation_reports_its_error_and_canceled_is_retried() {
        let e = operation_failed("nic0", "Failed", Some(&arm("PrivateIPAddressIsAllocated")));
        assert_eq!(e.kind, ErrorKind::Permanent);
        assert!(
            e.message.contains("PrivateIPAddressIsAllocated happened"),
            "{}",
            e.message
        );
        assert_eq!(
            operation_failed("nic0", "Canceled", None).kind,
            ErrorKind::Retryable
        );
    }

    #[test]
    fn retry_after_is_seconds_and_capped() {
        let cap = Duration::from_secs(30);
        assert_eq!(retry_after(Some("7"), cap), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(Some("3600"), cap), Some(cap));
        assert_eq!(
            retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), cap),
            None
        );
        assert_eq!(retry_after(None, cap), None);
    }
}
