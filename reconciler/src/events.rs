//! Kubernetes Events for the objects' transitions.
//!
//! A reconcile queues its Events and goes on; one publisher sends them, a few at a time. The
//! API server is what a burst of objects waits on, and an Event is worth less than the status
//! write it reports: sent beside 32 object writes, Events take a small share of the API server
//! until the burst has converged, and the queue drains after it. A full queue makes the reconcile
//! wait for room, so no Event is dropped while the process runs.
//!
//! kube's `Recorder` keeps every Event it sent for six minutes so it can fold repeats into a
//! series, and scans that cache on every publish: with thousands of objects that is tens of
//! megabytes and quadratic work for transitions that never repeat. Normal transitions are
//! therefore created directly; warnings, which a failing object repeats at every retry, still go
//! through the `Recorder` so they fold into one Event each.

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;

/// Where cluster-scoped objects' Events go, as kube's `Recorder` and client-go's recorder do.
/// Not the controller's namespace: kube-apiserver accepts an Event whose object has no namespace
/// only in `default` or `kube-system` ("involvedObject.namespace: Invalid value: \"\": does not
/// match event.namespace"), and `kubectl describe` finds it there.
pub const EVENT_NAMESPACE: &str = "default";

/// The action every Event reports.
const ACTION: &str = "Reconcile";

/// Events queued and not yet sent; a reconcile waits for room beyond it. About 300 bytes each.
const QUEUED: usize = 4096;

/// Events awaiting the API server at once.
const IN_FLIGHT: usize = 2;

/// How long a graceful shutdown keeps sending the Events still queued.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// One Event waiting to be sent.
struct Queued {
    regarding: ObjectReference,
    warning: bool,
    reason: &'static str,
    note: String,
}

/// Queues Events about objects; [`Publisher`] sends them.
pub struct Events {
    queue: mpsc::Sender<Queued>,
}

/// Sends the queued Events under one reporter.
pub struct Publisher {
    queue: mpsc::Receiver<Queued>,
    sender: Sender,
}

struct Sender {
    warnings: Recorder,
    api: Api<K8sEvent>,
    reporter: Reporter,
    metrics: Arc<Metrics>,
}

/// The queue's two ends: Events reported as `reporter`.
pub fn queue(client: Client, reporter: Reporter, metrics: Arc<Metrics>) -> (Events, Publisher) {
    let (tx, rx) = mpsc::channel(QUEUED);
    let sender = Sender {
        warnings: Recorder::new(client.clone(), reporter.clone()),
        api: Api::namespaced(client, EVENT_NAMESPACE),
        reporter,
        metrics,
    };
    (Events { queue: tx }, Publisher { queue: rx, sender })
}

impl Events {
    /// Queues one Event about `regarding`, waiting only while the queue is full. Once the
    /// publisher has stopped the Event is dropped: the process is shutting down.
    pub async fn publish(
        &self,
        regarding: ObjectReference,
        warning: bool,
        reason: &'static str,
        note: String,
    ) {
        let queued = Queued {
            regarding,
            warning,
            reason,
            note,
        };
        if self.queue.send(queued).await.is_err() {
            tracing::debug!(reason, "event not published: the publisher has stopped");
        }
    }
}

impl Publisher {
    /// Sends Events until `stop` resolves, then the ones already queued, and returns; Events
    /// queued after `stop` are dropped.
    pub async fn run(self, stop: oneshot::Receiver<()>) {
        let Self { mut queue, sender } = self;
        let mut stop = Some(stop);
        let sender = &sender;
        futures::stream::poll_fn(|cx| {
            if let Some(signal) = stop.as_mut()
                && signal.poll_unpin(cx).is_ready()
            {
                // Stopped or dropped alike: what is queued now is still received.
                queue.close();
                stop = None;
            }
            queue.poll_recv(cx)
        })
        .for_each_concurrent(IN_FLIGHT, |queued| sender.send(queued))
        .await;
    }
}

impl Sender {
    /// Sends one Event; a failure is logged, never returned: an Event is worth less than the
    /// transition it reports.
    async fn send(&self, queued: Queued) {
        let Queued {
            regarding,
            warning,
            reason,
            note,
        } = queued;
        let result = if warning {
            let event = Event {
                type_: EventType::Warning,
                reason: reason.to_owned(),
                note: Some(note),
                action: ACTION.to_owned(),
                secondary: None,
            };
            self.warnings.publish(&event, &regarding).await
        } else {
            let event = self.normal(&regarding, reason, note);
            self.api
                .create(&PostParams::default(), &event)
                .await
                .map(|_| ())
        };
        match result {
            Ok(()) => {
                self.metrics.events.inc();
            }
            Err(e) => tracing::debug!(error = %e, reason, "event not published"),
        }
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
