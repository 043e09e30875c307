//! The seam to a cloud: one batch-shaped trait every provider implements, and the plain data it
//! speaks. No SDK type crosses this module's boundary; each provider lives in its own submodule.
//!
//! The trait is object-safe (`Arc<dyn CloudProvider>`), because the provider is chosen at run time
//! from `--platform-type`. Rust's native `async fn` in traits is not `dyn`-compatible, so the
//! methods go through `async_trait`, which boxes the returned futures; one allocation per cloud
//! call is noise next to a network round trip.

#[cfg(feature = "aws")]
pub mod aws;
#[cfg(feature = "azure")]
pub mod azure;
pub mod driver;
#[cfg(feature = "gcp")]
pub mod gcp;
#[cfg(any(test, feature = "memory-cloud"))]
pub mod memory;
pub mod openstack;
pub mod pace;
pub mod public_ip;
pub mod reread;

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use cloudnet_shared::{Capacity, InternalIps, Platform};
use ipnet::{Ipv4Net, Ipv6Net};
use thiserror::Error;

pub use pace::Spend;

/// The cloud's identity of a node's VM, resolved once from the Node's `spec.providerID`.
///
/// The reconciler records it on the object when it attaches (annotation
/// [`crate::INSTANCE_ANNOTATION`]) so that detaching still works after the Node object is gone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub String);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything a provider needs to act on one node's VM.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeTarget {
    /// `metadata.name` of the Node (for logs and call records; may name a vanished Node).
    pub node_name: String,
    /// The Node's `spec.providerID` as last seen (empty when only the recorded instance is known).
    pub provider_id: String,
    /// The VM the IPs go on.
    pub instance: InstanceId,
    /// The Node's first InternalIP of each family, when the target was built from the Node
    /// (empty when only the recorded instance is known). OpenStack picks the server's port by it.
    pub internal_ips: InternalIps,
}

impl NodeTarget {
    /// The target of Node `node_name` on VM `instance`, its InternalIPs not known yet.
    pub fn new(node_name: &str, provider_id: &str, instance: String) -> Self {
        Self {
            node_name: node_name.to_owned(),
            provider_id: provider_id.to_owned(),
            instance: InstanceId(instance),
            internal_ips: InternalIps::default(),
        }
    }

    /// The target of Node `node_name` on the VM its providerID names, or a permanent error naming
    /// the node when the providerID names none of this cloud's VMs.
    pub fn from_provider_id<E: fmt::Display>(
        node_name: &str,
        provider_id: &str,
        instance: Result<String, E>,
    ) -> Result<Self, CloudError> {
        instance
            .map(|instance| Self::new(node_name, provider_id, instance))
            .map_err(|e| CloudError::permanent(format!("node {node_name}: {e}")))
    }
}

/// What the cloud says about a node's primary interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeEgress {
    /// Cloud identifier or name of the primary interface (ENI id, `nic0`, NIC name, port id).
    pub interface: String,
    /// The IPv4 subnet of the interface, if it has one.
    pub ipv4_subnet: Option<Ipv4Net>,
    /// The IPv6 subnet of the interface, if it has one.
    pub ipv6_subnet: Option<Ipv6Net>,
    /// The cloud's limit per bucket for this interface, before subtracting anything.
    pub capacity: Capacity,
    /// Every address on the interface that counts against `capacity` (the node's own primary
    /// address included). The annotation controller subtracts those no object manages.
    pub addresses: Vec<IpAddr>,
    /// The node's own addresses as the cloud reports them on the interface (AWS: the primary
    /// private IPv4 and the primary IPv6; Azure: the primary ip-configuration's; GCP: the
    /// network address of each alias range wider than /32; OpenStack: none, the port's fixed
    /// IPs are not pairs): never detached, and never taken as an egress IP. Every other address
    /// cloudnet did not attach is protected by the attachment ledger ([`Change::ours`]).
    pub primary: Vec<IpAddr>,
}

impl NodeEgress {
    /// Whether `ip` is on the interface.
    pub fn holds(&self, ip: IpAddr) -> bool {
        self.addresses.contains(&ip)
    }

    /// The view after `change` was applied in full.
    #[must_use]
    pub fn after(mut self, change: &Change) -> Self {
        self.addresses.retain(|ip| !change.remove.contains(ip));
        for ip in &change.add {
            if !self.addresses.contains(ip) {
                self.addresses.push(*ip);
            }
        }
        self
    }
}

/// What one call changes on a VM's primary interface: IPs to put on and IPs to take off.
///
/// An IP appears at most once. Providers whose API replaces the whole list (GCP aliases, Azure
/// ip-configurations) carry both in one request; EC2 needs one request per kind and family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// IPs to attach. One the interface holds already is success only when listed in
    /// [`Self::ours`]; any other is foreign, and the change is refused ([`ErrorKind::Foreign`]).
    pub add: Vec<IpAddr>,
    /// IPs to detach ("not attached" is success). The node's own addresses
    /// ([`NodeEgress::primary`]) are refused ([`ErrorKind::Foreign`]).
    pub remove: Vec<IpAddr>,
    /// Of `add`, the IPs this controller attached to this VM before (the attachment ledger
    /// recorded them there before this change: a crash or a lost answer after the call) or
    /// adopts (assigned by an earlier controller): found on the interface, they are done.
    pub ours: Vec<IpAddr>,
    /// Whether the view passed with this change was read from the cloud lately
    /// ([`READ_LATELY`]): a provider that reads the interface before additions not ours
    /// ([`ProviderNeeds::reads_before_adding`]) checks them against that view instead.
    pub read_lately: bool,
}

/// How old a read of an interface may be and still count as the interface as it is now, for a
/// cloud with no etag ([`ProviderNeeds::reads_before_adding`]): long enough for a move's
/// receiving VM, read when the IP starts to leave the old one, to need no read of its own when
/// the IP arrives; short enough that an address another tool puts there meanwhile is as
/// unlikely as one put between a read and the call that follows it.
pub const READ_LATELY: std::time::Duration = std::time::Duration::from_secs(2);

impl Change {
    /// A change that adds `add` and removes `remove`, none of the additions known as ours.
    pub fn new(add: Vec<IpAddr>, remove: Vec<IpAddr>) -> Self {
        Self {
            add,
            remove,
            ours: Vec::new(),
            read_lately: false,
        }
    }

    /// The same change, the additions of `ours` known as this controller's.
    #[must_use]
    pub fn with_ours(mut self, ours: Vec<IpAddr>) -> Self {
        self.ours = ours;
        self
    }

    /// The same change, its view known as read lately or not ([`Self::read_lately`]).
    #[must_use]
    pub fn with_read_lately(mut self, read_lately: bool) -> Self {
        self.read_lately = read_lately;
        self
    }

    /// Whether a cloud with no etag must read the interface before this change: it adds an IP
    /// not known as ours, and its view was not read lately ([`Self::read_lately`]).
    pub fn needs_fresh_view(&self) -> bool {
        !self.read_lately && self.add.iter().any(|ip| !self.ours.contains(ip))
    }

    /// Every IP of the change, additions first.
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.add.iter().chain(&self.remove).copied()
    }

    /// How many IPs the change carries.
    pub fn len(&self) -> usize {
        self.add.len() + self.remove.len()
    }

    /// Whether the change carries no IP.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}

/// What the engine needs to know about how to drive a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderNeeds {
    /// Provider name for metrics and logs (`aws`, `memory`, ...): a bounded label value.
    pub name: &'static str,
    /// Whether mutations of one node's interface must not overlap (etag/fingerprint clouds, and
    /// EC2, which rejects concurrent assignments on one ENI).
    pub serialize_per_node: bool,
    /// Most IPs one [`CloudProvider::apply`] call may carry; the engine splits larger batches.
    pub max_batch: usize,
    /// Whether [`CloudProvider::move_ips`] is implemented (OpenStack keeps the reservation port).
    pub native_move: bool,
    /// Most VMs one [`CloudProvider::egress_configs`] call may carry; the engine splits larger
    /// gatherings (1 for a provider that reads one VM at a time).
    pub max_read_batch: usize,
    /// The platform whose capacity model applies (`None` lets the annotation keys decide).
    pub platform: Option<Platform>,
    /// Whether [`CloudProvider::apply`] reads the interface before additions not ours unless
    /// its view was read lately ([`Change::read_lately`]; EC2, which has no etag): the engine
    /// then reads a move's receiving VM while the IP leaves the old one, off the move's path.
    pub reads_before_adding: bool,
}

/// How the engine should react to a failed cloud call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The cloud asked us to slow down (HTTP 429, `RequestLimitExceeded`): back off and retry.
    Throttled,
    /// A timeout, 5xx or similar: retry soon.
    Retryable,
    /// The write was made from a stale state (etag, fingerprint, revision): read and retry at
    /// once. The driver resolves it; the engine sees one it could not as [`Self::Retryable`].
    Conflict,
    /// The request itself is wrong (IP outside the subnet, IP in use elsewhere, over the limit):
    /// report it in the condition and retry only slowly, in case the world changes.
    Permanent,
    /// The instance (or its interface) does not exist.
    NotFound,
    /// The provider does not implement the operation.
    Unsupported,
    /// The address is not this controller's to touch: an addition the interface already holds
    /// that cloudnet did not attach (another controller or tool put it there), the node's own
    /// address, or (OpenStack) another cluster's reservation. Refused before any mutating call.
    Foreign,
}

impl ErrorKind {
    /// A bounded label value for metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Throttled => "throttled",
            Self::Retryable => "retryable",
            Self::Conflict => "conflict",
            Self::Permanent => "permanent",
            Self::NotFound => "not_found",
            Self::Unsupported => "unsupported",
            Self::Foreign => "foreign",
        }
    }
}

/// A failed cloud call, or one IP's failure inside a batch.
///
/// `message` is shown in the object's condition and in events: providers must keep credentials,
/// signed URLs and tokens out of it.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub struct CloudError {
    /// What the engine should do about it.
    pub kind: ErrorKind,
    /// The cloud's error text, safe to show to cluster users.
    pub message: String,
    /// How long the cloud asked us to wait before trying again (`Retry-After`), if it said.
    pub retry_after: Option<Duration>,
}

impl fmt::Display for CloudError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        match self.retry_after {
            Some(wait) => write!(f, " (retry after {}s)", wait.as_secs()),
            None => Ok(()),
        }
    }
}

impl CloudError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same error, with the wait the cloud asked for.
    #[must_use]
    pub fn with_retry_after(self, retry_after: Option<Duration>) -> Self {
        Self {
            retry_after,
            ..self
        }
    }

    /// The write was made from a stale state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }

    /// The cloud throttled the call.
    pub fn throttled(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Throttled, message)
    }

    /// A transient failure worth retrying soon.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Retryable, message)
    }

    /// The cloud refused the request as such.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Permanent, message)
    }

    /// The instance or interface does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// The provider does not implement the operation.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    /// The address is not this controller's to touch ([`ErrorKind::Foreign`]).
    pub fn foreign(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Foreign, message)
    }
}

/// A cloud that can put secondary private IPs on a VM's primary interface and take them off.
///
/// Implementations must: act on the primary interface only; wait until the cloud reports a change
/// done before returning; bound every call with a timeout; be safe to call again after a crash.
#[async_trait]
pub trait CloudProvider: Send + Sync + 'static {
    /// How the engine must drive this provider.
    fn needs(&self) -> ProviderNeeds;

    /// Forgets what this provider remembers of `instance` (a NIC, a port, an anchor): the engine
    /// calls it when it drops its own view of a VM that nothing refers to any more, which may
    /// outlive its Node for good. A provider that keeps nothing per VM needs no override.
    fn forget_vm(&self, _instance: &InstanceId) {}

    /// This cloud's public addresses that follow egress IPs (docs/public-ips.md), when the
    /// provider implements them; the `EgressPublicIP` controller runs only then.
    fn public_ips(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn public_ip::PublicIps>> {
        None
    }

    /// Resolves a Node's `spec.providerID` to the VM it names (parsing only where possible).
    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError>;

    /// Applies `change` to the node's primary interface in as few calls as the API allows, and
    /// returns the interface as it is afterwards.
    ///
    /// `known` is the engine's cached view of the interface, from this provider's last answer for
    /// the VM; a provider may use it instead of reading the interface first (it is `None` after
    /// a failed call or when nothing is cached). The call either succeeds for every IP or fails
    /// as a whole: the engine finds the IP to blame by splitting the change, so a provider only
    /// reports call-level errors.
    ///
    /// A VM that no longer exists, that has no primary interface, or whose primary interface is
    /// gone holds none of the IPs: a change that only removes is then a success with no view
    /// (`Ok(None)`), not a [`ErrorKind::NotFound`] error (a move away from a dead node, or a
    /// delete, must not retry forever). Adding to such a VM stays an error, and so does
    /// [`Self::egress_config`] on it.
    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError>;

    /// Resolves once the provider's rate limit would let a mutating call start now, spending as
    /// `spend` says. The engine waits on it before taking a batch, so that IPs arriving meanwhile
    /// join that batch.
    async fn write_budget(&self, spend: Spend) {
        let _ = spend;
    }

    /// Moves `ips` from one node to another as one cloud operation, never leaving an IP on both.
    ///
    /// Only called when [`ProviderNeeds::native_move`] is set; the default refuses.
    async fn move_ips(
        &self,
        from: &NodeTarget,
        to: &NodeTarget,
        ips: &[IpAddr],
    ) -> Result<(), CloudError> {
        let _ = (from, to, ips);
        Err(CloudError::unsupported(format!(
            "{} has no native move",
            self.needs().name
        )))
    }

    /// Takes `ip` off every interface of `node`'s VM other than its primary one, and says
    /// whether any held it. The engine calls it only at adoption, when the primary interface does
    /// not show an IP assigned without a record: the upstream controller may have put it on
    /// another interface of the same VM. One read of the VM's interfaces, never one per IP in
    /// the normal path.
    ///
    /// The default finds nothing: only a provider whose upstream could have chosen another
    /// interface overrides it (AWS: upstream took `NetworkInterfaces[0]` in API order, which is
    /// not always device index 0). GCP: upstream always used `nic0`, the primary. Azure:
    /// upstream took the NIC flagged primary (our choice too) and only fell back to the first
    /// listed when no flag was visible, where this reconciler refuses to pick any. OpenStack:
    /// both take the port whose subnet holds the node's first InternalIP for the annotation;
    /// upstream attached to the first port whose network holds the IP, which is that port for
    /// every IP in the annotated subnet (upstream refuses a node whose ports share a CIDR), and
    /// this reconciler refuses an IP outside it.
    async fn release_from_other_interfaces(
        &self,
        node: &NodeTarget,
        ip: IpAddr,
    ) -> Result<bool, CloudError> {
        let _ = (node, ip);
        Ok(false)
    }

    /// Reads the primary interface's subnets, capacity and current addresses from the cloud.
    ///
    /// The engine calls it when it has no view of the VM (a new node, a changed providerID, after
    /// a failed call) and on the drift period; every other answer comes from its cache.
    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError>;

    /// Reads the primary interfaces of many VMs in as few calls as the cloud allows: one answer
    /// per node, in the order given. The engine gathers the reads it needs at start-up, after a
    /// leader change, on the drift period and for VMs it has no view of into such batches.
    ///
    /// The default reads each VM on its own, [`PER_VM_READS`] at a time; a provider whose API
    /// lists many VMs in one call overrides it (and says how many it takes in
    /// [`ProviderNeeds::max_read_batch`]). A VM missing from a list answer is
    /// [`ErrorKind::NotFound`], as for [`Self::egress_config`].
    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        read_each(self, nodes).await
    }
}

/// `provider`'s single-VM reads of `nodes`, [`PER_VM_READS`] at a time, in the order given: the
/// default [`CloudProvider::egress_configs`], and a batching provider's way for VMs its list
/// call cannot answer.
pub async fn read_each<P: CloudProvider + ?Sized>(
    provider: &P,
    nodes: &[NodeTarget],
) -> Vec<Result<NodeEgress, CloudError>> {
    use futures::StreamExt as _;
    // Built before streaming: a closure inside the stream would make the future not `Send`
    // (rustc cannot prove it for every lifetime of the closure's argument).
    let reads: Vec<_> = nodes
        .iter()
        .map(|node| provider.egress_config(node))
        .collect();
    futures::stream::iter(reads)
        .buffered(PER_VM_READS)
        .collect()
        .await
}

/// How many single-VM reads the default [`CloudProvider::egress_configs`] keeps in flight.
pub const PER_VM_READS: usize = 8;

/// Single-kind shorthands over [`CloudProvider::apply`] (without a cached view), for tests and
/// tools that act on one kind of change at a time.
#[async_trait]
pub trait CloudProviderExt: CloudProvider {
    /// Attaches `ips` in one change.
    async fn attach(
        &self,
        node: &NodeTarget,
        ips: &[IpAddr],
    ) -> Result<Option<NodeEgress>, CloudError> {
        let change = Change::new(ips.to_vec(), Vec::new());
        self.apply(node, &change, None).await
    }

    /// Detaches `ips` in one change.
    async fn detach(
        &self,
        node: &NodeTarget,
        ips: &[IpAddr],
    ) -> Result<Option<NodeEgress>, CloudError> {
        let change = Change::new(Vec::new(), ips.to_vec());
        self.apply(node, &change, None).await
    }
}

impl<T: CloudProvider + ?Sized> CloudProviderExt for T {}
