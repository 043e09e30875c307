//! The API floor of the benchmarks: the Kubernetes requests SPEC §2.3 asks of any controller,
//! pushed through a control plane by a plain client (no watch, no cloud) with as many requests
//! in flight as the benchmarks' own creates. A benchmark runs it before its reconciler starts and
//! compares its total time with it: the fastest any controller bound to the protocol could go on
//! that control plane.
//!
//! Per added IP: the create, the finalizer (a metadata write), Pending, Success and, unless left
//! out, one Event (upstream writes none; the reconciler writes one per transition). Per moved
//! IP: the spec patch, Pending, status.node cleared, Pending, Success and two Events. The
//! attachment ledger's writes are one per VM and batch, not per IP, and are left out. The
//! scratch objects (10.200/16, labelled, without a finalizer) stay until [`clear`].

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// Requests in flight, as the benchmarks' creates.
const IN_FLIGHT_REQUESTS: usize = 64;

/// Label of the floor's scratch objects, so they can be deleted in one call.
const FLOOR_LABEL: &str = "cloudnet.io/bench-floor";

/// Whether the added IPs' Events are part of the floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Events {
    /// One Event per added IP, as the reconciler writes.
    One,
    /// None, as upstream writes: the protocol's writes alone.
    None,
}

/// The floor's requests for one IP, with its names.
struct Floor {
    api: Api<CloudPrivateIPConfig>,
    events: Api<K8sEvent>,
    nodes: usize,
}

impl Floor {
    fn new(client: &Client, nodes: usize) -> Self {
        Self {
            api: Api::all(client.clone()),
            events: Api::namespaced(client.clone(), "default"),
            nodes: nodes.max(1),
        }
    }

    fn name(i: usize) -> String {
        format!("10.200.{}.{}", (i / 256) % 256, i % 256)
    }

    fn node(&self, i: usize) -> String {
        format!("bench-{:04}", i % self.nodes)
    }

    /// The first fifth of the nodes (at least one), whose IPs a move takes to the others.
    fn failed(&self) -> usize {
        (self.nodes / 5).max(1)
    }

    fn new_node(&self, i: usize) -> String {
        let failed = self.failed();
        format!("bench-{:04}", failed + i % (self.nodes - failed).max(1))
    }

    /// The add's metadata write, standing for the finalizer (an annotation, so that the scratch
    /// objects stay deletable in one call).
    async fn record(&self, i: usize, node: &str) -> Result<()> {
        let record = json!({ "metadata": { "annotations": { FLOOR_LABEL: node } } });
        self.api
            .patch(
                &Self::name(i),
                &PatchParams::default(),
                &Patch::Merge(record),
            )
            .await?;
        Ok(())
    }

    async fn status(&self, i: usize, node: &str, reason: &str, status: &str) -> Result<()> {
        let body: Value = json!({ "status": { "node": node, "conditions": [{
            "type": "Assigned",
            "status": status,
            "reason": reason,
            "message": format!("floor {reason}"),
            "lastTransitionTime": Timestamp::now().to_string(),
        }]}});
        self.api
            .patch_status(&Self::name(i), &PatchParams::default(), &Patch::Merge(body))
            .await?;
        Ok(())
    }

    async fn event(&self, i: usize, reason: &str) -> Result<()> {
        let event = K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!("{}.floor.{}", Self::name(i), reason.to_lowercase())),
                ..ObjectMeta::default()
            },
            action: Some("Reconcile".into()),
            reason: Some(reason.into()),
            note: Some(format!("floor {reason}")),
            event_time: Some(MicroTime(Timestamp::now())),
            reporting_controller: Some("bench-floor".into()),
            reporting_instance: Some("bench-floor".into()),
            type_: Some("Normal".into()),
            ..K8sEvent::default()
        };
        self.events.create(&PostParams::default(), &event).await?;
        Ok(())
    }

    async fn add(&self, i: usize, events: Events) -> Result<()> {
        let node = self.node(i);
        let mut obj = CloudPrivateIPConfig::new(
            &Self::name(i),
            CloudPrivateIPConfigSpec { node: node.clone() },
        );
        obj.metadata.labels = Some([(FLOOR_LABEL.to_owned(), "1".to_owned())].into());
        self.api.create(&PostParams::default(), &obj).await?;
        self.record(i, &node).await?;
        self.status(i, &node, "CloudResponsePending", "Unknown")
            .await?;
        self.status(i, &node, "CloudResponseSuccess", "True")
            .await?;
        if events == Events::One {
            self.event(i, "Attached").await?;
        }
        Ok(())
    }

    async fn move_away(&self, i: usize) -> Result<()> {
        let (old, new) = (self.node(i), self.new_node(i));
        let spec = Patch::Merge(json!({ "spec": { "node": new } }));
        self.api
            .patch(&Self::name(i), &PatchParams::default(), &spec)
            .await?;
        self.status(i, &old, "CloudResponsePending", "Unknown")
            .await?;
        self.status(i, "", "CloudResponseSuccess", "True").await?;
        self.status(i, &new, "CloudResponsePending", "Unknown")
            .await?;
        self.status(i, &new, "CloudResponseSuccess", "True").await?;
        self.event(i, "Detached").await?;
        self.event(i, "AttachedAgain").await
    }
}

/// Creates `objects` IPs over `nodes` nodes with the writes of an add; returns how long it took.
/// The Events are named after their IPs: one add with [`Events::One`] per control plane.
pub async fn add(
    client: &Client,
    objects: usize,
    nodes: usize,
    events: Events,
) -> Result<Duration> {
    let floor = Floor::new(client, nodes);
    let started = Instant::now();
    stream::iter(0..objects.min(65536))
        .map(|i| floor.add(i, events))
        .buffer_unordered(IN_FLIGHT_REQUESTS)
        .try_collect::<()>()
        .await?;
    Ok(started.elapsed())
}

/// Moves the added IPs of the first fifth of the nodes to the others with the writes of a move;
/// returns how long it took.
pub async fn moved(client: &Client, objects: usize, nodes: usize) -> Result<Duration> {
    let floor = Floor::new(client, nodes);
    let failed = floor.failed();
    let started = Instant::now();
    stream::iter((0..objects.min(65536)).filter(|i| i % floor.nodes < failed))
        .map(|i| floor.move_away(i))
        .buffer_unordered(IN_FLIGHT_REQUESTS)
        .try_collect::<()>()
        .await?;
    Ok(started.elapsed())
}

/// Deletes the floor's objects and waits until they are gone.
pub async fn clear(client: &Client) -> Result<()> {
    let api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let selector = ListParams::default().labels(&format!("{FLOOR_LABEL}=1"));
    api.delete_collection(&DeleteParams::default(), &selector)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !api.list_metadata(&selector).await?.items.is_empty() {
        ensure!(Instant::now() < deadline, "floor objects not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
