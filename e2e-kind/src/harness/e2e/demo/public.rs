//! The demo's public address on EC2 (moto): an Elastic IP tagged with the admin's marker, bound
//! to an egress IP with an `EgressPublicIP`, associated with it on its node's ENI and following
//! it when it moves (docs/public-ips.md).

use std::time::Duration;

use anyhow::{Context, Result};
use cloudnet_shared::public_ip::{AssociatedReason, MARKER_KEY, MARKER_VALUE};
use kube::Client;

use crate::harness::e2e::public_ips;

/// The binding's name.
pub(super) const BINDING: &str = "partner-a";

/// How long the reconciler may take to pick up the CRD (it looks every 30 s) and associate.
const ASSOCIATE_WITHIN: Duration = Duration::from_secs(120);

/// Allocates an Elastic IP with the marker, binds it to `private_ip`; returns its allocation id.
pub(super) async fn bind(
    client: &Client,
    ec2: &aws_sdk_ec2::Client,
    private_ip: &str,
) -> Result<String> {
    let (id, address) = public_ips::allocate(ec2, true).await?;
    println!("Elastic IP {address} ({id}) tagged {MARKER_KEY}={MARKER_VALUE}");
    let private_ip = private_ip
        .parse()
        .with_context(|| format!("egress IP {private_ip:?}"))?;
    public_ips::bind(client, BINDING, private_ip, &id).await?;
    Ok(id)
}

/// Waits until the binding is Associated on `node`.
pub(super) async fn wait_associated(client: &Client, node: &str) -> Result<()> {
    let reason = AssociatedReason::Associated.as_str();
    public_ips::wait_reason(
        client,
        BINDING,
        reason,
        Some(node),
        ASSOCIATE_WITHIN,
        || async { Ok(true) },
    )
    .await?;
    Ok(())
}

/// Prints where EC2 says Elastic IP `id` is associated.
pub(super) async fn show_address(ec2: &aws_sdk_ec2::Client, id: &str) -> Result<()> {
    match public_ips::association(ec2, id).await? {
        Some((eni, association)) => {
            println!("EC2 DescribeAddresses: {id} associated on {eni} ({association})");
        }
        None => println!("EC2 DescribeAddresses: {id} not associated"),
    }
    Ok(())
}
