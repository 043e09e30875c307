//! Counted slots (request slots, connection slots) that remember since when every one has been
//! held, so that `/readyz` can tell a replica that is saturated from one that is merely busy.
//!
//! tower's `GlobalConcurrencyLimitLayer` and a bare [`Semaphore`] say how many permits are free
//! now, not for how long none has been; this wraps the semaphore to record that moment.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Requests reviewed at once (after their bodies are read; see `intake.rs`).
pub const MAX_CONCURRENT_REQUESTS: usize = 512;
/// Open connections at once; further clients wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 1024;
/// Small bodies (at most [`crate::budget::SMALL_BYTES`]) being read at once: 32 MiB at most.
/// Each is read within [`crate::intake::BODY_READ_TIMEOUT`], so one waiting for a read slot waits
/// about that long even when others hold them all.
pub const MAX_SMALL_READS: usize = 2048;
/// How long every slot of a kind must stay held, none freed, before `/readyz` says not ready.
/// Short against the readiness probe's 5 s period, long against any one review (microseconds
/// once its body is read), so a burst that turns slots over stays ready.
pub const SATURATED_AFTER: Duration = Duration::from_secs(2);

/// A fixed number of slots, and since when all of them have been held.
#[derive(Clone, Debug)]
pub struct Slots(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    semaphore: Arc<Semaphore>,
    total: usize,
    full_since: Mutex<Option<Instant>>,
}

impl Slots {
    /// `total` slots, all free.
    pub fn new(total: usize) -> Self {
        Self(Arc::new(Inner {
            semaphore: Arc::new(Semaphore::new(total)),
            total,
            full_since: Mutex::new(None),
        }))
    }

    /// Waits for a slot, in order of arrival.
    pub async fn acquire(&self) -> Option<Slot> {
        let permit = Arc::clone(&self.0.semaphore).acquire_owned().await.ok()?;
        if self.0.semaphore.available_permits() == 0 {
            self.full_since().get_or_insert_with(Instant::now);
        }
        Some(Slot {
            permit: Some(permit),
            slots: self.clone(),
        })
    }

    /// Slots held now.
    pub fn held(&self) -> usize {
        self.0.total - self.0.semaphore.available_permits()
    }

    /// How many slots there are.
    pub fn total(&self) -> usize {
        self.0.total
    }

    /// Waits until every slot is free again (the drain at shutdown), at most `timeout`;
    /// returns whether they all are.
    pub async fn all_free_within(&self, timeout: Duration) -> bool {
        let all = u32::try_from(self.0.total).unwrap_or(u32::MAX);
        tokio::time::timeout(timeout, self.0.semaphore.acquire_many(all))
            .await
            .is_ok()
    }

    /// How long every slot has been held without one coming free, if it has.
    pub fn saturated_for(&self, now: Instant) -> Option<Duration> {
        let since = (*self.full_since())?;
        Some(now.saturating_duration_since(since))
    }

    fn full_since(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.0
            .full_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One held slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    slots: Slots,
}

impl Drop for Slot {
    fn drop(&mut self) {
        drop(self.permit.take());
        // A waiter is handed the freed permit at once and the count stays at zero: still full.
        if self.slots.0.semaphore.available_permits() > 0 {
            *self.slots.full_since() = None;
        }
    }
}

/// The slots connections and requests take.
#[derive(Clone, Debug)]
pub struct Capacity {
    /// Requests under review; `/readyz` reports their saturation.
    pub requests: Slots,
    /// Open connections; `/readyz` reports their saturation.
    pub connections: Slots,
    /// Small bodies being read. Not reported: they free within the body deadline, so a review
    /// waiting for one is late, not lost, and an unlisted replica would turn that into a refusal.
    pub small_reads: Slots,
}

impl Default for Capacity {
    fn default() -> Self {
        Self {
            requests: Slots::new(MAX_CONCURRENT_REQUESTS),
            connections: connection_slots(),
            small_reads: Slots::new(MAX_SMALL_READS),
        }
    }
}

/// The slots of [`MAX_CONNECTIONS`] connections, plus the one the accept loop holds while it
/// waits for the next client, so that "every slot held" means the connections are at their cap.
pub fn connection_slots() -> Slots {
    Slots::new(MAX_CONNECTIONS + 1)
}

impl Capacity {
    /// Why the replica should not be listed: every slot of one kind held for
    /// [`SATURATED_AFTER`] without one coming free.
    pub fn saturated(&self, now: Instant) -> Option<&'static str> {
        let long = |slots: &Slots| {
            slots
                .saturated_for(now)
                .is_some_and(|d| d >= SATURATED_AFTER)
        };
        if long(&self.connections) {
            Some("saturated: every connection slot held, none freed lately")
        } else if long(&self.requests) {
            Some("saturated: every request slot held, none freed lately")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn saturation_counts_from_the_last_slot_taken_and_ends_when_one_comes_free() {
        let capacity = Capacity {
            requests: Slots::new(2),
            connections: Slots::new(4),
            small_reads: Slots::new(1),
        };
        let first = capacity.requests.acquire().await;
        assert!(first.is_some());
        tokio::time::advance(SATURATED_AFTER * 2).await;
        assert_eq!(capacity.saturated(Instant::now()), None, "a slot is free");
        let second = capacity.requests.acquire().await;
        assert_eq!(capacity.requests.held(), 2);
        tokio::time::advance(SATURATED_AFTER / 2).await;
        assert_eq!(capacity.saturated(Instant::now()), None, "not yet long");
        tokio::time::advance(SATURATED_AFTER).await;
        assert!(capacity.saturated(Instant::now()).is_some());

        // A freed slot handed straight to a waiter leaves every slot held.
        let requests = capacity.requests.clone();
        let waiter = tokio::spawn(async move { requests.acquire().await });
        tokio::task::yield_now().await;
        drop(first);
        let third = waiter.await.ok().flatten();
        assert!(third.is_some());
        assert!(capacity.saturated(Instant::now()).is_some());

        drop(second);
        assert_eq!(capacity.saturated(Instant::now()), None);
        drop(third);
    }
}
