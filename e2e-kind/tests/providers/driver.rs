#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The cloud driver's rules (`reconciler/src/cloud/driver`), one table run against every
//! provider and its fake: AWS on moto, Azure on the ARM fake, GCP on the GCE fake, OpenStack on
//! real Neutron, each behind the fault proxy (which injects the failures and counts the calls).
//! The rules are the driver's, so every cloud must show them the same way: a write from a stale
//! state loses no one else's change, a transient failure or a throttled answer is retried (ARM's
//! `Retry-After` honoured), a refusal is believed only after a fresh read, a VM that is gone
//! holds none of the IPs, and an IP named twice is sent once. And, through the engine's lanes
//! as the reconciler drives them: an address another writer put on the VM is never taken over
//! (unless the ledger says it is ours, or it is adopted), and the node's own addresses are
//! neither detached nor taken, with no write either way.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::arm::{ArmConfig, ArmFake};
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule};
use cloudnet_e2e::fakes::gce::{self, GceFake, PROJECT, ZONE};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::fakes::openstack::{Api, OpenStackServers, Options, PROVIDER_CALL_TIMEOUT, User};
use cloudnet_e2e::harness::e2e::ec2::{create_network, moto_settings, run_instances};
use cloudnet_reconciler::cloud::aws::{self, AwsProvider};
use cloudnet_reconciler::cloud::azure::{self, AzureProvider};
use cloudnet_reconciler::cloud::gcp::{self, GcpProvider};
use cloudnet_reconciler::cloud::openstack::{CloudConfig, OpenStackProvider, OpenStackSettings};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{Change, CloudProvider, ErrorKind, InstanceId, NodeTarget};
use cloudnet_reconciler::engine::{Gather, Interfaces, Lanes, Ledger, Mutation};
use cloudnet_reconciler::metrics::Metrics;
use serde_json::json;

/// The clouds the table runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cloud {
    Aws,
    Azure,
    Gcp,
    OpenStack,
}

const CLOUDS: [Cloud; 4] = [Cloud::Aws, Cloud::Azure, Cloud::Gcp, Cloud::OpenStack];

/// An address outside every subnet of every bed.
const OUTSIDE: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));

/// Bound on waiting for the proxy to have injected its faults.
const FAULT_WAIT: Duration = Duration::from_secs(60);

/// What each cloud's fake needs kept alive, and how to reach behind the provider's back.
enum Fake {
    Aws {
        ec2: aws_sdk_ec2::Client,
        instance: String,
        eni: String,
    },
    Azure {
        fake: ArmFake,
        vm: String,
    },
    Gcp {
        fake: GceFake,
        name: String,
        _secrets: tempfile::TempDir,
    },
    OpenStack {
        /// The cloud admin's API: only an admin deletes a server's (`compute:`) port.
        admin: Api,
        port: String,
    },
}

/// One VM of one cloud, its provider (through the proxy), and a second provider standing for
/// another writer (another controller, a human) that shares nothing with the first.
struct Bed {
    cloud: Cloud,
    fake: Fake,
    proxy: FaultProxy,
    provider: Arc<dyn CloudProvider>,
    other: Arc<dyn CloudProvider>,
    node: NodeTarget,
    /// Free addresses in the VM's subnet.
    free: Vec<IpAddr>,
}

impl Bed {
    async fn start(cloud: Cloud) -> Self {
        match cloud {
            Cloud::Aws => aws_bed().await,
            Cloud::Azure => azure_bed().await,
            Cloud::Gcp => gcp_bed().await,
            Cloud::OpenStack => openstack_bed().await,
        }
    }

    /// The route matcher of the cloud's write call.
    fn write_route(&self) -> RouteMatch {
        match self.cloud {
            Cloud::Aws => RouteMatch::exact("AssignPrivateIpAddresses"),
            Cloud::Azure => RouteMatch::prefix("PUT "),
            Cloud::Gcp => RouteMatch::exact("instances.updateNetworkInterface"),
            Cloud::OpenStack => RouteMatch::prefix("PUT /v2.0/ports/"),
        }
    }

    /// Writes the cloud has taken (the proxy's forwarded writes).
    fn writes(&self) -> u64 {
        let cloud = self.cloud;
        self.proxy.forwarded_where(|route| match cloud {
            Cloud::Aws => route.starts_with("Assign") || route.starts_with("Unassign"),
            Cloud::Azure | Cloud::OpenStack => route.starts_with("PUT "),
            Cloud::Gcp => route == "instances.updateNetworkInterface",
        })
    }

    /// Reads of the VM's interface the cloud has answered.
    fn reads(&self) -> u64 {
        let cloud = self.cloud;
        self.proxy.forwarded_where(|route| match cloud {
            Cloud::Aws => route == "DescribeNetworkInterfaces" || route == "DescribeInstances",
            Cloud::Azure => route.starts_with("GET ") && route.contains("/networkInterfaces/"),
            Cloud::Gcp => route == "instances.get",
            Cloud::OpenStack => route.starts_with("GET /v2.0/ports"),
        })
    }

    /// Faults the proxy injected so far.
    fn injected(&self) -> u64 {
        self.proxy
            .all_counts()
            .values()
            .map(|c| c.throttled + c.server_errors)
            .sum()
    }

    /// The addresses the cloud shows now, read by the provider afresh.
    async fn addresses(&self) -> Vec<IpAddr> {
        let view = self.provider.egress_config(&self.node).await.unwrap();
        view.addresses
    }

    /// Deletes the VM (or, on OpenStack, the server's port) behind the provider's back.
    async fn kill(&self) {
        match &self.fake {
            Fake::Aws { ec2, instance, eni } => {
                ec2.terminate_instances()
                    .instance_ids(instance)
                    .send()
                    .await
                    .unwrap();
                self.proxy.terminate(instance, &[eni.as_str()], None);
                assert!(self.proxy.forget(instance));
            }
            Fake::Azure { fake, vm } => fake.delete_vm(vm),
            Fake::Gcp { fake, name, .. } => assert!(fake.delete_instance(PROJECT, ZONE, name)),
            Fake::OpenStack { admin, port } => {
                let (status, _) = admin
                    .neutron("DELETE", &format!("/ports/{port}"), None)
                    .await
                    .unwrap();
                assert_eq!(status, 204, "deleting port {port}");
            }
        }
    }
}

fn add(ips: &[IpAddr]) -> Change {
    Change::new(ips.to_vec(), Vec::new())
}

async fn aws_bed() -> Bed {
    // moto keeps state per region: one region per bed.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const REGIONS: [&str; 8] = [
        "ap-south-1",
        "ap-northeast-3",
        "ca-central-1",
        "eu-west-3",
        "sa-east-1",
        "eu-north-1",
        "ap-southeast-2",
        "us-east-2",
    ];
    let region = REGIONS[NEXT.fetch_add(1, Ordering::Relaxed) as usize % REGIONS.len()];
    let moto = MotoServer::shared().await.unwrap();
    let direct = moto_settings(moto.url(), region);
    let ec2 = aws::build_sdk_client(&direct.client, &direct.credentials).unwrap();
    let network = create_network(&ec2, "10.0.0.0/16".parse().unwrap())
        .await
        .unwrap();
    let instance = run_instances(&ec2, &network, InstanceType::M5Large, 1)
        .await
        .unwrap()
        .remove(0);
    let proxy = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    let provider = Arc::new(AwsProvider::new(&moto_settings(proxy.url(), region)).unwrap());
    let other = Arc::new(AwsProvider::new(&direct).unwrap());
    let node = provider
        .resolve("node-0", &format!("aws:///zone-a/{}", instance.id))
        .await
        .unwrap();
    let [a, b, c, _] = network.ipv4.network().octets();
    let free = (0..4)
        .map(|i| IpAddr::V4(Ipv4Addr::new(a, b, c, 100 + i)))
        .collect();
    Bed {
        cloud: Cloud::Aws,
        fake: Fake::Aws {
            ec2,
            instance: instance.id,
            eni: instance.eni,
        },
        proxy,
        provider,
        other,
        node,
        free,
    }
}

async fn azure_bed() -> Bed {
    use aws::Secret;
    use azure::{AzureAuth, AzureCredentials, AzureSettings, Environment, RetryPolicy};
    const SUB: &str = "00000000-0000-0000-0000-000000000001";
    let fake = ArmFake::start(ArmConfig::default()).await.unwrap();
    let subnet = fake
        .add_subnet(SUB, "net-rg", "vnet", "workers", &["10.0.0.0/16"])
        .unwrap();
    let vm = fake.add_vm(
        SUB,
        "cluster-rg",
        "worker-0",
        &subnet,
        "10.0.0.4".parse().unwrap(),
    );
    let proxy = FaultProxy::builder(fake.url(), Dialect::Arm)
        .start()
        .await
        .unwrap();
    let settings = |resource_manager: &str| AzureSettings {
        // Tokens come straight from the fake, for its own URL.
        environment: Environment {
            token_audience: fake.url().to_owned(),
            ..Environment::at(resource_manager, fake.url()).unwrap()
        },
        credentials: AzureCredentials {
            client_id: "app".into(),
            tenant_id: "tenant".into(),
            auth: AzureAuth::ClientSecret(Secret::new("test-secret")),
            subscription_id: Some(SUB.into()),
            resource_group: Some("cluster-rg".into()),
        },
        // A cap above the proxy's `Retry-After: 1`, so that it is honoured in full.
        retry: RetryPolicy {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(2),
            max_attempts: 10,
            poll_interval: Duration::from_millis(20),
            operation_timeout: Duration::from_secs(20),
        },
        call_timeout: Duration::from_secs(10),
        pacing: Pacing::UNLIMITED,
    };
    let provider = Arc::new(AzureProvider::new(&settings(proxy.url())).unwrap());
    let other = Arc::new(AzureProvider::new(&settings(fake.url())).unwrap());
    let node = provider.resolve("worker-0", &vm.provider_id).await.unwrap();
    let free = (0..4)
        .map(|i| IpAddr::V4(Ipv4Addr::new(10, 0, 1, 10 + i)))
        .collect();
    Bed {
        cloud: Cloud::Azure,
        fake: Fake::Azure { fake, vm: vm.vm },
        proxy,
        provider,
        other,
        node,
        free,
    }
}

async fn gcp_bed() -> Bed {
    let fake = GceFake::start().await.unwrap();
    fake.add_standard_vm("vm-0", Ipv4Addr::new(10, 0, 0, 2))
        .unwrap();
    let proxy = FaultProxy::builder(fake.url(), Dialect::Gce)
        .start()
        .await
        .unwrap();
    let secrets = tempfile::tempdir().unwrap();
    gce::write_service_account(secrets.path()).unwrap();
    let settings = |endpoint: &str| {
        let mut settings = gcp::GcpSettings::new(endpoint);
        settings.retry = gcp::RetryPolicy {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(200),
            max_attempts: 10,
            call_timeout: Duration::from_secs(20),
            operation_timeout: Duration::from_secs(30),
        };
        settings.pacing = Pacing::UNLIMITED;
        settings
    };
    let provider = GcpProvider::from_secret_dir(&settings(proxy.url()), secrets.path())
        .await
        .unwrap();
    let other = GcpProvider::from_secret_dir(&settings(&fake.url()), secrets.path())
        .await
        .unwrap();
    let node = provider
        .resolve("vm-0", &format!("gce://{PROJECT}/{ZONE}/vm-0"))
        .await
        .unwrap();
    let free = (0..4)
        .map(|i| IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10 + i)))
        .collect();
    Bed {
        cloud: Cloud::Gcp,
        fake: Fake::Gcp {
            fake,
            name: "vm-0".into(),
            _secrets: secrets,
        },
        proxy,
        provider: Arc::new(provider),
        other: Arc::new(other),
        node,
        free,
    }
}

/// The tier's Keystone and Neutron, shared with the other tables of this binary.
pub(super) async fn openstack_servers() -> &'static OpenStackServers {
    static SHARED: tokio::sync::OnceCell<OpenStackServers> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_init(|| async { OpenStackServers::start(Options::default()).await.unwrap() })
        .await
}

/// A provider with the member's credentials of `servers`, reaching Neutron at `network_url`
/// (a proxy in front of it) instead of the catalog's when given.
pub(super) fn member_provider(
    servers: &OpenStackServers,
    network_url: Option<&str>,
) -> OpenStackProvider {
    provider_as(servers, &servers.member, network_url)
}

/// A provider with `user`'s credentials of `servers`, reaching Neutron at `network_url` when
/// given.
pub(super) fn provider_as(
    servers: &OpenStackServers,
    user: &User,
    network_url: Option<&str>,
) -> OpenStackProvider {
    let cloud = CloudConfig::parse(Path::new("clouds.yaml"), &servers.clouds_yaml(user)).unwrap();
    OpenStackProvider::new(&OpenStackSettings {
        cloud,
        ca_pem: None,
        network_url: network_url.map(str::to_owned),
        max_pairs: 10,
        call_timeout: PROVIDER_CALL_TIMEOUT,
    })
    .unwrap()
}

/// A network `name` with the IPv4 subnet `cidr`: their ids.
pub(super) async fn openstack_network(api: &Api, name: &str, cidr: &str) -> (String, String) {
    let id = |created: serde_json::Value| created["id"].as_str().unwrap().to_owned();
    let network = id(api
        .create("network", json!({ "name": name }))
        .await
        .unwrap());
    let subnet = api
        .create(
            "subnet",
            json!({"network_id": network, "ip_version": 4, "cidr": cidr}),
        )
        .await
        .unwrap();
    (network, id(subnet))
}

async fn openstack_bed() -> Bed {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let servers = openstack_servers().await;
    let api = servers.api(&servers.member).await.unwrap();
    let prefix = format!("10.{}.{n}", 200 + n / 250);
    let (network, subnet) =
        openstack_network(&api, &format!("driver-{n}"), &format!("{prefix}.0/24")).await;
    let server = format!("{n:08x}-0000-4000-8000-00000000d41e");
    let port = api
        .create(
            "port",
            json!({"network_id": network, "device_id": server, "device_owner": "compute:nova",
                   "fixed_ips": [{"subnet_id": subnet, "ip_address": format!("{prefix}.10")}]}),
        )
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let proxy = FaultProxy::builder(servers.neutron_url.clone(), Dialect::Rest)
        .start()
        .await
        .unwrap();
    let provider = Arc::new(member_provider(servers, Some(proxy.url())));
    let other = Arc::new(member_provider(servers, None));
    let node = NodeTarget {
        node_name: "node-0".into(),
        provider_id: format!("openstack:///{server}"),
        instance: InstanceId(server),
        internal_ips: Default::default(),
    };
    let free = (0..4)
        .map(|i| format!("{prefix}.{}", 100 + i).parse().unwrap())
        .collect();
    Bed {
        cloud: Cloud::OpenStack,
        fake: Fake::OpenStack {
            admin: servers.api(&servers.admin).await.unwrap(),
            port,
        },
        proxy,
        provider,
        other,
        node,
        free,
    }
}

/// Runs `row` against every cloud, one after the other (each on a bed of its own).
async fn for_every_cloud<F, Fut>(row: F)
where
    F: Fn(Bed) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for cloud in CLOUDS {
        eprintln!("{cloud:?}");
        row(Bed::start(cloud).await).await;
    }
}

/// Starts `change` on `bed`'s provider with `rule` on the cloud's write call, lifts the rule once
/// the proxy has injected `faults`, and returns how the change ended and how long it took.
async fn through_faults(
    bed: &Bed,
    rule: Rule,
    faults: u64,
    change: Change,
) -> (Result<(), ErrorKind>, Duration) {
    bed.proxy.set_rule(bed.write_route(), rule);
    let provider = Arc::clone(&bed.provider);
    let node = bed.node.clone();
    let started = Instant::now();
    let task = tokio::spawn(async move {
        let result = provider.apply(&node, &change, None).await;
        (result.map(drop).map_err(|e| e.kind), started.elapsed())
    });
    let deadline = Instant::now() + FAULT_WAIT;
    while bed.injected() < faults {
        assert!(
            Instant::now() < deadline,
            "{:?}: the proxy injected {} of {faults} faults",
            bed.cloud,
            bed.injected()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    bed.proxy.clear_rules();
    task.await.unwrap()
}

#[tokio::test]
async fn a_write_from_a_stale_state_loses_no_one_elses_change() {
    for_every_cloud(|bed| async move {
        let (theirs, ours) = (bed.free[0], bed.free[1]);
        let view = bed.provider.egress_config(&bed.node).await.unwrap();
        bed.other
            .apply(&bed.node, &add(&[theirs]), None)
            .await
            .unwrap();
        let writes = bed.writes();
        // The engine's view (our last answer) no longer shows the interface as it is.
        let after = bed
            .provider
            .apply(&bed.node, &add(&[ours]), Some(&view))
            .await
            .unwrap()
            .unwrap();
        assert!(after.holds(ours), "{:?}: {after:?}", bed.cloud);
        let now = bed.addresses().await;
        assert!(
            now.contains(&theirs) && now.contains(&ours),
            "{:?}: {now:?}",
            bed.cloud
        );
        // A guarded write (etag, fingerprint, revision) is refused once and sent again after a
        // read; EC2 has no guard and takes the one write as it is.
        let expected = if bed.cloud == Cloud::Aws { 1 } else { 2 };
        assert_eq!(bed.writes() - writes, expected, "{:?}", bed.cloud);
    })
    .await;
}

#[tokio::test]
async fn a_transient_failure_is_read_again_and_retried() {
    for_every_cloud(|bed| async move {
        let ips = [bed.free[0], bed.free[1]];
        let (result, _) =
            through_faults(&bed, Rule::PASS.with_server_error(1.0), 2, add(&ips)).await;
        assert_eq!(result, Ok(()), "{:?}", bed.cloud);
        let now = bed.addresses().await;
        assert!(
            ips.iter().all(|ip| now.contains(ip)),
            "{:?}: {now:?}",
            bed.cloud
        );
        assert!(bed.injected() >= 2, "{:?}", bed.cloud);
    })
    .await;
}

#[tokio::test]
async fn a_throttled_write_waits_as_asked_and_is_retried() {
    for_every_cloud(|bed| async move {
        let ips = [bed.free[2]];
        let (result, took) =
            through_faults(&bed, Rule::PASS.with_throttle(1.0), 2, add(&ips)).await;
        assert_eq!(result, Ok(()), "{:?}", bed.cloud);
        assert!(bed.addresses().await.contains(&ips[0]), "{:?}", bed.cloud);
        if bed.cloud == Cloud::Azure {
            // ARM's `Retry-After: 1`, honoured after each throttled PUT (the backoff alone
            // would have waited tens of milliseconds).
            assert!(took >= Duration::from_secs(2), "{took:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_refusal_is_believed_only_after_a_fresh_read_and_nothing_is_sent() {
    for_every_cloud(|bed| async move {
        // From a fresh read: believed at once.
        let writes = bed.writes();
        let error = bed
            .provider
            .apply(&bed.node, &add(&[OUTSIDE]), None)
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Permanent, "{:?}: {error}", bed.cloud);
        // From the remembered state: read again before it is believed.
        let view = bed.provider.egress_config(&bed.node).await.unwrap();
        let reads = bed.reads();
        let error = bed
            .provider
            .apply(&bed.node, &add(&[OUTSIDE]), Some(&view))
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Permanent, "{:?}: {error}", bed.cloud);
        assert!(
            bed.reads() > reads,
            "{:?}: no read before believing",
            bed.cloud
        );
        assert_eq!(bed.writes(), writes, "{:?}", bed.cloud);
    })
    .await;
}

#[tokio::test]
async fn a_vm_that_is_gone_holds_none_of_the_ips() {
    for_every_cloud(|bed| async move {
        let ip = bed.free[0];
        bed.provider
            .apply(&bed.node, &add(&[ip]), None)
            .await
            .unwrap();
        bed.kill().await;
        let remove = Change::new(Vec::new(), vec![ip]);
        let gone = bed.provider.apply(&bed.node, &remove, None).await;
        assert_eq!(gone, Ok(None), "{:?}", bed.cloud);
        let error = bed
            .provider
            .apply(&bed.node, &add(&[bed.free[1]]), None)
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::NotFound, "{:?}: {error}", bed.cloud);
    })
    .await;
}

#[tokio::test]
async fn an_ip_named_twice_is_sent_once() {
    for_every_cloud(|bed| async move {
        let (a, b) = (bed.free[0], bed.free[1]);
        let writes = bed.writes();
        let view = bed
            .provider
            .apply(&bed.node, &add(&[a, b, a]), None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(bed.writes() - writes, 1, "{:?}", bed.cloud);
        let now = bed.addresses().await;
        for ip in [a, b] {
            assert_eq!(
                now.iter().filter(|x| **x == ip).count(),
                1,
                "{:?}: {now:?}",
                bed.cloud
            );
            assert!(view.holds(ip), "{:?}", bed.cloud);
        }
    })
    .await;
}

/// The engine's lanes over `bed`'s provider, with a ledger in memory: what the reconciler runs.
fn engine(bed: &Bed) -> (Arc<Lanes>, Arc<Ledger>) {
    let metrics = Arc::new(Metrics::default());
    let ledger = Arc::new(Ledger::in_memory(Arc::clone(&metrics)));
    let interfaces = Arc::new(Interfaces::new(
        Arc::clone(&bed.provider),
        Arc::clone(&metrics),
    ));
    let at_once = Gather {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
    };
    let lanes = Lanes::new(
        Arc::clone(&bed.provider),
        metrics,
        interfaces,
        Arc::clone(&ledger),
        4,
        at_once,
    );
    (Arc::new(lanes), ledger)
}

#[tokio::test]
async fn an_address_another_writer_put_on_the_vm_is_not_taken_over_and_nothing_is_sent() {
    for_every_cloud(|bed| async move {
        let (lanes, ledger) = engine(&bed);
        let [theirs, mine, lost, upstream] = [bed.free[0], bed.free[1], bed.free[2], bed.free[3]];
        bed.other
            .apply(&bed.node, &add(&[theirs, lost, upstream]), None)
            .await
            .unwrap();
        let writes = bed.writes();
        // Without a view of the VM, the provider reads it and refuses.
        let error = lanes
            .submit(&bed.node, Mutation::Attach, theirs)
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Foreign, "{:?}: {error}", bed.cloud);
        assert!(error.message.contains("did not attach it"), "{error}");
        assert_eq!(bed.writes(), writes, "{:?}", bed.cloud);
        // With one (the answer of a change of ours), the lane refuses it before any call.
        lanes
            .submit(&bed.node, Mutation::Attach, mine)
            .await
            .unwrap();
        let (writes, reads) = (bed.writes(), bed.reads());
        let error = lanes
            .submit(&bed.node, Mutation::Attach, theirs)
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Foreign, "{:?}: {error}", bed.cloud);
        assert_eq!(
            (bed.writes(), bed.reads()),
            (writes, reads),
            "{:?}",
            bed.cloud
        );
        assert!(bed.addresses().await.contains(&theirs), "{:?}", bed.cloud);
        // Recorded as ours before (a call whose answer was lost), or adopted from an earlier
        // controller: found there, it is done, and nothing is sent.
        ledger.record(&bed.node, &[lost]).await.unwrap();
        let writes = bed.writes();
        lanes
            .submit(&bed.node, Mutation::Attach, lost)
            .await
            .unwrap();
        lanes
            .submit(&bed.node, Mutation::Adopt, upstream)
            .await
            .unwrap();
        assert_eq!(bed.writes(), writes, "{:?}", bed.cloud);
    })
    .await;
}

#[tokio::test]
async fn the_nodes_own_addresses_are_never_detached_nor_taken_as_egress_ips() {
    // OpenStack's fixed IPs are not allowed-address-pairs: the engine never sees them.
    for cloud in [Cloud::Aws, Cloud::Azure, Cloud::Gcp] {
        eprintln!("{cloud:?}");
        let bed = Bed::start(cloud).await;
        if let Fake::Gcp { fake, name, .. } = &bed.fake {
            // A range wider than /32 on nic0 (a pod range, say): its network address is the
            // node's, not an alias to detach or take.
            fake.set_aliases(PROJECT, ZONE, name, &["10.0.0.16/28"])
                .unwrap();
        }
        let own = bed.provider.egress_config(&bed.node).await.unwrap().primary;
        assert!(!own.is_empty(), "{cloud:?}");
        let (lanes, _) = engine(&bed);
        let writes = bed.writes();
        for ip in &own {
            for mutation in [Mutation::Detach, Mutation::Attach] {
                let error = lanes.submit(&bed.node, mutation, *ip).await.unwrap_err();
                assert_eq!(error.kind, ErrorKind::Foreign, "{cloud:?} {ip}: {error}");
                assert!(error.message.contains("node's own address"), "{error}");
            }
        }
        assert_eq!(bed.writes(), writes, "{cloud:?}");
        let after = bed.provider.egress_config(&bed.node).await.unwrap();
        assert_eq!(after.primary, own, "{cloud:?}");
        if let Fake::Gcp { fake, name, .. } = &bed.fake {
            assert_eq!(fake.aliases(PROJECT, ZONE, name), ["10.0.0.16/28"]);
        }
    }
}
