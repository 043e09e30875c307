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
mod notice;
pub(crate) mod plan;
mod writer;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use cloudnet_shared::CloudPrivateIPConfig;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use crate::events::Events;
use crate::metrics::Metrics;
use notice::{Notice, Notices};
use plan::{Existing, Want};

/// The label that marks a CloudPrivateIPConfig as a front end's, its value the front end's name.
pub const OWNER_LABEL: &str = cloudnet_shared::FRONT_END_LABEL;
/// The annotation that names the plugin object an owned CloudPrivateIPConfig is for
/// (`Egress/web`), for people and Events.
pub const SOURCE_ANNOTATION: &str = "cloudnet.io/source";

/// How long changes may keep arriving before a plan is made: a burst (Antrea's failover writes
/// one status per Egress) becomes one plan.
const QUIET: Duration = Duration::from_millis(50);
/// The longest a plan waits for a burst to end: the reconciler's status writes on the front end's
/// own objects keep coming while a failover is under way, and must not hold the next move back.
const MOST_GATHER: Duration = Duration::from_millis(250);

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

/// Waits out the rest of a burst of `changes`, so that one plan covers it: until none came for
/// [`QUIET`], or [`MOST_GATHER`] passed.
async fn rest_of_burst(changes: &mut (impl Stream<Item = ()> + Unpin)) {
    let gathering = tokio::time::Instant::now() + MOST_GATHER;
    while tokio::time::Instant::now() < gathering
        && let Ok(Some(())) = tokio::time::timeout(QUIET, changes.next()).await
    {}
}

/// A front end's own CloudPrivateIPConfigs as [`plan::plan`] reads them.
fn existing(owner: &str, objects: &Store<CloudPrivateIPConfig>) -> BTreeMap<String, Existing> {
    objects
        .state()
        .iter()
        .map(|object| {
            let existing = Existing {
                node: object.spec.node.clone(),
                owner: object.labels().get(OWNER_LABEL).cloned(),
                deleting: object.metadata.deletion_timestamp.is_some(),
                uid: object.uid().unwrap_or_default(),
            };
            (object.name_any(), existing)
        })
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
/// after each burst of `changes` (its plugin's objects, its own objects), and again after a
/// backoff while a write fails. After each plan, the transitions its objects' status shows are
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
        rest_of_burst(&mut changes).await;
        let steps = plan::plan(
            front.owner(),
            &front.wants(),
            &existing(front.owner(), objects),
        );
        let written = writer::apply(api, front.owner(), metrics, steps).await;
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

    #[tokio::test(start_paused = true)]
    async fn a_burst_ends_after_a_quiet_gap_or_at_its_bound_however_long_changes_keep_coming() {
        let start = tokio::time::Instant::now();
        let mut three = futures::stream::iter([(), (), ()]).chain(futures::stream::pending());
        rest_of_burst(&mut three).await;
        assert_eq!(start.elapsed(), QUIET, "three at once, then quiet");

        let start = tokio::time::Instant::now();
        let every = tokio::time::interval(QUIET / 5);
        let mut endless = tokio_stream_of(every);
        rest_of_burst(&mut endless).await;
        let waited = start.elapsed();
        assert!(
            waited >= MOST_GATHER && waited < MOST_GATHER + QUIET,
            "a change every {:?} kept the plan back {waited:?}",
            QUIET / 5
        );
    }

    /// A change at every tick of `interval`.
    fn tokio_stream_of(mut interval: tokio::time::Interval) -> impl Stream<Item = ()> + Unpin {
        Box::pin(futures::stream::poll_fn(move |cx| {
            interval.poll_tick(cx).map(|_| Some(()))
        }))
    }
}
