//! The delete transition, and the first half of a move made as detach then attach: the IP off
//! the VM the attachment ledger records for the node (or, for an IP attached without a record,
//! the node's VM if it shows the IP), then the finalizer released or `status.node` cleared.

use std::net::IpAddr;
use std::sync::Arc;

use cloudnet_shared::{AssignedReason, CloudPrivateIPConfig};
use futures::FutureExt;
use kube::ResourceExt;

use super::parked::Call;
use super::{Context, Error};
use crate::cloud::{CloudError, ErrorKind, NodeTarget};
use crate::controller::nodes;
use crate::controller::plan::{AfterDetach, DetachFrom, SourceNode, detach_from};
use crate::controller::status::upstream::{DELETE_FAILED, DELETED, DELETING, MOVE_FAILED, MOVING};
use crate::controller::status::upstream_first;
use crate::engine::lanes::{Announced, Mutation};

impl Context {
    /// The VM to detach `ip` from: the one the ledger records for `node`; else, for an IP
    /// an earlier controller assigned (`adopting`: the object is `Assigned=True` on `node`
    /// without a record), the Node's current VM if its cached interface view shows the IP
    /// there. `None` when nothing of ours is attached there, with the reason for the Event: an
    /// IP found there that neither this controller attached nor an earlier one assigned is
    /// another's, and stays.
    pub(super) async fn detach_target(
        &self,
        ip: IpAddr,
        node: &str,
        adopting: bool,
    ) -> Result<Result<NodeTarget, String>, Error> {
        let cached = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node));
        let synced = matches!(self.nodes.wait_until_ready().now_or_never(), Some(Ok(())));
        let source = match &cached {
            _ if !synced => SourceNode::NotSynced,
            None => SourceNode::Absent,
            Some(n) => match n.provider_id() {
                Some(provider_id) if !provider_id.is_empty() => SourceNode::Present { provider_id },
                _ => SourceNode::NoProviderId,
            },
        };
        let gone = matches!(source, SourceNode::Absent);
        match detach_from(node, self.ledger.instance(ip, node), source) {
            DetachFrom::Recorded(instance) => Ok(Ok(NodeTarget {
                node_name: node.to_owned(),
                provider_id: String::new(),
                instance,
                internal_ips: Default::default(),
            })),
            DetachFrom::Node(_) if !adopting => Ok(Err(format!(
                "the attachment ledger shows nothing this controller attached to node {node} \
                 and no earlier controller assigned {ip} there: nothing to detach; if {ip} is \
                 on that node's VM, another controller or tool put it there and it stays"
            ))),
            DetachFrom::Node(provider_id) => {
                let target =
                    nodes::resolve(self.cloud.as_ref(), node, cached.as_deref(), &provider_id)
                        .await?;
                if self.interfaces.get_or_read(&target).await?.holds(ip) {
                    Ok(Ok(target))
                } else {
                    Ok(Err(format!(
                        "the attachment ledger shows nothing attached to node {node} and its VM \
                         does not hold {ip}: nothing to detach"
                    )))
                }
            }
            DetachFrom::NothingRecorded => {
                let why = if gone { "is gone" } else { "has no providerID" };
                Ok(Err(format!(
                    "the attachment ledger shows nothing attached to node {node}, which {why}: \
                     nothing to detach; if another controller attached {ip} there, it may \
                     remain on that node's VM"
                )))
            }
            DetachFrom::Wait(message) => Err(Error::Blocked(message)),
        }
    }

    pub(super) async fn detach(
        &self,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
        then: AfterDetach,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let announced = self.lanes.expect(node);
        // A moving IP goes on to its new node once detached: announced there too, so that node's
        // lane keeps rate budget for it and, once the detach is done, waits for it to share its
        // call; the announcement goes on to the attach half (`next_half`).
        let spec_node = &obj.spec.node;
        let moving = matches!(then, AfterDetach::ClearStatusNode)
            && !spec_node.is_empty()
            && spec_node != node;
        let next = moving.then(|| self.lanes.expect_later(spec_node));
        if moving {
            self.read_ahead_of_move(spec_node);
        }
        // Upstream's texts: a detach on the way to another node is part of a move.
        let (pending, done, failed) = if moving {
            (MOVING, MOVING, MOVE_FAILED)
        } else {
            (DELETING, DELETED, DELETE_FAILED)
        };
        if self.released_from_node_lately(ip, node) {
            // This controller detached it from the node's VM lately, and the write after (the
            // finalizer, the status) is what failed or was not seen yet: that is what is left,
            // with nothing to warn of (a retry, or a second reconcile triggered by our own write
            // whose event came before its answer).
            tracing::debug!(object = %obj.name_any(), %node, "detached already: the ledger released the IP from the node's VM lately");
            let message = upstream_first(done, format_args!("{ip} detached from node {node}"));
            return self.after_detach(obj, then, &message).await;
        }
        let target = match self.detach_target(ip, node, assigned_on(obj, node)).await {
            Ok(Ok(t)) => t,
            Ok(Err(why)) => return self.skip_detach(ip, obj, node, then, why).await,
            Err(e) => {
                let message =
                    upstream_first(failed, format_args!("detaching {ip} from node {node}: {e}"));
                self.write_status(obj, node, AssignedReason::CloudResponseError, &message)
                    .await?;
                return Err(e);
            }
        };
        let message = upstream_first(pending, format_args!("detaching {ip} from node {node}"));
        self.write_status(obj, node, AssignedReason::CloudResponsePending, &message)
            .await?;
        // The reconcile ends here; the lane's answer reconciles the object again
        // ([`Self::finish_detach`]).
        let call = Call::Detach {
            node: node.to_owned(),
            then,
            next,
        };
        let answer = self.parked.park(&obj.name_any(), call);
        self.lanes
            .submit_then(announced, &target, Mutation::Detach, ip, answer);
        Ok(None)
    }

    /// Reads the VM of `node`, which a move's IP goes to once off its old VM, while it leaves,
    /// on a cloud that reads an interface before adding to it (EC2): that read is then off the
    /// move's path ([`crate::engine::interfaces::Interfaces::read_ahead`]).
    fn read_ahead_of_move(&self, node: &str) {
        if !self.cloud.needs().reads_before_adding {
            return;
        }
        let Some(cached) = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node))
        else {
            return;
        };
        let Some(provider_id) = cached
            .provider_id()
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
        else {
            return;
        };
        let (cloud, interfaces, node) = (
            Arc::clone(&self.cloud),
            Arc::clone(&self.interfaces),
            node.to_owned(),
        );
        tokio::spawn(async move {
            let resolved = nodes::resolve(cloud.as_ref(), &node, Some(&cached), &provider_id);
            if let Ok(target) = resolved.await {
                interfaces.read_ahead(&target).await;
            }
        });
    }

    /// Writes what the detach of `ip` from `node` came to, once the lane answered, then does
    /// `then`; `next` is the attach half of a move, announced to its node, which goes on to
    /// `next_half` once the IP is off the old VM.
    pub(super) async fn finish_detach(
        &self,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        (node, then, next): (&str, AfterDetach, Option<Announced>),
        detached: Result<(), CloudError>,
        next_half: &mut Option<Announced>,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        // Upstream's texts: a detach on the way to another node is part of a move.
        let (done, failed) = if next.is_some() {
            (MOVING, MOVE_FAILED)
        } else {
            (DELETED, DELETE_FAILED)
        };
        if let Err(e) = detached {
            // The node's own address: never detached, whatever the object says.
            if e.kind == ErrorKind::Foreign {
                return self.skip_detach(ip, obj, node, then, e.message).await;
            }
            let message = upstream_first(
                failed,
                format_args!("detaching {ip} from node {node} failed: {e}"),
            );
            self.write_status(obj, node, AssignedReason::CloudResponseError, &message)
                .await?;
            self.event(obj, true, "DetachFailed", message).await;
            return Err(e.into());
        }
        let message = upstream_first(done, format_args!("{ip} detached from node {node}"));
        let Some(mut next) = next else {
            self.event(obj, false, "Detached", message.clone()).await;
            return self.after_detach(obj, then, &message).await;
        };
        // Off the old VM: the new node's lane may wait for it now. The Event need not hold up
        // the write the attach half waits for.
        next.ready();
        let event = self.event(obj, false, "Detached", message.clone());
        let (_, written) = futures::join!(event, self.after_detach(obj, then, &message));
        *next_half = Some(next);
        written
    }

    /// Whether the ledger records `ip` on no VM of `node` and released it lately from the VM
    /// last seen as `node`.
    fn released_from_node_lately(&self, ip: IpAddr, node: &str) -> bool {
        if self.ledger.instance(ip, node).is_some() {
            return false;
        }
        let released = self.ledger.released_from(ip);
        !released.is_empty()
            && self
                .interfaces
                .known()
                .iter()
                .any(|t| t.node_name == node && released.contains(&t.instance))
    }

    /// Completes a detach from a node where nothing is attached (`why` says how that is known):
    /// no cloud call, an Event saying why, then what follows a detach.
    pub(super) async fn skip_detach(
        &self,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
        then: AfterDetach,
        why: String,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        tracing::info!(object = %obj.name_any(), %node, reason = %why, "nothing to detach");
        self.event(obj, true, "DetachSkipped", why).await;
        let message = upstream_first(
            DELETED,
            format_args!("{ip} was not attached to node {node}: nothing to detach"),
        );
        self.after_detach(obj, then, &message).await
    }

    /// What follows a detach: the finalizer goes, or `status.node` is cleared with `message`.
    pub(super) async fn after_detach(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
        then: AfterDetach,
        message: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        match then {
            AfterDetach::ReleaseFinalizer => {
                self.release_finalizer(obj).await?;
                self.forget(&obj.name_any());
                Ok(None)
            }
            AfterDetach::ClearStatusNode => {
                let obj = self
                    .write_status(obj, "", AssignedReason::CloudResponseSuccess, message)
                    .await?;
                Ok(Some(obj))
            }
        }
    }
}

/// Whether `obj` is `Assigned=True` on `node`: an IP assigned there without a ledger record
/// came from an earlier controller, and is detached as an adopted one would be.
pub(super) fn assigned_on(obj: &CloudPrivateIPConfig, node: &str) -> bool {
    obj.status_node() == Some(node) && obj.assigned_condition().is_some_and(|c| c.status == "True")
}
