//! The front-end layer's writes: each step of a plan as one API call that cannot touch another's
//! object. A create carries the owner label and the source; one that meets an existing object of
//! the name is a clash unless that object is ours (our cache had not shown it yet). A retarget is
//! a JSON patch whose first operation tests the owner label, so kube-apiserver refuses it (422)
//! if the object changed hands. A delete is preconditioned on the uid the plan saw.

use std::collections::BTreeMap;

use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use futures::StreamExt;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::notice::{self, Notice};
use super::plan::{Existing, Step};
use super::unseen::After;
use super::{OWNER_LABEL, SOURCE_ANNOTATION, existing_of};
use crate::metrics::Metrics;

/// Most writes of one plan in flight at once: a failover of many Egresses moves many objects.
const IN_FLIGHT: usize = 16;

/// What writing one plan came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Written {
    /// Writes that failed (each is logged; the caller plans again after a backoff).
    pub(crate) failed: usize,
    /// Wanted IPs whose object another owner holds (each is logged, and left alone).
    pub(crate) clashes: usize,
    /// The warnings for the plugin objects whose IP met another owner's object or whose write
    /// kube-apiserver refused.
    pub(crate) notices: Vec<Notice>,
    /// What each write that was answered left its object as, by name.
    pub(crate) done: Vec<(String, After)>,
}

/// Writes `steps` for front end `owner`, counting each in `metrics`.
pub(crate) async fn apply(
    api: &Api<CloudPrivateIPConfig>,
    owner: &'static str,
    metrics: &Metrics,
    steps: Vec<Step>,
) -> Written {
    futures::stream::iter(steps)
        .map(|step| async move {
            let what = describe(&step);
            let kind = kind(&step);
            let asking = asking(&step);
            let result = write(api, owner, step).await;
            // A create that met another owner's object wrote nothing: a clash, not a write.
            if let (Some(kind), false) = (kind, matches!(result, Ok(Wrote::Clash(_)))) {
                metrics.front_end.wrote(owner, kind, result.is_ok());
            }
            match result {
                Ok(Wrote::Done(done)) => Written {
                    done: done.into_iter().collect(),
                    ..Written::default()
                },
                Ok(Wrote::Clash(notice)) => Written {
                    clashes: 1,
                    notices: vec![notice],
                    ..Written::default()
                },
                Err(e) => {
                    tracing::warn!(front_end = owner, step = %what, error = %e, "front-end write failed");
                    let notices = match (&e, asking) {
                        (kube::Error::Api(status), Some((source, ip))) if refusal(status) => {
                            vec![notice::refused(source, &ip, &status.message)]
                        }
                        _ => Vec::new(),
                    };
                    Written {
                        failed: 1,
                        notices,
                        ..Written::default()
                    }
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .fold(Written::default(), |mut sum, one| async move {
            sum.failed += one.failed;
            sum.clashes += one.clashes;
            sum.notices.extend(one.notices);
            sum.done.extend(one.done);
            sum
        })
        .await
}

/// What a step that did not fail came to.
enum Wrote {
    /// Written (what it left the object as), or nothing left to write.
    Done(Option<(String, After)>),
    /// Another owner's object holds the IP.
    Clash(Notice),
}

/// The metric's name of a step that writes.
fn kind(step: &Step) -> Option<&'static str> {
    match step {
        Step::Create { .. } => Some("create"),
        Step::Retarget { .. } => Some("retarget"),
        Step::Delete { .. } => Some("delete"),
        Step::Clash { .. } => None,
    }
}

/// The plugin object asking for a create or a retarget, and the IP, for a refusal's warning.
fn asking(step: &Step) -> Option<(String, String)> {
    match step {
        Step::Create { ip, source, .. } => Some((source.clone(), ip.to_string())),
        Step::Retarget { name, source, .. } => Some((source.clone(), notice::ip_of(name))),
        Step::Delete { .. } | Step::Clash { .. } => None,
    }
}

/// Whether kube-apiserver refused the write for what it asked (admission, validation), rather
/// than failing for a moment or losing a race.
fn refusal(status: &kube::core::Status) -> bool {
    (400..500).contains(&status.code) && !matches!(status.code, 404 | 409 | 429)
}

/// The step in a few words, for logs.
fn describe(step: &Step) -> String {
    match step {
        Step::Create { name, node, .. } => format!("create {name} on {node}"),
        Step::Retarget { name, node, .. } if node.is_empty() => format!("park {name}"),
        Step::Retarget { name, node, .. } => format!("move {name} to {node}"),
        Step::Delete { name, .. } => format!("delete {name}"),
        Step::Clash { name, .. } => format!("clash on {name}"),
    }
}

/// The object a create makes.
fn owned(owner: &str, name: &str, node: &str, source: &str) -> CloudPrivateIPConfig {
    CloudPrivateIPConfig {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(OWNER_LABEL.to_owned(), owner.to_owned())])),
            annotations: Some(BTreeMap::from([(
                SOURCE_ANNOTATION.to_owned(),
                source.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: CloudPrivateIPConfigSpec {
            node: node.to_owned(),
        },
        status: None,
    }
}

/// JSON Pointer escaping of one path segment (RFC 6901).
fn pointer_segment(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

async fn write(
    api: &Api<CloudPrivateIPConfig>,
    owner: &str,
    step: Step,
) -> Result<Wrote, kube::Error> {
    match step {
        Step::Create {
            name, node, source, ..
        } => {
            let object = owned(owner, &name, &node, &source);
            match api.create(&PostParams::default(), &object).await {
                Ok(created) => {
                    tracing::info!(front_end = owner, object = %name, node = %node, source = %source, "created");
                    Ok(Wrote::Done(Some((
                        name,
                        After::Created(existing_of(&created)),
                    ))))
                }
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    let theirs = api.get_opt(&name).await?;
                    let holder = theirs
                        .as_ref()
                        .and_then(|o| o.labels().get(OWNER_LABEL).cloned());
                    if let Some(ours) = theirs.as_ref().filter(|_| holder.as_deref() == Some(owner))
                    {
                        return Ok(Wrote::Done(Some((name, After::Changed(existing_of(ours))))));
                    }
                    Ok(Wrote::Clash(clash(owner, &name, source, holder.as_deref())))
                }
                Err(e) => Err(e),
            }
        }
        Step::Retarget { name, node, source } => {
            let label = format!("/metadata/labels/{}", pointer_segment(OWNER_LABEL));
            let patch: json_patch::Patch = serde_json::from_value(json!([
                { "op": "test", "path": label, "value": owner },
                { "op": "replace", "path": "/spec/node", "value": node },
            ]))
            .map_err(kube::Error::SerdeError)?;
            let changed = api
                .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await?;
            tracing::info!(front_end = owner, object = %name, node = %node, source = %source, "retargeted");
            Ok(Wrote::Done(Some((
                name,
                After::Changed(existing_of(&changed)),
            ))))
        }
        Step::Delete { name, uid } => {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    tracing::info!(front_end = owner, object = %name, "deleted: no longer wanted");
                    let gone = Existing {
                        node: String::new(),
                        owner: Some(owner.to_owned()),
                        deleting: true,
                        uid: params.preconditions.and_then(|p| p.uid).unwrap_or_default(),
                    };
                    Ok(Wrote::Done(Some((name, After::Deleted(gone)))))
                }
                // Gone already, or someone else's now: nothing of ours to delete.
                Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {
                    Ok(Wrote::Done(None))
                }
                Err(e) => Err(e),
            }
        }
        Step::Clash {
            name,
            source,
            owner: holder,
        } => Ok(Wrote::Clash(clash(owner, &name, source, holder.as_deref()))),
    }
}

/// Reports that `source` wants the IP of `name`, which another owns: logged, and the warning
/// for `source`.
fn clash(owner: &str, name: &str, source: String, holder: Option<&str>) -> Notice {
    let holder = holder.map_or_else(
        || format!("a network plugin's or an admin's (no {OWNER_LABEL} label)"),
        |holder| format!("front end {holder}'s"),
    );
    tracing::warn!(
        front_end = owner,
        object = %name,
        source = %source,
        holder = %holder,
        "a CloudPrivateIPConfig of this IP exists and is not this front end's: left alone"
    );
    Notice {
        source,
        warning: true,
        reason: "IPHeldByAnother",
        note: format!(
            "CloudPrivateIPConfig {name} exists and is {holder}: cloudnet leaves it alone and does not attach this IP for {owner}; delete that object to hand the IP over"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_label_is_escaped_as_a_json_pointer_segment() {
        assert_eq!(pointer_segment(OWNER_LABEL), "cloudnet.io~1front-end");
        assert_eq!(pointer_segment("a~b"), "a~0b");
    }

    #[test]
    fn a_created_object_carries_its_owner_and_source() {
        let object = owned("antrea", "10.0.0.5", "node-a", "Egress/web");
        assert_eq!(
            object.labels().get(OWNER_LABEL).map(String::as_str),
            Some("antrea")
        );
        assert_eq!(
            object
                .annotations()
                .get(SOURCE_ANNOTATION)
                .map(String::as_str),
            Some("Egress/web")
        );
        assert_eq!(object.spec.node, "node-a");
    }
}
