//! The move transition on a cloud that moves an IP between VMs in one operation
//! ([`crate::cloud::ProviderNeeds`]): never on two VMs at once, and resumable after a crash as an
//! attach to the new node.

use std::net::IpAddr;
use std::sync::Arc;

use cloudnet_shared::{AssignedReason, CloudPrivateIPConfig};

use super::detach::assigned_on;
use super::{Context, Error};
use crate::cloud::ErrorKind;
use crate::controller::plan::AfterDetach;
use crate::controller::status::upstream::{MOVE_FAILED, MOVED, MOVING};
use crate::controller::status::upstream_first;

impl Context {
    /// Moves the IP from `from` to `to` in one provider operation that never leaves it on both.
    ///
    /// The status names `to` (Pending) and the ledger records `to`'s VM before the call, so a
    /// crash mid-move resumes as an attach to `to`, which the provider completes as a move (it
    /// takes the IP off the VM whose reservation it adopts first). Without a VM to move from (the
    /// Node gone with no record, or not yet known) it falls back to detach, then attach.
    pub(super) async fn move_ip(
        &self,
        name: &str,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        from: &str,
        to: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let source = match self.detach_target(ip, from, assigned_on(obj, from)).await {
            Ok(Ok(source)) => source,
            _ => {
                return self
                    .detach(ip, obj, from, AfterDetach::ClearStatusNode)
                    .await;
            }
        };
        let target = match self.attach_target(name, ip, to).await {
            Ok(target) => target,
            Err(message) => {
                // The IP stays where it is, and the status keeps saying so.
                self.write_status(obj, from, AssignedReason::CloudResponseError, &message)
                    .await?;
                self.event(obj, true, "MoveBlocked", message.clone()).await;
                return Err(Error::Blocked(message));
            }
        };
        let obj = self.ensure_finalizer(obj).await?;
        let message = upstream_first(
            MOVING,
            format_args!("moving {ip} from node {from} to node {to}"),
        );
        let obj = self
            .write_status(&obj, to, AssignedReason::CloudResponsePending, &message)
            .await?;
        if let Err(e) = self.lanes.move_ip(&source, &target, ip).await {
            // Refused before any call: the IP is still on `from`, and the status says so.
            if e.kind == ErrorKind::Foreign {
                return self
                    .refuse_foreign(&obj, ip, (to, from), MOVE_FAILED, e)
                    .await;
            }
            let message = upstream_first(
                MOVE_FAILED,
                format_args!("moving {ip} from node {from} to node {to} failed: {e}"),
            );
            let reason = AssignedReason::CloudResponseError;
            let Some(obj) = self
                .write_after_attach(&obj, &target, ip, reason, &message)
                .await?
            else {
                return Ok(None);
            };
            self.event(&obj, true, "MoveFailed", message).await;
            return Err(e.into());
        }
        let message = upstream_first(
            MOVED,
            format_args!("{ip} moved from node {from} to node {to}"),
        );
        let reason = AssignedReason::CloudResponseSuccess;
        let Some(obj) = self
            .write_after_attach(&obj, &target, ip, reason, &message)
            .await?
        else {
            return Ok(None);
        };
        self.event(&obj, false, "Moved", message).await;
        Ok(Some(obj))
    }
}
