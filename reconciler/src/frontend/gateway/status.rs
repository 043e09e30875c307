//! A gateway's status: its active node and the `Ready` condition, from the choice and from what
//! its CloudPrivateIPConfigs and the active node show. `Ready` is `True` once every IP is
//! attached to the active node in the cloud and the node carries the active label, which its
//! agent sets only after putting the IPs on its interface.

use cloudnet_shared::gateway::{
    ACTIVE_VALUE, CONDITION_READY, EgressGateway, EgressGatewayStatus, ReadyReason, active_label,
};
use cloudnet_shared::{AssignedReason, CloudPrivateIPConfig, encode_name};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::choose::Choice;
use super::ips;
use super::node::GatewayNode;

/// The active node, the `Ready` reason and its message for `gateway` chosen as `choice`.
pub(super) fn readiness(
    gateway: &EgressGateway,
    choice: &Choice,
    ours: &Store<CloudPrivateIPConfig>,
    nodes: &Store<GatewayNode>,
) -> (String, ReadyReason, String) {
    let node = match choice {
        Choice::Active(node) => node,
        Choice::NoEligibleNode => {
            return (
                String::new(),
                ReadyReason::NoEligibleNode,
                "no node the nodeSelector picks is Ready, schedulable, free of NoExecute taints, not being deleted and with a fresh node agent heartbeat".to_owned(),
            );
        }
        Choice::CapacityReached => {
            return (
                String::new(),
                ReadyReason::CapacityReached,
                "every eligible node's interface is full (capacity in its egress-ipconfig annotation)".to_owned(),
            );
        }
    };
    let mut waiting = Vec::new();
    for ip in ips(gateway) {
        let Ok(name) = encode_name(ip) else { continue };
        let object = ours.get(&ObjectRef::new(&name));
        let condition = object
            .as_ref()
            .and_then(|o| o.assigned_condition().cloned());
        match (object.as_ref(), condition) {
            (Some(object), Some(c))
                if object.spec.node == *node
                    && c.reason == AssignedReason::CloudResponseError.as_str() =>
            {
                return (
                    node.clone(),
                    ReadyReason::CloudError,
                    format!("{ip} on node {node}: {}", c.message),
                );
            }
            (Some(object), Some(c))
                if object.status_node() == Some(node.as_str()) && c.status == "True" => {}
            _ => waiting.push(ip.to_string()),
        }
    }
    if !waiting.is_empty() {
        return (
            node.clone(),
            ReadyReason::Pending,
            format!(
                "attaching {} to node {node} in the cloud",
                waiting.join(", ")
            ),
        );
    }
    let labelled = nodes
        .get(&ObjectRef::new(node))
        .and_then(|n| n.labels().get(&active_label(&gateway.name_any())).cloned())
        .is_some_and(|value| value == ACTIVE_VALUE);
    if !labelled {
        return (
            node.clone(),
            ReadyReason::Pending,
            format!(
                "attached in the cloud; waiting for node {node}'s agent to put the IPs on its interface"
            ),
        );
    }
    (
        node.clone(),
        ReadyReason::Ready,
        format!(
            "{} on node {node}'s interface",
            gateway.spec.egress_ips.join(", ")
        ),
    )
}

/// The status to write, or `None` when it is what `gateway` shows already. The condition's
/// `lastTransitionTime` moves only when its status does.
pub(super) fn next(
    gateway: &EgressGateway,
    active: &str,
    reason: ReadyReason,
    message: &str,
) -> Option<EgressGatewayStatus> {
    let current = gateway.status.clone().unwrap_or_default();
    let previous = gateway.ready_condition();
    let generation = gateway.metadata.generation;
    let unchanged = current.active_node == active
        && current.observed_generation == generation
        && previous.is_some_and(|c| {
            c.status == reason.status() && c.reason == reason.as_str() && c.message == message
        });
    if unchanged {
        return None;
    }
    let since = previous
        .filter(|c| c.status == reason.status())
        .map_or_else(
            || Time(Timestamp::now()),
            |c| c.last_transition_time.clone(),
        );
    Some(EgressGatewayStatus {
        active_node: active.to_owned(),
        conditions: vec![Condition {
            type_: CONDITION_READY.to_owned(),
            status: reason.status().to_owned(),
            reason: reason.as_str().to_owned(),
            message: message.to_owned(),
            last_transition_time: since,
            observed_generation: generation,
        }],
        observed_generation: generation,
    })
}
