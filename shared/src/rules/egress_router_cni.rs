//! The rules for an egress-router CNI configuration inside a NetworkAttachmentDefinition's
//! `spec.config` (openshift/egress-router-cni: `pkg/types/types.go` and its README).
//!
//! A configuration is an egress-router one when its `type`, or the `type` of an entry of its
//! `plugins` list (a conflist), is `egress-router`; anything else is not looked at.

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

use crate::egress::{
    Cidr, EGRESS_ROUTER_CNI_TYPE, EGRESS_ROUTER_GROUP, EGRESS_ROUTER_KIND, EgressRouterCniConfig,
    IpBlock, RouterRef, parse_cidr, parse_destination, valid_interface_name, valid_label,
    valid_pod_key, valid_subdomain,
};
use crate::platform::Platform;

use super::router_addresses::{check_cidr_address, check_gateway};
use super::router_conflict::check_router_addresses;
use super::{ClusterSnapshot, Denial, Operation, Rule, Verdict};

/// The interface types the plugin knows; `aws-elastic-ip` works on AWS only.
pub const INTERFACE_TYPES: [&str; 3] = ["macvlan", "ipvlan", "aws-elastic-ip"];
/// The kernel's macvlan modes, as the plugin spells them in `interfaceArgs.mode`.
pub const KERNEL_MACVLAN_MODES: [&str; 4] = ["bridge", "private", "vepa", "passthru"];

/// A checked egress-router configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckedConfig {
    /// Every static address it configures (`ip`, `podIP`, `ipConfig.overrides`).
    pub addresses: Vec<IpAddr>,
    /// Admission warnings.
    pub warnings: Vec<String>,
}

/// The egress-router plugin entries of a CNI configuration, with where each sits (`spec.config`
/// or `spec.config plugins[i]`); `None` when it has none (another plugin, or no JSON at all).
pub fn egress_router_entries(config: &str) -> Option<Vec<(String, Value)>> {
    // Cheap exit for the common case: most NetworkAttachmentDefinitions are not ours.
    if !config.contains(EGRESS_ROUTER_CNI_TYPE) {
        return None;
    }
    let Ok(Value::Object(mut top)) = serde_json::from_str::<Value>(config) else {
        return None;
    };
    let is_ours = |entry: &serde_json::Map<String, Value>| {
        entry.get("type").and_then(Value::as_str) == Some(EGRESS_ROUTER_CNI_TYPE)
    };
    if is_ours(&top) {
        return Some(vec![("spec.config".to_owned(), Value::Object(top))]);
    }
    let Some(Value::Array(plugins)) = top.remove("plugins") else {
        return None;
    };
    let entries: Vec<(String, Value)> = plugins
        .into_iter()
        .enumerate()
        .filter(|(_, plugin)| plugin.as_object().is_some_and(is_ours))
        .map(|(i, plugin)| (format!("spec.config plugins[{i}]"), plugin))
        .collect();
    (!entries.is_empty()).then_some(entries)
}

/// Checks `config`; `None` when it is no egress-router configuration.
pub fn check_cni_config(
    object: &RouterRef,
    config: &str,
    platform: Option<Platform>,
) -> Option<Result<CheckedConfig, Denial>> {
    let entries = egress_router_entries(config)?;
    let mut checked = CheckedConfig::default();
    for (place, entry) in entries {
        let deny = |rule, detail: String| Denial::new(rule, format!("{object}: {place}: {detail}"));
        let parsed: EgressRouterCniConfig = match serde_json::from_value(entry) {
            Ok(parsed) => parsed,
            Err(error) => {
                return Some(Err(deny(
                    Rule::EgressRouterCni,
                    format!(
                        "the egress-router configuration is not what the plugin reads ({error}); write addresses and destinations as lists of strings, gateway and interfaceArgs values as strings, podIP as an object"
                    ),
                )));
            }
        };
        if let Err((rule, detail)) = check_entry(&parsed, platform, &mut checked) {
            return Some(Err(deny(rule, detail)));
        }
    }
    Some(Ok(checked))
}

/// The whole decision for one NetworkAttachmentDefinition request. Configurations that are not
/// egress-router ones are allowed untouched. `owner` is the EgressRouter controlling the object,
/// or the object itself (see [`router_owner`]).
pub fn review_nad(
    operation: Operation,
    object: &RouterRef,
    owner: &RouterRef,
    new_config: Option<&str>,
    old_config: Option<&str>,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Verdict {
    if matches!(operation, Operation::Delete | Operation::Connect) {
        return Verdict::allow();
    }
    let Some(new_config) = new_config else {
        return Verdict::allow();
    };
    if operation == Operation::Update && old_config == Some(new_config) {
        return Verdict::allow();
    }
    let checked = match check_cni_config(object, new_config, platform) {
        None => return Verdict::allow(),
        Some(Err(denial)) => return denial.into(),
        Some(Ok(checked)) => checked,
    };
    let before = match (operation, old_config) {
        (Operation::Update, Some(old)) => config_addresses(old),
        _ => Vec::new(),
    };
    let mut verdict =
        match check_router_addresses(object, owner, &checked.addresses, &before, cluster) {
            Ok(()) => Verdict::allow(),
            Err(denial) => denial.into(),
        };
    verdict.warnings = checked.warnings;
    verdict
}

/// The router a NetworkAttachmentDefinition belongs to: the EgressRouter named by its
/// controller reference (the network operator creates one per EgressRouter), else itself.
pub fn router_owner(namespace: &str, name: &str, owners: &[OwnerReference]) -> RouterRef {
    owners
        .iter()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == EGRESS_ROUTER_KIND
                && o.api_version.split('/').next() == Some(EGRESS_ROUTER_GROUP)
        })
        .map_or_else(
            || RouterRef::nad(namespace, name),
            |o| RouterRef::egress_router(namespace, &o.name),
        )
}

/// The static addresses of an egress-router configuration, skipping unreadable ones: what the
/// index records. Empty for any other configuration.
pub fn config_addresses(config: &str) -> Vec<IpAddr> {
    let Some(entries) = egress_router_entries(config) else {
        return Vec::new();
    };
    let mut ips = Vec::new();
    for (_, entry) in entries {
        let Ok(parsed) = serde_json::from_value::<EgressRouterCniConfig>(entry) else {
            continue;
        };
        let blocks = parsed
            .ip
            .iter()
            .chain(parsed.pod_ip.iter().flat_map(|m| m.values()))
            .chain(parsed.ip_config.iter().filter_map(|c| c.overrides.as_ref()));
        for block in blocks {
            ips.extend(
                block
                    .addresses
                    .iter()
                    .flatten()
                    .filter_map(|a| parse_cidr(a))
                    .map(|c| c.ip),
            );
        }
    }
    ips
}

type Refusal = (Rule, String);

fn check_entry(
    config: &EgressRouterCniConfig,
    platform: Option<Platform>,
    checked: &mut CheckedConfig,
) -> Result<(), Refusal> {
    let set: Vec<&str> = [
        ("ip", config.ip.is_some()),
        ("podIP", config.pod_ip.is_some()),
        ("ipConfig", config.ip_config.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, present)| present.then_some(name))
    .collect();
    match set.as_slice() {
        [] => {
            return Err((
                Rule::EgressRouterCni,
                "sets none of ip, podIP and ipConfig; set exactly one of them".into(),
            ));
        }
        [_] => {}
        several => {
            return Err((
                Rule::EgressRouterCni,
                format!(
                    "sets {}; set exactly one of ip, podIP and ipConfig",
                    several.join(" and ")
                ),
            ));
        }
    }
    check_interface(config, platform, checked).map_err(|d| (Rule::EgressRouterInterface, d))?;
    if let Some(block) = &config.ip {
        check_block("ip", block, true, checked)?;
    }
    if let Some(pods) = &config.pod_ip {
        if pods.is_empty() {
            return Err((
                Rule::EgressRouterCni,
                "podIP names no pod; add an entry per pod name (or name prefix ending in *), or use ip".into(),
            ));
        }
        for (key, block) in pods {
            if !valid_pod_key(key) {
                return Err((
                    Rule::EgressRouterCni,
                    format!(
                        "podIP key {key:?} is no pod name; use a pod's name (lowercase letters, digits, '-' and '.') or a name prefix followed by a single trailing *"
                    ),
                ));
            }
            check_block(&format!("podIP[{key:?}]"), block, true, checked)?;
        }
    }
    if let Some(ip_config) = &config.ip_config {
        let name = ip_config.name.as_deref().unwrap_or_default();
        if name.is_empty() {
            return Err((
                Rule::EgressRouterCni,
                "ipConfig.name is missing; name the ConfigMap that holds the ip or podIP configuration".into(),
            ));
        }
        if !valid_subdomain(name) {
            return Err((
                Rule::EgressRouterCni,
                format!(
                    "ipConfig.name {name:?} is no ConfigMap name; use the ConfigMap's name (lowercase letters, digits, '-' and '.')"
                ),
            ));
        }
        if let Some(namespace) = ip_config.namespace.as_deref()
            && !namespace.is_empty()
            && !valid_label(namespace)
        {
            return Err((
                Rule::EgressRouterCni,
                format!(
                    "ipConfig.namespace {namespace:?} is no namespace name; use the ConfigMap's namespace, or leave it out for the pod's"
                ),
            ));
        }
        if let Some(overrides) = &ip_config.overrides {
            check_block("ipConfig.overrides", overrides, false, checked)?;
        }
    }
    Ok(())
}

fn check_interface(
    config: &EgressRouterCniConfig,
    platform: Option<Platform>,
    checked: &mut CheckedConfig,
) -> Result<(), String> {
    let interface_type = config
        .interface_type
        .as_deref()
        .filter(|t| !t.is_empty())
        .unwrap_or("macvlan");
    match (interface_type, platform) {
        ("macvlan" | "ipvlan", _) | ("aws-elastic-ip", Some(Platform::Aws)) => {}
        ("aws-elastic-ip", Some(other)) => {
            return Err(format!(
                "interfaceType aws-elastic-ip works on AWS only, and this cluster is {} (--platform-type); use macvlan or ipvlan",
                other.as_str()
            ));
        }
        ("aws-elastic-ip", None) => checked.warnings.push(
            "interfaceType aws-elastic-ip works on AWS only; the webhook was not told the cloud (--platform-type), so this was not checked".into(),
        ),
        (other, _) => {
            return Err(format!(
                "interfaceType {other:?} is not one of macvlan, ipvlan or aws-elastic-ip (AWS only); use one of them"
            ));
        }
    }
    let args = config.interface_args.iter().flatten();
    let mut mode = None;
    let mut master = None;
    for (key, value) in args {
        let Some(text) = value.as_str() else {
            return Err(format!(
                "interfaceArgs.{key} is {value}, not a string, and the plugin reads only strings there; write it as \"{}\"",
                value.to_string().trim_matches('"')
            ));
        };
        match key.as_str() {
            "mode" => mode = Some(text),
            "master" => master = Some(text),
            _ => {}
        }
    }
    if interface_type == "macvlan"
        && let Some(mode) = mode.filter(|m| !m.is_empty())
        && !KERNEL_MACVLAN_MODES.contains(&mode)
    {
        return Err(format!(
            "interfaceArgs.mode {mode:?} is not a macvlan mode of the kernel ({}); use one of them, in lower case",
            KERNEL_MACVLAN_MODES.join(", ")
        ));
    }
    if let Some(master) = master.filter(|m| !m.is_empty())
        && !valid_interface_name(master)
    {
        return Err(format!(
            "interfaceArgs.master {master:?} is no Linux interface name (1-15 characters, no '/', ':' or whitespace); name the node's interface, or leave master out to infer it"
        ));
    }
    Ok(())
}

fn check_block(
    path: &str,
    block: &IpBlock,
    addresses_required: bool,
    checked: &mut CheckedConfig,
) -> Result<(), Refusal> {
    let list = block.addresses.as_deref().unwrap_or_default();
    if addresses_required && list.is_empty() {
        return Err((
            Rule::EgressRouterAddress,
            format!(
                "{path}.addresses lists no address; add the router's address in CIDR form, e.g. \"192.168.3.10/24\""
            ),
        ));
    }
    let mut cidrs: Vec<(String, Cidr)> = Vec::with_capacity(list.len());
    for (i, text) in list.iter().enumerate() {
        let field = format!("{path}.addresses[{i}]");
        let cidr = check_cidr_address(&field, text).map_err(|d| (Rule::EgressRouterAddress, d))?;
        cidrs.push((field, cidr));
    }
    if let Some(gateway) = block.gateway.as_deref().filter(|g| !g.is_empty()) {
        check_gateway(&format!("{path}.gateway"), gateway, &cidrs)
            .map_err(|d| (Rule::EgressRouterAddress, d))?;
    }
    for (i, destination) in block.destinations.iter().flatten().enumerate() {
        if let Err(error) = parse_destination(destination) {
            return Err((
                Rule::EgressRouterRedirect,
                format!(
                    "{path}.destinations[{i}] {destination:?} {error}; write a CIDR such as \"203.0.113.0/24\" or a rule such as \"80 TCP 203.0.113.26 8080\""
                ),
            ));
        }
    }
    checked
        .addresses
        .extend(cidrs.into_iter().map(|(_, c)| c.ip));
    Ok(())
}
