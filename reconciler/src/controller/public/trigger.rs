//! What wakes a binding when its egress IP is attached: the CloudPrivateIPConfig watch, when an
//! object whose IP a binding names turns `Assigned=True` on a node (a first attach or a move's).
//! Not the attachment ledger's write: the ledger records an IP before the call that attaches it,
//! so the interface would not hold it yet.
//!
//! Nothing of the objects is kept but, for each bound IP, the node it was last seen attached to,
//! so that the object's later writes and the watch's re-lists wake nobody again.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use cloudnet_shared::public_ip::EgressPublicIP;
use cloudnet_shared::{CloudPrivateIPConfig, decode_name};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

/// The node each bound IP was last seen attached to.
#[derive(Debug, Default)]
pub(crate) struct Attached {
    seen: Mutex<HashMap<IpAddr, String>>,
}

impl Attached {
    /// The bindings to reconcile because of `object`'s new state: those naming its IP, when it
    /// has just turned attached to a node (other than the one it was last seen on).
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
        let attached = object.is_assigned() && object.metadata.deletion_timestamp.is_none();
        if bound.is_empty() || !attached {
            seen.remove(&ip);
            return Vec::new();
        }
        if seen.insert(ip, object.spec.node.clone()).as_deref() == Some(object.spec.node.as_str()) {
            return Vec::new();
        }
        bound
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
    fn a_binding_wakes_once_per_attach_of_its_ip_on_a_node() {
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
        assert_eq!(
            woken(&object("10.0.0.5", "a", false)),
            0,
            "not attached yet"
        );
        assert_eq!(woken(&object("10.0.0.5", "a", true)), 1, "attached on a");
        assert_eq!(woken(&object("10.0.0.5", "a", true)), 0, "a later write");
        assert_eq!(woken(&object("10.0.0.5", "b", false)), 0, "moving");
        assert_eq!(woken(&object("10.0.0.5", "b", true)), 1, "attached on b");
        assert_eq!(woken(&object("10.0.0.6", "b", true)), 0, "no binding");
    }
}
