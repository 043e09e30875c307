//! Rule 3: an egress IP is never a node's own address, on whichever node.
//!
//! A Node's `status.addresses` can list egress IPs too: cloud-provider-aws reports every private
//! IP of the primary ENI as an InternalIP, egress IPs included, and refreshes the list only every
//! few minutes. So an address there is the node's own only when no CloudPrivateIPConfig manages
//! it (see [`ClusterSnapshot::is_managed`]); otherwise moving, parking or re-creating an egress
//! IP, which failover depends on, would be refused for as long as its node still lists it.

use std::net::IpAddr;

use super::{ClusterSnapshot, Denial, Operation, Rule, cannot_place};

/// Refuses `ip` (object `name`) if a Node lists it in `status.addresses` and no
/// CloudPrivateIPConfig manages it.
///
/// An UPDATE never trips the rule: the object exists, so it manages its IP, even while the
/// cache has not seen it yet. Attaching a node's own IP elsewhere, or detaching it later, would
/// cut that node off the network.
pub fn check_node_ip(
    operation: Operation,
    ip: IpAddr,
    name: &str,
    spec_node: &str,
    cluster: &ClusterSnapshot,
) -> Result<(), Denial> {
    if operation == Operation::Update || cluster.is_managed(name) {
        return Ok(());
    }
    match cluster.node_with_address(ip) {
        None => Ok(()),
        Some(owner) => Err(Denial::new(
            Rule::NodeIp,
            format!(
                "{}: {ip} is an address of node {owner} (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must never be moved or detached; pick an unused address of the node's subnet",
                cannot_place(ip, spec_node)
            ),
        )),
    }
}
