//! The egress gateway front end (docs/gateways.md): for each `EgressGateway` the leader chooses
//! one healthy node ([`choose`]), keeps each of its egress IPs as a CloudPrivateIPConfig on that
//! node (the shared front-end layer: created, moved, parked with no node eligible, deleted with
//! the gateway), writes the gateway's status, and takes the active label off every node that is
//! not the gateway's active node. The node agent (`cloudnet-node`) on the active node puts the
//! IPs on its interface once the cloud has them there, and labels its node.
//!
//! A node is healthy while its agent's heartbeat Lease (`cloudnet-node-<node>`) is renewed
//! within the timeout ([`heartbeat`]); the leader looks again the moment the first fresh
//! heartbeat would turn stale, so a silent agent is noticed within the timeout with no event.
//!
//! Two loops share the caches: the chooser (every change of gateways, nodes, Leases and
//! objects, and every heartbeat expiry) and the shared layer's plan loop, which it wakes when a
//! choice changes. The chooser's first pass ends before the plan loop starts: a plan without
//! choices would park every gateway's IPs.

mod choose;
mod heartbeat;
mod node;
mod status;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cloudnet_shared::gateway::{EgressGateway, FRONT_END, LEASE_PREFIX, ReadyReason};
use cloudnet_shared::rules::gateway::{gateway_of_object, gateway_source};
use cloudnet_shared::{CloudPrivateIPConfig, EgressState};
use futures::{FutureExt, StreamExt, future};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::time::Instant;

use super::plan::Want;
use super::{FrontEnd, OWNER_LABEL, Parts};
use crate::events::Events;
use crate::metrics::Metrics;
use choose::{Candidate, Choice, Gateway};
use heartbeat::Heartbeats;
use node::GatewayNode;

/// This front end's name: the owner label's value on its objects.
pub const OWNER: &str = FRONT_END;

/// The least time between two passes of the chooser: every agent renews its Lease every
/// second, and a pass reads every node and object, so a burst of renewals is one pass. A failover
/// waits for it at most this long.
const PACE: Duration = Duration::from_millis(100);

/// What the front end needs besides the client.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The namespace of the node agents' heartbeat Leases.
    pub lease_namespace: String,
    /// How old a heartbeat may be before its node is no longer eligible.
    pub heartbeat_timeout: Duration,
}

/// The choices the plan loop reads, as the chooser last made them.
type Choices = Arc<Mutex<BTreeMap<String, Choice>>>;

/// The gateway front end over its caches.
struct Gateways {
    gateways: Store<EgressGateway>,
    choices: Choices,
}

impl FrontEnd for Gateways {
    fn owner(&self) -> &'static str {
        OWNER
    }

    fn regarding(&self, source: &str) -> Option<ObjectReference> {
        let name = gateway_of_object(Some(OWNER), Some(source))?;
        let gateway = self.gateways.get(&ObjectRef::new(name))?;
        Some(gateway.object_ref(&()))
    }

    fn wants(&self) -> BTreeMap<IpAddr, Want> {
        let choices = self
            .choices
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        wants(self.gateways.state().iter().map(AsRef::as_ref), &choices)
    }
}

/// Each egress IP of `gateways` on its gateway's active node (none: parked, detached in the
/// cloud, kept for the next eligible node). An IP two gateways name (the webhook refuses that)
/// goes to the first by name.
fn wants<'a>(
    gateways: impl IntoIterator<Item = &'a EgressGateway>,
    choices: &BTreeMap<String, Choice>,
) -> BTreeMap<IpAddr, Want> {
    let mut sorted: Vec<&EgressGateway> = gateways.into_iter().collect();
    sorted.sort_by_key(|gateway| gateway.name_any());
    let mut wants = BTreeMap::new();
    for gateway in sorted {
        let name = gateway.name_any();
        let node = match choices.get(&name) {
            Some(Choice::Active(node)) => node.clone(),
            _ => String::new(),
        };
        for ip in ips(gateway) {
            wants.entry(ip).or_insert_with(|| Want {
                node: node.clone(),
                source: gateway_source(&name),
            });
        }
    }
    wants
}

/// A gateway's egress IPs that parse (the webhook admits canonical ones only).
fn ips(gateway: &EgressGateway) -> Vec<IpAddr> {
    gateway
        .spec
        .egress_ips
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

/// The caches the chooser reads.
struct Caches {
    gateways: Store<EgressGateway>,
    nodes: Store<GatewayNode>,
    leases: Store<Lease>,
    /// Every CloudPrivateIPConfig, reduced to its nodes: who occupies which node.
    occupants: Store<CloudPrivateIPConfig>,
    /// The front end's own objects, with their status.
    ours: Store<CloudPrivateIPConfig>,
}

/// The chooser's state between passes.
struct Chooser {
    caches: Caches,
    heartbeats: Heartbeats,
    choices: Choices,
    gateway_api: Api<EgressGateway>,
    node_api: Api<GatewayNode>,
    events: Arc<Events>,
    metrics: Arc<Metrics>,
    settings: Settings,
    /// Gateways failing over, since when: the old node's last heartbeat, or when it was seen
    /// ineligible.
    failing: HashMap<String, Instant>,
}

impl Chooser {
    /// One pass: heartbeats, choices (published, and the plan loop woken if they changed),
    /// the gateways' status, Events, and the active label off every node not active.
    async fn pass(&mut self, wake: &futures::channel::mpsc::UnboundedSender<()>) {
        let now = Instant::now();
        self.heartbeats.observe(
            self.caches.leases.state().iter().map(AsRef::as_ref),
            now,
            k8s_openapi::jiff::Timestamp::now(),
        );
        self.metrics
            .gateway
            .set_heartbeats(self.heartbeats.ages(now));
        let nodes = self.candidates(now);
        let gateways: Vec<Gateway> = self
            .caches
            .gateways
            .state()
            .iter()
            .map(|gateway| Gateway {
                name: gateway.name_any(),
                selector: Selector::try_from(gateway.spec.node_selector.clone()).ok(),
                ips: ips(gateway),
                active: gateway.active_node().map(str::to_owned),
            })
            .collect();
        let chosen = choose::choose(&gateways, &nodes);
        let before = std::mem::replace(
            &mut *self.choices.lock().unwrap_or_else(PoisonError::into_inner),
            chosen.clone(),
        );
        if before != chosen {
            // The receiver lives as long as the plan loop, which outlives this one.
            let _ = wake.unbounded_send(());
        }
        self.count(&gateways, &nodes, &before, &chosen, now);
        let writes = self.caches.gateways.state().into_iter().map(|gateway| {
            let name = gateway.name_any();
            let choice = chosen.get(&name).cloned().unwrap_or(Choice::NoEligibleNode);
            let why_left = gateway
                .active_node()
                .filter(|old| Some(&Choice::Active((*old).to_owned())) != chosen.get(&name))
                .map(|old| self.why_not(old, &gateway, &nodes));
            self.settle(gateway, choice, why_left)
        });
        for (name, ready) in future::join_all(writes).await {
            if ready && let Some(since) = self.failing.remove(&name) {
                self.metrics
                    .gateway
                    .failover_took(now.duration_since(since));
            }
        }
        self.strip_labels(&chosen).await;
    }

    /// The metrics of this pass's choices, and the start of each failover.
    fn count(
        &mut self,
        gateways: &[Gateway],
        nodes: &BTreeMap<String, Candidate>,
        before: &BTreeMap<String, Choice>,
        chosen: &BTreeMap<String, Choice>,
        now: Instant,
    ) {
        let active = |choices: &BTreeMap<String, Choice>, name: &str| match choices.get(name) {
            Some(Choice::Active(node)) => Some(node.clone()),
            _ => None,
        };
        for gateway in gateways {
            let eligible = choose::live(gateway, nodes).count();
            self.metrics.gateway.set_eligible(&gateway.name, eligible);
            let (old, new) = (active(before, &gateway.name), active(chosen, &gateway.name));
            self.metrics
                .gateway
                .set_active(&gateway.name, old.as_deref(), new.as_deref());
            if let Some(old) = old.filter(|old| Some(old) != new.as_ref()) {
                self.metrics.gateway.failed_over(&gateway.name);
                let since = self
                    .heartbeats
                    .last(&old)
                    .filter(|_| !self.heartbeats.fresh(&old, now))
                    .unwrap_or(now);
                self.failing.insert(gateway.name.clone(), since);
            }
        }
        for (name, choice) in before {
            if !chosen.contains_key(name) {
                let old = match choice {
                    Choice::Active(node) => Some(node.as_str()),
                    _ => None,
                };
                self.metrics.gateway.forget(name, old);
                self.failing.remove(name);
            }
        }
    }

    /// Every node as [`choose`] reads it.
    fn candidates(&self, now: Instant) -> BTreeMap<String, Candidate> {
        let mut occupants: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
        for object in self.caches.occupants.state() {
            let Ok(ip) = cloudnet_shared::decode_name(&object.name_any()) else {
                continue;
            };
            let status_node = object.status_node().unwrap_or_default();
            for node in [object.spec.node.as_str(), status_node] {
                if !node.is_empty() {
                    occupants.entry(node.to_owned()).or_default().insert(ip);
                }
            }
        }
        self.caches
            .nodes
            .state()
            .iter()
            .map(|node| {
                let name = node.name_any();
                let capacity = EgressState::from_annotation(node.egress_annotation())
                    .config()
                    .map(|config| config.capacity);
                let candidate = Candidate {
                    labels: node.metadata.labels.clone().unwrap_or_default(),
                    healthy: node.healthy(),
                    heartbeat: self.heartbeats.fresh(&name, now),
                    capacity,
                    occupants: occupants.remove(&name).unwrap_or_default(),
                };
                (name, candidate)
            })
            .collect()
    }

    /// Why `node` can no longer be `gateway`'s active node, for its Event.
    fn why_not(
        &self,
        node: &str,
        gateway: &EgressGateway,
        nodes: &BTreeMap<String, Candidate>,
    ) -> String {
        let Some(candidate) = nodes.get(node) else {
            return format!("node {node} is gone");
        };
        let matches = Selector::try_from(gateway.spec.node_selector.clone())
            .is_ok_and(|s| s.matches(&candidate.labels));
        if !matches {
            format!("node {node} no longer matches the gateway's nodeSelector")
        } else if !candidate.heartbeat {
            format!(
                "node {node}'s agent has not renewed its Lease {LEASE_PREFIX}{node} within {:?}",
                self.settings.heartbeat_timeout
            )
        } else if !candidate.healthy {
            format!("node {node} is NotReady, cordoned, being deleted or tainted NoExecute")
        } else {
            format!("node {node} has no room left for the gateway's IPs")
        }
    }

    /// Writes `gateway`'s status for `choice` if it changed, and the Event of a new active
    /// node (`why_left`: why the old one is not).
    /// Returns the gateway's name and whether it is Ready.
    async fn settle(
        &self,
        gateway: Arc<EgressGateway>,
        choice: Choice,
        why_left: Option<String>,
    ) -> (String, bool) {
        let name = gateway.name_any();
        let (active, reason, message) =
            status::readiness(&gateway, &choice, &self.caches.ours, &self.caches.nodes);
        let ready = reason == ReadyReason::Ready;
        let Some(next) = status::next(&gateway, &active, reason, &message) else {
            return (name, ready);
        };
        let mut status = serde_json::json!(next);
        if active.is_empty() {
            // A merge patch keeps a field it does not name: no active node is an explicit null.
            status["activeNode"] = serde_json::Value::Null;
        }
        let patch = Patch::Merge(serde_json::json!({ "status": status }));
        if let Err(error) = self
            .gateway_api
            .patch_status(&name, &PatchParams::default(), &patch)
            .await
        {
            tracing::warn!(gateway = %name, %error, "status write failed; written again on the next pass");
            return (name, false);
        }
        let before = gateway.active_node().unwrap_or_default();
        if before == active {
            return (name, ready);
        }
        let regarding = gateway.object_ref(&());
        let (warning, event, note) = match (&choice, why_left) {
            (Choice::Active(new), Some(why)) => (
                false,
                "ActiveNodeChanged",
                format!("active node {before} → {new}: {why}"),
            ),
            (Choice::Active(new), None) => {
                (false, "ActiveNodeChosen", format!("active node {new}"))
            }
            (_, why) => (
                true,
                reason.as_str(),
                why.map_or_else(|| message.clone(), |why| format!("{why}; {message}")),
            ),
        };
        tracing::info!(gateway = %name, from = %before, to = %active, "{note}");
        self.events.publish(&regarding, warning, event, note).await;
        (name, ready)
    }

    /// Takes each gateway's active label off every node that is not its active node: an old
    /// node that comes back, or one whose agent labelled it from a stale view, never keeps it.
    async fn strip_labels(&self, chosen: &BTreeMap<String, Choice>) {
        let strips = self.caches.nodes.state().into_iter().filter_map(|node| {
            let name = node.name_any();
            let stale: Vec<String> = node
                .active_labels()
                .filter(|key| {
                    let gateway = cloudnet_shared::gateway::gateway_of_label(key).unwrap_or("");
                    chosen.get(gateway) != Some(&Choice::Active(name.clone()))
                })
                .map(str::to_owned)
                .collect();
            (!stale.is_empty()).then_some((name, stale))
        });
        let writes = strips.map(|(name, stale)| async move {
            let labels: serde_json::Map<String, serde_json::Value> = stale
                .iter()
                .map(|key| (key.clone(), serde_json::Value::Null))
                .collect();
            let patch = Patch::Merge(serde_json::json!({ "metadata": { "labels": labels } }));
            match self
                .node_api
                .patch(&name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => tracing::info!(node = %name, labels = ?stale, "active label taken off: not the gateway's active node"),
                Err(error) => tracing::warn!(node = %name, %error, "taking the active label off failed; tried again on the next pass"),
            }
        });
        future::join_all(writes).await;
    }
}

/// Runs the front end until `shutdown`, its Events published as `reporter`.
pub async fn run(
    client: Client,
    reporter: Reporter,
    metrics: Arc<Metrics>,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) {
    let events = Arc::new(Events::new(client.clone(), reporter, Arc::clone(&metrics)));
    let (gateways, gateway_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let (leases, lease_writer) = reflector::store();
    let (occupants, occupant_writer) = reflector::store();
    let (ours, our_writer) = reflector::store();
    let gateway_api = Api::<EgressGateway>::all(client.clone());
    let gateway_events = watcher(gateway_api.clone(), watcher::Config::default())
        .backoff(cloudnet_kubeclient::watch_backoff())
        .modify(|gateway: &mut EgressGateway| gateway.metadata.managed_fields = None)
        .reflect(gateway_writer)
        .map(super::logged(OWNER, "egressgateways.cloudnet.io"));
    let node_api = Api::<GatewayNode>::all(client.clone());
    let node_events = watcher(node_api.clone(), watcher::Config::default())
        .backoff(cloudnet_kubeclient::watch_backoff())
        .modify(node::slim)
        .reflect(node_writer)
        .map(super::logged(OWNER, "nodes"));
    let lease_events = watcher(
        Api::<Lease>::namespaced(client.clone(), &settings.lease_namespace),
        watcher::Config::default(),
    )
    .backoff(cloudnet_kubeclient::watch_backoff())
    .modify(|lease: &mut Lease| {
        lease.metadata.managed_fields = None;
        lease.metadata.annotations = None;
        lease.metadata.labels = None;
    })
    .reflect(lease_writer)
    .map(super::logged(OWNER, "node agent leases"));
    let api = Api::<CloudPrivateIPConfig>::all(client);
    let occupant_events = watcher(api.clone(), watcher::Config::default())
        .backoff(cloudnet_kubeclient::watch_backoff())
        .modify(occupant)
        .reflect(occupant_writer)
        .map(super::logged(OWNER, "cloudprivateipconfigs"));
    let own = format!("{OWNER_LABEL}={OWNER}");
    let our_events = watcher(api.clone(), watcher::Config::default().labels(&own))
        .backoff(cloudnet_kubeclient::watch_backoff())
        .modify(|object: &mut CloudPrivateIPConfig| object.metadata.managed_fields = None)
        .reflect(our_writer)
        .map(super::logged(OWNER, "its cloudprivateipconfigs"));
    let chooser_changes = futures::stream::select_all([
        gateway_events.boxed(),
        node_events.boxed(),
        lease_events.boxed(),
        occupant_events.boxed(),
    ]);
    let (wake, woken) = futures::channel::mpsc::unbounded::<()>();
    let plan_changes = futures::stream::select(our_events.map(|_| ()), woken);

    let mut chooser_changes = std::pin::pin!(chooser_changes);
    let mut plan_changes = std::pin::pin!(plan_changes);
    let mut shutdown = std::pin::pin!(shutdown.fuse());
    {
        let ready = async {
            // Choosing before every cache has listed would fail over from nodes not listed yet.
            let listed = future::join5(
                gateways.wait_until_ready(),
                nodes.wait_until_ready(),
                leases.wait_until_ready(),
                occupants.wait_until_ready(),
                ours.wait_until_ready(),
            )
            .await;
            listed.0.is_ok()
                && listed.1.is_ok()
                && listed.2.is_ok()
                && listed.3.is_ok()
                && listed.4.is_ok()
        };
        let mut ready = std::pin::pin!(ready);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                listed = &mut ready => {
                    if !listed {
                        return;
                    }
                    break;
                }
                _ = chooser_changes.next() => {}
                _ = plan_changes.next() => {}
            }
        }
    }
    let choices = Choices::default();
    let mut chooser = Chooser {
        caches: Caches {
            gateways: gateways.clone(),
            nodes,
            leases,
            occupants,
            ours: ours.clone(),
        },
        heartbeats: Heartbeats::new(settings.heartbeat_timeout),
        choices: Arc::clone(&choices),
        gateway_api,
        node_api,
        events: Arc::clone(&events),
        metrics: Arc::clone(&metrics),
        settings,
        failing: HashMap::new(),
    };
    chooser.pass(&wake).await;
    tracing::info!(
        front_end = OWNER,
        "egress gateways: active nodes chosen, their IPs kept on them"
    );
    let front = Gateways { gateways, choices };
    let parts = Parts {
        api: &api,
        objects: &ours,
        events: &events,
        metrics: &metrics,
    };
    let choosing = async {
        let mut last = Instant::now();
        loop {
            let expiry = chooser.heartbeats.next_expiry(Instant::now());
            let expired = async {
                match expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                change = chooser_changes.next() => if change.is_none() { return },
                () = expired => {}
            }
            tokio::time::sleep_until(last + PACE).await;
            while let Some(Some(_)) = chooser_changes.next().now_or_never() {}
            chooser.pass(&wake).await;
            last = Instant::now();
        }
    };
    tokio::select! {
        () = choosing => {}
        () = super::drive(&front, parts, plan_changes, &mut shutdown) => {}
    }
}

/// Only who occupies which node: a CloudPrivateIPConfig's name, `spec.node` and `status.node`.
fn occupant(object: &mut CloudPrivateIPConfig) {
    object.metadata.managed_fields = None;
    object.metadata.annotations = None;
    object.metadata.labels = None;
    if let Some(status) = object.status.as_mut() {
        status.conditions.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gateway(name: &str, ips: &[&str]) -> EgressGateway {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cloudnet.io/v1alpha1", "kind": "EgressGateway",
            "metadata": {"name": name},
            "spec": {"nodeSelector": {}, "egressIPs": ips},
        }))
        .unwrap()
    }

    #[test]
    fn each_ip_is_wanted_on_its_gateways_choice_and_parked_without_one() {
        let gateways = [
            gateway("web", &["10.0.0.5", "10.0.0.6"]),
            gateway("db", &["10.0.0.7"]),
            gateway("zz", &["10.0.0.5"]),
        ];
        let choices = BTreeMap::from([
            ("web".to_owned(), Choice::Active("node-a".into())),
            ("db".to_owned(), Choice::NoEligibleNode),
        ]);
        let wants = wants(&gateways, &choices);
        let at = |ip: &str| wants[&ip.parse::<IpAddr>().unwrap()].clone();
        assert_eq!(at("10.0.0.5").node, "node-a");
        assert_eq!(
            at("10.0.0.5").source,
            "EgressGateway/web",
            "the first by name"
        );
        assert_eq!(at("10.0.0.6").node, "node-a");
        assert_eq!(at("10.0.0.7").node, "", "parked: no node eligible");
    }
}
