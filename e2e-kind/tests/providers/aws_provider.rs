#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The AWS provider against a real moto server, through the fault-injection proxy so every EC2
//! call is counted. moto keeps state per region: each test works in a region of its own.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::{
    Dialect, FaultProxy, RouteMatch, Rule, ServerTls, TerminationPhase,
};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::e2e::ec2::{create_network, moto_settings, run_instances};
use cloudnet_reconciler::cloud::aws::{AwsProvider, AwsSettings, ClientSettings, build_sdk_client};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{
    Change, CloudProvider, CloudProviderExt, ErrorKind, NodeEgress, NodeTarget,
};
use ipnet::{Ipv4Net, Ipv6Net};

const MUTATIONS: [&str; 4] = [
    "AssignPrivateIpAddresses",
    "AssignIpv6Addresses",
    "UnassignPrivateIpAddresses",
    "UnassignIpv6Addresses",
];

/// The shared moto settings with the published pacing and, for the TLS tests, a CA bundle.
fn settings(endpoint: &str, region: &str, ca_bundle_pem: Option<Vec<u8>>) -> AwsSettings {
    let base = moto_settings(endpoint, region);
    AwsSettings {
        client: ClientSettings {
            ca_bundle_pem,
            ..base.client
        },
        pacing: Pacing::PUBLISHED,
        ..base
    }
}

/// A VPC with an IPv6 block, one dual-stack subnet and one m5.large instance in it.
struct World {
    ec2: aws_sdk_ec2::Client,
    subnet_v4: Ipv4Net,
    subnet_v6: Ipv6Net,
    instance: String,
    eni: String,
    primary: Ipv4Addr,
}

impl World {
    async fn create(moto: &MotoServer, region: &str) -> Self {
        let settings = settings(moto.url(), region, None);
        let ec2 = build_sdk_client(&settings.client, &settings.credentials).unwrap();
        let network = create_network(&ec2, "10.0.0.0/16".parse().unwrap())
            .await
            .unwrap();
        let instance = run_instances(&ec2, &network, InstanceType::M5Large, 1)
            .await
            .unwrap()
            .remove(0);
        let IpAddr::V4(primary) = instance.primary_ipv4 else {
            panic!("the primary address is IPv4");
        };
        Self {
            subnet_v4: network.ipv4,
            subnet_v6: network.ipv6,
            instance: instance.id,
            eni: instance.eni,
            primary,
            ec2,
        }
    }

    fn node(&self, name: &str) -> NodeTarget {
        NodeTarget {
            node_name: name.into(),
            provider_id: format!("aws:///zone-a/{}", self.instance),
            instance: cloudnet_reconciler::cloud::InstanceId(self.instance.clone()),
            internal_ips: Default::default(),
        }
    }

    fn v4(&self, host: u8) -> IpAddr {
        let [a, b, c, _] = self.subnet_v4.network().octets();
        IpAddr::V4(Ipv4Addr::new(a, b, c, host))
    }

    fn v6(&self, host: u16) -> IpAddr {
        let mut segments = self.subnet_v6.network().segments();
        segments[7] = host;
        IpAddr::V6(segments.into())
    }

    /// The addresses EC2 shows on the primary ENI, read directly (not through the provider).
    async fn eni_addresses(&self) -> Vec<IpAddr> {
        let answer = self
            .ec2
            .describe_network_interfaces()
            .network_interface_ids(&self.eni)
            .send()
            .await
            .unwrap();
        let ni = &answer.network_interfaces()[0];
        let v4 = ni
            .private_ip_addresses()
            .iter()
            .map(|a| a.private_ip_address().unwrap().parse().unwrap());
        let v6 = ni
            .ipv6_addresses()
            .iter()
            .map(|a| a.ipv6_address().unwrap().parse().unwrap());
        v4.chain(v6).collect()
    }
}

async fn setup(region: &str) -> (World, FaultProxy, AwsProvider) {
    let moto = MotoServer::shared().await.unwrap();
    let world = World::create(moto, region).await;
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    let provider = AwsProvider::new(&settings(proxy.url(), region, None)).unwrap();
    (world, proxy, provider)
}

fn mutations(proxy: &FaultProxy) -> u64 {
    proxy.forwarded_where(|route| MUTATIONS.contains(&route))
}

fn reads(proxy: &FaultProxy) -> u64 {
    proxy.forwarded_where(|route| route.starts_with("Describe"))
}

/// The secondary addresses a view shows, sorted.
fn secondary(view: &NodeEgress) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = view
        .addresses
        .iter()
        .copied()
        .filter(|ip| !view.primary.contains(ip))
        .collect();
    ips.sort();
    ips
}

#[tokio::test]
async fn egress_config_reports_primary_eni_subnets_and_instance_type_capacity() {
    let (world, proxy, provider) = setup("us-east-2").await;
    let node = provider
        .resolve("node-a", &format!("aws:///us-east-2a/{}", world.instance))
        .await
        .unwrap();
    assert_eq!(node.instance.0, world.instance);
    let egress = provider.egress_config(&node).await.unwrap();
    assert_eq!(egress.interface, world.eni);
    assert_eq!(egress.ipv4_subnet, Some(world.subnet_v4));
    assert_eq!(egress.ipv6_subnet, Some(world.subnet_v6));
    // m5.large: 10 IPv4 (the primary included) and 10 IPv6 addresses per interface.
    assert_eq!(egress.capacity.ipv4, Some(10));
    assert_eq!(egress.capacity.ipv6, Some(10));
    assert_eq!(egress.capacity.ip, None);
    assert_eq!(egress.addresses, vec![IpAddr::V4(world.primary)]);
    assert_eq!(egress.primary, vec![IpAddr::V4(world.primary)]);

    // The instance type's limits are looked up once.
    provider.egress_config(&node).await.unwrap();
    assert_eq!(proxy.counts("DescribeInstanceTypes").forwarded, 1);
    assert_eq!(mutations(&proxy), 0);
}

#[tokio::test]
async fn a_batch_of_ipv4_and_ipv6_ips_costs_one_call_per_family() {
    let (world, proxy, provider) = setup("us-west-1").await;
    let node = world.node("node-b");
    let ips = [
        world.v4(20),
        world.v4(21),
        world.v4(22),
        world.v6(0x20),
        world.v6(0x21),
    ];
    let view = provider.attach(&node, &ips).await.unwrap().unwrap();
    assert_eq!(proxy.counts("AssignPrivateIpAddresses").forwarded, 1);
    assert_eq!(proxy.counts("AssignIpv6Addresses").forwarded, 1);
    let on_eni = world.eni_addresses().await;
    for ip in ips {
        assert!(on_eni.contains(&ip), "{ip} missing from {on_eni:?}");
    }
    let mut want = ips.to_vec();
    want.sort();
    assert_eq!(secondary(&view), want, "the answer shows the change");
    let read = provider.egress_config(&node).await.unwrap();
    assert_eq!(secondary(&read), want);

    // Attaching again as ours (recorded before the first call) finds everything there and
    // changes nothing; not as ours, the addresses are another's and refused.
    let again = Change::new(ips.to_vec(), Vec::new());
    let error = provider.apply(&node, &again, None).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Foreign, "{error}");
    provider
        .apply(&node, &again.with_ours(ips.to_vec()), None)
        .await
        .unwrap();
    assert_eq!(mutations(&proxy), 2);
}

#[tokio::test]
async fn a_change_made_from_the_cached_view_reads_only_before_new_additions_and_carries_both_kinds()
{
    let (world, proxy, provider) = setup("us-east-1").await;
    let node = world.node("node-m");
    let view = provider
        .attach(&node, &[world.v4(24), world.v4(25)])
        .await
        .unwrap()
        .unwrap();
    proxy.reset_counts();
    // Additions that are ours already (recorded before a lost answer) read nothing.
    let ours = [world.v4(24), world.v4(25)];
    let again = Change::new(ours.to_vec(), Vec::new()).with_ours(ours.to_vec());
    provider.apply(&node, &again, Some(&view)).await.unwrap();
    assert_eq!(
        reads(&proxy) + mutations(&proxy),
        0,
        "{:?}",
        proxy.all_counts()
    );
    // New additions: one read of the ENI first (EC2 has no etag to tell another tool's change).
    let change = Change::new(vec![world.v4(26), world.v6(0x26)], vec![world.v4(24)]);
    let view = provider
        .apply(&node, &change, Some(&view))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        proxy.counts("DescribeNetworkInterfaces").forwarded,
        1,
        "{:?}",
        proxy.all_counts()
    );
    assert_eq!(reads(&proxy), 1, "{:?}", proxy.all_counts());
    // EC2 has no call that adds and removes: one per kind and family.
    assert_eq!(mutations(&proxy), 3, "{:?}", proxy.all_counts());
    let mut want = vec![world.v4(25), world.v4(26), world.v6(0x26)];
    want.sort();
    assert_eq!(secondary(&view), want);
    let mut on_eni = world.eni_addresses().await;
    on_eni.retain(|ip| *ip != IpAddr::V4(world.primary));
    on_eni.sort();
    assert_eq!(on_eni, want);

    // A stale view (an address removed behind our back) costs one read, then the change lands.
    world
        .ec2
        .unassign_private_ip_addresses()
        .network_interface_id(&world.eni)
        .private_ip_addresses(world.v4(25).to_string())
        .send()
        .await
        .unwrap();
    proxy.reset_counts();
    let change = Change::new(Vec::new(), vec![world.v4(25), world.v4(26)]);
    let after = provider
        .apply(&node, &change, Some(&view))
        .await
        .unwrap()
        .unwrap();
    assert!(reads(&proxy) <= 1, "{:?}", proxy.all_counts());
    assert_eq!(secondary(&after), vec![world.v6(0x26)]);
}

#[tokio::test]
async fn detach_removes_the_ips_and_detaching_absent_ips_succeeds_without_a_call() {
    let (world, proxy, provider) = setup("eu-west-1").await;
    let node = world.node("node-c");
    let ips = [world.v4(30), world.v4(31), world.v6(0x30)];
    provider.attach(&node, &ips).await.unwrap();
    proxy.reset_counts();

    provider.detach(&node, &ips[..2]).await.unwrap();
    assert_eq!(proxy.counts("UnassignPrivateIpAddresses").forwarded, 1);
    let on_eni = world.eni_addresses().await;
    assert!(
        !on_eni.contains(&ips[0]) && !on_eni.contains(&ips[1]),
        "{on_eni:?}"
    );
    assert!(on_eni.contains(&ips[2]), "{on_eni:?}");
    assert!(on_eni.contains(&IpAddr::V4(world.primary)), "{on_eni:?}");

    proxy.reset_counts();
    provider.detach(&node, &ips[..2]).await.unwrap();
    assert_eq!(mutations(&proxy), 0, "nothing to detach, nothing sent");

    provider.detach(&node, &[ips[2]]).await.unwrap();
    assert_eq!(proxy.counts("UnassignIpv6Addresses").forwarded, 1);
    assert!(!world.eni_addresses().await.contains(&ips[2]));
}

#[tokio::test]
async fn the_primary_address_is_never_detached() {
    let (world, proxy, provider) = setup("eu-west-2").await;
    let node = world.node("node-d");
    let error = provider
        .detach(&node, &[IpAddr::V4(world.primary)])
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Foreign);
    assert!(
        error.message.contains("node's own address"),
        "{}",
        error.message
    );
    assert_eq!(mutations(&proxy), 0);
    assert!(
        world
            .eni_addresses()
            .await
            .contains(&IpAddr::V4(world.primary))
    );
}

#[tokio::test]
async fn out_of_subnet_and_over_capacity_ips_are_refused_before_any_ec2_call() {
    let (world, proxy, provider) = setup("eu-west-3").await;
    let node = world.node("node-e");
    let outside = IpAddr::V4(Ipv4Addr::new(10, 0, 99, 9));
    let inside = world.v4(40);
    // The change is refused as a whole, naming the address; the engine splits it to let the
    // others through.
    let error = provider
        .attach(&node, &[outside, inside])
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Permanent);
    assert!(
        error.message.contains("outside the subnet") && error.message.contains("10.0.99.9"),
        "{}",
        error.message
    );
    assert_eq!(mutations(&proxy), 0);
    provider.attach(&node, &[inside]).await.unwrap();
    assert!(world.eni_addresses().await.contains(&inside));
    assert!(!world.eni_addresses().await.contains(&outside));
    assert_eq!(proxy.counts("AssignPrivateIpAddresses").forwarded, 1);

    // The ENI holds the primary and one secondary; m5.large allows 10 IPv4 in all.
    proxy.reset_counts();
    let too_many: Vec<IpAddr> = (50..59).map(|h| world.v4(h)).collect();
    let error = provider.attach(&node, &too_many).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Permanent);
    assert!(
        error.message.contains("PrivateIpAddressLimitExceeded"),
        "{}",
        error.message
    );
    assert_eq!(mutations(&proxy), 0);
}

#[tokio::test]
async fn throttled_assignments_are_retried_until_they_succeed() {
    let (world, proxy, provider) = setup("eu-central-1").await;
    let node = world.node("node-f");
    proxy.set_rule(
        RouteMatch::exact("AssignPrivateIpAddresses"),
        Rule::PASS.with_throttle(1.0),
    );
    let ip = world.v4(60);
    let attach = tokio::spawn(async move { provider.attach(&node, &[ip]).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.counts("AssignPrivateIpAddresses").throttled < 2 {
        assert!(Instant::now() < deadline, "no throttled attempts seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.clear_rules();
    attach.await.unwrap().unwrap();
    assert!(world.eni_addresses().await.contains(&ip));
    let counts = proxy.counts("AssignPrivateIpAddresses");
    assert!(counts.throttled >= 2);
    assert_eq!(counts.forwarded, 1);
}

#[tokio::test]
async fn persistent_throttling_ends_in_a_throttled_error() {
    let (world, proxy, provider) = setup("ap-southeast-1").await;
    let node = world.node("node-g");
    proxy.set_rule(RouteMatch::Any, Rule::PASS.with_throttle(1.0));
    let error = provider.egress_config(&node).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Throttled);
    assert!(
        error.message.contains("RequestLimitExceeded"),
        "{}",
        error.message
    );
    assert_eq!(proxy.counts("DescribeInstances").throttled, 10);
}

#[tokio::test]
async fn an_unknown_instance_is_not_found() {
    let (_world, _proxy, provider) = setup("ap-southeast-2").await;
    let node = provider
        .resolve("ghost", "aws:///ap-southeast-2a/i-0123456789abcdef0")
        .await
        .unwrap();
    let error = provider.egress_config(&node).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::NotFound);
    let error = provider.resolve("bad", "gce://p/z/vm").await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Permanent);
    assert!(
        error.message.contains("aws:///<zone>/<instance-id>"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn a_custom_ca_bundle_is_trusted_for_a_tls_endpoint() {
    let moto = MotoServer::shared().await.unwrap();
    let world = World::create(moto, "ap-northeast-1").await;
    let ca = cloudnet_certs::CertificateAuthority::generate("ec2-test-ca", time::Duration::days(1))
        .unwrap();
    let leaf = ca
        .issue(&cloudnet_certs::LeafRequest {
            common_name: "ec2.local",
            organizations: &[],
            alt_names: &["127.0.0.1", "localhost"],
            usage: cloudnet_certs::Usage::Server,
            validity: time::Duration::days(1),
        })
        .unwrap();
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .tls(ServerTls {
            cert_pem: leaf.cert_pem.clone(),
            key_pem: leaf.key_pem.clone(),
        })
        .start()
        .await
        .unwrap();
    assert!(proxy.url().starts_with("https://"));

    let trusted = settings(
        proxy.url(),
        "ap-northeast-1",
        Some(ca.cert_pem().as_bytes().to_vec()),
    );
    let provider = AwsProvider::new(&trusted).unwrap();
    let egress = provider.egress_config(&world.node("node-h")).await.unwrap();
    assert_eq!(egress.interface, world.eni);

    // Without the bundle the system roots apply, and they do not know our CA.
    let mut untrusted = settings(proxy.url(), "ap-northeast-1", None);
    untrusted.retry.max_attempts = 1;
    let provider = AwsProvider::new(&untrusted).unwrap();
    let error = provider
        .egress_config(&world.node("node-h"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Retryable, "{error}");
    assert_eq!(proxy.counts("DescribeInstances").forwarded, 1);
}

#[tokio::test]
async fn settings_load_credentials_from_the_secret_directory() {
    let moto = MotoServer::shared().await.unwrap();
    let world = World::create(moto, "ca-central-1").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("credentials"),
        "[default]\naws_access_key_id = AKIDFROMFILE\naws_secret_access_key = fromfile\n",
    )
    .unwrap();
    let settings = AwsSettings::load(dir.path(), "ca-central-1", Some(moto.url()), None).unwrap();
    assert!(!format!("{settings:?}").contains("fromfile"));
    let provider = AwsProvider::new(&settings).unwrap();
    let egress = provider.egress_config(&world.node("node-i")).await.unwrap();
    assert_eq!(egress.interface, world.eni);
}

#[tokio::test]
async fn dropped_connections_and_server_errors_are_retried_until_they_succeed() {
    let (world, proxy, provider) = setup("us-west-2").await;
    let node = world.node("node-j");
    proxy.set_rule(
        RouteMatch::exact("DescribeInstances"),
        Rule::PASS.with_drop(1.0),
    );
    proxy.set_rule(
        RouteMatch::exact("AssignIpv6Addresses"),
        Rule::PASS.with_server_error(1.0),
    );
    let ip = world.v6(0x77);
    let attach = tokio::spawn(async move { provider.attach(&node, &[ip]).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.counts("DescribeInstances").dropped < 2 {
        assert!(Instant::now() < deadline, "no dropped attempts seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.set_rule(RouteMatch::exact("DescribeInstances"), Rule::PASS);
    while proxy.counts("AssignIpv6Addresses").server_errors < 2 {
        assert!(Instant::now() < deadline, "no failed assignments seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.clear_rules();
    attach.await.unwrap().unwrap();
    assert!(world.eni_addresses().await.contains(&ip));
    assert_eq!(proxy.counts("AssignIpv6Addresses").forwarded, 1);
}

#[tokio::test]
async fn detaching_from_a_terminated_instance_succeeds_while_listed_and_once_forgotten() {
    let (world, proxy, provider) = setup("ap-south-1").await;
    let node = world.node("node-k");
    let ips = [world.v4(80), world.v4(81), world.v6(0x80)];
    provider.attach(&node, &ips).await.unwrap();
    world
        .ec2
        .terminate_instances()
        .instance_ids(&world.instance)
        .send()
        .await
        .unwrap();
    proxy.terminate(&world.instance, &[&world.eni], None);

    for phase in [TerminationPhase::Listed, TerminationPhase::Gone] {
        if phase == TerminationPhase::Gone {
            assert!(proxy.forget(&world.instance));
        }
        assert_eq!(proxy.termination_phase(&world.instance), Some(phase));
        proxy.reset_counts();
        let outcome = provider.detach(&node, &ips).await;
        assert_eq!(outcome, Ok(None), "{phase:?}: the IPs went with the ENI");
        assert_eq!(mutations(&proxy), 0, "{phase:?}: nothing left to unassign");

        let error = provider.attach(&node, &ips).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::NotFound, "{phase:?}: {error}");
        // The drift check's read fails, and once: no retries to spam EC2 with.
        let error = provider.egress_config(&node).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::NotFound, "{phase:?}: {error}");
        let reads = proxy.counts("DescribeInstances");
        assert_eq!(reads.total(), 3, "{phase:?}: one read per operation");
        if phase == TerminationPhase::Gone {
            assert_eq!(reads.not_found, 3, "the proxy answers for EC2: {reads:?}");
        }
    }
}

#[tokio::test]
async fn detaching_succeeds_when_the_interface_vanishes_under_a_listed_instance() {
    let (world, proxy, provider) = setup("eu-north-1").await;
    let node = world.node("node-l");
    let ips = [world.v4(90), world.v4(91), world.v6(0x90)];
    provider.attach(&node, &ips).await.unwrap();
    // moto then still lists the ENI on the instance (as EC2 may for a moment), but every call on
    // the ENI itself answers InvalidNetworkInterfaceID.NotFound.
    world
        .ec2
        .delete_network_interface()
        .network_interface_id(&world.eni)
        .send()
        .await
        .unwrap();
    proxy.reset_counts();
    // From the cached view (as the engine calls it): the unassign itself meets the vanished ENI.
    let view = NodeEgress {
        interface: world.eni.clone(),
        addresses: ips.to_vec(),
        ..NodeEgress::default()
    };
    let change = Change::new(Vec::new(), ips.to_vec());
    let outcome = provider.apply(&node, &change, Some(&view)).await;
    assert_eq!(outcome, Ok(None));
    assert_eq!(
        mutations(&proxy),
        1,
        "the first refusal settles it: no per-address retries"
    );
}

#[tokio::test]
async fn many_vms_are_read_in_one_describe_instances_call_and_an_unknown_one_fails_alone() {
    let moto = MotoServer::shared().await.unwrap();
    let region = "me-south-1";
    let direct = settings(moto.url(), region, None);
    let ec2 = build_sdk_client(&direct.client, &direct.credentials).unwrap();
    let network = create_network(&ec2, "10.0.0.0/16".parse().unwrap())
        .await
        .unwrap();
    let instances = run_instances(&ec2, &network, InstanceType::M5Large, 60)
        .await
        .unwrap();
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    let provider = AwsProvider::new(&settings(proxy.url(), region, None)).unwrap();
    assert_eq!(provider.needs().max_read_batch, 1000);
    let mut nodes: Vec<NodeTarget> = instances
        .iter()
        .enumerate()
        .map(|(i, vm)| NodeTarget::new(&format!("node-{i}"), &vm.provider_id(), vm.id.clone()))
        .collect();

    let answers = provider.egress_configs(&nodes).await;
    assert_eq!(proxy.counts("DescribeInstances").total(), 1);
    assert_eq!(
        proxy.counts("DescribeSubnets").total(),
        1,
        "the subnet memo"
    );
    assert_eq!(proxy.counts("DescribeInstanceTypes").total(), 1);
    for (vm, answer) in instances.iter().zip(&answers) {
        let view = answer.as_ref().unwrap();
        assert_eq!(view.interface, vm.eni);
        assert_eq!(view.primary, [vm.primary_ipv4]);
        assert_eq!(view.ipv4_subnet, Some(network.ipv4));
    }

    // EC2 refuses a whole call naming an instance it does not know, naming it (moto too), and a
    // forgotten terminated instance (the proxy in EC2's place): each fails alone, NotFound.
    let gone = &instances[59];
    proxy.terminate(&gone.id, &[&gone.eni], None);
    assert!(proxy.forget(&gone.id));
    let unknown = "i-0123456789abcdef0";
    nodes.insert(
        10,
        NodeTarget::new(
            "node-unknown",
            &format!("aws:///z/{unknown}"),
            unknown.into(),
        ),
    );
    proxy.reset_counts();
    let answers = provider.egress_configs(&nodes).await;
    let failed: Vec<(&str, ErrorKind)> = nodes
        .iter()
        .zip(&answers)
        .filter_map(|(node, answer)| {
            let error = answer.as_ref().err()?;
            Some((node.instance.0.as_str(), error.kind))
        })
        .collect();
    assert_eq!(
        failed,
        [
            (unknown, ErrorKind::NotFound),
            (gone.id.as_str(), ErrorKind::NotFound)
        ]
    );
    let reads = proxy.counts("DescribeInstances");
    // The refused calls, then the one that lists the other 59.
    assert_eq!(reads.total(), 3, "{reads:?}");
    assert_eq!(
        reads.not_found, 1,
        "the proxy refused the forgotten one: {reads:?}"
    );
}
