//! Adoption: an IP assigned without a record in the attachment ledger (by the upstream
//! controller, or before the ledger existed) is recorded there once its node's VM shows it.

use std::net::IpAddr;
use std::sync::Arc;

use cloudnet_shared::CloudPrivateIPConfig;

use super::{Context, Error, lock};
use crate::controller::nodes;
use crate::engine::lanes::Mutation;

impl Context {
    /// Records in the ledger an IP assigned to `node` without a record, once the node's current
    /// VM shows it on its interface (the cached view: one read per VM at most, never one per
    /// IP). The lane records it with the other IPs of the VM in one ledger write and, the view
    /// already showing the IP, makes no call. An IP a fresh read does not show either is
    /// attached again, as a drift check would have it.
    pub(super) async fn adopt(
        &self,
        name: &str,
        ip: IpAddr,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
    ) -> Result<Option<Arc<CloudPrivateIPConfig>>, Error> {
        let cached = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node));
        let provider_id = cached
            .as_ref()
            .and_then(|n| n.provider_id())
            .unwrap_or_default();
        if provider_id.is_empty() {
            let message = format!(
                "cannot adopt {ip}: node {node} is gone or has no providerID, so its VM is \
                 unknown; the IP is not recorded in the attachment ledger"
            );
            self.event(obj, true, "AdoptionBlocked", message.clone())
                .await;
            return Err(Error::Blocked(message));
        }
        let target =
            nodes::resolve(self.cloud.as_ref(), node, cached.as_deref(), provider_id).await?;
        // The cached view can predate the earlier controller's assignment; concluding
        // "missing" from it would re-attach, and the attach would then meet the address as
        // foreign.
        let holds = self
            .interfaces
            .confirmed(&target, |view| view.holds(ip))
            .await?
            .holds(ip);
        if !holds {
            // Upstream may have put it on another interface of the same VM (the VM is the
            // Node's, so this stays within nodes' VMs): off there first, or the re-attach to the
            // primary would leave it on two interfaces.
            if self
                .cloud
                .release_from_other_interfaces(&target, ip)
                .await?
            {
                let note = format!(
                    "{ip} was found on a secondary interface of node {node}'s VM {} and \
                     unassigned there; attaching it to the primary interface",
                    target.instance
                );
                self.event(obj, true, "MovedToPrimaryInterface", note).await;
            }
            tracing::warn!(object = name, %node, "assigned without a ledger record and missing from the node's primary interface; attaching again");
            lock(&self.drifted).insert(name.to_owned());
            return Ok(Some(Arc::clone(obj)));
        }
        self.lanes.submit(&target, Mutation::Adopt, ip).await?;
        tracing::info!(object = name, %node, instance = %target.instance, "adopted: recorded in the attachment ledger");
        let note = format!(
            "{ip} was assigned to node {node} without a record (by another controller, or \
             before the ledger existed): recorded in the attachment ledger on VM {}",
            target.instance
        );
        self.event(obj, false, "Adopted", note).await;
        Ok(Some(Arc::clone(obj)))
    }
}
