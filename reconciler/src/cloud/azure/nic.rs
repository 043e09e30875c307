//! The NIC's ip-configuration list: reading the addresses off it and computing the list a change
//! leaves, which is PUT whole (ARM replaces the NIC with the body: a field left out is dropped).

use std::net::IpAddr;

use azure_mgmt_network::package_2024_03::models::{
    IpAllocationMethod, IpVersion, NetworkInterface, NetworkInterfaceIpConfiguration,
    NetworkInterfaceIpConfigurationPropertiesFormat, SubResource, Subnet,
};

use super::super::{Change, CloudError};

/// Longest ip-configuration name ARM accepts.
pub const MAX_NAME: usize = 80;

/// Most ip-configurations one NIC may have.
pub const MAX_IP_CONFIGS: usize = 256;

/// The name of the ip-configuration carrying `ip` for `node`: `<node>_<ip>`, as upstream names
/// it, made valid for ARM (1–80 characters of letters, digits, `_`, `.`, `-`, starting with a
/// letter or digit and ending with one or `_`). IPv6 colons become `-`; a node name too long for
/// the limit is cut, never the address, so names stay unique per NIC.
pub fn ip_config_name(node: &str, ip: IpAddr) -> String {
    let address = address_text(ip);
    let clean: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let clean = clean.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let room = MAX_NAME.saturating_sub(address.len() + 1);
    let head: String = clean.chars().take(room).collect();
    let head = if head.is_empty() {
        "ip".to_owned()
    } else {
        head
    };
    // IPv6 text may start with `-` after the colon replacement ("::1"), which is fine in the middle.
    format!("{head}_{address}")
}

/// The address as an ARM name ends: IPv6 colons become `-`, and an address ending in `::` gets
/// its implied trailing `0` written out (`fd00::` → `fd00--0`, the same address), because ARM
/// refuses a name ending in `-`.
fn address_text(ip: IpAddr) -> String {
    let mut text = ip.to_string().replace(':', "-");
    if text.ends_with('-') {
        text.push('0');
    }
    text
}

/// The address an ip-configuration holds, if it holds exactly one.
pub fn config_address(config: &NetworkInterfaceIpConfiguration) -> Option<IpAddr> {
    let text = config.properties.as_ref()?.private_ip_address.as_deref()?;
    text.parse().ok()
}

/// Whether `config` is the NIC's primary ip-configuration.
pub fn is_primary(config: &NetworkInterfaceIpConfiguration) -> bool {
    config
        .properties
        .as_ref()
        .and_then(|p| p.primary)
        .unwrap_or(false)
}

/// The NIC's ip-configurations.
pub fn configs(nic: &NetworkInterface) -> &[NetworkInterfaceIpConfiguration] {
    nic.properties
        .as_ref()
        .map(|p| p.ip_configurations.as_slice())
        .unwrap_or_default()
}

/// The NIC's primary ip-configuration (the first one when none is marked, as ARM does for a
/// NIC with a single configuration).
pub fn primary_config(nic: &NetworkInterface) -> Option<&NetworkInterfaceIpConfiguration> {
    let all = configs(nic);
    all.iter().find(|c| is_primary(c)).or(all.first())
}

/// Every address on the NIC, in list order.
pub fn addresses(nic: &NetworkInterface) -> Vec<IpAddr> {
    configs(nic).iter().filter_map(config_address).collect()
}

/// Whether `config` was made by this project for its own address (`<node>_<ip>`): the
/// configurations whose load-balancer pools are stripped.
pub fn is_managed_config(config: &NetworkInterfaceIpConfiguration) -> bool {
    if is_primary(config) {
        return false;
    }
    let (Some(name), Some(ip)) = (config.name.as_deref(), config_address(config)) else {
        return false;
    };
    let suffix = format!("_{}", address_text(ip));
    name.ends_with(&suffix)
}

/// Whether any managed configuration still sits in a load-balancer backend pool.
pub fn has_pooled_managed_config(nic: &NetworkInterface) -> bool {
    configs(nic)
        .iter()
        .filter(|c| is_managed_config(c))
        .any(|c| {
            c.properties
                .as_ref()
                .is_some_and(|p| !p.load_balancer_backend_address_pools.is_empty())
        })
}

/// A new static, non-primary ip-configuration for `ip` on the primary configuration's subnet and
/// application security groups, without load-balancer pools or a public IP.
fn new_config(
    node: &str,
    ip: IpAddr,
    primary: &NetworkInterfaceIpConfigurationPropertiesFormat,
) -> NetworkInterfaceIpConfiguration {
    let mut properties = NetworkInterfaceIpConfigurationPropertiesFormat::new();
    properties.private_ip_address = Some(ip.to_string());
    properties.private_ip_allocation_method = Some(IpAllocationMethod::Static);
    properties.private_ip_address_version = Some(if ip.is_ipv4() {
        IpVersion::IPv4
    } else {
        IpVersion::IPv6
    });
    properties.primary = Some(false);
    properties.subnet = primary.subnet.as_ref().map(|s| {
        let mut subnet = Subnet::new();
        subnet.sub_resource = SubResource {
            id: s.sub_resource.id.clone(),
        };
        subnet
    });
    properties.application_security_groups = primary.application_security_groups.clone();
    let mut config = NetworkInterfaceIpConfiguration::new();
    config.name = Some(ip_config_name(node, ip));
    config.properties = Some(properties);
    config
}

/// The NIC as it must be PUT for `change`: configurations of removed addresses dropped (never
/// the primary's), one new configuration per added address not yet there, load-balancer pools
/// stripped from every managed configuration. `None` when nothing would change.
pub fn edited(
    nic: &NetworkInterface,
    node: &str,
    change: &Change,
) -> Result<Option<NetworkInterface>, CloudError> {
    let nic_name = nic.resource.name.clone().unwrap_or_default();
    let primary = primary_config(nic)
        .and_then(|c| c.properties.clone())
        .ok_or_else(|| {
            CloudError::not_found(format!(
                "network interface {nic_name} has no ip-configuration"
            ))
        })?;
    if let Some(ip) = change
        .remove
        .iter()
        .find(|ip| primary.private_ip_address.as_deref() == Some(ip.to_string().as_str()))
    {
        return Err(CloudError::permanent(format!(
            "{ip} is the primary address of network interface {nic_name}; it is never detached"
        )));
    }
    let mut out = nic.clone();
    let Some(props) = out.properties.as_mut() else {
        return Ok(None);
    };
    let before = props.ip_configurations.len();
    let mut changed = false;
    props.ip_configurations.retain(|c| {
        let drop =
            !is_primary(c) && config_address(c).is_some_and(|ip| change.remove.contains(&ip));
        changed |= drop;
        !drop
    });
    for config in &mut props.ip_configurations {
        if is_managed_config(config)
            && let Some(p) = config.properties.as_mut()
            && !p.load_balancer_backend_address_pools.is_empty()
        {
            p.load_balancer_backend_address_pools.clear();
            changed = true;
        }
    }
    let held: Vec<IpAddr> = props
        .ip_configurations
        .iter()
        .filter_map(config_address)
        .collect();
    for ip in &change.add {
        if !held.contains(ip) {
            props
                .ip_configurations
                .push(new_config(node, *ip, &primary));
            changed = true;
        }
    }
    let after = props.ip_configurations.len();
    if after > MAX_IP_CONFIGS && after > before {
        return Err(CloudError::permanent(format!(
            "network interface {nic_name} would hold {after} ip-configurations, more than Azure's {MAX_IP_CONFIGS}"
        )));
    }
    Ok(changed.then_some(out))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn config(name: &str, address: &str, primary: bool) -> NetworkInterfaceIpConfiguration {
        let mut p = NetworkInterfaceIpConfigurationPropertiesFormat::new();
        p.private_ip_address = Some(address.into());
        p.primary = Some(primary);
        let mut subnet = Subnet::new();
        subnet.sub_resource.id = Some("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/w".into());
        p.subnet = Some(subnet);
        let mut c = NetworkInterfaceIpConfiguration::new();
        c.name = Some(name.into());
        c.properties = Some(p);
        c
    }

    fn nic(configs: Vec<NetworkInterfaceIpConfiguration>) -> NetworkInterface {
        let mut n = NetworkInterface::new();
        n.resource.name = Some("nic0".into());
        let mut p =
            azure_mgmt_network::package_2024_03::models::NetworkInterfacePropertiesFormat::new();
        p.ip_configurations = configs;
        n.properties = Some(p);
        n
    }

    fn valid_arm_name(name: &str) -> bool {
        let ok_chars = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        let first = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
        let last = name
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        ok_chars && first && last && (1..=MAX_NAME).contains(&name.len())
    }

    #[test]
    fn names_are_node_underscore_ip_and_valid_for_azure() {
        assert_eq!(
            ip_config_name("worker-0", ip("10.0.0.9")),
            "worker-0_10.0.0.9"
        );
        let v6 = ip_config_name("worker-0", ip("fd00:1::54"));
        assert_eq!(v6, "worker-0_fd00-1--54");
        assert_eq!(ip_config_name("w", ip("fd00::")), "w_fd00--0");
        let long = "n".repeat(253);
        for address in ["10.0.0.9", "fd00:1:2:3:4:5:6:7", "::1", "fd00::"] {
            let name = ip_config_name(&long, ip(address));
            assert!(valid_arm_name(&name), "{name}");
            assert!(name.ends_with(&address_text(ip(address))));
        }
        assert!(valid_arm_name(&ip_config_name("-odd/node", ip("10.0.0.9"))));
        assert!(valid_arm_name(&ip_config_name("", ip("10.0.0.9"))));
    }

    #[test]
    fn one_edit_adds_and_removes_and_keeps_the_rest() {
        let n = nic(vec![
            config("ipconfig1", "10.0.0.4", true),
            config("other", "10.0.0.5", false),
            config("w_10.0.0.6", "10.0.0.6", false),
        ]);
        let change = Change::new(
            vec![ip("10.0.0.7"), ip("fd00::7"), ip("10.0.0.5")],
            vec![ip("10.0.0.6"), ip("10.0.0.99")],
        );
        let out = edited(&n, "w", &change).unwrap().unwrap();
        let names: Vec<_> = configs(&out)
            .iter()
            .map(|c| c.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["ipconfig1", "other", "w_10.0.0.7", "w_fd00--7"]);
        let v6 = &configs(&out)[3];
        let p = v6.properties.as_ref().unwrap();
        assert_eq!(p.private_ip_address_version, Some(IpVersion::IPv6));
        assert_eq!(
            p.private_ip_allocation_method,
            Some(IpAllocationMethod::Static)
        );
        assert_eq!(p.primary, Some(false));
        assert!(
            p.subnet
                .as_ref()
                .unwrap()
                .sub_resource
                .id
                .as_ref()
                .unwrap()
                .ends_with("/subnets/w")
        );
        assert_eq!(
            addresses(&out),
            [
                ip("10.0.0.4"),
                ip("10.0.0.5"),
                ip("10.0.0.7"),
                ip("fd00::7")
            ]
        );
    }

    #[test]
    fn nothing_to_do_is_no_put_and_the_primary_is_never_removed() {
        let n = nic(vec![config("ipconfig1", "10.0.0.4", true)]);
        let noop = Change::new(vec![ip("10.0.0.4")], vec![ip("10.0.0.8")]);
        assert!(edited(&n, "w", &noop).unwrap().is_none());
        let bad = Change::new(vec![], vec![ip("10.0.0.4")]);
        assert!(
            edited(&n, "w", &bad)
                .unwrap_err()
                .message
                .contains("primary address")
        );
    }

    #[test]
    fn the_256_limit_is_checked_before_the_put() {
        let mut list = vec![config("ipconfig1", "10.0.0.4", true)];
        for i in 0..255u32 {
            let a = std::net::Ipv4Addr::from(0x0a01_0000 + i).to_string();
            list.push(config(&format!("x_{a}"), &a, false));
        }
        let n = nic(list);
        let change = Change::new(vec![ip("10.0.0.200")], vec![]);
        assert!(
            edited(&n, "w", &change)
                .unwrap_err()
                .message
                .contains("256")
        );
        let swap = Change::new(vec![ip("10.0.0.200")], vec![ip("10.1.0.0")]);
        assert!(edited(&n, "w", &swap).unwrap().is_some());
    }

    #[test]
    fn load_balancer_pools_are_stripped_from_managed_configs_only() {
        use azure_mgmt_network::package_2024_03::models::BackendAddressPool;
        let mut managed = config("w_10.0.0.6", "10.0.0.6", false);
        let mut primary = config("ipconfig1", "10.0.0.4", true);
        for c in [&mut managed, &mut primary] {
            c.properties
                .as_mut()
                .unwrap()
                .load_balancer_backend_address_pools = vec![BackendAddressPool::new()];
        }
        let n = nic(vec![primary, managed]);
        assert!(has_pooled_managed_config(&n));
        let out = edited(&n, "w", &Change::default()).unwrap().unwrap();
        assert!(!has_pooled_managed_config(&out));
        let pools = |i: usize| {
            configs(&out)[i]
                .properties
                .as_ref()
                .unwrap()
                .load_balancer_backend_address_pools
                .len()
        };
        assert_eq!((pools(0), pools(1)), (1, 0));
    }
}
