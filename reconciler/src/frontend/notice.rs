//! What a front end tells on its plugin's objects. The reconciler reports each
//! CloudPrivateIPConfig's progress in its status and in Events on it; a plugin's admin looks at
//! the plugin's object (`kubectl describe egress web`), so each transition the front end sees in
//! the status of an object of its own becomes one Event on the plugin object that asked for it:
//! attached on a node, moved, detached, failed with the cloud's reason, capacity reached.
//!
//! Pure: [`Notices::observe`] compares what the cache shows with what it showed before. What the
//! first look after a start shows is recorded silently, so a restart or a leader change does not
//! announce every attachment again.

use std::collections::HashMap;

use cloudnet_shared::{AssignedReason, CloudPrivateIPConfig, decode_name, upstream_text};
use kube::ResourceExt;

use super::SOURCE_ANNOTATION;

/// The text every capacity refusal of the admission rules carries (`shared/src/rules/capacity.rs`:
/// `(capacity "ipv4" in annotation …)`), which tells a full node from other failures.
const CAPACITY_MARK: &str = "(capacity \"";

/// One Event to publish on a plugin object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Notice {
    /// The plugin object, as the owned object's source annotation names it (`Egress/web`).
    pub(crate) source: String,
    /// A warning rather than a normal Event.
    pub(crate) warning: bool,
    /// The Event's reason.
    pub(crate) reason: &'static str,
    /// The Event's note.
    pub(crate) note: String,
}

/// What the status of one object last showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Seen {
    /// `status.node` and the `Assigned` condition's status, reason and message.
    shown: Option<(String, String, String, String)>,
    /// The node the IP was last seen attached to.
    attached: Option<String>,
}

/// The status each object of a front end last showed.
#[derive(Debug, Default)]
pub(crate) struct Notices {
    seen: HashMap<String, Seen>,
    /// The first look has been recorded: later changes are told.
    looked: bool,
}

impl Notices {
    /// The Events that the change from the last look to `objects` (the front end's own) calls
    /// for; objects gone are forgotten.
    pub(crate) fn observe<'a>(
        &mut self,
        objects: impl IntoIterator<Item = &'a CloudPrivateIPConfig>,
    ) -> Vec<Notice> {
        let mut notices = Vec::new();
        let mut seen = HashMap::with_capacity(self.seen.len());
        for object in objects {
            let name = object.name_any();
            let mut now = self.seen.remove(&name).unwrap_or_default();
            let shown = object.status.as_ref().and_then(|status| {
                let condition = object.assigned_condition()?;
                Some((
                    status.node.clone(),
                    condition.status.clone(),
                    condition.reason.clone(),
                    condition.message.clone(),
                ))
            });
            if shown.is_some() && shown != now.shown {
                now.shown = shown;
                let told = tell(&name, &mut now);
                if self.looked
                    && let (Some((warning, reason, note)), Some(source)) =
                        (told, object.annotations().get(SOURCE_ANNOTATION))
                {
                    notices.push(Notice {
                        source: source.clone(),
                        warning,
                        reason,
                        note,
                    });
                }
            }
            seen.insert(name, now);
        }
        self.seen = seen;
        self.looked = true;
        notices
    }
}

/// The Event (warning, reason, note) the status `seen` now shows calls for, if any, keeping its
/// attached node up to date.
fn tell(name: &str, seen: &mut Seen) -> Option<(bool, &'static str, String)> {
    let (node, _, reason, message) = seen.shown.clone()?;
    let ip = ip_of(name);
    if reason == AssignedReason::CloudResponseSuccess.as_str() {
        // Off the old node and on the way to the new one: the move is told when it ends.
        if node.is_empty() && message.starts_with(upstream_text::MOVING) {
            return None;
        }
        let before =
            std::mem::replace(&mut seen.attached, (!node.is_empty()).then(|| node.clone()));
        return match (before, node.as_str()) {
            (None, "") => None,
            (Some(old), "") => Some((
                false,
                "Detached",
                format!("egress IP {ip} detached from node {old} in the cloud: no node holds it"),
            )),
            (Some(old), new) if old == new => None,
            (Some(old), new) => Some((
                false,
                "Moved",
                format!("egress IP {ip} moved from node {old} to node {new} in the cloud"),
            )),
            (None, new) => Some((
                false,
                "Attached",
                format!("egress IP {ip} attached to node {new}'s interface in the cloud"),
            )),
        };
    }
    if reason == AssignedReason::CloudResponseError.as_str() {
        let (reason, note) = failure(&ip, &message, "AttachFailed");
        return Some((true, reason, note));
    }
    None
}

/// The IP object `name` stands for, as Events write it (IPv6 with colons); the name itself if it
/// is none.
pub(crate) fn ip_of(name: &str) -> String {
    decode_name(name).map_or_else(|_| name.to_owned(), |ip| ip.to_string())
}

/// The reason and note of a warning that `ip` could not be attached for `message`:
/// `CapacityReached` when the node has no room, else `otherwise`.
fn failure(ip: &str, message: &str, otherwise: &'static str) -> (&'static str, String) {
    let reason = if message.contains(CAPACITY_MARK) {
        "CapacityReached"
    } else {
        otherwise
    };
    (reason, format!("egress IP {ip}: {message}"))
}

/// The warning for `source` when kube-apiserver refused a write of the object of `ip` (the
/// webhook's rules: a full node, an address outside the node's subnet), with its reason.
pub(crate) fn refused(source: String, ip: &str, message: &str) -> Notice {
    let (reason, note) = failure(ip, message, "AttachRefused");
    Notice {
        source,
        warning: true,
        reason,
        note,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::net::IpAddr;

    use cloudnet_shared::platform::Bucket;
    use cloudnet_shared::rules::check_capacity_count;

    use super::*;

    fn object(node: &str, reason: &str, message: &str) -> CloudPrivateIPConfig {
        let status = match reason {
            "CloudResponseSuccess" => "True",
            "CloudResponseError" => "False",
            _ => "Unknown",
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cloud.network.openshift.io/v1", "kind": "CloudPrivateIPConfig",
            "metadata": {"name": "10.0.0.5", "annotations": {SOURCE_ANNOTATION: "Egress/web"}},
            "spec": {"node": node},
            "status": {"node": node, "conditions": [{
                "type": "Assigned", "status": status, "reason": reason, "message": message,
                "lastTransitionTime": "2026-11-29T00:00:00Z"
            }]}
        }))
        .unwrap()
    }

    fn reasons(notices: &[Notice]) -> Vec<(&'static str, &str)> {
        notices
            .iter()
            .map(|n| (n.reason, n.source.as_str()))
            .collect()
    }

    #[test]
    fn attach_move_and_detach_are_told_once_each_and_pending_steps_and_halfway_not_at_all() {
        let mut notices = Notices::default();
        assert!(notices.observe([]).is_empty());
        let pending = object("node-a", "CloudResponsePending", "attaching");
        assert!(notices.observe([&pending]).is_empty());
        let attached = object("node-a", "CloudResponseSuccess", "added");
        let told = notices.observe([&attached]);
        assert_eq!(reasons(&told), [("Attached", "Egress/web")]);
        assert_eq!(
            told[0].note,
            "egress IP 10.0.0.5 attached to node node-a's interface in the cloud"
        );
        assert!(notices.observe([&attached]).is_empty(), "nothing changed");
        let moving = object("node-b", "CloudResponsePending", "moving");
        assert!(notices.observe([&moving]).is_empty());
        let halfway = object(
            "",
            "CloudResponseSuccess",
            "Moving IP address: 10.0.0.5 detached from node node-a",
        );
        assert!(
            notices.observe([&halfway]).is_empty(),
            "a move's detach half is no detach"
        );
        let moved = object("node-b", "CloudResponseSuccess", "moved");
        let told = notices.observe([&moved]);
        assert_eq!(reasons(&told), [("Moved", "Egress/web")]);
        assert_eq!(
            told[0].note,
            "egress IP 10.0.0.5 moved from node node-a to node node-b in the cloud"
        );
        let parked = object("", "CloudResponseSuccess", "deleted");
        assert_eq!(
            reasons(&notices.observe([&parked])),
            [("Detached", "Egress/web")]
        );
        let again = object("node-c", "CloudResponseSuccess", "added");
        assert_eq!(
            reasons(&notices.observe([&again])),
            [("Attached", "Egress/web")]
        );
    }

    #[test]
    fn a_failure_carries_the_clouds_reason_and_a_full_node_is_told_apart() {
        let mut notices = Notices::default();
        notices.observe([]);
        let failed = object(
            "node-a",
            "CloudResponseError",
            "attaching failed: UnauthorizedOperation",
        );
        let told = notices.observe([&failed]);
        assert_eq!(reasons(&told), [("AttachFailed", "Egress/web")]);
        assert!(told[0].warning);
        assert!(
            told[0].note.ends_with("UnauthorizedOperation"),
            "{}",
            told[0].note
        );

        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let capacity = serde_json::from_value(serde_json::json!({"ipv4": 1})).unwrap();
        let full = check_capacity_count(ip, "node-a", &capacity, Bucket::Ipv4, 1)
            .unwrap_err()
            .message;
        let blocked = object("node-a", "CloudResponseError", &full);
        let told = notices.observe([&blocked]);
        assert_eq!(
            reasons(&told),
            [("CapacityReached", "Egress/web")],
            "{full}"
        );
    }

    #[test]
    fn the_first_look_is_recorded_silently_and_a_forgotten_object_is_new_again() {
        let attached = object("node-a", "CloudResponseSuccess", "added");
        let mut notices = Notices::default();
        assert!(
            notices.observe([&attached]).is_empty(),
            "a restart announces nothing"
        );
        let moved = object("node-b", "CloudResponseSuccess", "moved");
        assert_eq!(
            reasons(&notices.observe([&moved])),
            [("Moved", "Egress/web")]
        );
        notices.observe([]);
        assert_eq!(
            reasons(&notices.observe([&moved])),
            [("Attached", "Egress/web")]
        );
    }
}
