//! The `EgressPublicIP` controller (docs/public-ips.md): keeps each binding's public address
//! associated with its egress IP on whichever node holds it. Runs on the leader only, beside the
//! object controller, and only while the opt-in CRD is installed and the cloud implements public
//! addresses ([`crate::cloud::CloudProvider::public_ips`]).
//!
//! A binding is reconciled when it changes (spec, finalizers, deletion: not its own status
//! writes), when its egress IP turns attached on a node or stops being attached there
//! ([`trigger`]), when a binding that held it back goes or gives way, and every drift period.

mod claim;
mod presence;
mod reconcile;
mod status;
mod trigger;

use std::future::Future;
use std::sync::Arc;

use cloudnet_shared::CloudPrivateIPConfig;
use cloudnet_shared::public_ip::EgressPublicIP;
use futures::channel::mpsc;
use futures::{StreamExt, TryStreamExt};
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::{Predicate, WatchStreamExt, predicates, reflector, watcher};
use kube::{Api, Client};

use crate::cloud::CloudProvider;
use crate::controller::EngineConfig;
use crate::controller::retries::Retries;
use crate::engine::interfaces::Interfaces;
use crate::engine::ledger::Ledger;
use crate::events::Events;
use crate::metrics::Metrics;
use reconcile::Context;
use trigger::Attached;

/// What the controller shares with the engine.
pub(crate) struct Parts {
    /// The engine's client.
    pub(crate) client: Client,
    /// The cloud.
    pub(crate) cloud: Arc<dyn CloudProvider>,
    /// Where each egress IP is attached.
    pub(crate) ledger: Arc<Ledger>,
    /// The engine's view of each VM's primary interface.
    pub(crate) interfaces: Arc<Interfaces>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// This replica's identity, for Events.
    pub(crate) identity: String,
    /// Drift period and retry pace.
    pub(crate) config: EngineConfig,
}

/// Runs the controller until `shutdown` resolves: waits while the CRD is not installed, stops
/// (and waits again) if it is removed. Returns at once when the cloud has no public addresses.
pub(crate) async fn run(
    parts: Parts,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let Some(public) = Arc::clone(&parts.cloud).public_ips() else {
        return;
    };
    // Exported from the start of the term, so that the first association shows as an increase.
    parts.metrics.public.zero();
    let api = Api::<EgressPublicIP>::all(parts.client.clone());
    loop {
        tokio::select! {
            () = presence::installed(&api, presence::LOOK_PERIOD) => {}
            () = shutdown.clone() => return,
        }
        tracing::info!(
            "the EgressPublicIP CRD is installed: public addresses follow their egress IPs"
        );
        let running = controller(&parts, Arc::clone(&public), shutdown.clone());
        tokio::select! {
            () = running => {
                parts.metrics.public.set_unassociated(0);
                return;
            }
            () = presence::removed(&api, presence::LOOK_PERIOD) => {}
        }
        parts.metrics.public.set_unassociated(0);
    }
}

/// The kube-runtime controller over bindings, woken by the objects' attaches too.
async fn controller(
    parts: &Parts,
    public: Arc<dyn crate::cloud::public_ip::PublicIps>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api = Api::<EgressPublicIP>::all(parts.client.clone());
    let objects = Api::<CloudPrivateIPConfig>::all(parts.client.clone());
    let (bindings, writer) = reflector::store();
    let (wake, woken) = mpsc::unbounded();
    let events = Events::new(
        parts.client.clone(),
        Reporter {
            controller: super::CONTROLLER_NAME.into(),
            instance: Some(parts.identity.clone()),
        },
        Arc::clone(&parts.metrics),
    );
    let ctx = Arc::new(Context {
        api: api.clone(),
        objects: objects.clone(),
        bindings: bindings.clone(),
        public,
        ledger: Arc::clone(&parts.ledger),
        interfaces: Arc::clone(&parts.interfaces),
        events,
        metrics: Arc::clone(&parts.metrics),
        drift: parts.config.drift_period,
        retries: Retries::new(parts.config.backoff_base, parts.config.backoff_cap),
        unassociated: Default::default(),
        wake,
    });
    // Its own status writes wake no binding: generation moves with spec and deletion, and the
    // finalizer's addition must wake it (kube-runtime's finalizer waits for that change).
    let changed = predicates::generation::<EgressPublicIP>.combine(predicates::finalizers);
    let on_delete = Arc::clone(&ctx);
    let binding_stream = watcher(api, watcher::Config::default())
        .backoff(cloudnet_kubeclient::watch_backoff())
        .reflect(writer)
        .inspect_ok(move |event| {
            if let watcher::Event::Delete(binding) = event {
                on_delete.gone(binding);
            }
        })
        .applied_objects()
        .predicate_filter(changed, Default::default())
        .filter(|e| std::future::ready(e.is_ok()));
    let attached = Attached::default();
    let store = bindings.clone();
    let object_stream = watcher(objects, watcher::Config::default())
        .backoff(cloudnet_kubeclient::watch_backoff())
        .filter_map(|event| std::future::ready(trigger::objects(event)));
    Controller::for_stream(binding_stream, bindings)
        .watches_stream(object_stream, move |object| attached.wake(&object, &store))
        .reconcile_on(woken)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|_| std::future::ready(()))
        .await;
}
