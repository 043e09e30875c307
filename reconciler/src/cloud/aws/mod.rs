//! The AWS provider: secondary private IPv4 and IPv6 addresses on an instance's primary ENI,
//! through `aws-sdk-ec2`.
//!
//! One attach or detach call carries every pending IP of a node: one `Assign…`/`Unassign…` call
//! per address family. Each operation first reads the ENI, so a repeated or crash-interrupted
//! operation only sends what is still missing ("already attached" and "not attached" are
//! success), and after the call it reads the ENI back until EC2 shows the change. Throttling and
//! transient failures are retried with capped exponential backoff, re-reading the ENI each time,
//! because a call that timed out may still have happened.

mod client;
mod credentials;
mod eni;
mod errors;
mod provider_id;
mod web_identity;

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::InstanceType;
use backon::{BackoffBuilder, ExponentialBuilder};
use cloudnet_shared::{Capacity, Platform};
use ipnet::{Ipv4Net, Ipv6Net};
use thiserror::Error;
use tokio::sync::OnceCell;

use super::{
    BatchOutcome, CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget,
    ProviderNeeds,
};
pub use client::{ClientError, ClientSettings, build as build_sdk_client};
pub use credentials::{AwsCredentials, CredentialSource, CredentialsError, Secret, WebIdentity};
use eni::{Addresses, PrimaryEni};
pub use provider_id::{ProviderIdError, instance_id};
pub use web_identity::{REFRESH_MARGIN, WebIdentityError};

/// The AWS SDKs' variable for STS's endpoint, for a `--platform-api-url` that serves EC2 only.
pub const STS_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_STS";

/// Most IPs one call carries; EC2's largest interfaces hold 50 addresses per family.
const MAX_BATCH: usize = 50;

/// How hard the provider retries and how long it waits for EC2 to show a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First backoff after a throttled or transient failure.
    pub min_delay: Duration,
    /// Backoff cap.
    pub max_delay: Duration,
    /// Attempts per operation, the first included.
    pub max_attempts: usize,
    /// First wait before re-reading the ENI after a change.
    pub confirm_min_delay: Duration,
    /// Re-reads of the ENI before the change counts as not yet done.
    pub confirm_polls: usize,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_attempts: 8,
            confirm_min_delay: Duration::from_millis(50),
            confirm_polls: 15,
        }
    }
}

/// Everything the provider needs, as loaded from flags and the mounted secret.
#[derive(Clone, Debug)]
pub struct AwsSettings {
    /// Region, endpoint, CA bundle and call timeout.
    pub client: ClientSettings,
    /// Where the credentials come from.
    pub credentials: CredentialSource,
    /// Retry and confirmation bounds.
    pub retry: RetryPolicy,
}

/// Why the provider could not be set up.
#[derive(Debug, Error)]
pub enum AwsSetupError {
    /// The credentials could not be read.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The CA bundle file could not be read.
    #[error("reading the CA bundle {path}: {source}")]
    CaBundle {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The client settings were refused.
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl AwsSettings {
    /// Settings from the process flags: the secret directory (`--secret-override`), region,
    /// optional endpoint (`--platform-api-url`) and CA bundle file (`--platform-aws-ca-override`),
    /// and from the SDKs' environment variable for a separate STS endpoint.
    pub fn load(
        secret_dir: &Path,
        region: &str,
        endpoint: Option<&str>,
        ca_bundle: Option<&Path>,
    ) -> Result<Self, AwsSetupError> {
        let credentials = CredentialSource::from_dir(secret_dir)?;
        let ca_bundle_pem = ca_bundle
            .map(|path| {
                std::fs::read(path).map_err(|source| AwsSetupError::CaBundle {
                    path: path.to_path_buf(),
                    source,
                })
            })
            .transpose()?;
        Ok(Self {
            client: ClientSettings {
                region: region.to_owned(),
                endpoint: endpoint.filter(|e| !e.is_empty()).map(str::to_owned),
                sts_endpoint: std::env::var(STS_ENDPOINT_ENV)
                    .ok()
                    .filter(|e| !e.is_empty()),
                ca_bundle_pem,
                call_timeout: Duration::from_secs(20),
            },
            credentials,
            retry: RetryPolicy::default(),
        })
    }
}

/// The EC2 cloud.
#[derive(Debug)]
pub struct AwsProvider {
    client: aws_sdk_ec2::Client,
    retry: RetryPolicy,
    /// Per-family limits per instance type: fixed by AWS, so looked up once, by one caller
    /// while the others wait (a fresh cluster asks for every node at the same moment).
    capacity: Mutex<HashMap<String, Arc<OnceCell<Capacity>>>>,
    /// Each subnet's CIDRs and when they were read, shared the same way for [`SUBNET_TTL`].
    subnets: Mutex<HashMap<String, Arc<OnceCell<SubnetRead>>>>,
}

/// A subnet's IPv4 and IPv6 CIDRs.
type SubnetCidrs = (Option<Ipv4Net>, Option<Ipv6Net>);

/// A subnet's CIDRs and when they were read.
type SubnetRead = (Instant, SubnetCidrs);

/// How long a subnet's CIDRs are reused: the IPv4 one never changes, but an IPv6 CIDR can be
/// associated with a subnet later, and the node annotation should show it without a restart.
const SUBNET_TTL: Duration = Duration::from_secs(300);

/// An address family, for the per-family calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl AwsProvider {
    /// A provider for `settings`. No call is made until the first operation.
    pub fn new(settings: &AwsSettings) -> Result<Self, AwsSetupError> {
        match &settings.credentials {
            CredentialSource::Static(_) => {
                tracing::info!("AWS credentials: keys from the secret directory");
            }
            CredentialSource::WebIdentity(identity) => tracing::info!(
                role = %identity.role_arn,
                token_file = %identity.token_file.display(),
                "AWS credentials: web identity, exchanged at STS"
            ),
        }
        Ok(Self {
            client: client::build(&settings.client, &settings.credentials)?,
            retry: settings.retry,
            capacity: Mutex::new(HashMap::new()),
            subnets: Mutex::new(HashMap::new()),
        })
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> {
        ExponentialBuilder::default()
            .with_min_delay(self.retry.min_delay)
            .with_max_delay(self.retry.max_delay)
            .with_max_times(self.retry.max_attempts.saturating_sub(1))
            .with_jitter()
            .build()
    }

    /// One read-only call, retried while throttled or failing transiently.
    async fn read<T, E, R, F, Fut>(
        &self,
        operation: &'static str,
        mut call: F,
    ) -> Result<T, CloudError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, R>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        let mut delays = self.backoff();
        loop {
            let error = match call().await {
                Ok(answer) => return Ok(answer),
                Err(e) => errors::classify(operation, &e),
            };
            match delays.next() {
                Some(delay) if is_transient(&error) => {
                    tracing::debug!(operation, error = %error, ?delay, "retrying EC2 call");
                    tokio::time::sleep(delay).await;
                }
                _ => return Err(error),
            }
        }
    }

    /// The primary ENI of `instance`, with its addresses.
    async fn primary_eni(&self, instance: &InstanceId) -> Result<PrimaryEni, CloudError> {
        let answer = self
            .read("DescribeInstances", || {
                self.client
                    .describe_instances()
                    .instance_ids(instance.0.clone())
                    .send()
            })
            .await?;
        let found = answer
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.instance_id() == Some(instance.0.as_str()))
            .ok_or_else(|| CloudError::not_found(format!("EC2 instance {instance} not found")))?;
        eni::primary_eni(found)
    }

    /// The addresses on `eni_id` now.
    async fn eni_addresses(&self, eni_id: &str) -> Result<Addresses, CloudError> {
        let answer = self
            .read("DescribeNetworkInterfaces", || {
                self.client
                    .describe_network_interfaces()
                    .network_interface_ids(eni_id)
                    .send()
            })
            .await?;
        answer
            .network_interfaces()
            .iter()
            .find(|ni| ni.network_interface_id() == Some(eni_id))
            .map(eni::interface_addresses)
            .ok_or_else(|| {
                CloudError::not_found(format!("EC2 network interface {eni_id} not found"))
            })
    }

    /// Per-family limits of `instance_type`, cached.
    async fn capacity(&self, instance_type: &str) -> Result<Capacity, CloudError> {
        let cell = Arc::clone(
            self.capacity
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(instance_type.to_owned())
                .or_default(),
        );
        cell.get_or_try_init(|| self.describe_capacity(instance_type))
            .await
            .copied()
    }

    async fn describe_capacity(&self, instance_type: &str) -> Result<Capacity, CloudError> {
        let answer = self
            .read("DescribeInstanceTypes", || {
                self.client
                    .describe_instance_types()
                    .instance_types(InstanceType::from(instance_type))
                    .send()
            })
            .await?;
        let info = answer
            .instance_types()
            .iter()
            .find_map(|t| t.network_info())
            .ok_or_else(|| {
                CloudError::permanent(format!("EC2 knows no network limits for {instance_type}"))
            })?;
        let ipv6 = if info.ipv6_supported() == Some(false) {
            0
        } else {
            info.ipv6_addresses_per_interface().unwrap_or(0)
        };
        Ok(Capacity {
            // Counts the primary address too, as the annotation's arithmetic expects.
            ipv4: Some(i64::from(info.ipv4_addresses_per_interface().unwrap_or(0))),
            ipv6: Some(i64::from(ipv6)),
            ip: None,
        })
    }

    /// The subnet's CIDRs, read at most once per [`SUBNET_TTL`] (every attach batch needs them).
    async fn subnet(&self, subnet_id: &str) -> Result<SubnetCidrs, CloudError> {
        let cell = {
            let mut subnets = self
                .subnets
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let cell = subnets.entry(subnet_id.to_owned()).or_default();
            if cell
                .get()
                .is_some_and(|(read, _)| read.elapsed() >= SUBNET_TTL)
            {
                *cell = Arc::default();
            }
            Arc::clone(cell)
        };
        let read = || async { Ok((Instant::now(), self.describe_subnet(subnet_id).await?)) };
        cell.get_or_try_init(read).await.map(|(_, cidrs)| *cidrs)
    }

    async fn describe_subnet(&self, subnet_id: &str) -> Result<SubnetCidrs, CloudError> {
        let answer = self
            .read("DescribeSubnets", || {
                self.client.describe_subnets().subnet_ids(subnet_id).send()
            })
            .await?;
        answer
            .subnets()
            .iter()
            .find(|s| s.subnet_id() == Some(subnet_id))
            .map(eni::subnet_cidrs)
            .ok_or_else(|| CloudError::not_found(format!("EC2 subnet {subnet_id} not found")))
    }

    /// One mutating call for `ips` of one family on `eni_id`, not retried here.
    async fn mutate(
        &self,
        attach: bool,
        family: Family,
        eni_id: &str,
        ips: &[IpAddr],
    ) -> Result<(), CloudError> {
        let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        let ips = Some(ips);
        let (operation, result) = match (attach, family) {
            (true, Family::V4) => {
                let call = self
                    .client
                    .assign_private_ip_addresses()
                    .network_interface_id(eni_id)
                    .set_private_ip_addresses(ips)
                    .allow_reassignment(false)
                    .send()
                    .await;
                (
                    "AssignPrivateIpAddresses",
                    call.map(drop)
                        .map_err(|e| errors::classify("AssignPrivateIpAddresses", &e)),
                )
            }
            (true, Family::V6) => {
                let call = self
                    .client
                    .assign_ipv6_addresses()
                    .network_interface_id(eni_id)
                    .set_ipv6_addresses(ips)
                    .send()
                    .await;
                (
                    "AssignIpv6Addresses",
                    call.map(drop)
                        .map_err(|e| errors::classify("AssignIpv6Addresses", &e)),
                )
            }
            (false, Family::V4) => {
                let call = self
                    .client
                    .unassign_private_ip_addresses()
                    .network_interface_id(eni_id)
                    .set_private_ip_addresses(ips)
                    .send()
                    .await;
                (
                    "UnassignPrivateIpAddresses",
                    call.map(drop)
                        .map_err(|e| errors::classify("UnassignPrivateIpAddresses", &e)),
                )
            }
            (false, Family::V6) => {
                let call = self
                    .client
                    .unassign_ipv6_addresses()
                    .network_interface_id(eni_id)
                    .set_ipv6_addresses(ips)
                    .send()
                    .await;
                (
                    "UnassignIpv6Addresses",
                    call.map(drop)
                        .map_err(|e| errors::classify("UnassignIpv6Addresses", &e)),
                )
            }
        };
        if let Err(error) = &result {
            tracing::debug!(operation, eni = eni_id, error = %error, "EC2 call failed");
        }
        result
    }

    /// Brings `ips` onto (`attach`) or off the ENI of `node`, in as few calls as EC2 allows,
    /// and returns once EC2 shows the result. `refused` holds IPs already failed by our checks.
    async fn converge(
        &self,
        attach: bool,
        eni: &PrimaryEni,
        ips: &[IpAddr],
        mut outcome: BatchOutcome,
    ) -> Result<BatchOutcome, CloudError> {
        let wanted = |addresses: &Addresses, ip: &IpAddr| addresses.contains(*ip) == attach;
        let mut pending: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| outcome.error_for(*ip).is_none())
            .collect();
        let mut addresses = eni.addresses.clone();
        let mut delays = self.backoff();
        loop {
            pending.retain(|ip| !wanted(&addresses, ip));
            if pending.is_empty() {
                return Ok(outcome);
            }
            let mut transient = None;
            for family in [Family::V4, Family::V6] {
                let batch: Vec<IpAddr> = pending
                    .iter()
                    .copied()
                    .filter(|ip| family_of(*ip) == family)
                    .collect();
                if batch.is_empty() {
                    continue;
                }
                match self.mutate(attach, family, &eni.id, &batch).await {
                    Ok(()) => {}
                    Err(e) if is_transient(&e) => transient = Some(e),
                    // The ENI itself is gone: no address of the batch is to blame.
                    Err(e) if e.kind == ErrorKind::NotFound => return Err(e),
                    Err(e) => {
                        // EC2 refuses a whole call for one bad address; find out which, one by
                        // one, so the others still go through.
                        let isolated =
                            self.isolate(attach, family, &eni.id, &batch, e, &mut outcome);
                        if let Some(e) = isolated.await? {
                            transient = Some(e);
                        }
                        pending.retain(|ip| outcome.error_for(*ip).is_none());
                    }
                }
            }
            match transient {
                None => {
                    addresses = self.confirm(&eni.id, &pending, attach).await?;
                }
                Some(error) => {
                    let Some(delay) = delays.next() else {
                        return Err(error);
                    };
                    tracing::debug!(eni = %eni.id, error = %error, ?delay, "retrying EC2 change");
                    tokio::time::sleep(delay).await;
                    // The failed call may still have happened: re-read before sending again.
                    addresses = self.eni_addresses(&eni.id).await?;
                }
            }
        }
    }

    /// Takes `ips` off the primary ENI of `node`; `NotFound` when the instance, its primary ENI
    /// or that ENI's record is gone.
    async fn detach_from_primary(
        &self,
        node: &NodeTarget,
        ips: &[IpAddr],
    ) -> Result<BatchOutcome, CloudError> {
        let eni = self.primary_eni(&node.instance).await?;
        let mut outcome = BatchOutcome::all_ok();
        if let Some(primary) = eni.addresses.primary_ipv4.map(IpAddr::V4)
            && ips.contains(&primary)
        {
            outcome.fail(
                primary,
                CloudError::permanent(format!(
                    "{primary} is the primary address of interface {}; it is never detached",
                    eni.id
                )),
            );
        }
        self.converge(false, &eni, ips, outcome).await
    }

    /// After a permanent failure of a batch, tries each IP alone to attribute the failure.
    /// Returns a transient error met on the way, so the caller backs off before going on, or
    /// fails with `NotFound` when the ENI itself disappears meanwhile.
    async fn isolate(
        &self,
        attach: bool,
        family: Family,
        eni_id: &str,
        batch: &[IpAddr],
        error: CloudError,
        outcome: &mut BatchOutcome,
    ) -> Result<Option<CloudError>, CloudError> {
        if let [ip] = batch {
            outcome.fail(*ip, error);
            return Ok(None);
        }
        let mut transient = None;
        for ip in batch {
            match self
                .mutate(attach, family, eni_id, std::slice::from_ref(ip))
                .await
            {
                Ok(()) => {}
                Err(e) if is_transient(&e) => transient = Some(e),
                Err(e) if e.kind == ErrorKind::NotFound => return Err(e),
                Err(e) => outcome.fail(*ip, e),
            }
        }
        Ok(transient)
    }

    /// Re-reads the ENI until every IP of `ips` is on it (`attach`) or off it, within bounds.
    async fn confirm(
        &self,
        eni_id: &str,
        ips: &[IpAddr],
        attach: bool,
    ) -> Result<Addresses, CloudError> {
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(self.retry.confirm_min_delay)
            .with_max_delay(Duration::from_secs(1))
            .with_max_times(self.retry.confirm_polls)
            .build();
        loop {
            let addresses = self.eni_addresses(eni_id).await?;
            if ips.iter().all(|ip| addresses.contains(*ip) == attach) {
                return Ok(addresses);
            }
            let Some(delay) = delays.next() else {
                return Err(CloudError::retryable(format!(
                    "EC2 accepted the change but interface {eni_id} does not show it yet"
                )));
            };
            tokio::time::sleep(delay).await;
        }
    }
}

fn family_of(ip: IpAddr) -> Family {
    if ip.is_ipv4() { Family::V4 } else { Family::V6 }
}

fn is_transient(error: &CloudError) -> bool {
    matches!(error.kind, ErrorKind::Throttled | ErrorKind::Retryable)
}

fn dedup(ips: &[IpAddr]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(ips.len());
    for ip in ips {
        if !out.contains(ip) {
            out.push(*ip);
        }
    }
    out
}

/// EC2 would refuse these (moto does not): out-of-subnet addresses, and more addresses than the
/// instance type allows on one interface. Checked before any mutating call.
fn precheck(
    eni: &PrimaryEni,
    subnets: (Option<Ipv4Net>, Option<Ipv6Net>),
    capacity: &Capacity,
    ips: &[IpAddr],
) -> BatchOutcome {
    let mut outcome = BatchOutcome::all_ok();
    let mut new = [0_i64; 2];
    for ip in ips {
        let in_subnet = match ip {
            IpAddr::V4(v4) => subnets.0.is_some_and(|n| n.contains(v4)),
            IpAddr::V6(v6) => subnets.1.is_some_and(|n| n.contains(v6)),
        };
        if !in_subnet {
            let subnet = match ip {
                IpAddr::V4(_) => subnets.0.map(|n| n.to_string()),
                IpAddr::V6(_) => subnets.1.map(|n| n.to_string()),
            };
            let subnet = subnet.unwrap_or_else(|| "no subnet of that family".into());
            outcome.fail(
                *ip,
                CloudError::permanent(format!(
                    "{ip} is outside the subnet of interface {} ({subnet})",
                    eni.id
                )),
            );
        } else if !eni.addresses.contains(*ip) {
            new[usize::from(ip.is_ipv6())] += 1;
        }
    }
    let checks = [
        (Family::V4, capacity.ipv4, eni.addresses.ipv4.len(), "IPv4"),
        (Family::V6, capacity.ipv6, eni.addresses.ipv6.len(), "IPv6"),
    ];
    for (family, limit, current, name) in checks {
        let added = new[usize::from(family == Family::V6)];
        let Some(limit) = limit else { continue };
        let current = i64::try_from(current).unwrap_or(i64::MAX);
        if added > 0 && current + added > limit {
            for ip in ips
                .iter()
                .filter(|ip| family_of(**ip) == family && !eni.addresses.contains(**ip))
            {
                if outcome.error_for(*ip).is_none() {
                    outcome.fail(
                        *ip,
                        CloudError::permanent(format!(
                            "interface {} holds {current} of at most {limit} {name} addresses; \
                             {added} more do not fit (PrivateIpAddressLimitExceeded)",
                            eni.id
                        )),
                    );
                }
            }
        }
    }
    outcome
}

#[async_trait]
impl CloudProvider for AwsProvider {
    fn needs(&self) -> ProviderNeeds {
        ProviderNeeds {
            name: "aws",
            serialize_per_node: true,
            max_batch: MAX_BATCH,
            native_move: false,
            platform: Some(Platform::Aws),
        }
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        let instance = instance_id(provider_id)
            .map_err(|e| CloudError::permanent(format!("node {node_name}: {e}")))?;
        Ok(NodeTarget {
            node_name: node_name.to_owned(),
            provider_id: provider_id.to_owned(),
            instance: InstanceId(instance.to_owned()),
        })
    }

    async fn attach(&self, node: &NodeTarget, ips: &[IpAddr]) -> Result<BatchOutcome, CloudError> {
        let ips = dedup(ips);
        let eni = self.primary_eni(&node.instance).await?;
        let missing: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| !eni.addresses.contains(*ip))
            .collect();
        if missing.is_empty() {
            return Ok(BatchOutcome::all_ok());
        }
        let subnets = self.subnet(&eni.subnet_id).await?;
        let capacity = self.capacity(&eni.instance_type).await?;
        let outcome = precheck(&eni, subnets, &capacity, &missing);
        self.converge(true, &eni, &missing, outcome).await
    }

    async fn detach(&self, node: &NodeTarget, ips: &[IpAddr]) -> Result<BatchOutcome, CloudError> {
        match self.detach_from_primary(node, &dedup(ips)).await {
            // EC2 deletes a terminated instance's primary ENI with its addresses
            // (DeleteOnTermination), lists the instance without interfaces for a while, then
            // forgets it: in every one of those states none of `ips` is attached anywhere.
            Err(error) if error.kind == ErrorKind::NotFound => {
                tracing::info!(
                    node = %node.node_name,
                    instance = %node.instance,
                    reason = %error,
                    "instance or primary interface gone: its IPs count as detached"
                );
                Ok(BatchOutcome::all_ok())
            }
            other => other,
        }
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        let eni = self.primary_eni(&node.instance).await?;
        let (ipv4_subnet, ipv6_subnet) = self.subnet(&eni.subnet_id).await?;
        let capacity = self.capacity(&eni.instance_type).await?;
        Ok(NodeEgress {
            interface: eni.id.clone(),
            ipv4_subnet,
            ipv6_subnet,
            capacity,
            addresses: eni.addresses.all(),
        })
    }

    async fn attached(&self, node: &NodeTarget) -> Result<Vec<IpAddr>, CloudError> {
        Ok(self
            .primary_eni(&node.instance)
            .await?
            .addresses
            .secondary())
    }
}
