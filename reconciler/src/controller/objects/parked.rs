//! IPs whose cloud call is under way after their reconcile ended. A reconcile that has written
//! its object's `CloudResponsePending` status hands the IP to its node's lane and returns, so
//! that its slot (and its future, the object its write returned and its span) is not held while
//! the IP waits for the VM's call: at 20,000 objects over 5,000 nodes, 4,096 such waiting
//! reconciles cost about 30 MiB. The lane's answer lands here, in a small record per object (the
//! call, its VM, the answer), and the object is queued for a reconcile again through the
//! controller's triggers; that reconcile writes what the waiting one would have written after
//! the call.
//!
//! An object deleted while its IP waits (its finalizer taken off by hand, or
//! kubernetes/kubernetes#77988) gets no further reconcile: its attach, once answered, goes out as
//! an [`Orphan`], to be detached again as a waiting reconcile would have.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cloudnet_shared::CloudPrivateIPConfig;
use futures::channel::mpsc;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;

use crate::cloud::{CloudError, NodeTarget};
use crate::controller::plan::AfterDetach;
use crate::engine::lanes::Announced;

/// The cloud step an object's IP waits for.
pub(crate) enum Call {
    /// An attach to `target`'s VM; `moving`: the attach half of a move (upstream's move texts).
    Attach { target: NodeTarget, moving: bool },
    /// A detach from `node`, then `then`; `next`: the attach half of a move, announced to its
    /// new node.
    Detach {
        node: String,
        then: AfterDetach,
        next: Option<Announced>,
    },
}

/// One object's IP in a lane, and the answer once it came.
struct Parcel {
    call: Call,
    answer: Option<Result<(), CloudError>>,
    /// The object, once the watch showed it deleted before the answer came.
    gone: Option<Arc<CloudPrivateIPConfig>>,
}

/// An attach answered after its object was deleted: its IP is to be detached again.
pub(crate) struct Orphan {
    pub(crate) object: Arc<CloudPrivateIPConfig>,
    pub(crate) target: NodeTarget,
}

/// What [`Parked::take`] found for an object.
pub(crate) enum Taken {
    /// No IP of the object is in a lane.
    Nothing,
    /// Its IP waits for its call; the answer will reconcile the object again.
    Waiting,
    /// The answer came: the call and its answer, to be written.
    Landed(Call, Result<(), CloudError>),
}

/// The objects whose IP waits in a lane, or whose answer waits for their next reconcile.
pub(crate) struct Parked {
    parcels: Mutex<HashMap<String, Parcel>>,
    /// The objects to reconcile again, their answer in.
    landed: mpsc::UnboundedSender<ObjectRef<CloudPrivateIPConfig>>,
    /// Attaches answered after their object was deleted.
    orphans: mpsc::UnboundedSender<Orphan>,
    /// Woken at every answer (a drain waits for the last one).
    answered: Notify,
}

impl Parked {
    /// Records with their two outlets: the objects to reconcile again, and the orphans.
    pub(crate) fn new(
        landed: mpsc::UnboundedSender<ObjectRef<CloudPrivateIPConfig>>,
        orphans: mpsc::UnboundedSender<Orphan>,
    ) -> Self {
        Self {
            parcels: Mutex::new(HashMap::new()),
            landed,
            orphans,
            answered: Notify::new(),
        }
    }

    fn parcels(&self) -> MutexGuard<'_, HashMap<String, Parcel>> {
        self.parcels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that object `name`'s IP waits for `call`; returns where the lane's answer goes.
    pub(crate) fn park(
        self: &Arc<Self>,
        name: &str,
        call: Call,
    ) -> impl FnOnce(Result<(), CloudError>) + Send + 'static {
        let parcel = Parcel {
            call,
            answer: None,
            gone: None,
        };
        self.parcels().insert(name.to_owned(), parcel);
        let (parked, name) = (Arc::clone(self), name.to_owned());
        move |answer| parked.land(&name, answer)
    }

    /// The lane answered object `name`'s IP: it is reconciled again, or, deleted meanwhile,
    /// its attach is an orphan.
    fn land(&self, name: &str, answer: Result<(), CloudError>) {
        let orphan = {
            let mut parcels = self.parcels();
            let Some(parcel) = parcels.get_mut(name) else {
                return;
            };
            if parcel.gone.is_some() {
                parcels.remove(name)
            } else {
                parcel.answer = Some(answer);
                // The controller ends only with the process's term; a closed channel is moot.
                let _ = self.landed.unbounded_send(ObjectRef::new(name));
                None
            }
        };
        self.answered.notify_waiters();
        if let Some(parcel) = orphan {
            self.orphan(parcel);
        }
    }

    fn orphan(&self, parcel: Parcel) {
        if let (Call::Attach { target, .. }, Some(object)) = (parcel.call, parcel.gone) {
            let _ = self.orphans.unbounded_send(Orphan { object, target });
        }
    }

    /// Follows a deletion the object watch showed: an answered attach of the object is an
    /// orphan now; one still waiting becomes one when its answer comes.
    pub(crate) fn deleted(&self, object: &CloudPrivateIPConfig) {
        let name = object.name_any();
        let orphan = {
            let mut parcels = self.parcels();
            let Some(parcel) = parcels.get_mut(&name) else {
                return;
            };
            parcel.gone = Some(Arc::new(object.clone()));
            if parcel.answer.is_some() {
                parcels.remove(&name)
            } else {
                None
            }
        };
        if let Some(parcel) = orphan {
            self.orphan(parcel);
        }
    }

    /// What object `name` has here; an answered record is taken.
    pub(crate) fn take(&self, name: &str) -> Taken {
        let mut parcels = self.parcels();
        match parcels.get(name) {
            None => Taken::Nothing,
            Some(parcel) if parcel.answer.is_none() => Taken::Waiting,
            Some(_) => match parcels.remove(name) {
                Some(Parcel {
                    call,
                    answer: Some(answer),
                    ..
                }) => Taken::Landed(call, answer),
                _ => Taken::Nothing,
            },
        }
    }

    /// Whether object `name`'s IP waits here, or its answer does.
    pub(crate) fn holds(&self, name: &str) -> bool {
        self.parcels().contains_key(name)
    }

    /// Whether no object's IP waits here, nor its answer.
    pub(crate) fn is_empty(&self) -> bool {
        self.parcels().is_empty()
    }

    /// The objects whose answer came.
    pub(crate) fn answered(&self) -> Vec<String> {
        self.parcels()
            .iter()
            .filter(|(_, p)| p.answer.is_some())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Waits until every IP here has its answer.
    pub(crate) async fn all_answered(&self) {
        loop {
            let notified = self.answered.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the records are read, so an answer in between still wakes it.
            notified.as_mut().enable();
            if self.parcels().values().all(|p| p.answer.is_some()) {
                return;
            }
            notified.await;
        }
    }

    /// Forgets the answered records of objects `present` no longer finds: deleted while the
    /// watch was down (no deletion event will come), they will not be reconciled again.
    pub(crate) fn retain_answered(&self, present: impl Fn(&str) -> bool) {
        self.parcels()
            .retain(|name, p| p.answer.is_none() || present(name));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cloudnet_shared::CloudPrivateIPConfigSpec;
    use futures::StreamExt;

    use super::*;
    use crate::cloud::InstanceId;

    fn parked() -> (
        Arc<Parked>,
        mpsc::UnboundedReceiver<ObjectRef<CloudPrivateIPConfig>>,
        mpsc::UnboundedReceiver<Orphan>,
    ) {
        let (landed, landed_rx) = mpsc::unbounded();
        let (orphans, orphans_rx) = mpsc::unbounded();
        (
            Arc::new(Parked::new(landed, orphans)),
            landed_rx,
            orphans_rx,
        )
    }

    fn attach() -> Call {
        Call::Attach {
            target: NodeTarget::new("n1", "aws:///a/i-1", "i-1".into()),
            moving: false,
        }
    }

    fn object(name: &str) -> CloudPrivateIPConfig {
        CloudPrivateIPConfig::new(name, CloudPrivateIPConfigSpec { node: "n1".into() })
    }

    #[tokio::test]
    async fn an_answer_is_kept_and_its_object_reconciled_again() {
        let (parked, mut landed, _) = parked();
        let answer = parked.park("10.0.0.1", attach());
        assert!(matches!(parked.take("10.0.0.1"), Taken::Waiting));
        assert!(parked.holds("10.0.0.1"));
        answer(Ok(()));
        let again = landed.next().await.map(|r| r.name);
        assert_eq!(again.as_deref(), Some("10.0.0.1"));
        let Taken::Landed(_, answer) = parked.take("10.0.0.1") else {
            panic!("the answer is not kept");
        };
        assert!(answer.is_ok());
        assert!(matches!(parked.take("10.0.0.1"), Taken::Nothing));
        assert!(parked.is_empty());
    }

    #[tokio::test]
    async fn an_attach_whose_object_was_deleted_is_an_orphan_whenever_its_answer_comes() {
        let (parked, _landed, mut orphans) = parked();
        // Deleted while waiting: an orphan once answered.
        let answer = parked.park("10.0.0.1", attach());
        parked.deleted(&object("10.0.0.1"));
        answer(Ok(()));
        let orphan = orphans.next().await.map(|o| o.object.name_any());
        assert_eq!(orphan.as_deref(), Some("10.0.0.1"));
        // Answered, then deleted before its reconcile came.
        let answer = parked.park("10.0.0.2", attach());
        answer(Err(CloudError::retryable("timeout")));
        parked.deleted(&object("10.0.0.2"));
        let orphan = orphans.next().await.map(|o| o.target.instance);
        assert_eq!(orphan, Some(InstanceId("i-1".into())));
        assert!(parked.is_empty());
        // A detach of a deleted object leaves nothing to undo.
        let answer = parked.park(
            "10.0.0.3",
            Call::Detach {
                node: "n1".into(),
                then: AfterDetach::ReleaseFinalizer,
                next: None,
            },
        );
        parked.deleted(&object("10.0.0.3"));
        answer(Ok(()));
        assert!(parked.is_empty());
        assert!(orphans.try_recv().is_err(), "no orphan of a detach");
    }

    #[tokio::test]
    async fn a_lane_that_drops_an_ip_unanswered_still_answers_it() {
        let (parked, mut landed, _) = parked();
        let answer = parked.park("10.0.0.1", attach());
        let waiting = {
            let parked = Arc::clone(&parked);
            tokio::spawn(async move { parked.all_answered().await })
        };
        let reply = crate::engine::lanes::Reply::to(answer);
        drop(reply);
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the drain waits for nothing more")
            .expect("joined");
        assert!(landed.next().await.is_some());
        let Taken::Landed(_, answer) = parked.take("10.0.0.1") else {
            panic!("no answer kept");
        };
        assert!(answer.is_err(), "abandoned");
    }
}
