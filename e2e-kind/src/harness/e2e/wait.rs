//! Bounded polls on conditions: the suite's only way of waiting.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// How often a condition is re-checked.
pub const POLL: Duration = Duration::from_millis(50);

/// Polls `check` every [`POLL`] until it returns `Ok(true)`; an `Err` ends the wait at once, and
/// `timeout` ends it with an error naming `what`.
pub async fn until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    found(timeout, what, || {
        let fut = check();
        async move { Ok(fut.await?.then_some(())) }
    })
    .await
}

/// Polls `check` every [`POLL`] until it returns `Ok(Some(value))` and returns the value.
pub async fn found<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}
