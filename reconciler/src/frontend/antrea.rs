//! The Antrea front end (docs/plugins/antrea.md): Antrea's agents elect the node of each Egress IP
//! and put the IP on a local device; in a cloud the VPC delivers the address only to the
//! interface the cloud has it on, so cloudnet keeps each IP of an Egress whose pool the admin
//! opted in ([`OPT_IN_LABEL`]) as a CloudPrivateIPConfig on `status.egressNode`: created when
//! the IP is first assigned, moved when Antrea moves it, parked when no node holds it, deleted
//! with the Egress, its IP or its pool's opt-in.
//!
//! It watches Egresses (each reduced to what [`Egress::held_ips`] reads), the opted-in pools only
//! (selected by label on the server) and its own CloudPrivateIPConfigs only (by owner label).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use cloudnet_shared::CloudPrivateIPConfig;
use cloudnet_shared::antrea::{Egress, ExternalIPPool, OPT_IN_LABEL, OPT_IN_VALUE};
use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::plan::Want;
use super::{FrontEnd, OWNER_LABEL, Parts};
use crate::events::Events;
use crate::metrics::Metrics;

/// This front end's name: the owner label's value on its objects.
pub const OWNER: &str = "antrea";

/// How its objects' source annotation names an Egress: `Egress/<name>`.
const SOURCE_KIND: &str = "Egress";

/// The egress IPs of `egresses` whose pool is in `opted_in`, each on its Egress's node. An IP two
/// Egresses hold (Antrea's webhook refuses that) goes to the first by name.
pub(crate) fn wants<'a>(
    egresses: impl IntoIterator<Item = &'a Egress>,
    opted_in: &BTreeSet<String>,
) -> BTreeMap<IpAddr, Want> {
    let mut sorted: Vec<&Egress> = egresses.into_iter().collect();
    sorted.sort_by_key(|egress| egress.name_any());
    let mut wants = BTreeMap::new();
    for egress in sorted {
        let source = format!("{SOURCE_KIND}/{}", egress.name_any());
        for held in egress.held_ips() {
            if opted_in.contains(&held.pool) {
                wants.entry(held.ip).or_insert_with(|| Want {
                    node: held.node,
                    source: source.clone(),
                });
            }
        }
    }
    wants
}

/// The Antrea front end over its caches.
struct Antrea {
    egresses: Store<Egress>,
    pools: Store<ExternalIPPool>,
}

impl FrontEnd for Antrea {
    fn owner(&self) -> &'static str {
        OWNER
    }

    fn regarding(&self, source: &str) -> Option<ObjectReference> {
        let name = source.strip_prefix(SOURCE_KIND)?.strip_prefix('/')?;
        let egress = self.egresses.get(&ObjectRef::new(name))?;
        Some(egress.object_ref(&()))
    }

    fn wants(&self) -> BTreeMap<IpAddr, Want> {
        let opted_in: BTreeSet<String> = self
            .pools
            .state()
            .iter()
            .filter(|pool| pool.opted_in())
            .map(|pool| pool.name_any())
            .collect();
        let egresses = self.egresses.state();
        wants(egresses.iter().map(Arc::as_ref), &opted_in)
    }
}

/// Only what [`Egress::held_ips`] and the plan read: the Pods an Egress applies to, its
/// conditions, annotations and managed fields can be large and are never read.
fn slim(egress: &mut Egress) {
    egress.metadata.managed_fields = None;
    egress.metadata.annotations = None;
    egress.spec.applied_to = Default::default();
    egress.spec.bandwidth = None;
    if let Some(status) = &mut egress.status {
        status.conditions.clear();
    }
}

/// Runs the front end until `shutdown`, its Events published as `reporter`: waits until its
/// three watches have listed, then plans after every change.
pub async fn run(
    client: Client,
    reporter: Reporter,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let events = Events::new(client.clone(), reporter, Arc::clone(&metrics));
    let (egresses, egress_writer) = reflector::store();
    let (pools, pool_writer) = reflector::store();
    let (objects, object_writer) = reflector::store();
    let egress_events = watcher(
        Api::<Egress>::all(client.clone()),
        watcher::Config::default(),
    )
    .backoff(cloudnet_kubeclient::watch_backoff())
    .modify(slim)
    .reflect(egress_writer)
    .map(super::logged(OWNER, "egresses.crd.antrea.io"));
    let opted_in = format!("{OPT_IN_LABEL}={OPT_IN_VALUE}");
    let pool_events = watcher(
        Api::<ExternalIPPool>::all(client.clone()),
        watcher::Config::default().labels(&opted_in),
    )
    .backoff(cloudnet_kubeclient::watch_backoff())
    .modify(|pool: &mut ExternalIPPool| pool.metadata.managed_fields = None)
    .reflect(pool_writer)
    .map(super::logged(OWNER, "externalippools.crd.antrea.io"));
    let ours = format!("{OWNER_LABEL}={OWNER}");
    let api = Api::<CloudPrivateIPConfig>::all(client);
    let object_events = watcher(api.clone(), watcher::Config::default().labels(&ours))
        .backoff(cloudnet_kubeclient::watch_backoff())
        // Its status stays: the transitions it shows are told on the Egress.
        .modify(|object: &mut CloudPrivateIPConfig| object.metadata.managed_fields = None)
        .reflect(object_writer)
        .map(super::logged(OWNER, "its cloudprivateipconfigs"));
    let changes = futures::stream::select(
        egress_events,
        futures::stream::select(pool_events, object_events),
    );
    let front = Antrea {
        egresses: egresses.clone(),
        pools: pools.clone(),
    };
    let ready = async {
        // Planning before every cache has listed would delete objects whose Egress is not
        // listed yet.
        let (e, p, o) = future::join3(
            egresses.wait_until_ready(),
            pools.wait_until_ready(),
            objects.wait_until_ready(),
        )
        .await;
        e.is_ok() && p.is_ok() && o.is_ok()
    };
    // The streams drive the caches: they are polled while waiting for the first lists.
    let mut changes = std::pin::pin!(changes);
    let mut shutdown = std::pin::pin!(shutdown);
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
            _ = changes.next() => {}
        }
    }
    tracing::info!(
        front_end = OWNER,
        "Antrea Egresses of opted-in ExternalIPPools are attached in the cloud"
    );
    let parts = Parts {
        api: &api,
        objects: &objects,
        events: &events,
        metrics: &metrics,
    };
    super::drive(&front, parts, changes, shutdown).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn egress(name: &str, ip: &str, pool: &str, node: &str) -> Egress {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "crd.antrea.io/v1beta1", "kind": "Egress",
            "metadata": {"name": name},
            "spec": {"appliedTo": {}, "egressIP": ip, "externalIPPool": pool},
            "status": {"egressNode": node, "egressIP": ip}
        }))
        .unwrap()
    }

    #[test]
    fn only_opted_in_pools_are_wanted_and_a_doubly_held_ip_goes_to_the_first_egress() {
        let egresses = [
            egress("web", "10.0.0.5", "cloud", "node-a"),
            egress("db", "10.0.0.6", "cloud", ""),
            egress("lab", "10.0.0.7", "on-prem", "node-a"),
            egress("zz-copy", "10.0.0.5", "cloud", "node-b"),
        ];
        let opted_in = BTreeSet::from(["cloud".to_owned()]);
        let wants = wants(&egresses, &opted_in);
        assert_eq!(wants.len(), 2, "{wants:?}");
        let web = &wants[&"10.0.0.5".parse::<IpAddr>().unwrap()];
        assert_eq!(
            (web.node.as_str(), web.source.as_str()),
            ("node-a", "Egress/web")
        );
        assert_eq!(
            wants[&"10.0.0.6".parse::<IpAddr>().unwrap()].node,
            "",
            "no node holds it"
        );
    }
}
