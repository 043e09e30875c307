//! Rule 2: a non-empty `spec.node` names an existing Node.

use std::net::IpAddr;

use super::{ClusterSnapshot, Denial, Rule, cannot_place};
use crate::node::NodeInfo;

/// The node `spec.node` names, or a denial if the cluster has no such node.
pub fn check_target_node<'c>(
    ip: IpAddr,
    node: &str,
    cluster: &'c ClusterSnapshot,
) -> Result<&'c NodeInfo, Denial> {
    cluster.node(node).ok_or_else(|| {
        Denial::new(
            Rule::TargetNode,
            format!(
                "{}: no Node named {node:?} exists; set spec.node to the name of an existing Node, or leave it empty",
                cannot_place(ip, node)
            ),
        )
    })
}
