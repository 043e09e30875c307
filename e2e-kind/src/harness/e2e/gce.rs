//! GCE as the local system's cloud: the project's GCE fake (schema-checked against the Compute v1
//! discovery document) with a subnetwork of its own, and the VMs a test adds to it.

use std::any::Any;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};
use ipnet::Ipv4Net;

use super::cloud::LocalCloud;
use crate::fakes::faultproxy::Dialect;
use crate::fakes::gce::{
    self, GceFake, HOST_PROJECT, InstanceSpec, PROJECT, REGION, SubnetSpec, ZONE,
};

/// The one Compute method that changes state; the suite counts it at the fault proxy.
pub const GCE_MUTATION: &str = "instances.updateNetworkInterface";

/// The subnetwork the suite's VMs live in: a /16, so the scale scenario fits beside the rest.
const SUBNET: &str = "e2e";

/// The GCE fake, serving one /16 subnetwork (a shared VPC's, in [`HOST_PROJECT`]).
#[derive(Debug)]
pub struct Gce {
    fake: GceFake,
    url: String,
    subnet: SubnetSpec,
    next_vm: AtomicU32,
}

impl Gce {
    /// Starts a fake of its own with the suite's subnetwork; callers need a bearer token.
    pub async fn start() -> Result<Self> {
        let fake = GceFake::start().await?;
        fake.require_auth(true);
        let subnet = SubnetSpec {
            project: HOST_PROJECT.into(),
            region: REGION.into(),
            name: SUBNET.into(),
            primary: Ipv4Net::new(Ipv4Addr::new(10, 0, 0, 0), 16)?,
            secondary: Vec::new(),
            ipv6: None,
        };
        fake.add_subnet(subnet.clone());
        Ok(Self {
            url: fake.url(),
            fake,
            subnet,
            next_vm: AtomicU32::new(0),
        })
    }

    /// The fake itself, to read a VM's aliases or change them as another client would.
    pub fn fake(&self) -> &GceFake {
        &self.fake
    }

    /// The subnetwork's primary range.
    pub fn range(&self) -> Ipv4Net {
        self.subnet.primary
    }

    /// A new VM `name` whose own address comes from the top /24 of the subnetwork (objects use
    /// the rest).
    pub fn add_vm(&self, name: &str) -> Result<InstanceSpec> {
        let n = self.next_vm.fetch_add(1, Ordering::Relaxed);
        let host = u8::try_from(n + 2).context("more than 250 VMs")?;
        let top = u32::from(self.subnet.primary.broadcast()) & !0xff;
        let vm = InstanceSpec {
            project: PROJECT.into(),
            zone: ZONE.into(),
            name: name.into(),
            subnet: (
                self.subnet.project.clone(),
                self.subnet.region.clone(),
                self.subnet.name.clone(),
            ),
            network_ip: Ipv4Addr::from(top | u32::from(host)),
        };
        self.fake.add_instance(vm.clone())?;
        Ok(vm)
    }

    /// `nic0`'s aliases of each VM in `vms`, as addresses, read at one instant.
    pub fn aliases(&self, vms: &[&str]) -> Vec<BTreeSet<IpAddr>> {
        self.fake
            .aliases_at_once(PROJECT, ZONE, vms)
            .iter()
            .map(|cidrs| {
                cidrs
                    .iter()
                    .filter_map(|cidr| cidr.parse::<Ipv4Net>().ok())
                    .map(|net| IpAddr::V4(net.addr()))
                    .collect()
            })
            .collect()
    }

    /// Sets `vm`'s aliases as another client would (its fingerprint rotates).
    pub fn set_aliases(&self, vm: &str, ips: &[IpAddr]) -> Result<()> {
        let cidrs: Vec<String> = ips.iter().map(|ip| format!("{ip}/32")).collect();
        let cidrs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
        self.fake.set_aliases(PROJECT, ZONE, vm, &cidrs)
    }
}

impl LocalCloud for Gce {
    fn platform(&self) -> &'static str {
        "GCP"
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn dialect(&self) -> Dialect {
        Dialect::Gce
    }

    fn write_credentials(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        gce::write_service_account(dir).map(drop)
    }

    fn reconciler_flags(&self, api_url: &str) -> Vec<String> {
        vec![format!("--platform-api-url={api_url}")]
    }

    fn is_mutation(&self, route: &str) -> bool {
        route == GCE_MUTATION
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
