//! Kubernetes Events for the objects' transitions.
//!
//! kube's `Recorder` keeps every Event it sent for six minutes so it can fold repeats into a
//! series, and scans that cache on every publish: with thousands of objects that is tens of
//! megabytes and quadratic work for transitions that never repeat. Normal transitions are
//! therefore created directly; warnings, which a failing object repeats at every retry, still go
//! through the `Recorder` so they fold into one Event each.
//!
//! Events go to `events.k8s.io` while it accepts them. A hosted control plane (HyperShift) grants
//! the controller core/v1 `events` get and create only, as the upstream controller's client-go
//! recorder uses: on a refusal of `events.k8s.io` the Event is created through core/v1 instead,
//! and every later one too (create only, never a patch: a warning repeated within
//! [`CORE_REPEAT`] is not written again, in place of the Recorder's series).
//!
//! Events are optional: OpenShift's network operator grants the controller no Events at all. A
//! refusal (403) of both APIs is logged once and Events are skipped for [`FORBIDDEN_PAUSE`], then
//! tried again (a grant added later takes effect without a restart), so a cluster without the
//! grant costs neither a request nor a log line per transition.
//!
//! A note is cut to [`NOTE_LIMIT`] bytes (kube-apiserver refuses a longer `note`, and a cloud's
//! error text can be longer), so a warning carrying one is written rather than dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::metrics::Metrics;

/// Attempts of one Event after the first when kube-apiserver fails it for a moment (a 5xx, a
/// 429, no answer): an Event lost to a moment of overload may be the one an admin looks for
/// (an `OrphanReleased` is written once), and client-go's recorder retries too.
const TRANSIENT_RETRIES: usize = 2;

/// The pause before the first retry (doubling after).
const TRANSIENT_PAUSE: Duration = Duration::from_millis(200);

/// Whether `error` is kube-apiserver failing for a moment rather than refusing the Event.
fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::Service(_) | kube::Error::HyperError(_) => true,
        _ => false,
    }
}

/// Where cluster-scoped objects' Events go, as kube's `Recorder` and client-go's recorder do.
/// Not the controller's namespace: kube-apiserver accepts an Event whose object has no namespace
/// only in `default` or `kube-system` ("involvedObject.namespace: Invalid value: \"\": does not
/// match event.namespace"), and `kubectl describe` finds it there.
pub const EVENT_NAMESPACE: &str = "default";

/// How long Events are skipped after kube-apiserver refused one as forbidden.
pub(crate) const FORBIDDEN_PAUSE: Duration = Duration::from_secs(10 * 60);

/// The action every Event reports.
const ACTION: &str = "Reconcile";

/// The longest note kube-apiserver accepts on an `events.k8s.io` Event, in bytes.
pub(crate) const NOTE_LIMIT: usize = 1024;

/// How long a warning written through core/v1 is not written again for the same object, reason
/// and note.
pub(crate) const CORE_REPEAT: Duration = Duration::from_secs(10 * 60);

/// Warnings remembered for [`CORE_REPEAT`] before the oldest are forgotten early.
const CORE_REPEAT_ENTRIES: usize = 4096;

/// Publishes Events about objects under one reporter.
pub(crate) struct Events {
    warnings: Recorder,
    api: Api<K8sEvent>,
    core: Api<CoreEvent>,
    /// `events.k8s.io` was refused and core/v1 accepted: Events go through core/v1 from now on.
    through_core: AtomicBool,
    /// When each warning (object, reason, note) was last written through core/v1.
    core_warnings: Mutex<HashMap<(String, String, String), Instant>>,
    reporter: Reporter,
    metrics: Arc<Metrics>,
    forbidden: Mutex<Forbidden>,
}

/// Whether Events were refused as forbidden, and until when they are skipped.
#[derive(Debug, Default)]
struct Forbidden {
    until: Option<Instant>,
    reported: bool,
}

impl Forbidden {
    fn skips(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// Records a refusal at `now`; true the first time, when it is worth a log line.
    fn refused(&mut self, now: Instant) -> bool {
        self.until = Some(now + FORBIDDEN_PAUSE);
        !std::mem::replace(&mut self.reported, true)
    }
}

impl Events {
    /// Events reported as `reporter`.
    pub(crate) fn new(client: Client, reporter: Reporter, metrics: Arc<Metrics>) -> Self {
        Self {
            warnings: Recorder::new(client.clone(), reporter.clone()),
            api: Api::namespaced(client.clone(), EVENT_NAMESPACE),
            core: Api::namespaced(client, EVENT_NAMESPACE),
            through_core: AtomicBool::new(false),
            core_warnings: Mutex::default(),
            reporter,
            metrics,
            forbidden: Mutex::default(),
        }
    }

    /// Publishes one Event about `regarding`; a failure is logged, never returned: an Event is
    /// worth less than the transition it reports.
    pub(crate) async fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        if self.forbidden().skips(Instant::now()) {
            return;
        }
        let note = bounded_note(note);
        let result = (|| self.publish_once(regarding, warning, reason, &note))
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(TRANSIENT_PAUSE)
                    .with_max_times(TRANSIENT_RETRIES),
            )
            .when(transient)
            .await;
        match result {
            Ok(()) => {
                self.metrics.events.inc();
            }
            Err(kube::Error::Api(status)) if status.is_forbidden() => {
                if self.forbidden().refused(Instant::now()) {
                    tracing::warn!(
                        namespace = EVENT_NAMESPACE,
                        error = %status.message,
                        "Events are forbidden to this ServiceAccount: not publishing them (tried \
                         again every {} minutes); conditions and logs carry the same facts",
                        FORBIDDEN_PAUSE.as_secs() / 60
                    );
                }
            }
            // Shown by default like client-go's recorder does: the Event is lost after its
            // retries, and an admin looking for it should find why.
            Err(e) => tracing::warn!(error = %e, reason, "Event not published"),
        }
    }

    /// One attempt at the Event: through `events.k8s.io`, or core/v1 where that is forbidden.
    async fn publish_once(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        if self.through_core.load(Ordering::Acquire) {
            return self.publish_core(regarding, warning, reason, note).await;
        }
        match self
            .publish_events_v1(regarding, warning, reason, note.to_owned())
            .await
        {
            Err(kube::Error::Api(status)) if status.is_forbidden() => {
                let core = self.publish_core(regarding, warning, reason, note).await;
                if core.is_ok() && !self.through_core.swap(true, Ordering::AcqRel) {
                    tracing::info!(
                        namespace = EVENT_NAMESPACE,
                        refused = %status.message,
                        "events.k8s.io is forbidden to this ServiceAccount, core/v1 events are \
                         not: writing Events through core/v1 (create only)"
                    );
                }
                core
            }
            other => other,
        }
    }

    async fn publish_events_v1(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: String,
    ) -> Result<(), kube::Error> {
        if warning {
            let event = Event {
                type_: EventType::Warning,
                reason: reason.to_owned(),
                note: Some(note),
                action: ACTION.to_owned(),
                secondary: None,
            };
            self.warnings.publish(&event, regarding).await
        } else {
            let event = self.normal(regarding, reason, note);
            self.api
                .create(&PostParams::default(), &event)
                .await
                .map(|_| ())
        }
    }

    /// Creates the Event through core/v1; a warning already written within [`CORE_REPEAT`] is
    /// not written again.
    async fn publish_core(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let key = (
            regarding.name.clone().unwrap_or_default(),
            reason.to_owned(),
            note.to_owned(),
        );
        if warning && self.recently_written(&key) {
            return Ok(());
        }
        let event = self.core_event(regarding, warning, reason, note);
        self.core.create(&PostParams::default(), &event).await?;
        if warning {
            self.remember_written(key);
        }
        Ok(())
    }

    fn recently_written(&self, key: &(String, String, String)) -> bool {
        let written = self
            .core_warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        written
            .get(key)
            .is_some_and(|at| at.elapsed() < CORE_REPEAT)
    }

    fn remember_written(&self, key: (String, String, String)) {
        let mut written = self
            .core_warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if written.len() >= CORE_REPEAT_ENTRIES {
            written.retain(|_, at| at.elapsed() < CORE_REPEAT);
        }
        if written.len() >= CORE_REPEAT_ENTRIES {
            // A storm of distinct warnings: forget them all rather than grow; at worst a repeat
            // is written once more.
            written.clear();
        }
        written.insert(key, Instant::now());
    }

    fn forbidden(&self) -> std::sync::MutexGuard<'_, Forbidden> {
        // A panic while holding it cannot leave the two fields inconsistent: keep using them.
        self.forbidden
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An Event's name and namespace: the object's name (else the controller's) and the time,
    /// in [`EVENT_NAMESPACE`], the same for both APIs.
    fn metadata(&self, regarding: &ObjectReference, now: Timestamp) -> ObjectMeta {
        let name = regarding
            .name
            .as_deref()
            .unwrap_or(&self.reporter.controller);
        ObjectMeta {
            namespace: Some(EVENT_NAMESPACE.to_owned()),
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            ..ObjectMeta::default()
        }
    }

    /// The reporting instance: the reporter's, else the controller's name.
    fn instance(&self) -> String {
        self.reporter
            .instance
            .clone()
            .unwrap_or_else(|| self.reporter.controller.clone())
    }

    /// A core/v1 Event as client-go's recorder writes one (no `eventTime`: the legacy shape,
    /// which kube-apiserver accepts in `default` for a cluster-scoped object).
    fn core_event(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> CoreEvent {
        let now = Timestamp::now();
        let controller = self.reporter.controller.clone();
        CoreEvent {
            metadata: self.metadata(regarding, now),
            involved_object: regarding.clone(),
            action: Some(ACTION.to_owned()),
            reason: Some(reason.to_owned()),
            message: Some(note.to_owned()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            source: Some(EventSource {
                component: Some(controller.clone()),
                host: None,
            }),
            reporting_component: Some(controller),
            reporting_instance: Some(self.instance()),
            ..CoreEvent::default()
        }
    }

    fn normal(&self, regarding: &ObjectReference, reason: &str, note: String) -> K8sEvent {
        let now = Timestamp::now();
        K8sEvent {
            metadata: self.metadata(regarding, now),
            action: Some(ACTION.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_instance: Some(self.instance()),
            reporting_controller: Some(self.reporter.controller.clone()),
            type_: Some("Normal".to_owned()),
            ..K8sEvent::default()
        }
    }
}

/// `note` cut to [`NOTE_LIMIT`] bytes on a character boundary, ending in `…` when cut.
pub(crate) fn bounded_note(mut note: String) -> String {
    const CUT: &str = "…";
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let mut end = NOTE_LIMIT - CUT.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push_str(CUT);
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_on_a_character_boundary() {
        assert_eq!(bounded_note("short".into()), "short");
        let exact = "x".repeat(NOTE_LIMIT);
        assert_eq!(bounded_note(exact.clone()), exact);
        // Two-byte characters across the cut: never half of one.
        let long = format!("a{}", "é".repeat(NOTE_LIMIT));
        let cut = bounded_note(long);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.ends_with("é…"), "{cut}");
    }

    #[test]
    fn a_refusal_pauses_events_and_is_reported_once() {
        let start = Instant::now();
        let mut forbidden = Forbidden::default();
        assert!(!forbidden.skips(start));
        assert!(forbidden.refused(start));
        assert!(forbidden.skips(start + FORBIDDEN_PAUSE / 2));
        assert!(!forbidden.skips(start + FORBIDDEN_PAUSE));
        // Refused again after the pause: skipped again, without a second log line.
        assert!(!forbidden.refused(start + FORBIDDEN_PAUSE));
        assert!(forbidden.skips(start + FORBIDDEN_PAUSE + FORBIDDEN_PAUSE / 2));
    }
}
