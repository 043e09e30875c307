//! The binding's status as the controller writes it: where the public address sits, the
//! association it made, and the `Associated` condition. Written only when something but the
//! condition's time changed, so that a binding re-checked on every drift period costs no write.

use cloudnet_shared::public_ip::{
    AssociatedReason, CONDITION_ASSOCIATED, EgressPublicIP, EgressPublicIPStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

/// What one reconcile found, to be written as the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    /// The condition's reason (its status follows from it).
    pub(crate) reason: AssociatedReason,
    /// The condition's message.
    pub(crate) message: String,
    /// The node whose interface holds the egress IP (empty when none does).
    pub(crate) node: String,
    /// That node's interface.
    pub(crate) interface: String,
    /// The cloud's id of the association this controller made, while it may still stand.
    pub(crate) association_id: String,
}

impl Found {
    /// What `binding` shows now, with a new condition: node, interface and association kept.
    pub(crate) fn kept(
        binding: &EgressPublicIP,
        reason: AssociatedReason,
        message: String,
    ) -> Self {
        let status = binding.status.clone().unwrap_or_default();
        Self {
            reason,
            message,
            node: status.node,
            interface: status.interface,
            association_id: status.association_id,
        }
    }

    /// What `binding` shows when no interface holds its egress IP for it: the new condition, no
    /// node or interface (the ones it named no longer hold the IP), the association id kept (a
    /// delete undoes it if the cloud still shows it).
    pub(crate) fn away(
        binding: &EgressPublicIP,
        reason: AssociatedReason,
        message: String,
    ) -> Self {
        Self {
            node: String::new(),
            interface: String::new(),
            ..Self::kept(binding, reason, message)
        }
    }
}

/// The status `found` makes of `binding`'s: the condition's transition time moves only when its
/// status does.
pub(crate) fn status(binding: &EgressPublicIP, found: &Found, now: Time) -> EgressPublicIPStatus {
    let before = binding.associated_condition();
    let status = found.reason.status();
    let last_transition_time = match before {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now,
    };
    EgressPublicIPStatus {
        node: found.node.clone(),
        interface: found.interface.clone(),
        association_id: found.association_id.clone(),
        conditions: vec![Condition {
            type_: CONDITION_ASSOCIATED.into(),
            status: status.into(),
            reason: found.reason.as_str().into(),
            message: found.message.clone(),
            last_transition_time,
            observed_generation: binding.metadata.generation,
        }],
        observed_generation: binding.metadata.generation,
    }
}

/// Whether writing `next` would change `binding`'s status.
pub(crate) fn changes(binding: &EgressPublicIP, next: &EgressPublicIPStatus) -> bool {
    binding.status.as_ref() != Some(next)
}

/// The merge patch that writes `next` whole: fields it leaves empty are removed, not kept.
pub(crate) fn patch(next: &EgressPublicIPStatus) -> Value {
    let mut status = serde_json::to_value(next).unwrap_or_else(|_| json!({}));
    if let Value::Object(fields) = &mut status {
        for field in ["node", "interface", "associationID"] {
            fields.entry(field).or_insert(Value::Null);
        }
    }
    json!({ "status": status })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloudnet_shared::public_ip::EgressPublicIPSpec;

    fn time(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap_or_default())
    }

    fn found(reason: AssociatedReason, association_id: &str) -> Found {
        Found {
            reason,
            message: "m".into(),
            node: "worker-a".into(),
            interface: "eni-0a".into(),
            association_id: association_id.into(),
        }
    }

    #[test]
    fn the_transition_time_moves_with_the_status_and_a_repeat_writes_nothing() {
        let mut binding = EgressPublicIP::new(
            "b",
            EgressPublicIPSpec {
                private_ip: "10.0.0.5".into(),
                public_ip: "eipalloc-0123456789abcdef0".into(),
            },
        );
        binding.metadata.generation = Some(3);
        let first = status(
            &binding,
            &found(AssociatedReason::Associated, "eipassoc-1"),
            time(10),
        );
        assert_eq!(first.conditions[0].status, "True");
        assert_eq!(first.conditions[0].last_transition_time, time(10));
        assert_eq!(first.observed_generation, Some(3));
        binding.status = Some(first);

        let again = status(
            &binding,
            &found(AssociatedReason::Associated, "eipassoc-1"),
            time(20),
        );
        assert!(!changes(&binding, &again), "{again:?}");

        let failed = status(&binding, &found(AssociatedReason::CloudError, ""), time(30));
        assert!(changes(&binding, &failed));
        assert_eq!(failed.conditions[0].last_transition_time, time(30));
        assert_eq!(
            patch(&failed)["status"]["associationID"],
            Value::Null,
            "an association no longer recorded is removed"
        );
    }
}
