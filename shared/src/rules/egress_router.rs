//! The EgressRouter rules: what `spec` must say for the network operator to build a working
//! router (openshift/api `networkoperator/v1`), plus the cross-object rule on its addresses.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::egress::{
    EgressRouterSpec, L4RedirectRule, Protocol, RouterRef, parse_cidr, valid_interface_name,
};

use super::router_addresses::{check_cidr_address, check_gateway};
use super::router_conflict::check_router_addresses;
use super::{ClusterSnapshot, Denial, Operation, Rule, Verdict};

/// The only mode of `spec.mode`.
pub const MODE_REDIRECT: &str = "Redirect";
/// The macvlan modes of `spec.networkInterface.macvlan.mode`, as the CRD's enum spells them.
pub const MACVLAN_MODES: [&str; 4] = ["Bridge", "Private", "VEPA", "Passthru"];

/// Checks an EgressRouter's spec on its own; returns its addresses (without prefix length).
pub fn check_egress_router(
    object: &RouterRef,
    spec: &EgressRouterSpec,
) -> Result<Vec<IpAddr>, Denial> {
    let deny = |rule, detail: String| Denial::new(rule, format!("{object}: {detail}"));
    if let Some(mode) = spec.mode.as_deref()
        && mode != MODE_REDIRECT
    {
        return Err(deny(
            Rule::EgressRouterMode,
            format!(
                "spec.mode is {mode:?}, but {MODE_REDIRECT} is the only mode; set spec.mode to {MODE_REDIRECT} (or leave it out)"
            ),
        ));
    }
    check_interface(spec).map_err(|d| deny(Rule::EgressRouterInterface, d))?;
    let addresses = check_addresses(spec).map_err(|d| deny(Rule::EgressRouterAddress, d))?;
    check_redirect(spec).map_err(|d| deny(Rule::EgressRouterRedirect, d))?;
    Ok(addresses)
}

/// The whole decision for one EgressRouter request: the spec rules, then the cross-object rule
/// for the addresses the request adds (on UPDATE, addresses the old object already had are not
/// checked again, so a router is never stuck by what appeared after it).
pub fn review_egress_router(
    operation: Operation,
    object: &RouterRef,
    new: Option<&EgressRouterSpec>,
    old: Option<&EgressRouterSpec>,
    cluster: &ClusterSnapshot,
) -> Verdict {
    let new = match super::reviewable(operation, new, &format!(" for {object}"), "EgressRouter") {
        Ok(new) => new,
        Err(verdict) => return verdict,
    };
    if operation == Operation::Update && old == Some(new) {
        // Metadata-only update (finalizers, labels, status): never block it.
        return Verdict::allow();
    }
    let addresses = match check_egress_router(object, new) {
        Ok(addresses) => addresses,
        Err(denial) => return denial.into(),
    };
    let before = match (operation, old) {
        (Operation::Update, Some(old)) => spec_addresses(old),
        _ => Vec::new(),
    };
    match check_router_addresses(object, object, &addresses, &before, cluster) {
        Ok(()) => Verdict::allow(),
        Err(denial) => denial.into(),
    }
}

/// The addresses an EgressRouter lists, skipping unreadable ones: what the index records.
pub fn spec_addresses(spec: &EgressRouterSpec) -> Vec<IpAddr> {
    spec.addresses
        .iter()
        .flatten()
        .filter_map(|address| parse_cidr(address.ip.as_deref()?))
        .map(|cidr| cidr.ip)
        .collect()
}

fn check_interface(spec: &EgressRouterSpec) -> Result<(), String> {
    let Some(macvlan) = spec
        .network_interface
        .as_ref()
        .and_then(|i| i.macvlan.as_ref())
    else {
        return Ok(());
    };
    if let Some(mode) = macvlan.mode.as_deref()
        && !MACVLAN_MODES.contains(&mode)
    {
        return Err(format!(
            "spec.networkInterface.macvlan.mode is {mode:?}, which is not one of {}; use one of them (Bridge is the default)",
            MACVLAN_MODES.join(", ")
        ));
    }
    if let Some(master) = macvlan.master.as_deref()
        && !master.is_empty()
        && !valid_interface_name(master)
    {
        return Err(format!(
            "spec.networkInterface.macvlan.master {master:?} is no Linux interface name (1-15 characters, no '/', ':' or whitespace); name the node's interface, or leave master out to infer it from the address"
        ));
    }
    Ok(())
}

fn check_addresses(spec: &EgressRouterSpec) -> Result<Vec<IpAddr>, String> {
    let list = spec.addresses.as_deref().unwrap_or_default();
    if list.is_empty() {
        return Err(
            "spec.addresses lists no address; add at least one {ip: <address>/<prefix length>, gateway: <next hop>}".into(),
        );
    }
    let mut seen: HashMap<IpAddr, usize> = HashMap::new();
    let mut ips = Vec::with_capacity(list.len());
    for (i, address) in list.iter().enumerate() {
        let field = format!("spec.addresses[{i}].ip");
        let Some(text) = address.ip.as_deref().filter(|t| !t.is_empty()) else {
            return Err(format!(
                "spec.addresses[{i}] has no ip; set ip to the router's address in CIDR form, e.g. \"192.168.3.10/24\""
            ));
        };
        let cidr = check_cidr_address(&field, text)?;
        if let Some(first) = seen.insert(cidr.ip, i) {
            return Err(format!(
                "{field} {} repeats spec.addresses[{first}]; list each address once",
                cidr.ip
            ));
        }
        if let Some(gateway) = address.gateway.as_deref().filter(|g| !g.is_empty()) {
            check_gateway(
                &format!("spec.addresses[{i}].gateway"),
                gateway,
                &[(field, cidr)],
            )?;
        }
        ips.push(cidr.ip);
    }
    Ok(ips)
}

fn check_redirect(spec: &EgressRouterSpec) -> Result<(), String> {
    let Some(redirect) = spec.redirect.as_ref() else {
        return Err(
            "spec.redirect is missing, and Redirect mode needs it; add spec.redirect with redirectRules or a fallbackIP".into(),
        );
    };
    let rules = redirect.redirect_rules.as_deref().unwrap_or_default();
    let fallback = redirect.fallback_ip.as_deref().filter(|f| !f.is_empty());
    if rules.is_empty() && fallback.is_none() {
        return Err(
            "spec.redirect has neither redirectRules nor a fallbackIP, so the router would forward nothing; add a redirect rule or set fallbackIP".into(),
        );
    }
    let mut ports: HashMap<(i64, Protocol), usize> = HashMap::new();
    for (i, rule) in rules.iter().enumerate() {
        let (port, protocol) = check_rule(i, rule)?;
        if let Some(first) = ports.insert((port, protocol), i) {
            return Err(format!(
                "spec.redirect.redirectRules[{i}] redirects {} port {port} again (redirectRules[{first}] already does); keep one rule per port and protocol",
                protocol.as_str()
            ));
        }
    }
    if let Some(fallback) = fallback
        && fallback.parse::<IpAddr>().is_err()
    {
        return Err(format!(
            "spec.redirect.fallbackIP {fallback:?} is no IP address; set the IP that traffic no rule matches goes to, or leave fallbackIP out"
        ));
    }
    Ok(())
}

fn check_rule(i: usize, rule: &L4RedirectRule) -> Result<(i64, Protocol), String> {
    let field = format!("spec.redirect.redirectRules[{i}]");
    let destination = rule.destination_ip.as_deref().unwrap_or_default();
    if destination.parse::<IpAddr>().is_err() {
        return Err(format!(
            "{field}.destinationIP {destination:?} is no IP address; set the remote destination's IP (IPv4 or IPv6, no prefix length)"
        ));
    }
    let protocol_text = rule.protocol.as_deref().unwrap_or_default();
    let Some(protocol) = Protocol::from_enum(protocol_text) else {
        return Err(format!(
            "{field}.protocol {protocol_text:?} is not TCP, UDP or SCTP; use one of them, in capitals"
        ));
    };
    let port = rule.port.unwrap_or_default();
    if !(1..=65535).contains(&port) {
        return Err(format!(
            "{field}.port {port} is not a port number (1-65535); set the port clients send to"
        ));
    }
    // 0 is Go's "unset" (omitempty): the rule then keeps `port`.
    if let Some(target) = rule.target_port
        && target != 0
        && !(1..=65535).contains(&target)
    {
        return Err(format!(
            "{field}.targetPort {target} is not a port number (1-65535); set the destination's port, or leave targetPort out to keep {port}"
        ));
    }
    Ok((port, protocol))
}
