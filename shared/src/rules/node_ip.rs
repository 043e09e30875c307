//! Rule 3: an egress IP is never a node's own address, on whichever node.

use std::net::IpAddr;

use super::{ClusterSnapshot, Denial, Rule, cannot_place};

/// Refuses `ip` if any Node lists it in `status.addresses`.
///
/// Attaching a node's own IP elsewhere, or detaching it later, would cut that node off the network.
pub fn check_node_ip(ip: IpAddr, spec_node: &str, cluster: &ClusterSnapshot) -> Result<(), Denial> {
    match cluster.node_with_address(ip) {
        None => Ok(()),
        Some(owner) => Err(Denial::new(
            Rule::NodeIp,
            format!(
                "{}: {ip} is an address of node {owner} (status.addresses), and a node's own IP must never be moved or detached; pick an unused address of the node's subnet",
                cannot_place(ip, spec_node)
            ),
        )),
    }
}
