//! The AWS provider: secondary private IPv4 and IPv6 addresses on an instance's primary ENI,
//! through `aws-sdk-ec2`.
//!
//! One change carries every pending IP of a node: one `Unassign…` and one `Assign…` call per
//! address family (EC2 has no call that does both). The engine's cached view of the ENI (the
//! answer of our last call) says what is still missing, so a change of IPs already ours costs no
//! read; the ENI is read when there is no such view, before adding IPs that are not ours yet
//! (EC2 has no etag, and an address another tool put there since must be refused, not taken
//! over), and again before retrying after a failed call (which may or may not have happened) or
//! when EC2 refuses a change made from a cached view. Each EC2
//! API draws from its own token bucket at EC2's published rate ([`ec2_rate`]), so the provider
//! paces itself instead of being throttled; a throttled answer empties that bucket and backs off
//! with jitter.

mod client;
mod credentials;
mod elastic_ip;
mod eni;
mod errors;
mod provider_id;
mod web_identity;

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{Instance, InstanceType};
use cloudnet_shared::{Capacity, Platform};
use ipnet::{Ipv4Net, Ipv6Net};
use thiserror::Error;

use super::driver::{self, Interface, Memo, SUBNET_TTL, Written};
use super::pace::{Pacing, Rate, Spend, TokenBucket};
use super::{Change, CloudError, CloudProvider, InstanceId, NodeEgress, NodeTarget, ProviderNeeds};
pub use client::{ClientError, ClientSettings, build as build_sdk_client};
pub use credentials::{AwsCredentials, CredentialSource, CredentialsError, Secret, WebIdentity};
use eni::Addresses;
pub use provider_id::{ProviderIdError, instance_id};
pub use web_identity::{REFRESH_MARGIN, WebIdentityError};

/// The AWS SDKs' variable for STS's endpoint, for a `--platform-api-url` that serves EC2 only.
pub const STS_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_STS";

/// Most IPs one call carries; EC2's largest interfaces hold 50 addresses per family.
const MAX_BATCH: usize = 50;

/// Most instance ids one DescribeInstances call takes ("Up to 1000 instance IDs").
const MAX_READ_BATCH: usize = 1000;

/// The mutating EC2 APIs the provider calls.
const MUTATING_APIS: [&str; 4] = [
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
    "AssignIpv6Addresses",
    "UnassignIpv6Addresses",
];

/// EC2's request token bucket for `api` ("Request throttling for the Amazon EC2 API": request
/// token bucket sizes and refill rates). Each API has its own bucket, per account and region,
/// shared with every other client of the account.
pub fn ec2_rate(api: &str) -> Rate {
    let (burst, per_second) = match api {
        // Listed among the uncategorized actions.
        "AssignPrivateIpAddresses" | "AssignIpv6Addresses" | "UnassignPrivateIpAddresses" => {
            (100, 5.0)
        }
        // Other mutating actions.
        "UnassignIpv6Addresses" | "AssociateAddress" | "DisassociateAddress" => (50, 5.0),
        // "Unfiltered and unpaginated non-mutating actions": called with ids, not a filter.
        "DescribeInstances" | "DescribeNetworkInterfaces" | "DescribeAddresses" => (50, 10.0),
        // Other non-mutating actions.
        _ => (100, 20.0),
    };
    Rate { burst, per_second }
}

/// How hard the provider retries: the driver's policy (200 ms doubling to 5 s, 8 attempts).
pub use super::driver::Retry as RetryPolicy;

/// Everything the provider needs, as loaded from flags and the mounted secret.
#[derive(Clone, Debug)]
pub struct AwsSettings {
    /// Region, endpoint, CA bundle and call timeout.
    pub client: ClientSettings,
    /// Where the credentials come from.
    pub credentials: CredentialSource,
    /// Retry bounds.
    pub retry: RetryPolicy,
    /// Client-side pace of each EC2 API: [`ec2_rate`], changed per class by the flags.
    pub pacing: Pacing,
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
            pacing: Pacing::PUBLISHED,
        })
    }
}

/// The EC2 cloud.
#[derive(Debug)]
pub struct AwsProvider {
    client: aws_sdk_ec2::Client,
    retry: RetryPolicy,
    /// Per-family limits per instance type: fixed by AWS, so looked up once.
    capacity: Memo<Capacity>,
    /// Each subnet's CIDRs, for [`SUBNET_TTL`].
    subnets: Memo<SubnetCidrs>,
    pacing: Pacing,
    /// One bucket per EC2 API, made on first use.
    buckets: Mutex<HashMap<&'static str, Arc<TokenBucket>>>,
}

/// A subnet's IPv4 and IPv6 CIDRs.
type SubnetCidrs = (Option<Ipv4Net>, Option<Ipv6Net>);

/// What DescribeInstances said about many ids.
struct Listed {
    /// The instances it listed, by id.
    found: HashMap<String, Instance>,
    /// The ids it refused (unknown, malformed), each with its own error.
    refused: HashMap<String, CloudError>,
}

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
            capacity: Memo::forever(),
            subnets: Memo::expiring(SUBNET_TTL),
            pacing: settings.pacing,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// The token bucket of EC2 API `operation`.
    fn bucket(&self, operation: &'static str) -> Arc<TokenBucket> {
        let mutating =
            MUTATING_APIS.contains(&operation) || elastic_ip::MUTATING_APIS.contains(&operation);
        let rate = self.pacing.rate(mutating, ec2_rate(operation));
        Arc::clone(
            self.buckets
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(operation)
                .or_insert_with(|| Arc::new(TokenBucket::new(rate))),
        )
    }

    /// One read-only call, paced, retried while throttled or failing transiently.
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
        let bucket = &self.bucket(operation);
        driver::read(&self.retry, operation, || {
            let sent = call();
            driver::paced(bucket, async move {
                sent.await.map_err(|e| errors::classify(operation, &e))
            })
        })
        .await
    }

    /// `instance` as DescribeInstances lists it, every interface included.
    async fn describe_instance(&self, instance: &InstanceId) -> Result<Instance, CloudError> {
        let answer = self
            .read("DescribeInstances", || {
                self.client
                    .describe_instances()
                    .instance_ids(instance.0.clone())
                    .send()
            })
            .await?;
        answer
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.instance_id() == Some(instance.0.as_str()))
            .cloned()
            .ok_or_else(|| CloudError::not_found(format!("EC2 instance {instance} not found")))
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
        self.capacity
            .get(instance_type, || self.describe_capacity(instance_type))
            .await
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
        self.subnets
            .get(subnet_id, || self.describe_subnet(subnet_id))
            .await
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

    /// One mutating call for `ips` of one family on `eni_id`, paced, not retried here.
    async fn mutate(
        &self,
        attach: bool,
        family: Family,
        eni_id: &str,
        ips: &[IpAddr],
    ) -> Result<(), CloudError> {
        let api = match (attach, family) {
            (true, Family::V4) => MUTATING_APIS[0],
            (false, Family::V4) => MUTATING_APIS[1],
            (true, Family::V6) => MUTATING_APIS[2],
            (false, Family::V6) => MUTATING_APIS[3],
        };
        let ips = Some(ips.iter().map(IpAddr::to_string).collect::<Vec<_>>());
        let client = &self.client;
        let call = async {
            match (attach, family) {
                (true, Family::V4) => client
                    .assign_private_ip_addresses()
                    .network_interface_id(eni_id)
                    .set_private_ip_addresses(ips)
                    .allow_reassignment(false)
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| errors::classify(api, &e)),
                (true, Family::V6) => client
                    .assign_ipv6_addresses()
                    .network_interface_id(eni_id)
                    .set_ipv6_addresses(ips)
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| errors::classify(api, &e)),
                (false, Family::V4) => client
                    .unassign_private_ip_addresses()
                    .network_interface_id(eni_id)
                    .set_private_ip_addresses(ips)
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| errors::classify(api, &e)),
                (false, Family::V6) => client
                    .unassign_ipv6_addresses()
                    .network_interface_id(eni_id)
                    .set_ipv6_addresses(ips)
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| errors::classify(api, &e)),
            }
        };
        let result = driver::paced(&self.bucket(api), call).await;
        if let Err(error) = &result {
            tracing::debug!(operation = api, eni = eni_id, error = %error, "EC2 call failed");
        }
        result
    }

    /// Every instance of `ids` as DescribeInstances lists them, by id, in one call per page.
    /// EC2 refuses a whole call naming an instance it does not know (or a malformed id), naming
    /// the ids: those are answered apart, each with its own error, and the call is made again
    /// without them. An id-error that names none of the ids is returned as it is.
    async fn describe_many(&self, ids: &[String]) -> Result<Listed, CloudError> {
        let mut asked = ids.to_vec();
        let mut refused = HashMap::new();
        while !asked.is_empty() {
            let error = match self.describe_pages(&asked).await {
                Ok(found) => return Ok(Listed { found, refused }),
                Err(error) => error,
            };
            let named = errors::named_instances(&error, &asked);
            if named.is_empty() {
                return Err(error);
            }
            asked.retain(|id| !named.contains(id));
            for id in named {
                let alone = errors::instance_refused(&error, &id);
                refused.insert(id, alone);
            }
        }
        Ok(Listed {
            found: HashMap::new(),
            refused,
        })
    }

    /// The instances of `ids`, every page of the answer read (each page one paced call).
    async fn describe_pages(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, Instance>, CloudError> {
        let mut found = HashMap::new();
        let mut token: Option<String> = None;
        loop {
            let answer = self
                .read("DescribeInstances", || {
                    self.client
                        .describe_instances()
                        .set_instance_ids(Some(ids.to_vec()))
                        .set_next_token(token.clone())
                        .send()
                })
                .await?;
            for instance in answer.reservations().iter().flat_map(|r| r.instances()) {
                if let Some(id) = instance.instance_id() {
                    found.insert(id.to_owned(), instance.clone());
                }
            }
            match answer.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => return Ok(found),
            }
        }
    }

    /// The whole view of `instance`'s primary interface, read now.
    async fn read_view(&self, instance: &InstanceId) -> Result<NodeEgress, CloudError> {
        self.view_of(&self.describe_instance(instance).await?).await
    }

    /// The view of the primary interface of `instance` as DescribeInstances listed it; subnets
    /// and limits come from their memos.
    async fn view_of(&self, instance: &Instance) -> Result<NodeEgress, CloudError> {
        let eni = eni::primary_eni(instance)?;
        let (ipv4_subnet, ipv6_subnet) = self.subnet(&eni.subnet_id).await?;
        let capacity = self.capacity(&eni.instance_type).await?;
        Ok(NodeEgress {
            interface: eni.id.clone(),
            ipv4_subnet,
            ipv6_subnet,
            capacity,
            addresses: eni.addresses.all(),
            primary: eni.addresses.own(),
        })
    }

    /// `view` with the addresses its ENI has now (subnets and limits do not change).
    async fn reread(&self, view: &NodeEgress) -> Result<NodeEgress, CloudError> {
        let addresses = self.eni_addresses(&view.interface).await?;
        Ok(NodeEgress {
            addresses: addresses.all(),
            primary: addresses.own(),
            ..view.clone()
        })
    }

    /// Sends what `change` still needs on `view`'s ENI: removals first, so that they make room
    /// for additions, one call per kind and family. `view` follows every call that succeeds.
    async fn send(&self, view: &mut NodeEgress, change: &Change) -> Result<(), CloudError> {
        for (attach, ips) in [(false, &change.remove), (true, &change.add)] {
            for family in [Family::V4, Family::V6] {
                let batch: Vec<IpAddr> = ips
                    .iter()
                    .copied()
                    .filter(|ip| family_of(*ip) == family)
                    .collect();
                if batch.is_empty() {
                    continue;
                }
                self.mutate(attach, family, &view.interface, &batch).await?;
                let done = if attach {
                    Change::new(batch, Vec::new())
                } else {
                    Change::new(Vec::new(), batch)
                };
                *view = std::mem::take(view).after(&done);
            }
        }
        Ok(())
    }
}

fn family_of(ip: IpAddr) -> Family {
    if ip.is_ipv4() { Family::V4 } else { Family::V6 }
}

/// EC2 would refuse these (moto does not): an out-of-subnet address, more addresses than the
/// instance type allows on one interface. Checked before any mutating call; the change is
/// refused as a whole, naming the first offending address. (The node's own addresses are the
/// driver's: [`driver::foreign`].)
fn precheck(view: &NodeEgress, todo: &Change) -> Result<(), CloudError> {
    let eni = &view.interface;
    for ip in &todo.add {
        let subnet = match ip {
            IpAddr::V4(v4) => view.ipv4_subnet.filter(|n| n.contains(v4)).map(|_| ()),
            IpAddr::V6(v6) => view.ipv6_subnet.filter(|n| n.contains(v6)).map(|_| ()),
        };
        if subnet.is_none() {
            let cidr = match ip {
                IpAddr::V4(_) => view.ipv4_subnet.map(|n| n.to_string()),
                IpAddr::V6(_) => view.ipv6_subnet.map(|n| n.to_string()),
            };
            let cidr = cidr.unwrap_or_else(|| "no subnet of that family".into());
            return Err(CloudError::permanent(format!(
                "{ip} is outside the subnet of interface {eni} ({cidr})"
            )));
        }
    }
    let checks = [
        (Family::V4, view.capacity.ipv4, "IPv4"),
        (Family::V6, view.capacity.ipv6, "IPv6"),
    ];
    for (family, limit, name) in checks {
        let Some(limit) = limit else { continue };
        let count = |ips: &[IpAddr]| {
            let n = ips.iter().filter(|ip| family_of(**ip) == family).count();
            i64::try_from(n).unwrap_or(i64::MAX)
        };
        let added = count(&todo.add);
        let current = count(&view.addresses);
        let after = current - count(&todo.remove) + added;
        if added > 0 && after > limit {
            let first = todo.add.iter().find(|ip| family_of(**ip) == family);
            let first = first.map(ToString::to_string).unwrap_or_default();
            return Err(CloudError::permanent(format!(
                "interface {eni} holds {current} of at most {limit} {name} addresses; \
                 {added} more (from {first}) do not fit (PrivateIpAddressLimitExceeded)"
            )));
        }
    }
    Ok(())
}

/// A node's primary ENI, for one change. Its state is the engine's view itself: EC2 has no etag,
/// and what a change still needs is what the view does not show yet.
struct Eni<'a> {
    provider: &'a AwsProvider,
    node: &'a NodeTarget,
}

#[async_trait]
impl Interface for Eni<'_> {
    type State = NodeEgress;

    async fn read(&self, last: Option<&NodeEgress>) -> Result<NodeEgress, CloudError> {
        match last {
            Some(view) => self.provider.reread(view).await,
            None => self.provider.read_view(&self.node.instance).await,
        }
    }

    async fn describe(&self, view: &NodeEgress) -> Result<NodeEgress, CloudError> {
        Ok(view.clone())
    }

    fn precheck(&self, _: &NodeEgress, view: &NodeEgress, todo: &Change) -> Result<(), CloudError> {
        precheck(view, todo)
    }

    async fn write(
        &self,
        view: &NodeEgress,
        change: &Change,
    ) -> Result<Written<NodeEgress>, CloudError> {
        let todo = driver::outstanding(view, change);
        if todo.is_empty() {
            return Ok(Written::Unchanged);
        }
        let mut after = view.clone();
        self.provider.send(&mut after, &todo).await?;
        Ok(Written::Changed(after))
    }
}

#[async_trait]
impl CloudProvider for AwsProvider {
    fn public_ips(self: Arc<Self>) -> Option<Arc<dyn crate::cloud::public_ip::PublicIps>> {
        Some(self)
    }

    fn needs(&self) -> ProviderNeeds {
        ProviderNeeds {
            name: "aws",
            serialize_per_node: true,
            max_batch: MAX_BATCH,
            native_move: false,
            max_read_batch: MAX_READ_BATCH,
            platform: Some(Platform::Aws),
            reads_before_adding: true,
        }
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        NodeTarget::from_provider_id(
            node_name,
            provider_id,
            instance_id(provider_id).map(str::to_owned),
        )
    }

    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        // EC2 deletes a terminated instance's primary ENI with its addresses
        // (DeleteOnTermination), lists the instance without interfaces for a while, then forgets
        // it: in every one of those states none of the IPs is attached anywhere.
        let eni = Eni {
            provider: self,
            node,
        };
        // EC2 has no etag: an Assign of an address another tool put on the ENI since our view
        // succeeds as if it were ours. Additions that are not ours are checked against the ENI
        // as it is now (one DescribeNetworkInterfaces, unless the view was read lately: a move's
        // receiving ENI is read while the IP leaves the old one), so that such an address is
        // refused (driver::foreign) instead of taken over; a change of ours alone reads nothing.
        let remembered = match known {
            Some(view) if change.needs_fresh_view() => Some(self.reread(view).await?),
            other => other.cloned(),
        };
        let done = driver::apply(&eni, &node.node_name, &self.retry, change, remembered).await?;
        Ok(done.map(|(_, view)| view))
    }

    async fn write_budget(&self, spend: Spend) {
        for api in MUTATING_APIS {
            self.bucket(api).until_available(spend).await;
        }
    }

    /// Upstream assigned to `NetworkInterfaces[0]` of DescribeInstances, in API order, which is
    /// not always device index 0: an adopted IP may sit on another ENI of the same instance.
    async fn release_from_other_interfaces(
        &self,
        node: &NodeTarget,
        ip: IpAddr,
    ) -> Result<bool, CloudError> {
        let instance = self.describe_instance(&node.instance).await?;
        let others = eni::other_interfaces_holding(&instance, ip);
        for eni_id in &others {
            tracing::warn!(node = %node.node_name, instance = %node.instance, eni = %eni_id, %ip, "unassigning an IP found on a secondary interface of the node's VM");
            self.mutate(false, family_of(ip), eni_id, &[ip]).await?;
        }
        Ok(!others.is_empty())
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        self.read_view(&node.instance).await
    }

    /// One DescribeInstances call per [`MAX_READ_BATCH`] instances (per page of the answer),
    /// paced like any other; an instance missing from the answer is not found, alone.
    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        let mut answers = Vec::with_capacity(nodes.len());
        for chunk in nodes.chunks(MAX_READ_BATCH) {
            let mut ids: Vec<String> = chunk.iter().map(|n| n.instance.0.clone()).collect();
            ids.sort_unstable();
            ids.dedup();
            let listed = match self.describe_many(&ids).await {
                Ok(listed) => listed,
                Err(error) => {
                    answers.extend(chunk.iter().map(|_| Err(error.clone())));
                    continue;
                }
            };
            let views = chunk.iter().map(|node| {
                let id = node.instance.0.as_str();
                let listed = &listed;
                async move {
                    if let Some(error) = listed.refused.get(id) {
                        return Err(error.clone());
                    }
                    match listed.found.get(id) {
                        Some(instance) => self.view_of(instance).await,
                        None => Err(CloudError::not_found(format!(
                            "EC2 instance {id} not found"
                        ))),
                    }
                }
            });
            answers.extend(futures::future::join_all(views).await);
        }
        answers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_the_provider_calls_has_ec2s_published_bucket() {
        let rate = |api| {
            let r = ec2_rate(api);
            (r.burst, r.per_second)
        };
        assert_eq!(rate("AssignPrivateIpAddresses"), (100, 5.0));
        assert_eq!(rate("UnassignPrivateIpAddresses"), (100, 5.0));
        assert_eq!(rate("AssignIpv6Addresses"), (100, 5.0));
        assert_eq!(rate("UnassignIpv6Addresses"), (50, 5.0));
        assert_eq!(rate("DescribeInstances"), (50, 10.0));
        assert_eq!(rate("DescribeNetworkInterfaces"), (50, 10.0));
        assert_eq!(rate("DescribeSubnets"), (100, 20.0));
        assert_eq!(rate("DescribeInstanceTypes"), (100, 20.0));
        for api in MUTATING_APIS {
            assert!(ec2_rate(api).per_second < ec2_rate("DescribeSubnets").per_second);
        }
    }
}
