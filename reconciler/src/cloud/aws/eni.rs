//! Reading an instance's primary network interface out of EC2's answers, into plain data.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aws_sdk_ec2::types::{
    Instance, InstanceNetworkInterface, NetworkInterface, Subnet, SubnetCidrBlockStateCode,
};
use ipnet::{Ipv4Net, Ipv6Net};

use crate::cloud::CloudError;

/// The addresses on an interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    /// The interface's primary private IPv4 address (never detached by us).
    pub primary_ipv4: Option<Ipv4Addr>,
    /// Every private IPv4 address, the primary one included.
    pub ipv4: Vec<Ipv4Addr>,
    /// Every IPv6 address.
    pub ipv6: Vec<Ipv6Addr>,
    /// The IPv6 addresses EC2 flags as the interface's primary one (`IsPrimaryIpv6`).
    pub primary_ipv6: Vec<Ipv6Addr>,
}

impl Addresses {
    /// Every address, primary first.
    pub fn all(&self) -> Vec<IpAddr> {
        let v4 = self.ipv4.iter().copied().map(IpAddr::V4);
        v4.chain(self.ipv6.iter().copied().map(IpAddr::V6))
            .collect()
    }

    /// The node's own addresses as EC2 flags them: the primary private IPv4 and the primary
    /// IPv6 (never detached, never taken as egress IPs).
    pub fn own(&self) -> Vec<IpAddr> {
        let v4 = self.primary_ipv4.map(IpAddr::V4);
        v4.into_iter()
            .chain(self.primary_ipv6.iter().copied().map(IpAddr::V6))
            .collect()
    }
}

#[cfg(test)]
impl Addresses {
    /// Whether `ip` is on the interface.
    fn contains(&self, ip: IpAddr) -> bool {
        self.all().contains(&ip)
    }

    /// Every address except the primary IPv4 one.
    fn secondary(&self) -> Vec<IpAddr> {
        let primary = self.primary_ipv4.map(IpAddr::V4);
        self.all()
            .into_iter()
            .filter(|ip| Some(*ip) != primary)
            .collect()
    }
}

/// An instance's primary interface as DescribeInstances reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimaryEni {
    /// The ENI id (`eni-…`).
    pub id: String,
    /// Its subnet (`subnet-…`).
    pub subnet_id: String,
    /// The instance type (`m5.large`), for the capacity lookup.
    pub instance_type: String,
    /// Its addresses.
    pub addresses: Addresses,
}

/// The primary interface of `instance`: the one attached at device index 0, whatever the order
/// EC2 lists them in.
pub fn primary_eni(instance: &Instance) -> Result<PrimaryEni, CloudError> {
    let instance_id = instance.instance_id().unwrap_or("the instance");
    let eni = instance
        .network_interfaces()
        .iter()
        .find(|ni| ni.attachment().and_then(|a| a.device_index()) == Some(0))
        .ok_or_else(|| {
            CloudError::not_found(format!(
                "{instance_id} has no network interface at device index 0"
            ))
        })?;
    let id = eni.network_interface_id().ok_or_else(|| {
        CloudError::permanent(format!(
            "EC2 listed the primary interface of {instance_id} without an id"
        ))
    })?;
    let subnet_id = eni.subnet_id().ok_or_else(|| {
        CloudError::permanent(format!("EC2 listed interface {id} without a subnet"))
    })?;
    let instance_type = instance
        .instance_type()
        .map(|t| t.as_str().to_owned())
        .ok_or_else(|| CloudError::permanent(format!("EC2 listed {instance_id} without a type")))?;
    Ok(PrimaryEni {
        id: id.to_owned(),
        subnet_id: subnet_id.to_owned(),
        instance_type,
        addresses: attached_addresses(eni),
    })
}

/// The interfaces of `instance` other than the primary one (device index 0) that hold `ip`.
pub fn other_interfaces_holding(instance: &Instance, ip: IpAddr) -> Vec<String> {
    instance
        .network_interfaces()
        .iter()
        .filter(|ni| ni.attachment().and_then(|a| a.device_index()) != Some(0))
        .filter(|ni| attached_addresses(ni).all().contains(&ip))
        .filter_map(|ni| ni.network_interface_id().map(str::to_owned))
        .collect()
}

/// The addresses of an interface as DescribeInstances reports it.
fn attached_addresses(eni: &InstanceNetworkInterface) -> Addresses {
    let private = eni
        .private_ip_addresses()
        .iter()
        .filter_map(|a| Some((a.private_ip_address()?, a.primary().unwrap_or(false))));
    let ipv6 = eni
        .ipv6_addresses()
        .iter()
        .filter_map(|a| Some((a.ipv6_address()?, a.is_primary_ipv6().unwrap_or(false))));
    addresses(private, ipv6, eni.private_ip_address())
}

/// The addresses of `eni` as DescribeNetworkInterfaces reports them.
pub fn interface_addresses(eni: &NetworkInterface) -> Addresses {
    let private = eni
        .private_ip_addresses()
        .iter()
        .filter_map(|a| Some((a.private_ip_address()?, a.primary().unwrap_or(false))));
    let ipv6 = eni
        .ipv6_addresses()
        .iter()
        .filter_map(|a| Some((a.ipv6_address()?, a.is_primary_ipv6().unwrap_or(false))));
    addresses(private, ipv6, eni.private_ip_address())
}

/// The subnet's IPv4 CIDR and its associated IPv6 CIDR, as network addresses.
pub fn subnet_cidrs(subnet: &Subnet) -> (Option<Ipv4Net>, Option<Ipv6Net>) {
    let ipv4 = subnet
        .cidr_block()
        .and_then(|c| c.parse::<Ipv4Net>().ok())
        .map(|n| n.trunc());
    let ipv6 = subnet
        .ipv6_cidr_block_association_set()
        .iter()
        .filter(|a| usable(a.ipv6_cidr_block_state().and_then(|s| s.state())))
        .find_map(|a| a.ipv6_cidr_block()?.parse::<Ipv6Net>().ok())
        .map(|n| n.trunc());
    (ipv4, ipv6)
}

/// Whether an IPv6 block in `state` serves addresses. States other than the documented ones are
/// taken as associated: moto 5 reports `"{'State': 'associated'}"` as the state string.
fn usable(state: Option<&SubnetCidrBlockStateCode>) -> bool {
    !matches!(
        state,
        Some(
            SubnetCidrBlockStateCode::Associating
                | SubnetCidrBlockStateCode::Disassociating
                | SubnetCidrBlockStateCode::Disassociated
                | SubnetCidrBlockStateCode::Failing
                | SubnetCidrBlockStateCode::Failed
        )
    )
}

fn addresses<'a>(
    private: impl Iterator<Item = (&'a str, bool)>,
    ipv6: impl Iterator<Item = (&'a str, bool)>,
    primary_hint: Option<&str>,
) -> Addresses {
    let mut out = Addresses::default();
    for (text, primary) in private {
        let Ok(ip) = text.parse::<Ipv4Addr>() else {
            continue;
        };
        if primary {
            out.primary_ipv4 = Some(ip);
        }
        if !out.ipv4.contains(&ip) {
            out.ipv4.push(ip);
        }
    }
    if out.primary_ipv4.is_none() {
        out.primary_ipv4 = primary_hint.and_then(|p| p.parse().ok());
    }
    // Primary first, so the list reads like the console's.
    if let Some(primary) = out.primary_ipv4 {
        out.ipv4.retain(|ip| *ip != primary);
        out.ipv4.insert(0, primary);
    }
    for (text, primary) in ipv6 {
        // EC2 writes IPv6 compressed; parsing makes the comparison independent of spelling.
        let Ok(ip) = text.parse::<Ipv6Addr>() else {
            continue;
        };
        if primary && !out.primary_ipv6.contains(&ip) {
            out.primary_ipv6.push(ip);
        }
        if !out.ipv6.contains(&ip) {
            out.ipv6.push(ip);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use aws_sdk_ec2::types::{
        InstanceIpv6Address, InstanceNetworkInterface, InstanceNetworkInterfaceAttachment,
        InstancePrivateIpAddress, InstanceType, SubnetCidrBlockState,
        SubnetIpv6CidrBlockAssociation,
    };

    use super::*;

    fn interface(id: &str, device_index: i32, ips: &[&str]) -> InstanceNetworkInterface {
        let mut builder = InstanceNetworkInterface::builder()
            .network_interface_id(id)
            .subnet_id(format!("subnet-{id}"))
            .attachment(
                InstanceNetworkInterfaceAttachment::builder()
                    .device_index(device_index)
                    .build(),
            );
        for (i, ip) in ips.iter().enumerate() {
            builder = builder.private_ip_addresses(
                InstancePrivateIpAddress::builder()
                    .private_ip_address(*ip)
                    .primary(i == 0)
                    .build(),
            );
        }
        builder
            .ipv6_addresses(
                InstanceIpv6Address::builder()
                    .ipv6_address("2600:1f18:0:1::10")
                    .build(),
            )
            .build()
    }

    #[test]
    fn other_interfaces_holding_an_ip_leave_the_primary_out() {
        let instance = Instance::builder()
            .network_interfaces(interface("eni-second", 1, &["10.0.2.5", "10.0.1.7"]))
            .network_interfaces(interface("eni-first", 0, &["10.0.1.5", "10.0.1.7"]))
            .network_interfaces(interface("eni-third", 2, &["10.0.3.5"]))
            .build();
        let held = |ip: &str| other_interfaces_holding(&instance, ip.parse().unwrap());
        assert_eq!(held("10.0.1.7"), ["eni-second"]);
        assert!(held("10.0.1.5").is_empty(), "on the primary alone");
        assert!(held("10.0.9.9").is_empty());
        assert_eq!(held("2600:1f18:0:1::10"), ["eni-second", "eni-third"]);
    }

    #[test]
    fn primary_eni_is_device_index_zero_not_list_order() {
        let instance = Instance::builder()
            .instance_id("i-0123456789abcdef0")
            .instance_type(InstanceType::M5Large)
            .network_interfaces(interface("eni-second", 1, &["10.0.2.5"]))
            .network_interfaces(interface("eni-first", 0, &["10.0.1.5", "10.0.1.9"]))
            .build();
        let eni = primary_eni(&instance).unwrap();
        assert_eq!(eni.id, "eni-first");
        assert_eq!(eni.subnet_id, "subnet-eni-first");
        assert_eq!(eni.instance_type, "m5.large");
        assert_eq!(eni.addresses.primary_ipv4, Some(Ipv4Addr::new(10, 0, 1, 5)));
        assert_eq!(
            eni.addresses.secondary(),
            vec![
                "10.0.1.9".parse::<IpAddr>().unwrap(),
                "2600:1f18:0:1::10".parse().unwrap()
            ]
        );
        assert!(
            eni.addresses
                .contains("2600:1f18:0000:0001:0000:0000:0000:0010".parse().unwrap())
        );
    }

    #[test]
    fn an_instance_without_device_index_zero_is_not_found() {
        let instance = Instance::builder()
            .instance_id("i-0123456789abcdef0")
            .instance_type(InstanceType::M5Large)
            .network_interfaces(interface("eni-second", 1, &["10.0.2.5"]))
            .build();
        let error = primary_eni(&instance).unwrap_err();
        assert_eq!(error.kind, crate::cloud::ErrorKind::NotFound);
        assert!(
            error.message.contains("device index 0"),
            "{}",
            error.message
        );
    }

    #[test]
    fn subnet_cidrs_are_network_addresses_of_associated_blocks() {
        let association = |cidr: &str, state| {
            SubnetIpv6CidrBlockAssociation::builder()
                .ipv6_cidr_block(cidr)
                .ipv6_cidr_block_state(SubnetCidrBlockState::builder().state(state).build())
                .build()
        };
        let subnet = Subnet::builder()
            .cidr_block("10.0.1.0/24")
            .ipv6_cidr_block_association_set(association(
                "2600:1f18::/64",
                SubnetCidrBlockStateCode::Disassociated,
            ))
            .ipv6_cidr_block_association_set(association(
                "2600:1f18:0:1::/64",
                SubnetCidrBlockStateCode::Associated,
            ))
            .build();
        let (v4, v6) = subnet_cidrs(&subnet);
        assert_eq!(v4, Some("10.0.1.0/24".parse().unwrap()));
        assert_eq!(v6, Some("2600:1f18:0:1::/64".parse().unwrap()));
        assert_eq!(subnet_cidrs(&Subnet::builder().build()), (None, None));
    }
}
