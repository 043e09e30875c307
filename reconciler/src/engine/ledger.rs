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
//! memory. Every write passes the leadership fence ([`Fence`]) and is guarded by the page's
//! resourceVersion, so a late write of a deposed leader fails instead of overwriting; a conflict
//! re-reads that one page and tries again only while the fence is still open (a deposed leader
//! stops). Writes to one page are serialised. In memory an IP costs one map entry pointing at a
//! placement (VM and node) shared by every IP of the page.
//!
//! Exact under loss: a write whose answer was lost (a timeout, a reset connection) may have
//! landed, so a page it created or took over stays reserved for that VM and the next write goes
//! to the same page (a conflict then shows it). Two pages naming one VM (a lost answer of an
//! earlier version, a hand edit) are merged into one when loaded or re-read: the second page's
//! entries and records are written to the first, then the second is emptied and free. A page
//! taken over starts empty: the previous VM's keys are removed in the same write. Released
//! records are capped per page ([`RELEASED_CAP`], oldest dropped first and counted in
//! `cloudnet_ledger_released_dropped_total`), so a page never nears the 256 KiB annotation
//! limit.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cloudnet_shared::ledger::{
    LABEL_VALUE, RECENT_RELEASE_WINDOW, RELEASED_ANNOTATION, format_released, parse_released,
};
use cloudnet_shared::{decode_name, encode_name};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::cloud::{InstanceId, NodeTarget};
use crate::engine::fence::Fence;
use crate::metrics::Metrics;

pub use cloudnet_shared::ledger::{INSTANCE_ANNOTATION, LABEL};
/// Pages are named this, then a number.
const NAME_PREFIX: &str = "cloudnet-ledger-";
/// Tries of one write whose page keeps changing under it (another writer, a stale view).
const WRITE_ATTEMPTS: usize = 4;
/// Most released records one page keeps; past it the oldest are dropped. An IPv6 record costs
/// about 54 bytes of JSON, so 2,048 stay near 110 KiB, well inside the 256 KiB that all of an
/// object's annotations may take (past that every write of the page would be refused).
pub const RELEASED_CAP: usize = 2048;

/// Why the ledger could not be read or written.
#[derive(Debug, Error)]
pub enum LedgerError {
    /// The API server refused or failed the request.
    #[error("attachment ledger: {0}")]
    Kube(#[from] kube::Error),
    /// Every try found the page changed by another writer.
    #[error("attachment ledger: page {0} kept changing under this controller's writes")]
    Contended(String),
    /// The leadership fence is closed: this replica no longer leads, so it writes nothing.
    #[error("attachment ledger: not written, this replica no longer holds the leader lease")]
    Deposed,
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
    /// `data` keys the page holds that are no IP of the view (hand edits): removed when the
    /// page is taken over, so that it starts empty.
    junk: Vec<String>,
}

impl Page {
    fn new(name: String, version: String) -> Self {
        Self {
            name,
            version,
            entries: 0,
            placements: Vec::new(),
            released: BTreeMap::new(),
            junk: Vec::new(),
        }
    }
}

/// A page no VM uses, free for the next one: its name, resourceVersion, and the `data` keys it
/// still holds, which the write taking it over removes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Free {
    name: String,
    version: String,
    stale: Vec<String>,
}

/// A second page naming a VM that already has one, as loaded: merged into the first.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Duplicate {
    name: String,
    version: String,
    /// Its `data` as it stands (every key, with its node).
    data: BTreeMap<String, String>,
    released: BTreeMap<IpAddr, u64>,
}

/// The in-memory view: plain data, no I/O.
#[derive(Debug)]
struct View {
    by_ip: HashMap<IpAddr, Vec<Arc<Placement>>>,
    pages: HashMap<InstanceId, Page>,
    /// Empty pages, free for the next VM.
    free: Vec<Free>,
    /// Second pages of VMs, to merge into their first.
    duplicates: HashMap<InstanceId, Vec<Duplicate>>,
    /// A page a write created or took over for a VM without learning whether it landed (its
    /// answer was lost): the VM's next write goes there again.
    uncertain: HashMap<InstanceId, Target>,
    /// The number of the next new page.
    next_index: u64,
    /// How long a released record lives, in seconds.
    window: u64,
    /// Most released records per page.
    cap: usize,
}

impl Default for View {
    fn default() -> Self {
        Self {
            by_ip: HashMap::new(),
            pages: HashMap::new(),
            free: Vec::new(),
            duplicates: HashMap::new(),
            uncertain: HashMap::new(),
            next_index: 0,
            window: RECENT_RELEASE_WINDOW.as_secs(),
            cap: RELEASED_CAP,
        }
    }
}

/// A page write: where it goes and what it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    /// The VM's page.
    Page { name: String, version: String },
    /// A free page, taken over.
    Free(Free),
    /// A new page.
    New { name: String },
}

impl Target {
    fn name(&self) -> &str {
        match self {
            Self::Page { name, .. } | Self::Free(Free { name, .. }) | Self::New { name } => name,
        }
    }
}

impl View {
    /// Whether a record made at `at` still counts at `now`.
    fn recent(&self, at: u64, now: u64) -> bool {
        now.saturating_sub(at) < self.window
    }

    /// Whether `page` records nothing that still matters at `now`.
    fn unused(&self, page: &Page, now: u64) -> bool {
        page.entries == 0 && !page.released.values().any(|at| self.recent(*at, now))
    }

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
        // The page a write whose answer was lost may have made this VM's: a conflict (it
        // landed) or a success (it did not) tells.
        if let Some(target) = self.uncertain.get(instance) {
            return target.clone();
        }
        if self.free.is_empty() {
            self.reclaim(now);
        }
        if let Some(free) = self.free.pop() {
            return Target::Free(free);
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
            .filter(|(instance, page)| {
                self.unused(page, now) && !self.duplicates.contains_key(*instance)
            })
            .map(|(instance, _)| instance.clone())
            .collect();
        for instance in unused {
            if let Some(page) = self.pages.remove(&instance) {
                self.free.push(Free {
                    name: page.name,
                    version: page.version,
                    stale: page.junk,
                });
            }
        }
    }

    /// The released records `instance`'s page holds after a write at `now` that adds `add` and
    /// removes `remove`: expired records dropped, re-attached IPs dropped, removed IPs added,
    /// then the oldest dropped past the cap; with how many the cap dropped.
    fn released_after(
        &self,
        instance: &InstanceId,
        add: &[IpAddr],
        remove: &[IpAddr],
        now: u64,
    ) -> (BTreeMap<IpAddr, u64>, usize) {
        let mut released: BTreeMap<IpAddr, u64> = self
            .pages
            .get(instance)
            .map(|page| page.released.clone())
            .unwrap_or_default();
        released.retain(|ip, at| self.recent(*at, now) && !add.contains(ip));
        released.extend(remove.iter().map(|ip| (*ip, now)));
        let dropped = cap_released(&mut released, self.cap);
        (released, dropped)
    }

    /// Takes back a page reserved by [`Self::target`] whose write failed. Refused (`certain`),
    /// a free page is free again and a new name is not reused; with no answer, the write may
    /// have landed, so the page stays reserved for `instance`.
    fn unreserve(&mut self, instance: &InstanceId, target: Target, certain: bool) {
        if !certain && !matches!(target, Target::Page { .. }) {
            self.uncertain.insert(instance.clone(), target);
            return;
        }
        self.uncertain.remove(instance);
        if let Target::Free(free) = target {
            let known = self.free.iter().any(|f| f.name == free.name)
                || self.pages.values().any(|p| p.name == free.name);
            if !known {
                self.free.push(free);
            }
        }
    }

    /// Drops the page named `name` from the view, whoever it belonged to. A VM's first page
    /// dropped, its second (if any) takes its place.
    fn drop_page(&mut self, name: &str) {
        if let Some((instance, dups)) = self.take_page(name) {
            for dup in dups {
                self.insert(&instance, dup);
            }
        }
    }

    /// Removes the page named `name` from the view; when it was a VM's first page, returns that
    /// VM with its second pages, taken out too.
    fn take_page(&mut self, name: &str) -> Option<(InstanceId, Vec<Duplicate>)> {
        self.free.retain(|f| f.name != name);
        self.uncertain.retain(|_, t| t.name() != name);
        let mut was_duplicate = false;
        self.duplicates.retain(|_, dups| {
            let before = dups.len();
            dups.retain(|d| d.name != name);
            was_duplicate |= dups.len() != before;
            !dups.is_empty()
        });
        if was_duplicate {
            return None;
        }
        let instance = self
            .pages
            .iter()
            .find(|(_, p)| p.name == name)
            .map(|(i, _)| i.clone())?;
        self.pages.remove(&instance);
        self.by_ip.retain(|_, placements| {
            placements.retain(|p| p.instance != instance);
            !placements.is_empty()
        });
        let dups = self.duplicates.remove(&instance).unwrap_or_default();
        Some((instance, dups))
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
        let displaced = self.take_page(&name);
        self.load_page(cm, name, version, now);
        // A VM's second pages follow its first: still second if it still names the VM.
        if let Some((instance, dups)) = displaced {
            for dup in dups {
                self.insert(&instance, dup);
            }
        }
    }

    fn load_page(&mut self, cm: &ConfigMap, name: String, version: String, now: u64) {
        let instance = cm.annotations().get(INSTANCE_ANNOTATION).cloned();
        let data = cm.data.clone().unwrap_or_default();
        let released: BTreeMap<IpAddr, u64> = cm
            .annotations()
            .get(RELEASED_ANNOTATION)
            .map(|value| parse_released(value))
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, at)| self.recent(*at, now))
            .filter_map(|(key, at)| Some((decode_name(&key).ok()?, at)))
            .collect();
        let holds_ips = data.keys().any(|key| decode_name(key).is_ok());
        let instance = match instance {
            Some(instance) if !instance.is_empty() && (holds_ips || !released.is_empty()) => {
                InstanceId(instance)
            }
            _ => {
                // Whatever keys it still holds go when the next VM takes it over.
                self.free.push(Free {
                    name,
                    version,
                    stale: data.into_keys().collect(),
                });
                return;
            }
        };
        self.uncertain.remove(&instance);
        let page = Duplicate {
            name,
            version,
            data,
            released,
        };
        self.insert(&instance, page);
    }

    /// Makes `page` `instance`'s page, or, when it has one by another name, a second page to
    /// merge into it; either way its IPs are known as the VM's from now on.
    fn insert(&mut self, instance: &InstanceId, page: Duplicate) {
        let entries: Vec<(IpAddr, String)> = page
            .data
            .iter()
            .filter_map(|(key, node)| Some((decode_name(key).ok()?, node.clone())))
            .collect();
        match self.pages.get(instance) {
            Some(first) if first.name != page.name => {
                tracing::warn!(first = %first.name, second = %page.name, %instance, "two ledger pages name one VM; merging the second into the first");
                self.duplicates
                    .entry(instance.clone())
                    .or_default()
                    .push(page);
            }
            _ => {
                let mut first = Page::new(page.name, page.version);
                first.released = page.released;
                first.junk = page
                    .data
                    .into_keys()
                    .filter(|key| decode_name(key).is_err())
                    .collect();
                self.pages.insert(instance.clone(), first);
            }
        }
        self.add(
            instance,
            entries.iter().map(|(ip, node)| (*ip, node.as_str())),
        );
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
            ..
        } = write;
        self.uncertain.remove(instance);
        let taken_over = matches!(target, Target::Free(_));
        let name = match target {
            Target::Page { name, .. } | Target::New { name } => name,
            Target::Free(Free { name, .. }) => {
                self.free.retain(|f| f.name != name);
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
        if taken_over {
            page.junk.clear();
        }
        self.add(instance, add.iter().map(|ip| (*ip, node)));
        self.remove(instance, &remove);
        if self
            .pages
            .get(instance)
            .is_some_and(|p| p.entries == 0 && p.released.is_empty())
            && !self.duplicates.contains_key(instance)
            && let Some(page) = self.pages.remove(instance)
        {
            self.free.push(Free {
                name: page.name,
                version: page.version,
                stale: page.junk,
            });
        }
    }

    /// The IPs released from a VM within the window at `now`, with the VM and the time.
    fn recently_released(&self, now: u64) -> Vec<(IpAddr, InstanceId, u64)> {
        self.pages
            .iter()
            .flat_map(|(instance, page)| {
                page.released
                    .iter()
                    .filter(|(_, at)| self.recent(**at, now))
                    .map(|(ip, at)| (*ip, instance.clone(), *at))
            })
            .collect()
    }
}

/// One page write: where it goes, the IPs it adds and removes, and the released records the
/// page holds after it (with how many the cap dropped).
#[derive(Debug)]
struct Write {
    target: Target,
    add: Vec<IpAddr>,
    remove: Vec<IpAddr>,
    released: BTreeMap<IpAddr, u64>,
    dropped: usize,
}

impl Write {
    /// The released records as the annotation's value (`null` removes the annotation).
    fn released_value(&self) -> Value {
        released_value(&self.released)
    }
}

/// Released records as the annotation's value (`null` removes the annotation).
fn released_value(released: &BTreeMap<IpAddr, u64>) -> Value {
    let records = released
        .iter()
        .filter_map(|(ip, at)| Some((encode_name(*ip).ok()?, *at)))
        .collect();
    format_released(&records).map_or(Value::Null, Value::from)
}

/// Drops the oldest of `released` (by time, then IP) until at most `cap` are left; returns how
/// many it dropped.
fn cap_released(released: &mut BTreeMap<IpAddr, u64>, cap: usize) -> usize {
    let over = released.len().saturating_sub(cap);
    if over == 0 {
        return 0;
    }
    let mut by_age: Vec<(u64, IpAddr)> = released.iter().map(|(ip, at)| (*at, *ip)).collect();
    by_age.sort_unstable();
    for (_, ip) in by_age.into_iter().take(over) {
        released.remove(&ip);
    }
    over
}

/// The wall clock in Unix seconds: released records are read by other processes (the webhook),
/// so they carry a time every reader can compare with its own clock.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How a ledger is kept beyond its API: the leadership fence its writes pass and how long a
/// released record lives.
#[derive(Clone, Debug)]
pub struct LedgerSettings {
    /// Writes run only while it is open; `None`: always (tests, the in-process benchmarks).
    pub fence: Option<Fence>,
    /// How long a released record lives: at least `RECENT_RELEASE_WINDOW`, longer when the
    /// orphan sweep needs it ([`crate::controller::sweep::release_window`]).
    pub release_window: std::time::Duration,
}

impl Default for LedgerSettings {
    fn default() -> Self {
        Self {
            fence: None,
            release_window: RECENT_RELEASE_WINDOW,
        }
    }
}

/// The ledger: the in-memory view of every page, and the writes that keep the pages ahead of
/// the cloud.
pub struct Ledger {
    /// `None`: kept in memory only (the lanes' unit tests and the in-process benchmarks).
    api: Option<Api<ConfigMap>>,
    view: Mutex<View>,
    /// Serialises the writes to each VM's page; a VM's entry lives while a write of it waits
    /// or runs.
    locks: Mutex<HashMap<InstanceId, Arc<tokio::sync::Mutex<()>>>>,
    fence: Option<Fence>,
    metrics: Arc<Metrics>,
}

/// What a page write answered.
type Written = Result<ConfigMap, kube::Error>;

impl Ledger {
    /// Loads every page in `api`'s namespace.
    pub async fn load(api: Api<ConfigMap>, metrics: Arc<Metrics>) -> Result<Self, LedgerError> {
        Self::load_with(api, metrics, LedgerSettings::default()).await
    }

    /// Loads every page in `api`'s namespace and merges any two pages naming one VM.
    pub async fn load_with(
        api: Api<ConfigMap>,
        metrics: Arc<Metrics>,
        settings: LedgerSettings,
    ) -> Result<Self, LedgerError> {
        let pages = api
            .list(&ListParams::default().labels(&format!("{LABEL}={LABEL_VALUE}")))
            .await?;
        let mut view = View {
            window: settings.release_window.as_secs(),
            ..View::default()
        };
        let now = unix_now();
        for page in &pages.items {
            view.load(page, now);
        }
        tracing::info!(
            pages = pages.items.len(),
            ips = view.by_ip.len(),
            duplicates = view.duplicates.values().map(Vec::len).sum::<usize>(),
            "attachment ledger loaded"
        );
        let ledger = Self::with(Some(api), view, metrics, settings.fence);
        let doubled: Vec<InstanceId> = ledger.view().duplicates.keys().cloned().collect();
        for instance in doubled {
            let lock = ledger.lock_of(&instance);
            let turn = lock.lock().await;
            let merged = ledger.merge(&instance).await;
            drop(turn);
            ledger.unlock(&instance, lock);
            // The VM's next write merges again first; both pages' IPs are known meanwhile.
            if let Err(e) = merged {
                tracing::warn!(%instance, error = %e, "merging a second ledger page failed; the VM's next write tries again");
            }
        }
        Ok(ledger)
    }

    /// A ledger kept in memory only, starting empty.
    pub fn in_memory(metrics: Arc<Metrics>) -> Self {
        Self::with(None, View::default(), metrics, None)
    }

    fn with(
        api: Option<Api<ConfigMap>>,
        view: View,
        metrics: Arc<Metrics>,
        fence: Option<Fence>,
    ) -> Self {
        Self {
            api,
            view: Mutex::new(view),
            locks: Mutex::default(),
            fence,
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

    /// The IPs released from a VM within the release window, each with that VM and the Unix
    /// seconds of the release.
    pub(crate) fn recently_released(&self) -> Vec<(IpAddr, InstanceId, u64)> {
        self.view().recently_released(unix_now())
    }

    /// The VMs `ip` was released from within the release window.
    pub(crate) fn released_from(&self, ip: IpAddr) -> Vec<InstanceId> {
        let now = unix_now();
        let view = self.view();
        view.pages
            .iter()
            .filter(|(_, page)| {
                page.released
                    .get(&ip)
                    .is_some_and(|at| view.recent(*at, now))
            })
            .map(|(instance, _)| instance.clone())
            .collect()
    }

    /// How many IPs the ledger records (an IP recorded on two VMs counts once).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.view().by_ip.len()
    }

    /// How many VMs have a write waiting or running.
    #[cfg(test)]
    pub(crate) fn locked(&self) -> usize {
        self.locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Records `ips` on `target`'s VM as its node, before the call that attaches them: one page
    /// write for all of them, none when they are all recorded already.
    pub async fn record(&self, target: &NodeTarget, ips: &[IpAddr]) -> Result<(), LedgerError> {
        let (instance, node) = (&target.instance, target.node_name.as_str());
        if self.view().missing(instance, node, ips).is_empty() {
            return Ok(());
        }
        self.locked_write(instance, node, true, |view| {
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
        self.locked_write(instance, "", true, |view| {
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
        self.locked_write(instance, "", false, |view| {
            (Vec::new(), view.held(instance, ips))
        })
        .await
    }

    /// [`Self::write`] in `instance`'s turn, after merging any second page of it; `released` as
    /// there.
    async fn locked_write(
        &self,
        instance: &InstanceId,
        node: &str,
        released: bool,
        change: impl Fn(&View) -> (Vec<IpAddr>, Vec<IpAddr>),
    ) -> Result<(), LedgerError> {
        let lock = self.lock_of(instance);
        let turn = lock.lock().await;
        let mut written = self.merge(instance).await;
        if written.is_ok() {
            written = self.write(instance, node, released, change).await;
        }
        drop(turn);
        self.unlock(instance, lock);
        written
    }

    fn lock_of(&self, instance: &InstanceId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.entry(instance.clone()).or_default())
    }

    /// Frees `instance`'s lock once no other write holds or waits for it, so that VMs long gone
    /// leave nothing behind.
    fn unlock(&self, instance: &InstanceId, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        // Ours and the map's: nobody else has it.
        if Arc::strong_count(&lock) <= 2 {
            locks.remove(instance);
        }
    }

    /// Runs one request to the API server if this replica still leads; a request on the wire
    /// when the fence closes is abandoned (its page's resourceVersion keeps it from landing
    /// over a newer leader's write).
    async fn fenced<T>(
        &self,
        request: impl std::future::Future<Output = T>,
    ) -> Result<T, LedgerError> {
        match &self.fence {
            Some(fence) => fence.guard(request).await.map_err(|_| LedgerError::Deposed),
            None => Ok(request.await),
        }
    }

    /// Merges every second page of `instance` into its first: their entries and records are
    /// written to the first, then the second is emptied, free for another VM.
    async fn merge(&self, instance: &InstanceId) -> Result<(), LedgerError> {
        let Some(api) = &self.api else {
            return Ok(());
        };
        loop {
            let (first, dup) = {
                let mut view = self.view();
                let Some(dup) = view.duplicates.get_mut(instance).and_then(Vec::pop) else {
                    view.duplicates.remove(instance);
                    return Ok(());
                };
                if view.duplicates.get(instance).is_some_and(Vec::is_empty) {
                    view.duplicates.remove(instance);
                }
                if !view.pages.contains_key(instance) {
                    // Its first page went meanwhile: the second is the first now.
                    view.insert(instance, dup);
                    continue;
                }
                let page = &view.pages[instance];
                let mut released = page.released.clone();
                released.extend(dup.released.iter().map(|(ip, at)| (*ip, *at)));
                let now = unix_now();
                released.retain(|_, at| view.recent(*at, now));
                let dropped = cap_released(&mut released, view.cap);
                let first = (page.name.clone(), page.version.clone(), released);
                drop(view);
                self.count_dropped(dropped);
                (first, dup)
            };
            let (name, version, released) = first;
            let data: Map<String, Value> = dup
                .data
                .iter()
                .filter(|(key, _)| decode_name(key).is_ok())
                .map(|(key, node)| (key.clone(), Value::from(node.as_str())))
                .collect();
            let patch = json!({
                "metadata": {
                    "resourceVersion": version,
                    "annotations": {
                        INSTANCE_ANNOTATION: instance.0,
                        RELEASED_ANNOTATION: released_value(&released),
                    },
                },
                "data": data,
            });
            self.metrics.ledger_writes.inc();
            let written = self
                .fenced(api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)))
                .await;
            let merged = self.after_merge_write(&name, written).await;
            if let Err(e) = merged {
                self.view()
                    .duplicates
                    .entry(instance.clone())
                    .or_default()
                    .push(dup);
                return Err(e);
            }
            let emptied: Map<String, Value> = dup
                .data
                .keys()
                .map(|key| (key.clone(), Value::Null))
                .collect();
            let patch = json!({
                "metadata": {
                    "resourceVersion": dup.version,
                    "annotations": { INSTANCE_ANNOTATION: null, RELEASED_ANNOTATION: null },
                },
                "data": emptied,
            });
            self.metrics.ledger_writes.inc();
            let written = self
                .fenced(api.patch(&dup.name, &PatchParams::default(), &Patch::Merge(&patch)))
                .await?;
            match written {
                Ok(page) => {
                    tracing::info!(first = %name, second = %dup.name, %instance, "merged a second ledger page of one VM into its first; the second is free");
                    self.view().free.push(Free {
                        name: dup.name,
                        version: page.resource_version().unwrap_or_default(),
                        stale: Vec::new(),
                    });
                }
                // Changed meanwhile: read it again, and merge what it holds now next time.
                Err(e) => {
                    self.reread(api, &dup.name).await?;
                    return Err(e.into());
                }
            }
        }
    }

    /// Takes in the answer to the write that merged a second page into the first page `name`.
    async fn after_merge_write(
        &self,
        name: &str,
        written: Result<Written, LedgerError>,
    ) -> Result<(), LedgerError> {
        let Some(api) = &self.api else {
            return Ok(());
        };
        match written? {
            Ok(page) => {
                self.view().load(&page, unix_now());
                Ok(())
            }
            Err(e) => {
                self.reread(api, name).await?;
                Err(e.into())
            }
        }
    }

    /// Reads page `name` again into the view (gone: dropped from it).
    async fn reread(&self, api: &Api<ConfigMap>, name: &str) -> Result<(), LedgerError> {
        match self.fenced(api.get_opt(name)).await?? {
            Some(page) => self.view().load(&page, unix_now()),
            None => self.view().drop_page(name),
        }
        Ok(())
    }

    /// Writes the change `change` computes from the current view (additions, removals) to
    /// `instance`'s page, re-reading the page after a conflict while this replica leads; the
    /// removals leave released records when `released` says so.
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
                let gone: &[IpAddr] = if released { &remove } else { &[] };
                let (released, dropped) = view.released_after(instance, &add, gone, now);
                let target = view.target(instance, now);
                Write {
                    target,
                    add,
                    remove,
                    released,
                    dropped,
                }
            };
            if self.fence.as_ref().is_some_and(|f| !f.is_open()) {
                return Err(LedgerError::Deposed);
            }
            let Some(api) = &self.api else {
                self.count_dropped(write.dropped);
                self.view().commit(instance, node, write, String::new());
                return Ok(());
            };
            let stale: &[String] = match &write.target {
                Target::Free(free) => &free.stale,
                _ => &[],
            };
            let data = page_data(node, &write.add, &write.remove, stale);
            self.metrics.ledger_writes.inc();
            let request = async {
                match &write.target {
                    Target::Page { name, version } | Target::Free(Free { name, version, .. }) => {
                        // The released records are written whole: a taken-over page's stale
                        // ones go, and expired ones are dropped here.
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
                }
            };
            let written = match self.fenced(request).await {
                Ok(written) => written,
                Err(deposed) => {
                    // Abandoned on the wire: it may still land.
                    self.view().unreserve(instance, write.target, false);
                    return Err(deposed);
                }
            };
            let name = write.target.name().to_owned();
            match written {
                Ok(page) => {
                    let version = page.resource_version().unwrap_or_default();
                    self.count_dropped(write.dropped);
                    self.view().commit(instance, node, write, version);
                    return Ok(());
                }
                // Changed, taken or created by another writer, or by a write of ours whose
                // answer was lost: read it again and retry, unless this replica no longer leads
                // (the other writer may be the next leader).
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tracing::debug!(page = %name, "ledger page changed under a write; reading it again");
                    self.view().uncertain.remove(instance);
                    self.reread(api, &name).await?;
                    self.merge(instance).await?;
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
                    // A refusal is certain; anything else (a timeout, a reset connection, a
                    // server error) may have landed.
                    let certain = matches!(&e, kube::Error::Api(s) if s.code < 500);
                    self.view().unreserve(instance, write.target, certain);
                    return Err(e.into());
                }
            }
        }
        Err(LedgerError::Contended(contended))
    }

    fn count_dropped(&self, dropped: usize) {
        if dropped > 0 {
            tracing::warn!(
                dropped,
                cap = RELEASED_CAP,
                "ledger page at its cap of released records; dropped the oldest"
            );
            self.metrics.ledger_released_dropped.inc_by(dropped as u64);
        }
    }
}

/// The `data` of a page write: `null` (a merge patch's removal) for each `stale` key (a page
/// taken over) and each IP removed, `node` for each IP added.
fn page_data(
    node: &str,
    add: &[IpAddr],
    remove: &[IpAddr],
    stale: &[String],
) -> Map<String, Value> {
    let mut data: Map<String, Value> = stale.iter().map(|k| (k.clone(), Value::Null)).collect();
    for (ips, value) in [(remove, Value::Null), (add, Value::from(node))] {
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
