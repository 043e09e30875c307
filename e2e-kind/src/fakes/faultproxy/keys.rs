//! EC2's part for a revoked access key: once a test names the one key EC2 accepts, a call signed
//! with any other key gets EC2's own `AuthFailure` answer, as after a rotation whose old key was
//! deactivated. moto accepts every key, so a credential rotation can only be asserted here.
//! Calls are counted per key (the SigV4 `Credential=<AKID>/` of the Authorization header).

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode, header};
use http_body_util::Full;

use super::dialect;

/// Calls seen signed with one access key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyCounts {
    /// Let through to the rest of the proxy's rules.
    pub accepted: u64,
    /// Answered `AuthFailure` by the proxy.
    pub refused: u64,
}

/// The key EC2 accepts (`None`: every key, moto's behaviour) and the calls per key.
#[derive(Debug, Default)]
pub(crate) struct AccessKeys {
    only: Option<String>,
    counts: BTreeMap<String, KeyCounts>,
}

impl AccessKeys {
    pub(crate) fn accept_only(&mut self, key: Option<String>) {
        self.only = key;
    }

    pub(crate) fn counts(&self) -> BTreeMap<String, KeyCounts> {
        self.counts.clone()
    }

    pub(crate) fn reset_counts(&mut self) {
        self.counts.clear();
    }

    /// Counts the call under its key and, if that key is not the accepted one, EC2's refusal.
    pub(crate) fn refusal(
        &mut self,
        headers: &HeaderMap,
        request_id: impl FnOnce() -> u64,
    ) -> Option<Response<Full<Bytes>>> {
        let key = signing_key(headers).unwrap_or_default();
        let refused = self.only.as_ref().is_some_and(|only| *only != key);
        let counts = self.counts.entry(key).or_default();
        if !refused {
            counts.accepted += 1;
            return None;
        }
        counts.refused += 1;
        Some(dialect::ec2_error(
            StatusCode::UNAUTHORIZED,
            "AuthFailure",
            "AWS was not able to validate the provided access credentials",
            request_id(),
        ))
    }
}

/// The access key id of a SigV4 Authorization header (`… Credential=AKID/date/region/…`).
fn signing_key(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (_, credential) = value.split_once("Credential=")?;
    let (key, _) = credential.split_once('/')?;
    Some(key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(key: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = format!(
            "AWS4-HMAC-SHA256 Credential={key}/20260101/us-east-1/ec2/aws4_request, \
             SignedHeaders=host;x-amz-date, Signature=00"
        );
        headers.insert(header::AUTHORIZATION, value.parse().unwrap());
        headers
    }

    #[test]
    fn every_key_passes_until_one_is_named_then_others_get_auth_failure() {
        let mut keys = AccessKeys::default();
        assert!(keys.refusal(&signed("OLD"), || 1).is_none());
        keys.accept_only(Some("NEW".into()));
        let refused = keys.refusal(&signed("OLD"), || 2).unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert!(keys.refusal(&signed("NEW"), || 3).is_none());
        assert!(keys.refusal(&HeaderMap::new(), || 4).is_some());
        let counts = keys.counts();
        assert_eq!(
            counts["OLD"],
            KeyCounts {
                accepted: 1,
                refused: 1
            }
        );
        assert_eq!(counts["NEW"].accepted, 1);
        assert_eq!(counts[""].refused, 1);
    }
}
