//! Public addresses that follow egress IPs, as the tests, the benchmark and the demo set them up:
//! the opt-in EgressPublicIP CRD installed, Elastic IPs allocated in moto with or without the
//! admin's marker, and where moto says one is associated.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_ec2::types::{DomainType, ResourceType, Tag, TagSpecification};
use cloudnet_shared::public_ip::{EgressPublicIP, MARKER_KEY, MARKER_VALUE};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

/// The opt-in EC2 actions of public addresses (docs/clouds/aws.md), beyond OpenShift's
/// CredentialsRequest.
pub const EC2_ACTIONS: [&str; 3] = [
    "DescribeAddresses",
    "AssociateAddress",
    "DisassociateAddress",
];

/// How long the CRD may take to be served on a loaded machine.
const SERVED_WITHIN: Duration = Duration::from_secs(60);

/// Installs the EgressPublicIP CRD (`manifests/public-ips/`) and waits until it is served.
pub async fn install_crd(client: &Client) -> Result<()> {
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &cloudnet_shared::public_ip::crd())
        .await
        .context("installing the EgressPublicIP CRD")?;
    let api: Api<EgressPublicIP> = Api::all(client.clone());
    let give_up = Instant::now() + SERVED_WITHIN;
    while api.list(&ListParams::default().limit(1)).await.is_err() {
        if Instant::now() > give_up {
            bail!("the EgressPublicIP CRD is not served after {SERVED_WITHIN:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A new Elastic IP, tagged with the admin's marker when `marked`: its allocation id and address.
pub async fn allocate(ec2: &aws_sdk_ec2::Client, marked: bool) -> Result<(String, String)> {
    let mut tags = TagSpecification::builder().resource_type(ResourceType::ElasticIp);
    if marked {
        tags = tags.tags(Tag::builder().key(MARKER_KEY).value(MARKER_VALUE).build());
    }
    let answer = ec2
        .allocate_address()
        .domain(DomainType::Vpc)
        .tag_specifications(tags.build())
        .send()
        .await
        .context("AllocateAddress")?;
    let id = answer
        .allocation_id()
        .context("AllocateAddress gave no allocation id")?;
    Ok((
        id.to_owned(),
        answer.public_ip().unwrap_or_default().to_owned(),
    ))
}

/// Where moto says Elastic IP `id` is associated: its ENI and association id, if anywhere.
pub async fn association(ec2: &aws_sdk_ec2::Client, id: &str) -> Result<Option<(String, String)>> {
    let answer = ec2
        .describe_addresses()
        .allocation_ids(id)
        .send()
        .await
        .context("DescribeAddresses")?;
    let address = answer
        .addresses()
        .first()
        .with_context(|| format!("no Elastic IP {id}"))?;
    Ok(
        match (address.network_interface_id(), address.association_id()) {
            (Some(eni), Some(association)) if !eni.is_empty() => {
                Some((eni.to_owned(), association.to_owned()))
            }
            _ => None,
        },
    )
}
