//! The node's heartbeat: the coordination.k8s.io/v1 Lease `cloudnet-node-<node>` in the agent's
//! namespace, created or renewed every interval (holderIdentity: the node, renewTime: now,
//! leaseDurationSeconds). The reconciler's leader reads it to decide the node's health.
//!
//! One server-side apply per beat creates the Lease or renews it in one request, with no read
//! first. Each beat has a deadline below the interval, so a slow API server costs missed beats,
//! never a queue of late ones; it runs in a task of its own, so it never holds the address loop.

use std::sync::Arc;
use std::time::Duration;

use cloudnet_shared::gateway::lease_name;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::{Api, Client};

use crate::metrics::Metrics;

/// The field manager of the agent's writes.
pub const FIELD_MANAGER: &str = "cloudnet-node";

/// What a beat writes and how often.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    /// The node (holder and the Lease's name).
    pub node: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// Time between beats.
    pub interval: Duration,
    /// `leaseDurationSeconds` written in the Lease.
    pub lease_duration_seconds: i32,
}

impl Heartbeat {
    /// The Lease a beat at `now` applies.
    pub fn lease(&self, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(&self.node)),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.node.clone()),
                lease_duration_seconds: Some(self.lease_duration_seconds),
                renew_time: Some(MicroTime(now)),
                ..LeaseSpec::default()
            }),
        }
    }

    /// Beats until the process ends.
    pub async fn run(self, client: Client, metrics: Arc<Metrics>) {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let name = lease_name(&self.node);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        // Below the interval, so that the next beat starts on time.
        let deadline = self.interval.mul_f64(0.9);
        let mut beats = tokio::time::interval(self.interval);
        beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            beats.tick().await;
            let now = Timestamp::now();
            let lease = self.lease(now);
            let outcome =
                tokio::time::timeout(deadline, api.patch(&name, &params, &Patch::Apply(&lease)))
                    .await;
            match outcome {
                Ok(Ok(_)) => {
                    if failing {
                        tracing::info!(lease = %name, "heartbeat renewed again");
                        failing = false;
                    }
                    metrics.heartbeat(Some(now.as_millisecond() as f64 / 1000.0));
                }
                Ok(Err(e)) => {
                    if !failing {
                        tracing::warn!(lease = %name, error = %e, "cannot renew the heartbeat Lease; retrying every interval");
                        failing = true;
                    }
                    metrics.heartbeat(None);
                }
                Err(_) => {
                    if !failing {
                        tracing::warn!(lease = %name, ?deadline, "heartbeat renewal took too long; retrying every interval");
                        failing = true;
                    }
                    metrics.heartbeat(None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_beat_names_the_node_as_holder_with_the_duration() {
        let heartbeat = Heartbeat {
            node: "worker-1".into(),
            namespace: "cloudnet-system".into(),
            interval: Duration::from_secs(1),
            lease_duration_seconds: 3,
        };
        let lease = heartbeat.lease(Timestamp::UNIX_EPOCH);
        let json = serde_json::to_value(&lease).unwrap();
        assert_eq!(json["apiVersion"], "coordination.k8s.io/v1");
        assert_eq!(json["metadata"]["name"], "cloudnet-node-worker-1");
        assert_eq!(json["spec"]["holderIdentity"], "worker-1");
        assert_eq!(json["spec"]["leaseDurationSeconds"], 3);
        assert_eq!(json["spec"]["renewTime"], "1970-01-01T00:00:00.000000Z");
    }
}
