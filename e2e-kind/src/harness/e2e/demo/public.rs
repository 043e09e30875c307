//! The demo's public address on EC2 (moto): an Elastic IP tagged with the admin's marker, bound
//! to an egress IP with an `EgressPublicIP`, associated with it on its node's ENI and following
//! it when it moves (docs/public-ips.md).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cloudnet_shared::public_ip::{EgressPublicIP, EgressPublicIPSpec, MARKER_KEY, MARKER_VALUE};
use kube::api::PostParams;
use kube::{Api, Client};

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
    let binding = EgressPublicIP::new(
        BINDING,
        EgressPublicIPSpec {
            private_ip: private_ip.to_owned(),
            public_ip: id.clone(),
        },
    );
    Api::<EgressPublicIP>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .context("creating the EgressPublicIP")?;
    Ok(id)
}

/// Waits until the binding is Associated on `node`.
pub(super) async fn wait_associated(client: &Client, node: &str) -> Result<()> {
    let api: Api<EgressPublicIP> = Api::all(client.clone());
    let give_up = Instant::now() + ASSOCIATE_WITHIN;
    loop {
        let binding = api.get(BINDING).await?;
        let on = binding.status.as_ref().is_some_and(|s| s.node == node);
        if on
            && binding
                .associated_condition()
                .is_some_and(|c| c.status == "True")
        {
            return Ok(());
        }
        if Instant::now() > give_up {
            bail!(
                "{BINDING} not associated on {node} within {ASSOCIATE_WITHIN:?}: {:?}",
                binding.status
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
