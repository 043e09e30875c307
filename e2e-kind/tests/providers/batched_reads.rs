#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Reads batched across VMs (`CloudProvider::egress_configs`), one check per cloud whose API
//! lists many VMs in one call: GCP on the GCE fake (VMs over two zones), Azure on the ARM fake
//! (two resource groups), OpenStack on real Neutron (a full `device_id` list, so the URL's length
//! is tested too), each behind the fault proxy, which counts the calls. The batched answer must
//! equal the per-VM answers, cost the expected list calls (pages included) and no per-VM read,
//! and a VM missing among them must be NotFound on its own while the others answer. OpenStack
//! reads servers it knows with one list of their network: that a later read costs one call and
//! still sees changes and deletions, and that every list follows Neutron's pages, has its own
//! tests.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use cloudnet_e2e::fakes::arm::{ArmConfig, ArmFake};
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch, Rule};
use cloudnet_e2e::fakes::gce::{self, GceFake, InstanceSpec, PROJECT};
use cloudnet_e2e::fakes::openstack::{Api, OpenStackServers};
use cloudnet_reconciler::cloud::openstack::OpenStackProvider;
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{
    CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget,
};
use cloudnet_shared::InternalIps;
use serde_json::json;

/// VMs of each zone or resource group.
const PER_GROUP: usize = 6;

/// The page size the fakes cut their lists to, so that a list of a group takes two pages.
const PAGE: usize = 4;

/// VMs of one cloud, the provider reading them through the proxy, and what reading them costs.
struct Fleet {
    proxy: FaultProxy,
    provider: Arc<dyn CloudProvider>,
    /// The VMs that exist, then one that does not, in the order they are read.
    nodes: Vec<NodeTarget>,
    missing: NodeTarget,
    /// Whether a proxy route is the cloud's list call.
    list_route: fn(&str) -> bool,
    /// Whether a proxy route is a single-VM read (none on OpenStack, whose single read is a
    /// list too).
    single_route: fn(&str) -> bool,
    /// List calls (pages) one batched read of every node costs.
    lists: u64,
    /// Single reads it costs besides (the missing VM's, where the list cannot tell).
    singles: u64,
    /// The cloud's fake, kept alive.
    _keep: Box<dyn std::any::Any + Send>,
}

impl Fleet {
    fn forwarded(&self, route: fn(&str) -> bool) -> u64 {
        self.proxy.forwarded_where(route)
    }

    /// The missing VM amid the others.
    fn targets(&self) -> Vec<NodeTarget> {
        let mut targets = self.nodes.clone();
        targets.insert(self.nodes.len() / 2, self.missing.clone());
        targets
    }

    /// Reads every target in one batch and checks it against the per-VM reads.
    async fn check(&self) {
        let targets = self.targets();
        let name = self.provider.needs().name;
        assert!(
            targets.len() <= self.provider.needs().max_read_batch,
            "{name}: {} VMs do not fit one batch",
            targets.len()
        );
        let batched = self.provider.egress_configs(&targets).await;
        assert_eq!(batched.len(), targets.len(), "{name}: one answer per VM");
        assert_eq!(self.forwarded(self.list_route), self.lists, "{name}: lists");
        assert_eq!(
            self.forwarded(self.single_route),
            self.singles,
            "{name}: single reads"
        );
        for (target, answer) in targets.iter().zip(&batched) {
            let single = self.provider.egress_config(target).await;
            if *target == self.missing {
                let error = answer.as_ref().unwrap_err();
                assert_eq!(error.kind, ErrorKind::NotFound, "{name}: {error}");
                assert_eq!(single.unwrap_err().kind, ErrorKind::NotFound, "{name}");
            } else {
                let answer = answer.as_ref().unwrap();
                assert_eq!(*answer, single.unwrap(), "{name}: {}", target.node_name);
                assert!(answer.ipv4_subnet.is_some(), "{name}: {answer:?}");
            }
        }
    }
}

// AWS's row (DescribeInstances with many instance ids) belongs beside these: `aws_fleet`.

/// GCP's VMs over two zones, `per_zone` in each, the list cut to pages of `page` when given;
/// and a VM of the same project that is not the cluster's.
async fn gcp_fleet(grant_list: bool, per_zone: usize, page: Option<usize>) -> Fleet {
    const ZONES: [&str; 2] = ["us-central1-a", "us-central1-b"];
    let fake = GceFake::start().await.unwrap();
    if grant_list {
        let mut granted = gce::CREDENTIALS_REQUEST.map(str::to_owned).to_vec();
        granted.push("compute.instances.list".into());
        fake.grant(Some(granted));
    }
    fake.set_list_page_size(page);
    let subnet = GceFake::standard_subnet();
    let key = (
        subnet.project.clone(),
        subnet.region.clone(),
        subnet.name.clone(),
    );
    fake.add_subnet(subnet);
    let mut specs = Vec::new();
    for (z, zone) in ZONES.iter().enumerate() {
        for i in 0..per_zone {
            let spec = InstanceSpec {
                project: PROJECT.into(),
                zone: (*zone).into(),
                name: format!("vm-{z}-{i}"),
                subnet: key.clone(),
                network_ip: Ipv4Addr::from(0x0a00_000a + u32::try_from(z * 1000 + i).unwrap()),
            };
            fake.add_instance(spec.clone()).unwrap();
            specs.push(spec);
        }
    }
    fake.add_instance(InstanceSpec {
        project: PROJECT.into(),
        zone: ZONES[0].into(),
        name: "db-0".into(),
        subnet: key.clone(),
        network_ip: Ipv4Addr::new(10, 0, 0, 9),
    })
    .unwrap();
    // Answers that differ from VM to VM.
    fake.set_aliases(PROJECT, ZONES[0], "vm-0-1", &["10.0.0.100/32"])
        .unwrap();
    fake.set_aliases(PROJECT, ZONES[1], "vm-1-2", &["10.4.0.7/32", "10.4.0.8/32"])
        .unwrap();
    let proxy = FaultProxy::builder(fake.url(), Dialect::Gce)
        .start()
        .await
        .unwrap();
    let secrets = tempfile::tempdir().unwrap();
    gce::write_service_account(secrets.path()).unwrap();
    let mut settings = cloudnet_reconciler::cloud::gcp::GcpSettings::new(proxy.url());
    settings.pacing = Pacing::UNLIMITED;
    let provider =
        cloudnet_reconciler::cloud::gcp::GcpProvider::from_secret_dir(&settings, secrets.path())
            .await
            .unwrap();
    let mut nodes = Vec::new();
    for spec in &specs {
        nodes.push(
            provider
                .resolve(&spec.name, &spec.provider_id())
                .await
                .unwrap(),
        );
    }
    let missing = provider
        .resolve("gone", &format!("gce://{PROJECT}/{}/vm-gone", ZONES[0]))
        .await
        .unwrap();
    Fleet {
        proxy,
        provider: Arc::new(provider),
        nodes,
        missing,
        list_route: |r| r == "instances.aggregatedList",
        single_route: |r| r == "instances.get",
        // One list of the project, in pages.
        lists: u64::try_from((2 * per_zone).div_ceil(page.unwrap_or(500))).unwrap(),
        singles: 0,
        _keep: Box::new((fake, secrets)),
    }
}

/// What the GCE fake saw that the discovery document does not allow (filters included).
fn gce_violations(fleet: &Fleet) -> Vec<String> {
    let (fake, _) = fleet
        ._keep
        .downcast_ref::<(GceFake, tempfile::TempDir)>()
        .unwrap();
    fake.violations()
}

#[tokio::test]
async fn gcp_lists_the_projects_vms_in_every_zone_by_name_in_pages() {
    let fleet = gcp_fleet(true, PER_GROUP, Some(PAGE)).await;
    fleet.check().await;
    assert_eq!(gce_violations(&fleet), Vec::<String>::new());
}

#[tokio::test]
async fn gcp_lists_a_thousand_vms_in_two_calls_by_their_names_common_prefix() {
    // More VMs than a filter names one by one (50): a drift period over 1,000 VMs in two zones
    // is ⌈1,000 / 500⌉ = 2 calls (pages), and the project's other VM, outside the prefix, is
    // not listed.
    let fleet = gcp_fleet(true, 500, None).await;
    fleet.check().await;
    assert_eq!(gce_violations(&fleet), Vec::<String>::new());
}

#[tokio::test]
async fn gcp_without_the_list_permission_reads_each_vm_once_refused() {
    let mut fleet = gcp_fleet(false, PER_GROUP, Some(PAGE)).await;
    // OpenShift's CredentialsRequest grants `compute.instances.get` only: the project's list is
    // refused once, then every VM is read on its own, and later batches do not list again.
    fleet.lists = 1;
    fleet.singles = u64::try_from(fleet.nodes.len() + 1).unwrap();
    fleet.check().await;
    let lists = fleet.forwarded(fleet.list_route);
    fleet.provider.egress_configs(&fleet.targets()).await;
    assert_eq!(fleet.forwarded(fleet.list_route), lists);
    assert_eq!(gce_violations(&fleet), Vec::<String>::new());
}

/// The Azure fleet's subscription.
const SUB: &str = "00000000-0000-0000-0000-000000000002";

async fn azure_fleet() -> Fleet {
    use cloudnet_reconciler::cloud::aws::Secret;
    use cloudnet_reconciler::cloud::azure::{
        AzureAuth, AzureCredentials, AzureProvider, AzureSettings, Environment,
    };
    let fake = ArmFake::start(ArmConfig::default()).await.unwrap();
    fake.set_list_page_size(Some(PAGE));
    let subnet = fake
        .add_subnet(SUB, "net-rg", "vnet", "workers", &["10.0.0.0/16"])
        .unwrap();
    let mut vms = Vec::new();
    for (g, group) in ["rg-a", "rg-b"].iter().enumerate() {
        for i in 0..PER_GROUP {
            let octet = u8::try_from(10 + g * 10 + i).unwrap();
            let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, octet));
            vms.push(fake.add_vm(SUB, group, &format!("worker-{g}-{i}"), &subnet, ip));
        }
    }
    let proxy = FaultProxy::builder(fake.url(), Dialect::Arm)
        .start()
        .await
        .unwrap();
    let settings = AzureSettings {
        environment: Environment {
            token_audience: fake.url().to_owned(),
            ..Environment::at(proxy.url(), fake.url()).unwrap()
        },
        credentials: AzureCredentials {
            client_id: "app".into(),
            tenant_id: "tenant".into(),
            auth: AzureAuth::ClientSecret(Secret::new("test-secret")),
            subscription_id: Some(SUB.into()),
            resource_group: Some("rg-a".into()),
        },
        // Short, so that a list failing for good gives up soon.
        retry: cloudnet_reconciler::cloud::azure::RetryPolicy {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
            max_attempts: 3,
            ..cloudnet_reconciler::cloud::azure::RetryPolicy::default()
        },
        call_timeout: Duration::from_secs(10),
        pacing: Pacing::UNLIMITED,
    };
    let provider = AzureProvider::new(&settings).unwrap();
    let mut nodes = Vec::new();
    for (i, vm) in vms.iter().enumerate() {
        nodes.push(
            provider
                .resolve(&format!("node-{i}"), &vm.provider_id)
                .await
                .unwrap(),
        );
    }
    let gone = format!(
        "azure:///subscriptions/{SUB}/resourceGroups/rg-a/providers/Microsoft.Compute/virtualMachines/gone"
    );
    let missing = provider.resolve("gone", &gone).await.unwrap();
    Fleet {
        proxy,
        provider: Arc::new(provider),
        nodes,
        missing,
        list_route: |r| r.starts_with("GET ") && r.ends_with("/networkInterfaces"),
        single_route: |r| {
            r.starts_with("GET ")
                && (r.contains("/networkInterfaces/") || r.contains("/virtualMachines/"))
        },
        // Each group's NICs come in two pages.
        lists: 4,
        // No NIC of its group names the missing VM: its own read (the VM's GET) says it is gone.
        singles: 1,
        _keep: Box::new(fake),
    }
}

#[tokio::test]
async fn azure_lists_each_resource_groups_nics() {
    azure_fleet().await.check().await;
}

#[tokio::test]
async fn azure_a_failed_list_fails_the_vms_of_its_group_alone() {
    let fleet = azure_fleet().await;
    let list = format!(
        "GET /subscriptions/{SUB}/resourceGroups/rg-b/providers/Microsoft.Network/networkInterfaces"
    );
    fleet.proxy.set_rule(
        RouteMatch::exact(list.clone()),
        Rule::PASS.with_server_error(1.0),
    );
    let targets = fleet.targets();
    let answers = fleet.provider.egress_configs(&targets).await;
    for (target, answer) in targets.iter().zip(answers) {
        let kind = answer.as_ref().err().map(|e| e.kind);
        let expected = if *target == fleet.missing {
            Some(ErrorKind::NotFound)
        } else if target.instance.0.contains("/rg-b/") {
            Some(ErrorKind::Retryable)
        } else {
            None
        };
        assert_eq!(kind, expected, "{}: {answer:?}", target.node_name);
    }
    // The failing list was retried as a single read is (three attempts), and nothing else was
    // read per VM but the missing one.
    assert_eq!(fleet.proxy.counts(&list).server_errors, 3);
    assert_eq!(fleet.forwarded(fleet.single_route), 1);
}

/// Servers of one network in the tier's Neutron, each with one `compute:nova` port allowing an
/// address of its own, and an OpenStack provider reading them through the fault proxy.
struct NeutronFleet {
    proxy: FaultProxy,
    provider: OpenStackProvider,
    api: Api,
    /// The servers, in the order they are read.
    nodes: Vec<NodeTarget>,
    /// Each server's port id, in the same order.
    ports: Vec<String>,
}

/// Ports created per bulk call.
const BULK: usize = 200;

async fn neutron_fleet(servers: &OpenStackServers, count: usize) -> NeutronFleet {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let api = servers.api(&servers.member).await.unwrap();
    // A /16 of its own: room for more than a page of servers.
    let base = u32::from(Ipv4Addr::new(172, u8::try_from(15 + n).unwrap(), 0, 0));
    let (network, subnet) = super::driver::openstack_network(
        &api,
        &format!("batched-{n}"),
        &format!("{}/16", Ipv4Addr::from(base)),
    )
    .await;
    let address = |i: usize| Ipv4Addr::from(base + u32::try_from(i).unwrap());
    // Server ids of their own (`f1ee`): other tables' servers on the same Neutron are numbered
    // from 1 too, and a server id on two tables' ports would give both servers two ports.
    let server = |i: usize| format!("{n:08x}-f1ee-4000-8000-{:012x}", i + 1);
    let mut ports = Vec::new();
    let all: Vec<usize> = (0..count).collect();
    for chunk in all.chunks(BULK) {
        let each = chunk
            .iter()
            .map(|&i| {
                json!({"network_id": network, "device_id": server(i), "device_owner": "compute:nova",
                       "fixed_ips": [{"subnet_id": subnet, "ip_address": address(10 + i).to_string()}],
                       "allowed_address_pairs": [{"ip_address": address(0x8000 + i).to_string()}]})
            })
            .collect();
        let created = api.create_many("port", each).await.unwrap();
        ports.extend(created.iter().map(|p| p["id"].as_str().unwrap().to_owned()));
    }
    let nodes = (0..count)
        .map(|i| NodeTarget {
            node_name: format!("node-{i}"),
            provider_id: format!("openstack:///{}", server(i)),
            instance: InstanceId(server(i)),
            internal_ips: InternalIps {
                ipv4: Some(address(10 + i)),
                ipv6: None,
            },
        })
        .collect();
    let proxy = FaultProxy::builder(servers.neutron_url.clone(), Dialect::Rest)
        .start()
        .await
        .unwrap();
    let provider = super::driver::member_provider(servers, Some(proxy.url()));
    NeutronFleet {
        proxy,
        provider,
        api,
        nodes,
        ports,
    }
}

impl NeutronFleet {
    /// Port list calls so far (pages included).
    fn lists(&self) -> u64 {
        self.proxy.forwarded_where(|r| r == "GET /v2.0/ports")
    }

    /// Reads every server in one batch: the answers, and the list calls it cost.
    async fn read(&self) -> (Vec<Result<NodeEgress, CloudError>>, u64) {
        assert!(self.nodes.len() <= self.provider.needs().max_read_batch);
        let before = self.lists();
        let answers = self.provider.egress_configs(&self.nodes).await;
        assert_eq!(answers.len(), self.nodes.len());
        (answers, self.lists() - before)
    }
}

/// List calls of a first read, by `device_id` in chunks of this many servers.
const DEVICE_IDS: usize = 64;

#[tokio::test]
async fn openstack_reads_known_servers_with_one_list_of_their_network() {
    // More servers than one device_id list names.
    let count = 130;
    let servers = super::driver::openstack_servers().await;
    let fleet = neutron_fleet(servers, count).await;
    let (first, lists) = fleet.read().await;
    assert_eq!(
        lists,
        u64::try_from(count.div_ceil(DEVICE_IDS)).unwrap(),
        "a first read lists by device_id"
    );
    let first: Vec<NodeEgress> = first.into_iter().map(Result::unwrap).collect();
    let (second, lists) = fleet.read().await;
    assert_eq!(
        lists, 1,
        "known servers: one list of their network's compute ports"
    );
    let second: Vec<NodeEgress> = second.into_iter().map(Result::unwrap).collect();
    assert_eq!(second, first);

    // A change made behind the provider's back is seen by the next read.
    let changed = 7;
    let pair = "172.31.255.7";
    let (status, body) = fleet
        .api
        .neutron(
            "PUT",
            &format!("/ports/{}", fleet.ports[changed]),
            Some(&json!({"port": {"allowed_address_pairs": [{"ip_address": pair}]}})),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (third, lists) = fleet.read().await;
    assert_eq!(lists, 1);
    let third: Vec<NodeEgress> = third.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        third[changed].addresses,
        vec![pair.parse::<IpAddr>().unwrap()]
    );
    for (i, (now, then)) in third.iter().zip(&first).enumerate() {
        if i != changed {
            assert_eq!(now, then, "{}", fleet.nodes[i].node_name);
        }
    }

    // A server whose port is gone (deleted with the server: Neutron lets the cloud's admin, not
    // a member, delete a compute port) is read again by device_id, alone, and is NotFound.
    let deleted = 11;
    let admin = servers.api(&servers.admin).await.unwrap();
    let (status, body) = admin
        .neutron("DELETE", &format!("/ports/{}", fleet.ports[deleted]), None)
        .await
        .unwrap();
    assert_eq!(status, 204, "{body}");
    let (fourth, lists) = fleet.read().await;
    assert_eq!(
        lists, 2,
        "the network's list, then the missing server's own"
    );
    for (i, (now, then)) in fourth.iter().zip(&third).enumerate() {
        if i == deleted {
            let error = now.as_ref().unwrap_err();
            assert_eq!(error.kind, ErrorKind::NotFound, "{error}");
        } else {
            assert_eq!(now.as_ref().unwrap(), then, "{}", fleet.nodes[i].node_name);
        }
    }
}

/// List calls of `items` ports in pages of `cap`: Neutron marks a full page as followed by
/// another, so a multiple of `cap` ends with an empty page.
fn pages(items: usize, cap: usize) -> u64 {
    u64::try_from(items / cap + 1).unwrap()
}

#[tokio::test]
async fn openstack_follows_the_pages_of_a_neutron_that_caps_its_lists() {
    // The OpenStack provider table's Neutron cuts lists into pages (`pagination_max_limit`).
    let servers = super::openstack_provider::servers().await;
    let cap = usize::try_from(super::openstack_provider::PAGINATION_MAX_LIMIT).unwrap();
    let count = 130;
    let fleet = neutron_fleet(servers, count).await;
    let (first, lists) = fleet.read().await;
    let by_device: u64 = (0..count)
        .collect::<Vec<_>>()
        .chunks(DEVICE_IDS)
        .map(|chunk| pages(chunk.len(), cap))
        .sum();
    assert_eq!(lists, by_device, "every page of each device_id list");
    // A server whose port is on a later page is not taken for gone.
    let first: Vec<NodeEgress> = first.into_iter().map(Result::unwrap).collect();
    let (second, lists) = fleet.read().await;
    assert_eq!(lists, pages(count, cap), "every page of the network's list");
    let second: Vec<NodeEgress> = second.into_iter().map(Result::unwrap).collect();
    assert_eq!(second, first);
}

async fn openstack_fleet() -> Fleet {
    // A full device_id list with the missing server among them: the longest list URL the
    // provider sends must pass Neutron's server.
    let fleet = neutron_fleet(super::driver::openstack_servers().await, DEVICE_IDS - 1).await;
    let gone = format!("{:08x}-0000-4000-8000-{:012x}", u32::MAX, 1);
    let missing = NodeTarget {
        node_name: "gone".into(),
        provider_id: format!("openstack:///{gone}"),
        instance: InstanceId(gone),
        internal_ips: InternalIps::default(),
    };
    Fleet {
        proxy: fleet.proxy,
        provider: Arc::new(fleet.provider),
        nodes: fleet.nodes,
        missing,
        list_route: |r| r == "GET /v2.0/ports",
        single_route: |_| false,
        lists: 1,
        singles: 0,
        _keep: Box::new(()),
    }
}

#[tokio::test]
async fn openstack_lists_the_ports_of_a_full_batch_in_one_call() {
    openstack_fleet().await.check().await;
}
