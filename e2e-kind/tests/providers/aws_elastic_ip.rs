#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Elastic IPs that follow an egress IP (docs/public-ips.md), the AWS provider against moto
//! behind the fault proxy: read with its association and the admin's marker tag, associated with
//! (ENI, private IP), moved to another ENI in one call, disassociated by our association only;
//! an unmarked address is never touched; a refused permission is named.
//!
//! moto 5.2.5 takes `AssociateAddress` with `NetworkInterfaceId` and `AllowReassociation` as EC2
//! does (refusing a move without it with `Resource.AlreadyAssociated`), but ignores
//! `PrivateIpAddress`: it does not check that the ENI holds the address, and `DescribeAddresses`
//! then reports the ENI's primary address as the association's. So these tests assert the ENI of
//! an association, never its private IP.

use std::net::{IpAddr, Ipv4Addr};

use aws_sdk_ec2::types::{DomainType, ResourceType, Tag, TagSpecification};
use cloudnet_e2e::fakes::faultproxy::{Dialect, EC2_CREDENTIALS_REQUEST, FaultProxy};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::e2e::ec2::{Instance, moto_instances, moto_settings};
use cloudnet_reconciler::cloud::aws::AwsProvider;
use cloudnet_reconciler::cloud::public_ip::{PublicAddress, PublicIpError, PublicIps};
use cloudnet_shared::public_ip::{MARKER_KEY, MARKER_VALUE};

/// Two instances in one subnet, each with an egress IP on its primary ENI.
struct World {
    ec2: aws_sdk_ec2::Client,
    nodes: Vec<Instance>,
    egress_ip: IpAddr,
}

impl World {
    async fn create(moto: &MotoServer, region: &str) -> Self {
        let (ec2, network, nodes) = moto_instances(moto.url(), region, 2).await.unwrap();
        let [a, b, c, _] = network.ipv4.network().octets();
        let egress_ip = IpAddr::V4(Ipv4Addr::new(a, b, c, 40));
        let world = Self {
            ec2,
            nodes,
            egress_ip,
        };
        world.place_egress_ip(0).await;
        world
    }

    /// Moves the egress IP onto node `to`'s ENI, as the engine does before the public address
    /// follows.
    async fn place_egress_ip(&self, to: usize) {
        for (i, node) in self.nodes.iter().enumerate() {
            let ip = self.egress_ip.to_string();
            if i == to {
                self.ec2
                    .assign_private_ip_addresses()
                    .network_interface_id(&node.eni)
                    .private_ip_addresses(ip)
                    .send()
                    .await
                    .unwrap();
            } else if i < to {
                self.ec2
                    .unassign_private_ip_addresses()
                    .network_interface_id(&node.eni)
                    .private_ip_addresses(ip)
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    /// A new Elastic IP, tagged with `tags`.
    async fn allocate(&self, tags: &[(&str, &str)]) -> String {
        let mut spec = TagSpecification::builder().resource_type(ResourceType::ElasticIp);
        for (key, value) in tags {
            spec = spec.tags(Tag::builder().key(*key).value(*value).build());
        }
        self.ec2
            .allocate_address()
            .domain(DomainType::Vpc)
            .tag_specifications(spec.build())
            .send()
            .await
            .unwrap()
            .allocation_id()
            .unwrap()
            .to_owned()
    }

    /// The ENI the Elastic IP is associated with, read directly (not through the provider).
    async fn associated_eni(&self, allocation_id: &str) -> Option<String> {
        let answer = self
            .ec2
            .describe_addresses()
            .allocation_ids(allocation_id)
            .send()
            .await
            .unwrap();
        answer.addresses()[0]
            .network_interface_id()
            .filter(|eni| !eni.is_empty())
            .map(str::to_owned)
    }
}

async fn setup(region: &str, permitted: Option<&[&str]>) -> (World, FaultProxy, AwsProvider) {
    let moto = MotoServer::shared().await.unwrap();
    let world = World::create(moto, region).await;
    let mut proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query);
    if let Some(actions) = permitted {
        proxy = proxy.permit(actions.iter().copied());
    }
    let proxy = proxy.start().await.unwrap();
    let provider = AwsProvider::new(&moto_settings(proxy.url(), region)).unwrap();
    (world, proxy, provider)
}

#[tokio::test]
async fn a_marked_elastic_ip_follows_the_egress_ip_to_another_eni_and_only_our_association_is_undone()
 {
    let (world, proxy, provider) = setup("ap-northeast-2", None).await;
    let id = world
        .allocate(&[(MARKER_KEY, MARKER_VALUE), ("team", "a")])
        .await;
    let read = provider.public_address(&id).await.unwrap();
    assert_eq!(read.id, id);
    assert!(read.marked);
    assert!(read.address.is_some());
    assert_eq!(read.association, None);

    let (eni_a, eni_b) = (world.nodes[0].eni.clone(), world.nodes[1].eni.clone());
    let first = provider
        .associate(&read, &eni_a, world.egress_ip)
        .await
        .unwrap();
    assert!(first.id.starts_with("eipassoc-"), "{first:?}");
    assert_eq!(first.interface, eni_a);
    assert_eq!(
        world.associated_eni(&id).await.as_deref(),
        Some(eni_a.as_str())
    );
    let read = provider.public_address(&id).await.unwrap();
    assert_eq!(
        read.association.as_ref().map(|a| a.id.as_str()),
        Some(first.id.as_str())
    );

    // The egress IP moves; one AssociateAddress moves the public address after it.
    world.place_egress_ip(1).await;
    let second = provider
        .associate(&read, &eni_b, world.egress_ip)
        .await
        .unwrap();
    assert_ne!(second.id, first.id);
    assert_eq!(
        world.associated_eni(&id).await.as_deref(),
        Some(eni_b.as_str())
    );
    assert_eq!(proxy.counts("AssociateAddress").forwarded, 2);

    // The first association no longer exists: undoing it succeeds and leaves the second alone.
    provider.disassociate(&id, &first).await.unwrap();
    assert_eq!(
        world.associated_eni(&id).await.as_deref(),
        Some(eni_b.as_str())
    );
    provider.disassociate(&id, &second).await.unwrap();
    assert_eq!(world.associated_eni(&id).await, None);
    let kept = provider.public_address(&id).await.unwrap();
    assert_eq!(
        kept.association, None,
        "the allocation is kept, unassociated"
    );
    assert_eq!(proxy.counts("DisassociateAddress").forwarded, 2);
}

#[tokio::test]
async fn an_elastic_ip_without_the_marker_is_never_associated() {
    let (world, proxy, provider) = setup("eu-south-2", None).await;
    for tags in [
        &[][..],
        &[(MARKER_KEY, "false")][..],
        &[("cloudnet.io/other", MARKER_VALUE)][..],
    ] {
        let id = world.allocate(tags).await;
        let read = provider.public_address(&id).await.unwrap();
        refused_unmarked(
            &provider,
            &read,
            &world.nodes[0].eni,
            world.egress_ip,
            "tag cloudnet.io/egress-public-ip=true",
        )
        .await;
        assert_eq!(world.associated_eni(&id).await, None);
    }
    assert_eq!(
        proxy.counts("AssociateAddress").forwarded,
        0,
        "refused before any call"
    );
}

#[tokio::test]
async fn each_missing_permission_is_named_and_an_unknown_allocation_is_not_found() {
    let with_describe: Vec<&str> = EC2_CREDENTIALS_REQUEST
        .iter()
        .copied()
        .chain(["DescribeAddresses"])
        .collect();
    let (world, _proxy, provider) = setup("ap-south-2", Some(&EC2_CREDENTIALS_REQUEST)).await;
    let id = world.allocate(&[(MARKER_KEY, MARKER_VALUE)]).await;
    let error = provider.public_address(&id).await.unwrap_err();
    assert_eq!(
        error,
        PublicIpError::MissingPermission {
            cloud: "EC2",
            action: "DescribeAddresses",
            permission: "ec2:DescribeAddresses",
        }
    );
    assert!(
        error
            .to_string()
            .contains("lack the permission ec2:DescribeAddresses"),
        "{error}"
    );

    let moto = MotoServer::shared().await.unwrap();
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .permit(with_describe)
        .start()
        .await
        .unwrap();
    let provider = AwsProvider::new(&moto_settings(proxy.url(), "ap-south-2")).unwrap();
    let read = provider.public_address(&id).await.unwrap();
    let error = provider
        .associate(&read, &world.nodes[0].eni, world.egress_ip)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            PublicIpError::MissingPermission {
                permission: "ec2:AssociateAddress",
                ..
            }
        ),
        "{error:?}"
    );
    let made = cloudnet_reconciler::cloud::public_ip::Association {
        id: "eipassoc-0123456789abcdef0".into(),
        interface: world.nodes[0].eni.clone(),
        private_ip: Some(world.egress_ip),
    };
    let error = provider.disassociate(&id, &made).await.unwrap_err();
    assert!(
        matches!(
            error,
            PublicIpError::MissingPermission {
                permission: "ec2:DisassociateAddress",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.reason(),
        cloudnet_shared::public_ip::AssociatedReason::PermissionDenied
    );

    let unknown = provider
        .public_address("eipalloc-0000000000000000f")
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, PublicIpError::NotFound { .. }),
        "{unknown:?}"
    );
    assert!(!unknown.is_transient());
}

/// Asserts that `associate` refuses the unmarked `read` before any call, naming `marker`: every
/// cloud's public-address tests check it the same way.
pub(super) async fn refused_unmarked(
    provider: &dyn PublicIps,
    read: &PublicAddress,
    interface: &str,
    private_ip: IpAddr,
    marker: &str,
) {
    assert!(!read.marked, "{read:?}");
    let error = provider
        .associate(read, interface, private_ip)
        .await
        .unwrap_err();
    assert!(
        matches!(error, PublicIpError::MarkerMissing { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains(marker), "{error}");
}
