//! One memo of slow-changing cloud facts (a subnet's CIDRs, an instance type's limits), read by
//! one caller while concurrent callers of the same key wait for that read: a fresh cluster asks
//! for every node at the same moment.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::cloud::CloudError;

/// One key's value once read, and when; concurrent first reads share the cell.
type Slot<V> = Arc<OnceCell<(Instant, V)>>;

/// Values by key, each read once and reused for the memo's lifetime (`None`: forever).
#[derive(Debug)]
pub struct Memo<V> {
    ttl: Option<Duration>,
    cells: Mutex<HashMap<String, Slot<V>>>,
}

impl<V: Clone> Memo<V> {
    /// A memo whose values are read again once they are `ttl` old.
    pub fn expiring(ttl: Duration) -> Self {
        Self {
            ttl: Some(ttl),
            cells: Mutex::default(),
        }
    }

    /// A memo of values that never change.
    pub fn forever() -> Self {
        Self {
            ttl: None,
            cells: Mutex::default(),
        }
    }

    /// `key`'s value: remembered, or from `read` (a failed read is not remembered).
    pub async fn get<F, Fut>(&self, key: &str, read: F) -> Result<V, CloudError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, CloudError>>,
    {
        let cell = {
            let mut cells = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
            let cell = cells.entry(key.to_owned()).or_default();
            if let (Some(ttl), Some((at, _))) = (self.ttl, cell.get())
                && at.elapsed() >= ttl
            {
                *cell = Arc::default();
            }
            Arc::clone(cell)
        };
        let init = || async { Ok((Instant::now(), read().await?)) };
        cell.get_or_try_init(init)
            .await
            .map(|(_, value)| value.clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn concurrent_first_reads_share_one_and_failures_are_not_kept() {
        let memo = Memo::<u32>::forever();
        let reads = AtomicUsize::new(0);
        let read = || async {
            reads.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            Ok(7)
        };
        let (a, b) = tokio::join!(memo.get("k", read), memo.get("k", read));
        assert_eq!((a.unwrap(), b.unwrap()), (7, 7));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        let failed = memo
            .get("other", || async { Err(CloudError::retryable("down")) })
            .await;
        assert!(failed.is_err());
        assert_eq!(memo.get("other", || async { Ok(9) }).await.unwrap(), 9);
    }

    #[tokio::test]
    async fn an_expired_value_is_read_again() {
        let memo = Memo::<u32>::expiring(Duration::ZERO);
        assert_eq!(memo.get("k", || async { Ok(1) }).await.unwrap(), 1);
        assert_eq!(memo.get("k", || async { Ok(2) }).await.unwrap(), 2);
        let kept = Memo::<u32>::expiring(Duration::from_secs(3600));
        assert_eq!(kept.get("k", || async { Ok(1) }).await.unwrap(), 1);
        assert_eq!(kept.get("k", || async { Ok(2) }).await.unwrap(), 1);
    }
}
