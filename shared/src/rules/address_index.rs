//! Rule 4: the IP lies in the node's subnet of its family, off the cloud-reserved indices.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{Denial, Rule, cannot_place};
use crate::annotation::{EGRESS_IPCONFIG_ANNOTATION, IfAddr};
use crate::platform::{Platform, reserved_index, reserved_summary};

/// Refuses a family the cloud cannot attach at all (IPv6 on GCP).
pub fn check_family_supported(ip: IpAddr, node: &str, platform: Platform) -> Result<(), Denial> {
    if ip.is_ipv4() || platform.supports_ipv6() {
        return Ok(());
    }
    Err(Denial::new(
        Rule::AddressIndex,
        format!(
            "{}: {platform} attaches only IPv4 egress IPs (alias IP ranges are IPv4 only); use an IPv4 address of the node's subnet",
            cannot_place(ip, node)
        ),
    ))
}

/// Why the cloud cannot attach an address to a node's interface, the subnet of its family in
/// hand: the one reading of rule 4, which the CloudPrivateIPConfig rule and the Antrea pool rule
/// (`antrea.rs`) word each for its own object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Misplaced {
    /// The node has no subnet of the address's family (`"IPv4"` or `"IPv6"`).
    NoSubnet(&'static str),
    /// The address is outside the node's subnet.
    Outside(IpNet),
    /// The address is one the cloud reserves in the subnet, and why.
    Reserved(IpNet, &'static str),
}

/// Whether `ip` cannot be a secondary address of the interface whose subnets are `ifaddr` on
/// `platform` (the family check is [`check_family_supported`]'s).
pub(crate) fn misplaced(ip: IpAddr, ifaddr: &IfAddr, platform: Platform) -> Option<Misplaced> {
    let (subnet, family) = match ip {
        IpAddr::V4(_) => (ifaddr.ipv4.map(IpNet::V4), "IPv4"),
        IpAddr::V6(_) => (ifaddr.ipv6.map(IpNet::V6), "IPv6"),
    };
    let Some(subnet) = subnet else {
        return Some(Misplaced::NoSubnet(family));
    };
    if !subnet.contains(&ip) {
        return Some(Misplaced::Outside(subnet));
    }
    reserved_index(platform, subnet, ip).map(|reason| Misplaced::Reserved(subnet, reason))
}

/// Refuses `ip` unless it is a usable secondary address of the node's subnet `ifaddr` on `platform`.
pub fn check_address_index(
    ip: IpAddr,
    node: &str,
    ifaddr: &IfAddr,
    platform: Platform,
) -> Result<(), Denial> {
    check_family_supported(ip, node, platform)?;
    let detail = match misplaced(ip, ifaddr, platform) {
        None => return Ok(()),
        Some(Misplaced::NoSubnet(family)) => format!(
            "the node has no {family} subnet (annotation {EGRESS_IPCONFIG_ANNOTATION} lists none); pick a node with an {family} subnet, or an address of the family the node has"
        ),
        Some(Misplaced::Outside(subnet)) => format!(
            "{ip} is outside the node's subnet {subnet}, and the cloud only attaches addresses of the NIC's own subnet; pick an address in {subnet}, or a node in the subnet of {ip}"
        ),
        Some(Misplaced::Reserved(subnet, reason)) => format!(
            "{ip} is {reason} in subnet {subnet} ({}); pick another address in {subnet}",
            reserved_summary(platform, ip.is_ipv6())
        ),
    };
    Err(Denial::new(
        Rule::AddressIndex,
        format!("{}: {detail}", cannot_place(ip, node)),
    ))
}
