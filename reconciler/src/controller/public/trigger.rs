//! What wakes a binding when its egress IP comes or goes: the CloudPrivateIPConfig watch, when an
//! object whose IP a binding names turns `Assigned=True` on a node (a first attach or a move's),
//! and when it stops being attached there (a move or delete started, a failed attach, the object
//! gone), so that the binding's condition leaves `Associated` at once rather than at the next
//! drift check. Not the attachment ledger's write: the ledger records an IP before the call that
//! attaches it, so the interface would not hold it yet.
//!
//! Nothing of the objects is kept but, for each bound IP, the node it was last seen attached to
//! (or that it was seen attached nowhere), so that the object's later writes and the watch's
//! re-lists wake nobody again.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use cloudnet_shared::public_ip::EgressPublicIP;
use cloudnet_shared::{CloudPrivateIPConfig, decode_name};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

/// For each bound IP seen since it was bound: the node it is attached to, or `None`.
#[derive(Debug, Default)]
pub(crate) struct Attached {
    seen: Mutex<HashMap<IpAddr, Option<String>>>,
}

impl Attached {
    /// The bindings to reconcile because of `object`'s new state: those naming its IP, when the
    /// node it is attached to changed since it was last seen (attached, moved, or no longer
    /// attached anywhere).
    pub(crate) fn wake(
        &self,
        object: &CloudPrivateIPConfig,
        bindings: &Store<EgressPublicIP>,
    ) -> Vec<ObjectRef<EgressPublicIP>> {
        let Ok(ip) = decode_name(&object.name_any()) else {
            return Vec::new();
        };
        let bound: Vec<ObjectRef<EgressPublicIP>> = bindings
            .state()
            .iter()
            .filter(|b| b.spec.private_ip.parse::<IpAddr>() == Ok(ip))
            .map(|b| ObjectRef::from_obj(&**b))
            .collect();
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if bound.is_empty() {
            seen.remove(&ip);
            return Vec::new();
        }
        let attached = (object.is_assigned() && object.metadata.deletion_timestamp.is_none())
            .then(|| object.spec.node.clone());
        if seen.insert(ip, attached.clone()).as_ref() == Some(&attached) {
            return Vec::new();
        }
        bound
    }
}

/// The objects of a watch of CloudPrivateIPConfigs as [`Attached::wake`] reads them: a deleted
/// object comes as one attached nowhere (its last state may still say `Assigned=True`).
pub(crate) fn objects(
    event: Result<watcher::Event<CloudPrivateIPConfig>, watcher::Error>,
) -> Option<Result<CloudPrivateIPConfig, watcher::Error>> {
    match event {
        Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => Some(Ok(object)),
        Ok(watcher::Event::Delete(mut object)) => {
            object.status = None;
            Some(Ok(object))
        }
        // Errors are the watcher's to retry (with its backoff); they wake nobody.
        Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloudnet_shared::public_ip::EgressPublicIPSpec;
    use cloudnet_shared::{
        CONDITION_ASSIGNED, CloudPrivateIPConfigSpec, CloudPrivateIPConfigStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::runtime::{reflector, watcher};

    /// Object `ip` aimed at `node`, attached there when `assigned`.
    fn object(ip: &str, node: &str, assigned: bool) -> CloudPrivateIPConfig {
        let mut o = CloudPrivateIPConfig::new(ip, CloudPrivateIPConfigSpec { node: node.into() });
        o.status = Some(CloudPrivateIPConfigStatus {
            node: node.into(),
            conditions: vec![Condition {
                type_: CONDITION_ASSIGNED.into(),
                status: if assigned { "True" } else { "Unknown" }.into(),
                reason: String::new(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
        });
        o
    }

    #[test]
    fn a_binding_wakes_once_per_attach_of_its_ip_on_a_node_and_once_when_it_leaves() {
        let (bindings, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Apply(EgressPublicIP::new(
            "partner-a",
            EgressPublicIPSpec {
                private_ip: "10.0.0.5".into(),
                public_ip: "eipalloc-0123456789abcdef0".into(),
            },
        )));
        let attached = Attached::default();
        let woken = |o: &CloudPrivateIPConfig| attached.wake(o, &bindings).len();
        assert_eq!(woken(&object("10.0.0.5", "a", false)), 1, "first seen");
        assert_eq!(woken(&object("10.0.0.5", "a", false)), 0, "still pending");
        assert_eq!(woken(&object("10.0.0.5", "a", true)), 1, "attached on a");
        assert_eq!(woken(&object("10.0.0.5", "a", true)), 0, "a later write");
        assert_eq!(
            woken(&object("10.0.0.5", "b", false)),
            1,
            "moving away from a"
        );
        assert_eq!(woken(&object("10.0.0.5", "b", false)), 0, "still moving");
        assert_eq!(woken(&object("10.0.0.5", "b", true)), 1, "attached on b");
        let mut deleting = object("10.0.0.5", "b", true);
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(woken(&deleting), 1, "being deleted");
        assert_eq!(woken(&object("10.0.0.5", "b", true)), 1, "attached again");
        let gone = objects(Ok(watcher::Event::Delete(object("10.0.0.5", "b", true))))
            .and_then(Result::ok)
            .unwrap_or_else(|| object("", "", false));
        assert_eq!(woken(&gone), 1, "deleted while still reading attached");
        assert_eq!(woken(&object("10.0.0.6", "b", true)), 0, "no binding");
    }
}
