//! Plugin front ends: one layer above the object controller, whose only output is
//! CloudPrivateIPConfigs, the contract every network plugin shares. A front end reads its
//! plugin's objects (Antrea's Egresses, ...) and says which egress IP it wants on which node
//! ([`FrontEnd::wants`]); this layer turns that into objects marked as the front end's
//! ([`OWNER_LABEL`]), and the rest is the reconciler as OVN-Kubernetes uses it: the ledger,
//! batching, moves, public addresses.
//!
//! Every front end shares one loop ([`drive`]): after any change of its plugin's objects or of its
//! own CloudPrivateIPConfigs it plans the whole difference ([`plan`]) and writes it. Level-driven,
//! from the API alone: a restart, a leader change, or a crash between the plugin's write and ours
//! plans the same steps again, and nothing is lost or doubled. It never changes or deletes an
//! object it did not create: its watch selects its own label, a create that meets another's
//! object of the same name is a clash (reported, left alone), a retarget is a JSON patch that
//! first tests the label, and a delete names the uid it saw.
//!
//! Layering: `process/` starts the enabled front ends beside the controllers, on the leader only.
//! A front end uses the Kubernetes API and `cloudnet-shared`, never the controllers, the engine
//! or the cloud.

pub mod antrea;
pub mod gateway;
mod notice;
pub(crate) mod plan;
mod unseen;
mod writer;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use cloudnet_shared::CloudPrivateIPConfig;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use crate::events::Events;
use crate::metrics::Metrics;
use notice::{Notice, Notices};
use plan::{Existing, Want};
use unseen::Unseen;

/// The label that marks a CloudPrivateIPConfig as a front end's, its value the front end's name.
pub const OWNER_LABEL: &str = cloudnet_shared::FRONT_END_LABEL;
/// The annotation that names the plugin object an owned CloudPrivateIPConfig is for
/// (`Egress/web`), for people and Events.
pub const SOURCE_ANNOTATION: &str = cloudnet_shared::rules::gateway::SOURCE_ANNOTATION;

/// The backoff of a plan whose writes failed: from half a second, doubling, to a minute, with
/// jitter; it starts over after a plan that wrote everything.
fn backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(60))
        .with_jitter()
        .without_max_times()
        .build()
}

/// A plugin front end.
pub(crate) trait FrontEnd: Send + Sync {
    /// Its name: the value of [`OWNER_LABEL`] on its objects.
    fn owner(&self) -> &'static str;

    /// The egress IPs it wants now, and where, from its plugin's objects.
    fn wants(&self) -> BTreeMap<IpAddr, Want>;

    /// The plugin object a [`Want::source`] names, for Events; `None` once it is gone.
    fn regarding(&self, source: &str) -> Option<ObjectReference>;
}

/// A watch's events as changes, its failures logged: Antrea's CRDs not installed, a grant
/// missing. The watch retries with backoff, and nothing is planned until every watch has listed.
pub(crate) fn logged<T>(
    front_end: &'static str,
    watch: &'static str,
) -> impl FnMut(Result<T, kube::runtime::watcher::Error>) + Send {
    move |event| {
        if let Err(error) = event {
            tracing::warn!(front_end, watch, %error, "watch failed; retrying");
        }
    }
}

/// Takes every change already waiting, so that one plan covers them. A plan is not held back
/// to gather a burst: a move's latency is what a failover is judged by, and the changes that
/// arrive while a plan's writes are in flight are gathered into the next plan anyway.
fn waiting(changes: &mut (impl Stream<Item = ()> + Unpin)) {
    while let Some(Some(())) = changes.next().now_or_never() {}
}

/// A CloudPrivateIPConfig as [`plan::plan`] reads it.
fn existing_of(object: &CloudPrivateIPConfig) -> Existing {
    Existing {
        node: object.spec.node.clone(),
        owner: object.labels().get(OWNER_LABEL).cloned(),
        deleting: object.metadata.deletion_timestamp.is_some(),
        uid: object.uid().unwrap_or_default(),
    }
}

/// A front end's own CloudPrivateIPConfigs as [`plan::plan`] reads them.
fn existing(owner: &str, objects: &Store<CloudPrivateIPConfig>) -> BTreeMap<String, Existing> {
    objects
        .state()
        .iter()
        .map(|object| (object.name_any(), existing_of(object)))
        .filter(|(_, existing)| existing.owner.as_deref() == Some(owner))
        .collect()
}

/// Publishes each of `notices` on the plugin object it names (if still there), in order, until
/// the sending side is dropped.
async fn tell<F: FrontEnd>(front: &F, events: &Events, notices: impl Stream<Item = Notice>) {
    notices
        .for_each(|notice| async move {
            if let Some(regarding) = front.regarding(&notice.source) {
                events
                    .publish(&regarding, notice.warning, notice.reason, notice.note)
                    .await;
            }
        })
        .await;
}

/// What a front end's loop works with besides its plugin's objects.
pub(crate) struct Parts<'a> {
    /// CloudPrivateIPConfigs.
    pub(crate) api: &'a Api<CloudPrivateIPConfig>,
    /// The cache of the front end's own CloudPrivateIPConfigs, with their status.
    pub(crate) objects: &'a Store<CloudPrivateIPConfig>,
    /// Events on the plugin's objects.
    pub(crate) events: &'a Events,
    /// The front end's counters.
    pub(crate) metrics: &'a Metrics,
}

/// Runs `front`'s loop until `shutdown`: a plan at once (its caches must have listed), then
/// after each of `changes` (its plugin's objects, its own objects; those that arrive during a
/// plan are one change), and again after a backoff while a write fails. After each plan, the transitions its objects' status shows are
/// told on the plugin objects that asked for them ([`notice`]), beside the loop: an Event must
/// not hold the next move back.
pub(crate) async fn drive<F: FrontEnd>(
    front: &F,
    parts: Parts<'_>,
    changes: impl Stream<Item = ()> + Send,
    shutdown: impl Future<Output = ()>,
) {
    let (told, to_tell) = futures::channel::mpsc::unbounded();
    futures::future::join(
        plan_loop(front, &parts, told, changes, shutdown),
        tell(front, parts.events, to_tell),
    )
    .await;
}

/// [`drive`]'s loop, handing what is to be told to `told`.
async fn plan_loop<F: FrontEnd>(
    front: &F,
    parts: &Parts<'_>,
    told: futures::channel::mpsc::UnboundedSender<Notice>,
    changes: impl Stream<Item = ()> + Send,
    shutdown: impl Future<Output = ()>,
) {
    let Parts {
        api,
        objects,
        metrics,
        ..
    } = *parts;
    let mut notices = Notices::default();
    let mut unseen = Unseen::default();
    let mut delays = backoff();
    let mut changes = std::pin::pin!(changes);
    let mut shutdown = std::pin::pin!(shutdown);
    // The first plan comes at once: the caches have listed, and what changed while no front
    // end ran (a failover during a restart) shows in no event.
    let mut again: Option<Duration> = Some(Duration::ZERO);
    loop {
        let retry = async {
            match again {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => return,
            change = changes.next() => if change.is_none() { return },
            () = retry => {}
        }
        waiting(&mut changes);
        let mut mine = existing(front.owner(), objects);
        unseen.overlay(&mut mine);
        let steps = plan::plan(front.owner(), &front.wants(), &mine);
        let mut written = writer::apply(api, front.owner(), metrics, steps).await;
        for (name, after) in written.done.drain(..) {
            unseen.wrote(name, after);
        }
        metrics
            .front_end
            .set_clashes(front.owner(), written.clashes);
        let seen = notices.observe(objects.state().iter().map(AsRef::as_ref));
        for notice in seen.into_iter().chain(written.notices) {
            // The receiver lives as long as this loop.
            let _ = told.unbounded_send(notice);
        }
        again = if written.failed == 0 {
            delays = backoff();
            None
        } else {
            delays.next()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_plan_takes_every_change_already_waiting_and_none_to_come() {
        let mut changes = futures::stream::iter([(), (), ()]).chain(futures::stream::pending());
        waiting(&mut changes);
        assert!(
            changes.next().now_or_never().is_none(),
            "the three waiting were taken, and nothing waited for"
        );
    }
}
