//! What a front end's CloudPrivateIPConfigs must become, from what its plugin wants: pure, so
//! that every front end shares one set of ownership rules and their tests.
//!
//! A front end names each egress IP it wants and the node it should be on (empty: on none, the
//! plugin's node lost). The plan compares that with the CloudPrivateIPConfigs that carry the
//! front end's owner label and with every other object of the same name:
//! - a wanted IP with no object and a node: create it there, marked as the front end's;
//! - ours on another node: retarget `spec.node` (a move, as OVN-Kubernetes moves an IP); ours
//!   while the plugin has no node for it: park it (`spec.node: ""`, detached in the cloud, kept
//!   for the plugin's next node);
//! - ours no longer wanted: delete it;
//! - an object of that name not ours (OVN-Kubernetes', an admin's, another front end's): a
//!   clash, reported and never changed;
//! - ours being deleted: nothing until it is gone (then it is created anew if still wanted).
//!
//! Nothing here reads a clock or the API: restarts rebuild both sides from the API alone, so
//! the plan after a crash between the plugin's write and ours is the plan the crash interrupted.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cloudnet_shared::encode_name;

/// One egress IP a front end wants attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Want {
    /// The node it should be on; empty while the plugin has no node for it.
    pub(crate) node: String,
    /// The plugin object that asks for it, as Events and clashes name it (`Egress/web`).
    pub(crate) source: String,
}

/// A CloudPrivateIPConfig as the plan reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Existing {
    /// `spec.node`.
    pub(crate) node: String,
    /// The front end its owner label names, if any.
    pub(crate) owner: Option<String>,
    /// Whether it is being deleted.
    pub(crate) deleting: bool,
    /// Its uid: a delete names it, so an object someone made anew under the name is not deleted.
    pub(crate) uid: String,
}

/// One write the plan asks for, or a clash to report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Create object `name` (the IP `ip`) on `node`, owned by the front end, for `source`.
    Create {
        /// The object's name.
        name: String,
        /// Its IP.
        ip: IpAddr,
        /// `spec.node`.
        node: String,
        /// The plugin object asking.
        source: String,
    },
    /// Set `spec.node` of our object `name` to `node` (empty: park it).
    Retarget {
        /// The object's name.
        name: String,
        /// The new `spec.node`.
        node: String,
        /// The plugin object asking.
        source: String,
    },
    /// Delete our object `name`: no plugin object wants its IP any more.
    Delete {
        /// The object's name.
        name: String,
        /// The uid of the object the plan saw.
        uid: String,
    },
    /// `source` wants the IP of object `name`, which is not ours: left alone, reported.
    Clash {
        /// The object's name.
        name: String,
        /// The plugin object asking.
        source: String,
        /// The owner label of the object in the way (`None`: unlabelled, e.g. OVN-Kubernetes').
        owner: Option<String>,
    },
}

/// The steps that make `existing` (every CloudPrivateIPConfig the front end can see, by name)
/// what front end `owner` wants (`wants`, by IP). In name order, so a run is reproducible.
pub(crate) fn plan(
    owner: &str,
    wants: &BTreeMap<IpAddr, Want>,
    existing: &BTreeMap<String, Existing>,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut wanted = std::collections::BTreeSet::new();
    for (ip, want) in wants {
        // Every IP has a canonical name; one that does not is no usable unicast IP.
        let Ok(name) = encode_name(*ip) else {
            continue;
        };
        wanted.insert(name.clone());
        match existing.get(&name) {
            None if want.node.is_empty() => {}
            None => steps.push(Step::Create {
                name,
                ip: *ip,
                node: want.node.clone(),
                source: want.source.clone(),
            }),
            Some(object) if object.owner.as_deref() != Some(owner) => steps.push(Step::Clash {
                name,
                source: want.source.clone(),
                owner: object.owner.clone(),
            }),
            Some(object) if object.deleting || object.node == want.node => {}
            Some(_) => steps.push(Step::Retarget {
                name,
                node: want.node.clone(),
                source: want.source.clone(),
            }),
        }
    }
    for (name, object) in existing {
        if object.owner.as_deref() == Some(owner) && !object.deleting && !wanted.contains(name) {
            steps.push(Step::Delete {
                name: name.clone(),
                uid: object.uid.clone(),
            });
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const OWNER: &str = "antrea";

    fn want(node: &str) -> Want {
        Want {
            node: node.into(),
            source: "Egress/web".into(),
        }
    }

    fn ours(node: &str) -> Existing {
        Existing {
            node: node.into(),
            owner: Some(OWNER.into()),
            deleting: false,
            uid: format!("uid-{node}"),
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn wanted_ips_are_created_moved_parked_and_deleted_and_others_objects_never_touched() {
        let wants = BTreeMap::from([
            (ip("10.0.0.1"), want("a")),
            (ip("10.0.0.2"), want("b")),
            (ip("10.0.0.3"), want("")),
            (ip("10.0.0.4"), want("a")),
            (ip("10.0.0.5"), want("a")),
            (ip("10.0.0.6"), want("")),
            (ip("10.0.0.7"), want("a")),
        ]);
        let existing = BTreeMap::from([
            ("10.0.0.2".to_owned(), ours("a")),
            ("10.0.0.3".to_owned(), ours("a")),
            (
                "10.0.0.4".to_owned(),
                Existing {
                    owner: None,
                    ..ours("a")
                },
            ),
            (
                "10.0.0.5".to_owned(),
                Existing {
                    deleting: true,
                    ..ours("b")
                },
            ),
            ("10.0.0.7".to_owned(), ours("a")),
            ("10.0.0.8".to_owned(), ours("a")),
            (
                "10.0.0.9".to_owned(),
                Existing {
                    owner: Some("gateway".into()),
                    ..ours("a")
                },
            ),
        ]);
        let steps = plan(OWNER, &wants, &existing);
        assert_eq!(
            steps,
            [
                Step::Create {
                    name: "10.0.0.1".into(),
                    ip: ip("10.0.0.1"),
                    node: "a".into(),
                    source: "Egress/web".into()
                },
                Step::Retarget {
                    name: "10.0.0.2".into(),
                    node: "b".into(),
                    source: "Egress/web".into()
                },
                Step::Retarget {
                    name: "10.0.0.3".into(),
                    node: "".into(),
                    source: "Egress/web".into()
                },
                Step::Clash {
                    name: "10.0.0.4".into(),
                    source: "Egress/web".into(),
                    owner: None
                },
                Step::Delete {
                    name: "10.0.0.8".into(),
                    uid: "uid-a".into()
                },
            ],
            "10.0.0.5 waits for its delete, 10.0.0.6 has no node and no object, 10.0.0.7 is \
             where it should be, 10.0.0.9 is another front end's"
        );
    }

    #[test]
    fn ipv6_objects_are_named_as_the_resource_names_them() {
        let wants = BTreeMap::from([(ip("fd00::6"), want("a"))]);
        let steps = plan(OWNER, &wants, &BTreeMap::new());
        assert!(matches!(
            &steps[..],
            [Step::Create { name, .. }] if name == "fd00.0000.0000.0000.0000.0000.0000.0006"
        ));
    }
}
