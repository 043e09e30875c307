//! The memory budget of admission requests: how many body bytes may be read and reviewed at once.
//!
//! A review costs a small multiple of its body while it is parsed and answered (the body, the
//! parsed object, the response), and a body may be up to [`BODY_LIMIT_BYTES`]. Counting requests
//! alone cannot bound that: 512 reviews of 1 MiB each are half a gigabyte. So every admission
//! request larger than [`SMALL_BYTES`] first takes its `Content-Length` (the limit when it sends
//! none) from one shared budget, in KiB, and gives it back when answered; requests beyond it wait,
//! in order, with their bodies still unread in the connection's small buffers (see `server.rs`),
//! and without holding one of the request slots (`intake.rs`). Real reviews are 1-4 KiB: they
//! pass uncharged, so a flood of large requests delays none of them; small bodies being read take
//! one of [`crate::slots::MAX_SMALL_READS`] read slots instead (32 MiB), each for at most
//! [`crate::intake::BODY_READ_TIMEOUT`].
//!
//! No crate offers a byte-weighted limit as a tower layer; this is a weighted
//! [`tokio::sync::Semaphore`] taken before the body is read.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A review holds one or two objects of well under 1 KiB (a CloudPrivateIPConfig, an
/// EgressRouter, a NetworkAttachmentDefinition); 1 MiB leaves room for large CNI configs while
/// a client cannot make each request buffer megabytes.
pub const BODY_LIMIT_BYTES: usize = 1024 * 1024;

/// Body bytes under review at once: 16 of the largest requests, or thousands of real ones.
pub const BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// Requests up to this size are not charged (every real review is far smaller).
pub const SMALL_BYTES: usize = 16 * 1024;

/// The unit the budget is counted in.
const UNIT: usize = 1024;

/// The shared budget.
#[derive(Clone, Debug)]
pub struct Budget(Arc<Semaphore>);

impl Default for Budget {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(BUDGET_BYTES / UNIT)))
    }
}

/// The KiB a request is charged: none when it declares at most [`SMALL_BYTES`], else its declared
/// length capped by the body limit (a longer body is refused by the limit without being read).
fn charge(request: &Request) -> Option<u32> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok())
        .unwrap_or(BODY_LIMIT_BYTES);
    if declared <= SMALL_BYTES {
        return None;
    }
    let kib = declared.min(BODY_LIMIT_BYTES).div_ceil(UNIT);
    Some(u32::try_from(kib).unwrap_or(u32::MAX))
}

impl Budget {
    /// Waits for a large request's share, in order of arrival; `None` for a small request,
    /// which is charged nothing. The share is given back when dropped. The wait borrows nothing
    /// of the request, whose body is not `Sync`.
    pub fn reserve(
        &self,
        request: &Request,
    ) -> impl Future<Output = Result<Option<OwnedSemaphorePermit>, Closed>> + Send + use<> {
        let kib = charge(request);
        let semaphore = Arc::clone(&self.0);
        async move {
            let Some(kib) = kib else {
                return Ok(None);
            };
            // Only a closed semaphore fails, and nothing closes it.
            semaphore
                .acquire_many_owned(kib)
                .await
                .map(Some)
                .map_err(|_| Closed)
        }
    }
}

/// The budget was closed (never, in practice).
#[derive(Debug, thiserror::Error)]
#[error("request budget closed")]
pub struct Closed;

#[cfg(test)]
mod tests {
    use axum::body::Body;

    use super::*;

    fn request(length: Option<&str>) -> Request {
        let mut builder = Request::builder().method("POST").uri("/validate");
        if let Some(length) = length {
            builder = builder.header(header::CONTENT_LENGTH, length);
        }
        builder.body(Body::empty()).unwrap_or_default()
    }

    #[test]
    fn a_large_request_is_charged_its_length_in_kib_and_at_most_the_limit() {
        assert_eq!(charge(&request(Some("2000"))), None);
        assert_eq!(charge(&request(Some("16384"))), None);
        assert_eq!(charge(&request(Some("16385"))), Some(17));
        assert_eq!(charge(&request(Some("99999999999"))), Some(1024));
        assert_eq!(charge(&request(None)), Some(1024));
        assert_eq!(charge(&request(Some("not a number"))), Some(1024));
    }
}
