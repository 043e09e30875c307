//! The labeller: applies the address loop's latest [`LabelPatch`] to this node's labels, apart
//! from that loop so that a slow API server never holds an address repair back. A JSON merge
//! patch of `metadata.labels` only (the agent's RBAC and admission policy allow nothing else):
//! `active` for a gateway held, `null` to remove. A failed patch is retried until it succeeds or
//! a newer patch replaces it.

use std::sync::Arc;
use std::time::Duration;

use cloudnet_shared::gateway::ACTIVE_VALUE;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::plan::LabelPatch;

/// The body of `patch`: a JSON merge patch of the labels alone.
pub fn merge_patch(patch: &LabelPatch) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    for key in &patch.remove {
        labels.insert(key.clone(), serde_json::Value::Null);
    }
    for key in &patch.set {
        labels.insert(key.clone(), ACTIVE_VALUE.into());
    }
    serde_json::json!({ "metadata": { "labels": labels } })
}

/// Applies `patches` to node `node` until the sender closes; a failed patch waits `retry`.
pub async fn run(
    client: Client,
    node: String,
    mut patches: watch::Receiver<LabelPatch>,
    retry: Duration,
    metrics: Arc<Metrics>,
) {
    let api: Api<Node> = Api::all(client);
    let params = PatchParams::default();
    loop {
        if patches.changed().await.is_err() {
            return;
        }
        loop {
            let patch = patches.borrow_and_update().clone();
            if patch.is_empty() {
                break;
            }
            let outcome = tokio::time::timeout(
                retry.max(Duration::from_secs(2)),
                api.patch(&node, &params, &Patch::Merge(merge_patch(&patch))),
            )
            .await;
            match outcome {
                Ok(Ok(_)) => {
                    metrics.label_patch(true);
                    tracing::info!(set = ?patch.set, removed = ?patch.remove, "node labels patched");
                    break;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot patch this node's labels; retrying")
                }
                Err(_) => tracing::warn!("patching this node's labels took too long; retrying"),
            }
            metrics.label_patch(false);
            // A newer patch goes at once; the same one after `retry`.
            let _ = tokio::time::timeout(retry, patches.changed()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_patch_touches_only_the_named_labels() {
        let patch = LabelPatch {
            set: ["egress-gateway.cloudnet.io/web".to_owned()].into(),
            remove: ["egress-gateway.cloudnet.io/db".to_owned()].into(),
        };
        assert_eq!(
            merge_patch(&patch),
            serde_json::json!({"metadata": {"labels": {
                "egress-gateway.cloudnet.io/web": "active",
                "egress-gateway.cloudnet.io/db": null,
            }}})
        );
    }
}
