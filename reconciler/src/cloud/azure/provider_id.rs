//! Node `spec.providerID` → Azure VM, and the ARM resource ids the provider works with.

use thiserror::Error;

/// A providerID or resource id that names no Azure VM. The message says what was expected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ProviderIdError {
    /// The providerID is empty (the cloud provider has not initialised the node yet).
    #[error("providerID is empty; the node is not initialised by the Azure cloud provider yet")]
    Empty,
    /// The scheme is not `azure://`.
    #[error(
        "providerID {0:?} is not an Azure one: expected azure:///subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<vm>"
    )]
    NotAzure(String),
    /// A scale-set instance, whose NIC lives under the scale set (not supported, as upstream).
    #[error(
        "providerID {0:?} names a virtual machine scale set instance; only standalone VMs (Microsoft.Compute/virtualMachines) are supported"
    )]
    ScaleSet(String),
    /// The path is not the one of a VM.
    #[error(
        "providerID {0:?} does not name a VM: expected azure:///subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<vm>"
    )]
    NotVm(String),
}

/// One VM, as its ARM resource id names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VmRef {
    /// Subscription id.
    pub subscription: String,
    /// Resource group of the VM (the NIC and VNet may live elsewhere: their ids say where).
    pub resource_group: String,
    /// VM name.
    pub name: String,
}

impl VmRef {
    /// The VM's ARM resource id (`/subscriptions/.../virtualMachines/<vm>`), the instance id the
    /// engine records.
    pub fn resource_id(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{}",
            self.subscription, self.resource_group, self.name
        )
    }
}

/// The VM named by `provider_id`: `azure:///subscriptions/<s>/resourceGroups/<rg>/providers/
/// Microsoft.Compute/virtualMachines/<vm>` (also with two slashes, and with the segment keys in
/// any case, since ARM ids are case-insensitive and some tools lower-case them).
pub fn parse(provider_id: &str) -> Result<VmRef, ProviderIdError> {
    let trimmed = provider_id.trim();
    if trimmed.is_empty() {
        return Err(ProviderIdError::Empty);
    }
    let rest = strip_prefix_ci(trimmed, "azure://")
        .ok_or_else(|| ProviderIdError::NotAzure(provider_id.to_owned()))?;
    vm_from_resource_id(rest).map_err(|e| match e {
        ProviderIdError::ScaleSet(_) => ProviderIdError::ScaleSet(provider_id.to_owned()),
        _ => ProviderIdError::NotVm(provider_id.to_owned()),
    })
}

/// The VM named by an ARM resource id (`/subscriptions/.../virtualMachines/<vm>`), such as the
/// instance id recorded on an object.
pub fn vm_from_resource_id(id: &str) -> Result<VmRef, ProviderIdError> {
    let segments: Vec<&str> = id.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        [sub_key, sub, rg_key, rg, prov_key, ns, vm_key, vm]
            if sub_key.eq_ignore_ascii_case("subscriptions")
                && rg_key.eq_ignore_ascii_case("resourceGroups")
                && prov_key.eq_ignore_ascii_case("providers")
                && ns.eq_ignore_ascii_case("Microsoft.Compute")
                && vm_key.eq_ignore_ascii_case("virtualMachines")
                && [sub, rg, vm].iter().all(|s| valid_segment(s)) =>
        {
            Ok(VmRef {
                subscription: (*sub).to_owned(),
                resource_group: (*rg).to_owned(),
                name: (*vm).to_owned(),
            })
        }
        [.., kind, _, "virtualMachines", _]
            if kind.eq_ignore_ascii_case("virtualMachineScaleSets") =>
        {
            Err(ProviderIdError::ScaleSet(id.to_owned()))
        }
        _ => Err(ProviderIdError::NotVm(id.to_owned())),
    }
}

/// A subnet's place: `/subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Network/
/// virtualNetworks/<vnet>/subnets/<subnet>` (the VNet's resource group comes from here, not from
/// the VM's: shared VNets live in another group).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SubnetRef {
    /// Subscription id.
    pub subscription: String,
    /// Resource group of the VNet.
    pub resource_group: String,
    /// VNet name.
    pub vnet: String,
    /// Subnet name.
    pub subnet: String,
}

/// The subnet named by an ARM subnet id, if it is one.
pub fn subnet_from_resource_id(id: &str) -> Option<SubnetRef> {
    let segments: Vec<&str> = id.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        [
            sub_key,
            sub,
            rg_key,
            rg,
            prov_key,
            ns,
            vnet_key,
            vnet,
            subnet_key,
            subnet,
        ] if sub_key.eq_ignore_ascii_case("subscriptions")
            && rg_key.eq_ignore_ascii_case("resourceGroups")
            && prov_key.eq_ignore_ascii_case("providers")
            && ns.eq_ignore_ascii_case("Microsoft.Network")
            && vnet_key.eq_ignore_ascii_case("virtualNetworks")
            && subnet_key.eq_ignore_ascii_case("subnets")
            && [sub, rg, vnet, subnet].iter().all(|s| valid_segment(s)) =>
        {
            Some(SubnetRef {
                subscription: (*sub).to_owned(),
                resource_group: (*rg).to_owned(),
                vnet: (*vnet).to_owned(),
                subnet: (*subnet).to_owned(),
            })
        }
        _ => None,
    }
}

/// A NIC's place: subscription, resource group and name from its ARM id.
pub fn nic_from_resource_id(id: &str) -> Option<(String, String, String)> {
    let segments: Vec<&str> = id.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        [sub_key, sub, rg_key, rg, prov_key, ns, nic_key, nic]
            if sub_key.eq_ignore_ascii_case("subscriptions")
                && rg_key.eq_ignore_ascii_case("resourceGroups")
                && prov_key.eq_ignore_ascii_case("providers")
                && ns.eq_ignore_ascii_case("Microsoft.Network")
                && nic_key.eq_ignore_ascii_case("networkInterfaces")
                && [sub, rg, nic].iter().all(|s| valid_segment(s)) =>
        {
            Some(((*sub).to_owned(), (*rg).to_owned(), (*nic).to_owned()))
        }
        _ => None,
    }
}

fn valid_segment(segment: &str) -> bool {
    !segment.is_empty() && !segment.contains(['?', '#', '%', '\\'])
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ID: &str = "azure:///subscriptions/0000-11/resourceGroups/rg-a/providers/Microsoft.Compute/virtualMachines/worker-0";

    #[test]
    fn the_cloud_providers_form_names_the_vm() {
        let vm = parse(ID).unwrap();
        assert_eq!(vm.subscription, "0000-11");
        assert_eq!(vm.resource_group, "rg-a");
        assert_eq!(vm.name, "worker-0");
        assert_eq!(
            vm.resource_id(),
            "/subscriptions/0000-11/resourceGroups/rg-a/providers/Microsoft.Compute/virtualMachines/worker-0"
        );
        assert_eq!(vm_from_resource_id(&vm.resource_id()).unwrap(), vm);
    }

    #[test]
    fn lower_cased_keys_and_two_slashes_are_accepted() {
        let vm = parse("azure://subscriptions/s/resourcegroups/RG/providers/microsoft.compute/virtualmachines/vm1").unwrap();
        assert_eq!(
            (vm.resource_group.as_str(), vm.name.as_str()),
            ("RG", "vm1")
        );
    }

    #[test]
    fn other_forms_are_refused_with_what_was_expected() {
        assert_eq!(parse(" "), Err(ProviderIdError::Empty));
        assert!(matches!(
            parse("aws:///us-east-1a/i-0123"),
            Err(ProviderIdError::NotAzure(_))
        ));
        let vmss = "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/3";
        assert!(matches!(parse(vmss), Err(ProviderIdError::ScaleSet(_))));
        let short = "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines";
        let err = parse(short).unwrap_err();
        assert!(
            err.to_string().contains("expected azure:///subscriptions/"),
            "{err}"
        );
        let empty_name = "azure:///subscriptions/s/resourceGroups//providers/Microsoft.Compute/virtualMachines/vm";
        assert!(matches!(parse(empty_name), Err(ProviderIdError::NotVm(_))));
    }

    #[test]
    fn subnet_and_nic_ids_split_into_their_parts() {
        let subnet = subnet_from_resource_id(
            "/subscriptions/s/resourceGroups/net-rg/providers/Microsoft.Network/virtualNetworks/vn/subnets/workers",
        )
        .unwrap();
        assert_eq!(subnet.resource_group, "net-rg");
        assert_eq!(
            (subnet.vnet.as_str(), subnet.subnet.as_str()),
            ("vn", "workers")
        );
        assert!(subnet_from_resource_id("/subscriptions/s/resourceGroups/rg").is_none());
        let nic = nic_from_resource_id(
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/nic0",
        )
        .unwrap();
        assert_eq!(nic, ("s".into(), "rg".into(), "nic0".into()));
    }
}
