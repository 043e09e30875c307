//! The orphan sweep (SPEC §2.3): ledger entries that no object claims are detached and removed
//! after a grace period.
//!
//! How an entry loses its object: kube-apiserver completed a delete despite our finalizer
//! (kubernetes/kubernetes#77988), someone removed the finalizer by hand, the process died between
//! a call and the write after it, or a call sent before a lost lease landed after. The ledger is
//! written before every attach call, so each of those leaves an entry, and nothing else would
//! ever detach the IP.
//!
//! An object claims an entry when it names the entry's node in its spec or its status. The grace
//! period covers the object watch showing a claim late; an entry must stay unclaimed for all of
//! it, seen by every sweep in between.
//!
//! A late call can also land after its entry is gone: the new term detached the IP (nothing was
//! there yet) and removed the entry, and then the held attach put it on the VM. The ledger's
//! released records name such a VM for ten minutes: an IP released from a VM lately that the
//! cached interface view (refreshed every drift period) shows on that VM again, with no ledger
//! entry there and no object claiming the node the VM was last seen as, is swept like an
//! orphaned entry. Only VMs the ledger names are ever acted on.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_shared::{CloudPrivateIPConfig, encode_name};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::cloud::NodeTarget;
use crate::controller::objects::Context;
use crate::engine::interfaces::Interfaces;
use crate::engine::lanes::Mutation;
use crate::engine::ledger::{Ledger, Placement};
use crate::metrics::OutcomeLabels;

/// Since when each unclaimed entry has been seen unclaimed.
#[derive(Debug, Default)]
pub(crate) struct Unclaimed {
    since: HashMap<(IpAddr, Arc<Placement>), Instant>,
}

impl Unclaimed {
    /// Of `entries`, those unclaimed for at least `grace` by `now`; forgets the entries claimed
    /// again or gone from the ledger.
    pub(crate) fn orphans(
        &mut self,
        entries: Vec<(IpAddr, Arc<Placement>)>,
        claimed: impl Fn(IpAddr, &Placement) -> bool,
        now: Instant,
        grace: Duration,
    ) -> Vec<(IpAddr, Arc<Placement>)> {
        let mut seen = HashMap::with_capacity(self.since.len());
        let mut orphans = Vec::new();
        for entry in entries {
            if claimed(entry.0, &entry.1) {
                continue;
            }
            let since = self.since.get(&entry).copied().unwrap_or(now);
            if now.duration_since(since) >= grace {
                orphans.push(entry.clone());
            }
            seen.insert(entry, since);
        }
        self.since = seen;
        orphans
    }
}

/// Whether `obj` (if it exists) claims an entry on `node`.
pub(crate) fn claims(obj: Option<&CloudPrivateIPConfig>, node: &str) -> bool {
    obj.is_some_and(|o| o.spec.node == node || o.status_node() == Some(node))
}

/// Sweeps every quarter of the grace period, until the engine stops.
pub(crate) async fn sweep_loop(ctx: Arc<Context>) {
    let grace = ctx.config.orphan_grace;
    let mut tick = tokio::time::interval((grace / 4).max(Duration::from_millis(250)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unclaimed = Unclaimed::default();
    loop {
        tick.tick().await;
        // An unsynced cache claims nothing: no sweep before it has listed every object.
        match tokio::time::timeout(grace, ctx.objects.wait_until_ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => continue,
        }
        let claimed = |ip: IpAddr, placement: &Placement| {
            let Ok(name) = encode_name(ip) else {
                return false;
            };
            let cached = ctx.objects.get(&ObjectRef::new(&name));
            let current = cached.map(|o| ctx.freshest(o));
            claims(current.as_deref(), &placement.node)
        };
        let mut entries = ctx.ledger.entries();
        entries.extend(back_after_release(&ctx.ledger, &ctx.interfaces));
        let orphans = unclaimed.orphans(entries, claimed, Instant::now(), grace);
        // Together, so that one VM's orphans share its lane's call.
        futures::future::join_all(orphans.into_iter().map(|(ip, p)| release(&ctx, ip, p))).await;
    }
}

/// The IPs the ledger released from a VM lately that the VM's cached interface view shows on it
/// again, while the ledger records none of them there: each with the VM and the node it was last
/// seen as.
fn back_after_release(ledger: &Ledger, interfaces: &Interfaces) -> Vec<(IpAddr, Arc<Placement>)> {
    let released = ledger.recently_released();
    if released.is_empty() {
        return Vec::new();
    }
    let known = interfaces.known();
    released
        .into_iter()
        .filter(|(ip, instance, _)| !ledger.records(*ip, instance))
        .filter_map(|(ip, instance, _)| {
            let target = known
                .iter()
                .find(|t| t.instance == instance && !t.node_name.is_empty())?;
            interfaces.get(&instance)?.holds(ip).then(|| {
                let placement = Placement {
                    instance,
                    node: target.node_name.as_str().into(),
                };
                (ip, Arc::new(placement))
            })
        })
        .collect()
}

/// Detaches an orphan's IP from its VM; the lane takes it off the ledger once detached.
async fn release(ctx: &Context, ip: IpAddr, placement: Arc<Placement>) {
    let node = placement.node.to_string();
    let target = NodeTarget {
        node_name: node.clone(),
        provider_id: String::new(),
        instance: placement.instance.clone(),
        internal_ips: Default::default(),
    };
    let grace = ctx.config.orphan_grace;
    let result = ctx.lanes.submit(&target, Mutation::Detach, ip).await;
    let outcome = if result.is_ok() { "detached" } else { "failed" };
    ctx.metrics
        .orphans_released
        .get_or_create(&OutcomeLabels {
            outcome: outcome.to_owned(),
        })
        .inc();
    let note = match &result {
        Ok(()) => {
            tracing::warn!(%ip, %node, instance = %target.instance, "no object claimed the IP for {grace:?}; detached it");
            format!(
                "{ip} was recorded on this node's VM {} but no object claimed it for {}s: \
                 detached it",
                target.instance,
                grace.as_secs()
            )
        }
        Err(e) => {
            tracing::warn!(%ip, %node, instance = %target.instance, error = %e, "detaching an IP no object claims failed; the next sweep retries");
            format!(
                "{ip} is recorded on this node's VM {} but no object claims it: detaching it \
                 failed: {e}; the next sweep retries",
                target.instance
            )
        }
    };
    let node_ref = ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Node".to_owned()),
        name: Some(node),
        ..ObjectReference::default()
    };
    ctx.events
        .publish(&node_ref, true, "OrphanReleased", note)
        .await;
}

#[cfg(test)]
mod tests {
    use cloudnet_shared::CloudPrivateIPConfigSpec;

    use super::*;
    use crate::cloud::InstanceId;

    fn entry(ip: &str, node: &str) -> (IpAddr, Arc<Placement>) {
        let placement = Placement {
            instance: InstanceId(format!("i-{node}")),
            node: node.into(),
        };
        (ip.parse().unwrap(), Arc::new(placement))
    }

    #[test]
    fn an_entry_is_an_orphan_only_after_a_whole_grace_period_unclaimed() {
        let grace = Duration::from_secs(10);
        let start = Instant::now();
        let mut unclaimed = Unclaimed::default();
        let entries = || vec![entry("10.0.0.1", "a"), entry("10.0.0.2", "a")];
        let only_first_claimed = |ip: IpAddr, _: &Placement| ip.to_string() == "10.0.0.1";
        let none = |_: IpAddr, _: &Placement| false;
        assert!(unclaimed.orphans(entries(), none, start, grace).is_empty());
        // Claimed again in between: its clock starts over.
        let later = start + Duration::from_secs(5);
        let all = |_: IpAddr, _: &Placement| true;
        assert!(unclaimed.orphans(entries(), all, later, grace).is_empty());
        let at = start + Duration::from_secs(11);
        assert!(
            unclaimed
                .orphans(entries(), only_first_claimed, at, grace)
                .is_empty()
        );
        let end = at + grace;
        let orphans = unclaimed.orphans(entries(), only_first_claimed, end, grace);
        assert_eq!(orphans, vec![entry("10.0.0.2", "a")]);
        // Gone from the ledger: forgotten.
        assert!(unclaimed.orphans(Vec::new(), none, end, grace).is_empty());
        assert!(unclaimed.since.is_empty());
    }

    #[test]
    fn an_object_claims_the_nodes_of_its_spec_and_status() {
        let mut obj =
            CloudPrivateIPConfig::new("10.0.0.1", CloudPrivateIPConfigSpec { node: "b".into() });
        assert!(claims(Some(&obj), "b"));
        assert!(!claims(Some(&obj), "a"));
        obj.status = Some(cloudnet_shared::CloudPrivateIPConfigStatus {
            node: "a".into(),
            conditions: Vec::new(),
        });
        assert!(claims(Some(&obj), "a"));
        assert!(!claims(None, "a"));
    }
}
