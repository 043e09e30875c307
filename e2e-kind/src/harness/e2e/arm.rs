//! Azure as the local system's cloud: the project's ARM fake (every NIC PUT checked against the
//! NetworkInterface schema of API version 2024-03-01) with one dual-stack subnet, and the VMs a
//! test adds to it.

use std::any::Any;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use ipnet::{Ipv4Net, Ipv6Net};

use cloudnet_shared::public_ip::{MARKER_PLAIN, MARKER_VALUE};

use super::cloud::LocalCloud;
use crate::fakes::arm::{ArmConfig, ArmFake, VmIds};
use crate::fakes::faultproxy::Dialect;

/// The subscription every resource lives in.
pub const SUBSCRIPTION: &str = "00000000-0000-0000-0000-0000000000e2";
/// The cluster's resource group (VMs, NICs and the VNet).
pub const RESOURCE_GROUP: &str = "cloudnet-e2e-rg";
/// The tenant the service principal belongs to.
const TENANT: &str = "00000000-0000-0000-0000-00000000a11d";

/// How long the suite's NIC operations stay `InProgress`.
pub const OPERATION_TIME: Duration = Duration::from_millis(50);
/// The `Retry-After` (seconds) of the suite's write answers and operation polls, as ARM sends.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The subnet's prefixes: a /16, so the scale scenario fits beside the rest, and an IPv6 /64.
const IPV4_PREFIX: &str = "10.1.0.0/16";
const IPV6_PREFIX: &str = "fd00:0:0:e2::/64";

/// The ARM fake, serving one dual-stack subnet of one VNet.
#[derive(Debug)]
pub struct Arm {
    fake: ArmFake,
    /// Flags the reconciler runs with beyond the cloud's own.
    extra_flags: Vec<String>,
    subnet_id: String,
    range: Ipv4Net,
    range_v6: Ipv6Net,
    next_vm: AtomicU32,
}

/// A VM the suite added: its ARM ids and its primary ip-configuration's address.
#[derive(Clone, Debug)]
pub struct ArmVm {
    /// The VM's and its NIC's resource ids, and the Node `spec.providerID`.
    pub ids: VmIds,
    /// The node's own address (the NIC's primary ip-configuration).
    pub primary_ip: Ipv4Addr,
}

impl Arm {
    /// Starts a fake of its own with the suite's subnet. Operations stay `InProgress` for
    /// [`OPERATION_TIME`] and every write and poll answer carries a `Retry-After` of
    /// [`RETRY_AFTER_SECS`], as ARM's do.
    pub async fn start() -> Result<Self> {
        Self::start_with(&[], Vec::new()).await
    }

    /// [`Self::start`], the role granting `extra` actions beyond OpenShift's and the reconciler
    /// run with `flags` beyond the cloud's own.
    pub async fn start_with(extra: &[&str], flags: Vec<String>) -> Result<Self> {
        let base = ArmConfig::default();
        let permissions = base.permissions.map(|granted| {
            granted
                .into_iter()
                .chain(extra.iter().map(|a| (*a).to_owned()))
                .collect()
        });
        let fake = ArmFake::start(ArmConfig {
            permissions,
            operation_time: OPERATION_TIME,
            retry_after: Some(RETRY_AFTER_SECS),
            ..base
        })
        .await?;
        let subnet_id = fake.add_subnet(
            SUBSCRIPTION,
            RESOURCE_GROUP,
            "cloudnet-e2e-vnet",
            "workers",
            &[IPV4_PREFIX, IPV6_PREFIX],
        )?;
        Ok(Self {
            fake,
            extra_flags: flags,
            subnet_id,
            range: IPV4_PREFIX.parse()?,
            range_v6: IPV6_PREFIX.parse()?,
            next_vm: AtomicU32::new(0),
        })
    }

    /// The fake itself, to read a NIC or change it as another writer would.
    pub fn fake(&self) -> &ArmFake {
        &self.fake
    }

    /// The subnet's IPv4 prefix.
    pub fn range(&self) -> Ipv4Net {
        self.range
    }

    /// The subnet's IPv6 prefix.
    pub fn range_v6(&self) -> Ipv6Net {
        self.range_v6
    }

    /// A new VM `name` whose own address comes from the top /24 of the subnet (objects use the
    /// rest).
    pub fn add_vm(&self, name: &str) -> Result<ArmVm> {
        let n = self.next_vm.fetch_add(1, Ordering::Relaxed);
        let host = u8::try_from(n + 4).context("more than 250 VMs")?;
        let top = u32::from(self.range().broadcast()) & !0xff;
        let primary_ip = Ipv4Addr::from(top | u32::from(host));
        let ids = self.fake.add_vm(
            SUBSCRIPTION,
            RESOURCE_GROUP,
            name,
            &self.subnet_id,
            IpAddr::V4(primary_ip),
        );
        Ok(ArmVm { ids, primary_ip })
    }

    /// A new public IP `name` at `address` in the cluster's resource group, tagged with the
    /// admin's marker when `marked`: its resource id.
    pub fn add_public_ip(&self, name: &str, address: IpAddr, marked: bool) -> String {
        let tags: &[(&str, &str)] = if marked {
            &[(MARKER_PLAIN, MARKER_VALUE)]
        } else {
            &[]
        };
        self.fake
            .add_public_ip(SUBSCRIPTION, RESOURCE_GROUP, name, address, tags)
    }

    /// The NIC PUTs so far whose body carries public IP `id` on an ip-configuration (the engine's
    /// own PUTs of a NIC holding it included).
    pub fn puts_carrying(&self, id: &str) -> usize {
        self.fake
            .put_bodies()
            .iter()
            .filter(|body| {
                crate::fakes::arm::configs(body).iter().any(|c| {
                    c["properties"]["publicIPAddress"]["id"]
                        .as_str()
                        .is_some_and(|on| on.eq_ignore_ascii_case(id))
                })
            })
            .count()
    }

    /// The secondary addresses (all but the primary ip-configuration's) of each VM's NIC, read
    /// at one instant.
    pub fn addresses(&self, vms: &[&ArmVm]) -> Vec<BTreeSet<IpAddr>> {
        let nics: Vec<&str> = vms.iter().map(|vm| vm.ids.nic.as_str()).collect();
        self.fake
            .addresses_at_once(&nics)
            .into_iter()
            .zip(vms)
            .map(|(ips, vm)| {
                ips.into_iter()
                    .filter(|ip| *ip != IpAddr::V4(vm.primary_ip))
                    .collect()
            })
            .collect()
    }
}

impl ArmVm {
    /// The VM's name (its Node's).
    pub fn name(&self) -> &str {
        self.ids.vm.rsplit('/').next().unwrap_or_default()
    }
}

/// Whether a fault-proxy route (ARM's `METHOD /path`) is a NIC PUT, the one call that changes
/// state.
pub fn is_nic_put(route: &str) -> bool {
    route.starts_with("PUT ") && route.contains("/providers/Microsoft.Network/networkInterfaces/")
}

impl LocalCloud for Arm {
    fn platform(&self) -> &'static str {
        "Azure"
    }

    fn url(&self) -> &str {
        self.fake.url()
    }

    fn dialect(&self) -> Dialect {
        Dialect::Arm
    }

    /// The mounted Secret as upstream's installer writes it for a service principal.
    fn write_credentials(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, value) in [
            ("azure_client_id", "cloudnet-e2e-app"),
            ("azure_client_secret", "cloudnet-e2e-secret"),
            ("azure_tenant_id", TENANT),
            ("azure_subscription_id", SUBSCRIPTION),
            ("azure_resourcegroup", RESOURCE_GROUP),
            ("azure_region", "westeurope"),
            ("azure_resource_prefix", "cloudnet-e2e"),
        ] {
            std::fs::write(dir.join(name), value)?;
        }
        Ok(())
    }

    /// Resource Manager through the fault proxy; its metadata endpoint names the fake itself as
    /// the token authority, so tokens come straight from it (Entra ID is not Resource Manager,
    /// and the proxy's ARM faults do not apply to it), as upstream finds them.
    fn reconciler_flags(&self, api_url: &str) -> Vec<String> {
        let mut flags = vec![
            "--platform-azure-environment=AzurePublicCloud".into(),
            format!("--platform-api-url={api_url}"),
        ];
        flags.extend(self.extra_flags.iter().cloned());
        flags
    }

    fn is_mutation(&self, route: &str) -> bool {
        is_nic_put(route)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
