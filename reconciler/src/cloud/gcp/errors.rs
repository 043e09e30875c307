//! GCE errors to [`ErrorKind`]: HTTP answers of the API, the `error` of a finished zone operation,
//! and the client's own failures. The mapping lives here only.
//!
//! GCE error bodies: <https://cloud.google.com/compute/docs/api/handling-errors>; reasons such as
//! `rateLimitExceeded` sit in `error.errors[].reason`.

use google_cloud_gax::error::Error as GaxError;

use crate::cloud::{CloudError, ErrorKind};

/// An HTTP error answer of the Compute API.
pub fn classify_http(operation: &str, status: u16, body: &[u8]) -> CloudError {
    let (message, reasons) = parse_body(body);
    let message = message.unwrap_or_else(|| format!("HTTP {status}"));
    let text = format!("GCE {operation}: {message} (HTTP {status})");
    let rate_limited = reasons
        .iter()
        .any(|r| r == "rateLimitExceeded" || r == "userRateLimitExceeded");
    let kind = match status {
        429 => ErrorKind::Throttled,
        403 if rate_limited => ErrorKind::Throttled,
        // conditionNotMet: the fingerprint was stale; re-read and try again.
        412 => ErrorKind::Conflict,
        404 => ErrorKind::NotFound,
        408 | 500..=599 => ErrorKind::Retryable,
        _ => ErrorKind::Permanent,
    };
    CloudError::new(kind, text)
}

/// A failure of the client library: an HTTP answer, or no answer at all.
pub fn classify(operation: &str, error: &GaxError) -> CloudError {
    if let Some(status) = error.http_status_code() {
        let body = error.http_payload().map(|b| b.to_vec()).unwrap_or_default();
        if body.is_empty()
            && let Some(s) = error.status()
        {
            let body = serde_json::json!({"error": {"message": s.message}}).to_string();
            return classify_http(operation, status, body.as_bytes());
        }
        return classify_http(operation, status, &body);
    }
    if error.is_authentication() {
        // The token could not be had: a network blip at the token endpoint or a revoked key;
        // retrying soon costs little either way.
        return CloudError::retryable(format!("GCE {operation}: obtaining credentials: {error}"));
    }
    if error.is_binding() || error.is_serialization() {
        return CloudError::permanent(format!("GCE {operation}: {error}"));
    }
    CloudError::retryable(format!("GCE {operation}: {error}"))
}

/// The `error` of a zone operation that finished: one `code` per failure.
pub fn classify_operation(operation_name: &str, errors: &[(String, String)]) -> CloudError {
    let retryable = [
        "RESOURCE_NOT_READY",
        "RESOURCE_OPERATION_RATE_EXCEEDED",
        "INTERNAL_ERROR",
        "CONDITION_NOT_MET",
    ];
    let throttled = errors
        .iter()
        .any(|(code, _)| code.contains("RATE_LIMIT") || code == "QUOTA_EXCEEDED");
    let kind = if throttled {
        ErrorKind::Throttled
    } else if !errors.is_empty()
        && errors
            .iter()
            .all(|(code, _)| retryable.contains(&code.as_str()))
    {
        ErrorKind::Retryable
    } else {
        // IP_IN_USE_BY_ANOTHER_RESOURCE, INVALID_USAGE, ...: the request as such was refused.
        ErrorKind::Permanent
    };
    let detail: Vec<String> = errors
        .iter()
        .map(|(code, message)| format!("{code}: {message}"))
        .collect();
    CloudError::new(
        kind,
        format!(
            "GCE operation {operation_name} failed: {}",
            detail.join("; ")
        ),
    )
}

fn parse_body(body: &[u8]) -> (Option<String>, Vec<String>) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return (None, Vec::new());
    };
    let error = &value["error"];
    let message = error["message"].as_str().map(str::to_owned);
    let reasons = error["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["reason"].as_str().map(str::to_owned))
        .collect();
    (message, reasons)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(code: u16, reason: &str, message: &str) -> Vec<u8> {
        serde_json::json!({"error": {"code": code, "message": message,
            "errors": [{"domain": "usageLimits", "reason": reason, "message": message}]}})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn http_answers_map_to_kinds() {
        let cases = [
            (429, "rateLimitExceeded", ErrorKind::Throttled),
            (403, "rateLimitExceeded", ErrorKind::Throttled),
            (403, "userRateLimitExceeded", ErrorKind::Throttled),
            (403, "forbidden", ErrorKind::Permanent),
            (412, "conditionNotMet", ErrorKind::Conflict),
            (400, "required", ErrorKind::Permanent),
            (404, "notFound", ErrorKind::NotFound),
            (500, "backendError", ErrorKind::Retryable),
            (503, "backendError", ErrorKind::Retryable),
        ];
        for (status, reason, kind) in cases {
            let got = classify_http("instances.get", status, &body(status, reason, "boom"));
            assert_eq!(got.kind, kind, "{status} {reason}");
            assert!(got.message.contains("boom"), "{}", got.message);
            assert!(got.message.contains(&status.to_string()), "{}", got.message);
        }
    }

    #[test]
    fn a_body_that_is_not_json_still_names_the_status() {
        let got = classify_http("instances.get", 502, b"<html>bad gateway</html>");
        assert_eq!(got.kind, ErrorKind::Retryable);
        assert!(got.message.contains("HTTP 502"));
    }

    #[test]
    fn operation_errors_map_to_kinds() {
        let e = |code: &str| vec![(code.to_owned(), "m".to_owned())];
        assert_eq!(
            classify_operation("op-1", &e("IP_IN_USE_BY_ANOTHER_RESOURCE")).kind,
            ErrorKind::Permanent
        );
        assert_eq!(
            classify_operation("op-1", &e("RESOURCE_NOT_READY")).kind,
            ErrorKind::Retryable
        );
        assert_eq!(
            classify_operation("op-1", &e("RATE_LIMIT_EXCEEDED")).kind,
            ErrorKind::Throttled
        );
        let m = classify_operation("op-1", &e("IP_IN_USE_BY_ANOTHER_RESOURCE")).message;
        assert!(
            m.contains("IP_IN_USE_BY_ANOTHER_RESOURCE") && m.contains("op-1"),
            "{m}"
        );
    }
}
