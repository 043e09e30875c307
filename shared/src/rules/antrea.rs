//! Admission of Antrea's objects (docs/plugins/antrea.md, "Admission"): an opted-in
//! `ExternalIPPool` whose ranges the cloud cannot attach, and an `Egress` whose IP lies outside
//! its opted-in pool.
//!
//! A pool is checked with the CloudPrivateIPConfig rules, read for a range instead of one IP:
//!
//! * **family** (`address_index`): IPv6 ranges on a cloud that attaches IPv4 only;
//! * **node IP** (`node_ip`): a range holding a node's own address (`status.addresses`) that no
//!   CloudPrivateIPConfig manages, on any node: Antrea could hand it to an Egress;
//! * **subnet** (`address_index`): each end of a range must be attachable to every annotated
//!   node the pool's `nodeSelector` picks (inside its subnet, off the reserved indices; the
//!   cloud's reserved indices sit at the subnet's edges, so the two ends decide for the range);
//! * **capacity** (`capacity`): the pool holds no more addresses than the picked nodes can hold
//!   between them, per bucket of the node annotation as rule 5 reads it.
//!
//! Nothing is refused on what cannot be verified: a node without a readable annotation is left
//! out of the subnet check and makes the capacity check skip, with an admission warning, and a
//! selector that picks no node yet admits the pool with a warning. Each Egress IP is still
//! checked on its own node when cloudnet creates its CloudPrivateIPConfig.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kube::core::Selector;

use super::address_index::{Misplaced, misplaced};
use super::picked::{Picked, Skipped, picked};
use super::{ClusterSnapshot, Denial, Operation, Rule, Verdict, reviewable};
use crate::annotation::{Capacity, EGRESS_IPCONFIG_ANNOTATION};
use crate::antrea::{EgressSpec, ExternalIPPool, IpRange};
use crate::codec::encode_name;
use crate::platform::{Bucket, CapacityModel, Platform, bucket_for, reserved_summary};

/// The admission decision for an `ExternalIPPool` (`name`, after the operation `new`, before it
/// `old`). Pools without the opt-in label are always admitted: they are none of cloudnet's
/// business, and removing the label must never be refused.
///
/// On an UPDATE of a pool that was opted in already and keeps its nodeSelector, only the ranges
/// it adds are checked, and capacity only when it grows: a pool once admitted is never held
/// back by nodes that changed since.
pub fn review_pool(
    operation: Operation,
    name: &str,
    new: Option<&ExternalIPPool>,
    old: Option<&ExternalIPPool>,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Verdict {
    let subject = format!(" for ExternalIPPool {name}");
    let new = match reviewable(operation, new, &subject, "ExternalIPPool") {
        Ok(new) => new,
        Err(verdict) => return verdict,
    };
    if !new.opted_in() {
        return Verdict::allow();
    }
    // The ranges and selector already admitted, when the pool was opted in before.
    let before = old.filter(|old| operation == Operation::Update && old.opted_in());
    if before.is_some_and(|old| {
        old.spec.ip_ranges == new.spec.ip_ranges && old.spec.node_selector == new.spec.node_selector
    }) {
        return Verdict::allow();
    }
    let mut verdict = Verdict::allow();
    if let Err(denial) = check_pool(name, new, before, cluster, platform, &mut verdict.warnings) {
        verdict.denial = Some(denial);
    }
    verdict
}

fn check_pool(
    name: &str,
    pool: &ExternalIPPool,
    before: Option<&ExternalIPPool>,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
    warnings: &mut Vec<String>,
) -> Result<(), Denial> {
    let ranges = pool.ranges().map_err(|error| {
        Denial::new(
            Rule::BadInput,
            format!(
                "ExternalIPPool {name}: {error}; give each of spec.ipRanges a cidr, or a start and an end of one family"
            ),
        )
    })?;
    let selector = Selector::try_from(pool.spec.node_selector.clone()).map_err(|error| {
        Denial::new(
            Rule::BadInput,
            format!(
                "ExternalIPPool {name}: spec.nodeSelector cannot be read ({error}); write it as a Kubernetes label selector"
            ),
        )
    })?;
    let same_nodes = before.is_some_and(|old| old.spec.node_selector == pool.spec.node_selector);
    // Each range with its index and its spelling, as the admin wrote it.
    let checked: Vec<(usize, &IpRange, (IpAddr, IpAddr))> = pool
        .spec
        .ip_ranges
        .iter()
        .zip(ranges.iter().copied())
        .enumerate()
        .map(|(index, (range, bounds))| (index, range, bounds))
        .filter(|(_, range, _)| {
            !(same_nodes && before.is_some_and(|old| old.spec.ip_ranges.contains(range)))
        })
        .collect();

    if let Some(platform) = platform {
        for &(index, range, (first, _)) in &checked {
            if first.is_ipv6() && !platform.supports_ipv6() {
                return Err(Denial::new(
                    Rule::AddressIndex,
                    format!(
                        "ExternalIPPool {name}: ipRanges[{index}] ({}) is IPv6, and {platform} attaches only IPv4 egress IPs (alias IP ranges are IPv4 only); use IPv4 ranges",
                        spelled(range)
                    ),
                ));
            }
        }
    }

    for &(index, range, (first, last)) in &checked {
        let managed = |ip: IpAddr| encode_name(ip).is_ok_and(|name| cluster.is_managed(&name));
        if let Some((ip, node)) = cluster.node_address_in(first, last, managed) {
            return Err(Denial::new(
                Rule::NodeIp,
                format!(
                    "ExternalIPPool {name}: ipRanges[{index}] ({}) holds {ip}, an address of node {node} (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must never be moved or detached; leave {ip} out of the pool's ranges",
                    spelled(range)
                ),
            ));
        }
    }

    let object = format!("ExternalIPPool {name}");
    let Some(Picked {
        annotated,
        complete,
    }) = picked(cluster, &selector, &object, &SKIPPED, warnings)
    else {
        return Ok(());
    };

    if let Some(platform) = platform {
        for &(index, range, (first, last)) in &checked {
            for &(node, config) in &annotated {
                for ip in [first, last] {
                    if let Some(problem) = misplaced(ip, &config.ifaddr, platform) {
                        return Err(Denial::new(
                            Rule::AddressIndex,
                            format!(
                                "ExternalIPPool {name}: ipRanges[{index}] ({}) reaches {ip}, which {platform} cannot attach to node {node} that the nodeSelector picks: {}",
                                spelled(range),
                                misplaced_detail(ip, &problem, platform)
                            ),
                        ));
                    }
                }
            }
        }
    }

    let grew = before.is_none_or(|old| {
        !same_nodes
            || old
                .ranges()
                .map_or(true, |old| count(&old) < count(&ranges))
    });
    if complete && grew {
        check_pool_capacity(name, &ranges, &annotated, platform)?;
    }
    Ok(())
}

/// What the node checks of a pool skip without the nodes' annotations.
const SKIPPED: Skipped = Skipped {
    all: "the subnet and capacity checks",
    some: "the subnet check skipped them and the capacity check was skipped",
    later: LATER,
};

/// What happens to a pool admitted without the node checks.
const LATER: &str = "each of its IPs is still checked on its node when cloudnet creates the IP's CloudPrivateIPConfig, and a refusal shows in the controller's log";

/// The capacity check of a pool over the annotated nodes its selector picks (all of them).
fn check_pool_capacity(
    name: &str,
    ranges: &[(IpAddr, IpAddr)],
    nodes: &[(&str, &crate::annotation::EgressIpConfig)],
    platform: Option<Platform>,
) -> Result<(), Denial> {
    let Some(&(_, first_config)) = nodes.first() else {
        return Ok(());
    };
    // The buckets as rule 5 reads them: the cloud's model, else the first node's keys.
    let buckets = match platform.map(Platform::capacity_model) {
        Some(CapacityModel::PerFamily) => [Bucket::Ipv4, Bucket::Ipv6],
        Some(CapacityModel::Shared) => [Bucket::Ip, Bucket::Ip],
        None => [
            bucket_for(
                None,
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                &first_config.capacity,
            ),
            bucket_for(
                None,
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                &first_config.capacity,
            ),
        ],
    };
    let mut demand: Vec<(Bucket, u128)> = Vec::new();
    for &(first, last) in ranges {
        let bucket = buckets[usize::from(first.is_ipv6())];
        let size = size(first, last);
        match demand.iter_mut().find(|(b, _)| *b == bucket) {
            Some((_, total)) => *total = total.saturating_add(size),
            None => demand.push((bucket, size)),
        }
    }
    for (bucket, wanted) in demand {
        let Some(room) = room(nodes.iter().map(|(_, config)| &config.capacity), bucket) else {
            // A node without the key is unlimited in that bucket, as it is to rule 5.
            continue;
        };
        if wanted > room {
            return Err(Denial::new(
                Rule::Capacity,
                format!(
                    "ExternalIPPool {name} holds {wanted} {}addresses, but the {} nodes its nodeSelector picks can hold {room} egress IPs between them (capacity \"{bucket}\" in annotation {EGRESS_IPCONFIG_ANNOTATION}); shrink spec.ipRanges to at most {room} addresses, or select more nodes",
                    family(bucket),
                    nodes.len()
                ),
            ));
        }
    }
    Ok(())
}

/// The sum of `bucket` over `capacities` (a negative value counts as none); `None` when one of
/// them has no such key (unlimited).
fn room<'a>(capacities: impl Iterator<Item = &'a Capacity>, bucket: Bucket) -> Option<u128> {
    capacities
        .map(|capacity| capacity.get(bucket).map(|n| u128::try_from(n).unwrap_or(0)))
        .try_fold(0u128, |sum, n| n.map(|n| sum.saturating_add(n)))
}

/// The addresses in `first..=last`, saturating.
fn size(first: IpAddr, last: IpAddr) -> u128 {
    let number = |ip: IpAddr| match ip {
        IpAddr::V4(ip) => u128::from(u32::from(ip)),
        IpAddr::V6(ip) => u128::from(ip),
    };
    number(last).saturating_sub(number(first)).saturating_add(1)
}

/// The addresses of all `ranges` together.
fn count(ranges: &[(IpAddr, IpAddr)]) -> u128 {
    ranges.iter().fold(0, |sum, &(first, last)| {
        sum.saturating_add(size(first, last))
    })
}

/// The family word of a bucket, for messages.
const fn family(bucket: Bucket) -> &'static str {
    match bucket {
        Bucket::Ipv4 => "IPv4 ",
        Bucket::Ipv6 => "IPv6 ",
        Bucket::Ip => "",
    }
}

/// Why `ip` cannot go on the node, and what to change in the pool.
fn misplaced_detail(ip: IpAddr, problem: &Misplaced, platform: Platform) -> String {
    match problem {
        Misplaced::NoSubnet(family) => format!(
            "the node has no {family} subnet (annotation {EGRESS_IPCONFIG_ANNOTATION} lists none); use ranges of the family the nodes have, or narrow the nodeSelector to nodes with an {family} subnet"
        ),
        Misplaced::Outside(subnet) => format!(
            "it is outside the node's subnet {subnet}, and the cloud only attaches addresses of the NIC's own subnet; keep the range inside {subnet}, or narrow the nodeSelector to nodes of the range's subnet"
        ),
        Misplaced::Reserved(subnet, reason) => format!(
            "it is {reason} in subnet {subnet} ({}); leave it out of the range",
            reserved_summary(platform, ip.is_ipv6())
        ),
    }
}

/// A range as the admin wrote it.
fn spelled(range: &IpRange) -> String {
    if range.cidr.is_empty() {
        format!("{}-{}", range.start, range.end)
    } else {
        range.cidr.clone()
    }
}

/// The admission decision for an `Egress` (`name`): each static IP it names (`spec.egressIP`
/// with `spec.externalIPPool`, each of `spec.egressIPs` with the pool of the same index) must
/// lie in its pool when `pool` finds that pool opted in. An IP without a pool, of a pool that is
/// not opted in (or not known), or that is no IP (Antrea's schema refuses it) is Antrea's
/// business alone. An UPDATE that keeps every IP and pool passes.
pub fn review_egress<'p>(
    operation: Operation,
    name: &str,
    new: Option<&EgressSpec>,
    old: Option<&EgressSpec>,
    pool: impl Fn(&str) -> Option<&'p ExternalIPPool>,
) -> Verdict {
    let subject = format!(" for Egress {name}");
    let new = match reviewable(operation, new, &subject, "Egress") {
        Ok(new) => new,
        Err(verdict) => return verdict,
    };
    if operation == Operation::Update && old.is_some_and(|old| static_ips(old) == static_ips(new)) {
        return Verdict::allow();
    }
    for (field, text, pool_name) in static_ips(new) {
        let (Ok(ip), Some(pool)) = (text.parse::<IpAddr>(), pool(pool_name)) else {
            continue;
        };
        if pool.contains(ip) {
            continue;
        }
        let ranges = pool
            .spec
            .ip_ranges
            .iter()
            .map(spelled)
            .collect::<Vec<_>>()
            .join(", ");
        return Verdict::deny(
            Rule::AntreaEgressIp,
            format!(
                "Egress {name}: {field} {ip} is outside ExternalIPPool {pool_name} ({ranges}), whose IPs cloudnet attaches; pick an address in the pool's ranges, or leave the IP empty for Antrea to allocate one"
            ),
        );
    }
    Verdict::allow()
}

/// Each IP an Egress's spec names, with its field and its pool.
fn static_ips(spec: &EgressSpec) -> Vec<(String, &str, &str)> {
    let mut ips = Vec::new();
    if !spec.egress_ip.is_empty() {
        ips.push((
            "spec.egressIP".to_owned(),
            spec.egress_ip.as_str(),
            spec.external_ip_pool.as_str(),
        ));
    }
    for (index, ip) in spec.egress_ips.iter().enumerate() {
        let pool = spec.external_ip_pools.get(index).map_or("", String::as_str);
        ips.push((format!("spec.egressIPs[{index}]"), ip.as_str(), pool));
    }
    ips
}
