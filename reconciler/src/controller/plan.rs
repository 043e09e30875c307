//! The state machine of SPEC §2.3 as a pure function: given what an object says, what to do next.
//!
//! The engine applies one [`Step`], reads the object back and asks again until [`Step::Idle`], so
//! a move is "detach from the old node" followed, on the next round, by "attach to the new one"
//! (or one [`Step::Move`] on a cloud with a native move), and re-running after a crash at any point
//! picks up where the object's status says it stands.

use std::time::Duration;

/// Status of the `Assigned` condition as the engine reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Assigned {
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
    pub(crate) fn from_status(status: Option<&str>) -> Self {
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
pub(crate) struct ObjectState<'a> {
    /// `metadata.deletionTimestamp` is set.
    pub(crate) deleting: bool,
    /// Our finalizer is on the object.
    pub(crate) has_finalizer: bool,
    /// `spec.node`.
    pub(crate) spec_node: &'a str,
    /// `status.node`.
    pub(crate) status_node: &'a str,
    /// The `Assigned` condition.
    pub(crate) assigned: Assigned,
    /// A drift check found the IP missing from `status.node` although the condition is `True`.
    pub(crate) drifted: bool,
    /// The attachment ledger records the IP on `status.node`'s VM.
    pub(crate) recorded: bool,
    /// The provider moves an IP between VMs in one operation ([`crate::cloud::ProviderNeeds`]).
    pub(crate) native_move: bool,
}

/// What to do after a successful detach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterDetach {
    /// The object is being deleted: remove the finalizer.
    ReleaseFinalizer,
    /// A move or an unassignment: clear `status.node` (then attach elsewhere, if asked).
    ClearStatusNode,
}

/// The next step for one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing to do: the object is converged (or not ours to touch).
    Idle,
    /// Put the finalizer on an object whose IP is attached, so a delete cannot leak it.
    AddFinalizer,
    /// Record in the ledger an IP assigned without a record (by the upstream controller, or
    /// before the ledger was lost), from `node`'s current VM once its interface shows the IP.
    Adopt {
        /// The node the IP is assigned to (`status.node` = `spec.node`).
        node: String,
    },
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
pub(crate) fn next_step(state: &ObjectState<'_>) -> Step {
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
        match (state.has_finalizer, state.recorded) {
            (false, _) => Step::AddFinalizer,
            (true, true) => Step::Idle,
            (true, false) => Step::Adopt {
                node: status_node.to_owned(),
            },
        }
    } else {
        Step::Attach {
            node: state.spec_node.to_owned(),
        }
    }
}

/// What the node cache says about the node an IP is to be detached from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourceNode<'a> {
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
pub(crate) enum DetachFrom<I> {
    /// The VM the ledger records the IP on for that node.
    Recorded(I),
    /// Nothing recorded; the VM the Node's providerID names, if its interface holds the IP (an
    /// IP the upstream controller attached and that was never adopted).
    Node(String),
    /// Nothing recorded and no VM to look at (the Node is gone or has no providerID): the ledger
    /// is written before every attach call, so nothing of ours is attached there.
    NothingRecorded,
    /// Nothing to act on yet; the message says why.
    Wait(String),
}

/// Where to detach an IP from `node`, given the instance the ledger records for that node (if
/// any) and what the node cache says.
///
/// Without the "nothing recorded" answer a move away from, or a delete on, a node the IP never
/// reached would wait forever (an attach refused before any cloud call because the Node was
/// gone or had no providerID yet).
pub(crate) fn detach_from<I>(
    node: &str,
    recorded: Option<I>,
    source: SourceNode<'_>,
) -> DetachFrom<I> {
    if let Some(instance) = recorded {
        return DetachFrom::Recorded(instance);
    }
    match source {
        SourceNode::Present { provider_id } => DetachFrom::Node(provider_id.to_owned()),
        SourceNode::Absent | SourceNode::NoProviderId => DetachFrom::NothingRecorded,
        SourceNode::NotSynced => DetachFrom::Wait(format!(
            "the node cache has not synced; cannot look up node {node}"
        )),
    }
}

/// Delay before retry number `attempt` (0-based): doubling from `base`, capped at `cap`.
///
/// There is no last attempt: a failing object keeps being retried at `cap` and its condition
/// says why, where upstream stops silently after about five minutes.
pub(crate) fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
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
            recorded: true,
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
    fn detach_goes_to_the_ledger_else_the_nodes_vm_and_skips_a_node_without_one() {
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
            // Nothing recorded and no VM to look at: nothing of ours is attached there.
            (None, Absent, NothingRecorded),
            (None, NoProviderId, NothingRecorded),
        ];
        for (recorded, source, want) in table {
            assert_eq!(
                detach_from("a", recorded, source),
                want,
                "{recorded:?} {source:?}"
            );
        }
        // An unsynced cache proves nothing: wait.
        let got = detach_from::<&str>("a", None, NotSynced);
        assert!(matches!(&got, Wait(m) if m.contains("node a")), "{got:?}");
    }

    #[test]
    fn an_assigned_ip_without_a_record_is_adopted_once_it_has_the_finalizer() {
        use Assigned::*;
        let unrecorded = |s: ObjectState<'static>| ObjectState {
            recorded: false,
            ..s
        };
        let adopt = |node: &str| Step::Adopt { node: node.into() };
        let table = [
            (unrecorded(state(false, true, "a", "a", True)), adopt("a")),
            (
                unrecorded(state(false, false, "a", "a", True)),
                Step::AddFinalizer,
            ),
            // Not converged: the attach records it anyway.
            (unrecorded(state(false, true, "a", "a", False)), attach("a")),
            (
                unrecorded(state(false, true, "a", "", Missing)),
                attach("a"),
            ),
            // Moving or deleting: the detach looks for the IP itself.
            (
                unrecorded(state(false, true, "b", "a", True)),
                detach("a", AfterDetach::ClearStatusNode),
            ),
            (
                unrecorded(state(true, true, "a", "a", True)),
                detach("a", AfterDetach::ReleaseFinalizer),
            ),
            (unrecorded(state(false, true, "", "", True)), Step::Idle),
        ];
        for (input, want) in table {
            assert_eq!(next_step(&input), want, "{input:?}");
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
