//! The controller layer: the `CloudPrivateIPConfig` controller ([`objects`]), the node annotation
//! controller ([`nodes`]) and the orphan sweep ([`sweep`]), which decide through the pure
//! [`plan`] and act through the engine ([`crate::engine`]).
//!
//! This module wires the two controllers, the drift checker and the lanes over one client and one
//! cloud, and runs them until a shutdown signal, then drains: no new reconcile starts, running ones
//! finish.

pub(crate) mod cached_node;
pub(crate) mod intake;
pub(crate) mod nodes;
pub(crate) mod objects;
pub(crate) mod plan;
pub(crate) mod public;
pub(crate) mod retries;
pub(crate) mod status;
pub(crate) mod sweep;

pub use crate::events::EVENT_NAMESPACE;
pub use objects::EngineConfig;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_shared::{CloudPrivateIPConfig, decode_name};
use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use crate::cloud::{CloudProvider, InstanceId, NodeTarget};
use crate::controller::cached_node::CachedNode;
use crate::controller::retries::Retries;
use crate::engine::interfaces::Interfaces;
use crate::engine::lanes::{AbortOnDrop, Gather, Lanes};
use crate::engine::ledger::{Ledger, LedgerSettings};
use crate::events::Events;
use crate::index::{NodeIndex, Written};
use crate::metrics::{Metrics, StateLabels};
use intake::Intake;
use plan::backoff;

/// The name events are reported under.
pub(crate) const CONTROLLER_NAME: &str = "cloudnet-reconciler";

/// How long the node controller waits for a node's events to settle before recomputing its
/// annotation.
const NODE_DEBOUNCE: Duration = Duration::from_millis(500);

/// How often the objects-by-state gauge is refreshed when drift checks are off.
const STATE_GAUGE_PERIOD: Duration = Duration::from_secs(2);

/// How a run of the engine ended.
#[derive(Debug)]
pub enum Ended {
    /// `shutdown` resolved and in-flight work was drained.
    Stopped,
    /// The attachment ledger could not be loaded within [`EngineConfig::ledger_deadline`]; nothing
    /// was attached or detached. The cause, in a line.
    LedgerUnavailable(String),
}

/// Runs the reconciler until `shutdown` resolves, then drains in-flight work and returns.
pub async fn run(
    client: Client,
    cloud: Arc<dyn CloudProvider>,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    identity: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    run_term(client, cloud, config, metrics, identity, shutdown).await;
}

/// As [`run`], but gives up, before anything acts, when the attachment ledger cannot be loaded
/// within [`EngineConfig::ledger_deadline`], and says how it ended.
pub async fn run_term(
    client: Client,
    cloud: Arc<dyn CloudProvider>,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    identity: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Ended {
    let shutdown = shutdown.boxed().shared();
    // Nothing acts before the ledger is known: every detach and the sweep read it.
    let ledger_api = Api::<ConfigMap>::namespaced(client.clone(), &config.namespace);
    let settings = LedgerSettings {
        fence: config.fence.clone(),
        release_window: sweep::release_window(
            config.drift_period,
            config.orphan_grace,
            config.call_deadline,
        ),
    };
    let loading = load_ledger(ledger_api, &metrics, settings, config.ledger_deadline);
    let ledger = tokio::select! {
        ledger = loading => match ledger {
            Ok(ledger) => Arc::new(ledger),
            Err(cause) => return Ended::LedgerUnavailable(cause),
        },
        () = shutdown.clone() => return Ended::Stopped,
    };
    let objects_api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let nodes_api: Api<CachedNode> = Api::all(client.clone());
    let gather = Gather {
        quiet: config.coalesce_window,
        max: config.max_gather,
    };
    // Reads gather like the lanes' IPs: at start-up every node asks for its VM at once.
    let interfaces = Arc::new(
        Interfaces::new(Arc::clone(&cloud), Arc::clone(&metrics))
            .with_gather(gather)
            .with_read_lately(config.read_lately),
    );
    let lanes = Arc::new(
        Lanes::new(
            Arc::clone(&cloud),
            Arc::clone(&metrics),
            Arc::clone(&interfaces),
            Arc::clone(&ledger),
            config.parallel_nodes,
            gather,
        )
        .with_call_deadline(config.call_deadline),
    );
    // If this future is dropped (aborted task, lost lease), no cloud call of ours keeps running.
    let _lanes_guard = AbortOnDrop(Arc::clone(&lanes));

    let (node_reader, node_writer) = reflector::store();
    let node_retries = Arc::new(Retries::new(config.backoff_base, config.backoff_cap));
    let (room_metrics, nodes_now, retries) = (
        Arc::clone(&metrics),
        node_reader.clone(),
        Arc::clone(&node_retries),
    );
    let node_stream = watcher(nodes_api.clone(), watcher::Config::default())
        .backoff(cloudnet_kubeclient::watch_backoff())
        .modify(cached_node::slim)
        .reflect(node_writer)
        .inspect_ok(move |event| {
            nodes::forget_gone_nodes(event, &nodes_now, &room_metrics, &retries)
        })
        .applied_objects()
        .predicate_filter(nodes::relevant_fields, PredicateConfig::default())
        .filter(no_error);

    let (drift_tx, drift_rx) = mpsc::unbounded();
    let (node_drift_tx, node_drift_rx) = mpsc::unbounded();
    let (object_store, object_writer) = reflector::store();
    let by_node = Arc::new(NodeIndex::default());
    let index = Arc::clone(&by_node);
    let written = Arc::new(Written::default());
    let caught_up = Arc::clone(&written);
    metrics.glance.begin_term(object_store.clone());
    metrics.zero_cloud_errors(cloud.needs().name);
    let glance = Arc::clone(&metrics.glance);
    // The answers of IPs whose reconcile ended while they wait in their lane reconcile their
    // objects again; an object deleted meanwhile leaves an orphan to detach.
    let (landed_tx, landed_rx) = mpsc::unbounded();
    let (orphans_tx, orphans_rx) = mpsc::unbounded();
    let parked = Arc::new(objects::Parked::new(landed_tx, orphans_tx));
    let parked_for_watch = Arc::clone(&parked);
    // The node controller follows the same watch: a second watch of every object would cost
    // the API server and this process a second copy of each event.
    let (object_nodes_tx, object_nodes_rx) = mpsc::unbounded();
    let object_stream = watcher(objects_api.clone(), watcher::Config::default())
        .backoff(cloudnet_kubeclient::watch_backoff())
        // Nothing reads an object's managed fields or annotations (the instance is the ledger's
        // to say); a one-entry annotation map alone costs about 600 bytes an object in the cache.
        .modify(|o: &mut CloudPrivateIPConfig| {
            o.metadata.managed_fields = None;
            o.metadata.annotations = None;
        })
        .reflect(object_writer)
        // Every event reaches the node index and the node controller, but one that shows only
        // what our own writes returned starts no reconcile.
        .try_filter(move |event| {
            let nodes = index.apply(event);
            let seen = caught_up.apply(event);
            glance.apply(event);
            match event {
                watcher::Event::Apply(obj) if obj.metadata.deletion_timestamp.is_some() => {
                    tracing::debug!(object = %obj.name_any(), seen, "watch: object deleting");
                }
                watcher::Event::Delete(obj) => parked_for_watch.deleted(obj),
                _ => {}
            }
            for node in nodes {
                // The node controller ends only with this process; a closed channel is moot.
                let _ = object_nodes_tx.unbounded_send(ObjectRef::<CachedNode>::new(&node));
            }
            std::future::ready(!seen)
        })
        .applied_objects();
    // Every object's requests go through the intake (see `intake`), a bounded number at a time;
    // the watch itself never waits for the controller, so the cache keeps up with the API.
    let intake = Intake::new(usize::from(config.concurrency));
    let watched = Arc::clone(&intake);
    let object_watch = object_stream
        .for_each(move |event| {
            if let Ok(obj) = event {
                watched.push(&obj.name_any());
            }
            std::future::ready(())
        })
        .then(|_| std::future::pending::<()>());
    let answered = Arc::clone(&intake);
    let other_triggers = futures::stream::select(drift_rx, landed_rx)
        .for_each(move |request| {
            answered.push(&request.name);
            std::future::ready(())
        })
        .then(|()| std::future::pending::<()>());
    let object_controller = Controller::for_stream(
        futures::stream::pending::<Result<CloudPrivateIPConfig, watcher::Error>>(),
        object_store.clone(),
    )
    .with_config(ControllerConfig::default().concurrency(config.concurrency))
    .reconcile_on(intake.requests());
    let objects_for_nodes = object_store.clone();
    let index = Arc::clone(&by_node);
    // A node that appears (or gets its providerID) releases the objects waiting for it.
    let node_appeared = watcher(nodes_api.clone(), watcher::Config::default())
        .backoff(cloudnet_kubeclient::watch_backoff())
        .touched_objects()
        .predicate_filter(
            |n: &CachedNode| Some(u64::from(n.provider_id().is_some())),
            PredicateConfig::default(),
        )
        .filter(no_error);
    let object_controller = object_controller.watches_stream(node_appeared, move |node| {
        let name = node.name_any();
        index
            .objects_on(&objects_for_nodes, &name)
            .into_iter()
            .filter(|o| o.spec.node == name && !o.is_assigned())
            .map(|o| request_for(&o))
            .collect::<Vec<_>>()
    });

    let public_run = public::run(
        public::Parts {
            client: client.clone(),
            cloud: Arc::clone(&cloud),
            ledger: Arc::clone(&ledger),
            interfaces: Arc::clone(&interfaces),
            metrics: Arc::clone(&metrics),
            identity: identity.clone(),
            config: config.clone(),
        },
        shutdown.clone(),
    );
    let events = Events::new(
        client.clone(),
        Reporter {
            controller: CONTROLLER_NAME.into(),
            instance: Some(identity),
        },
        Arc::clone(&metrics),
    );
    let object_ctx = Arc::new(objects::Context::new(
        objects_api.clone(),
        Arc::clone(&cloud),
        Arc::clone(&lanes),
        node_reader.clone(),
        object_store.clone(),
        Arc::clone(&by_node),
        Arc::clone(&ledger),
        Arc::clone(&interfaces),
        written,
        parked,
        events,
        Arc::clone(&metrics),
        config.clone(),
    ));
    let node_ctx = Arc::new(nodes::Context::new(
        nodes_api,
        Arc::clone(&cloud),
        Arc::clone(&interfaces),
        node_reader.clone(),
        object_store.clone(),
        by_node,
        Arc::clone(&metrics),
        node_retries,
    ));
    // Object events (our own status writes included) recompute the annotation from the cached
    // interface view: they cost no cloud call. Each recomputation scans the object cache, and a
    // burst writes three times per object: the debounce folds a node's burst into one.
    let node_controller = Controller::for_stream(node_stream, node_reader.clone())
        .with_config(ControllerConfig::default().debounce(NODE_DEBOUNCE))
        .trigger_backoff(cloudnet_kubeclient::watch_backoff())
        .reconcile_on(object_nodes_rx)
        .reconcile_on(node_drift_rx);

    let (starting, dropped) = (Arc::clone(&intake), Arc::clone(&intake));
    let objects_run = object_controller
        .graceful_shutdown_on(shutdown.clone())
        .run(
            move |obj, ctx| {
                starting.started(&obj.name_any());
                objects::reconcile(obj, ctx)
            },
            objects::error_policy,
            Arc::clone(&object_ctx),
        )
        .for_each(move |result| {
            // A request for an object gone from the cache is dropped without a reconcile.
            if let Err(kube::runtime::controller::Error::ObjectNotFound(request)) = &result {
                dropped.started(&request.name);
            }
            std::future::ready(())
        });
    let nodes_run = node_controller
        .graceful_shutdown_on(shutdown.clone())
        .run(nodes::reconcile, nodes::error_policy, node_ctx)
        .for_each(|_| std::future::ready(()));
    let orphans = sweep::sweep_loop(Arc::clone(&object_ctx));
    let released = objects::release_orphans(Arc::clone(&object_ctx), orphans_rx);
    let drift = drift_loop(
        Arc::clone(&object_ctx),
        interfaces,
        Triggers {
            objects: drift_tx,
            nodes: node_drift_tx,
        },
        config.drift_period,
    );
    // The watch and each controller are polled only when they were woken: kube's controller
    // polls every running reconcile each time it is polled, which at 1,024 reconciles in flight
    // made every watch event, and every wake of the node controller, a pass over all of them.
    // They stay in this task, so that dropping the run (a lost lease) drops their reconciles at
    // once.
    let controllers: FuturesUnordered<BoxFuture<'_, ()>> =
        [objects_run.boxed(), nodes_run.boxed(), public_run.boxed()]
            .into_iter()
            .collect();
    tokio::select! {
        // Once the controllers have stopped, the IPs still in their lanes are answered and
        // written, as the reconciles that handed them over would have been.
        () = controllers.collect::<()>() => object_ctx.drain_parked().await,
        () = drift => {}
        () = orphans => {}
        () = released => {}
        () = object_watch => {}
        () = other_triggers => {}
    }
    tracing::info!("reconciler stopped");
    Ended::Stopped
}

/// Keeps a watch's errors away from a controller's triggers. kube-runtime backs off a controller's
/// whole trigger selector on any one trigger's error (client-go's 0.8 s doubling to 30 s), so after
/// an API outage one watch's failed re-lists held every trigger, a new object's included, for 12 s
/// and more after the API answered again. Each watch here backs off on its own
/// ([`cloudnet_kubeclient::watch_backoff`]) and the watcher logs its errors.
fn no_error<T>(event: &Result<T, watcher::Error>) -> std::future::Ready<bool> {
    std::future::ready(event.is_ok())
}

/// The object controller's request for `obj`: its name alone (kube's `ObjectRef::from_obj`
/// adds the uid and resourceVersion, which nothing here reads: requests compare by name).
fn request_for(obj: &CloudPrivateIPConfig) -> ObjectRef<CloudPrivateIPConfig> {
    ObjectRef::new(&obj.name_any())
}

/// Loads the attachment ledger, retrying with backoff while the API server refuses or fails (an
/// outage, or the namespace or the permission missing: the log says which), for at most
/// `deadline`; then the last cause, in a line.
async fn load_ledger(
    api: Api<ConfigMap>,
    metrics: &Arc<Metrics>,
    settings: LedgerSettings,
    deadline: Duration,
) -> Result<Ledger, String> {
    let (base, cap) = (Duration::from_millis(500), Duration::from_secs(30));
    let give_up = tokio::time::Instant::now() + deadline;
    let mut attempt = 0;
    loop {
        let load = Ledger::load_with(api.clone(), Arc::clone(metrics), settings.clone());
        let last = match tokio::time::timeout_at(give_up, load).await {
            Ok(Ok(ledger)) => return Ok(ledger),
            Ok(Err(e)) => e.to_string(),
            Err(_) => {
                format!(
                    "attachment ledger: listing its ConfigMaps got no answer within {}s",
                    deadline.as_secs()
                )
            }
        };
        let delay = backoff(attempt, base, cap);
        if tokio::time::Instant::now() + delay >= give_up {
            tracing::error!(error = %last, ?deadline, "cannot load the attachment ledger; giving up this term so that another replica can lead");
            return Err(last);
        }
        tracing::error!(error = %last, retry_in = ?delay, "cannot load the attachment ledger; nothing is attached or detached until it loads");
        tokio::time::sleep(delay).await;
        attempt = attempt.saturating_add(1);
    }
}

/// Where the drift check sends what it finds.
struct Triggers {
    /// Objects whose IP is missing from their node.
    objects: mpsc::UnboundedSender<ObjectRef<CloudPrivateIPConfig>>,
    /// Nodes whose interface was read again (their annotation is recomputed).
    nodes: mpsc::UnboundedSender<ObjectRef<CachedNode>>,
}

/// Every `period`, reads every known VM's interface again, in as few list calls as the cloud
/// allows (the one periodic cloud read: it refreshes the cached views the annotation and the
/// next change rely on), recomputes those nodes' annotations, and sends the objects whose IP is
/// missing from their node back through the controller; also refreshes the state gauge.
async fn drift_loop(
    ctx: Arc<objects::Context>,
    interfaces: Arc<Interfaces>,
    triggers: Triggers,
    period: Duration,
) {
    if period.is_zero() {
        return state_gauge_loop(&ctx).await;
    }
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        // Bounded, like the node reconcile's cache wait: an unsynced cache skips this round.
        match tokio::time::timeout(period, ctx.objects.wait_until_ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => continue,
        }
        let objects = ctx.objects.state();
        update_state_gauge(&ctx.metrics, &objects);
        let mut by_node: BTreeMap<String, Vec<Arc<CloudPrivateIPConfig>>> = BTreeMap::new();
        for obj in objects.into_iter().filter(|o| o.is_assigned()) {
            by_node.entry(obj.spec.node.clone()).or_default().push(obj);
        }
        let mut targets: BTreeMap<InstanceId, NodeTarget> = interfaces
            .known()
            .into_iter()
            .map(|t| (t.instance.clone(), t))
            .collect();
        // Every VM the ledger records IPs on, with a cached view or not (after a restart).
        for (_, placement) in ctx.ledger.entries() {
            let instance = placement.instance.clone();
            targets.entry(instance.clone()).or_insert(NodeTarget {
                node_name: placement.node.to_string(),
                provider_id: String::new(),
                instance,
                internal_ips: Default::default(),
            });
        }
        // Read together: as few list calls as the cloud allows, not one read per VM.
        let targets: Vec<NodeTarget> = targets.into_values().collect();
        let answers = interfaces.refresh_all(&targets).await;
        for (target, answer) in targets.into_iter().zip(answers) {
            let node = &target.node_name;
            let view = match answer {
                Ok(Some(view)) => view,
                // A change landed while reading: its answer is newer than the read.
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(%node, error = %e, "drift check failed");
                    interfaces.forget(&target.instance);
                    continue;
                }
            };
            if triggers.nodes.unbounded_send(ObjectRef::new(node)).is_err() {
                return;
            }
            let recorded_here =
                |ip| ctx.ledger.instance(ip, node).as_ref() == Some(&target.instance);
            for obj in by_node.get(node).into_iter().flatten() {
                let missing = decode_name(&obj.name_any())
                    .is_ok_and(|ip| recorded_here(ip) && !view.holds(ip));
                if missing {
                    tracing::warn!(object = %obj.name_any(), %node, "IP missing from its node; attaching again");
                    ctx.drifted
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(obj.name_any());
                    if triggers.objects.unbounded_send(request_for(obj)).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Keeps `cloudnet_ips` current when drift checks (which also refresh it) are off.
async fn state_gauge_loop(ctx: &objects::Context) {
    let mut tick = tokio::time::interval(STATE_GAUGE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Bounded: see the node reconcile's cache wait; the next tick looks again.
        match tokio::time::timeout(STATE_GAUGE_PERIOD, ctx.objects.wait_until_ready()).await {
            Ok(Ok(())) => update_state_gauge(&ctx.metrics, &ctx.objects.state()),
            Ok(Err(_)) => return,
            Err(_) => {}
        }
    }
}

fn update_state_gauge(metrics: &Metrics, objects: &[Arc<CloudPrivateIPConfig>]) {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for obj in objects {
        let state = match obj.assigned_condition().map(|c| c.status.as_str()) {
            _ if obj.spec.node.is_empty() => "unassigned",
            Some("True") => "assigned",
            Some("False") => "error",
            _ => "pending",
        };
        *counts.entry(state).or_default() += 1;
    }
    for state in ["assigned", "pending", "error", "unassigned"] {
        metrics
            .ips
            .get_or_create(&StateLabels {
                state: state.to_owned(),
            })
            .set(counts.get(state).copied().unwrap_or(0));
    }
}
