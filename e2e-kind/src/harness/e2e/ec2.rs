//! The network plugin's view of EC2: the VPC and subnet the suite works in, instances created
//! for nodes, and reads of what is attached to their primary interfaces.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use aws_sdk_ec2::types::InstanceType;
use cloudnet_reconciler::cloud::aws::{
    AwsCredentials, AwsSettings, ClientSettings, RetryPolicy, Secret, build_sdk_client,
};
use cloudnet_reconciler::cloud::pace::Pacing;
use ipnet::{Ipv4Net, Ipv6Net};

/// One dual-stack subnet in its own VPC.
#[derive(Clone, Debug)]
pub struct Network {
    /// The subnet id.
    pub subnet_id: String,
    /// Its IPv4 CIDR.
    pub ipv4: Ipv4Net,
    /// Its IPv6 CIDR.
    pub ipv6: Ipv6Net,
}

/// An instance as a node sees it.
#[derive(Clone, Debug)]
pub struct Instance {
    /// `i-…`.
    pub id: String,
    /// Its availability zone.
    pub zone: String,
    /// The primary ENI (attachment device index 0).
    pub eni: String,
    /// The primary private IPv4 address.
    pub primary_ipv4: IpAddr,
    /// The instance type.
    pub instance_type: InstanceType,
}

impl Instance {
    /// The providerID the kubelet would set: `aws:///<zone>/<instance-id>`.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.zone, self.id)
    }
}

/// The AWS provider's settings for a test against moto at `endpoint` in `region`: fixed test
/// keys, fast retries, no client-side pacing.
pub fn moto_settings(endpoint: &str, region: &str) -> AwsSettings {
    AwsSettings {
        client: ClientSettings {
            region: region.into(),
            endpoint: Some(endpoint.into()),
            sts_endpoint: None,
            ca_bundle_pem: None,
            call_timeout: Duration::from_secs(20),
        },
        credentials: AwsCredentials {
            access_key_id: Secret::new("AKIDTESTONLY"),
            secret_access_key: Secret::new("test-secret"),
            session_token: None,
        }
        .into(),
        retry: RetryPolicy {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(200),
            max_attempts: 10,
        },
        pacing: Pacing::UNLIMITED,
    }
}

/// A client for moto at `endpoint` in `region` ([`moto_settings`]), a new 10.0.0.0/16 network
/// ([`create_network`]) and `count` m5.large instances in it: the public-address tests' and
/// benchmark's world.
pub async fn moto_instances(
    endpoint: &str,
    region: &str,
    count: i32,
) -> Result<(aws_sdk_ec2::Client, Network, Vec<Instance>)> {
    let settings = moto_settings(endpoint, region);
    let ec2 = build_sdk_client(&settings.client, &settings.credentials)?;
    let network = create_network(&ec2, "10.0.0.0/16".parse()?).await?;
    let instances = run_instances(&ec2, &network, InstanceType::M5Large, count).await?;
    Ok((ec2, network, instances))
}

/// Creates a VPC with `cidr` and an Amazon IPv6 block, and one subnet: `cidr`'s first /20 and
/// the IPv6 block's first /64.
pub async fn create_network(ec2: &aws_sdk_ec2::Client, cidr: Ipv4Net) -> Result<Network> {
    create_network_sized(ec2, cidr, 20).await
}

/// [`create_network`] with a subnet of `prefix_len` bits (a larger one for the scale benchmark).
pub async fn create_network_sized(
    ec2: &aws_sdk_ec2::Client,
    cidr: Ipv4Net,
    prefix_len: u8,
) -> Result<Network> {
    let vpc = ec2
        .create_vpc()
        .cidr_block(cidr.to_string())
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await
        .context("CreateVpc")?;
    let vpc = vpc.vpc().context("CreateVpc returned no VPC")?;
    let vpc_v6: Ipv6Net = vpc
        .ipv6_cidr_block_association_set()
        .first()
        .and_then(|a| a.ipv6_cidr_block())
        .context("the VPC has no IPv6 block")?
        .parse()?;
    let ipv6 = Ipv6Net::new(vpc_v6.network(), 64)?;
    let ipv4 = Ipv4Net::new(cidr.network(), prefix_len)?;
    let subnet = ec2
        .create_subnet()
        .vpc_id(vpc.vpc_id().context("VPC without id")?)
        .cidr_block(ipv4.to_string())
        .ipv6_cidr_block(ipv6.to_string())
        .send()
        .await
        .context("CreateSubnet")?;
    let subnet_id = subnet
        .subnet()
        .and_then(|s| s.subnet_id())
        .context("CreateSubnet returned no id")?
        .to_owned();
    Ok(Network {
        subnet_id,
        ipv4,
        ipv6,
    })
}

/// Runs `count` instances of `instance_type` in the network's subnet.
pub async fn run_instances(
    ec2: &aws_sdk_ec2::Client,
    network: &Network,
    instance_type: InstanceType,
    count: i32,
) -> Result<Vec<Instance>> {
    let run = ec2
        .run_instances()
        .image_id("ami-12345678")
        .instance_type(instance_type.clone())
        .min_count(count)
        .max_count(count)
        .subnet_id(&network.subnet_id)
        .send()
        .await
        .context("RunInstances")?;
    run.instances()
        .iter()
        .map(|i| {
            let primary = i
                .network_interfaces()
                .iter()
                .find(|ni| ni.attachment().and_then(|a| a.device_index()) == Some(0))
                .context("instance without a device-index-0 interface")?;
            Ok(Instance {
                id: i.instance_id().context("instance without id")?.to_owned(),
                zone: i
                    .placement()
                    .and_then(|p| p.availability_zone())
                    .context("instance without zone")?
                    .to_owned(),
                eni: primary
                    .network_interface_id()
                    .context("interface without id")?
                    .to_owned(),
                primary_ipv4: primary
                    .private_ip_address()
                    .context("interface without private IP")?
                    .parse()?,
                instance_type: instance_type.clone(),
            })
        })
        .collect()
}

/// Every address on each of `enis` (primary and secondary, both families), read in one
/// DescribeNetworkInterfaces call so the answer is one consistent snapshot.
pub async fn addresses(
    ec2: &aws_sdk_ec2::Client,
    enis: &[&str],
) -> Result<Vec<(String, BTreeSet<IpAddr>)>> {
    let out = ec2
        .describe_network_interfaces()
        .set_network_interface_ids(Some(enis.iter().map(|e| (*e).to_owned()).collect()))
        .send()
        .await
        .context("DescribeNetworkInterfaces")?;
    let mut found = Vec::new();
    for eni in enis {
        let Some(ni) = out
            .network_interfaces()
            .iter()
            .find(|ni| ni.network_interface_id() == Some(eni))
        else {
            bail!("interface {eni} not found");
        };
        let mut ips = BTreeSet::new();
        for p in ni.private_ip_addresses() {
            if let Some(ip) = p.private_ip_address() {
                ips.insert(ip.parse()?);
            }
        }
        for p in ni.ipv6_addresses() {
            if let Some(ip) = p.ipv6_address() {
                ips.insert(ip.parse()?);
            }
        }
        found.push(((*eni).to_owned(), ips));
    }
    Ok(found)
}

/// The addresses on one interface.
pub async fn addresses_of(ec2: &aws_sdk_ec2::Client, eni: &str) -> Result<BTreeSet<IpAddr>> {
    let mut all = addresses(ec2, &[eni]).await?;
    all.pop()
        .map(|(_, ips)| ips)
        .context("no answer for the interface")
}

/// Per-interface address limits of an instance type: (IPv4, IPv6), the IPv4 one counting the
/// primary address.
pub async fn limits(ec2: &aws_sdk_ec2::Client, instance_type: InstanceType) -> Result<(i64, i64)> {
    let out = ec2
        .describe_instance_types()
        .instance_types(instance_type.clone())
        .send()
        .await
        .context("DescribeInstanceTypes")?;
    let network = out
        .instance_types()
        .first()
        .and_then(|t| t.network_info())
        .with_context(|| format!("no network info for {instance_type}"))?;
    Ok((
        i64::from(network.ipv4_addresses_per_interface().unwrap_or_default()),
        i64::from(network.ipv6_addresses_per_interface().unwrap_or_default()),
    ))
}

/// Attaches `count` secondary IPv4 addresses chosen by EC2: addresses no object manages.
pub async fn add_unmanaged_ipv4(ec2: &aws_sdk_ec2::Client, eni: &str, count: i32) -> Result<()> {
    ec2.assign_private_ip_addresses()
        .network_interface_id(eni)
        .secondary_private_ip_address_count(count)
        .send()
        .await
        .context("AssignPrivateIpAddresses")?;
    Ok(())
}

/// Every interface holding `ip` (as a private IPv4 or an IPv6 address), read in one unfiltered
/// DescribeNetworkInterfaces call: a doubled IP shows up as two.
pub async fn holders_of(ec2: &aws_sdk_ec2::Client, ip: IpAddr) -> Result<BTreeSet<String>> {
    let out = ec2
        .describe_network_interfaces()
        .send()
        .await
        .context("DescribeNetworkInterfaces")?;
    let text = ip.to_string();
    Ok(out
        .network_interfaces()
        .iter()
        .filter(|ni| {
            ni.private_ip_addresses()
                .iter()
                .any(|p| p.private_ip_address() == Some(&text))
                || ni
                    .ipv6_addresses()
                    .iter()
                    .any(|p| p.ipv6_address() == Some(&text))
        })
        .filter_map(|ni| ni.network_interface_id().map(str::to_owned))
        .collect())
}
