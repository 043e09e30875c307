//! The attachment ledger (SPEC §2.3): where each IP this controller attached may be, as the
//! controller itself recorded it before the cloud call, so that nothing a user can write (an
//! object's annotations, labels or spec) decides which VM a detach acts on.
//!
//! Where it lives: ConfigMaps in the controller's namespace (`CONTROLLER_NAMESPACE`, where the
//! Lease is), labelled [`LABEL`]. OpenShift's network operator grants the upstream controller
//! configmaps get/list/watch/create/update/patch there and nothing else that could hold such a
//! record, so the drop-in needs no extra RBAC; only the controller's ServiceAccount (and cluster
//! admins) may write there.
//!
//! One ConfigMap ("page") per VM, not per node: the lanes batch per VM (`lanes.rs`), so a batch
//! costs one page write before its call and one after a confirmed detach, whatever its size; a
//! detach acts on a VM, and a node name can come back on another VM (a node pool replaced under
//! the same names) where a per-node page would mix two VMs. A page holds at most one
//! interface's IPs (256 on Azure, the largest), far below a ConfigMap's 1 MiB.
//!
//! Page layout: the VM's instance id in the annotation [`INSTANCE_ANNOTATION`] (ids are long and
//! hold characters no name may, such as Azure's resource paths); `data` maps each IP's object
//! name (the canonical encoding, always a valid ConfigMap key) to the node it was attached as.
//! Pages are named `cloudnet-ledger-<n>`. A page whose last IP was released is emptied, not
//! deleted (the operator's grant has no delete), and the next VM that needs a page takes it over,
//! so there are never more pages than VMs holding IPs at once.
//!
//! The leader is the only writer: it loads every page when it starts leading and keeps them in
//! memory. Every write is guarded by the page's resourceVersion, so a late write of a deposed
//! leader fails instead of overwriting; a conflict re-reads that one page and tries again. Writes
//! to one page are serialised. In memory an IP costs one map entry pointing at a placement
//! (VM and node) shared by every IP of the page.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cloudnet_shared::{decode_name, encode_name};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::cloud::{InstanceId, NodeTarget};
use crate::metrics::Metrics;

/// The label every page carries (`kubectl get configmaps -l cloudnet.io/ledger`).
pub const LABEL: &str = "cloudnet.io/ledger";
/// The label's value: the page layout's version.
const LABEL_VALUE: &str = "v1";
/// The annotation naming a page's VM.
pub const INSTANCE_ANNOTATION: &str = "cloudnet.io/ledger-instance";
/// Pages are named this, then a number.
const NAME_PREFIX: &str = "cloudnet-ledger-";
/// Tries of one write whose page keeps changing under it (another writer, a stale view).
const WRITE_ATTEMPTS: usize = 4;

/// Why the ledger could not be read or written.
#[derive(Debug, Error)]
pub enum LedgerError {
    /// The API server refused or failed the request.
    #[error("attachment ledger: {0}")]
    Kube(#[from] kube::Error),
    /// Every try found the page changed by another writer.
    #[error("attachment ledger: page {0} kept changing under this controller's writes")]
    Contended(String),
}

/// Where an IP may be attached: a VM, and the node it was attached as.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Placement {
    /// The VM, as the provider resolved it.
    pub instance: InstanceId,
    /// The node the VM was attached as.
    pub node: Box<str>,
}

/// One VM's page.
#[derive(Debug)]
struct Page {
    name: String,
    version: String,
    /// How many IPs it records.
    entries: usize,
    /// The placements its IPs point at (one per node name the VM was seen as; nearly always one).
    placements: Vec<Arc<Placement>>,
}

/// The in-memory view: plain data, no I/O.
#[derive(Debug, Default)]
struct View {
    by_ip: HashMap<IpAddr, Vec<Arc<Placement>>>,
    pages: HashMap<InstanceId, Page>,
    /// Empty pages (name, resourceVersion), free for the next VM.
    free: Vec<(String, String)>,
    /// The number of the next new page.
    next_index: u64,
}

/// A page write: where it goes and what it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    /// The VM's page.
    Page { name: String, version: String },
    /// A free page, taken over.
    Free { name: String, version: String },
    /// A new page.
    New { name: String },
}

impl View {
    fn placement(&mut self, instance: &InstanceId, node: &str) -> Option<Arc<Placement>> {
        let page = self.pages.get_mut(instance)?;
        if let Some(p) = page.placements.iter().find(|p| &*p.node == node) {
            return Some(Arc::clone(p));
        }
        let placement = Arc::new(Placement {
            instance: instance.clone(),
            node: node.into(),
        });
        page.placements.push(Arc::clone(&placement));
        Some(placement)
    }

    fn holds(&self, ip: IpAddr, instance: &InstanceId, node: Option<&str>) -> bool {
        self.by_ip.get(&ip).is_some_and(|placements| {
            placements
                .iter()
                .any(|p| &p.instance == instance && node.is_none_or(|n| &*p.node == n))
        })
    }

    /// Of `ips`, those not yet recorded on `instance` as `node`.
    fn missing(&self, instance: &InstanceId, node: &str, ips: &[IpAddr]) -> Vec<IpAddr> {
        ips.iter()
            .copied()
            .filter(|ip| !self.holds(*ip, instance, Some(node)))
            .collect()
    }

    /// Of `ips`, those recorded on `instance`.
    fn held(&self, instance: &InstanceId, ips: &[IpAddr]) -> Vec<IpAddr> {
        ips.iter()
            .copied()
            .filter(|ip| self.holds(*ip, instance, None))
            .collect()
    }

    /// Where a write for `instance` goes. A free page or a new name is reserved at once, so
    /// that the first writes of many VMs at the same moment (a burst over new nodes) go to
    /// different pages instead of colliding on one; see [`Self::unreserve`].
    fn target(&mut self, instance: &InstanceId) -> Target {
        if let Some(page) = self.pages.get(instance) {
            return Target::Page {
                name: page.name.clone(),
                version: page.version.clone(),
            };
        }
        if let Some((name, version)) = self.free.pop() {
            return Target::Free { name, version };
        }
        let name = format!("{NAME_PREFIX}{}", self.next_index);
        self.next_index += 1;
        Target::New { name }
    }

    /// Returns a free page reserved by [`Self::target`] whose write failed without telling
    /// anything about the page (a new name is simply not reused).
    fn unreserve(&mut self, target: Target) {
        if let Target::Free { name, version } = target {
            let known = self.free.iter().any(|(n, _)| *n == name)
                || self.pages.values().any(|p| p.name == name);
            if !known {
                self.free.push((name, version));
            }
        }
    }

    /// Drops the page named `name` from the view, whoever it belonged to.
    fn drop_page(&mut self, name: &str) {
        self.free.retain(|(n, _)| n != name);
        let Some(instance) = self
            .pages
            .iter()
            .find(|(_, p)| p.name == name)
            .map(|(i, _)| i.clone())
        else {
            return;
        };
        self.pages.remove(&instance);
        self.by_ip.retain(|_, placements| {
            placements.retain(|p| p.instance != instance);
            !placements.is_empty()
        });
    }

    /// Takes in a page as the API server returned it, replacing what the view held under its
    /// name. Pages of other controllers' making (no number after the prefix) still load.
    fn load(&mut self, cm: &ConfigMap) {
        let name = cm.name_any();
        let version = cm.resource_version().unwrap_or_default();
        if let Some(n) = name
            .strip_prefix(NAME_PREFIX)
            .and_then(|n| n.parse::<u64>().ok())
        {
            self.next_index = self.next_index.max(n + 1);
        }
        self.drop_page(&name);
        let instance = cm.annotations().get(INSTANCE_ANNOTATION).cloned();
        let entries: Vec<(IpAddr, &str)> = cm
            .data
            .iter()
            .flatten()
            .filter_map(|(key, node)| Some((decode_name(key).ok()?, node.as_str())))
            .collect();
        let instance = match instance {
            Some(instance) if !instance.is_empty() && !entries.is_empty() => InstanceId(instance),
            _ => {
                self.free.push((name, version));
                return;
            }
        };
        // A second page for one VM (a deposed leader's doing): its IPs stay known, and the
        // newer page takes the VM's writes.
        self.pages.insert(
            instance.clone(),
            Page {
                name,
                version,
                entries: 0,
                placements: Vec::new(),
            },
        );
        self.add(&instance, entries);
    }

    fn add<'a>(
        &mut self,
        instance: &InstanceId,
        entries: impl IntoIterator<Item = (IpAddr, &'a str)>,
    ) {
        for (ip, node) in entries {
            if self.holds(ip, instance, Some(node)) {
                continue;
            }
            let Some(placement) = self.placement(instance, node) else {
                return;
            };
            self.by_ip.entry(ip).or_default().push(placement);
            if let Some(page) = self.pages.get_mut(instance) {
                page.entries += 1;
            }
        }
    }

    fn remove(&mut self, instance: &InstanceId, ips: &[IpAddr]) {
        for ip in ips {
            let Some(placements) = self.by_ip.get_mut(ip) else {
                continue;
            };
            let before = placements.len();
            placements.retain(|p| &p.instance != instance);
            let removed = before - placements.len();
            if placements.is_empty() {
                self.by_ip.remove(ip);
            }
            if let Some(page) = self.pages.get_mut(instance) {
                page.entries = page.entries.saturating_sub(removed);
            }
        }
    }

    /// Records a successful write of `target` (now at `version`) for `instance`.
    fn commit(
        &mut self,
        instance: &InstanceId,
        node: &str,
        target: Target,
        version: String,
        add: &[IpAddr],
        remove: &[IpAddr],
    ) {
        let name = match target {
            Target::Page { name, .. } | Target::New { name } => name,
            Target::Free { name, .. } => {
                self.free.retain(|(n, _)| *n != name);
                name
            }
        };
        if let Some(n) = name
            .strip_prefix(NAME_PREFIX)
            .and_then(|n| n.parse::<u64>().ok())
        {
            self.next_index = self.next_index.max(n + 1);
        }
        let page = self.pages.entry(instance.clone()).or_insert_with(|| Page {
            name: name.clone(),
            version: String::new(),
            entries: 0,
            placements: Vec::new(),
        });
        page.version = version;
        self.add(instance, add.iter().map(|ip| (*ip, node)));
        self.remove(instance, remove);
        if self.pages.get(instance).is_some_and(|p| p.entries == 0)
            && let Some(page) = self.pages.remove(instance)
        {
            self.free.push((page.name, page.version));
        }
    }
}

/// The ledger: the in-memory view of every page, and the writes that keep the pages ahead of
/// the cloud.
pub struct Ledger {
    /// `None`: kept in memory only (the lanes' unit tests and the in-process benchmarks).
    api: Option<Api<ConfigMap>>,
    view: Mutex<View>,
    /// Serialises the writes to each VM's page.
    locks: Mutex<HashMap<InstanceId, Arc<tokio::sync::Mutex<()>>>>,
    metrics: Arc<Metrics>,
}

impl Ledger {
    /// Loads every page in `api`'s namespace.
    pub async fn load(api: Api<ConfigMap>, metrics: Arc<Metrics>) -> Result<Self, LedgerError> {
        let pages = api
            .list(&ListParams::default().labels(&format!("{LABEL}={LABEL_VALUE}")))
            .await?;
        let mut view = View::default();
        for page in &pages.items {
            view.load(page);
        }
        tracing::info!(
            pages = pages.items.len(),
            ips = view.by_ip.len(),
            "attachment ledger loaded"
        );
        Ok(Self::with(Some(api), view, metrics))
    }

    /// A ledger kept in memory only, starting empty.
    pub fn in_memory(metrics: Arc<Metrics>) -> Self {
        Self::with(None, View::default(), metrics)
    }

    fn with(api: Option<Api<ConfigMap>>, view: View, metrics: Arc<Metrics>) -> Self {
        Self {
            api,
            view: Mutex::new(view),
            locks: Mutex::default(),
            metrics,
        }
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The VM the ledger records `ip` on as `node`, if any.
    pub fn instance(&self, ip: IpAddr, node: &str) -> Option<InstanceId> {
        let view = self.view();
        let placements = view.by_ip.get(&ip)?;
        placements
            .iter()
            .find(|p| &*p.node == node)
            .map(|p| p.instance.clone())
    }

    /// Every entry: each IP with one place it may be attached.
    pub fn entries(&self) -> Vec<(IpAddr, Arc<Placement>)> {
        let view = self.view();
        view.by_ip
            .iter()
            .flat_map(|(ip, placements)| placements.iter().map(|p| (*ip, Arc::clone(p))))
            .collect()
    }

    /// How many IPs the ledger records (an IP recorded on two VMs counts once).
    pub fn len(&self) -> usize {
        self.view().by_ip.len()
    }

    /// Whether the ledger records nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records `ips` on `target`'s VM as its node, before the call that attaches them: one page
    /// write for all of them, none when they are all recorded already.
    pub async fn record(&self, target: &NodeTarget, ips: &[IpAddr]) -> Result<(), LedgerError> {
        let (instance, node) = (&target.instance, target.node_name.as_str());
        if self.view().missing(instance, node, ips).is_empty() {
            return Ok(());
        }
        let lock = self.lock_of(instance);
        let _turn = lock.lock().await;
        self.write(instance, node, |view| {
            (view.missing(instance, node, ips), Vec::new())
        })
        .await
    }

    /// Removes `ips` from `instance`'s page, after a confirmed detach: one page write, none when
    /// none of them is recorded there.
    pub async fn release(&self, instance: &InstanceId, ips: &[IpAddr]) -> Result<(), LedgerError> {
        if self.view().held(instance, ips).is_empty() {
            return Ok(());
        }
        let lock = self.lock_of(instance);
        let _turn = lock.lock().await;
        self.write(instance, "", |view| (Vec::new(), view.held(instance, ips)))
            .await
    }

    fn lock_of(&self, instance: &InstanceId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.entry(instance.clone()).or_default())
    }

    /// Writes the change `change` computes from the current view (additions, removals) to
    /// `instance`'s page, re-reading the page after a conflict.
    async fn write(
        &self,
        instance: &InstanceId,
        node: &str,
        change: impl Fn(&View) -> (Vec<IpAddr>, Vec<IpAddr>),
    ) -> Result<(), LedgerError> {
        let mut contended = String::new();
        for _ in 0..WRITE_ATTEMPTS {
            let (add, remove, target) = {
                let mut view = self.view();
                let (add, remove) = change(&view);
                if add.is_empty() && remove.is_empty() {
                    return Ok(());
                }
                let target = view.target(instance);
                (add, remove, target)
            };
            let Some(api) = &self.api else {
                self.view()
                    .commit(instance, node, target, String::new(), &add, &remove);
                return Ok(());
            };
            let data = page_data(node, &add, &remove);
            self.metrics.ledger_writes.inc();
            let written = match &target {
                Target::Page { name, version } | Target::Free { name, version } => {
                    let patch = json!({
                        "metadata": {
                            "resourceVersion": version,
                            "annotations": { INSTANCE_ANNOTATION: instance.0 },
                        },
                        "data": data,
                    });
                    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                }
                Target::New { name } => {
                    api.create(&PostParams::default(), &new_page(name, instance, data))
                        .await
                }
            };
            let name = match &target {
                Target::Page { name, .. } | Target::Free { name, .. } | Target::New { name } => {
                    name.clone()
                }
            };
            match written {
                Ok(page) => {
                    let version = page.resource_version().unwrap_or_default();
                    self.view()
                        .commit(instance, node, target, version, &add, &remove);
                    return Ok(());
                }
                // Changed, taken or created by another writer: read it again and retry.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tracing::debug!(page = %name, "ledger page changed under a write; reading it again");
                    match api.get_opt(&name).await? {
                        Some(page) => self.view().load(&page),
                        None => self.view().drop_page(&name),
                    }
                    contended = name;
                }
                // Deleted by hand: what it recorded is no longer durable, so the view forgets it
                // too (adoption records the assigned objects' IPs again); the next try writes a
                // new page.
                Err(kube::Error::Api(s))
                    if s.code == 404 && !matches!(target, Target::New { .. }) =>
                {
                    tracing::warn!(page = %name, "ledger page deleted by someone else; writing a new one");
                    self.view().drop_page(&name);
                    contended = name;
                }
                Err(e) => {
                    self.view().unreserve(target);
                    return Err(e.into());
                }
            }
        }
        Err(LedgerError::Contended(contended))
    }
}

/// The `data` of a page write: `node` for each IP added, `null` (a merge patch's removal) for
/// each IP removed.
fn page_data(node: &str, add: &[IpAddr], remove: &[IpAddr]) -> Map<String, Value> {
    let mut data = Map::new();
    for (ips, value) in [(add, Value::from(node)), (remove, Value::Null)] {
        for ip in ips {
            if let Ok(key) = encode_name(*ip) {
                data.insert(key, value.clone());
            }
        }
    }
    data
}

fn new_page(name: &str, instance: &InstanceId, data: Map<String, Value>) -> ConfigMap {
    let data: BTreeMap<String, String> = data
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_str()?.to_owned())))
        .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(LABEL.to_owned(), LABEL_VALUE.to_owned())])),
            annotations: Some(BTreeMap::from([(
                INSTANCE_ANNOTATION.to_owned(),
                instance.0.clone(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn vm(id: &str) -> InstanceId {
        InstanceId(id.to_owned())
    }

    fn page(name: &str, instance: Option<&str>, entries: &[(&str, &str)]) -> ConfigMap {
        let mut cm = new_page(name, &vm(instance.unwrap_or_default()), Map::new());
        if instance.is_none() {
            cm.metadata.annotations = None;
        }
        cm.metadata.resource_version = Some("7".into());
        cm.data = Some(
            entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        cm
    }

    fn target(node: &str, instance: &str) -> NodeTarget {
        NodeTarget {
            node_name: node.into(),
            provider_id: String::new(),
            instance: vm(instance),
        }
    }

    #[test]
    fn pages_load_into_ips_free_pages_and_the_next_name() {
        let mut view = View::default();
        view.load(&page(
            "cloudnet-ledger-3",
            Some("i-1"),
            &[("10.0.0.5", "a"), ("10.0.0.6", "a")],
        ));
        view.load(&page("cloudnet-ledger-1", Some("i-2"), &[]));
        view.load(&page("cloudnet-ledger-x", None, &[("10.0.0.7", "b")]));
        view.load(&page(
            "cloudnet-ledger-4",
            Some("i-3"),
            &[("not-an-ip", "c")],
        ));
        assert_eq!(view.by_ip.len(), 2);
        assert!(view.holds(ip("10.0.0.5"), &vm("i-1"), Some("a")));
        assert!(!view.holds(ip("10.0.0.5"), &vm("i-1"), Some("b")));
        // The two IPs of one page share one placement.
        let (a, b) = (
            &view.by_ip[&ip("10.0.0.5")][0],
            &view.by_ip[&ip("10.0.0.6")][0],
        );
        assert!(Arc::ptr_eq(a, b));
        let mut free: Vec<&str> = view.free.iter().map(|(n, _)| n.as_str()).collect();
        free.sort_unstable();
        assert_eq!(
            free,
            [
                "cloudnet-ledger-1",
                "cloudnet-ledger-4",
                "cloudnet-ledger-x"
            ]
        );
        assert_eq!(view.next_index, 5);
    }

    #[test]
    fn writes_go_to_the_vms_page_else_a_free_one_else_a_new_one() {
        let mut view = View::default();
        let new = view.target(&vm("i-1"));
        assert_eq!(
            new,
            Target::New {
                name: "cloudnet-ledger-0".into()
            }
        );
        let add = [ip("10.0.0.5")];
        view.commit(&vm("i-1"), "a", new, "1".into(), &add, &[]);
        assert_eq!(
            view.target(&vm("i-1")),
            Target::Page {
                name: "cloudnet-ledger-0".into(),
                version: "1".into()
            }
        );
        // Two VMs' first writes at once reserve two names, not one.
        let (second, third) = (view.target(&vm("i-2")), view.target(&vm("i-3")));
        assert_eq!(
            (second, third),
            (
                Target::New {
                    name: "cloudnet-ledger-1".into()
                },
                Target::New {
                    name: "cloudnet-ledger-2".into()
                }
            )
        );
        // The last IP released: the page is free, and the next VM takes it over.
        let page = view.target(&vm("i-1"));
        view.commit(&vm("i-1"), "", page, "2".into(), &[], &add);
        assert!(view.by_ip.is_empty());
        let free = view.target(&vm("i-2"));
        assert_eq!(
            free,
            Target::Free {
                name: "cloudnet-ledger-0".into(),
                version: "2".into()
            }
        );
        assert!(view.free.is_empty(), "reserved for i-2");
        assert!(matches!(view.target(&vm("i-3")), Target::New { .. }));
        // A write that failed gives the page back; one that succeeded keeps it.
        view.unreserve(free.clone());
        assert_eq!(view.free.len(), 1);
        let free = view.target(&vm("i-2"));
        view.commit(&vm("i-2"), "b", free, "3".into(), &[ip("10.0.0.9")], &[]);
        assert!(view.free.is_empty());
        assert!(view.holds(ip("10.0.0.9"), &vm("i-2"), Some("b")));
    }

    #[test]
    fn an_ip_may_be_recorded_on_two_vms_and_each_release_removes_its_own() {
        let mut view = View::default();
        for (instance, node) in [("i-1", "a"), ("i-2", "b")] {
            let t = view.target(&vm(instance));
            view.commit(&vm(instance), node, t, "1".into(), &[ip("10.0.0.5")], &[]);
        }
        assert_eq!(view.by_ip[&ip("10.0.0.5")].len(), 2);
        assert_eq!(
            view.held(&vm("i-1"), &[ip("10.0.0.5"), ip("10.0.0.6")]),
            [ip("10.0.0.5")]
        );
        let t = view.target(&vm("i-1"));
        view.commit(&vm("i-1"), "", t, "2".into(), &[], &[ip("10.0.0.5")]);
        assert!(view.holds(ip("10.0.0.5"), &vm("i-2"), Some("b")));
        assert!(!view.holds(ip("10.0.0.5"), &vm("i-1"), None));
    }

    #[test]
    fn a_page_write_sets_additions_and_removes_with_null() {
        let data = page_data("a", &[ip("10.0.0.5")], &[ip("fd00::1")]);
        assert_eq!(
            Value::Object(data),
            json!({
                "10.0.0.5": "a",
                "fd00.0000.0000.0000.0000.0000.0000.0001": null,
            })
        );
    }

    #[tokio::test]
    async fn an_in_memory_ledger_records_and_releases() {
        let ledger = Ledger::in_memory(Arc::default());
        let t = target("a", "i-1");
        ledger
            .record(&t, &[ip("10.0.0.5"), ip("10.0.0.6")])
            .await
            .unwrap();
        assert_eq!(ledger.instance(ip("10.0.0.5"), "a"), Some(vm("i-1")));
        assert_eq!(ledger.instance(ip("10.0.0.5"), "b"), None);
        ledger.release(&vm("i-1"), &[ip("10.0.0.5")]).await.unwrap();
        assert_eq!(ledger.instance(ip("10.0.0.5"), "a"), None);
        assert_eq!(ledger.len(), 1);
    }
}
