//! The state machine of SPEC §2.3 as a pure function: given what an object says, what to do next.
//!
//! The engine applies one [`Step`], reads the object back and asks again until [`Step::Idle`], so
//! a move is "detach from the old node" followed, on the next round, by "attach to the new one"
//! (or one [`Step::Move`] on a cloud with a native move), and re-running after a crash at any point
//! picks up where the object's status says it stands.

use std::time::Duration;

/// Status of the `Assigned` condition as the engine reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assigned {
    /// `True`: the last cloud call for `status.node` succeeded.
    True,
    /// `False`: the last cloud call failed.
    False,
    /// `Unknown`: a call was in flight (perhaps when a previous controller died).
    Unknown,
    /// No condition yet.
    Missing,
}

impl Assigned {
    /// Reads a condition status string (`None` when the object has no condition).
    pub fn from_status(status: Option<&str>) -> Self {
        match status {
            Some("True") => Self::True,
            Some("False") => Self::False,
            Some(_) => Self::Unknown,
            None => Self::Missing,
        }
    }
}

/// What the decision looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectState<'a> {
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Our finalizer is on the object.
    pub has_finalizer: bool,
    /// `spec.node`.
    pub spec_node: &'a str,
    /// `status.node`.
    pub status_node: &'a str,
    /// The `Assigned` condition.
    pub assigned: Assigned,
    /// A drift check found the IP missing from `status.node` although the condition is `True`.
    pub drifted: bool,
    /// The provider moves an IP between VMs in one operation ([`crate::cloud::ProviderNeeds`]).
    pub native_move: bool,
}

/// What to do after a successful detach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterDetach {
    /// The object is being deleted: remove the finalizer.
    ReleaseFinalizer,
    /// A move or an unassignment: clear `status.node` (then attach elsewhere, if asked).
    ClearStatusNode,
}

/// The next step for one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do: the object is converged (or not ours to touch).
    Idle,
    /// Put the finalizer on an object whose IP is attached, so a delete cannot leak it.
    AddFinalizer,
    /// Remove the finalizer; nothing is attached (upstream leaves such objects stuck).
    ReleaseFinalizer,
    /// Detach the IP from `node`, then do `then`.
    Detach {
        /// The node the IP is on (`status.node`).
        node: String,
        /// What follows a successful detach.
        then: AfterDetach,
    },
    /// Attach the IP to `node` (`spec.node`), finalizer first.
    Attach {
        /// The target node.
        node: String,
    },
    /// Move the IP from `from` (`status.node`) to `to` (`spec.node`) in one cloud operation
    /// that never leaves it on both (OpenStack keeps the reservation port this way).
    Move {
        /// The node the IP is on.
        from: String,
        /// The target node.
        to: String,
    },
}

/// The next step for an object in `state`.
pub fn next_step(state: &ObjectState<'_>) -> Step {
    let status_node = state.status_node;
    if state.deleting {
        return match (state.has_finalizer, status_node.is_empty()) {
            (false, _) => Step::Idle,
            (true, true) => Step::ReleaseFinalizer,
            (true, false) => Step::Detach {
                node: status_node.to_owned(),
                then: AfterDetach::ReleaseFinalizer,
            },
        };
    }
    if !status_node.is_empty() && status_node != state.spec_node {
        if state.native_move && !state.spec_node.is_empty() {
            return Step::Move {
                from: status_node.to_owned(),
                to: state.spec_node.to_owned(),
            };
        }
        // Never attach to the new node before the old one let go: the IP must not be on two.
        return Step::Detach {
            node: status_node.to_owned(),
            then: AfterDetach::ClearStatusNode,
        };
    }
    if state.spec_node.is_empty() {
        return Step::Idle;
    }
    let converged = status_node == state.spec_node && state.assigned == Assigned::True;
    if converged && !state.drifted {
        if state.has_finalizer {
            Step::Idle
        } else {
            Step::AddFinalizer
        }
    } else {
        Step::Attach {
            node: state.spec_node.to_owned(),
        }
    }
}

/// What the node cache says about the node an IP is to be detached from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceNode<'a> {
    /// The cache has not listed the nodes yet: absence means nothing.
    NotSynced,
    /// The Node exists and names its VM.
    Present {
        /// Its `spec.providerID`.
        provider_id: &'a str,
    },
    /// The Node exists but has no providerID yet.
    NoProviderId,
    /// The cache has synced and holds no such Node.
    Absent,
}

/// Where a detach goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetachFrom<I> {
    /// The VM recorded on the object when the IP was attached.
    Recorded(I),
    /// The VM the Node's providerID names.
    Node(String),
    /// The Node is gone and this controller never attached the IP there (no record, which is
    /// written before every attach call): nothing of ours to detach, so skip the cloud call.
    NeverAttached,
    /// Nothing to act on yet; the message says why.
    Wait(String),
}

/// Where to detach an IP from `node`, given the instance recorded for that node (if any) and
/// what the node cache says.
///
/// Without the "never attached" answer a move away from, or a delete on, a vanished node would
/// wait forever for a Node that is not coming back (an attach refused before any cloud call, or
/// an object adopted from the upstream controller).
pub fn detach_from<I>(node: &str, recorded: Option<I>, source: SourceNode<'_>) -> DetachFrom<I> {
    if let Some(instance) = recorded {
        return DetachFrom::Recorded(instance);
    }
    match source {
        SourceNode::Present { provider_id } => DetachFrom::Node(provider_id.to_owned()),
        SourceNode::Absent => DetachFrom::NeverAttached,
        SourceNode::NoProviderId => DetachFrom::Wait(format!(
            "node {node} has no providerID yet and no instance was recorded on the object; \
             waiting for the providerID"
        )),
        SourceNode::NotSynced => DetachFrom::Wait(format!(
            "the node cache has not synced; cannot look up node {node}"
        )),
    }
}

/// Delay before retry number `attempt` (0-based): doubling from `base`, capped at `cap`.
///
/// There is no last attempt: a failing object keeps being retried at `cap` and its condition
/// says why, where upstream stops silently after about five minutes.
pub fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(cap).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(
        deleting: bool,
        has_finalizer: bool,
        spec_node: &'static str,
        status_node: &'static str,
        assigned: Assigned,
    ) -> ObjectState<'static> {
        ObjectState {
            deleting,
            has_finalizer,
            spec_node,
            status_node,
            assigned,
            drifted: false,
            native_move: false,
        }
    }

    fn attach(node: &str) -> Step {
        Step::Attach { node: node.into() }
    }

    fn detach(node: &str, then: AfterDetach) -> Step {
        Step::Detach {
            node: node.into(),
            then,
        }
    }

    #[test]
    fn transitions_follow_spec_2_3() {
        use AfterDetach::*;
        use Assigned::*;
        let table = [
            // add
            (state(false, false, "a", "", Missing), attach("a")),
            (state(false, true, "a", "a", Unknown), attach("a")),
            (state(false, true, "a", "a", False), attach("a")),
            (state(false, true, "a", "a", True), Step::Idle),
            (state(false, false, "a", "a", True), Step::AddFinalizer),
            // move: detach first, then attach on the next round
            (
                state(false, true, "b", "a", True),
                detach("a", ClearStatusNode),
            ),
            (
                state(false, true, "b", "a", Unknown),
                detach("a", ClearStatusNode),
            ),
            (
                state(false, true, "b", "a", False),
                detach("a", ClearStatusNode),
            ),
            (state(false, true, "b", "", True), attach("b")),
            // unassign
            (
                state(false, true, "", "a", True),
                detach("a", ClearStatusNode),
            ),
            (state(false, true, "", "", True), Step::Idle),
            (state(false, false, "", "", Missing), Step::Idle),
            // delete
            (
                state(true, true, "a", "a", True),
                detach("a", ReleaseFinalizer),
            ),
            (
                state(true, true, "b", "a", Unknown),
                detach("a", ReleaseFinalizer),
            ),
            (state(true, true, "a", "", Missing), Step::ReleaseFinalizer),
            (state(true, true, "a", "", False), Step::ReleaseFinalizer),
            (state(true, false, "a", "a", True), Step::Idle),
        ];
        for (input, want) in table {
            assert_eq!(next_step(&input), want, "{input:?}");
        }
    }

    #[test]
    fn detach_goes_to_the_record_else_the_node_and_skips_only_a_really_absent_node() {
        use DetachFrom::*;
        use SourceNode::*;
        let present = Present {
            provider_id: "memory:///i-2",
        };
        let table = [
            // A record always wins: the Node may be gone or now name another VM.
            (Some("i-1"), present, Recorded("i-1")),
            (Some("i-1"), Absent, Recorded("i-1")),
            (Some("i-1"), NotSynced, Recorded("i-1")),
            (Some("i-1"), NoProviderId, Recorded("i-1")),
            (None, present, Node("memory:///i-2".to_owned())),
            // Never attached by us, and the Node is gone for sure: nothing to detach.
            (None, Absent, NeverAttached),
        ];
        for (recorded, source, want) in table {
            assert_eq!(
                detach_from("a", recorded, source),
                want,
                "{recorded:?} {source:?}"
            );
        }
        // An unsynced cache or a Node still being initialised proves nothing: wait.
        for source in [NotSynced, NoProviderId] {
            let got = detach_from::<&str>("a", None, source);
            assert!(matches!(&got, Wait(m) if m.contains("node a")), "{got:?}");
        }
    }

    #[test]
    fn drift_reattaches_a_converged_object() {
        let mut s = state(false, true, "a", "a", Assigned::True);
        s.drifted = true;
        assert_eq!(next_step(&s), attach("a"));
    }

    #[test]
    fn a_move_never_attaches_before_detaching() {
        // Walk a move through the steps the engine would take; no attach while status names A.
        let mut status_node = "a";
        let mut assigned = Assigned::True;
        let mut steps = Vec::new();
        loop {
            let step = next_step(&state(false, true, "b", status_node, assigned));
            if let Step::Attach { .. } = step {
                assert_eq!(status_node, "", "attach while still on {status_node}");
            }
            steps.push(step.clone());
            match step {
                Step::Idle => break,
                Step::Detach { .. } => status_node = "",
                Step::Attach { .. } => {
                    status_node = "b";
                    assigned = Assigned::True;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(steps.len(), 3, "{steps:?}");
    }

    #[test]
    fn a_native_move_is_one_step_and_everything_else_is_unchanged() {
        use Assigned::*;
        let native = |s: ObjectState<'static>| ObjectState {
            native_move: true,
            ..s
        };
        let moving = |from: &str, to: &str| Step::Move {
            from: from.into(),
            to: to.into(),
        };
        let table = [
            (native(state(false, true, "b", "a", True)), moving("a", "b")),
            // An interrupted or failed move is moved again: the operation is idempotent.
            (
                native(state(false, true, "b", "a", Unknown)),
                moving("a", "b"),
            ),
            (
                native(state(false, true, "b", "a", False)),
                moving("a", "b"),
            ),
            // Unassigning and deleting still detach.
            (
                native(state(false, true, "", "a", True)),
                detach("a", AfterDetach::ClearStatusNode),
            ),
            (
                native(state(true, true, "b", "a", True)),
                detach("a", AfterDetach::ReleaseFinalizer),
            ),
            (native(state(false, true, "b", "", True)), attach("b")),
            (native(state(false, true, "b", "b", True)), Step::Idle),
        ];
        for (input, want) in table {
            assert_eq!(next_step(&input), want, "{input:?}");
        }
    }

    #[test]
    fn condition_status_strings_are_read() {
        assert_eq!(Assigned::from_status(Some("True")), Assigned::True);
        assert_eq!(Assigned::from_status(Some("False")), Assigned::False);
        assert_eq!(Assigned::from_status(Some("Unknown")), Assigned::Unknown);
        assert_eq!(Assigned::from_status(None), Assigned::Missing);
    }

    #[test]
    fn backoff_doubles_and_caps_without_giving_up() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(60);
        assert_eq!(backoff(0, base, cap), Duration::from_millis(100));
        assert_eq!(backoff(1, base, cap), Duration::from_millis(200));
        assert_eq!(backoff(5, base, cap), Duration::from_millis(3200));
        assert_eq!(backoff(10, base, cap), cap);
        assert_eq!(backoff(u32::MAX, base, cap), cap);
    }
}
