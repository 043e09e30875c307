//! One binding's reconcile: find where its egress IP is attached (the node of its
//! CloudPrivateIPConfig, the VM the attachment ledger holds the IP on there, and that VM's primary
//! interface as the engine last saw it: never anything the binding or the Node says), read the
//! public address, and associate it there unless it already serves the IP. The status records the
//! association the cloud shows, read back when none had to be made, so that an id lost with a
//! failed status write (or a leader change between the call and the write) is found again. On
//! delete, undo the recorded association, and no other; and none at all while another binding of
//! the same public address lives, whose association it then is.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cloudnet_shared::public_ip::{AssociatedReason, EgressPublicIP};
use cloudnet_shared::{CloudPrivateIPConfig, encode_name};
use futures::channel::mpsc;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event as Finalized, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use thiserror::Error;

use super::claim;
use super::status::{self, Found};
use crate::cloud::NodeTarget;
use crate::cloud::public_ip::{Association, PublicAddress, PublicIpError, PublicIps, same_id};
use crate::controller::retries::Retries;
use crate::engine::interfaces::Interfaces;
use crate::engine::ledger::Ledger;
use crate::events::Events;
use crate::metrics::Metrics;

/// The finalizer that keeps a binding until its association is undone.
pub(crate) const FINALIZER: &str = "cloudnet.io/egress-public-ip";

/// How long a binding waits that only the admin can mend (marker, permission, id, conflict).
const SLOW_RETRY: Duration = Duration::from_secs(60);

/// A failed reconcile: the API, or the cloud while undoing an association (the finalizer stays).
#[derive(Debug, Error)]
pub(crate) enum Error {
    /// kube-apiserver failed a read or a write.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// The cloud failed the call that undoes the association.
    #[error(transparent)]
    Cloud(#[from] PublicIpError),
}

/// What every reconcile shares.
pub(crate) struct Context {
    /// Bindings.
    pub(crate) api: Api<EgressPublicIP>,
    /// CloudPrivateIPConfigs, read one at a time (no cache of them is kept here).
    pub(crate) objects: Api<CloudPrivateIPConfig>,
    /// Every binding, for the conflicts.
    pub(crate) bindings: Store<EgressPublicIP>,
    /// The cloud's public addresses.
    pub(crate) public: Arc<dyn PublicIps>,
    /// Where each egress IP is attached.
    pub(crate) ledger: Arc<Ledger>,
    /// The engine's view of each VM's primary interface.
    pub(crate) interfaces: Arc<Interfaces>,
    /// Events about bindings.
    pub(crate) events: Events,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// How often an associated binding is read again (drift); zero: never.
    pub(crate) drift: Duration,
    /// How soon a binding is tried again after a failure that may pass by itself (throttling, a
    /// 412 from a concurrent NIC update, an egress IP not on its interface yet): per binding,
    /// doubling from the engine's backoff base to its cap.
    pub(crate) retries: Retries,
    /// The bindings not associated now, for the gauge.
    pub(crate) unassociated: Mutex<HashSet<String>>,
    /// Bindings to reconcile now: the rivals of one that went or gave way.
    pub(crate) wake: mpsc::UnboundedSender<ObjectRef<EgressPublicIP>>,
}

/// Where the egress IP is attached, or why it is not (and whether a watch event will say when).
enum Place {
    /// On `node`'s VM, whose primary interface is `interface`.
    On { node: String, interface: String },
    /// Not attached: why, and whether to look again soon rather than wait for the watch.
    Not { why: String, soon: bool },
}

/// Reconciles one binding under the finalizer.
pub(crate) async fn reconcile(
    binding: Arc<EgressPublicIP>,
    ctx: Arc<Context>,
) -> Result<Action, finalizer::Error<Error>> {
    let api = ctx.api.clone();
    finalizer(&api, FINALIZER, binding, |event| async move {
        match event {
            Finalized::Apply(binding) => ctx.apply(&binding).await,
            Finalized::Cleanup(binding) => ctx.cleanup(&binding).await,
        }
    })
    .await
}

/// A failed reconcile is tried again: soon when the failure may pass by itself.
pub(crate) fn error_policy(
    binding: Arc<EgressPublicIP>,
    error: &finalizer::Error<Error>,
    ctx: Arc<Context>,
) -> Action {
    tracing::warn!(binding = %binding.name_any(), error = %error, "EgressPublicIP reconcile failed");
    match error {
        finalizer::Error::CleanupFailed(Error::Cloud(e)) if !e.is_transient() => {
            Action::requeue(SLOW_RETRY)
        }
        _ => ctx.soon(&binding),
    }
}

/// Whether associating `address` as `made` changed where it sits: a cloud whose association
/// needed no call (OpenStack's reservation port already held it) answers the association it
/// found, which is neither counted nor announced.
fn changed(address: &PublicAddress, made: &Association) -> bool {
    !address.association.as_ref().is_some_and(|a| a.is(made))
}

impl Context {
    async fn apply(&self, binding: &EgressPublicIP) -> Result<Action, Error> {
        let Ok(ip) = binding.spec.private_ip.parse::<IpAddr>() else {
            let why = format!(
                "spec.privateIP {:?} is not an IP address",
                binding.spec.private_ip
            );
            let found = Found::away(binding, AssociatedReason::EgressIPNotAttached, why);
            self.write(binding, &found).await?;
            return Ok(Action::await_change());
        };
        let bindings = self.bindings.state();
        let all = || bindings.iter().map(|b| &**b);
        if let Some(rival) = claim::rival(binding, all()) {
            let kept = claim::keeper(binding, all()).is_some();
            return self.yielded(binding, rival, kept).await;
        }
        let (node, interface) = match self.place(ip).await? {
            Place::On { node, interface } => (node, interface),
            Place::Not { why, soon } => {
                let found = Found::away(binding, AssociatedReason::EgressIPNotAttached, why);
                self.write(binding, &found).await?;
                return Ok(if soon {
                    self.soon(binding)
                } else {
                    self.retries.reset(&binding.name_any());
                    self.later()
                });
            }
        };
        let address = match self.public.public_address(&binding.spec.public_ip).await {
            Ok(address) => address,
            Err(e) => return self.failed(binding, &node, &interface, &e).await,
        };
        let serving = address
            .association
            .as_ref()
            .filter(|_| self.public.serves(&address, &interface, ip));
        let association_id = match serving {
            // The association the cloud shows, not the one recorded: after a status write that
            // failed, or a leader change between the call and the write, the record is older.
            Some(live) => live.id.clone(),
            None => match self.public.associate(&address, &interface, ip).await {
                Ok(made) => {
                    if changed(&address, &made) {
                        self.metrics.public.associated();
                        let note = format!(
                            "public address {} associated with {ip} on node {node} ({interface})",
                            binding.spec.public_ip
                        );
                        self.publish(binding, false, "PublicIPAssociated", note)
                            .await;
                    }
                    made.id
                }
                Err(e) => return self.failed(binding, &node, &interface, &e).await,
            },
        };
        let found = Found {
            reason: AssociatedReason::Associated,
            message: format!("associated with {ip} on node {node}"),
            node,
            interface,
            association_id,
        };
        self.write(binding, &found).await?;
        self.retries.reset(&binding.name_any());
        Ok(self.later())
    }

    /// Where `ip` is attached: its object's node when the object says it is attached there, the
    /// VM the ledger holds it on as that node, and that VM's interface when it holds the IP.
    async fn place(&self, ip: IpAddr) -> Result<Place, Error> {
        let not = |why: String, soon: bool| Ok(Place::Not { why, soon });
        let Ok(name) = encode_name(ip) else {
            return not(format!("{ip} names no CloudPrivateIPConfig"), false);
        };
        let Some(object) = self.objects.get_opt(&name).await? else {
            return not(
                format!("no CloudPrivateIPConfig {name}: {ip} is not an egress IP"),
                false,
            );
        };
        if object.metadata.deletion_timestamp.is_some() {
            return not(
                format!("CloudPrivateIPConfig {name} is being deleted: {ip} leaves its node"),
                false,
            );
        }
        if !object.is_assigned() {
            return not(format!("{ip} is not attached to a node now"), false);
        }
        let node = object.spec.node.clone();
        let Some(instance) = self.ledger.instance(ip, &node) else {
            return not(
                format!("the attachment ledger records {ip} on no VM of node {node}"),
                true,
            );
        };
        let view = match self.interfaces.get(&instance) {
            Some(view) => view,
            None => {
                let target = NodeTarget {
                    node_name: node.clone(),
                    provider_id: String::new(),
                    instance,
                    internal_ips: Default::default(),
                };
                match self.interfaces.get_or_read(&target).await {
                    Ok(view) => view,
                    Err(e) => return not(format!("reading node {node}'s interface: {e}"), true),
                }
            }
        };
        if !view.holds(ip) {
            return not(
                format!("node {node}'s interface does not hold {ip} yet"),
                true,
            );
        }
        Ok(Place::On {
            node,
            interface: view.interface,
        })
    }

    /// A cloud call of `binding` failed: the condition says why (a missing permission by name).
    async fn failed(
        &self,
        binding: &EgressPublicIP,
        node: &str,
        interface: &str,
        error: &PublicIpError,
    ) -> Result<Action, Error> {
        self.metrics.public.failed();
        let mut found = Found::kept(binding, error.reason(), error.to_string());
        node.clone_into(&mut found.node);
        interface.clone_into(&mut found.interface);
        let changed = self.write(binding, &found).await?;
        if changed {
            self.publish(
                binding,
                true,
                "PublicIPAssociationFailed",
                error.to_string(),
            )
            .await;
        }
        Ok(if error.is_transient() {
            self.soon(binding)
        } else {
            Action::requeue(SLOW_RETRY)
        })
    }

    /// `binding` claims what an older binding (`rival`) claims: it undoes any association of its
    /// own (unless another live binding of its public address, `kept`, relies on it) and stays
    /// `Conflict` until the older one is gone. If it undid one, the rival looks again now, since
    /// its address may have been displaced from the private IP meanwhile.
    async fn yielded(
        &self,
        binding: &EgressPublicIP,
        rival: &EgressPublicIP,
        kept: bool,
    ) -> Result<Action, Error> {
        let undone = !kept && self.undo(binding).await?;
        let why = format!(
            "the older EgressPublicIP {} claims the same private IP or public address; this one waits until it is deleted",
            rival.name_any()
        );
        let mut found = Found::away(binding, AssociatedReason::Conflict, why);
        found.association_id.clear();
        self.write(binding, &found).await?;
        self.retries.reset(&binding.name_any());
        if undone {
            self.wake_up(rival);
        }
        Ok(Action::requeue(SLOW_RETRY))
    }

    /// Undoes the association `binding`'s status records, if it still stands; any other is
    /// left alone. Says whether it undid one.
    async fn undo(&self, binding: &EgressPublicIP) -> Result<bool, Error> {
        let recorded = binding
            .status
            .as_ref()
            .map(|s| s.association_id.as_str())
            .unwrap_or_default();
        if recorded.is_empty() {
            return Ok(false);
        }
        let address = match self.public.public_address(&binding.spec.public_ip).await {
            Ok(address) => address,
            // Released by the admin: nothing of ours is left.
            Err(PublicIpError::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let Some(ours) = address.association.filter(|a| same_id(&a.id, recorded)) else {
            return Ok(false);
        };
        self.public.disassociate(&address.id, &ours).await?;
        self.metrics.public.disassociated();
        let note = format!(
            "public address {} disassociated from {} ({})",
            binding.spec.public_ip, binding.spec.private_ip, ours.interface
        );
        self.publish(binding, false, "PublicIPDisassociated", note)
            .await;
        Ok(true)
    }

    async fn cleanup(&self, binding: &EgressPublicIP) -> Result<Action, Error> {
        let bindings = self.bindings.state();
        // Another binding of the same public address (admitted in the same instant as this one)
        // relies on its association: deleting either must leave the address where it is.
        let kept = claim::keeper(binding, bindings.iter().map(|b| &**b)).is_some();
        if !kept && let Err(e) = self.undo(binding).await {
            if let Error::Cloud(cloud) = &e {
                let found = Found::kept(binding, cloud.reason(), cloud.to_string());
                // The condition says why the delete waits; the error keeps the finalizer.
                let _ = self.write(binding, &found).await;
            }
            return Err(e);
        }
        self.gone(binding);
        Ok(Action::await_change())
    }

    /// `binding` is deleted (with or without its finalizer's cleanup: an admin may remove it):
    /// it leaves the gauge and the retries, and the bindings it held back look again now.
    pub(crate) fn gone(&self, binding: &EgressPublicIP) {
        let name = binding.name_any();
        self.count_unassociated(&name, false);
        self.retries.reset(&name);
        let bindings = self.bindings.state();
        for other in claim::overlapping(binding, bindings.iter().map(|b| &**b)) {
            self.wake_up(other);
        }
    }

    /// Reconciles `binding` soon, not at its next timer.
    fn wake_up(&self, binding: &EgressPublicIP) {
        // The controller ends only with this context; a closed channel is moot.
        let _ = self.wake.unbounded_send(ObjectRef::from_obj(binding));
    }

    /// When to look again at `binding` after a failure that may pass by itself: per binding,
    /// doubling from the backoff base to its cap.
    fn soon(&self, binding: &EgressPublicIP) -> Action {
        Action::requeue(
            self.retries
                .next_delay_from(&binding.name_any(), Duration::ZERO),
        )
    }

    /// When to look at an associated (or waiting) binding again: the drift period.
    fn later(&self) -> Action {
        if self.drift.is_zero() {
            Action::await_change()
        } else {
            Action::requeue(self.drift)
        }
    }

    /// Counts binding `name` as unassociated or not, and sets the gauge.
    fn count_unassociated(&self, name: &str, unassociated: bool) {
        let mut set = self
            .unassociated
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if unassociated {
            set.insert(name.to_owned());
        } else {
            set.remove(name);
        }
        self.metrics.public.set_unassociated(set.len());
    }

    /// Writes `found` as `binding`'s status when it changes anything; says whether it did.
    async fn write(&self, binding: &EgressPublicIP, found: &Found) -> Result<bool, Error> {
        self.count_unassociated(
            &binding.name_any(),
            found.reason != AssociatedReason::Associated,
        );
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let next = status::status(binding, found, now);
        if !status::changes(binding, &next) {
            return Ok(false);
        }
        self.api
            .patch_status(
                &binding.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status::patch(&next)),
            )
            .await?;
        Ok(true)
    }

    async fn publish(&self, binding: &EgressPublicIP, warning: bool, reason: &str, note: String) {
        self.events
            .publish(&binding.object_ref(&()), warning, reason, note)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn association(id: &str, interface: &str) -> Association {
        Association {
            id: id.into(),
            interface: interface.into(),
            private_ip: "10.0.0.40".parse().ok(),
        }
    }

    fn address(on: Option<Association>) -> PublicAddress {
        PublicAddress {
            id: "public".into(),
            address: None,
            marked: true,
            association: on,
        }
    }

    #[test]
    fn an_association_found_in_place_is_no_change_and_a_new_one_is() {
        let port = association("port-1", "port-1");
        assert!(
            !changed(&address(Some(port.clone())), &port),
            "OpenStack: the reservation port already held it, no call was made"
        );
        let arm = "/subscriptions/s/resourceGroups/RG/providers/Microsoft.Network/networkInterfaces/n/ipConfigurations/c";
        assert!(
            !changed(
                &address(Some(association(&arm.to_lowercase(), "n"))),
                &association(arm, "N")
            ),
            "ARM ids in another case name the same association"
        );
        assert!(changed(&address(None), &port));
        assert!(changed(
            &address(Some(association("eipassoc-1", "eni-1"))),
            &association("eipassoc-2", "eni-1")
        ));
    }
}
