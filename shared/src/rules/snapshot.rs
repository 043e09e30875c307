//! An indexed in-memory view of the cluster, kept up to date from watch events, so that every
//! admission decision is a handful of hash lookups instead of a scan of all nodes and objects.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use kube::core::{Selector, SelectorExt};

use crate::antrea::ExternalIPPool;
use crate::codec;
use crate::node::NodeInfo;
use crate::platform::Bucket;

use super::gateway_index::GatewayIndex;
use super::public_ip_index::PublicIpIndex;
use super::router_index::RouterIndex;

/// Nodes, node addresses, the objects and which nodes they occupy.
#[derive(Clone, Debug, Default)]
pub struct ClusterSnapshot {
    nodes: HashMap<String, NodeInfo>,
    /// Every node holding each address. Normally one; a set so that two nodes briefly reporting
    /// the same IP (a replaced VM) cannot make the index forget the survivor when one goes.
    node_addresses: HashMap<IpAddr, BTreeSet<String>>,
    /// Every object with a canonical name, wherever it points (empty nodes included): the IPs a
    /// CloudPrivateIPConfig manages.
    objects: HashMap<String, ObjectEntry>,
    /// Node name → names of the objects occupying it (`spec.node` or `status.node`), per family.
    per_node: HashMap<String, NodeObjects>,
    /// Names of objects deleted lately; whoever feeds the snapshot decides how long "lately" is.
    recently_deleted: HashSet<String>,
    /// Names the attachment ledger shows attached or released lately, each with the number of
    /// ledger pages naming it (an IP can be on two VMs' pages during a move).
    ledger: HashMap<String, u32>,
    /// Addresses of egress routers (EgressRouters and egress-router NetworkAttachmentDefinitions).
    routers: RouterIndex,
    /// The EgressPublicIP bindings.
    public_ips: PublicIpIndex,
    /// Each node's labels, for the nodeSelector of an Antrea ExternalIPPool; only nodes with
    /// labels are kept.
    node_labels: HashMap<String, BTreeMap<String, String>>,
    /// The opted-in Antrea ExternalIPPools by name, reduced to their ranges (an Egress's IP must
    /// lie in them).
    antrea_pools: HashMap<String, ExternalIPPool>,
    /// The EgressGateways' egress IPs.
    gateways: GatewayIndex,
    /// The objects the reconciler keeps for an EgressGateway (its front end's label and source
    /// annotation), by object name → gateway name; every other object is absent.
    object_gateways: HashMap<String, String>,
}

#[derive(Clone, Debug)]
struct ObjectEntry {
    ip: IpAddr,
    spec_node: String,
    status_node: String,
}

impl ObjectEntry {
    /// The nodes this object occupies: none, one, or source and target during a move.
    fn occupied(&self) -> impl Iterator<Item = &str> {
        let spec = Some(self.spec_node.as_str()).filter(|n| !n.is_empty());
        let status =
            Some(self.status_node.as_str()).filter(|n| !n.is_empty() && *n != self.spec_node);
        spec.into_iter().chain(status)
    }
}

#[derive(Clone, Debug, Default)]
struct NodeObjects {
    ipv4: HashSet<String>,
    ipv6: HashSet<String>,
}

impl NodeObjects {
    fn family_mut(&mut self, ip: IpAddr) -> &mut HashSet<String> {
        match ip {
            IpAddr::V4(_) => &mut self.ipv4,
            IpAddr::V6(_) => &mut self.ipv6,
        }
    }

    fn is_empty(&self) -> bool {
        self.ipv4.is_empty() && self.ipv6.is_empty()
    }
}

impl ClusterSnapshot {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a node, re-indexing its addresses.
    pub fn upsert_node(&mut self, node: NodeInfo) {
        self.unindex_addresses(&node.name);
        for ip in &node.addresses {
            self.node_addresses
                .entry(*ip)
                .or_default()
                .insert(node.name.clone());
        }
        self.nodes.insert(node.name.clone(), node);
    }

    /// Forgets a node; objects on it keep counting should it come back.
    pub fn remove_node(&mut self, name: &str) {
        self.unindex_addresses(name);
        self.nodes.remove(name);
        self.node_labels.remove(name);
    }

    /// Records the labels of node `name` (an ExternalIPPool's nodeSelector reads them); an empty
    /// map forgets them.
    pub fn set_node_labels(&mut self, name: &str, labels: BTreeMap<String, String>) {
        if labels.is_empty() {
            self.node_labels.remove(name);
        } else {
            self.node_labels.insert(name.to_owned(), labels);
        }
    }

    /// The known nodes with their labels (empty for a node without), in no particular order.
    pub fn nodes_with_labels(
        &self,
    ) -> impl Iterator<Item = (&NodeInfo, &BTreeMap<String, String>)> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        self.nodes.values().map(|node| {
            let labels = self.node_labels.get(&node.name).unwrap_or(&NONE);
            (node, labels)
        })
    }

    /// The known nodes whose labels `selector` matches (a nodeSelector's picks), by name.
    pub fn nodes_matching(&self, selector: &Selector) -> Vec<&NodeInfo> {
        let mut picked: Vec<&NodeInfo> = self
            .nodes_with_labels()
            .filter(|(_, labels)| selector.matches(labels))
            .map(|(node, _)| node)
            .collect();
        picked.sort_by(|a, b| a.name.cmp(&b.name));
        picked
    }

    /// The lowest node address in `first..=last` (of their family), with its node (the first by
    /// name), skipping the addresses `skip` accepts: a scan of every node address, for the rare
    /// write of an ExternalIPPool.
    pub fn node_address_in(
        &self,
        first: IpAddr,
        last: IpAddr,
        skip: impl Fn(IpAddr) -> bool,
    ) -> Option<(IpAddr, &str)> {
        self.node_addresses
            .iter()
            .filter(|(ip, _)| {
                ip.is_ipv4() == first.is_ipv4() && first <= **ip && **ip <= last && !skip(**ip)
            })
            .min_by_key(|(ip, _)| **ip)
            .and_then(|(ip, names)| names.first().map(|name| (*ip, name.as_str())))
    }

    /// Records an opted-in ExternalIPPool (only its name and ranges are kept).
    pub fn upsert_antrea_pool(&mut self, pool: &ExternalIPPool) {
        let name = pool.metadata.name.clone().unwrap_or_default();
        let mut slim = ExternalIPPool::new(&name, crate::antrea::ExternalIPPoolSpec::default());
        slim.spec.ip_ranges.clone_from(&pool.spec.ip_ranges);
        self.antrea_pools.insert(name, slim);
    }

    /// Forgets an ExternalIPPool (deleted, or no longer opted in).
    pub fn remove_antrea_pool(&mut self, name: &str) {
        self.antrea_pools.remove(name);
    }

    /// The opted-in ExternalIPPool `name`, with its ranges only.
    pub fn antrea_pool(&self, name: &str) -> Option<&ExternalIPPool> {
        self.antrea_pools.get(name)
    }

    /// An opted-in ExternalIPPool whose ranges hold `ip` (the first by name): a scan of the
    /// pools, for the rare write of an EgressGateway.
    pub fn antrea_pool_containing(&self, ip: IpAddr) -> Option<&str> {
        self.antrea_pools
            .iter()
            .filter(|(_, pool)| pool.contains(ip))
            .map(|(name, _)| name.as_str())
            .min()
    }

    /// The EgressGateways' egress IPs.
    pub fn gateways(&self) -> &GatewayIndex {
        &self.gateways
    }

    /// The EgressGateways' egress IPs, to update from watch events.
    pub fn gateways_mut(&mut self) -> &mut GatewayIndex {
        &mut self.gateways
    }

    /// Records that object `name` is the one the reconciler keeps for EgressGateway `gateway`
    /// (`None`: for none). Call it after [`Self::upsert_object`], which forgets it; an object the
    /// snapshot does not hold is ignored.
    pub fn set_object_gateway(&mut self, name: &str, gateway: Option<&str>) {
        match gateway {
            Some(gateway) if self.objects.contains_key(name) => {
                self.object_gateways
                    .insert(name.to_owned(), gateway.to_owned());
            }
            _ => {
                self.object_gateways.remove(name);
            }
        }
    }

    /// The EgressGateway object `name` is kept for, if it is one of a gateway's.
    pub fn object_gateway(&self, name: &str) -> Option<&str> {
        self.object_gateways.get(name).map(String::as_str)
    }

    /// Records an object with its `spec.node` and `status.node` (either may be empty).
    ///
    /// Objects whose name is no canonical IP are ignored: admission refuses them, so they can
    /// only predate the webhook, and the reconciler never attaches them.
    pub fn upsert_object(&mut self, name: &str, spec_node: &str, status_node: &str) {
        self.remove_object(name);
        let Ok(ip) = codec::decode_name(name) else {
            return;
        };
        let entry = ObjectEntry {
            ip,
            spec_node: spec_node.to_owned(),
            status_node: status_node.to_owned(),
        };
        for node in entry.occupied() {
            self.per_node
                .entry(node.to_owned())
                .or_default()
                .family_mut(ip)
                .insert(name.to_owned());
        }
        self.objects.insert(name.to_owned(), entry);
    }

    /// Forgets an object (see [`Self::remember_deleted`] to keep its IP managed a while).
    pub fn remove_object(&mut self, name: &str) {
        self.object_gateways.remove(name);
        let Some(entry) = self.objects.remove(name) else {
            return;
        };
        for node in entry.occupied() {
            if let Some(objects) = self.per_node.get_mut(node) {
                objects.family_mut(entry.ip).remove(name);
                if objects.is_empty() {
                    self.per_node.remove(node);
                }
            }
        }
    }

    /// Marks `name` as deleted lately: its IP still counts as managed (rule 3) until
    /// [`Self::forget_deleted`], because nodes keep listing a detached IP for minutes.
    pub fn remember_deleted(&mut self, name: &str) {
        self.recently_deleted.insert(name.to_owned());
    }

    /// Ends the grace of a deleted name.
    pub fn forget_deleted(&mut self, name: &str) {
        self.recently_deleted.remove(name);
    }

    /// A ledger page names `name` (attached, or released lately): its IP counts as managed
    /// (rule 3) until as many [`Self::ledger_forget`] calls.
    pub fn ledger_name(&mut self, name: &str) {
        *self.ledger.entry(name.to_owned()).or_default() += 1;
    }

    /// A ledger page no longer names `name`.
    pub fn ledger_forget(&mut self, name: &str) {
        if let Some(count) = self.ledger.get_mut(name) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.ledger.remove(name);
            }
        }
    }

    /// Whether a CloudPrivateIPConfig manages the IP named `name`: an object of that name
    /// exists (wherever it points, nowhere included), was deleted lately, or the reconciler's
    /// ledger shows it attached or released lately.
    pub fn is_managed(&self, name: &str) -> bool {
        self.objects.contains_key(name)
            || self.recently_deleted.contains(name)
            || self.ledger.contains_key(name)
    }

    /// Whether a CloudPrivateIPConfig named `name` exists (deleted ones not included).
    pub fn has_object(&self, name: &str) -> bool {
        self.objects.contains_key(name)
    }

    /// The egress routers' addresses.
    pub fn routers(&self) -> &RouterIndex {
        &self.routers
    }

    /// The egress routers' addresses, to update from watch events.
    pub fn routers_mut(&mut self) -> &mut RouterIndex {
        &mut self.routers
    }

    /// The EgressPublicIP bindings.
    pub fn public_ips(&self) -> &PublicIpIndex {
        &self.public_ips
    }

    /// The EgressPublicIP bindings, to update from watch events.
    pub fn public_ips_mut(&mut self) -> &mut PublicIpIndex {
        &mut self.public_ips
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.get(name)
    }

    /// The node (the first by name, should several claim it) that has `ip` in `status.addresses`.
    pub fn node_with_address(&self, ip: IpAddr) -> Option<&str> {
        self.node_addresses
            .get(&ip)
            .and_then(|names| names.first())
            .map(String::as_str)
    }

    /// The node an object's `spec.node` names, as last recorded; `None` for an unknown object
    /// or an empty `spec.node`.
    pub fn object_node(&self, name: &str) -> Option<&str> {
        self.objects
            .get(name)
            .map(|entry| entry.spec_node.as_str())
            .filter(|node| !node.is_empty())
    }

    /// How many objects occupying `node` (see [`super::capacity::occupies`]) fall in `bucket`, not counting the
    /// object `excluding`: for an admission request, the occupants that come before it.
    pub fn count_occupying(&self, node: &str, bucket: Bucket, excluding: &str) -> usize {
        let Some(objects) = self.per_node.get(node) else {
            return 0;
        };
        let count = |set: &HashSet<String>| set.len() - usize::from(set.contains(excluding));
        match bucket {
            Bucket::Ipv4 => count(&objects.ipv4),
            Bucket::Ipv6 => count(&objects.ipv6),
            Bucket::Ip => count(&objects.ipv4) + count(&objects.ipv6),
        }
    }

    /// Number of nodes known.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Number of objects known (those with a canonical name).
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    fn unindex_addresses(&mut self, name: &str) {
        let Some(old) = self.nodes.get(name) else {
            return;
        };
        for ip in &old.addresses {
            if let Some(names) = self.node_addresses.get_mut(ip) {
                names.remove(name);
                if names.is_empty() {
                    self.node_addresses.remove(ip);
                }
            }
        }
    }
}
