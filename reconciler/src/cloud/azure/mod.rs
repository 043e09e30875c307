//! The Azure provider: egress IPs as extra ip-configurations on a VM's primary NIC, through
//! `azure_mgmt_network` (API package 2024-03-01) and `azure_identity` tokens.
//!
//! One change is one PUT of the whole NIC with `If-Match: <etag>`: additions and removals
//! together, so concurrent writers (another controller, a human) cannot overwrite each other; a
//! stale etag (412) re-reads the NIC and rebuilds the list. The PUT's asynchronous operation is
//! followed to `Succeeded`, honouring `Retry-After`; `Failed` reports ARM's error text. The NIC
//! as last PUT or read is kept per VM, so a batch costs no read when the engine's view is
//! current. Managed ip-configurations are kept out of load-balancer backend pools (egress must
//! not leave through the public load balancer): every PUT strips them, and so does the drift
//! read when it finds one pooled.

mod arm;
mod credentials;
mod environment;
mod errors;
mod identity;
mod nic;
mod nic_edits;
mod provider_id;
mod public_ip;
mod user_agent;
mod user_assigned;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::auth::TokenCredential;
use azure_core::{Method, RetryOptions, TransportOptions};
use azure_mgmt_network::package_2024_03::models::{NetworkInterface, NetworkInterfaceListResult};
use cloudnet_shared::{Capacity, Platform};
use ipnet::{Ipv4Net, Ipv6Net};
use thiserror::Error;

use super::driver::{self, Interface, Memo, Retry, SUBNET_TTL, Written};
use super::pace::{Pacing, Rate, Spend, TokenBucket};
use super::{
    Change, CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget, ProviderNeeds,
};
use crate::outbound::{proxy, trust};
pub use arm::{COMPUTE_API_VERSION, NETWORK_API_VERSION};
pub use credentials::{AzureAuth, AzureCredentials, CredentialsError};
pub use environment::{ENVIRONMENT_FILE_ENV, Environment, EnvironmentError, Source};
pub use nic::{MAX_IP_CONFIGS, ip_config_name};
pub use provider_id::{ProviderIdError, VmRef};
pub use user_agent::APPLICATION_ID;
pub use user_assigned::{CREDENTIALS_PATH_ENV, IdentityFile, IdentityFileError};

/// Most IPs one PUT carries (the engine splits larger batches): a NIC holds 256 in all.
const MAX_BATCH: usize = 64;

/// Most VMs one batched read takes: it lists each resource group's NICs once
/// (`NetworkInterfaces_List`), however many of its VMs it reads, so a drift period gathered
/// into one read lists each group once; smaller reads would each list the same groups again.
const MAX_READ_BATCH: usize = 10_000;

/// Azure Resource Manager's per-subscription token buckets ("Understand how Azure Resource
/// Manager throttles requests", regional throttling): reads 250 burst, 25/s; writes 200, 10/s.
pub fn arm_rate(mutating: bool) -> Rate {
    if mutating {
        Rate {
            burst: 200,
            per_second: 10.0,
        }
    } else {
        Rate {
            burst: 250,
            per_second: 25.0,
        }
    }
}

/// How hard the provider retries and waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First backoff after a failure without `Retry-After`.
    pub min_delay: Duration,
    /// Backoff cap, and cap on any `Retry-After`.
    pub max_delay: Duration,
    /// Attempts per change, the first included.
    pub max_attempts: usize,
    /// Wait between operation polls when ARM sends no `Retry-After` (the SDK's poller waits 30 s).
    pub poll_interval: Duration,
    /// Longest wait for one asynchronous operation.
    pub operation_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            max_attempts: 8,
            poll_interval: Duration::from_secs(2),
            operation_timeout: Duration::from_secs(180),
        }
    }
}

/// Everything the provider needs, as loaded from flags and the mounted secret.
#[derive(Clone, Debug)]
pub struct AzureSettings {
    /// Resource Manager and token authority.
    pub environment: Environment,
    /// Who the provider is.
    pub credentials: AzureCredentials,
    /// Retry and polling bounds.
    pub retry: RetryPolicy,
    /// Bound on one HTTP call.
    pub call_timeout: Duration,
    /// Client-side pace of reads and writes: [`arm_rate`], changed per class by the flags.
    pub pacing: Pacing,
}

/// Why the provider could not be set up.
#[derive(Debug, Error)]
pub enum AzureSetupError {
    /// The credentials could not be read.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The environment's endpoints could not be found.
    #[error(transparent)]
    Environment(#[from] EnvironmentError),
    /// The extra CA bundles are unusable.
    #[error("the cluster's CA bundles")]
    Trust(#[source] crate::outbound::trust::TrustError),
    /// The HTTP client could not be built.
    #[error("building the HTTP client of ARM and Azure AD")]
    Http(#[source] reqwest012::Error),
    /// The SDK client refused its settings.
    #[error("building the Azure network client")]
    Client(#[source] azure_core::Error),
}

/// The SDKs' variable for a token authority other than the environment's.
pub const AUTHORITY_HOST_ENV: &str = "AZURE_AUTHORITY_HOST";

impl AzureSettings {
    /// Settings from the process flags: the secret directory (`--secret-override`), the
    /// environment (`--platform-azure-environment`) and an optional Resource Manager URL
    /// (`--platform-api-url`, whose metadata endpoint is read now); `AZURE_ENVIRONMENT_FILEPATH`
    /// names Azure Stack Hub's environment file and `AZURE_AUTHORITY_HOST` replaces the token
    /// authority.
    pub async fn load(
        secret_dir: &Path,
        environment: &str,
        api_url: Option<&str>,
    ) -> Result<Self, AzureSetupError> {
        Self::load_with(secret_dir, environment, api_url, &|name| {
            std::env::var(name).ok()
        })
        .await
    }

    /// [`Self::load`], reading environment variables through `env`.
    pub async fn load_with(
        secret_dir: &Path,
        environment: &str,
        api_url: Option<&str>,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<Self, AzureSetupError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let credentials = AzureCredentials::from_dir_and(secret_dir, env)?;
        let call_timeout = Duration::from_secs(20);
        let source =
            Environment::source(environment, api_url, var(ENVIRONMENT_FILE_ENV).as_deref())?;
        let environment = Environment::load(source, &http_client()?, call_timeout)
            .await?
            .with_authority(var(AUTHORITY_HOST_ENV).as_deref())?;
        tracing::info!(
            resource_manager = %environment.resource_manager,
            authority = %environment.authority_host,
            audience = %environment.token_audience,
            "Azure endpoints"
        );
        Ok(Self {
            environment,
            credentials,
            retry: RetryPolicy::default(),
            call_timeout,
            pacing: Pacing::PUBLISHED,
        })
    }
}

/// A NIC as last seen, with where it lives.
#[derive(Clone, Debug)]
struct SeenNic {
    /// The NIC's resource id.
    id: String,
    /// The NIC itself, etag included.
    nic: NetworkInterface,
}

/// A subnet's CIDRs.
type SubnetCidrs = (Option<Ipv4Net>, Option<Ipv6Net>);

/// The Azure cloud.
pub struct AzureProvider {
    arm: arm::Arm,
    network: azure_mgmt_network::package_2024_03::Client,
    retry: RetryPolicy,
    /// The driver's part of `retry`.
    steps: Retry,
    read_bucket: TokenBucket,
    write_bucket: TokenBucket,
    /// Each VM's primary NIC id: fixed while the VM exists.
    vm_nics: Mutex<HashMap<String, String>>,
    /// Each VM's NIC as last PUT or read.
    nics: Mutex<HashMap<String, SeenNic>>,
    /// Each subnet's CIDRs, by subnet id, for [`SUBNET_TTL`].
    subnets: Memo<SubnetCidrs>,
    /// The public-IP edits waiting on each NIC.
    nic_edits: nic_edits::NicEdits<public_ip::Edit, public_ip::EditAnswer>,
}

impl std::fmt::Debug for AzureProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureProvider")
            .field("endpoint", &self.arm.endpoint.as_str())
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// The HTTP client of ARM and Azure AD: azure_core's (reqwest, no idle connections kept, as
/// `azure_core::new_http_client` builds it: see hyper#2312), through the proxy the process's
/// rules name for each URL, trusting the cluster's CA bundle besides the system roots, and
/// naming cloudnet in every `User-Agent`.
fn http_client() -> Result<Arc<dyn azure_core::HttpClient>, AzureSetupError> {
    let mut builder = reqwest012::Client::builder()
        .pool_max_idle_per_host(0)
        .proxy(reqwest012::Proxy::custom(|url| {
            proxy::for_url(proxy::rules(), url.as_str())
        }));
    let bundles = trust::extra_bundles(None).map_err(AzureSetupError::Trust)?;
    for der in trust::bundle_certificates(&bundles).map_err(AzureSetupError::Trust)? {
        let cert = reqwest012::Certificate::from_der(&der).map_err(AzureSetupError::Http)?;
        builder = builder.add_root_certificate(cert);
    }
    let client = builder.build().map_err(AzureSetupError::Http)?;
    Ok(Arc::new(user_agent::WithApplicationId(Arc::new(client))))
}

impl AzureProvider {
    /// A provider for `settings`. No call is made until the first operation.
    pub fn new(settings: &AzureSettings) -> Result<Self, AzureSetupError> {
        let http = http_client()?;
        let creds = &settings.credentials;
        let authority = settings.environment.authority_host.clone();
        let credential: Arc<dyn TokenCredential> = match &creds.auth {
            AzureAuth::ClientSecret(secret) => {
                tracing::info!(client = %creds.client_id, "Azure credentials: client secret");
                Arc::new(azure_identity::ClientSecretCredential::new(
                    Arc::clone(&http),
                    authority,
                    creds.tenant_id.clone(),
                    creds.client_id.clone(),
                    secret.expose().to_owned(),
                ))
            }
            AzureAuth::UserAssignedIdentity(file) => {
                tracing::info!(
                    client = %creds.client_id,
                    file = %file.display(),
                    "Azure credentials: ARO-HCP user-assigned identity (certificate)"
                );
                let identity = IdentityFile::read(file)
                    .map_err(|e| AzureSetupError::Credentials(CredentialsError::from(e)))?;
                Arc::new(user_assigned::UserAssignedIdentityCredential::new(
                    Arc::clone(&http),
                    file.clone(),
                    identity,
                ))
            }
            AzureAuth::FederatedTokenFile(file) => {
                tracing::info!(
                    client = %creds.client_id,
                    token_file = %file.display(),
                    "Azure credentials: workload identity (federated token file)"
                );
                Arc::new(identity::FederatedFileCredential::new(
                    Arc::clone(&http),
                    authority,
                    creds.tenant_id.clone(),
                    creds.client_id.clone(),
                    file.clone(),
                ))
            }
        };
        let endpoint = settings.environment.resource_manager.clone();
        let scope = settings.environment.scope();
        let network = azure_mgmt_network::package_2024_03::Client::builder(Arc::clone(&credential))
            .endpoint(endpoint.clone())
            .scopes(&[scope.as_str()])
            // Retries are ours: they honour ARM's answers and the engine's view of the node.
            .retry(RetryOptions::none())
            .transport(TransportOptions::new(Arc::clone(&http)))
            .build()
            .map_err(AzureSetupError::Client)?;
        let pacing = settings.pacing;
        let r = settings.retry;
        Ok(Self {
            arm: arm::Arm {
                http,
                credential,
                endpoint,
                scope,
                timeout: settings.call_timeout,
            },
            network,
            retry: settings.retry,
            steps: Retry::new(r.min_delay, r.max_delay, r.max_attempts),
            read_bucket: TokenBucket::new(pacing.rate(false, arm_rate(false))),
            write_bucket: TokenBucket::new(pacing.rate(true, arm_rate(true))),
            vm_nics: Mutex::new(HashMap::new()),
            nics: Mutex::new(HashMap::new()),
            subnets: Memo::expiring(SUBNET_TTL),
            nic_edits: nic_edits::NicEdits::default(),
        })
    }

    /// One read, paced and retried while throttled or failing transiently.
    async fn read<T, F, Fut>(&self, mut call: F) -> Result<T, CloudError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, CloudError>>,
    {
        let bucket = &self.read_bucket;
        driver::read(&self.steps, "ARM read", || driver::paced(bucket, call())).await
    }

    /// A raw GET of `url` (`what` names it), paced and retried; a non-2xx answer is its error.
    async fn get(&self, url: &azure_core::Url, what: &str) -> Result<arm::Answer, CloudError> {
        self.read(|| async move {
            let answer = self
                .arm
                .call(Method::Get, url.clone(), None, None, what)
                .await?;
            if answer.ok() {
                Ok(answer)
            } else {
                Err(answer.error("GET", what))
            }
        })
        .await
    }

    /// The VM's primary NIC id, from the VM's network profile (read once per VM).
    async fn primary_nic_id(&self, vm: &VmRef) -> Result<String, CloudError> {
        let key = vm.resource_id();
        if let Some(id) = lock(&self.vm_nics).get(&key) {
            return Ok(id.clone());
        }
        let url = self.arm.url(&key, COMPUTE_API_VERSION)?;
        let what = &format!("virtual machine {}", vm.name);
        let answer = self.get(&url, what).await?;
        let parsed: arm::VirtualMachine = serde_json::from_slice(&answer.body)
            .map_err(|e| CloudError::retryable(format!("GET {what}: undecodable answer: {e}")))?;
        let id = parsed.primary_nic().map(str::to_owned).ok_or_else(|| {
            CloudError::not_found(format!("{what} has no primary network interface"))
        })?;
        lock(&self.vm_nics).insert(key, id.clone());
        Ok(id)
    }

    /// The NIC `id` as ARM has it now.
    async fn get_nic(&self, id: &str) -> Result<NetworkInterface, CloudError> {
        let (sub, rg, name) = provider_id::nic_from_resource_id(id).ok_or_else(|| {
            CloudError::permanent(format!("{id:?} is not a network interface id"))
        })?;
        let what = &format!("network interface {name}");
        let (sub, rg, name) = (&sub, &rg, &name);
        self.read(|| async move {
            let get = self.network.network_interfaces_client().get(rg, name, sub);
            match tokio::time::timeout(self.arm.timeout, get.into_future()).await {
                Ok(Ok(nic)) => Ok(nic),
                Ok(Err(e)) => Err(errors::from_sdk("GET", what, &e)),
                Err(_) => Err(CloudError::retryable(format!(
                    "GET {what}: no answer in time"
                ))),
            }
        })
        .await
    }

    /// Every NIC of resource group `group`: one `NetworkInterfaces_List`, each page paced and
    /// retried as a single read.
    async fn list_nics(
        &self,
        subscription: &str,
        group: &str,
    ) -> Result<Vec<NetworkInterface>, CloudError> {
        let what = &format!("the network interfaces of resource group {group}");
        let path = format!(
            "/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Network/networkInterfaces"
        );
        let mut url = self.arm.url(&path, NETWORK_API_VERSION)?;
        let mut nics = Vec::new();
        loop {
            let answer = self.get(&url, what).await?;
            let page: NetworkInterfaceListResult =
                serde_json::from_slice(&answer.body).map_err(|e| {
                    CloudError::retryable(format!("GET {what}: undecodable answer: {e}"))
                })?;
            nics.extend(page.value);
            match page.next_link.filter(|link| !link.is_empty()) {
                Some(next) => url = self.arm.next_page(&next, what)?,
                None => return Ok(nics),
            }
        }
    }

    /// `vm`'s primary NIC among `nics` (its resource group's), decided as a single read decides:
    /// the NIC the VM's network profile named when that is known, else, of the NICs attached to
    /// the VM, the one flagged primary or the only one ([`arm::the_primary`]). `None` when the
    /// list cannot tell (the NIC lives in another group, or the VM is gone): a single read then
    /// decides.
    fn listed_nic(&self, vm: &VmRef, nics: &[NetworkInterface]) -> Option<SeenNic> {
        let vm_id = vm.resource_id();
        let same =
            |id: Option<&String>, other: &str| id.is_some_and(|id| id.eq_ignore_ascii_case(other));
        let known = lock(&self.vm_nics).get(&vm_id).cloned();
        let nic = match known {
            Some(id) => nics.iter().find(|n| same(n.resource.id.as_ref(), &id))?,
            None => {
                let attached: Vec<&NetworkInterface> = nics
                    .iter()
                    .filter(|n| {
                        let vm_ref = n
                            .properties
                            .as_ref()
                            .and_then(|p| p.virtual_machine.as_ref());
                        same(vm_ref.and_then(|r| r.id.as_ref()), &vm_id)
                    })
                    .collect();
                *arm::the_primary(&attached, |n| {
                    n.properties
                        .as_ref()
                        .and_then(|p| p.primary)
                        .unwrap_or(false)
                })?
            }
        };
        let id = nic.resource.id.clone().filter(|id| !id.is_empty())?;
        lock(&self.vm_nics).insert(vm_id, id.clone());
        Some(SeenNic {
            id,
            nic: nic.clone(),
        })
    }

    /// The subnet's CIDRs, read at most once per [`SUBNET_TTL`].
    async fn subnet(&self, subnet_id: &str) -> Result<SubnetCidrs, CloudError> {
        self.subnets
            .get(subnet_id, || self.get_subnet(subnet_id))
            .await
    }

    /// Reads the subnet through its virtual network, as the upstream controller does: OpenShift's
    /// CredentialsRequest grants `Microsoft.Network/virtualNetworks/read` but not
    /// `virtualNetworks/subnets/read`, so a direct subnet GET is refused there (403).
    async fn get_subnet(&self, subnet_id: &str) -> Result<SubnetCidrs, CloudError> {
        let subnet = provider_id::subnet_from_resource_id(subnet_id)
            .ok_or_else(|| CloudError::permanent(format!("{subnet_id:?} is not a subnet id")))?;
        let what = &format!("virtual network {}", subnet.vnet);
        let subnet = &subnet;
        let vnet = self
            .read(|| async move {
                let get = self.network.virtual_networks_client().get(
                    &subnet.resource_group,
                    &subnet.vnet,
                    &subnet.subscription,
                );
                match tokio::time::timeout(self.arm.timeout, get.into_future()).await {
                    Ok(Ok(s)) => Ok(s),
                    Ok(Err(e)) => Err(errors::from_sdk("GET", what, &e)),
                    Err(_) => Err(CloudError::retryable(format!(
                        "GET {what}: no answer in time"
                    ))),
                }
            })
            .await?;
        let answer = vnet
            .properties
            .unwrap_or_default()
            .subnets
            .into_iter()
            .find(|s| {
                s.name
                    .as_deref()
                    .is_some_and(|name| name.eq_ignore_ascii_case(&subnet.subnet))
            })
            .ok_or_else(|| {
                CloudError::permanent(format!(
                    "virtual network {} has no subnet {}",
                    subnet.vnet, subnet.subnet
                ))
            })?;
        let props = answer.properties.unwrap_or_default();
        let prefixes = props
            .address_prefix
            .into_iter()
            .chain(props.address_prefixes);
        let mut cidrs: SubnetCidrs = (None, None);
        for prefix in prefixes {
            if let Ok(v4) = prefix.parse::<Ipv4Net>() {
                cidrs.0.get_or_insert(v4);
            } else if let Ok(v6) = prefix.parse::<Ipv6Net>() {
                cidrs.1.get_or_insert(v6);
            }
        }
        Ok(cidrs)
    }

    /// The engine's view of `nic`.
    async fn view(&self, nic: &NetworkInterface) -> Result<NodeEgress, CloudError> {
        let name = nic.resource.name.clone().unwrap_or_default();
        let primary = nic::primary_config(nic);
        let subnet_id = primary
            .and_then(|c| c.properties.as_ref())
            .and_then(|p| p.subnet.as_ref())
            .and_then(|s| s.sub_resource.id.clone());
        let (ipv4_subnet, ipv6_subnet) = match subnet_id {
            Some(id) => self.subnet(&id).await?,
            None => (None, None),
        };
        Ok(NodeEgress {
            interface: name,
            ipv4_subnet,
            ipv6_subnet,
            capacity: Capacity {
                ipv4: None,
                ipv6: None,
                ip: Some(i64::try_from(MAX_IP_CONFIGS).unwrap_or(i64::MAX)),
            },
            addresses: nic::addresses(nic),
            primary: primary.and_then(nic::config_address).into_iter().collect(),
        })
    }

    /// The VM's NIC read now, remembered.
    async fn read_nic(&self, vm: &VmRef) -> Result<SeenNic, CloudError> {
        let id = self.primary_nic_id(vm).await?;
        let nic = match self.get_nic(&id).await {
            Ok(nic) => nic,
            Err(e) if e.kind == ErrorKind::NotFound => {
                // The VM may have been given another NIC: ask it again next time.
                lock(&self.vm_nics).remove(&vm.resource_id());
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let seen = SeenNic { id, nic };
        self.remember(vm, &seen);
        Ok(seen)
    }

    /// `vm`'s NIC as just read, kept for the next change.
    fn remember(&self, vm: &VmRef, seen: &SeenNic) {
        lock(&self.nics).insert(vm.resource_id(), seen.clone());
    }

    /// The engine's view of `node`'s NIC as just read; managed ip-configurations found in a
    /// load-balancer backend pool are taken out of it first (best effort: the next change's PUT
    /// strips them as well).
    async fn egress_of(&self, node: &NodeTarget, seen: &SeenNic) -> Result<NodeEgress, CloudError> {
        if nic::has_pooled_managed_config(&seen.nic) {
            tracing::info!(
                node = %node.node_name,
                "stripping load-balancer backend pools from managed ip-configurations"
            );
            match self
                .apply(node, &Change::default(), Some(&self.view(&seen.nic).await?))
                .await
            {
                Ok(Some(view)) => return Ok(view),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %node.node_name, error = %e, "stripping pools failed")
                }
            }
        }
        self.view(&seen.nic).await
    }

    /// PUTs `body` over the NIC `seen` with its etag and follows the operation to its end; the
    /// NIC as it is afterwards.
    async fn put_nic(
        &self,
        seen: &SeenNic,
        body: &NetworkInterface,
    ) -> Result<NetworkInterface, CloudError> {
        let name = body.resource.name.clone().unwrap_or_default();
        let what = format!("network interface {name}");
        let etag = seen.nic.etag.as_deref().ok_or_else(|| {
            CloudError::retryable(format!("{what} came without an etag; reading it again"))
        })?;
        let payload = serde_json::to_vec(body)
            .map_err(|e| CloudError::permanent(format!("encoding {what}: {e}")))?;
        let url = self.arm.url(&seen.id, NETWORK_API_VERSION)?;
        let put = async {
            let answer = self
                .arm
                .call(Method::Put, url, Some(payload.into()), Some(etag), &what)
                .await?;
            if answer.ok() {
                return Ok(answer);
            }
            let wait = errors::retry_after(answer.retry_after.as_deref(), self.retry.max_delay);
            Err(answer.error("PUT", &what).with_retry_after(wait))
        };
        let answer = driver::paced(&self.write_bucket, put).await?;
        self.follow(&answer, &what).await?;
        self.get_nic(&seen.id).await
    }

    /// Waits for the operation a write answer started, by whichever protocol it names.
    async fn follow(&self, answer: &arm::Answer, what: &str) -> Result<(), CloudError> {
        let (url, azure_async) = match (&answer.async_operation, &answer.location) {
            (Some(url), _) => (url.clone(), true),
            (None, Some(url)) if answer.status == 202 => (url.clone(), false),
            _ => return Ok(()),
        };
        let url = azure_core::Url::parse(&url)
            .map_err(|e| CloudError::retryable(format!("{what}: bad operation URL: {e}")))?;
        let deadline = tokio::time::Instant::now() + self.retry.operation_timeout;
        let mut wait = self.wait_for(answer.retry_after.as_deref());
        loop {
            if tokio::time::Instant::now() + wait > deadline {
                return Err(CloudError::retryable(format!(
                    "updating {what}: the operation did not finish within {:?}",
                    self.retry.operation_timeout
                )));
            }
            tokio::time::sleep(wait).await;
            self.read_bucket.acquire().await;
            let status = self
                .arm
                .call(Method::Get, url.clone(), None, None, what)
                .await?;
            if !status.ok() {
                let error = status.error("GET operation of", what);
                if driver::is_transient(&error) {
                    wait = self.wait_for(status.retry_after.as_deref());
                    continue;
                }
                return Err(error);
            }
            if !azure_async {
                if status.status == 202 {
                    wait = self.wait_for(status.retry_after.as_deref());
                    continue;
                }
                return Ok(());
            }
            let doc: arm::OperationStatus =
                serde_json::from_slice(&status.body).unwrap_or_default();
            match doc.status.as_str() {
                "Succeeded" => return Ok(()),
                "Failed" | "Canceled" => {
                    return Err(errors::operation_failed(
                        what,
                        &doc.status,
                        doc.error.as_ref(),
                    ));
                }
                _ => wait = self.wait_for(status.retry_after.as_deref()),
            }
        }
    }

    fn wait_for(&self, retry_after: Option<&str>) -> Duration {
        errors::retry_after(retry_after, self.retry.max_delay).unwrap_or(self.retry.poll_interval)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Azure would refuse these: an address outside the NIC's subnet of its family. Checked before
/// the PUT, naming the first offending address.
fn precheck(view: &NodeEgress, change: &Change) -> Result<(), CloudError> {
    for ip in &change.add {
        let inside = match ip {
            IpAddr::V4(v4) => view.ipv4_subnet.is_some_and(|n| n.contains(v4)),
            IpAddr::V6(v6) => view.ipv6_subnet.is_some_and(|n| n.contains(v6)),
        };
        if !inside {
            let cidr = match ip {
                IpAddr::V4(_) => view.ipv4_subnet.map(|n| n.to_string()),
                IpAddr::V6(_) => view.ipv6_subnet.map(|n| n.to_string()),
            };
            let cidr = cidr.unwrap_or_else(|| "no subnet of that family".into());
            return Err(CloudError::permanent(format!(
                "{ip} is outside the subnet of network interface {} ({cidr})",
                view.interface
            )));
        }
    }
    Ok(())
}

/// A VM's primary NIC, for one change: one PUT of the whole NIC guarded by its etag.
struct Nic<'a> {
    provider: &'a AzureProvider,
    node: &'a NodeTarget,
    vm: VmRef,
}

#[async_trait]
impl Interface for Nic<'_> {
    type State = SeenNic;

    async fn read(&self, _: Option<&SeenNic>) -> Result<SeenNic, CloudError> {
        self.provider.read_nic(&self.vm).await
    }

    async fn describe(&self, seen: &SeenNic) -> Result<NodeEgress, CloudError> {
        self.provider.view(&seen.nic).await
    }

    fn precheck(&self, _: &SeenNic, view: &NodeEgress, todo: &Change) -> Result<(), CloudError> {
        precheck(view, todo)
    }

    async fn write(&self, seen: &SeenNic, change: &Change) -> Result<Written<SeenNic>, CloudError> {
        let Some(body) = nic::edited(&seen.nic, &self.node.node_name, change)? else {
            return Ok(Written::Unchanged);
        };
        let after = SeenNic {
            id: seen.id.clone(),
            nic: self.provider.put_nic(seen, &body).await?,
        };
        lock(&self.provider.nics).insert(self.vm.resource_id(), after.clone());
        Ok(Written::Changed(after))
    }

    fn forget(&self) {
        lock(&self.provider.nics).remove(&self.vm.resource_id());
    }
}

#[async_trait]
impl CloudProvider for AzureProvider {
    fn public_ips(self: Arc<Self>) -> Option<Arc<dyn crate::cloud::public_ip::PublicIps>> {
        Some(self)
    }

    fn forget_vm(&self, instance: &InstanceId) {
        if let Ok(vm) = provider_id::vm_from_resource_id(&instance.0) {
            let key = vm.resource_id();
            lock(&self.vm_nics).remove(&key);
            lock(&self.nics).remove(&key);
        }
    }

    fn needs(&self) -> ProviderNeeds {
        ProviderNeeds {
            name: "azure",
            serialize_per_node: true,
            max_batch: MAX_BATCH,
            native_move: false,
            max_read_batch: MAX_READ_BATCH,
            platform: Some(Platform::Azure),
            reads_before_adding: false,
        }
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        NodeTarget::from_provider_id(
            node_name,
            provider_id,
            provider_id::parse(provider_id).map(|vm| vm.resource_id()),
        )
    }

    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        let vm = vm_of(node)?;
        let nic = Nic {
            provider: self,
            node,
            vm,
        };
        // The NIC as last PUT or read, when the engine's view (our last answer) is current.
        let remembered = known.and_then(|_| lock(&self.nics).get(&nic.vm.resource_id()).cloned());
        driver::change(&nic, &node.node_name, &self.steps, change, remembered).await
    }

    async fn write_budget(&self, spend: Spend) {
        self.write_bucket.until_available(spend).await;
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        let vm = vm_of(node)?;
        let seen = self.read_nic(&vm).await?;
        self.egress_of(node, &seen).await
    }

    /// One `NetworkInterfaces_List` per resource group of the VMs; a VM the list cannot answer
    /// (its NIC in another group, or no NIC of the group attached to it) is read on its own.
    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        let mut answers = driver::Answers::new(nodes.len());
        // The VMs of each resource group (ARM ids are case-insensitive), by index in `nodes`.
        let mut groups: BTreeMap<(String, String), Vec<(usize, VmRef)>> = BTreeMap::new();
        for (i, node) in nodes.iter().enumerate() {
            match vm_of(node) {
                Ok(vm) => groups
                    .entry((
                        vm.subscription.to_ascii_lowercase(),
                        vm.resource_group.to_ascii_lowercase(),
                    ))
                    .or_default()
                    .push((i, vm)),
                Err(e) => answers.set(i, Err(e)),
            }
        }
        let lists = futures::future::join_all(groups.values().map(|vms| {
            let vm = &vms[0].1;
            self.list_nics(&vm.subscription, &vm.resource_group)
        }))
        .await;
        for (vms, listed) in groups.values().zip(lists) {
            let nics = match listed {
                Ok(nics) => nics,
                Err(e) => {
                    answers.fail(vms.iter().map(|(i, _)| *i), &e);
                    continue;
                }
            };
            for (i, vm) in vms {
                match self.listed_nic(vm, &nics) {
                    Some(seen) => {
                        self.remember(vm, &seen);
                        answers.set(*i, self.egress_of(&nodes[*i], &seen).await);
                    }
                    None => answers.read_alone(*i),
                }
            }
        }
        answers.finish(self, nodes).await
    }
}

/// The VM `node`'s recorded instance names.
fn vm_of(node: &NodeTarget) -> Result<VmRef, CloudError> {
    provider_id::vm_from_resource_id(&node.instance.0)
        .map_err(|e| CloudError::permanent(format!("node {}: {e}", node.node_name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_paced_below_reads_at_arms_published_rates() {
        assert_eq!(arm_rate(true).burst, 200);
        assert!(arm_rate(true).per_second < arm_rate(false).per_second);
    }

    #[test]
    fn retry_after_is_carried_typed_and_shown() {
        let e = CloudError::throttled("PUT nic: TooManyRequests (429)")
            .with_retry_after(Some(Duration::from_secs(7)));
        assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
        assert_eq!(
            e.to_string(),
            "PUT nic: TooManyRequests (429) (retry after 7s)"
        );
        assert_eq!(CloudError::throttled("x").retry_after, None);
    }
}
