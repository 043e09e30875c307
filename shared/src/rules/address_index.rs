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

/// Refuses `ip` unless it is a usable secondary address of the node's subnet `ifaddr` on `platform`.
pub fn check_address_index(
    ip: IpAddr,
    node: &str,
    ifaddr: &IfAddr,
    platform: Platform,
) -> Result<(), Denial> {
    check_family_supported(ip, node, platform)?;
    let deny = |detail: String| {
        Denial::new(
            Rule::AddressIndex,
            format!("{}: {detail}", cannot_place(ip, node)),
        )
    };
    let (subnet, family) = match ip {
        IpAddr::V4(_) => (ifaddr.ipv4.map(IpNet::V4), "IPv4"),
        IpAddr::V6(_) => (ifaddr.ipv6.map(IpNet::V6), "IPv6"),
    };
    let Some(subnet) = subnet else {
        return Err(deny(format!(
            "the node has no {family} subnet (annotation {EGRESS_IPCONFIG_ANNOTATION} lists none); pick a node with an {family} subnet, or an address of the family the node has"
        )));
    };
    if !subnet.contains(&ip) {
        return Err(deny(format!(
            "{ip} is outside the node's subnet {subnet}, and the cloud only attaches addresses of the NIC's own subnet; pick an address in {subnet}, or a node in the subnet of {ip}"
        )));
    }
    if let Some(reason) = reserved_index(platform, subnet, ip) {
        return Err(deny(format!(
            "{ip} is {reason} in subnet {subnet} ({}); pick another address in {subnet}",
            reserved_summary(platform, ip.is_ipv6())
        )));
    }
    Ok(())
}
