//! An admission request's way in: it waits for its peer's share, then for the memory budget if
//! it is large or a read slot if it is small, reads its body under a deadline, and only then
//! takes one of the request slots.
//!
//! A slot is held for the review itself (microseconds of CPU on a body already in memory), never
//! while a client takes its time to send: clients that send headers and then trickle or stall
//! their bodies hold their own peer's share and their connections, not what kube-apiserver's
//! reviews need.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::budget::{BODY_LIMIT_BYTES, Budget};
use crate::peer::PeerRequests;
use crate::slots::Slots;

/// A body must arrive within this time once its headers have. kube-apiserver writes a review in
/// one go; a client that takes longer is answered 408 and gives back what it held.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// What admission requests take on their way in.
#[derive(Clone, Debug)]
pub struct Intake {
    /// The memory budget of large bodies.
    pub budget: Budget,
    /// The request slots.
    pub slots: Slots,
    /// The read slots of small bodies.
    pub small_reads: Slots,
}

/// Middleware of the admission routes; see the module's doc.
pub async fn admit(State(intake): State<Intake>, request: Request, next: Next) -> Response {
    // Requests that did not come through `server.rs` (in-process tests) have no peer.
    let peer = request.extensions().get::<PeerRequests>().cloned();
    let _peer_share = match peer {
        Some(peer) => match peer.acquire().await {
            Some(permit) => Some(permit),
            None => return unavailable(),
        },
        None => None,
    };
    let Ok(budget_share) = intake.budget.reserve(&request).await else {
        return unavailable();
    };
    // A large body is bounded by its share of the budget, a small one by a read slot.
    let read_slot = match &budget_share {
        Some(_) => None,
        None => match intake.small_reads.acquire().await {
            Some(slot) => Some(slot),
            None => return unavailable(),
        },
    };
    let (parts, body) = request.into_parts();
    let read = Limited::new(body, BODY_LIMIT_BYTES).collect();
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<LengthLimitError>() => {
            return (StatusCode::PAYLOAD_TOO_LARGE, "request body over 1 MiB").into_response();
        }
        Ok(Err(error)) => {
            tracing::debug!(%error, "request body unreadable");
            return (StatusCode::BAD_REQUEST, "request body unreadable").into_response();
        }
        Err(_) => {
            return (
                StatusCode::REQUEST_TIMEOUT,
                format!("request body not received within {BODY_READ_TIMEOUT:?}"),
            )
                .into_response();
        }
    };
    drop(read_slot);
    let Some(_slot) = intake.slots.acquire().await else {
        return unavailable();
    };
    next.run(Request::from_parts(parts, Body::from(body))).await
}

/// Only a closed semaphore fails, and nothing closes them.
fn unavailable() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "request limits closed").into_response()
}
