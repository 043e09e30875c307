//! The address checks both egress-router forms share: an address in CIDR form that a router
//! can hold, and a gateway inside its network.

use std::net::IpAddr;

use crate::egress::{Cidr, parse_cidr};

/// Checks the address at `field` (e.g. `spec.addresses[0].ip`); `Err` holds the message's
/// detail (what is wrong; the fix).
pub fn check_cidr_address(field: &str, text: &str) -> Result<Cidr, String> {
    let Some(cidr) = parse_cidr(text) else {
        if let Ok(ip) = text.trim().parse::<IpAddr>() {
            let len = if ip.is_ipv4() { 24 } else { 64 };
            return Err(format!(
                "{field} {text:?} has no prefix length; write it in CIDR form with its network's prefix length, e.g. \"{ip}/{len}\""
            ));
        }
        return Err(format!(
            "{field} {text:?} is no address in CIDR form; write it as <address>/<prefix length>, e.g. \"192.168.3.10/24\""
        ));
    };
    if let Some(why) = unusable(cidr.ip) {
        return Err(format!(
            "{field} {text:?} is {why}, which cannot be a router's address; use a unicast address of the router's network"
        ));
    }
    Ok(cidr)
}

/// Checks `gateway` at `field` against the addresses it serves: an IP inside the network of
/// one of them (of its family), and none of the addresses themselves.
pub fn check_gateway(
    field: &str,
    gateway: &str,
    addresses: &[(String, Cidr)],
) -> Result<(), String> {
    let Ok(ip) = gateway.parse::<IpAddr>() else {
        return Err(format!(
            "{field} {gateway:?} is no IP address; set the next hop's IP, or leave {field} out to have it inferred"
        ));
    };
    if let Some((address_field, _)) = addresses.iter().find(|(_, cidr)| cidr.ip == ip) {
        return Err(format!(
            "{field} {ip} is the router's own address ({address_field}); set the next hop's IP, another address of that network"
        ));
    }
    if addresses.is_empty() || addresses.iter().any(|(_, cidr)| cidr.net.contains(&ip)) {
        return Ok(());
    }
    let networks: Vec<String> = addresses
        .iter()
        .map(|(address_field, cidr)| {
            format!(
                "{} ({address_field} {}/{})",
                cidr.net.trunc(),
                cidr.ip,
                cidr.net.prefix_len()
            )
        })
        .collect();
    Err(format!(
        "{field} {ip} is outside {}; use a gateway inside the address's network, or correct the address's prefix length",
        networks.join(" and ")
    ))
}

/// Why `ip` cannot be an interface's unicast address, if it cannot.
fn unusable(ip: IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("the unspecified address")
    } else if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()) {
        Some("the broadcast address")
    } else {
        None
    }
}
