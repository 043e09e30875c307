//! Admission of `EgressGateway`s (docs/gateways.md, "Admission"), and the one rule they add to
//! CloudPrivateIPConfigs.
//!
//! A gateway's egress IPs are checked with the CloudPrivateIPConfig rules, read for every node
//! the gateway may become active on, and against every other holder of an egress IP:
//!
//! * **spelling** (`egress_gateway_ip`): each IP canonical (IPv4 dotted decimal, IPv6 as RFC 5952
//!   writes it), usable as rule 1 reads it, listed once;
//! * **family** (`address_index`): IPv6 on a cloud that attaches IPv4 only;
//! * **node IP** (`node_ip`): a node's own address that no CloudPrivateIPConfig manages, on any
//!   node;
//! * **subnet** (`address_index`): attachable to every annotated node the `nodeSelector` picks
//!   (inside its subnet, off the reserved indices), since any of them may become the active one;
//! * **claims** (`egress_gateway_conflict`): no other gateway lists the IP, no opted-in Antrea
//!   ExternalIPPool holds it, and no CloudPrivateIPConfig holds it but the one the reconciler
//!   keeps for this gateway.
//!
//! Nothing is refused on what cannot be verified: a selector that picks no node yet, or a picked
//! node without a readable annotation, is admitted with a warning; the reconciler's own checks
//! before the cloud call still hold then. On an UPDATE only the IPs it adds are checked against
//! the cluster (and every IP against the nodes, when the selector changes): a gateway once
//! admitted is never held back by nodes or objects that changed since.
//!
//! The reverse ([`check_object_claim`]): a CloudPrivateIPConfig created for an IP a gateway
//! lists is refused unless it carries the gateway front end's label, so the reconciler never
//! meets another's object in its place.

use std::net::IpAddr;

use kube::core::Selector;

use super::address_index::{Misplaced, misplaced};
use super::picked::{Skipped, picked};
use super::{ClusterSnapshot, Denial, Operation, Rule, Verdict, reviewable};
use crate::annotation::EGRESS_IPCONFIG_ANNOTATION;
use crate::codec::{NameError, canonical_name, decode_name, encode_name};
use crate::excerpt::excerpt;
use crate::gateway::{EgressGatewaySpec, FRONT_END};
use crate::platform::{Platform, reserved_summary};
use crate::resource::FRONT_END_LABEL;

/// The annotation on a front end's CloudPrivateIPConfig that names the object it is kept for
/// (`EgressGateway/<name>`); the reconciler's front-end layer writes it.
pub const SOURCE_ANNOTATION: &str = "cloudnet.io/source";

/// What [`SOURCE_ANNOTATION`] starts with on the objects kept for a gateway.
const SOURCE_PREFIX: &str = "EgressGateway/";

/// The value of [`SOURCE_ANNOTATION`] on the objects kept for gateway `name`.
pub fn gateway_source(name: &str) -> String {
    format!("{SOURCE_PREFIX}{name}")
}

/// The gateway a CloudPrivateIPConfig is kept for, from its front-end label and its source
/// annotation: `Some` only when both say it is a gateway's.
pub fn gateway_of_object<'a>(front_end: Option<&str>, source: Option<&'a str>) -> Option<&'a str> {
    if front_end != Some(FRONT_END) {
        return None;
    }
    source?
        .strip_prefix(SOURCE_PREFIX)
        .filter(|name| !name.is_empty())
}

/// The admission decision for an `EgressGateway` (`name`, after the operation `new`, before it
/// `old`; `old` is `None` on a create, or when unreadable, which reviews the gateway in full).
///
/// An UPDATE that keeps the spec passes: labels, annotations and the reconciler's status
/// writes are never held back by rules that changed since.
pub fn review_gateway(
    operation: Operation,
    name: &str,
    new: Option<&EgressGatewaySpec>,
    old: Option<&EgressGatewaySpec>,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Verdict {
    let subject = format!(" for EgressGateway {name}");
    let new = match reviewable(operation, new, &subject, "EgressGateway") {
        Ok(new) => new,
        Err(verdict) => return verdict,
    };
    let before = old.filter(|_| operation == Operation::Update);
    if before == Some(new) {
        return Verdict::allow();
    }
    let mut verdict = Verdict::allow();
    if let Err(denial) = check_gateway(name, new, before, cluster, platform, &mut verdict.warnings)
    {
        verdict.denial = Some(denial);
    }
    verdict
}

fn check_gateway(
    name: &str,
    spec: &EgressGatewaySpec,
    before: Option<&EgressGatewaySpec>,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
    warnings: &mut Vec<String>,
) -> Result<(), Denial> {
    // Spelling first: it does not depend on the cluster, so every IP is checked every time.
    let mut ips: Vec<(usize, IpAddr)> = Vec::with_capacity(spec.egress_ips.len());
    for (index, text) in spec.egress_ips.iter().enumerate() {
        let ip = check_spelling(name, index, text)?;
        if let Some(&(first, _)) = ips.iter().find(|(_, seen)| *seen == ip) {
            return Err(Denial::new(
                Rule::GatewayIp,
                format!(
                    "EgressGateway {name}: egressIPs[{index}] repeats egressIPs[{first}] ({ip}); list each egress IP once"
                ),
            ));
        }
        ips.push((index, ip));
    }
    let selector = Selector::try_from(spec.node_selector.clone()).map_err(|error| {
        Denial::new(
            Rule::BadInput,
            format!(
                "EgressGateway {name}: spec.nodeSelector cannot be read ({error}); write it as a Kubernetes label selector (operators In, NotIn, Exists, DoesNotExist)"
            ),
        )
    })?;
    let kept = |ip: IpAddr| {
        before.is_some_and(|old| {
            old.egress_ips
                .iter()
                .any(|text| text.parse::<IpAddr>() == Ok(ip))
        })
    };
    // The IPs the cluster has not judged for this gateway yet.
    let added: Vec<(usize, IpAddr)> = ips.iter().copied().filter(|(_, ip)| !kept(*ip)).collect();
    // The IPs to place on the picked nodes: all of them when the nodes may differ.
    let same_nodes = before.is_some_and(|old| old.node_selector == spec.node_selector);
    let placed = if same_nodes { &added } else { &ips };

    if let Some(platform) = platform
        && !platform.supports_ipv6()
        && let Some(&(index, ip)) = placed.iter().find(|(_, ip)| ip.is_ipv6())
    {
        return Err(Denial::new(
            Rule::AddressIndex,
            format!(
                "EgressGateway {name}: egressIPs[{index}] {ip} is IPv6, and {platform} attaches only IPv4 egress IPs (alias IP ranges are IPv4 only); use IPv4 addresses"
            ),
        ));
    }

    for &(index, ip) in &added {
        check_node_ip(name, index, ip, cluster)?;
    }

    if !placed.is_empty() {
        check_placement(name, placed, &selector, cluster, platform, warnings)?;
    }

    for &(index, ip) in &added {
        check_claims(name, index, ip, cluster)?;
    }
    Ok(())
}

/// Egress IP number `index`, `text`, is the canonical spelling of a usable unicast IP.
fn check_spelling(name: &str, index: usize, text: &str) -> Result<IpAddr, Denial> {
    let deny = |detail: String| {
        Denial::new(
            Rule::GatewayIp,
            format!("EgressGateway {name}: egressIPs[{index}] {detail}"),
        )
    };
    let Ok(ip) = text.parse::<IpAddr>() else {
        // Another spelling of an IP (leading zeros, the CloudPrivateIPConfig name's dotted
        // IPv6) is named back in the spelling to use.
        let to_use = canonical_name(text)
            .and_then(|name| decode_name(&name))
            .map(|ip| format!("use {:?}", ip.to_string()))
            .unwrap_or_else(|_| {
                "write an IPv4 address such as \"10.0.0.5\" or an IPv6 address such as \"fc00::54\""
                    .into()
            });
        return Err(deny(format!(
            "{:?} is not an IP address in canonical form: {to_use}",
            excerpt(text)
        )));
    };
    match encode_name(ip) {
        Ok(_) => {}
        Err(NameError::Ipv4Mapped { ipv4, .. }) => {
            return Err(deny(format!(
                "{ip} is an IPv4-mapped IPv6 address, a second spelling of an IPv4 address: use {ipv4:?}"
            )));
        }
        Err(NameError::Unusable { kind, .. }) => {
            return Err(deny(format!(
                "{ip} is {kind}, which cannot be an egress IP: use a unicast address of the nodes' subnet"
            )));
        }
        Err(error) => return Err(deny(format!("{ip}: {error}"))),
    }
    let canonical = ip.to_string();
    if canonical != text {
        return Err(deny(format!(
            "{text:?} is not canonical: use {canonical:?}"
        )));
    }
    Ok(ip)
}

/// Rule 3 for a gateway's IP: no node's own address, on any node, unless a CloudPrivateIPConfig
/// manages it (the cloud lists egress IPs among a node's addresses too).
fn check_node_ip(
    name: &str,
    index: usize,
    ip: IpAddr,
    cluster: &ClusterSnapshot,
) -> Result<(), Denial> {
    let managed = encode_name(ip).is_ok_and(|object| cluster.is_managed(&object));
    match cluster.node_with_address(ip) {
        Some(node) if !managed => Err(Denial::new(
            Rule::NodeIp,
            format!(
                "EgressGateway {name}: egressIPs[{index}] {ip} is an address of node {node} (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must never be moved or detached; pick an unused address of the nodes' subnet"
            ),
        )),
        _ => Ok(()),
    }
}

/// Rule 4 for each of `ips` on every annotated node the selector picks; warnings for what
/// cannot be checked.
fn check_placement(
    name: &str,
    ips: &[(usize, IpAddr)],
    selector: &Selector,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
    warnings: &mut Vec<String>,
) -> Result<(), Denial> {
    let object = format!("EgressGateway {name}");
    let Some(picked) = picked(cluster, selector, &object, &SKIPPED, warnings) else {
        return Ok(());
    };
    let Some(platform) = platform else {
        return Ok(());
    };
    for (node, config) in picked.annotated {
        for &(index, ip) in ips {
            if let Some(problem) = misplaced(ip, &config.ifaddr, platform) {
                return Err(Denial::new(
                    Rule::AddressIndex,
                    format!(
                        "EgressGateway {name}: egressIPs[{index}] {ip} cannot be attached by {platform} to node {node} that the nodeSelector picks: {}",
                        misplaced_detail(ip, &problem, platform)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// What the node checks of a gateway skip without the nodes' annotations.
const SKIPPED: Skipped = Skipped {
    all: "the subnet checks",
    some: "the subnet check skipped them",
    later: LATER,
};

/// What happens to a gateway admitted without the node checks.
const LATER: &str = "the reconciler checks each IP against the active node's annotation before it attaches it, and reports a refusal in the gateway's Ready condition";

/// Why `ip` cannot go on the node, and what to change in the gateway.
fn misplaced_detail(ip: IpAddr, problem: &Misplaced, platform: Platform) -> String {
    match problem {
        Misplaced::NoSubnet(family) => format!(
            "the node has no {family} subnet (annotation {EGRESS_IPCONFIG_ANNOTATION} lists none); use addresses of the family the nodes have, or narrow the nodeSelector to nodes with an {family} subnet"
        ),
        Misplaced::Outside(subnet) => format!(
            "it is outside the node's subnet {subnet}, and the cloud only attaches addresses of the NIC's own subnet; pick an address in {subnet}, or narrow the nodeSelector to nodes of the subnet of {ip}"
        ),
        Misplaced::Reserved(subnet, reason) => format!(
            "it is {reason} in subnet {subnet} ({}); pick another address in {subnet}",
            reserved_summary(platform, ip.is_ipv6())
        ),
    }
}

/// No one else holds `ip`: another gateway, an opted-in Antrea pool, or a CloudPrivateIPConfig
/// that is not the one the reconciler keeps for this gateway.
fn check_claims(
    name: &str,
    index: usize,
    ip: IpAddr,
    cluster: &ClusterSnapshot,
) -> Result<(), Denial> {
    let deny = |detail: String| {
        Denial::new(
            Rule::GatewayConflict,
            format!("EgressGateway {name}: egressIPs[{index}] {ip} {detail}"),
        )
    };
    if let Some(other) = cluster.gateways().other_claiming(ip, name) {
        return Err(deny(format!(
            "is an egress IP of EgressGateway {other} already, and an egress IP has one gateway; pick another address, or remove {ip} from {other} first"
        )));
    }
    if let Some(pool) = cluster.antrea_pool_containing(ip) {
        return Err(deny(format!(
            "lies in Antrea ExternalIPPool {pool}, whose IPs cloudnet attaches for Antrea's Egresses; pick an address outside the pool's ranges, or take it out of the pool first"
        )));
    }
    let Ok(object) = encode_name(ip) else {
        return Ok(());
    };
    if cluster.has_object(&object) && cluster.object_gateway(&object) != Some(name) {
        let held = match cluster.object_node(&object) {
            Some(node) => format!("CloudPrivateIPConfig {object}, on node {node},"),
            None => format!("CloudPrivateIPConfig {object}"),
        };
        return Err(deny(format!(
            "is held by {held} which is not this gateway's (a network plugin's, an admin's or another front end's); pick another address, or delete that CloudPrivateIPConfig first"
        )));
    }
    Ok(())
}

/// The CloudPrivateIPConfig side of the claims: a CREATE of object `name` whose IP a gateway
/// lists is refused unless the object carries the gateway front end's label
/// (`front_end` is its `cloudnet.io/front-end` label), so the reconciler never finds another's
/// object where it keeps a gateway's IP. Other operations, and names that are no canonical IP
/// (rule 1 refuses them), pass.
pub fn check_object_claim(
    operation: Operation,
    name: &str,
    front_end: Option<&str>,
    cluster: &ClusterSnapshot,
) -> Result<(), Denial> {
    if operation != Operation::Create || front_end == Some(FRONT_END) {
        return Ok(());
    }
    let Ok(ip) = decode_name(name) else {
        return Ok(());
    };
    match cluster.gateways().claiming(ip) {
        None => Ok(()),
        Some(gateway) => Err(Denial::new(
            Rule::GatewayConflict,
            format!(
                "cannot create CloudPrivateIPConfig {name}: {ip} is an egress IP of EgressGateway {gateway}, whose CloudPrivateIPConfigs cloudnet's reconciler creates (label {FRONT_END_LABEL}={FRONT_END}); pick another address, or remove {ip} from EgressGateway {gateway} first"
            ),
        )),
    }
}
