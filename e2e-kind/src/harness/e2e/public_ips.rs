//! Public addresses that follow egress IPs, as the tests, the benchmark and the demo set them up:
//! the opt-in EgressPublicIP CRD installed, bindings made, waited on and deleted, Elastic IPs
//! allocated in moto with or without the admin's marker, and where moto says one is associated.

use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_ec2::types::{DomainType, ResourceType, Tag, TagSpecification};
use cloudnet_shared::public_ip::{
    EgressPublicIP, EgressPublicIPSpec, EgressPublicIPStatus, MARKER_KEY, MARKER_VALUE,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

use super::{Cluster, metrics, plugin, wait};

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
    wait_served(client).await
}

/// Installs the CRD unless a test of the suite did (or does at the same time), and waits until
/// it is served.
pub async fn ensure_crd(client: &Client) -> Result<()> {
    let result = Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &cloudnet_shared::public_ip::crd())
        .await;
    match result {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("installing the EgressPublicIP CRD"),
    }
    wait_served(client).await
}

async fn wait_served(client: &Client) -> Result<()> {
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

/// Creates binding `name`: the public address `public` (the cloud's id) follows egress IP
/// `private`.
pub async fn bind(client: &Client, name: &str, private: IpAddr, public: &str) -> Result<()> {
    let binding = EgressPublicIP::new(
        name,
        EgressPublicIPSpec {
            private_ip: private.to_string(),
            public_ip: public.to_owned(),
        },
    );
    Api::<EgressPublicIP>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .with_context(|| format!("creating EgressPublicIP {name}"))?;
    Ok(())
}

/// Waits until binding `name`'s `Associated` condition has `reason` with `node` in its status
/// (any node when `None`) and the cloud agrees (`cloud`, read on every poll); returns the status.
pub async fn wait_reason<F, Fut>(
    client: &Client,
    name: &str,
    reason: &str,
    node: Option<&str>,
    within: Duration,
    mut cloud: F,
) -> Result<EgressPublicIPStatus>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let api: Api<EgressPublicIP> = Api::all(client.clone());
    let what = format!("EgressPublicIP {name} {reason} on node {node:?} and the cloud agreeing");
    wait::found(within, &what, || {
        let (api, agrees) = (&api, cloud());
        async move {
            let binding = api.get(name).await?;
            let reached = binding
                .associated_condition()
                .is_some_and(|c| c.reason == reason)
                && binding
                    .status
                    .as_ref()
                    .is_some_and(|s| node.is_none_or(|node| s.node == node));
            let agreed = reached && agrees.await?;
            Ok(binding.status.filter(|_| agreed))
        }
    })
    .await
}

/// Deletes binding `name` and waits until it is gone (its finalizer released) and `cloud` holds.
pub async fn unbind<F, Fut>(
    client: &Client,
    name: &str,
    within: Duration,
    mut cloud: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let api: Api<EgressPublicIP> = Api::all(client.clone());
    api.delete(name, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting EgressPublicIP {name}"))?;
    let what = format!("EgressPublicIP {name} gone and the cloud agreeing");
    wait::until(within, &what, || {
        let (api, agrees) = (&api, cloud());
        async move { Ok(api.get_opt(name).await?.is_none() && agrees.await?) }
    })
    .await
}

/// The association calls that succeeded, by the local reconciler's own count (a call that found
/// nothing to change included).
pub async fn associations(cluster: &Cluster) -> Result<f64> {
    let text = cluster
        .reconciler_metrics()
        .await?
        .context("the reconciler's metrics are read only on a local system")?;
    Ok(metrics::sum(
        &text,
        "cloudnet_public_ip_associations_total",
        &["outcome=\"associated\""],
    ))
}

/// A binding that followed its egress IP's move, and how long it took (information for the
/// reports, never a bound).
#[derive(Debug)]
pub struct Followed {
    /// The binding's status once it followed.
    pub status: EgressPublicIPStatus,
    /// From the egress IP seen attached on the new node.
    pub after_attach: Duration,
    /// From the move's patch.
    pub after_patch: Duration,
}

/// Moves egress IP object `object` to `node` as OVN-Kubernetes does (the same object's
/// `spec.node`), waits until it is attached there, then until binding `name` is `Associated` on
/// `node` and `cloud` agrees ([`wait_reason`]).
pub async fn follow_move<F, Fut>(
    client: &Client,
    object: &str,
    name: &str,
    node: &str,
    within: Duration,
    cloud: F,
) -> Result<Followed>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let moved = Instant::now();
    plugin::retarget(client, object, node).await?;
    plugin::wait_assigned(client, object, node).await?;
    let attached = Instant::now();
    let status = wait_reason(client, name, "Associated", Some(node), within, cloud).await?;
    Ok(Followed {
        status,
        after_attach: attached.elapsed(),
        after_patch: moved.elapsed(),
    })
}
