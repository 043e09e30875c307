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
//! moto's answer; the proxy also answers `DescribeAddresses` with the private IP each
//! association was made with, as EC2 does ([`Builder::exact_associations`]), so the reconciler
//! recognises an association of its own.
//!
//! What the binding records must be what the cloud holds under faults: it leaves `Associated`
//! as soon as its egress IP leaves the node (a move under way, the object deleted), with drift
//! checks off; an association whose status write failed is found on the cloud, recorded and
//! undone on delete; of two bindings of one spec, deleting either leaves the address associated;
//! a throttled association is retried within seconds; a binding forced out by an admin leaves
//! the gauge.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::fakes::apifaults::{ApiFault, ApiFaults};
use cloudnet_e2e::fakes::faultproxy::{
    Builder, Dialect, EC2_CREDENTIALS_REQUEST, FaultProxy, RouteMatch, Rule,
};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::e2e::ec2::{Instance, moto_instances, moto_settings};
use cloudnet_e2e::harness::e2e::{plugin, public_ips};
use cloudnet_reconciler::cloud::aws::AwsProvider;
use cloudnet_reconciler::controller::EngineConfig;
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::public_ip::{EgressPublicIP, EgressPublicIPSpec, MARKER_KEY};
use http::Method;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
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
    /// The fault proxy the reconciler reaches kube-apiserver through, if the test asked for it.
    api_faults: Option<ApiFaults>,
    metrics: Arc<Metrics>,
    nodes: Vec<Instance>,
    egress_ip: IpAddr,
    _reconciler: JoinHandle<()>,
}

impl World {
    /// The world in `region` (each test its own: moto is shared), EC2 allowing `permitted`
    /// actions (all when `None`).
    async fn start(region: &str, permitted: Option<&[&str]>, config: EngineConfig) -> Self {
        Self::launch(region, permitted, config, false).await
    }

    /// As [`Self::start`], with the reconciler reaching kube-apiserver through [`ApiFaults`]
    /// when `api_faults`.
    async fn launch(
        region: &str,
        permitted: Option<&[&str]>,
        config: EngineConfig,
        api_faults: bool,
    ) -> Self {
        let moto = MotoServer::shared().await.unwrap();
        let (ec2, network, nodes) = moto_instances(moto.url(), region, 2).await.unwrap();
        let [a, b, c, _] = network.ipv4.network().octets();
        let egress_ip = IpAddr::V4(Ipv4Addr::new(a, b, c, 40));
        let mut proxy: Builder = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
            .exact_associations()
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
        let (api_faults, reconciler_client) = if api_faults {
            let (faults, _) = cp.api_faults("kubeconfig-faults").await.unwrap();
            let through = cp.client_via(faults.addr()).await.unwrap();
            (Some(faults), through)
        } else {
            (None, client.clone())
        };
        let metrics = Arc::new(Metrics::default());
        let reconciler = tokio::spawn(cloudnet_reconciler::controller::run(
            reconciler_client,
            Arc::new(provider),
            config,
            Arc::clone(&metrics),
            "test".into(),
            std::future::pending(),
        ));
        Self {
            _cp: cp,
            client,
            ec2,
            proxy,
            api_faults,
            metrics,
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

    /// Waits until the leader's `cloudnet_public_ips_unassociated` gauge reads `count`.
    async fn wait_unassociated(&self, count: usize) {
        let line = format!("cloudnet_public_ips_unassociated {count}\n");
        wait_until(STEP, &format!("the unassociated gauge at {count}"), || {
            let found = self.metrics.exposition().contains(&line);
            async move { found }
        })
        .await;
    }

    /// Deletes binding `name` and waits until it is gone.
    async fn unbind(&self, name: &str) {
        bindings(&self.client)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        let api = bindings(&self.client);
        wait_until(STEP, &format!("binding {name} gone"), || {
            let api = api.clone();
            async move { api.get_opt(name).await.unwrap().is_none() }
        })
        .await;
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

#[tokio::test]
async fn a_binding_leaves_associated_at_once_when_its_egress_ip_moves_away_or_is_deleted() {
    // Drift checks off: only the egress IP's own events can tell the binding.
    let world = World::start("us-west-1", None, engine_config()).await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    let public = world.allocate(true).await;
    world.bind("leaving", &public).await;
    world.wait_reason("leaving", "Associated", Some("a")).await;
    world.wait_unassociated(0).await;

    // A move held between its detach from a and its attach to b: the IP is on no interface.
    world
        .proxy
        .hold(RouteMatch::exact("AssignPrivateIpAddresses"));
    retarget(&world.client, &ip, "b").await;
    let status = public_ips::wait_reason(
        &world.client,
        "leaving",
        "EgressIPNotAttached",
        Some(""),
        STEP,
        || async { Ok(true) },
    )
    .await
    .unwrap();
    assert_eq!(
        status.interface, "",
        "the old interface no longer holds the IP"
    );
    world.wait_unassociated(1).await;
    world.proxy.release_held();
    world.wait_reason("leaving", "Associated", Some("b")).await;
    world.wait_unassociated(0).await;

    // The egress IP deleted: the binding says so, and the alert's gauge counts it.
    delete(&world.client, &ip).await;
    let status = public_ips::wait_reason(
        &world.client,
        "leaving",
        "EgressIPNotAttached",
        Some(""),
        STEP,
        || async { Ok(true) },
    )
    .await
    .unwrap();
    assert_eq!(status.interface, "");
    world.wait_unassociated(1).await;
}

#[tokio::test]
async fn an_association_whose_status_write_failed_is_found_on_the_cloud_and_undone_on_delete() {
    let world = World::launch("us-east-2", None, engine_config(), true).await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    let public = world.allocate(true).await;
    let faults = world.api_faults.as_ref().unwrap();
    // The first status write of the binding is the one after AssociateAddress: it fails.
    faults.inject(
        Method::PATCH,
        "/apis/cloudnet.io/v1alpha1/egresspublicips/lost/status",
        ApiFault::ServerError,
        1,
    );
    world.bind("lost", &public).await;
    let status = public_ips::wait_reason(
        &world.client,
        "lost",
        "Associated",
        Some("a"),
        STEP,
        || async { Ok(true) },
    )
    .await
    .unwrap();
    assert_eq!(faults.applied().len(), 1, "{:?}", faults.applied());
    let (eni, live) = world.association(&public).await.unwrap();
    assert_eq!(eni, world.eni(0));
    assert_eq!(
        status.association_id, live,
        "the status records the association the cloud holds"
    );
    assert_eq!(
        world.associations(),
        [(public.clone(), world.eni(0), ip.clone())],
        "found, not made again"
    );

    world.unbind("lost").await;
    assert_eq!(world.disassociations(), [live]);
    assert_eq!(
        world.association(&public).await,
        None,
        "the Elastic IP is free"
    );
}

#[tokio::test]
async fn deleting_either_of_two_bindings_of_one_spec_leaves_the_address_associated() {
    let world = World::start("ap-south-1", None, engine_config()).await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    let public = world.allocate(true).await;
    // Three admitted in the same second (two webhook replicas, or a cache not yet listed): the
    // name decides between equals.
    for name in ["twin-a", "twin-b", "twin-c"] {
        world.bind(name, &public).await;
    }
    world.wait_reason("twin-a", "Associated", Some("a")).await;
    world.wait_reason("twin-b", "Conflict", None).await;
    world.wait_reason("twin-c", "Conflict", None).await;
    let (_, association) = world.association(&public).await.unwrap();

    world.unbind("twin-c").await;
    assert!(
        world.disassociations().is_empty(),
        "a loser undid the winner's association"
    );
    world.unbind("twin-a").await;
    assert!(
        world.disassociations().is_empty(),
        "the winner undid what its twin relies on"
    );
    assert_eq!(
        world.association(&public).await,
        Some((world.eni(0), association.clone()))
    );
    // The twin takes over at once, by event: well within the minute a Conflict waits.
    public_ips::wait_reason(
        &world.client,
        "twin-b",
        "Associated",
        Some("a"),
        Duration::from_secs(30),
        || async { Ok(true) },
    )
    .await
    .unwrap();
    assert_eq!(world.associations().len(), 1, "{:?}", world.associations());

    world.unbind("twin-b").await;
    assert_eq!(world.disassociations(), [association]);
    assert_eq!(world.association(&public).await, None);
}

#[tokio::test]
async fn a_throttled_association_is_retried_within_seconds_not_after_the_backoff_cap() {
    let config = EngineConfig {
        backoff_base: Duration::from_millis(500),
        backoff_cap: Duration::from_secs(60),
        ..engine_config()
    };
    let world = World::start("us-west-2", None, config).await;
    let ip = world.egress_ip.to_string();
    create(&world.client, &ip, "a").await;
    wait_assigned(&world.client, &ip, "a").await;
    let public = world.allocate(true).await;
    world.proxy.set_rule(
        RouteMatch::exact("AssociateAddress"),
        Rule::default().with_throttle(1.0),
    );
    world.bind("throttled", &public).await;
    world.wait_reason("throttled", "CloudError", None).await;
    world.proxy.clear_rules();
    // Half a second, doubling: a flat retry after the 60 s cap would miss this bound.
    public_ips::wait_reason(
        &world.client,
        "throttled",
        "Associated",
        Some("a"),
        Duration::from_secs(30),
        || async { Ok(true) },
    )
    .await
    .unwrap();
    assert!(world.proxy.counts("AssociateAddress").throttled >= 1);
}

#[tokio::test]
async fn a_binding_whose_finalizer_an_admin_removed_leaves_the_unassociated_gauge() {
    let world = World::start("eu-central-1", None, engine_config()).await;
    let public = world.allocate(true).await;
    // No egress IP: the binding waits, counted as unassociated.
    world.bind("forced", &public).await;
    world
        .wait_reason("forced", "EgressIPNotAttached", None)
        .await;
    world.wait_unassociated(1).await;
    // Its delete's cleanup is stuck reading the cloud (it records an association to undo)...
    let api = bindings(&world.client);
    api.patch_status(
        "forced",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"status": {"associationID": "eipassoc-0123456789abcdef0"}}),
        ),
    )
    .await
    .unwrap();
    world.proxy.hold(RouteMatch::exact("DescribeAddresses"));
    api.delete("forced", &DeleteParams::default())
        .await
        .unwrap();
    wait_until(STEP, "the cleanup reading the Elastic IP", || {
        let held = world.proxy.held_now();
        async move { held > 0 }
    })
    .await;
    // ...so the admin removes the finalizer.
    api.patch(
        "forced",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    world.wait_unassociated(0).await;
    world.proxy.release_held();
}
