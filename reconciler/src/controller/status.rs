//! The status the reconciler writes: upstream's `Assigned` condition with our fixes
//! (`lastTransitionTime` moves only when the condition's status does; `observedGeneration` set).

use cloudnet_shared::{AssignedReason, CONDITION_ASSIGNED, CloudPrivateIPConfigStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub(crate) use cloudnet_shared::upstream_text as upstream;

/// How the message of an attach refused as not this controller's to take begins, after
/// upstream's failure text: the reason stays `CloudResponseError` (SPEC §2.2; consumers know
/// only upstream's three), and this says which kind of failure it is.
pub(crate) const FOREIGN: &str = "foreign address";

/// `text` (one of [`upstream`]'s), then `detail`: upstream's message first, ours after it.
pub(crate) fn upstream_first(text: &str, detail: impl std::fmt::Display) -> String {
    format!("{text}: {detail}")
}

/// The status after setting `node` and the `Assigned` condition to `reason`/`message`.
///
/// Returns `None` when that is exactly the current status, so the caller skips the API write.
pub(crate) fn next_status(
    current: Option<&CloudPrivateIPConfigStatus>,
    node: &str,
    reason: AssignedReason,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<CloudPrivateIPConfigStatus> {
    let previous =
        current.and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_ASSIGNED));
    let unchanged = current.is_some_and(|s| s.node == node)
        && previous.is_some_and(|c| {
            c.status == reason.status()
                && c.reason == reason.as_str()
                && c.message == message
                && c.observed_generation == generation
        });
    if unchanged {
        return None;
    }
    let last_transition_time = match previous {
        Some(c) if c.status == reason.status() => c.last_transition_time.clone(),
        _ => Time(now),
    };
    Some(CloudPrivateIPConfigStatus {
        node: node.to_owned(),
        conditions: vec![Condition {
            type_: CONDITION_ASSIGNED.to_owned(),
            status: reason.status().to_owned(),
            reason: reason.as_str().to_owned(),
            message: message.to_owned(),
            observed_generation: generation,
            last_transition_time,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn first_write_sets_every_field() {
        let status = next_status(
            None,
            "a",
            AssignedReason::CloudResponsePending,
            "attaching",
            Some(3),
            at(10),
        )
        .unwrap();
        assert_eq!(status.node, "a");
        let c = &status.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Assigned", "Unknown", "CloudResponsePending")
        );
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(c.last_transition_time, Time(at(10)));
    }

    #[test]
    fn identical_status_is_not_written_again() {
        let first = next_status(
            None,
            "a",
            AssignedReason::CloudResponseSuccess,
            "ok",
            Some(1),
            at(10),
        );
        let again = next_status(
            first.as_ref(),
            "a",
            AssignedReason::CloudResponseSuccess,
            "ok",
            Some(1),
            at(20),
        );
        assert_eq!(again, None);
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let failed = next_status(
            None,
            "a",
            AssignedReason::CloudResponseError,
            "boom",
            Some(1),
            at(10),
        );
        let failed_again = next_status(
            failed.as_ref(),
            "a",
            AssignedReason::CloudResponseError,
            "boom twice",
            Some(1),
            at(20),
        )
        .unwrap();
        assert_eq!(
            failed_again.conditions[0].last_transition_time,
            Time(at(10))
        );
        let ok = next_status(
            Some(&failed_again),
            "a",
            AssignedReason::CloudResponseSuccess,
            "ok",
            Some(1),
            at(30),
        )
        .unwrap();
        assert_eq!(ok.conditions[0].last_transition_time, Time(at(30)));
    }
}
