//! The object controller's intake: the names of the objects to reconcile, handed to kube's
//! controller a bounded number at a time.
//!
//! kube's controller takes every request it is given into its scheduler at once. A burst of
//! 20,000 creates made 20,000 scheduled requests: two hash tables sized for them (about 4 MB
//! each at that size, never shrunk) and an entry and two object references each, the largest
//! part of the reconciler's memory after its caches (`make bench-scale`). Here a waiting name
//! costs a few dozen bytes, and at most `room` requests are in the controller's hands and not
//! started; a reconcile reads the object from the cache when it starts, so any number of events
//! of one object before then come to one request, as in kube's own queue. No crate offers such a
//! gate in front of kube's scheduler, and kube's controller has no bound of its own on it.

use std::collections::{HashSet, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use cloudnet_shared::CloudPrivateIPConfig;
use futures::Stream;
use kube::runtime::reflector::ObjectRef;

/// Objects waiting to be handed to the controller, and those handed and not started.
pub(crate) struct Intake {
    state: Mutex<State>,
    room: usize,
}

#[derive(Default)]
struct State {
    /// In the order their first event came.
    waiting: VecDeque<Arc<str>>,
    /// The same names, to skip an object already waiting.
    queued: HashSet<Arc<str>>,
    /// Handed to the controller; their reconcile has not started.
    handed: HashSet<Arc<str>>,
    /// The controller's poll, to wake when a name or room comes.
    waker: Option<Waker>,
}

impl Intake {
    /// An intake that leaves at most `room` requests unstarted in the controller's hands.
    pub(crate) fn new(room: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            room: room.max(1),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Object `name` is to be reconciled: it waits, unless it waits already or its request is
    /// in the controller's hands and not started (that reconcile will read what changed).
    pub(crate) fn push(&self, name: &str) {
        let mut state = self.state();
        if state.queued.contains(name) || state.handed.contains(name) {
            return;
        }
        let name: Arc<str> = Arc::from(name);
        state.queued.insert(Arc::clone(&name));
        state.waiting.push_back(name);
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
    }

    /// The reconcile of `name` started, or the controller dropped its request (the object was
    /// gone from the cache): its room goes to the next name.
    pub(crate) fn started(&self, name: &str) {
        let mut state = self.state();
        if state.handed.remove(name)
            && let Some(waker) = state.waker.take()
        {
            waker.wake();
        }
    }

    /// Names waiting, not yet handed to the controller.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.state().waiting.len()
    }

    /// The requests for the controller, as a stream that never ends.
    pub(crate) fn requests(self: &Arc<Self>) -> Requests {
        Requests(Arc::clone(self))
    }
}

/// The intake's requests for the controller ([`Intake::requests`]).
pub(crate) struct Requests(Arc<Intake>);

impl Stream for Requests {
    type Item = ObjectRef<CloudPrivateIPConfig>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let intake = &self.0;
        let mut state = intake.state();
        if state.handed.len() < intake.room
            && let Some(name) = state.waiting.pop_front()
        {
            state.queued.remove(&name);
            let request = ObjectRef::new(&name);
            state.handed.insert(name);
            return Poll::Ready(Some(request));
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use futures::task::noop_waker_ref;

    use super::*;

    fn next(requests: &mut Requests) -> Option<String> {
        let mut cx = Context::from_waker(noop_waker_ref());
        match Pin::new(requests).poll_next(&mut cx) {
            Poll::Ready(Some(r)) => Some(r.name),
            _ => None,
        }
    }

    #[test]
    fn names_go_in_order_of_their_first_event_and_at_most_room_at_a_time() {
        let intake = Intake::new(2);
        let mut requests = intake.requests();
        for name in ["a", "b", "a", "c", "b"] {
            intake.push(name);
        }
        assert_eq!(next(&mut requests).as_deref(), Some("a"));
        assert_eq!(next(&mut requests).as_deref(), Some("b"));
        assert_eq!(next(&mut requests), None, "two handed and not started");
        assert_eq!(intake.waiting(), 1);
        intake.started("a");
        assert_eq!(next(&mut requests).as_deref(), Some("c"));
        assert_eq!(next(&mut requests), None);
    }

    #[test]
    fn an_event_before_the_start_is_the_handed_requests_and_one_after_it_waits_again() {
        let intake = Intake::new(4);
        let mut requests = intake.requests();
        intake.push("a");
        assert_eq!(next(&mut requests).as_deref(), Some("a"));
        // Handed, not started: that reconcile will read this change.
        intake.push("a");
        assert_eq!(next(&mut requests), None);
        intake.started("a");
        // Started: it may have read the object before this change.
        intake.push("a");
        assert_eq!(next(&mut requests).as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn the_controller_is_woken_when_a_name_or_room_comes() {
        let intake = Intake::new(1);
        let mut requests = intake.requests();
        let waiter = tokio::spawn(async move {
            let first = requests.next().await.map(|r| r.name);
            let second = requests.next().await.map(|r| r.name);
            (first, second)
        });
        tokio::task::yield_now().await;
        intake.push("a");
        intake.push("b");
        tokio::task::yield_now().await;
        intake.started("a");
        let (first, second) = waiter.await.unwrap();
        assert_eq!(
            (first.as_deref(), second.as_deref()),
            (Some("a"), Some("b"))
        );
    }
}
