//! The orphan sweep (SPEC §2.3): ledger entries that no object claims are detached and removed
//! after a grace period.
//!
//! How an entry loses its object: kube-apiserver completed a delete despite our finalizer
//! (kubernetes/kubernetes#77988), someone removed the finalizer by hand, the process died between
//! a call and the write after it, or a call sent before a lost lease landed after. The ledger is
//! written before every attach call, so each of those leaves an entry, and nothing else would
//! ever detach the IP.
//!
//! Claims are judged per IP and VM, as a detach acts: an IP's entries on one VM (one per node
//! name the VM was recorded as) are claimed when an object names any of those nodes, or the
//! node the VM is now, in its spec or its status. The grace period covers the object watch
//! showing a claim late; an entry must stay unclaimed for all of it, seen by every sweep in
//! between.
//!
//! A late call can also land after its entry is gone: the new term detached the IP (nothing was
//! there yet) and removed the entry, and then the held attach put it on the VM. The ledger's
//! released records name such a VM for [`release_window`]: an IP released from a VM lately that
//! the cached interface view shows on that VM again, with no ledger entry there and no object
//! claiming the node the VM was last seen as, is swept like an orphaned entry. The view is
//! refreshed every drift period, or, with drift checks off, by the sweep itself every tick for
//! the VMs holding such records. Only VMs the ledger names are ever acted on.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_shared::{CloudPrivateIPConfig, encode_name};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use cloudnet_shared::ledger::RECENT_RELEASE_WINDOW;

use crate::cloud::{InstanceId, NodeTarget};
use crate::controller::objects::Context;
use crate::engine::interfaces::Interfaces;
use crate::engine::lanes::Mutation;
use crate::engine::ledger::{Ledger, Placement};
use crate::metrics::OutcomeLabels;

/// How late a cloud call may land after it was sent: EC2 accepts a SigV4-signed request up to
/// 5 minutes after its timestamp, the longest any of the clouds allows.
pub(crate) const LATE_CALL: Duration = Duration::from_secs(300);

/// How often the sweep looks: a quarter of the grace period, at least every 250 ms.
pub(crate) fn tick(grace: Duration) -> Duration {
    (grace / 4).max(Duration::from_millis(250))
}

/// How long a released record must live for the sweep to catch every late attach: the last one
/// lands [`LATE_CALL`] after the release at worst; the next read of the VM (a drift period, or a
/// sweep tick with drift checks off) answers within the call deadline; the next sweep tick sees
/// it, a whole grace later the tick after that decides. Never shorter than
/// `RECENT_RELEASE_WINDOW`, which the webhook's rule 3 reads the records for.
pub fn release_window(
    drift_period: Duration,
    grace: Duration,
    call_deadline: Duration,
) -> Duration {
    let tick = tick(grace);
    let read = if drift_period.is_zero() {
        tick
    } else {
        drift_period
    };
    (LATE_CALL + read + call_deadline + tick + grace + tick).max(RECENT_RELEASE_WINDOW)
}

/// An IP on one VM: what a detach acts on, and what a claim is judged for.
type OnVm = (IpAddr, InstanceId);

/// Since when each unclaimed IP on a VM has been seen unclaimed.
#[derive(Debug, Default)]
pub(crate) struct Unclaimed {
    since: HashMap<OnVm, Instant>,
}

impl Unclaimed {
    /// Of `entries`, the IPs on a VM that `claimed` (given the IP, the VM and every node the
    /// ledger records the IP on that VM as) refuses for at least `grace` by `now`, each with
    /// one of its entries; forgets the IPs claimed again or gone from the ledger.
    pub(crate) fn orphans(
        &mut self,
        entries: Vec<(IpAddr, Arc<Placement>)>,
        claimed: impl Fn(IpAddr, &InstanceId, &[&str]) -> bool,
        now: Instant,
        grace: Duration,
    ) -> Vec<(IpAddr, Arc<Placement>)> {
        // Sorted in place and read in runs, not grouped into a map: at 20,000 entries a map of
        // every IP with a copy of its VM's id took 4 MB at each sweep, for the few unclaimed.
        let mut entries = entries;
        entries
            .sort_by(|a, b| (a.0, &a.1.instance, &a.1.node).cmp(&(b.0, &b.1.instance, &b.1.node)));
        let mut seen = HashMap::with_capacity(self.since.len());
        let mut orphans = Vec::new();
        for run in entries.chunk_by(|a, b| a.0 == b.0 && a.1.instance == b.1.instance) {
            let (ip, first) = &run[0];
            let nodes: Vec<&str> = run.iter().map(|(_, p)| &*p.node).collect();
            if claimed(*ip, &first.instance, &nodes) {
                continue;
            }
            let key = (*ip, first.instance.clone());
            let since = self.since.get(&key).copied().unwrap_or(now);
            if now.duration_since(since) >= grace {
                orphans.push((*ip, Arc::clone(first)));
            }
            seen.insert(key, since);
        }
        self.since = seen;
        orphans.sort_by(|a, b| (a.0, &a.1.node).cmp(&(b.0, &b.1.node)));
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
    let mut tick = tokio::time::interval(tick(grace));
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
        forget_gone_objects(&ctx);
        ctx.forget_gone_vms();
        // With drift checks off nothing else reads the VMs a late attach may land on.
        if ctx.config.drift_period.is_zero() {
            read_released_from(&ctx.ledger, &ctx.interfaces).await;
        }
        let known = ctx.interfaces.known();
        // By VM: every entry asks, and a scan of every known VM per entry was quadratic.
        let mut known_as: HashMap<&InstanceId, Vec<&str>> = HashMap::with_capacity(known.len());
        for target in &known {
            known_as
                .entry(&target.instance)
                .or_default()
                .push(&target.node_name);
        }
        let claimed = |ip: IpAddr, instance: &InstanceId, nodes: &[&str]| {
            let Ok(name) = encode_name(ip) else {
                return false;
            };
            let cached = ctx.objects.get(&ObjectRef::new(&name));
            let current = cached.map(|o| ctx.freshest(o));
            let now_as = known_as.get(instance).into_iter().flatten().copied();
            nodes
                .iter()
                .copied()
                .chain(now_as)
                .any(|node| claims(current.as_deref(), node))
        };
        let mut entries = ctx.ledger.entries();
        entries.extend(back_after_release(&ctx.ledger, &ctx.interfaces));
        let orphans = unclaimed.orphans(entries, claimed, Instant::now(), grace);
        // Together, so that one VM's orphans share its lane's call.
        futures::future::join_all(orphans.into_iter().map(|(ip, p)| release(&ctx, ip, p))).await;
    }
}

/// Forgets the retry counts, drift marks and answered lane records of objects no longer in the
/// cache (deleted, or forced out without a last reconcile), so that a long-running process keeps
/// none of them.
fn forget_gone_objects(ctx: &Context) {
    let present = |name: &str| ctx.objects.get(&ObjectRef::new(name)).is_some();
    ctx.retries.retain(present);
    ctx.parked.retain_answered(present);
    ctx.drifted
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|name| present(name));
}

/// Reads again, in as few list calls as the cloud allows, every known VM the ledger released an
/// IP from lately that it does not record there now: what the drift period does when it is on.
async fn read_released_from(ledger: &Ledger, interfaces: &Interfaces) {
    let released = ledger.recently_released();
    if released.is_empty() {
        return;
    }
    let mut targets: Vec<NodeTarget> = interfaces
        .known()
        .into_iter()
        .filter(|t| {
            released
                .iter()
                .any(|(ip, instance, _)| *instance == t.instance && !ledger.records(*ip, instance))
        })
        .collect();
    targets.sort_by(|a, b| a.instance.cmp(&b.instance));
    targets.dedup_by(|a, b| a.instance == b.instance);
    if targets.is_empty() {
        return;
    }
    // A failed read keeps the view it had: the next tick reads the VM again.
    for (target, answer) in targets.iter().zip(interfaces.refresh_all(&targets).await) {
        if let Err(e) = answer {
            tracing::debug!(node = %target.node_name, error = %e, "reading a VM an IP was released from failed; the next sweep reads it again");
        }
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
        entry_on(ip, &format!("i-{node}"), node)
    }

    fn entry_on(ip: &str, instance: &str, node: &str) -> (IpAddr, Arc<Placement>) {
        let placement = Placement {
            instance: InstanceId(instance.to_owned()),
            node: node.into(),
        };
        (ip.parse().unwrap(), Arc::new(placement))
    }

    #[test]
    fn a_claim_on_any_node_the_vm_was_recorded_as_keeps_the_ip_on_that_vm() {
        // One VM recorded as node a and, after a rename, as node b; the object claims b. The
        // sweep's detach would take the IP off the VM whichever entry it came from.
        let grace = Duration::from_secs(10);
        let start = Instant::now();
        let entries = || {
            vec![
                entry_on("10.0.0.1", "i-1", "a"),
                entry_on("10.0.0.1", "i-1", "b"),
                entry_on("10.0.0.1", "i-2", "c"),
            ]
        };
        let claims_b = |_: IpAddr, _: &InstanceId, nodes: &[&str]| nodes.contains(&"b");
        let mut unclaimed = Unclaimed::default();
        assert!(
            unclaimed
                .orphans(entries(), claims_b, start, grace)
                .is_empty()
        );
        let orphans = unclaimed.orphans(entries(), claims_b, start + grace, grace);
        assert_eq!(orphans, vec![entry_on("10.0.0.1", "i-2", "c")]);
    }

    #[test]
    fn the_release_window_outlasts_the_latest_sweep_of_a_late_attach_for_every_setting() {
        let second = Duration::from_secs(1);
        for drift in [0, 1, 60, 300, 3600] {
            for grace in [1, 30, 120, 900] {
                for deadline in [1, 120, 600] {
                    let (drift, grace, deadline) =
                        (drift * second, grace * second, deadline * second);
                    let window = release_window(drift, grace, deadline);
                    let read = if drift.is_zero() { tick(grace) } else { drift };
                    // The worst case: the attach lands LATE_CALL after the release, just after
                    // a read; the next read answers a deadline later, just after a sweep; the
                    // sweep after it starts the grace, and the first sweep past the grace acts.
                    let acted = LATE_CALL + read + deadline + tick(grace) + grace + tick(grace);
                    assert!(
                        window >= acted,
                        "{drift:?} {grace:?} {deadline:?}: {window:?}"
                    );
                    assert!(window >= RECENT_RELEASE_WINDOW);
                }
            }
        }
        // The defaults: 15 minutes.
        assert_eq!(
            release_window(300 * second, 120 * second, 120 * second),
            900 * second
        );
    }

    #[test]
    fn an_entry_is_an_orphan_only_after_a_whole_grace_period_unclaimed() {
        let grace = Duration::from_secs(10);
        let start = Instant::now();
        let mut unclaimed = Unclaimed::default();
        let entries = || vec![entry("10.0.0.1", "a"), entry("10.0.0.2", "a")];
        let only_first_claimed =
            |ip: IpAddr, _: &InstanceId, _: &[&str]| ip.to_string() == "10.0.0.1";
        let none = |_: IpAddr, _: &InstanceId, _: &[&str]| false;
        assert!(unclaimed.orphans(entries(), none, start, grace).is_empty());
        // Claimed again in between: its clock starts over.
        let later = start + Duration::from_secs(5);
        let all = |_: IpAddr, _: &InstanceId, _: &[&str]| true;
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
