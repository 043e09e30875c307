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
//! One ConfigMap ("page") per VM, not per node: the lanes batch per VM ([`super::lanes`]), so a batch
//! costs one page write before its call and one after a confirmed detach, whatever its size; a
//! detach acts on a VM, and a node name can come back on another VM (a node pool replaced under
//! the same names) where a per-node page would mix two VMs. A page holds at most one
//! interface's IPs (256 on Azure, the largest), far below a ConfigMap's 1 MiB.
//!
//! Page layout: the VM's instance id in the annotation [`INSTANCE_ANNOTATION`] (ids are long and
//! hold characters no name may, such as Azure's resource paths); `data` maps each IP's object
//! name (the canonical encoding, always a valid ConfigMap key) to the node it was attached as.
//! Pages are named `cloudnet-ledger-<n>`.
//!
//! Released records: the write that removes IPs after a confirmed detach also records them in the
//! page's [`RELEASED_ANNOTATION`] with the time (the format is in `cloudnet_shared::ledger`), so
//! that for `cloudnet_shared::ledger::RECENT_RELEASE_WINDOW` it is known that they were on this VM lately: the webhook
//! reads it (rule 3: a released IP the Node still lists is not the node's own), and so does the
//! orphan sweep (a late attach landing on a VM the IP was just taken from). The record costs no
//! extra write; records older than the window are dropped on the page's next write, and a record
//! of an IP attached again to the same VM is dropped by that attach's write.
//!
//! A page that records no IP and no recent release is free: not deleted (the operator's grant
//! has no delete), but taken over by the next VM that needs a page, whose first write replaces
//! its stale records (readers ignore records older than the window meanwhile). A page holding
//! only recent released records stays its VM's until they expire. So there are never more pages
//! than VMs holding IPs, or released from, within the window.
//!
//! The leader is the only writer: it loads every page when it starts leading and keeps them in
//! memory. Every write is guarded by the page's resourceVersion, so a late write of a deposed
//! leader fails instead of overwriting; a conflict re-reads that one page and tries again. Writes
//! to one page are serialised. In memory an IP costs one map entry pointing at a placement
//! (VM and node) shared by every IP of the page.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cloudnet_shared::ledger::{
    LABEL_VALUE, RELEASED_ANNOTATION, format_released, is_recent, parse_released,
};
use cloudnet_shared::{decode_name, encode_name};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::cloud::{InstanceId, NodeTarget};
use crate::metrics::Metrics;

pub use cloudnet_shared::ledger::{INSTANCE_ANNOTATION, LABEL};
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
pub(crate) struct Placement {
    /// The VM, as the provider resolved it.
    pub(crate) instance: InstanceId,
    /// The node the VM was attached as.
    pub(crate) node: Box<str>,
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
    /// IPs released from the VM lately, with the Unix seconds of each release.
    released: BTreeMap<IpAddr, u64>,
}

impl Page {
    fn new(name: String, version: String) -> Self {
        Self {
            name,
            version,
            entries: 0,
            placements: Vec::new(),
            released: BTreeMap::new(),
        }
    }

    /// Whether the page records nothing that still matters at `now`.
    fn unused(&self, now: u64) -> bool {
        self.entries == 0 && !self.released.values().any(|at| is_recent(*at, now))
    }
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
    fn target(&mut self, instance: &InstanceId, now: u64) -> Target {
        if let Some(page) = self.pages.get(instance) {
            return Target::Page {
                name: page.name.clone(),
                version: page.version.clone(),
            };
        }
        if self.free.is_empty() {
            self.reclaim(now);
        }
        if let Some((name, version)) = self.free.pop() {
            return Target::Free { name, version };
        }
        let name = format!("{NAME_PREFIX}{}", self.next_index);
        self.next_index += 1;
        Target::New { name }
    }

    /// Frees the pages of VMs that hold no IP and whose released records have all expired.
    fn reclaim(&mut self, now: u64) {
        let unused: Vec<InstanceId> = self
            .pages
            .iter()
            .filter(|(_, page)| page.unused(now))
            .map(|(instance, _)| instance.clone())
            .collect();
        for instance in unused {
            if let Some(page) = self.pages.remove(&instance) {
                self.free.push((page.name, page.version));
            }
        }
    }

    /// The released records `instance`'s page holds after a write at `now` that adds `add` and
    /// removes `remove`: expired records dropped, re-attached IPs dropped, removed IPs added.
    fn released_after(
        &self,
        instance: &InstanceId,
        add: &[IpAddr],
        remove: &[IpAddr],
        now: u64,
    ) -> BTreeMap<IpAddr, u64> {
        let mut released: BTreeMap<IpAddr, u64> = self
            .pages
            .get(instance)
            .map(|page| page.released.clone())
            .unwrap_or_default();
        released.retain(|ip, at| is_recent(*at, now) && !add.contains(ip));
        released.extend(remove.iter().map(|ip| (*ip, now)));
        released
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
    fn load(&mut self, cm: &ConfigMap, now: u64) {
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
        let released: BTreeMap<IpAddr, u64> = cm
            .annotations()
            .get(RELEASED_ANNOTATION)
            .map(|value| parse_released(value))
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, at)| is_recent(*at, now))
            .filter_map(|(key, at)| Some((decode_name(&key).ok()?, at)))
            .collect();
        let instance = match instance {
            Some(instance)
                if !instance.is_empty() && (!entries.is_empty() || !released.is_empty()) =>
            {
                InstanceId(instance)
            }
            _ => {
                self.free.push((name, version));
                return;
            }
        };
        // A second page for one VM (a deposed leader's doing): its IPs stay known, and the
        // newer page takes the VM's writes.
        let mut page = Page::new(name, version);
        page.released = released;
        self.pages.insert(instance.clone(), page);
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

    /// Records a successful write of `target` (now at `version`) for `instance`, which left
    /// the page with `released`.
    fn commit(&mut self, instance: &InstanceId, node: &str, write: Write, version: String) {
        let Write {
            target,
            add,
            remove,
            released,
        } = write;
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
        let page = self
            .pages
            .entry(instance.clone())
            .or_insert_with(|| Page::new(name, String::new()));
        page.version = version;
        page.released = released;
        self.add(instance, add.iter().map(|ip| (*ip, node)));
        self.remove(instance, &remove);
        if self
            .pages
            .get(instance)
            .is_some_and(|p| p.entries == 0 && p.released.is_empty())
            && let Some(page) = self.pages.remove(instance)
        {
            self.free.push((page.name, page.version));
        }
    }

    /// The IPs released from a VM within the window at `now`, with the VM and the time.
    fn recently_released(&self, now: u64) -> Vec<(IpAddr, InstanceId, u64)> {
        self.pages
            .iter()
            .flat_map(|(instance, page)| {
                page.released
                    .iter()
                    .filter(|(_, at)| is_recent(**at, now))
                    .map(|(ip, at)| (*ip, instance.clone(), *at))
            })
            .collect()
    }
}

/// One page write: where it goes, the IPs it adds and removes, and the released records the
/// page holds after it.
#[derive(Debug)]
struct Write {
    target: Target,
    add: Vec<IpAddr>,
    remove: Vec<IpAddr>,
    released: BTreeMap<IpAddr, u64>,
}

impl Write {
    /// The released records as the annotation's value (`null` removes the annotation).
    fn released_value(&self) -> Value {
        let records = self
            .released
            .iter()
            .filter_map(|(ip, at)| Some((encode_name(*ip).ok()?, *at)))
            .collect();
        format_released(&records).map_or(Value::Null, Value::from)
    }
}

/// The wall clock in Unix seconds: released records are read by other processes (the webhook),
/// so they carry a time every reader can compare with its own clock.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
        let now = unix_now();
        for page in &pages.items {
            view.load(page, now);
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
    pub(crate) fn instance(&self, ip: IpAddr, node: &str) -> Option<InstanceId> {
        let view = self.view();
        let placements = view.by_ip.get(&ip)?;
        placements
            .iter()
            .find(|p| &*p.node == node)
            .map(|p| p.instance.clone())
    }

    /// Whether the ledger records `ip` on `instance` (as any node).
    pub(crate) fn records(&self, ip: IpAddr, instance: &InstanceId) -> bool {
        self.view().holds(ip, instance, None)
    }

    /// Every entry: each IP with one place it may be attached.
    pub(crate) fn entries(&self) -> Vec<(IpAddr, Arc<Placement>)> {
        let view = self.view();
        view.by_ip
            .iter()
            .flat_map(|(ip, placements)| placements.iter().map(|p| (*ip, Arc::clone(p))))
            .collect()
    }

    /// The IPs released from a VM within `cloudnet_shared::ledger::RECENT_RELEASE_WINDOW`, each with that VM and the
    /// Unix seconds of the release.
    pub(crate) fn recently_released(&self) -> Vec<(IpAddr, InstanceId, u64)> {
        self.view().recently_released(unix_now())
    }

    /// How many IPs the ledger records (an IP recorded on two VMs counts once).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.view().by_ip.len()
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
        self.write(instance, node, true, |view| {
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
        self.write(instance, "", true, |view| {
            (Vec::new(), view.held(instance, ips))
        })
        .await
    }

    /// Removes `ips` from `instance`'s page without a released record: their attach was refused
    /// before any mutating call (the address is foreign, or the node's own), so nothing of this
    /// controller can be on the VM or land there later, and the orphan sweep must not take the
    /// address for a late attach of ours.
    pub async fn unrecord(&self, instance: &InstanceId, ips: &[IpAddr]) -> Result<(), LedgerError> {
        if self.view().held(instance, ips).is_empty() {
            return Ok(());
        }
        let lock = self.lock_of(instance);
        let _turn = lock.lock().await;
        self.write(instance, "", false, |view| {
            (Vec::new(), view.held(instance, ips))
        })
        .await
    }

    fn lock_of(&self, instance: &InstanceId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.entry(instance.clone()).or_default())
    }

    /// Writes the change `change` computes from the current view (additions, removals) to
    /// `instance`'s page, re-reading the page after a conflict; the removals leave released
    /// records when `released` says so.
    async fn write(
        &self,
        instance: &InstanceId,
        node: &str,
        released: bool,
        change: impl Fn(&View) -> (Vec<IpAddr>, Vec<IpAddr>),
    ) -> Result<(), LedgerError> {
        let mut contended = String::new();
        for _ in 0..WRITE_ATTEMPTS {
            let now = unix_now();
            let write = {
                let mut view = self.view();
                let (add, remove) = change(&view);
                if add.is_empty() && remove.is_empty() {
                    return Ok(());
                }
                let released =
                    view.released_after(instance, &add, if released { &remove } else { &[] }, now);
                let target = view.target(instance, now);
                Write {
                    target,
                    add,
                    remove,
                    released,
                }
            };
            let Some(api) = &self.api else {
                self.view().commit(instance, node, write, String::new());
                return Ok(());
            };
            let data = page_data(node, &write.add, &write.remove);
            self.metrics.ledger_writes.inc();
            let written = match &write.target {
                Target::Page { name, version } | Target::Free { name, version } => {
                    // The released records are written whole: a taken-over page's stale ones
                    // go, and expired ones are dropped here.
                    let patch = json!({
                        "metadata": {
                            "resourceVersion": version,
                            "annotations": {
                                INSTANCE_ANNOTATION: instance.0,
                                RELEASED_ANNOTATION: write.released_value(),
                            },
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
            let name = match &write.target {
                Target::Page { name, .. } | Target::Free { name, .. } | Target::New { name } => {
                    name.clone()
                }
            };
            match written {
                Ok(page) => {
                    let version = page.resource_version().unwrap_or_default();
                    self.view().commit(instance, node, write, version);
                    return Ok(());
                }
                // Changed, taken or created by another writer: read it again and retry.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tracing::debug!(page = %name, "ledger page changed under a write; reading it again");
                    match api.get_opt(&name).await? {
                        Some(page) => self.view().load(&page, unix_now()),
                        None => self.view().drop_page(&name),
                    }
                    contended = name;
                }
                // Deleted by hand: what it recorded is no longer durable, so the view forgets it
                // too (adoption records the assigned objects' IPs again); the next try writes a
                // new page.
                Err(kube::Error::Api(s))
                    if s.code == 404 && !matches!(write.target, Target::New { .. }) =>
                {
                    tracing::warn!(page = %name, "ledger page deleted by someone else; writing a new one");
                    self.view().drop_page(&name);
                    contended = name;
                }
                Err(e) => {
                    self.view().unreserve(write.target);
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
mod tests;
