//! Elastic IPs that follow egress IPs (docs/public-ips.md): DescribeAddresses by allocation id
//! (association and tags), AssociateAddress with the ENI and the private IP (`AllowReassociation`,
//! so one call moves it from the old node's ENI), DisassociateAddress by association id (so only
//! the association we made is undone).
//!
//! The three actions are opt-in permissions: a refusal (`UnauthorizedOperation`) becomes
//! [`PublicIpError::MissingPermission`] naming the `ec2:` permission, and touches nothing else.
//! The calls are paced from their own EC2 buckets; none is retried here except the read, since
//! the caller decides again from a fresh read after a failure.

use std::net::IpAddr;

use async_trait::async_trait;
use aws_sdk_ec2::types::Address;
use cloudnet_shared::Platform;
use cloudnet_shared::public_ip::{MARKER_KEY, MARKER_VALUE};

use super::{AwsProvider, driver, errors};
use crate::cloud::CloudError;
use crate::cloud::public_ip::{
    Association, PublicAddress, PublicIpError, PublicIps, require_marker,
};

/// The read.
const DESCRIBE: &str = "DescribeAddresses";
/// The mutating actions, paced as mutating calls.
pub const MUTATING_APIS: [&str; 2] = ["AssociateAddress", "DisassociateAddress"];
const ASSOCIATE: &str = MUTATING_APIS[0];
const DISASSOCIATE: &str = MUTATING_APIS[1];

/// How messages name the cloud.
const CLOUD: &str = "EC2";

/// The IAM permission of EC2 `action`.
const fn permission(action: &str) -> &'static str {
    match action.as_bytes() {
        b"AssociateAddress" => "ec2:AssociateAddress",
        b"DisassociateAddress" => "ec2:DisassociateAddress",
        _ => "ec2:DescribeAddresses",
    }
}

/// The public-address error for a failed `action`: a refused permission and an unknown
/// allocation are told apart from every other failure, which keeps its EC2 classification.
fn classified(action: &'static str, id: &str, error: CloudError) -> PublicIpError {
    let code = |c: &str| error.message.contains(&format!("({c})"));
    if code("UnauthorizedOperation") {
        PublicIpError::MissingPermission {
            cloud: CLOUD,
            action,
            permission: permission(action),
        }
    } else if code("InvalidAllocationID.NotFound") || code("InvalidAllocationID.Malformed") {
        PublicIpError::NotFound {
            cloud: CLOUD,
            id: id.to_owned(),
        }
    } else {
        PublicIpError::Cloud(error)
    }
}

/// An Elastic IP as DescribeAddresses lists it.
fn public_address(address: &Address) -> PublicAddress {
    let marked = address
        .tags()
        .iter()
        .any(|t| t.key() == Some(MARKER_KEY) && t.value() == Some(MARKER_VALUE));
    let association = match (address.association_id(), address.network_interface_id()) {
        (Some(id), Some(interface)) => Some(Association {
            id: id.to_owned(),
            interface: interface.to_owned(),
            private_ip: address
                .private_ip_address()
                .and_then(|ip| ip.parse::<IpAddr>().ok()),
        }),
        _ => None,
    };
    PublicAddress {
        id: address.allocation_id().unwrap_or_default().to_owned(),
        address: address.public_ip().and_then(|ip| ip.parse().ok()),
        marked,
        association,
    }
}

#[async_trait]
impl PublicIps for AwsProvider {
    async fn public_address(&self, id: &str) -> Result<PublicAddress, PublicIpError> {
        let answer = self
            .read(DESCRIBE, || {
                self.client.describe_addresses().allocation_ids(id).send()
            })
            .await
            .map_err(|e| classified(DESCRIBE, id, e))?;
        answer
            .addresses()
            .iter()
            .find(|a| a.allocation_id() == Some(id))
            .map(public_address)
            .ok_or_else(|| PublicIpError::NotFound {
                cloud: CLOUD,
                id: id.to_owned(),
            })
    }

    async fn associate(
        &self,
        address: &PublicAddress,
        interface: &str,
        private_ip: IpAddr,
    ) -> Result<Association, PublicIpError> {
        require_marker(address, Platform::Aws)?;
        let call = async {
            self.client
                .associate_address()
                .allocation_id(&address.id)
                .network_interface_id(interface)
                .private_ip_address(private_ip.to_string())
                // Without it EC2 refuses an address associated elsewhere (the old node's ENI)
                // with Resource.AlreadyAssociated; with it one call moves it.
                .allow_reassociation(true)
                .send()
                .await
                .map_err(|e| errors::classify(ASSOCIATE, &e))
        };
        let answer = driver::paced(&self.bucket(ASSOCIATE), call)
            .await
            .map_err(|e| classified(ASSOCIATE, &address.id, e))?;
        Ok(Association {
            id: answer.association_id().unwrap_or_default().to_owned(),
            interface: interface.to_owned(),
            private_ip: Some(private_ip),
        })
    }

    async fn disassociate(&self, id: &str, association: &Association) -> Result<(), PublicIpError> {
        let call = async {
            self.client
                .disassociate_address()
                .association_id(&association.id)
                .send()
                .await
                .map(drop)
                .map_err(|e| errors::classify(DISASSOCIATE, &e))
        };
        match driver::paced(&self.bucket(DISASSOCIATE), call).await {
            Ok(()) => Ok(()),
            // Moved or removed since: that association is gone, which is what was asked.
            Err(error) if error.message.contains("(InvalidAssociationID.NotFound)") => Ok(()),
            Err(error) => Err(classified(DISASSOCIATE, id, error)),
        }
    }
}
