//! The seam for public addresses that follow egress IPs (docs/public-ips.md): read one public
//! address with its association and the admin's marker, associate it with a private IP on an
//! interface, undo an association of ours. Each cloud implements [`PublicIps`]; nothing here
//! knows an SDK's types.
//!
//! The marker is checked at this layer, before any association call, so no caller can move a
//! public address the admin has not marked for cloudnet, whatever a binding names.

use std::net::IpAddr;

use async_trait::async_trait;
use cloudnet_shared::Platform;
use cloudnet_shared::public_ip::{AssociatedReason, marker};
use thiserror::Error;

use super::{CloudError, ErrorKind};

/// A public address as the cloud shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicAddress {
    /// The cloud's id of it (AWS allocation id, Azure resource id, floating IP id).
    pub id: String,
    /// The public IP itself, when the cloud says it.
    pub address: Option<IpAddr>,
    /// Whether it carries the admin's marker (`cloudnet_shared::public_ip::marker`).
    pub marked: bool,
    /// Where it is associated now, if anywhere.
    pub association: Option<Association>,
}

/// One association of a public address with a private IP on an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Association {
    /// The cloud's id of this association (AWS `eipassoc-…`), which undoes exactly it.
    pub id: String,
    /// The interface (ENI id, NIC id, port id).
    pub interface: String,
    /// The private IP on the interface, when the cloud says it.
    pub private_ip: Option<IpAddr>,
}

impl PublicAddress {
    /// Whether it sits on `private_ip` of `interface` now.
    pub fn is_on(&self, interface: &str, private_ip: IpAddr) -> bool {
        self.association
            .as_ref()
            .is_some_and(|a| same_id(&a.interface, interface) && a.private_ip == Some(private_ip))
    }
}

impl Association {
    /// Whether `other` is this same association: ids and interfaces compare as [`same_id`] does.
    pub fn is(&self, other: &Association) -> bool {
        same_id(&self.id, &other.id)
            && same_id(&self.interface, &other.interface)
            && self.private_ip == other.private_ip
    }
}

/// Whether two of the cloud's ids name one thing. Without regard to ASCII case: ARM compares its
/// resource ids so, and answers a public IP's `ipConfiguration.id` with the resource group in
/// another case than the NIC's own id has; the other clouds' ids are lower case throughout.
pub fn same_id(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Why a public-address call failed, sorted by what the binding's condition says.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum PublicIpError {
    /// The credentials lack one permission; only the bindings are affected.
    #[error(
        "{cloud} refused {action}: the reconciler's credentials lack the permission {permission}, which public addresses that follow egress IPs need (docs/public-ips.md); nothing else is affected"
    )]
    MissingPermission {
        /// The cloud, as messages name it.
        cloud: &'static str,
        /// The API action refused.
        action: &'static str,
        /// The permission to grant, as the cloud's IAM spells it.
        permission: &'static str,
    },
    /// The cloud has no public address with this id.
    #[error("{cloud} has no public address {id}: check spec.publicIP")]
    NotFound {
        /// The cloud.
        cloud: &'static str,
        /// The id asked for.
        id: String,
    },
    /// The public address lacks the admin's marker: never touched.
    #[error(
        "public address {id} does not carry {marker}, so cloudnet leaves it alone; add the marker in the cloud to let it follow the egress IP"
    )]
    MarkerMissing {
        /// The id.
        id: String,
        /// The marker, as `cloudnet_shared::public_ip::marker` spells it.
        marker: &'static str,
    },
    /// Any other failure of the call.
    #[error(transparent)]
    Cloud(#[from] CloudError),
}

impl PublicIpError {
    /// The `Associated` condition's reason for this failure.
    pub fn reason(&self) -> AssociatedReason {
        match self {
            Self::MissingPermission { .. } => AssociatedReason::PermissionDenied,
            Self::NotFound { .. } => AssociatedReason::PublicIPNotFound,
            Self::MarkerMissing { .. } => AssociatedReason::MarkerMissing,
            Self::Cloud(_) => AssociatedReason::CloudError,
        }
    }

    /// Whether trying again soon may succeed (throttling, transient failures); the others wait
    /// for the admin.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Cloud(CloudError {
                kind: ErrorKind::Throttled | ErrorKind::Retryable | ErrorKind::Conflict,
                ..
            })
        )
    }
}

/// A cloud's public addresses.
#[async_trait]
pub trait PublicIps: Send + Sync {
    /// The public address `id`: where it is associated and whether it is marked.
    async fn public_address(&self, id: &str) -> Result<PublicAddress, PublicIpError>;

    /// Associates `address` with `private_ip` of the VM whose primary interface is `interface`
    /// (the engine's view of the VM the ledger holds the IP on), moving it from wherever it is;
    /// refused without a call when it is not marked. Associating it where it already is succeeds.
    async fn associate(
        &self,
        address: &PublicAddress,
        interface: &str,
        private_ip: IpAddr,
    ) -> Result<Association, PublicIpError>;

    /// Undoes `association` of public address `id` (the address itself is kept). An association
    /// that no longer exists (moved or removed by someone else since) is left alone: success.
    async fn disassociate(&self, id: &str, association: &Association) -> Result<(), PublicIpError>;

    /// Whether `address` already serves `private_ip` of the VM whose primary interface is
    /// `interface`, so no call is needed. A cloud that associates elsewhere than the primary
    /// interface (OpenStack: the private IP's own reservation port) says so here.
    fn serves(&self, address: &PublicAddress, interface: &str, private_ip: IpAddr) -> bool {
        address.is_on(interface, private_ip)
    }
}

/// The refusal of an unmarked address, for every cloud's `associate`.
pub fn require_marker(address: &PublicAddress, platform: Platform) -> Result<(), PublicIpError> {
    if address.marked {
        Ok(())
    } else {
        Err(PublicIpError::MarkerMissing {
            id: address.id.clone(),
            marker: marker(platform),
        })
    }
}
