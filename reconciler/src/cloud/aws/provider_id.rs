//! Node `spec.providerID` → EC2 instance id, for every form the AWS cloud provider writes.

use thiserror::Error;

/// A providerID that names no EC2 instance. The message says what was expected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ProviderIdError {
    /// The providerID is empty (the cloud provider has not initialised the node yet).
    #[error("providerID is empty; the node is not initialised by the AWS cloud provider yet")]
    Empty,
    /// The scheme is not `aws://`.
    #[error("providerID {0:?} is not an AWS one: expected aws:///<zone>/<instance-id>")]
    NotAws(String),
    /// The last path segment is not an instance id.
    #[error(
        "providerID {0:?} does not end in an EC2 instance id (i-<hex>): expected aws:///<zone>/<instance-id>"
    )]
    NoInstance(String),
    /// More segments than `<zone>/<instance>`.
    #[error("providerID {0:?} has too many path segments: expected aws:///<zone>/<instance-id>")]
    TooManySegments(String),
}

/// The instance id (`i-…`) named by `provider_id`.
///
/// Accepted forms (SPEC §4): `aws:///<zone>/<id>`, `aws://<zone>/<id>`, `aws:///<id>`,
/// `aws://<id>`. The zone is not checked: the instance id alone identifies the VM in a region.
pub fn instance_id(provider_id: &str) -> Result<&str, ProviderIdError> {
    let trimmed = provider_id.trim();
    if trimmed.is_empty() {
        return Err(ProviderIdError::Empty);
    }
    let rest = trimmed
        .strip_prefix("aws://")
        .ok_or_else(|| ProviderIdError::NotAws(provider_id.to_owned()))?;
    let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    let id = match segments.as_slice() {
        [id] | [_, id] => *id,
        _ => return Err(ProviderIdError::TooManySegments(provider_id.to_owned())),
    };
    if is_instance_id(id) {
        Ok(id)
    } else {
        Err(ProviderIdError::NoInstance(provider_id.to_owned()))
    }
}

/// `i-` followed by 8 or 17 lower-case hex digits (the old and the current format).
fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_form_yields_the_instance() {
        let cases = [
            (
                "aws:///us-east-1a/i-0123456789abcdef0",
                "i-0123456789abcdef0",
            ),
            (
                "aws://us-east-1a/i-0123456789abcdef0",
                "i-0123456789abcdef0",
            ),
            ("aws:///i-0123456789abcdef0", "i-0123456789abcdef0"),
            ("aws://i-0123456789abcdef0", "i-0123456789abcdef0"),
            ("aws:///eu-west-3c/i-deadbeef", "i-deadbeef"),
            (
                " aws:///us-east-1a/i-0123456789abcdef0 ",
                "i-0123456789abcdef0",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(instance_id(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn malformed_provider_ids_are_refused_with_the_reason() {
        type Expect = fn(String) -> ProviderIdError;
        let cases: [(&str, Expect); 7] = [
            ("gce://p/z/i-0123456789abcdef0", ProviderIdError::NotAws),
            ("i-0123456789abcdef0", ProviderIdError::NotAws),
            ("aws:///us-east-1a/", ProviderIdError::NoInstance),
            ("aws:///us-east-1a/vm-1", ProviderIdError::NoInstance),
            (
                "aws:///us-east-1a/i-0123456789ABCDEF0",
                ProviderIdError::NoInstance,
            ),
            ("aws:///us-east-1a/i-012345", ProviderIdError::NoInstance),
            (
                "aws:///a/b/i-0123456789abcdef0",
                ProviderIdError::TooManySegments,
            ),
        ];
        for (input, want) in cases {
            assert_eq!(instance_id(input), Err(want(input.to_owned())), "{input}");
        }
        assert_eq!(instance_id(""), Err(ProviderIdError::Empty));
    }

    #[test]
    fn errors_show_the_expected_form() {
        let message = instance_id("aws:///zone/vm").unwrap_err().to_string();
        assert!(message.contains("aws:///<zone>/<instance-id>"), "{message}");
    }
}
