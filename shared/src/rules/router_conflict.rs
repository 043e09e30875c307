//! The cross-object rule for egress routers: an address a router adds is no CloudPrivateIPConfig's
//! IP, no node's own address, and no other router's address.
//!
//! "A node's own address" is rule 3's definition (`webhook/README.md`, "Rules in detail"): listed
//! in some Node's `status.addresses` and managed by no CloudPrivateIPConfig (none exists under
//! that name, and none was deleted lately). An IP a CloudPrivateIPConfig holds is refused by the
//! first check instead, naming that object.

use std::net::IpAddr;

use crate::codec::encode_name;
use crate::egress::RouterRef;

use super::{ClusterSnapshot, Denial, Rule};

/// Refuses the first address of `ips` that is taken. `object` is the reviewed object (named in
/// the message), `owner` the router it belongs to (itself, or the EgressRouter controlling a
/// NetworkAttachmentDefinition); addresses in `unchanged` are skipped. Each check is a hash
/// lookup.
pub fn check_router_addresses(
    object: &RouterRef,
    owner: &RouterRef,
    ips: &[IpAddr],
    unchanged: &[IpAddr],
    cluster: &ClusterSnapshot,
) -> Result<(), Denial> {
    for &ip in ips.iter().filter(|ip| !unchanged.contains(ip)) {
        let name = encode_name(ip).ok();
        if let Some(name) = name.as_deref()
            && cluster.has_object(name)
        {
            return Err(Denial::new(
                Rule::EgressRouterConflict,
                format!(
                    "{object} uses {ip}, which is the egress IP of CloudPrivateIPConfig {name} that the cloud attaches to a node; pick an address no CloudPrivateIPConfig uses"
                ),
            ));
        }
        let managed = name.as_deref().is_some_and(|n| cluster.is_managed(n));
        if !managed && let Some(node) = cluster.node_with_address(ip) {
            return Err(Denial::new(
                Rule::EgressRouterConflict,
                format!(
                    "{object} uses {ip}, which is an address of node {node} (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must not be taken by a router; pick an unused address of the router's network"
                ),
            ));
        }
        if let Some(other) = cluster.routers().other_owner(ip, owner) {
            return Err(Denial::new(
                Rule::EgressRouterConflict,
                format!(
                    "{object} uses {ip}, which {other} already uses; give each egress router its own address"
                ),
            ));
        }
    }
    Ok(())
}
