//! The agent's three watches, each caching only the fields the plan reads: every EgressGateway
//! (name, egress IPs, active node), the gateways' CloudPrivateIPConfigs only (selected by the
//! front-end label on the server: name, status node, Assigned), and this node only (selected by
//! name on the server: its active labels and its egress-ipconfig annotation). After their first
//! lists, every change publishes a new [`Snapshot`].
//!
//! An API outage leaves the last snapshot in place: the agent does not fence itself (the cloud
//! keeps the IPs on this VM meanwhile, and a whole-API outage must not take every gateway's
//! addresses away); the watches resume and converge when the API is back.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use cloudnet_shared::gateway::{ACTIVE_LABEL_PREFIX, EgressGateway, FRONT_END};
use cloudnet_shared::{
    CONDITION_ASSIGNED, CloudPrivateIPConfig, EGRESS_IPCONFIG_ANNOTATION, FRONT_END_LABEL,
};
use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use crate::endpoint::Health;
use crate::plan::{Attachment, Gateway, NodeView, Snapshot};

/// Runs the watches until the process ends, publishing to `snapshots` (after the first lists)
/// and marking `health` synced then.
pub async fn run(
    client: Client,
    node: String,
    snapshots: watch::Sender<Option<Arc<Snapshot>>>,
    health: Arc<Health>,
) {
    let (gateways, gateway_writer) = reflector::store();
    let (objects, object_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let gateway_events = watcher(
        Api::<EgressGateway>::all(client.clone()),
        watcher::Config::default(),
    )
    .backoff(cloudnet_kubeclient::watch_backoff())
    .modify(slim_gateway)
    .reflect(gateway_writer)
    .map(logged("egressgateways"));
    let ours = format!("{FRONT_END_LABEL}={FRONT_END}");
    let object_events = watcher(
        Api::<CloudPrivateIPConfig>::all(client.clone()),
        watcher::Config::default().labels(&ours),
    )
    .backoff(cloudnet_kubeclient::watch_backoff())
    .modify(slim_object)
    .reflect(object_writer)
    .map(logged("cloudprivateipconfigs"));
    let this_node = format!("metadata.name={node}");
    let node_events = watcher(
        Api::<Node>::all(client),
        watcher::Config::default().fields(&this_node),
    )
    .backoff(cloudnet_kubeclient::watch_backoff())
    .modify(slim_node)
    .reflect(node_writer)
    .map(logged("this node"));
    let mut changes = std::pin::pin!(futures::stream::select(
        gateway_events,
        futures::stream::select(object_events, node_events),
    ));
    let ready = async {
        // A snapshot before every cache has listed would remove the addresses of the gateways
        // not listed yet.
        let (g, o, n) = future::join3(
            gateways.wait_until_ready(),
            objects.wait_until_ready(),
            nodes.wait_until_ready(),
        )
        .await;
        g.is_ok() && o.is_ok() && n.is_ok()
    };
    let mut ready = std::pin::pin!(ready);
    // The streams drive the caches: they are polled while waiting for the first lists.
    loop {
        tokio::select! {
            listed = &mut ready => {
                if !listed {
                    return;
                }
                break;
            }
            next = changes.next() => if next.is_none() { return },
        }
    }
    health.set_synced();
    tracing::info!(%node, "gateways, their CloudPrivateIPConfigs and this node listed");
    loop {
        let snapshot = snapshot(&node, &nodes, &gateways, &objects);
        snapshots.send_if_modified(|current| {
            let changed = current.as_deref() != Some(&snapshot);
            if changed {
                *current = Some(Arc::new(snapshot));
            }
            changed
        });
        if changes.next().await.is_none() {
            return;
        }
    }
}

/// The picture the caches hold now.
fn snapshot(
    node: &str,
    nodes: &Store<Node>,
    gateways: &Store<EgressGateway>,
    objects: &Store<CloudPrivateIPConfig>,
) -> Snapshot {
    let node_view = nodes
        .state()
        .iter()
        .find(|n| n.name_any() == node)
        .map(|n| node_view(node, n))
        .unwrap_or_else(|| NodeView {
            name: node.to_owned(),
            ..NodeView::default()
        });
    let mut gateway_views: Vec<Gateway> = gateways
        .state()
        .iter()
        .map(|gateway| Gateway {
            name: gateway.name_any(),
            egress_ips: gateway
                .spec
                .egress_ips
                .iter()
                .filter_map(|ip| ip.parse().ok())
                .collect(),
            active_node: gateway.active_node().map(str::to_owned),
        })
        .collect();
    gateway_views.sort_by(|a, b| a.name.cmp(&b.name));
    let attachments: BTreeMap<IpAddr, Attachment> = objects
        .state()
        .iter()
        .filter_map(|object| {
            let ip = cloudnet_shared::decode_name(&object.name_any()).ok()?;
            let attachment = Attachment {
                node: object.status_node().map(str::to_owned),
                assigned: object
                    .assigned_condition()
                    .is_some_and(|c| c.status == "True"),
            };
            Some((ip, attachment))
        })
        .collect();
    Snapshot {
        node: node_view,
        gateways: gateway_views,
        attachments,
    }
}

/// `node` as the plan reads it; an unreadable annotation reads as none (no device is guessed).
fn node_view(name: &str, node: &Node) -> NodeView {
    let egress = node
        .annotations()
        .get(EGRESS_IPCONFIG_ANNOTATION)
        .map(|value| match cloudnet_shared::annotation::decode(value) {
            Ok(configs) => configs,
            Err(e) => {
                tracing::warn!(error = %e, "this node's egress-ipconfig annotation is unreadable");
                Vec::new()
            }
        })
        .unwrap_or_default();
    NodeView {
        name: name.to_owned(),
        labels: node.labels().clone(),
        egress,
    }
}

/// Only the name, the egress IPs and the active node stay.
fn slim_gateway(gateway: &mut EgressGateway) {
    gateway.metadata.managed_fields = None;
    gateway.metadata.annotations = None;
    gateway.metadata.labels = None;
    gateway.spec.node_selector = Default::default();
    if let Some(status) = &mut gateway.status {
        status.conditions.clear();
    }
}

/// Only the name, the status node and the Assigned condition's status stay.
fn slim_object(object: &mut CloudPrivateIPConfig) {
    object.metadata.managed_fields = None;
    object.metadata.annotations = None;
    object.metadata.labels = None;
    object.metadata.finalizers = None;
    if let Some(status) = &mut object.status {
        status.conditions.retain(|c| c.type_ == CONDITION_ASSIGNED);
        for condition in &mut status.conditions {
            condition.message.clear();
        }
    }
}

/// Only the active labels and the egress-ipconfig annotation stay: a Node's status (images,
/// conditions) is most of its size and is never read here.
fn slim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(annotations) = &mut node.metadata.annotations {
        annotations.retain(|key, _| key == EGRESS_IPCONFIG_ANNOTATION);
    }
    if let Some(labels) = &mut node.metadata.labels {
        labels.retain(|key, _| key.starts_with(ACTIVE_LABEL_PREFIX));
    }
    node.spec = None;
    node.status = None;
}

/// Logs a watch's errors (the watcher retries them with its backoff); the event itself is in
/// the cache by then, so only its arrival matters.
fn logged<T>(watched: &'static str) -> impl FnMut(Result<T, watcher::Error>) {
    move |event| {
        if let Err(e) = &event {
            tracing::warn!(watched, error = %e, "watch failed; retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_slim_node_keeps_only_what_the_plan_reads() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "node-a",
                "labels": {"kubernetes.io/hostname": "node-a", "egress-gateway.cloudnet.io/web": "active"},
                "annotations": {
                    "cloud.network.openshift.io/egress-ipconfig": "[{\"interface\":\"eni-1\",\"ifaddr\":{\"ipv4\":\"10.0.0.0/24\"},\"capacity\":{\"ipv4\":14}}]",
                    "node.alpha.kubernetes.io/ttl": "0"
                }
            },
            "spec": {"providerID": "aws:///us-east-1a/i-1"},
            "status": {"images": [{"names": ["a"], "sizeBytes": 1}]}
        }))
        .unwrap();
        slim_node(&mut node);
        assert!(node.status.is_none() && node.spec.is_none());
        let view = node_view("node-a", &node);
        assert_eq!(
            view.labels.keys().collect::<Vec<_>>(),
            ["egress-gateway.cloudnet.io/web"]
        );
        assert_eq!(
            view.egress[0].ifaddr.ipv4,
            Some("10.0.0.0/24".parse().unwrap())
        );
    }
}
