//! The public-IP edits waiting on each NIC, so that one guarded PUT carries them all: a failover
//! that moves several bound egress IPs onto one NIC costs ARM one or two long-running PUTs
//! instead of one each, and no two of our PUTs of one NIC race each other for its etag.
//!
//! The edit whose turn it is reads the NIC and then takes every edit queued by then, its own
//! included; edits that arrive while that PUT runs (about a second: ARM's operation is followed
//! to its end) go together in the next. Hand-written because the batch closes on the NIC's
//! read and write, not on a size or a timer, which is what batching crates offer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// One queued edit and where its answer goes.
pub(super) type Waiting<E, O> = (E, oneshot::Sender<O>);

/// Each NIC's queue, by lower-case NIC id (ARM ids are case-insensitive).
type Queues<E, O> = Arc<Mutex<HashMap<String, Arc<Queue<E, O>>>>>;

/// The edits waiting on each NIC.
pub(super) struct NicEdits<E, O> {
    queues: Queues<E, O>,
}

impl<E, O> Default for NicEdits<E, O> {
    fn default() -> Self {
        Self {
            queues: Arc::default(),
        }
    }
}

/// The edits waiting on one NIC, and the turn to write them.
pub(super) struct Queue<E, O> {
    waiting: Mutex<Vec<Waiting<E, O>>>,
    turn: tokio::sync::Mutex<()>,
}

impl<E, O> Default for Queue<E, O> {
    fn default() -> Self {
        Self {
            waiting: Mutex::default(),
            turn: tokio::sync::Mutex::default(),
        }
    }
}

/// An edit's place on its NIC's queue; dropping it drops the queue once nobody needs it.
pub(super) struct Ticket<E, O> {
    queues: Queues<E, O>,
    key: String,
    queue: Arc<Queue<E, O>>,
}

impl<E, O> NicEdits<E, O> {
    /// Queues `edit` on NIC `nic_id`: the ticket to take a turn with, and the edit's answer.
    pub(super) fn queue(&self, nic_id: &str, edit: E) -> (Ticket<E, O>, oneshot::Receiver<O>) {
        let key = nic_id.to_ascii_lowercase();
        let queue = Arc::clone(lock(&self.queues).entry(key.clone()).or_default());
        let (reply, answer) = oneshot::channel();
        lock(&queue.waiting).push((edit, reply));
        let ticket = Ticket {
            queues: Arc::clone(&self.queues),
            key,
            queue,
        };
        (ticket, answer)
    }

    /// How many NICs have a queue now.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.queues).len()
    }
}

impl<E, O> Ticket<E, O> {
    /// Waits for this NIC's turn; edits queued meanwhile are written by whoever holds it.
    pub(super) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.queue.turn.lock().await
    }

    /// Whether any edit still waits (its own may have gone in an earlier turn's PUT).
    pub(super) fn any_waiting(&self) -> bool {
        lock(&self.queue.waiting)
            .iter()
            .any(|(_, reply)| !reply.is_closed())
    }

    /// Every waiting edit whose caller still waits for it: a cancelled call's edit is dropped,
    /// never written later behind its caller's back.
    pub(super) fn take(&self) -> Vec<Waiting<E, O>> {
        let mut taken = std::mem::take(&mut *lock(&self.queue.waiting));
        taken.retain(|(_, reply)| !reply.is_closed());
        taken
    }
}

impl<E, O> Drop for Ticket<E, O> {
    fn drop(&mut self) {
        let mut queues = lock(&self.queues);
        // The map's reference and ours: nobody else can queue on it any more.
        let idle = Arc::strong_count(&self.queue) == 2
            && queues
                .get(&self.key)
                .is_some_and(|q| Arc::ptr_eq(q, &self.queue));
        if idle {
            queues.remove(&self.key);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn edits_queued_before_a_turn_is_used_are_taken_together_and_the_queue_goes_after() {
        let edits: NicEdits<u32, u32> = NicEdits::default();
        let (first, first_answer) = edits.queue("/subscriptions/S/NIC", 1);
        let (second, second_answer) = edits.queue("/subscriptions/s/nic", 2);
        let (other, _) = edits.queue("/subscriptions/s/other", 3);
        assert_eq!(
            edits.len(),
            2,
            "one queue per NIC, ids compared without case"
        );

        let turn = first.turn().await;
        let taken = first.take();
        assert_eq!(taken.iter().map(|(e, _)| *e).collect::<Vec<_>>(), [1, 2]);
        for (edit, reply) in taken {
            reply.send(edit * 10).unwrap();
        }
        drop(turn);
        assert!(!second.any_waiting(), "its edit went in the first turn");
        assert_eq!(first_answer.await.unwrap(), 10);
        assert_eq!(second_answer.await.unwrap(), 20);

        drop(first);
        assert_eq!(edits.len(), 2, "the second ticket still holds the queue");
        drop(second);
        drop(other);
        assert_eq!(edits.len(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_callers_edit_is_never_written() {
        let edits: NicEdits<u32, u32> = NicEdits::default();
        let (ticket, _answer) = edits.queue("nic", 1);
        let (cancelled, answer) = edits.queue("nic", 2);
        drop((cancelled, answer));
        assert!(ticket.any_waiting());
        assert_eq!(
            ticket.take().iter().map(|(e, _)| *e).collect::<Vec<_>>(),
            [1]
        );
        assert!(!ticket.any_waiting());
        let (_cancelled, answer) = edits.queue("nic", 3);
        drop(answer);
        assert!(!ticket.any_waiting(), "nothing waits for the third");
    }
}
