//! Calls let through the rate gate whose tokens the bucket may still show: a call takes its
//! token only when it reaches the cloud, after the ledger's write and the provider's read (a
//! few hundred milliseconds under load), and until then the gate must not hand the same token
//! to the next lane. Without this, while IPs kept arriving at 1,000 nodes, every lane waiting
//! its turn passed a full bucket within that time, each with the IPs it had so far, and the
//! burst's calls came in rushes of the in-flight bound with one or two IPs each.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// How many calls are claimed, and a wake-up when one ends.
#[derive(Default)]
pub(super) struct Claims {
    count: AtomicUsize,
    released: Notify,
}

impl Claims {
    /// Calls let through and not finished.
    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// A call let through; it stays claimed until the guard drops.
    pub(super) fn claim(&self) -> Claim<'_> {
        self.count.fetch_add(1, Ordering::AcqRel);
        Claim(self)
    }

    /// Resolves at the next release; registered before `count` is read, so that a release in
    /// between still wakes the waiter.
    pub(super) fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.released.notified()
    }
}

/// One claimed call; released when dropped.
pub(super) struct Claim<'a>(&'a Claims);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.0.released.notify_waiters();
    }
}
