//! The add transition: an IP attached to its node's VM, after the admission rules that read the
//! node's annotation are checked again from the cache; and the detach of an IP whose object
//! vanished while it was being attached.

use std::net::IpAddr;
use std::sync::Arc;

use backon::{BackoffBuilder, ExponentialBuilder};
use cloudnet_shared::platform::{bucket_for, key_mismatch};
use cloudnet_shared::rules::{Claim, check_address_index, check_claim};
use cloudnet_shared::{
    AssignedReason, CloudPrivateIPConfig, EGRESS_IPCONFIG_ANNOTATION, EgressState, decode_name,
};
use kube::ResourceExt;

use super::parked::Call;
use super::{Context, Error, lock};
use crate::cloud::{Change, CloudError, ErrorKind, NodeEgress, NodeTarget, driver};
use crate::controller::cached_node::CachedNode;
use crate::controller::nodes;
use crate::controller::status::upstream::{ADD_FAILED, ADDED, ADDING, MOVE_FAILED, MOVED, MOVING};
use crate::controller::status::{FOREIGN, upstream_first};
use crate::engine::lanes::{Announced, Mutation};

/// Retries of the detach of an IP whose object vanished mid-attach (no later reconcile will).
const ORPHAN_DETACH_RETRIES: usize = 8;

impl Context {
    /// Re-checks the admission rules that read the node's annotation (SPEC §3 rules 4 and 5)
    /// from the node cache before any cloud call: admission can race, can be bypassed, or may
    /// have seen the node before it was annotated. Without a readable annotation there is
    /// nothing to check against and the cloud's own answer decides.
    ///
    /// Capacity blocks only the IPs over the limit: the occupants of the node's bucket are
    /// ranked by [`Claim`] (attached first, then oldest, then by name), so the same IPs win
    /// whichever object is reconciled first.
    pub(super) fn check_capacity(
        &self,
        name: &str,
        ip: IpAddr,
        node: &CachedNode,
    ) -> Result<(), String> {
        let info = node.info();
        let EgressState::Present(config) = &info.egress else {
            tracing::debug!(object = name, node = %info.name, "node not annotated; attaching without the subnet and capacity checks");
            return Ok(());
        };
        let platform = self.cloud.needs().platform;
        if let Some(platform) = platform {
            check_address_index(ip, &info.name, &config.ifaddr, platform).map_err(|d| d.message)?;
        }
        if let Some(mismatch) = key_mismatch(platform, &config.capacity) {
            tracing::warn!(
                object = name,
                node = %info.name,
                platform = mismatch.platform.as_str(),
                annotation_keys = mismatch.keys_label(),
                "node annotation {EGRESS_IPCONFIG_ANNOTATION}: {mismatch}"
            );
        }
        let bucket = bucket_for(platform, ip, &config.capacity);
        let objects = self.by_node.objects_on(&self.objects, &info.name);
        let mut me = Claim::newcomer(name);
        let mut others = Vec::new();
        for object in &objects {
            let claim = Claim::of(object, &info.name);
            if claim.name == name {
                me = claim;
            } else if decode_name(claim.name)
                .is_ok_and(|other| bucket_for(platform, other, &config.capacity) == bucket)
            {
                others.push(claim);
            }
        }
        check_claim(ip, &info.name, &config.capacity, bucket, &me, others).map_err(|d| d.message)
    }

    /// Attaches the IP to `node`; `None` when the object vanished meanwhile (its IP is then
    /// detached again, see [`Self::release_orphan`]).
    pub(super) async fn attach(
        &self,
        name: &str,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
        next_half: Option<Announced>,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        // The attach half of a move was announced when its detach began.
        let announced = match next_half {
            Some(a) if a.node() == node => a,
            _ => self.lanes.expect(node),
        };
        let target = match self.attach_target(name, ip, node).await {
            Ok(target) => target,
            Err(message) => {
                self.write_status(obj, node, AssignedReason::CloudResponseError, &message)
                    .await?;
                self.event(obj, true, "AttachBlocked", message.clone())
                    .await;
                return Err(Error::Blocked(message));
            }
        };
        // The second half of a move made as detach, then attach: the detach left upstream's
        // move text in the condition (or a failed attach retried), and the move's texts go on
        // to its end.
        let moving = obj
            .assigned_condition()
            .is_some_and(|c| c.message.starts_with(MOVING) || c.message.starts_with(MOVE_FAILED));
        let (pending, failed) = if moving {
            (MOVING, MOVE_FAILED)
        } else {
            (ADDING, ADD_FAILED)
        };
        if let Err(e) = self.foreign_on(&target, ip).await {
            drop(announced);
            return self.refuse_foreign(obj, ip, (node, node), failed, e).await;
        }
        let obj = self.ensure_finalizer(obj).await?;
        let message = upstream_first(pending, format_args!("attaching {ip} to node {node}"));
        self.write_status(&obj, node, AssignedReason::CloudResponsePending, &message)
            .await?;
        // The reconcile ends here; the lane's answer reconciles the object again
        // ([`Self::finish_attach`]).
        let answer = self.parked.park(
            name,
            Call::Attach {
                target: target.clone(),
                moving,
            },
        );
        self.lanes
            .submit_then(announced, &target, Mutation::Attach, ip, answer);
        Ok(None)
    }

    /// Writes what the attach of `ip` to `target`'s VM came to, once the lane answered:
    /// `moving` says whether it was the attach half of a move (upstream's move texts).
    pub(super) async fn finish_attach(
        &self,
        name: &str,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        (target, moving): (NodeTarget, bool),
        attached: Result<(), CloudError>,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let (done, failed) = if moving {
            (MOVED, MOVE_FAILED)
        } else {
            (ADDED, ADD_FAILED)
        };
        let node = target.node_name.as_str();
        if let Err(e) = attached {
            if e.kind == ErrorKind::Foreign {
                return self.refuse_foreign(obj, ip, (node, node), failed, e).await;
            }
            let message = upstream_first(
                failed,
                format_args!("attaching {ip} to node {node} failed: {e}"),
            );
            // A failed call may still have attached the IP (a timeout, say).
            let reason = AssignedReason::CloudResponseError;
            let Some(obj) = self
                .write_after_attach(obj, &target, ip, reason, &message)
                .await?
            else {
                return Ok(None);
            };
            self.event(&obj, true, "AttachFailed", message).await;
            return Err(e.into());
        }
        if lock(&self.drifted).remove(name) {
            self.metrics.drift_repaired.inc();
            self.event(
                obj,
                true,
                "DriftRepaired",
                format!("{ip} was missing from node {node} and was attached again"),
            )
            .await;
        }
        let message = upstream_first(done, format_args!("{ip} attached to node {node}"));
        let reason = AssignedReason::CloudResponseSuccess;
        let Some(obj) = self
            .write_after_attach(obj, &target, ip, reason, &message)
            .await?
        else {
            return Ok(None);
        };
        self.event(&obj, false, "Attached", message).await;
        Ok(Some(obj))
    }

    /// Refuses, before any write or call, an attach of `ip` that the view of the VM shows is
    /// not ours to take (see [`driver::foreign`]), believed only from a fresh read
    /// ([`Interfaces::confirmed`]: the cached view may predate the other tool's change, or its
    /// undoing). A failed read leaves it to the lane and the provider, which refuse it too.
    ///
    /// [`Interfaces::confirmed`]: crate::engine::interfaces::Interfaces::confirmed
    async fn foreign_on(&self, target: &NodeTarget, ip: IpAddr) -> Result<(), CloudError> {
        let ours = if self.ledger.records(ip, &target.instance) {
            vec![ip]
        } else {
            Vec::new()
        };
        let change = Change::new(vec![ip], Vec::new()).with_ours(ours);
        let taken = |view: &NodeEgress| driver::foreign(view, &change);
        match self
            .interfaces
            .confirmed(target, |view| taken(view).is_ok())
            .await
        {
            Ok(view) => taken(&view),
            Err(_) => Ok(()),
        }
    }

    /// Reports an attach refused because the address is not this controller's to take (see
    /// [`crate::cloud::ErrorKind::Foreign`]): `Assigned=False` with reason `CloudResponseError`
    /// and a message that says so ([`FOREIGN`]), a Warning Event `ForeignAddress`, and no cloud
    /// call. `status.node` becomes `status_node`: the target, as after any failed attach, or
    /// the source of a native move that did not start; the object is retried slowly and
    /// attached once the address is gone from the interface.
    pub(super) async fn refuse_foreign(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
        ip: IpAddr,
        (node, status_node): (&str, &str),
        failed: &str,
        error: CloudError,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let message = upstream_first(
            failed,
            format_args!("{FOREIGN}: {ip} was not attached to node {node}: {error}"),
        );
        let reason = AssignedReason::CloudResponseError;
        let obj = self
            .write_status(obj, status_node, reason, &message)
            .await?;
        self.event(&obj, true, "ForeignAddress", message).await;
        Err(error.into())
    }

    /// Writes the outcome of an attach call; `None` when the object has vanished meanwhile, in
    /// which case the IP has been detached again.
    pub(super) async fn write_after_attach(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
        target: &NodeTarget,
        ip: IpAddr,
        reason: AssignedReason,
        message: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        match self
            .write_status(obj, &target.node_name, reason, message)
            .await
        {
            Ok(written) => Ok(Some(written)),
            Err(e) if is_gone(&e) => {
                // A rare path: boxed so every attach does not carry its state.
                Box::pin(self.release_orphan(obj, target, ip)).await;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Detaches the IP of an object that vanished while its IP was being attached.
    ///
    /// kube-apiserver can complete a delete that raced with the write adding our finalizer
    /// (kubernetes/kubernetes#77988): both succeed and the object is gone at once, so the
    /// finalizer never brings the object back to us. Nothing claims the IP any more; it is
    /// detached here, with retries, because no later reconcile will see the object. (Should an
    /// object of the same name be created meanwhile, its own reconcile attaches the IP again and
    /// the drift check repairs any overlap.)
    pub(super) async fn release_orphan(
        &self,
        obj: &CloudPrivateIPConfig,
        target: &NodeTarget,
        ip: IpAddr,
    ) {
        let name = obj.name_any();
        let node = &target.node_name;
        tracing::warn!(object = %name, %node, %ip, "object deleted while its IP was being attached; detaching the IP");
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(self.config.backoff_base)
            .with_max_delay(self.config.backoff_cap)
            .with_max_times(ORPHAN_DETACH_RETRIES)
            .with_jitter()
            .build();
        let outcome = loop {
            match self.lanes.submit(target, Mutation::Detach, ip).await {
                Ok(()) => break Ok(()),
                Err(e) => match delays.next() {
                    Some(delay) => {
                        tracing::warn!(object = %name, %node, %ip, error = %e, retry_in = ?delay, "detaching the IP of a deleted object failed");
                        tokio::time::sleep(delay).await;
                    }
                    None => break Err(e),
                },
            }
        };
        self.forget(&name);
        match outcome {
            Ok(()) => {
                let note = format!(
                    "{ip} detached from node {node}: the object was deleted while the IP was being attached"
                );
                self.event(obj, true, "OrphanDetached", note).await;
            }
            Err(e) => {
                let note = format!(
                    "{ip} is still attached to node {node} and no object claims it: detaching it failed: {e}; remove it by hand"
                );
                tracing::error!(object = %name, %node, %ip, error = %e, "giving up detaching the IP of a deleted object");
                self.event(obj, true, "OrphanDetachFailed", note).await;
            }
        }
    }

    /// The VM for `node`, after checking the node exists and the IP fits it (subnet, reserved
    /// index, capacity); the error is the condition message.
    pub(super) async fn attach_target(
        &self,
        name: &str,
        ip: IpAddr,
        node: &str,
    ) -> Result<NodeTarget, String> {
        let Some(n) = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node))
        else {
            return Err(format!(
                "cannot attach {ip}: node {node} does not exist; will retry when it appears"
            ));
        };
        self.check_capacity(name, ip, &n)?;
        let provider_id = n.provider_id().unwrap_or_default();
        nodes::resolve(self.cloud.as_ref(), node, Some(&n), provider_id)
            .await
            .map_err(|e| format!("cannot attach {ip} to node {node}: {e}"))
    }
}

/// Whether a write failed because the object no longer exists.
fn is_gone(error: &Error) -> bool {
    matches!(error, Error::Kube(kube::Error::Api(s)) if s.is_not_found())
}
