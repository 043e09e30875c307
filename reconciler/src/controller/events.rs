//! Kubernetes Events for the objects' transitions.
//!
//! kube's `Recorder` keeps every Event it sent for six minutes so it can fold repeats into a
//! series, and scans that cache on every publish: with thousands of objects that is tens of
//! megabytes and quadratic work for transitions that never repeat. Normal transitions are
//! therefore created directly; warnings, which a failing object repeats at every retry, still go
//! through the `Recorder` so they fold into one Event each.
//!
//! Events are optional: OpenShift's network operator grants the controller no Events at all. A
//! refusal (403) is logged once and Events are skipped for [`FORBIDDEN_PAUSE`], then tried again
//! (a grant added later takes effect without a restart), so a cluster without the grant costs
//! neither a request nor a log line per transition.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::metrics::Metrics;

/// Where cluster-scoped objects' Events go, as kube's `Recorder` and client-go's recorder do.
/// Not the controller's namespace: kube-apiserver accepts an Event whose object has no namespace
/// only in `default` or `kube-system` ("involvedObject.namespace: Invalid value: \"\": does not
/// match event.namespace"), and `kubectl describe` finds it there.
pub const EVENT_NAMESPACE: &str = "default";

/// How long Events are skipped after kube-apiserver refused one as forbidden.
pub(crate) const FORBIDDEN_PAUSE: Duration = Duration::from_secs(10 * 60);

/// The action every Event reports.
const ACTION: &str = "Reconcile";

/// Publishes Events about objects under one reporter.
pub(crate) struct Events {
    warnings: Recorder,
    api: Api<K8sEvent>,
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
            api: Api::namespaced(client, EVENT_NAMESPACE),
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
        let result = if warning {
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
        };
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
            Err(e) => tracing::debug!(error = %e, reason, "event not published"),
        }
    }

    fn forbidden(&self) -> std::sync::MutexGuard<'_, Forbidden> {
        // A panic while holding it cannot leave the two fields inconsistent: keep using them.
        self.forbidden
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn normal(&self, regarding: &ObjectReference, reason: &str, note: String) -> K8sEvent {
        let now = Timestamp::now();
        let controller = self.reporter.controller.clone();
        let name = regarding.name.as_deref().unwrap_or(&controller);
        K8sEvent {
            metadata: ObjectMeta {
                namespace: Some(EVENT_NAMESPACE.to_owned()),
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            action: Some(ACTION.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            reporting_controller: Some(controller),
            type_: Some("Normal".to_owned()),
            ..K8sEvent::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
