#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The egress gateway's whole path on every cloud, one story each cloud's file tells on its own
//! system: the EgressGateway CRD from `manifests/gateways`; the gateway front end in this process
//! (the code the reconciler's leader runs with `--front-end egress-gateway`) over the system's
//! control plane; the shipped reconciler attaching in that cloud's fake or real part; and the real
//! node agent (`cloudnet-node`, in process) of each of two nodes, each in a network namespace of
//! its own whose `eth0` holds the node's address in its cloud subnet ([`crate::netns`]). After
//! every step the story reads the gateway's status, the cloud's own view of each node's interface,
//! each namespace's addresses, and which nodes carry the active label. On AWS it also creates
//! Cilium's `CiliumEgressGatewayPolicy` (the CRD of the pinned Cilium) selecting the gateway by
//! that label; Cilium's agent is not run.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudnet_e2e::harness::cilium;
use cloudnet_e2e::harness::e2e::local::NAMESPACE;
use cloudnet_e2e::harness::e2e::plugin;
use cloudnet_reconciler::frontend::gateway::{self, Settings};
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::encode_name;
use cloudnet_shared::gateway::{ACTIVE_VALUE, EgressGateway, active_label, lease_name};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::core::Selector;
use kube::runtime::events::Reporter;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::netns::{Agent, NodeNetns};

/// A failure bound for one step on a loaded machine, not a speed measure (`make bench-gateway`
/// measures failover).
const STEP: Duration = Duration::from_secs(90);
/// How often the story reads the system while it waits for a state.
const POLL: Duration = Duration::from_millis(100);
/// The label by which a story's gateway selects its two nodes (the value is the story's prefix).
const SELECTED: &str = "cloudnet.io/e2e-gateway";
/// The front end's heartbeat timeout: the default (`--heartbeat-timeout-ms`).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);
/// The removals the agent has made, as its `/metrics` shows them.
const REMOVED: &str =
    r#"cloudnet_node_address_operations_total{operation="remove",outcome="success"}"#;

/// Whether the story also creates Cilium's policy for the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cilium {
    /// Not on this cloud (one cloud is enough: the policy only reads the label).
    Skip,
    /// Install Cilium's CRD and check the policy's selector against the nodes.
    Policy,
}

/// What the story sees of the gateway at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    /// `status.activeNode` (`None`: the gateway is gone).
    active: Option<String>,
    /// The `Ready` condition's reason.
    ready: String,
    /// The gateway's IPs the cloud shows on each node's interface.
    cloud: [BTreeSet<IpAddr>; 2],
    /// The addresses the agent's mark is on, on each node's `eth0`.
    netns: [BTreeSet<IpAddr>; 2],
    /// Each of the gateway's IPs that has a CloudPrivateIPConfig, with its `status.node`.
    objects: BTreeMap<IpAddr, String>,
    /// The nodes carrying `egress-gateway.cloudnet.io/<gateway>=active`, the whole cluster's.
    labelled: Vec<String>,
}

/// EgressGateway `<prefix>-gw` holding `ips`, selecting `nodes` (in name order: the first is
/// chosen first), follows its live agent: active on `nodes[0]` (the IPs attached there in the
/// cloud, marked on its `eth0`, the label on it alone); `nodes[0]`'s agent stopped: all of it on
/// `nodes[1]`; `nodes[0]`'s agent back, first with the addresses the stopped one left, then on a
/// clean interface: it removes them, never puts them on and never labels its node, and the
/// gateway stays; the gateway deleted: the IPs leave the cloud and every namespace, the objects
/// and the label go. With [`Cilium::Policy`], Cilium's policy for the gateway selects exactly the
/// active node before and after the failover. `on(node)` reads the addresses the cloud shows on
/// that node's interface.
pub async fn a_gateway_follows_its_live_agent<F, Fut>(
    client: &Client,
    prefix: &str,
    ips: &[IpAddr],
    nodes: [&str; 2],
    cilium: Cilium,
    on: F,
) where
    F: Fn(&str) -> Fut,
    Fut: Future<Output = BTreeSet<IpAddr>>,
{
    assert!(
        nodes[0] < nodes[1],
        "the story expects its nodes in name order"
    );
    let ips: BTreeSet<IpAddr> = ips.iter().copied().collect();
    let name = format!("{prefix}-gw");
    install_crd(client, gateway_crd()).await;
    let mut spaces = Vec::new();
    for node in nodes {
        let own = own_addresses(client, node).await;
        make_eligible(client, node, prefix).await;
        spaces.push(NodeNetns::new(&own).await);
    }
    let story = Story {
        client,
        name: name.clone(),
        ips: ips.clone(),
        nodes,
        netns: [spaces.remove(0), spaces.remove(0)],
        on,
    };
    start_front_end(client);
    let mut agents = nodes.map(|node| Some(Agent::start(client, story.netns_of(node), node)));
    // Both heartbeats are fresh before the gateway exists, so the first by name is the choice.
    for node in nodes {
        renewals(client, node, 2).await;
    }

    create_gateway(client, &name, prefix, &ips).await;
    let none = BTreeSet::new;
    story
        .wait_for(
            "active on the first node by name",
            held(nodes[0], &ips, [ips.clone(), none()], [ips.clone(), none()]),
        )
        .await;
    let policy = match cilium {
        Cilium::Skip => None,
        Cilium::Policy => {
            let policy = cilium_policy(client, &name, &ips).await;
            assert_eq!(policy_selects(client, &policy).await, [nodes[0]]);
            Some(policy)
        }
    };

    // The active node's agent stops (its VM powered off, say): its Lease is no longer renewed.
    // The address it put on its interface stays there (stopping changes nothing on the host).
    let stopped = Instant::now();
    agents[0].take().unwrap().stop().await;
    story
        .wait_for(
            "failed over to the second node",
            held(
                nodes[1],
                &ips,
                [none(), ips.clone()],
                [ips.clone(), ips.clone()],
            ),
        )
        .await;
    println!(
        "{prefix}: cloud, interface and label on {} {:?} after {}'s agent stopped",
        nodes[1],
        stopped.elapsed(),
        nodes[0]
    );
    if let Some(policy) = &policy {
        assert_eq!(policy_selects(client, policy).await, [nodes[1]]);
    }

    // Split brain: the old active node's agent comes back (same node, same interface) while the
    // other holds the gateway. It removes what the stopped one left and never labels its node;
    // the gateway stays.
    let back = Agent::start(client, story.netns_of(nodes[0]), nodes[0]);
    story.split_brain(&back, &ips, ips.len()).await;
    // Once more with its interface clean, as after a reboot: it never puts the addresses there.
    back.stop().await;
    let back = Agent::start(client, story.netns_of(nodes[0]), nodes[0]);
    story.split_brain(&back, &ips, 0).await;
    agents[0] = Some(back);

    // The gateway deleted: the IPs leave the cloud, every interface, and the label every node.
    Api::<EgressGateway>::all(client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let gone = Seen {
        active: None,
        ready: String::new(),
        cloud: [none(), none()],
        netns: [none(), none()],
        objects: BTreeMap::new(),
        labelled: Vec::new(),
    };
    story.wait_for("the gateway gone", gone).await;
    if let Some(policy) = policy {
        cilium::policies(client)
            .delete(&policy.name_any(), &DeleteParams::default())
            .await
            .unwrap();
    }
    for agent in agents.into_iter().flatten() {
        agent.stop().await;
    }
}

/// The expected sight of the gateway held by `node`, ready: each of `ips` attached there.
fn held(
    node: &str,
    ips: &BTreeSet<IpAddr>,
    cloud: [BTreeSet<IpAddr>; 2],
    netns: [BTreeSet<IpAddr>; 2],
) -> Seen {
    Seen {
        active: Some(node.to_owned()),
        ready: "Ready".to_owned(),
        cloud,
        netns,
        objects: ips.iter().map(|ip| (*ip, node.to_owned())).collect(),
        labelled: vec![node.to_owned()],
    }
}

struct Story<'a, F> {
    client: &'a Client,
    name: String,
    ips: BTreeSet<IpAddr>,
    nodes: [&'a str; 2],
    netns: [NodeNetns; 2],
    on: F,
}

impl<F, Fut> Story<'_, F>
where
    F: Fn(&str) -> Fut,
    Fut: Future<Output = BTreeSet<IpAddr>>,
{
    fn netns_of(&self, node: &str) -> &NodeNetns {
        &self.netns[usize::from(node == self.nodes[1])]
    }

    async fn seen(&self) -> Seen {
        let gateway = Api::<EgressGateway>::all(self.client.clone())
            .get_opt(&self.name)
            .await
            .unwrap();
        let mut cloud = [BTreeSet::new(), BTreeSet::new()];
        let mut netns = [BTreeSet::new(), BTreeSet::new()];
        for (i, node) in self.nodes.iter().enumerate() {
            cloud[i] = (self.on)(node)
                .await
                .intersection(&self.ips)
                .copied()
                .collect();
            netns[i] = self.netns[i].marked().await;
        }
        let api = plugin::objects(self.client);
        let mut objects = BTreeMap::new();
        for ip in &self.ips {
            if let Some(object) = api.get_opt(&encode_name(*ip).unwrap()).await.unwrap() {
                objects.insert(*ip, object.status.map(|s| s.node).unwrap_or_default());
            }
        }
        let labelled = Api::<Node>::all(self.client.clone())
            .list(
                &ListParams::default()
                    .labels(&format!("{}={ACTIVE_VALUE}", active_label(&self.name))),
            )
            .await
            .unwrap()
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        Seen {
            active: gateway
                .as_ref()
                .map(|g| g.active_node().unwrap_or_default().to_owned()),
            ready: gateway
                .as_ref()
                .and_then(|g| g.ready_condition())
                .map(|c| c.reason.clone())
                .unwrap_or_default(),
            cloud,
            netns,
            objects,
            labelled,
        }
    }

    /// Waits until the story sees `expected`; panics with what it saw last.
    async fn wait_for(&self, what: &str, expected: Seen) {
        let deadline = Instant::now() + STEP;
        loop {
            let seen = self.seen().await;
            if seen == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what} not within {STEP:?}\nexpected {expected:#?}\nseen {seen:#?}",
                self.name
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// The returning agent `back` of `nodes[0]` converges (its watches listed and its metrics
    /// counting the removals of the `leftovers` addresses the stopped agent left), and from then
    /// on for two renewals of its Lease its interface holds none of `ips`; with no leftovers, not
    /// from the start either. Throughout, its node never carries the label and the gateway stays
    /// on `nodes[1]`.
    async fn split_brain(&self, back: &Agent, ips: &BTreeSet<IpAddr>, leftovers: usize) {
        let [old, new] = self.nodes;
        let expected = held(
            new,
            ips,
            [BTreeSet::new(), ips.clone()],
            [BTreeSet::new(), ips.clone()],
        );
        let deadline = Instant::now() + STEP;
        let mut lease = LeaseRenewals::new(self.client, old).await;
        let mut converged_at = None;
        loop {
            let seen = self.seen().await;
            assert_eq!(seen.active.as_deref(), Some(new), "the gateway moved back");
            assert_eq!(seen.labelled, [new], "{old}'s returning agent labelled it");
            lease.poll().await;
            if leftovers == 0 {
                assert_eq!(seen, expected, "{old}'s returning agent put an address on");
            }
            match converged_at {
                None => {
                    let removed = back.sample(REMOVED).unwrap_or(0.0);
                    if back.ready() && removed >= leftovers as f64 {
                        converged_at = Some(lease.count);
                    }
                }
                Some(at) => {
                    assert_eq!(
                        seen, expected,
                        "{old}'s returning agent kept or put back an address"
                    );
                    if lease.count >= at + 2 {
                        break;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "{old}'s returning agent did not converge within {STEP:?} (lease renewed {} times, removals {:?}, ready {}): {seen:#?}",
                lease.count,
                back.sample(REMOVED),
                back.ready()
            );
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(back.sample("cloudnet_node_gateways"), Some(0.0));
        assert_eq!(
            back.sample(r#"cloudnet_node_egress_ips{state="held"}"#),
            Some(0.0)
        );
    }
}

/// Counts the renewals of a node's heartbeat Lease the story sees.
struct LeaseRenewals {
    api: Api<Lease>,
    name: String,
    last: Option<String>,
    count: usize,
}

impl LeaseRenewals {
    async fn new(client: &Client, node: &str) -> Self {
        let mut renewals = Self {
            api: Api::namespaced(client.clone(), NAMESPACE),
            name: lease_name(node),
            last: None,
            count: 0,
        };
        renewals.last = renewals.renew_time().await;
        renewals
    }

    async fn renew_time(&self) -> Option<String> {
        let lease = self.api.get_opt(&self.name).await.unwrap()?;
        Some(serde_json::to_string(&lease.spec?.renew_time?).unwrap())
    }

    async fn poll(&mut self) {
        let now = self.renew_time().await;
        if now.is_some() && now != self.last {
            self.count += 1;
            self.last = now;
        }
    }
}

/// Waits until `node`'s heartbeat Lease has been renewed `n` times from now.
async fn renewals(client: &Client, node: &str, n: usize) {
    let deadline = Instant::now() + STEP;
    let mut lease = LeaseRenewals::new(client, node).await;
    while lease.count < n {
        assert!(
            Instant::now() < deadline,
            "{node}'s heartbeat Lease renewed {} times in {STEP:?}",
            lease.count
        );
        tokio::time::sleep(POLL).await;
        lease.poll().await;
    }
}

/// The node's own addresses for its interface: its InternalIP in each subnet its egress
/// annotation names, with the subnet's prefix length (an IPv6 subnet without such an address gets
/// the subnet's `::a`, as a dual-stack VM has an address of its own there).
async fn own_addresses(client: &Client, node: &str) -> Vec<(IpAddr, u8)> {
    let annotation = plugin::wait_annotation(client, node).await.unwrap();
    let status = Api::<Node>::all(client.clone())
        .get_status(node)
        .await
        .unwrap();
    let internal: Vec<IpAddr> = status
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    let mut own = Vec::new();
    for config in annotation {
        if let Some(net) = config.ifaddr.ipv4 {
            let ip = internal
                .iter()
                .find(|ip| matches!(ip, IpAddr::V4(v4) if net.contains(v4)))
                .unwrap_or_else(|| panic!("{node} has no InternalIP in {net}"));
            own.push((*ip, net.prefix_len()));
        }
        if let Some(net) = config.ifaddr.ipv6 {
            let ip = internal
                .iter()
                .copied()
                .find(|ip| matches!(ip, IpAddr::V6(v6) if net.contains(v6)))
                .unwrap_or_else(|| IpAddr::V6((u128::from(net.network()) | 0xa).into()));
            own.push((ip, net.prefix_len()));
        }
    }
    own
}

/// Labels `node` for the story's gateway and makes it Ready, as the kubelet reports it.
async fn make_eligible(client: &Client, node: &str, prefix: &str) {
    let nodes = Api::<Node>::all(client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {SELECTED: prefix}}})),
        )
        .await
        .unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }]}})),
        )
        .await
        .unwrap();
}

/// Starts the gateway front end in this process, as the leader runs it; it runs until the test's
/// runtime ends. One per system: it plans for every gateway there.
fn start_front_end(client: &Client) {
    let reporter = Reporter {
        controller: "cloudnet-reconciler".into(),
        instance: Some("e2e".into()),
    };
    tokio::spawn(gateway::run(
        client.clone(),
        reporter,
        Arc::new(Metrics::default()),
        Settings {
            lease_namespace: NAMESPACE.into(),
            heartbeat_timeout: HEARTBEAT_TIMEOUT,
        },
        std::future::pending(),
    ));
}

async fn create_gateway(client: &Client, name: &str, prefix: &str, ips: &BTreeSet<IpAddr>) {
    let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
    let gateway: EgressGateway = serde_json::from_value(json!({
        "apiVersion": "cloudnet.io/v1alpha1", "kind": "EgressGateway",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {SELECTED: prefix}}, "egressIPs": ips},
    }))
    .unwrap();
    Api::<EgressGateway>::all(client.clone())
        .create(&PostParams::default(), &gateway)
        .await
        .unwrap();
}

/// The EgressGateway CRD as `manifests/gateways` ships it.
fn gateway_crd() -> CustomResourceDefinition {
    let path = cloudnet_e2e::crate_file("../manifests/gateways/egressgateways.cloudnet.io.yaml");
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Creates `crd` (already there: kept) and waits until its resource is served.
async fn install_crd(client: &Client, crd: CustomResourceDefinition) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    match crds.create(&PostParams::default(), &crd).await {
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        other => {
            other.unwrap();
        }
    }
    let version = crd.spec.versions.iter().find(|v| v.served).unwrap();
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &version.name, &crd.spec.names.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let deadline = Instant::now() + STEP;
    while api.list(&ListParams::default().limit(1)).await.is_err() {
        assert!(Instant::now() < deadline, "{} not served", crd.name_any());
        tokio::time::sleep(POLL).await;
    }
}

/// Installs the pinned Cilium's CRD and creates the policy Cilium would read for gateway
/// `gateway`: its pods' traffic SNATed to the gateway's IPv4 egress IP on the node that carries
/// the gateway's active label. The API server admits it (the CRD's own schema and validations);
/// the stored policy says what was asked.
async fn cilium_policy(client: &Client, gateway: &str, ips: &BTreeSet<IpAddr>) -> DynamicObject {
    cilium::install_egress_gateway_policy_crd(client)
        .await
        .unwrap();
    let ip = *ips.iter().find(|ip| ip.is_ipv4()).unwrap();
    let label = active_label(gateway);
    let stored = cilium::create_policy(client, gateway, (&label, ACTIVE_VALUE), ip)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        stored.data["spec"]["egressGateway"]["egressIP"],
        json!(ip.to_string())
    );
    stored
}

/// The nodes the policy's `egressGateway.nodeSelector` selects, as Cilium's agent would list
/// them (read from the stored policy).
async fn policy_selects(client: &Client, policy: &DynamicObject) -> Vec<String> {
    let stored = cilium::policies(client)
        .get(&policy.name_any())
        .await
        .unwrap();
    let selector: LabelSelector =
        serde_json::from_value(stored.data["spec"]["egressGateway"]["nodeSelector"].clone())
            .unwrap();
    let selector = Selector::try_from(selector).unwrap();
    Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels_from(&selector))
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect()
}
