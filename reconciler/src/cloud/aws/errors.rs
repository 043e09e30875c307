//! EC2 failures → [`CloudError`]: the one place that decides which errors are retried and how
//! each reads in a condition message. Only the error code and EC2's own message are used, so no
//! request detail (signed headers, credentials) can leak into a status.

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};

use aws_credential_types::provider::error::CredentialsError;

use super::web_identity::WebIdentityError;
use crate::cloud::{CloudError, ErrorKind};

/// Error codes EC2 uses when it throttles a caller.
const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
];

/// Error codes for a server-side failure worth retrying.
const TRANSIENT_CODES: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
    "IncorrectState",
];

/// Error codes meaning the instance or interface is gone. (A `….Malformed` id names nothing
/// that could ever have held an address, so it is a plain refusal, not a vanished resource.)
const NOT_FOUND_CODES: &[&str] = &[
    "InvalidInstanceID.NotFound",
    "InvalidNetworkInterfaceID.NotFound",
];

/// The [`CloudError`] for a failed call of `operation` (an EC2 action name).
pub fn classify<E, R>(operation: &str, error: &SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    if let Some(reason) = credentials_failure(error) {
        // Retried slowly by the engine, not at once here: a refused token or role stays refused
        // for a while, and STS's own client already retried a passing failure.
        return CloudError::permanent(format!("EC2 {operation}: no AWS credentials: {reason}"));
    }
    match error {
        SdkError::TimeoutError(_) => CloudError::retryable(format!("EC2 {operation} timed out")),
        SdkError::DispatchFailure(failure) => {
            let what = if failure.is_timeout() {
                "timed out"
            } else if failure.is_io() {
                "failed: connection error"
            } else {
                "failed: could not reach the EC2 endpoint"
            };
            // The connector's causes say what failed (refused, DNS, TLS, the proxy's answer); they
            // name hosts and OS errors, never credentials.
            let cause = failure
                .as_connector_error()
                .map(|e| format!(": {}", cloudnet_shared::report::one_line(e)))
                .unwrap_or_default();
            CloudError::retryable(format!("EC2 {operation} {what}{cause}"))
        }
        SdkError::ResponseError(_) => CloudError::retryable(format!(
            "EC2 {operation} failed: unreadable response from the EC2 endpoint"
        )),
        SdkError::ConstructionFailure(_) => {
            CloudError::permanent(format!("EC2 {operation}: could not build the request"))
        }
        _ => from_code(operation, error.code(), error.message()),
    }
}

/// Why the credentials for a call could not be had, when that is why it failed: the SDK fails
/// such a call before sending it, as a dispatch failure. Only our own web identity error is shown
/// (it names the role and the token file, never the token); the SDK's wording stands in for any
/// other credentials error.
fn credentials_failure<E, R>(error: &SdkError<E, R>) -> Option<String>
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let mut source = std::error::Error::source(error);
    let mut found = None;
    while let Some(link) = source {
        if let Some(ours) = link.downcast_ref::<WebIdentityError>() {
            return Some(ours.to_string());
        }
        if link.is::<CredentialsError>() || link.to_string().contains("identity resolver timed out")
        {
            found.get_or_insert_with(|| link.to_string());
        }
        source = link.source();
    }
    found
}

/// The [`CloudError`] for EC2 error `code` with `message`.
pub fn from_code(operation: &str, code: Option<&str>, message: Option<&str>) -> CloudError {
    let message = message.unwrap_or("no message");
    let Some(code) = code else {
        return CloudError::retryable(format!("EC2 {operation} failed: {message}"));
    };
    if THROTTLING_CODES.contains(&code) {
        return CloudError::throttled(format!("EC2 throttled {operation} ({code}): {message}"));
    }
    if TRANSIENT_CODES.contains(&code) {
        return CloudError::retryable(format!("EC2 {operation} failed ({code}): {message}"));
    }
    if NOT_FOUND_CODES.contains(&code) {
        return CloudError::not_found(format!("EC2 {operation} ({code}): {message}"));
    }
    match code {
        "PrivateIpAddressLimitExceeded" => CloudError::permanent(format!(
            "EC2 {operation} refused: the interface has no room for more addresses of this family \
             (PrivateIpAddressLimitExceeded): {message}"
        )),
        "InvalidIPAddress.InUse" => CloudError::permanent(format!(
            "EC2 {operation} refused: the address is already in use by another interface \
             (InvalidIPAddress.InUse): {message}"
        )),
        "AuthFailure" | "UnauthorizedOperation" => CloudError::permanent(format!(
            "EC2 {operation} refused ({code}): check the credentials and their IAM permissions"
        )),
        _ => CloudError::permanent(format!("EC2 {operation} failed ({code}): {message}")),
    }
}

/// The error codes of a request naming an instance id EC2 cannot use; EC2 names the ids in the
/// message ("The instance IDs 'i-1, i-2' do not exist").
const INSTANCE_ID_CODES: &[&str] = &["InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"];

/// The ids among `asked` that `error` refuses, when it is an instance-id error naming them.
pub fn named_instances(error: &CloudError, asked: &[String]) -> Vec<String> {
    if !INSTANCE_ID_CODES.iter().any(|c| error.message.contains(c)) {
        return Vec::new();
    }
    let mut named: Vec<String> = error
        .message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| asked.iter().any(|id| id == word))
        .map(str::to_owned)
        .collect();
    named.sort_unstable();
    named.dedup();
    named
}

/// The error for `id` alone, out of a call that `error` refused for naming it (among others).
pub fn instance_refused(error: &CloudError, id: &str) -> CloudError {
    let message = if error.kind == ErrorKind::NotFound {
        format!("EC2 instance {id} not found (InvalidInstanceID.NotFound)")
    } else {
        format!("EC2 refused instance id {id}: {}", error.message)
    };
    CloudError::new(error.kind, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_documented_kinds_and_messages() {
        let cases = [
            ("RequestLimitExceeded", ErrorKind::Throttled, "throttled"),
            ("Throttling", ErrorKind::Throttled, "throttled"),
            ("InternalError", ErrorKind::Retryable, "InternalError"),
            (
                "InvalidInstanceID.NotFound",
                ErrorKind::NotFound,
                "NotFound",
            ),
            (
                "InvalidNetworkInterfaceID.NotFound",
                ErrorKind::NotFound,
                "NotFound",
            ),
            (
                "InvalidInstanceID.Malformed",
                ErrorKind::Permanent,
                "Malformed",
            ),
            (
                "PrivateIpAddressLimitExceeded",
                ErrorKind::Permanent,
                "no room for more addresses",
            ),
            (
                "InvalidIPAddress.InUse",
                ErrorKind::Permanent,
                "already in use",
            ),
            (
                "InvalidParameterValue",
                ErrorKind::Permanent,
                "InvalidParameterValue",
            ),
        ];
        for (code, kind, phrase) in cases {
            let error = from_code("AssignPrivateIpAddresses", Some(code), Some("detail"));
            assert_eq!(error.kind, kind, "{code}");
            assert!(error.message.contains(phrase), "{code}: {}", error.message);
            assert!(
                error.message.contains("AssignPrivateIpAddresses"),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn auth_failures_never_echo_the_message() {
        let error = from_code(
            "DescribeInstances",
            Some("AuthFailure"),
            Some("key AKIDSECRET"),
        );
        assert_eq!(error.kind, ErrorKind::Permanent);
        assert!(!error.message.contains("AKIDSECRET"), "{}", error.message);
    }

    #[test]
    fn an_answer_without_a_code_is_retried() {
        assert_eq!(from_code("X", None, None).kind, ErrorKind::Retryable);
    }

    #[test]
    fn an_instance_id_error_names_the_ids_to_answer_apart() {
        let asked = ["i-0a1", "i-0b2", "i-0c3"].map(String::from);
        let many = from_code(
            "DescribeInstances",
            Some("InvalidInstanceID.NotFound"),
            Some("The instance IDs 'i-0c3, i-0a1' do not exist"),
        );
        assert_eq!(named_instances(&many, &asked), ["i-0a1", "i-0c3"]);
        let alone = instance_refused(&many, "i-0a1");
        assert_eq!(alone.kind, ErrorKind::NotFound);
        assert!(!alone.message.contains("i-0c3"), "{}", alone.message);
        let malformed = from_code(
            "DescribeInstances",
            Some("InvalidInstanceID.Malformed"),
            Some("Invalid id: \"i-0b2\""),
        );
        assert_eq!(named_instances(&malformed, &asked), ["i-0b2"]);
        assert_eq!(
            instance_refused(&malformed, "i-0b2").kind,
            ErrorKind::Permanent
        );
        // Another code naming an id, or an id error naming none of ours, names nothing.
        let other = from_code("DescribeInstances", Some("InternalError"), Some("i-0a1"));
        assert!(named_instances(&other, &asked).is_empty());
        let stranger = from_code(
            "DescribeInstances",
            Some("InvalidInstanceID.NotFound"),
            Some("The instance ID 'i-0ff' does not exist"),
        );
        assert!(named_instances(&stranger, &asked).is_empty());
    }
}
