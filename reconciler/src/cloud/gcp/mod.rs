//! The GCP provider: alias IP ranges on a VM's `nic0`, through `google-cloud-compute-v1`.
//!
//! GCE has no "add an alias" call: `instances.updateNetworkInterface` (a PATCH) replaces the
//! NIC's whole `aliasIpRanges` list and must carry the NIC's current fingerprint, which rotates
//! on every change. So one change is one PATCH carrying additions and removals together; a stale
//! fingerprint answers 412, after which the NIC is read again and the list recomputed. The PATCH
//! starts a zone operation; the change is done when `zoneOperations.get` reports it DONE, and its
//! `error` (e.g. `IP_IN_USE_BY_ANOTHER_RESOURCE`) is the change's failure.
//! <https://cloud.google.com/compute/docs/reference/rest/v1/instances/updateNetworkInterface>
//!
//! The NIC's fingerprint and aliases from the last read are kept per VM, so a change made from
//! the engine's cached view costs no read before the PATCH; the read after the operation both
//! confirms the change and fetches the new fingerprint.

pub mod aliases;
pub mod credentials;
pub mod errors;
pub mod provider_id;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes_b64::encode_fingerprint;
use cloudnet_shared::{Capacity, Platform};
use google_cloud_auth::credentials::{CacheableResource, Credentials};
use google_cloud_compute_v1::client::{Instances, Subnetworks};
use google_cloud_compute_v1::model::{
    AliasIpRange, Instance, NetworkInterface, Operation, operation::Status,
};
use ipnet::{Ipv4Net, Ipv6Net};
use thiserror::Error;

use super::driver::{self, Interface, Memo, Retry, SUBNET_TTL, Written};
use super::pace::{Pacing, Rate, Spend, TokenBucket};
use super::{
    Change, CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget, ProviderNeeds,
};
use crate::outbound::{proxy, trust};
use aliases::{Alias, SubnetRanges};
pub use credentials::{CredentialsError, CredentialsFile};
pub use provider_id::{GceInstance, ProviderIdError};

/// The public Compute endpoint; the client appends `/compute/v1/...`.
pub const DEFAULT_ENDPOINT: &str = "https://compute.googleapis.com";

/// The interface upstream manages (GCE names a VM's interfaces `nic0`, `nic1`, ...).
pub const NIC: &str = "nic0";

/// Aliases one NIC can hold, the capacity the annotation starts from.
pub const CAPACITY: i64 = 100;

/// Most IPs one call carries: a NIC's whole alias list.
const MAX_BATCH: usize = 100;

/// Most VMs one list names one by one in its filter: 50 names of GCE's longest (63 characters)
/// make a query of about 5 KB once encoded, well inside what Google's front ends take in a URL,
/// and one page.
const MAX_NAMED: usize = 50;

/// Most VMs the engine gathers into one read. More than [`MAX_NAMED`] VMs of a project are listed
/// by their names' common prefix (OpenShift names every VM of a cluster `<infraID>-...`), so the
/// whole cluster in one batch pages through that prefix once, where batches of a few hundred
/// would each page through the same VMs again.
const MAX_READ_BATCH: usize = 10_000;

/// Items per list page: GCE's maximum.
const PAGE: u32 = 500;

/// The read that answers many VMs of one project, in all its zones, at once.
const LIST_API: &str = "instances.aggregatedList";

/// First wait before polling an operation: a NIC's alias change is often done by then.
const POLL_FIRST: Duration = Duration::from_millis(100);

/// Longest wait between two polls of an operation.
const POLL_MAX: Duration = Duration::from_secs(2);

/// The only mutating API the provider calls.
const WRITE_API: &str = "instances.updateNetworkInterface";

/// GCE's per-project rate quota for `api`: Compute Engine meters API requests per minute and
/// region in classes ("Read requests", "Write requests", "Operation read requests"), 1,500 per
/// minute each by default (<https://cloud.google.com/compute/api-quota>); a burst of a few
/// seconds' worth keeps a fresh start from waiting.
pub fn gce_rate(api: &str) -> Rate {
    let _ = api;
    Rate {
        burst: 50,
        per_second: 25.0,
    }
}

/// How hard the provider retries and how long it waits for an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First backoff after a throttled or transient failure.
    pub min_delay: Duration,
    /// Backoff cap.
    pub max_delay: Duration,
    /// Attempts per call (and PATCHes per change), the first included.
    pub max_attempts: usize,
    /// Bound of one HTTP call.
    pub call_timeout: Duration,
    /// How long a zone operation may take to be DONE.
    pub operation_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_attempts: 8,
            call_timeout: Duration::from_secs(30),
            operation_timeout: Duration::from_secs(120),
        }
    }
}

/// Everything the provider needs.
#[derive(Clone, Debug)]
pub struct GcpSettings {
    /// Compute endpoint (`--platform-api-url`), without the `/compute/v1` path.
    pub endpoint: String,
    /// Retry bounds.
    pub retry: RetryPolicy,
    /// Client-side pace of each API class.
    pub pacing: Pacing,
}

impl GcpSettings {
    /// Settings for `endpoint` (empty: the public one).
    pub fn new(endpoint: &str) -> Self {
        Self {
            endpoint: normalize_endpoint(endpoint),
            retry: RetryPolicy::default(),
            pacing: Pacing::PUBLISHED,
        }
    }
}

/// `--platform-api-url` as the client wants it: no trailing slash, no `/compute/v1` (upstream's
/// Go client takes the URL with that path, the Rust client appends it itself).
pub fn normalize_endpoint(endpoint: &str) -> String {
    let e = endpoint.trim().trim_end_matches('/');
    let e = e.strip_suffix("/compute/v1").unwrap_or(e);
    if e.is_empty() {
        DEFAULT_ENDPOINT.to_owned()
    } else {
        e.to_owned()
    }
}

/// Why the provider could not be set up.
#[derive(Debug, Error)]
pub enum GcpSetupError {
    /// The credentials could not be found or built.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The extra CA bundles are unusable.
    #[error("the cluster's CA bundles")]
    Trust(#[source] crate::outbound::trust::TrustError),
    /// The client library refused its configuration.
    #[error("building the Compute client")]
    Client(#[source] google_cloud_gax::client_builder::Error),
    /// The HTTP client of the one raw request could not be built.
    #[error("building the Compute client")]
    Http(#[source] reqwest::Error),
}

/// NIC `nic0` of a VM as last read: what a PATCH needs besides the change.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Nic {
    fingerprint: Vec<u8>,
    aliases: Vec<Alias>,
    subnetwork: String,
    /// The NIC's own address (`networkIP`).
    network_ip: Option<IpAddr>,
}

/// The GCE cloud.
pub struct GcpProvider {
    instances: Instances,
    subnetworks: Subnetworks,
    raw: RawPatch,
    retry: RetryPolicy,
    /// The driver's part of `retry`.
    steps: Retry,
    pacing: Pacing,
    buckets: Mutex<HashMap<&'static str, Arc<TokenBucket>>>,
    /// Each subnetwork's ranges by URL, for [`SUBNET_TTL`].
    subnets: Memo<SubnetRanges>,
    nics: Mutex<HashMap<InstanceId, Nic>>,
    /// Whether GCE refused the list for want of `compute.instances.list` (OpenShift's
    /// CredentialsRequest grants `compute.instances.get` only): VMs are then read one at a time.
    list_refused: AtomicBool,
}

impl std::fmt::Debug for GcpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcpProvider")
            .field("endpoint", &self.raw.endpoint)
            .finish_non_exhaustive()
    }
}

/// Makes ring the process's rustls provider unless one is already set: google-cloud-auth and
/// reqwest are built without a provider of their own (it would pull aws-lc) and panic on first
/// use without one.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl GcpProvider {
    /// A provider calling `settings.endpoint` with `credentials`. No call is made yet.
    pub async fn new(
        settings: &GcpSettings,
        credentials: Credentials,
    ) -> Result<Self, GcpSetupError> {
        install_crypto_provider();
        // Our own retries and token buckets pace every call; the library's would hide throttling.
        use google_cloud_gax::retry_policy::NeverRetry;
        let instances = Instances::builder()
            .with_endpoint(settings.endpoint.clone())
            .with_credentials(credentials.clone())
            .with_retry_policy(NeverRetry)
            .build()
            .await
            .map_err(GcpSetupError::Client)?;
        let subnetworks = Subnetworks::builder()
            .with_endpoint(settings.endpoint.clone())
            .with_credentials(credentials.clone())
            .with_retry_policy(NeverRetry)
            .build()
            .await
            .map_err(GcpSetupError::Client)?;
        let r = settings.retry;
        Ok(Self {
            instances,
            subnetworks,
            raw: RawPatch::new(
                &settings.endpoint,
                credentials,
                settings.retry.call_timeout,
                &trust::bundle_certificates(
                    &trust::extra_bundles(None).map_err(GcpSetupError::Trust)?,
                )
                .map_err(GcpSetupError::Trust)?,
            )
            .map_err(GcpSetupError::Http)?,
            retry: settings.retry,
            steps: Retry::new(r.min_delay, r.max_delay, r.max_attempts),
            pacing: settings.pacing,
            buckets: Mutex::new(HashMap::new()),
            subnets: Memo::expiring(SUBNET_TTL),
            nics: Mutex::new(HashMap::new()),
            list_refused: AtomicBool::new(false),
        })
    }

    /// A provider with the credentials upstream would find (see [`credentials`]).
    pub async fn from_secret_dir(
        settings: &GcpSettings,
        secret_dir: &std::path::Path,
    ) -> Result<Self, GcpSetupError> {
        // Before the credentials exist: their token cache may start signing at once.
        install_crypto_provider();
        let env = std::env::var_os(credentials::ENV_VAR);
        let file = CredentialsFile::find(secret_dir, env.as_deref())?;
        tracing::info!(path = %file.path.display(), kind = %file.kind, "GCP credentials");
        let credentials = file.build()?;
        Self::new(settings, credentials).await
    }

    fn bucket(&self, api: &'static str) -> Arc<TokenBucket> {
        let rate = self.pacing.rate(api == WRITE_API, gce_rate(api));
        Arc::clone(
            self.buckets
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(api)
                .or_insert_with(|| Arc::new(TokenBucket::new(rate))),
        )
    }

    /// One paced, bounded call; a throttled answer empties the API's bucket.
    async fn call<T, F>(&self, api: &'static str, call: F) -> Result<T, CloudError>
    where
        F: Future<Output = Result<T, CloudError>>,
    {
        let timeout = self.retry.call_timeout;
        let bounded = async move {
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| {
                    Err(CloudError::retryable(format!(
                        "GCE {api}: no answer within {timeout:?}"
                    )))
                })
        };
        driver::paced(&self.bucket(api), bounded).await
    }

    /// A read, retried while throttled or failing transiently.
    async fn read<T, F, Fut>(&self, api: &'static str, mut call: F) -> Result<T, CloudError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, CloudError>>,
    {
        driver::read(&self.steps, api, || self.call(api, call())).await
    }

    /// The VM as GCE reports it now.
    async fn get_instance(&self, vm: &GceInstance) -> Result<Instance, CloudError> {
        self.read("instances.get", || async move {
            self.instances
                .get()
                .set_project(&vm.project)
                .set_zone(&vm.zone)
                .set_instance(&vm.name)
                .send()
                .await
                .map_err(|e| errors::classify("instances.get", &e))
        })
        .await
    }

    /// The VMs of `project` that `filter` selects, by zone and name, every page of one
    /// `instances.aggregatedList`; `Ok(None)` when GCE refused the call for want of permission.
    async fn list_instances(
        &self,
        project: &str,
        filter: Option<&str>,
    ) -> Result<Option<Listed>, CloudError> {
        let mut listed = Listed::default();
        let mut token: Option<String> = None;
        loop {
            let page_token = &token;
            let page = self
                .read(LIST_API, || async move {
                    let answer = self
                        .instances
                        .aggregated_list()
                        .set_project(project)
                        .set_or_clear_filter(filter)
                        .set_max_results(PAGE)
                        .set_or_clear_page_token(page_token.clone())
                        .send()
                        .await;
                    match answer {
                        Ok(page) => Ok(Some(page)),
                        Err(e) if e.http_status_code() == Some(403) => {
                            let error = errors::classify(LIST_API, &e);
                            match error.kind {
                                ErrorKind::Permanent => Ok(None),
                                _ => Err(error),
                            }
                        }
                        Err(e) => Err(errors::classify(LIST_API, &e)),
                    }
                })
                .await?;
            let Some(page) = page else {
                return Ok(None);
            };
            for (scope, scoped) in page.items {
                let Some(zone) = scope.strip_prefix("zones/") else {
                    continue;
                };
                for instance in scoped.instances {
                    if let Some(name) = instance.name.clone() {
                        listed.instances.insert((zone.to_owned(), name), instance);
                    }
                }
            }
            listed.unreachable.extend(
                page.unreachables
                    .iter()
                    .filter_map(|s| s.strip_prefix("zones/"))
                    .map(str::to_owned),
            );
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(next) => token = Some(next),
                None => return Ok(Some(listed)),
            }
        }
    }

    /// `nic0` of the VM now, remembered for the next change; `Ok(None)` when the VM or the NIC
    /// does not exist.
    async fn read_nic(&self, id: &InstanceId, vm: &GceInstance) -> Result<Option<Nic>, CloudError> {
        let instance = match self.get_instance(vm).await {
            Ok(instance) => Some(instance),
            Err(e) if e.kind == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        self.remember(id, instance.as_ref())
    }

    /// `nic0` of `instance` as GCE just answered it (`None`: no such VM), remembered for the
    /// next change; `Ok(None)` when the VM or the NIC does not exist.
    fn remember(
        &self,
        id: &InstanceId,
        instance: Option<&Instance>,
    ) -> Result<Option<Nic>, CloudError> {
        let nic = instance.and_then(nic0).map(nic_of).transpose()?;
        let mut nics = self.nics.lock().unwrap_or_else(PoisonError::into_inner);
        match &nic {
            Some(nic) => nics.insert(id.clone(), nic.clone()),
            None => nics.remove(id),
        };
        Ok(nic)
    }

    fn forget(&self, id: &InstanceId) {
        self.nics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    fn cached_nic(&self, id: &InstanceId) -> Option<Nic> {
        self.nics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// The ranges of the subnetwork `url` names, read at most once per [`SUBNET_TTL`].
    async fn subnet(&self, url: &str) -> Result<(String, SubnetRanges), CloudError> {
        let (project, region, name) = aliases::subnet_parts(url).ok_or_else(|| {
            CloudError::permanent(format!("GCE subnetwork URL {url:?} is not understood"))
        })?;
        let ranges = self
            .subnets
            .get(url, || self.get_subnet(&project, &region, &name))
            .await?;
        Ok((name, ranges))
    }

    /// The ranges of subnetwork `name`, read now.
    async fn get_subnet(
        &self,
        project: &str,
        region: &str,
        name: &str,
    ) -> Result<SubnetRanges, CloudError> {
        let (p, r, n) = (project, region, name);
        let subnet = self
            .read("subnetworks.get", || async move {
                self.subnetworks
                    .get()
                    .set_project(p)
                    .set_region(r)
                    .set_subnetwork(n)
                    .send()
                    .await
                    .map_err(|e| errors::classify("subnetworks.get", &e))
            })
            .await?;
        let parse = |s: &Option<String>| s.as_deref().and_then(|c| c.parse::<Ipv4Net>().ok());
        let ranges = SubnetRanges {
            primary: parse(&subnet.ip_cidr_range),
            secondary: subnet
                .secondary_ip_ranges
                .iter()
                .filter_map(|r| Some((r.range_name.clone()?, parse(&r.ip_cidr_range)?)))
                .collect(),
            // As upstream's getSubnet (pkg/cloudprovider/gcp.go): `ipv6CidrRange`, the range
            // of a dual-stack subnetwork (the annotation clears host bits, as Go's ParseCIDR).
            ipv6: subnet
                .ipv_6_cidr_range
                .as_deref()
                .and_then(|c| c.parse::<Ipv6Net>().ok()),
        };
        Ok(ranges)
    }

    /// The engine's view of a NIC.
    async fn view(&self, nic: &Nic) -> Result<NodeEgress, CloudError> {
        let (_, ranges) = self.subnet(&nic.subnetwork).await?;
        Ok(NodeEgress {
            interface: NIC.to_owned(),
            ipv4_subnet: ranges.primary,
            ipv6_subnet: ranges.ipv6,
            capacity: Capacity {
                ipv4: None,
                ipv6: None,
                ip: Some(CAPACITY),
            },
            // The NIC's own address does not take an alias slot, so only aliases count.
            addresses: nic.aliases.iter().filter_map(Alias::address).collect(),
            // The NIC's own address, and each range wider than /32 (a pod range, say): the
            // node's, never an egress IP; a wide range's network address must not pass for an
            // alias to take over or to detach.
            primary: nic
                .network_ip
                .into_iter()
                .chain(
                    nic.aliases
                        .iter()
                        .filter(|a| a.single().is_none())
                        .filter_map(Alias::address),
                )
                .collect(),
        })
    }

    /// One PATCH of `nic0`'s alias list, then the wait for its operation.
    async fn patch(&self, vm: &GceInstance, nic: &Nic, list: &[Alias]) -> Result<(), CloudError> {
        let operation = if list.is_empty() {
            // The client drops an empty `aliasIpRanges` from the body, and GCE's PATCH reads an
            // absent field as "unchanged": removing the last alias must go out by hand.
            self.call(WRITE_API, self.raw.clear_aliases(vm, &nic.fingerprint))
                .await?
        } else {
            let body = NetworkInterface::new()
                .set_fingerprint(bytes::Bytes::from(nic.fingerprint.clone()))
                .set_alias_ip_ranges(list.iter().map(|a| {
                    AliasIpRange::new()
                        .set_ip_cidr_range(a.cidr.clone())
                        .set_or_clear_subnetwork_range_name(a.range.clone())
                }));
            self.call(WRITE_API, async {
                self.instances
                    .update_network_interface()
                    .set_project(&vm.project)
                    .set_zone(&vm.zone)
                    .set_instance(&vm.name)
                    .set_network_interface(NIC)
                    .set_body(body)
                    .send()
                    .await
                    .map_err(|e| errors::classify(WRITE_API, &e))
            })
            .await?
        };
        self.wait(vm, operation).await
    }

    /// Waits until the zone operation is DONE; its `error` is the change's failure.
    ///
    /// Polls `zoneOperations.get` (the instances service's `getOperation`) with a growing
    /// interval: `zoneOperations.wait` would answer in one call, but needs the crate's
    /// `zone-operations` service compiled too, and a change of a NIC's aliases is done within a
    /// few polls.
    async fn wait(&self, vm: &GceInstance, mut operation: Operation) -> Result<(), CloudError> {
        let deadline = tokio::time::Instant::now() + self.retry.operation_timeout;
        let name = operation.name.clone().unwrap_or_default();
        let mut interval = POLL_FIRST;
        loop {
            if operation.status == Some(Status::Done) {
                return operation_result(&name, &operation);
            }
            if name.is_empty() {
                return Err(CloudError::retryable(
                    "GCE returned an operation without a name",
                ));
            }
            if tokio::time::Instant::now() + interval > deadline {
                return Err(CloudError::retryable(format!(
                    "GCE operation {name} not DONE after {:?}",
                    self.retry.operation_timeout
                )));
            }
            tokio::time::sleep(interval).await;
            interval = (interval * 2).min(POLL_MAX);
            let op_name = &name;
            operation = self
                .read("zoneOperations.get", || async move {
                    self.instances
                        .get_operation()
                        .set_project(&vm.project)
                        .set_zone(&vm.zone)
                        .set_operation(op_name)
                        .send()
                        .await
                        .map_err(|e| errors::classify("zoneOperations.get", &e))
                })
                .await?;
        }
    }
}

/// `nic0` of `instance`: the interface of that name, or the first one when GCE reports no names.
fn nic0(instance: &Instance) -> Option<&NetworkInterface> {
    instance
        .network_interfaces
        .iter()
        .find(|n| n.name.as_deref() == Some(NIC))
        .or_else(|| {
            instance
                .network_interfaces
                .first()
                .filter(|n| n.name.is_none())
        })
}

fn nic_of(nic: &NetworkInterface) -> Result<Nic, CloudError> {
    let subnetwork = nic
        .subnetwork
        .clone()
        .ok_or_else(|| CloudError::permanent("GCE interface nic0 has no subnetwork"))?;
    Ok(Nic {
        network_ip: nic.network_ip.as_deref().and_then(|ip| ip.parse().ok()),
        fingerprint: nic
            .fingerprint
            .as_ref()
            .map(|b| b.to_vec())
            .unwrap_or_default(),
        aliases: nic
            .alias_ip_ranges
            .iter()
            .filter_map(|a| {
                Some(Alias {
                    cidr: a.ip_cidr_range.clone()?,
                    range: a.subnetwork_range_name.clone(),
                })
            })
            .collect(),
        subnetwork,
    })
}

fn operation_result(name: &str, operation: &Operation) -> Result<(), CloudError> {
    let Some(error) = &operation.error else {
        return Ok(());
    };
    let errors: Vec<(String, String)> = error
        .errors
        .iter()
        .map(|e| {
            (
                e.code.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default(),
            )
        })
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    Err(errors::classify_operation(name, &errors))
}

fn vm_of(node: &NodeTarget) -> Result<GceInstance, CloudError> {
    GceInstance::from_key(&node.instance.0).map_err(|e| CloudError::permanent(e.to_string()))
}

/// A VM's `nic0`, for one change: one PATCH of the whole alias list with its fingerprint.
struct Nic0<'a> {
    provider: &'a GcpProvider,
    node: &'a NodeTarget,
    vm: GceInstance,
}

/// The error of a VM, or its `nic0`, that does not exist.
fn vm_not_found(node: &NodeTarget) -> CloudError {
    CloudError::not_found(format!(
        "GCE instance {} (or its {NIC}) not found",
        node.instance
    ))
}

#[async_trait]
impl Interface for Nic0<'_> {
    type State = Nic;

    async fn read(&self, _: Option<&Nic>) -> Result<Nic, CloudError> {
        let nic = self
            .provider
            .read_nic(&self.node.instance, &self.vm)
            .await?;
        nic.ok_or_else(|| vm_not_found(self.node))
    }

    async fn describe(&self, nic: &Nic) -> Result<NodeEgress, CloudError> {
        self.provider.view(nic).await
    }

    async fn write(&self, current: &Nic, change: &Change) -> Result<Written<Nic>, CloudError> {
        let (subnet_name, ranges) = self.provider.subnet(&current.subnetwork).await?;
        let list = aliases::next_list(&current.aliases, change, &subnet_name, &ranges)
            .map_err(|e| CloudError::permanent(e.to_string()))?;
        let Some(list) = list else {
            return Ok(Written::Unchanged);
        };
        // Whatever happens next, the kept fingerprint is spent.
        self.forget();
        self.provider.patch(&self.vm, current, &list).await?;
        let after = self
            .provider
            .read_nic(&self.node.instance, &self.vm)
            .await?;
        let after = after.ok_or_else(|| {
            CloudError::not_found(format!("GCE instance {} vanished", self.node.instance))
        })?;
        Ok(Written::Changed(after))
    }

    fn forget(&self) {
        self.provider.forget(&self.node.instance);
    }
}

#[async_trait]
impl CloudProvider for GcpProvider {
    fn forget_vm(&self, instance: &InstanceId) {
        self.forget(instance);
    }

    fn needs(&self) -> ProviderNeeds {
        ProviderNeeds {
            name: "gcp",
            // The fingerprint makes concurrent PATCHes of one NIC fail each other.
            serialize_per_node: true,
            max_batch: MAX_BATCH,
            native_move: false,
            max_read_batch: MAX_READ_BATCH,
            platform: Some(Platform::Gcp),
            reads_before_adding: false,
        }
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        NodeTarget::from_provider_id(
            node_name,
            provider_id,
            provider_id::parse(provider_id).map(|vm| vm.key()),
        )
    }

    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        let nic = Nic0 {
            provider: self,
            node,
            vm: vm_of(node)?,
        };
        // The engine's view is our last answer; the fingerprint and list kept with it are then
        // still current unless someone else changed the NIC, which the PATCH's 412 tells.
        let remembered = known.and_then(|_| self.cached_nic(&node.instance));
        driver::change(&nic, &node.node_name, &self.steps, change, remembered).await
    }

    async fn write_budget(&self, spend: Spend) {
        self.bucket(WRITE_API).until_available(spend).await;
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        let vm = vm_of(node)?;
        let nic = self.read_nic(&node.instance, &vm).await?;
        self.egress_of(node, nic).await
    }

    /// One `instances.aggregatedList` per project, filtered by the VMs' names (see
    /// [`list_filter`]); a VM the list does not return does not exist. Without the permission
    /// to list, each VM is read on its own.
    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        if self.list_refused.load(Ordering::Relaxed) {
            return super::read_each(self, nodes).await;
        }
        let mut answers = driver::Answers::new(nodes.len());
        // The VMs of each project, by their index in `nodes`.
        let mut projects: BTreeMap<String, Vec<(usize, GceInstance)>> = BTreeMap::new();
        for (i, node) in nodes.iter().enumerate() {
            match vm_of(node) {
                // A name GCE cannot have would spoil the filter for every VM of its project.
                Ok(vm) if !listable(&vm.name) => answers.read_alone(i),
                Ok(vm) => projects
                    .entry(vm.project.clone())
                    .or_default()
                    .push((i, vm)),
                Err(e) => answers.set(i, Err(e)),
            }
        }
        let lists = futures::future::join_all(projects.iter().map(|(project, vms)| {
            let names: Vec<&str> = vms.iter().map(|(_, vm)| vm.name.as_str()).collect();
            let filter = list_filter(&names);
            async move { self.list_instances(project, filter.as_deref()).await }
        }))
        .await;
        for (vms, listed) in projects.values().zip(lists) {
            let listed = match listed {
                Ok(Some(listed)) => listed,
                Ok(None) => {
                    if !self.list_refused.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "GCE refused instances.aggregatedList (compute.instances.list is not \
                             granted): reading VMs one at a time"
                        );
                    }
                    vms.iter().for_each(|(i, _)| answers.read_alone(*i));
                    continue;
                }
                Err(e) => {
                    answers.fail(vms.iter().map(|(i, _)| *i), &e);
                    continue;
                }
            };
            for (i, vm) in vms {
                // A zone the list could not reach tells nothing about its VMs.
                if listed.unreachable.contains(&vm.zone) {
                    answers.read_alone(*i);
                    continue;
                }
                let node = &nodes[*i];
                let instance = listed.instances.get(&(vm.zone.clone(), vm.name.clone()));
                let answer = match self.remember(&node.instance, instance) {
                    Ok(nic) => self.egress_of(node, nic).await,
                    Err(e) => Err(e),
                };
                answers.set(*i, answer);
            }
        }
        answers.finish(self, nodes).await
    }
}

/// What one aggregated list answered: the instances by zone and name, and the zones it could
/// not reach.
#[derive(Default)]
struct Listed {
    instances: HashMap<(String, String), Instance>,
    unreachable: BTreeSet<String>,
}

impl GcpProvider {
    /// The engine's view of `node`'s `nic0` as just read (`None`: the VM or the NIC is gone).
    async fn egress_of(
        &self,
        node: &NodeTarget,
        nic: Option<Nic>,
    ) -> Result<NodeEgress, CloudError> {
        let nic = nic.ok_or_else(|| vm_not_found(node))?;
        self.view(&nic).await
    }
}

/// Whether `name` is a GCE resource name (RFC 1035: a lower-case letter, then up to 62 lower-case
/// letters, digits or dashes, not ending in a dash), which a filter can name as it is.
fn listable(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() <= 63
        && bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes.last().is_some_and(|b| *b != b'-')
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// The `instances.aggregatedList` filter for the VMs named `names` (GCE resource names, see
/// [`listable`]), in the grammar the Compute API documents for its `filter` parameter: up to
/// [`MAX_NAMED`] names as parenthesised `=` terms joined by an explicit `OR`, which select
/// exactly them; more as one `eq` regular expression (RE2, matching the whole name) on their
/// common prefix, which keeps the URL short whatever their number, at the cost of paging through
/// other VMs that share the prefix. No common prefix: no filter, the whole project.
fn list_filter(names: &[&str]) -> Option<String> {
    if names.len() <= MAX_NAMED {
        let terms: Vec<String> = names.iter().map(|n| format!("(name = \"{n}\")")).collect();
        return Some(terms.join(" OR "));
    }
    let first = names.first()?;
    let common = names.iter().fold(first.len(), |len, name| {
        first
            .bytes()
            .zip(name.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count()
    });
    // Names are lower-case letters, digits and dashes: nothing in the prefix is a regex operator.
    (common > 0).then(|| format!("name eq \"{}.*\"", &first[..common]))
}

/// The one request the client cannot express: a PATCH with an explicit empty alias list.
/// Same endpoint, same credentials, same error mapping; nothing else goes this way.
struct RawPatch {
    http: reqwest::Client,
    endpoint: String,
    credentials: Credentials,
}

impl RawPatch {
    /// A client trusting the system roots plus `trusted` (the cluster's trusted CA).
    fn new(
        endpoint: &str,
        credentials: Credentials,
        timeout: Duration,
        trusted: &[rustls::pki_types::CertificateDer<'static>],
    ) -> Result<Self, reqwest::Error> {
        let mut certs = Vec::new();
        for der in trusted {
            certs.push(reqwest::Certificate::from_der(der)?);
        }
        Ok(Self {
            // The compute client's own reqwest reads the proxy variables itself; this one
            // follows the process's rules, as every client built here does.
            http: reqwest::Client::builder()
                .timeout(timeout)
                .proxy(reqwest::Proxy::custom(|url| {
                    proxy::for_url(proxy::rules(), url.as_str())
                }))
                .tls_certs_merge(certs)
                .build()?,
            endpoint: endpoint.to_owned(),
            credentials,
        })
    }

    /// The URL of `updateNetworkInterface` for `vm`'s `nic0`.
    fn url(&self, vm: &GceInstance) -> String {
        format!(
            "{}/compute/v1/projects/{}/zones/{}/instances/{}/updateNetworkInterface?networkInterface={NIC}",
            self.endpoint, vm.project, vm.zone, vm.name
        )
    }

    async fn clear_aliases(
        &self,
        vm: &GceInstance,
        fingerprint: &[u8],
    ) -> Result<Operation, CloudError> {
        let headers = match self.credentials.headers(http::Extensions::new()).await {
            Ok(CacheableResource::New { data, .. }) => data,
            Ok(CacheableResource::NotModified) => http::HeaderMap::new(),
            Err(e) => {
                return Err(CloudError::retryable(format!(
                    "GCE {WRITE_API}: obtaining credentials: {e}"
                )));
            }
        };
        let body = clear_body(fingerprint);
        let answer = self
            .http
            .patch(self.url(vm))
            .headers(headers)
            .json(&body)
            .send()
            .await
            .map_err(|e| CloudError::retryable(format!("GCE {WRITE_API}: {e}")))?;
        let status = answer.status().as_u16();
        let bytes = answer
            .bytes()
            .await
            .map_err(|e| CloudError::retryable(format!("GCE {WRITE_API}: {e}")))?;
        if !(200..300).contains(&status) {
            return Err(errors::classify_http(WRITE_API, status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            CloudError::retryable(format!("GCE {WRITE_API}: unreadable operation: {e}"))
        })
    }
}

/// The body that empties `nic0`'s alias list.
fn clear_body(fingerprint: &[u8]) -> serde_json::Value {
    serde_json::json!({
        "fingerprint": encode_fingerprint(fingerprint),
        "aliasIpRanges": [],
    })
}

mod bytes_b64 {
    use base64::Engine as _;

    /// GCE fingerprints travel as URL-safe base64 with padding (discovery `format: byte`).
    pub fn encode_fingerprint(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE.encode(bytes)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn endpoints_are_normalized() {
        assert_eq!(normalize_endpoint(""), DEFAULT_ENDPOINT);
        assert_eq!(
            normalize_endpoint("http://127.0.0.1:8080/"),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            normalize_endpoint("https://compute.example/compute/v1/"),
            "https://compute.example"
        );
    }

    #[test]
    fn only_gce_resource_names_go_into_a_filter() {
        assert!(listable("vm-0") && listable("a"));
        assert!(!listable("") && !listable("0vm") && !listable("vm-") && !listable("a\"b"));
        assert!(!listable(&"a".repeat(64)) && listable(&"a".repeat(63)));
    }

    #[test]
    fn the_list_filter_ors_few_names_and_takes_many_by_their_common_prefix() {
        assert_eq!(list_filter(&["a"]).as_deref(), Some(r#"(name = "a")"#));
        assert_eq!(
            list_filter(&["vm-1", "vm-2"]).as_deref(),
            Some(r#"(name = "vm-1") OR (name = "vm-2")"#)
        );
        let many: Vec<String> = (0..=MAX_NAMED)
            .map(|i| format!("infra-{}-{i}", if i % 2 == 0 { "master" } else { "worker" }))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(list_filter(&many).as_deref(), Some(r#"name eq "infra-.*""#));
        let mut apart = many.clone();
        apart.push("other");
        assert_eq!(list_filter(&apart), None);
    }

    #[test]
    fn the_clearing_body_sends_an_explicit_empty_list() {
        let body = clear_body(&[0xfb, 0xff, 0x01]);
        assert_eq!(body["aliasIpRanges"], serde_json::json!([]));
        assert_eq!(body["fingerprint"], "-_8B");
    }

    #[test]
    fn nic0_is_found_by_name() {
        let instance = Instance::new().set_network_interfaces([
            NetworkInterface::new().set_name("nic1"),
            NetworkInterface::new()
                .set_name("nic0")
                .set_subnetwork("projects/p/regions/r/subnetworks/s")
                .set_alias_ip_ranges([AliasIpRange::new().set_ip_cidr_range("10.0.0.5/32")]),
        ]);
        let nic = nic_of(nic0(&instance).unwrap()).unwrap();
        assert_eq!(nic.aliases.len(), 1);
        assert_eq!(nic.subnetwork, "projects/p/regions/r/subnetworks/s");
        let none =
            Instance::new().set_network_interfaces([NetworkInterface::new().set_name("nic1")]);
        assert!(nic0(&none).is_none());
    }

    #[test]
    fn a_done_operation_with_an_error_fails_the_change() {
        use google_cloud_compute_v1::model::operation::{Error, error::Errors};
        let op = Operation::new().set_status(Status::Done).set_error(
            Error::new().set_errors([Errors::new()
                .set_code("IP_IN_USE_BY_ANOTHER_RESOURCE")
                .set_message("in use")]),
        );
        let e = operation_result("op", &op).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Permanent);
        assert!(e.message.contains("IP_IN_USE_BY_ANOTHER_RESOURCE"));
        assert!(operation_result("op", &Operation::new().set_status(Status::Done)).is_ok());
    }
}
