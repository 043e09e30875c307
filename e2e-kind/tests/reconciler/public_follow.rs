//! The EgressPublicIP controller end to end: the reconciler in-process against a real
//! kube-apiserver, with the AWS provider on moto behind the fault proxy. A marked Elastic IP is
//! associated with the egress IP on the ENI of the node it is attached to, follows it to another
//! node, is disassociated (and kept) when the binding is deleted, and is associated again after
//! someone removed it; a missing permission or marker is named in the condition and touches
//! nothing; of two bindings of one egress IP the older wins.
//!
//! moto ignores `AssociateAddress`'s `PrivateIpAddress` (it reports the ENI's primary address)
//! and does not disassociate an Elastic IP when its private IP is unassigned, so the private IP
//! of an association is asserted on the requests the fault proxy recorded, and the ENI on
//! moto's answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::fakes::faultproxy::{Dialect, EC2_CREDENTIALS_REQUEST, FaultProxy};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::e2e::ec2::{Instance, moto_instances, moto_settings};
use cloudnet_e2e::harness::e2e::{plugin, public_ips};
use cloudnet_reconciler::cloud::aws::AwsProvider;
use cloudnet_reconciler::controller::EngineConfig;
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::public_ip::{EgressPublicIP, EgressPublicIPSpec, MARKER_KEY};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::support::*;

/// How long a step may take on a loaded machine (a failure bound, not a speed measure).
const STEP: Duration = Duration::from_secs(60);

/// A control plane with both CRDs, two moto instances as nodes "a" and "b", and the reconciler.
struct World {
    _cp: ControlPlane,
    client: Client,
    ec2: aws_sdk_ec2::Client,
    proxy: FaultProxy,
    nodes: Vec<Instance>,
    egress_ip: IpAddr,
    _reconciler: JoinHandle<()>,
}

impl World {
    /// The world in `region` (each test its own: moto is shared), EC2 allowing `permitted`
    /// actions (all when `None`).
    async fn start(region: &str, permitted: Option<&[&str]>, config: EngineConfig) -> Self {
        let moto = MotoServer::shared().await.unwrap();
        let (ec2, network, nodes) = moto_instances(moto.url(), region, 2).await.unwrap();
        let [a, b, c, _] = network.ipv4.network().octets();
        let egress_ip = IpAddr::V4(Ipv4Addr::new(a, b, c, 40));
        let mut proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
            .record(["AssociateAddress", "DisassociateAddress"]);
        if let Some(actions) = permitted {
            proxy = proxy.permit(actions.iter().copied());
        }
        let proxy = proxy.start().await.unwrap();

        let (cp, client) = control_plane().await;
        public_ips::install_crd(&client).await.unwrap();
        for (name, node) in ["a", "b"].iter().zip(&nodes) {
            plugin::create_node(&client, name, node).await.unwrap();
        }
        let provider = AwsProvider::new(&moto_settings(proxy.url(), region)).unwrap();
        let reconciler = tokio::spawn(cloudnet_reconciler::controller::run(
            client.clone(),
            Arc::new(provider),
            config,
            Arc::new(Metrics::default()),
            "test".into(),
            std::future::pending(),
        ));
        Self {
            _cp: cp,
            client,
            ec2,
            proxy,
            nodes,
            egress_ip,
            _reconciler: reconciler,
        }
    }

    /// A new Elastic IP, with the admin's marker or without: its allocation id.
    async fn allocate(&self, marked: bool) -> String {
        public_ips::allocate(&self.ec2, marked).await.unwrap().0
    }

    /// The Elastic IP `id` as moto shows it: its ENI and association id, if associated.
    async fn association(&self, id: &str) -> Option<(String, String)> {
        public_ips::association(&self.ec2, id).await.unwrap()
    }

    /// Creates binding `name` of the egress IP to `public`.
    async fn bind(&self, name: &str, public: &str) {
        let binding = EgressPublicIP::new(
            name,
            EgressPublicIPSpec {
                private_ip: self.egress_ip.to_string(),
                public_ip: public.into(),
            },
        );
        bindings(&self.client)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }

    /// Waits until binding `name`'s condition has `reason` (on node `node` when given); returns
    /// the condition's message.
    async fn wait_reason(&self, name: &str, reason: &str, node: Option<&str>) -> String {
        let status = public_ips::wait_reason(&self.client, name, reason, node, STEP, || async {
            Ok(true)
        })
        .await
        .unwrap();
        status
            .associated_condition()
            .map(|c| c.message.clone())
            .unwrap_or_default()
    }

    /// The `AssociateAddress` calls forwarded to moto, each as (allocation, ENI, private IP).
    fn associations(&self) -> Vec<(String, String, String)> {
        self.proxy
            .recorded()
            .iter()
            .filter(|r| r.route == "AssociateAddress")
            .map(|r| {
                let p = |k: &str| r.param(k).unwrap_or_default().to_owned();
                (
                    p("AllocationId"),
                    p("NetworkInterfaceId"),
                    p("PrivateIpAddress"),
                )
            })
            .collect()
    }

    /// The association ids of the `DisassociateAddress` calls forwarded to moto.
    fn disassociations(&self) -> Vec<String> {
        self.proxy
            .recorded()
            .iter()
            .filter(|r| r.route == "DisassociateAddress")
            .map(|r| r.param("AssociationId").unwrap_or_default().to_owned())
            .collect()
    }

    fn eni(&self, node: usize) -> String {
        self.nodes[node].eni.clone()
    }
}

fn bindings(client: &Client) -> Api<EgressPublicIP> {
    Api::all(client.clone())
}

#[tokio::test]
async fn a_public_address_follows_its_egress_ip_to_another_node_and_is_disassociated_but_kept_on_delete()
 {
    let world = World::start("eu-west-1", None, engine_config()).await;
    let ip = world.egress_ip.to_string();
    let public = world.allocate(true).await;
    // Bound before the egress IP exists: it waits, and acts when the IP is attached.
    world.bind("partner-a", &public).await;
    world
        .wait_reason("partner-a", "EgressIPNotAttached", None)
        .await;
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    world
        .wait_reason("partner-a", "Associated", Some("a"))
        .await;
    assert_eq!(
        world.associations(),
        [(public.clone(), world.eni(0), ip.clone())]
    );
    let (eni, first) = world.association(&public).await.unwrap();
    assert_eq!(eni, world.eni(0));
    let status = bindings(&world.client)
        .get("partner-a")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.interface, world.eni(0));
    assert_eq!(status.association_id, first);

    retarget(&world.client, &ip, "b").await;
    wait_assigned(&world.client, &ip, "b").await;
    world
        .wait_reason("partner-a", "Associated", Some("b"))
        .await;
    assert_eq!(
        world.associations().last(),
        Some(&(public.clone(), world.eni(1), ip.clone()))
    );
    let (eni, second) = world.association(&public).await.unwrap();
    assert_eq!(eni, world.eni(1));

    bindings(&world.client)
        .delete("partner-a", &DeleteParams::default())
        .await
        .unwrap();
    let api = bindings(&world.client);
    wait_until(STEP, "the binding gone", || {
        let api = api.clone();
        async move { api.get_opt("partner-a").await.unwrap().is_none() }
    })
    .await;
    assert_eq!(world.disassociations(), [second]);
    assert_eq!(world.association(&public).await, None, "disassociated");
    // The egress IP is untouched.
    assert!(objects(&world.client).get(&ip).await.unwrap().is_assigned());
}

#[tokio::test]
async fn a_binding_created_after_its_egress_ip_is_attached_acts_at_once() {
    // Drift checks off: nothing but the binding's own creation can start the association.
    let world = World::start("eu-west-2", None, engine_config()).await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "b").await;
    wait_assigned(&world.client, &ip, "b").await;
    let public = world.allocate(true).await;
    world.bind("late", &public).await;
    world.wait_reason("late", "Associated", Some("b")).await;
    let expected = (public.clone(), world.eni(1), ip);
    let calls = world.associations();
    // moto never shows the private IP associated (see the header), so a second wake (the
    // object's Assigned event arriving after the binding) associates again, in the same place.
    assert!(
        !calls.is_empty() && calls.iter().all(|c| *c == expected),
        "{calls:?}"
    );
}

#[tokio::test]
async fn an_association_someone_removed_is_made_again_on_the_drift_period() {
    let config = EngineConfig {
        drift_period: Duration::from_secs(1),
        ..engine_config()
    };
    let world = World::start("eu-west-3", None, config).await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    let public = world.allocate(true).await;
    world.bind("drifting", &public).await;
    world.wait_reason("drifting", "Associated", Some("a")).await;
    let (_, association) = world.association(&public).await.unwrap();
    world
        .ec2
        .disassociate_address()
        .association_id(&association)
        .send()
        .await
        .unwrap();
    wait_until(STEP, "the Elastic IP associated again", || {
        let world = &world;
        let public = public.clone();
        async move { world.association(&public).await.is_some() }
    })
    .await;
    assert_eq!(world.association(&public).await.unwrap().0, world.eni(0));
    assert_eq!(
        world.associations().last(),
        Some(&(public.clone(), world.eni(0), ip))
    );
}

#[tokio::test]
async fn a_missing_permission_is_named_in_the_condition_and_the_egress_ip_is_unaffected() {
    let permitted: Vec<&str> = EC2_CREDENTIALS_REQUEST
        .iter()
        .copied()
        .chain(["DescribeAddresses"])
        .collect();
    let world = World::start("eu-north-1", Some(permitted.as_slice()), engine_config()).await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    let public = world.allocate(true).await;
    world.bind("unpermitted", &public).await;
    let message = world
        .wait_reason("unpermitted", "PermissionDenied", None)
        .await;
    assert!(message.contains("ec2:AssociateAddress"), "{message}");
    assert!(world.proxy.counts("AssociateAddress").unauthorized >= 1);
    assert_eq!(world.association(&public).await, None);
    // The egress IP's own work goes on: a move still lands.
    retarget(&world.client, &ip, "b").await;
    wait_assigned(&world.client, &ip, "b").await;
}

#[tokio::test]
async fn an_elastic_ip_without_the_marker_is_never_touched() {
    let world = World::start("sa-east-1", None, engine_config()).await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    let public = world.allocate(false).await;
    world.bind("unmarked", &public).await;
    let message = world.wait_reason("unmarked", "MarkerMissing", None).await;
    assert!(message.contains(MARKER_KEY), "{message}");
    assert!(world.associations().is_empty());
    assert_eq!(world.association(&public).await, None);
}

#[tokio::test]
async fn of_two_bindings_of_one_egress_ip_the_older_wins_and_the_other_is_in_conflict() {
    let world = World::start(
        "ca-central-1",
        Some(all_actions().as_slice()),
        engine_config(),
    )
    .await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    let (first, second) = (world.allocate(true).await, world.allocate(true).await);
    // Two webhook replicas could admit both; this tier runs no webhook at all.
    world.bind("a-first", &first).await;
    world.bind("b-second", &second).await;
    world.wait_reason("a-first", "Associated", Some("a")).await;
    let message = world.wait_reason("b-second", "Conflict", None).await;
    assert!(message.contains("a-first"), "{message}");
    assert!(
        world.associations().iter().all(|(id, _, _)| *id == first),
        "{:?}",
        world.associations()
    );
    assert_eq!(world.association(&second).await, None);
}

/// What OpenShift grants plus the public-address actions.
fn all_actions() -> Vec<&'static str> {
    EC2_CREDENTIALS_REQUEST
        .iter()
        .copied()
        .chain(public_ips::EC2_ACTIONS)
        .collect()
}
