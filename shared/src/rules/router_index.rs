//! Which egress router holds which address, for the cross-object rule: one hash lookup per
//! address, whatever the number of routers.
//!
//! Each indexed object (an EgressRouter, or an egress-router NetworkAttachmentDefinition) is
//! recorded with its *owner*: the EgressRouter that controls it, or itself. The network
//! operator creates one NetworkAttachmentDefinition per EgressRouter with the same addresses;
//! both share the owner, so they never conflict with each other.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use crate::egress::RouterRef;

/// Addresses of egress routers, by address and by the object that lists them.
#[derive(Clone, Debug, Default)]
pub struct RouterIndex {
    /// Object → the addresses it lists, to unindex them when it changes or goes.
    by_source: HashMap<RouterRef, Vec<IpAddr>>,
    /// Address → the objects listing it, with their owners. Normally one object, or an
    /// EgressRouter and its own NetworkAttachmentDefinition.
    by_ip: HashMap<IpAddr, BTreeMap<RouterRef, RouterRef>>,
}

impl RouterIndex {
    /// Records that `source` (owned by `owner`) lists `ips`, replacing what it listed before.
    pub fn upsert(&mut self, source: RouterRef, owner: RouterRef, mut ips: Vec<IpAddr>) {
        self.remove(&source);
        ips.sort_unstable();
        ips.dedup();
        if ips.is_empty() {
            return;
        }
        for ip in &ips {
            self.by_ip
                .entry(*ip)
                .or_default()
                .insert(source.clone(), owner.clone());
        }
        self.by_source.insert(source, ips);
    }

    /// Forgets `source`.
    pub fn remove(&mut self, source: &RouterRef) {
        let Some(ips) = self.by_source.remove(source) else {
            return;
        };
        for ip in ips {
            if let Some(holders) = self.by_ip.get_mut(&ip) {
                holders.remove(source);
                if holders.is_empty() {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }

    /// The owner of another router than `owner` that lists `ip` (the first by name).
    pub fn other_owner(&self, ip: IpAddr, owner: &RouterRef) -> Option<&RouterRef> {
        self.by_ip
            .get(&ip)?
            .values()
            .find(|holder| *holder != owner)
    }

    /// Number of objects indexed.
    pub fn len(&self) -> usize {
        self.by_source.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_source.is_empty()
    }

    /// Every indexed object, e.g. to drop those that vanished during a re-list.
    pub fn sources(&self) -> impl Iterator<Item = &RouterRef> {
        self.by_source.keys()
    }
}
