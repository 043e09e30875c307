//! The nodes an object's nodeSelector picks (an Antrea pool's, an egress gateway's), as the
//! checks that read their egress annotation see them, and the warnings that say what those
//! checks skipped: one wording for every front end.

use kube::core::Selector;

use super::ClusterSnapshot;
use crate::annotation::{EGRESS_IPCONFIG_ANNOTATION, EgressIpConfig};

/// Names listed in a warning before "and N more".
const NAMES_LISTED: usize = 3;

/// What the warnings say the checks skipped, and what happens to the object instead.
pub(super) struct Skipped<'w> {
    /// Without any picked node: the checks, as the subject of "were skipped".
    pub(super) all: &'w str,
    /// With picked nodes lacking an annotation: what the checks did ("the subnet check skipped
    /// them").
    pub(super) some: &'w str,
    /// What checks the object's IPs later.
    pub(super) later: &'w str,
}

/// The picked nodes the checks can read.
pub(super) struct Picked<'a> {
    /// Each picked node with a readable annotation, by name.
    pub(super) annotated: Vec<(&'a str, &'a EgressIpConfig)>,
    /// Whether every picked node has one.
    pub(super) complete: bool,
}

/// The nodes `selector` picks for the checks of `object` ("EgressGateway a"), `None` when it
/// picks none yet; a warning says what the checks skipped then, or for the nodes without a
/// readable annotation.
pub(super) fn picked<'a>(
    cluster: &'a ClusterSnapshot,
    selector: &Selector,
    object: &str,
    skipped: &Skipped<'_>,
    warnings: &mut Vec<String>,
) -> Option<Picked<'a>> {
    let Skipped { all, some, later } = skipped;
    let nodes = cluster.nodes_matching(selector);
    if nodes.is_empty() {
        warnings.push(format!(
            "{object}: its nodeSelector picks no node yet, so {all} were skipped; {later}"
        ));
        return None;
    }
    let annotated: Vec<(&str, &EgressIpConfig)> = nodes
        .iter()
        .filter_map(|node| node.egress.config().map(|c| (node.name.as_str(), c)))
        .collect();
    let complete = annotated.len() == nodes.len();
    if !complete {
        let unannotated: Vec<&str> = nodes
            .iter()
            .filter(|node| node.egress.config().is_none())
            .map(|node| node.name.as_str())
            .collect();
        warnings.push(format!(
            "{object}: {} of the {} nodes its nodeSelector picks ({}) have no readable {EGRESS_IPCONFIG_ANNOTATION} annotation yet, so {some}; {later}",
            unannotated.len(),
            nodes.len(),
            listed(&unannotated)
        ));
    }
    Some(Picked {
        annotated,
        complete,
    })
}

/// Up to [`NAMES_LISTED`] names, then how many more.
fn listed(names: &[&str]) -> String {
    let shown = names
        .iter()
        .take(NAMES_LISTED)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    match names.len().saturating_sub(NAMES_LISTED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}
