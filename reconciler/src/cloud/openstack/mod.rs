//! The OpenStack provider: egress IPs as Neutron allowed-address-pairs on a server's port, each
//! backed by a reservation port that holds the address in the subnet's IPAM.
//!
//! Keystone v3 and Neutron are spoken in plain HTTPS + JSON (a handful of calls); no SDK type
//! leaves this module. Per change of a server: one reservation port created per IP added
//! (`409 IpAddressAlreadyAllocated` → adopt our own reservation port, refuse anyone else's), one
//! `PUT` of the server port's whole pair list guarded by `If-Match: revision_number=<n>` (412 →
//! re-read the port and retry), then the reservation ports of the IPs removed are deleted. The
//! server port's revision is remembered from our last answer, so a change costs no read. Of a
//! server's several ports, the one whose subnet holds the node's first InternalIP carries the
//! egress IPs, as upstream picks it ([`ports::choose`]). Reads of many servers list the ports
//! of each network the servers are known to be on, and those of the others by `device_id`
//! ([`reads`]); every list follows Neutron's pages.

mod client;
mod config;
mod errors;
mod floating_ip;
mod neutron;
mod ports;
mod provider_id;
mod reads;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cloudnet_shared::{Capacity, InternalIps, Platform};
use ipnet::IpNet;
use thiserror::Error;

use super::driver::{self, Interface, Memo, Retry, Written};
use super::{
    Change, CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget, ProviderNeeds,
};
pub use client::ClientError;
use client::{Http, Session};
pub use config::{Auth, CloudConfig, ConfigError, NameOrId, Secret, load_ca};
use neutron::{Created, Neutron, Pair, Port, RESERVATION_OWNER, Subnet, reservation_device};
use ports::{Chosen, Pick, ServerPort, choose};
pub use provider_id::{ProviderIdError, server_id};

/// Neutron's default `max_allowed_address_pairs`.
pub const DEFAULT_MAX_PAIRS: usize = 10;

/// Most IPs one change carries.
const MAX_BATCH: usize = 50;

/// Most servers one [`CloudProvider::egress_configs`] call reads. A network's list pages through
/// all its servers' ports whichever of them are asked for, so a drift period gathered into one
/// read lists each network once: a thousand known servers on one network are two list calls
/// ([`reads`]); smaller reads would each list the same network again.
const MAX_READ_BATCH: usize = 10_000;

/// How hard one change is retried against a stale revision or a transient failure.
const RETRY: Retry = Retry {
    min_delay: Duration::from_millis(200),
    max_delay: Duration::from_secs(5),
    max_attempts: 6,
};

/// Everything the provider needs, as loaded from flags and the mounted secret.
#[derive(Clone, Debug)]
pub struct OpenStackSettings {
    /// The `openstack` cloud of clouds.yaml.
    pub cloud: CloudConfig,
    /// The CA bundle to trust instead of the system's.
    pub ca_pem: Option<Vec<u8>>,
    /// Neutron's URL instead of the catalog's (`--platform-api-url`).
    pub network_url: Option<String>,
    /// Neutron's `max_allowed_address_pairs`.
    pub max_pairs: usize,
    /// Bound of every HTTP exchange.
    pub call_timeout: Duration,
}

/// Why the provider could not be set up.
#[derive(Debug, Error)]
pub enum OpenStackSetupError {
    /// clouds.yaml or the CA could not be read.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The HTTPS client could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl OpenStackSettings {
    /// Settings from `<secret_dir>/clouds.yaml`, the CA in `<secret_dir>/cacert` or
    /// `<config_dir>/ca-bundle.pem`, and an optional Neutron URL.
    pub fn load(
        secret_dir: &Path,
        config_dir: &Path,
        network_url: Option<&str>,
        max_pairs: usize,
    ) -> Result<Self, OpenStackSetupError> {
        Ok(Self {
            cloud: CloudConfig::load(secret_dir)?,
            ca_pem: load_ca(secret_dir, config_dir)?,
            network_url: network_url.filter(|u| !u.is_empty()).map(str::to_owned),
            max_pairs,
            call_timeout: Duration::from_secs(20),
        })
    }
}

/// The OpenStack cloud.
#[derive(Debug)]
pub struct OpenStackProvider {
    neutron: Neutron,
    max_pairs: usize,
    /// Each server's port as our last call saw it (its revision guards the next update).
    ports: Mutex<HashMap<String, ServerPort>>,
    /// Each server's node's first InternalIPs as last seen, for the calls whose target was
    /// built without the Node (from the ledger): they pick the same port.
    anchors: Mutex<HashMap<String, InternalIps>>,
    /// Subnets by id: their CIDR never changes.
    subnets: Memo<Subnet>,
    /// Where each floating IP bound to an egress IP was last seen ([`floating_ip`]).
    floating: floating_ip::Placements,
}

impl OpenStackProvider {
    /// A provider for `settings`. No call is made until the first operation.
    pub fn new(settings: &OpenStackSettings) -> Result<Self, OpenStackSetupError> {
        if !settings.cloud.verify {
            tracing::warn!(
                "clouds.yaml sets verify: false; certificates are still verified (give the CA in \
                 the secret's cacert instead)"
            );
        }
        let http = Http::new(settings.ca_pem.as_deref(), settings.call_timeout)?;
        tracing::info!(
            auth_url = %settings.cloud.auth_url,
            kind = match settings.cloud.auth {
                Auth::Password { .. } => "password",
                Auth::ApplicationCredential { .. } => "application credential",
            },
            custom_ca = settings.ca_pem.is_some(),
            "OpenStack credentials from clouds.yaml"
        );
        Ok(Self {
            neutron: Neutron {
                session: Session::new(http, settings.cloud.clone(), settings.network_url.clone()),
            },
            max_pairs: settings.max_pairs,
            ports: Mutex::new(HashMap::new()),
            anchors: Mutex::new(HashMap::new()),
            subnets: Memo::forever(),
            floating: floating_ip::Placements::default(),
        })
    }

    fn remember(&self, server: &str, state: &ServerPort) {
        self.ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(server.to_owned(), state.clone());
    }

    /// Forgets all this provider remembers of `server` (its port and its node's anchor).
    fn forget_server(&self, server: &str) {
        self.forget(server);
        self.anchors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(server);
    }

    fn forget(&self, server: &str) {
        self.ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(server);
    }

    fn cached(&self, server: &str) -> Option<ServerPort> {
        self.ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(server)
            .cloned()
    }

    async fn subnet(&self, id: &str) -> Result<Subnet, CloudError> {
        self.subnets.get(id, || self.neutron.subnet(id)).await
    }

    /// The node's InternalIPs to pick `server`'s port by: `given` (remembered for later calls
    /// without them), else the ones remembered.
    fn anchor(&self, server: &str, given: InternalIps) -> InternalIps {
        let mut anchors = self
            .anchors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if given.is_empty() {
            anchors.get(server).copied().unwrap_or_default()
        } else {
            anchors.insert(server.to_owned(), given);
            given
        }
    }

    /// The server's port, read now: of its `compute:` ports (by creation, then id), the one
    /// [`choose`] picks. A server without such a port, or a removal none of its ports holds,
    /// is [`ErrorKind::NotFound`].
    async fn read_server(&self, server: &str, pick: Pick<'_>) -> Result<ServerPort, CloudError> {
        let ports = self.neutron.ports_of(server).await?;
        self.server_port(server, ports, pick).await
    }

    /// Of `ports` (every port whose `device_id` is `server`, as Neutron just listed them), the
    /// one [`choose`] picks, remembered; see [`Self::read_server`].
    async fn server_port(
        &self,
        server: &str,
        ports: Vec<Port>,
        pick: Pick<'_>,
    ) -> Result<ServerPort, CloudError> {
        let mut ports: Vec<Port> = ports
            .into_iter()
            .filter(|p| p.device_owner.starts_with("compute:"))
            .collect();
        if ports.is_empty() {
            // The server is gone: nothing of it is kept for a call that will not come.
            self.forget_server(server);
            return Err(CloudError::not_found(format!(
                "server {server} has no port (no Neutron port with device_id={server} and a \
                 compute: owner)"
            )));
        }
        ports.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        let mut candidates = Vec::with_capacity(ports.len());
        for port in ports {
            let mut subnets: Vec<Subnet> = Vec::new();
            for fixed in &port.fixed_ips {
                if !subnets.iter().any(|s| s.id == fixed.subnet_id) {
                    subnets.push(self.subnet(&fixed.subnet_id).await?);
                }
            }
            candidates.push(ServerPort { port, subnets });
        }
        let pick = Pick {
            node: self.anchor(server, pick.node),
            ..pick
        };
        let state = match choose(server, &candidates, &pick)? {
            Chosen::Port(index) => candidates.swap_remove(index),
            Chosen::Nothing => {
                return Err(CloudError::not_found(format!(
                    "none of the {} ports of server {server} holds the IPs",
                    candidates.len()
                )));
            }
        };
        self.remember(server, &state);
        Ok(state)
    }

    /// `state`'s port, read again (subnets do not change); `pick` finds the server's port
    /// again if that one was replaced.
    async fn reread(
        &self,
        server: &str,
        state: &ServerPort,
        pick: Pick<'_>,
    ) -> Result<ServerPort, CloudError> {
        let port = match self.neutron.port(&state.port.id).await {
            Ok(port) => port,
            // The port was replaced: look the server up again.
            Err(e) if e.kind == ErrorKind::NotFound => return self.read_server(server, pick).await,
            Err(e) => return Err(e),
        };
        let state = ServerPort {
            port,
            subnets: state.subnets.clone(),
        };
        self.remember(server, &state);
        Ok(state)
    }

    fn view(&self, state: &ServerPort) -> NodeEgress {
        let v4 = state.subnets.iter().find_map(|s| match s.cidr {
            IpNet::V4(n) => Some(n.trunc()),
            IpNet::V6(_) => None,
        });
        let v6 = state.subnets.iter().find_map(|s| match s.cidr {
            IpNet::V6(n) => Some(n.trunc()),
            IpNet::V4(_) => None,
        });
        NodeEgress {
            interface: state.port.id.clone(),
            ipv4_subnet: v4,
            ipv6_subnet: v6,
            capacity: Capacity {
                ipv4: None,
                ipv6: None,
                ip: Some(i64::try_from(self.max_pairs).unwrap_or(i64::MAX)),
            },
            // Only pairs count against the limit; the port's own addresses are not pairs.
            addresses: state.pair_ips(),
            primary: Vec::new(),
        }
    }

    /// Refuses what Neutron would refuse (or what would break the node) before any call.
    fn precheck(
        &self,
        state: &ServerPort,
        add: &[IpAddr],
        remove: &[IpAddr],
    ) -> Result<(), CloudError> {
        let port = &state.port.id;
        for ip in add {
            if state
                .port
                .fixed_ips
                .iter()
                .any(|f| f.ip_address.parse::<IpAddr>().ok() == Some(*ip))
            {
                return Err(CloudError::permanent(format!(
                    "{ip} is a fixed address of port {port}; it cannot be an egress IP"
                )));
            }
            if state.subnet_of(*ip).is_none() {
                let cidrs: Vec<String> = state.subnets.iter().map(|s| s.cidr.to_string()).collect();
                return Err(CloudError::permanent(format!(
                    "{ip} is outside the subnets of port {port} ({})",
                    cidrs.join(", ")
                )));
            }
        }
        let current = state.port.allowed_address_pairs.len();
        let after = current + add.len() - remove.len().min(current);
        if !add.is_empty() && after > self.max_pairs {
            return Err(CloudError::permanent(format!(
                "port {port} holds {current} of at most {} allowed-address-pairs; {} more (from {}) \
                 do not fit (AllowedAddressPairExhausted)",
                self.max_pairs,
                add.len(),
                add.first().map(ToString::to_string).unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// Whether `server` is one of this cluster's: a server this provider has read or changed as
    /// a node's (every Node's server is read for its annotation) or remembers a port of.
    fn is_member(&self, server: &str) -> bool {
        fn known<V>(map: &Mutex<HashMap<String, V>>, server: &str) -> bool {
            map.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains_key(server)
        }
        known(&self.anchors, server) || known(&self.ports, server)
    }

    /// Makes sure `ip` is held by a reservation port of `server` in `subnet`. Another server's
    /// reservation of it is taken over only when `may_take(previous)` says so (a move from that
    /// server, or an interrupted one of ours); any other holder is foreign.
    async fn reserve(
        &self,
        server: &str,
        network: &str,
        subnet: &str,
        ip: IpAddr,
        may_take: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<(), CloudError> {
        // Twice: the port holding the IP may vanish between our create and our look-up.
        for _ in 0..2 {
            let in_use = match self
                .neutron
                .create_reservation(server, network, subnet, ip)
                .await?
            {
                Created::Reserved => return Ok(()),
                Created::InUse(e) => e,
            };
            let holders = self.neutron.ports_with_ip(network, ip).await?;
            let Some(holder) = holders.first() else {
                tracing::debug!(%ip, error = %in_use, "address freed meanwhile; reserving again");
                continue;
            };
            if holder.device_owner != RESERVATION_OWNER {
                return Err(CloudError::permanent(format!(
                    "{ip} is in use by port {} (name {:?}, device_owner {:?}, device_id {:?}), which \
                     is not an egress IP reservation; refusing to take it",
                    holder.id, holder.name, holder.device_owner, holder.device_id
                )));
            }
            if holder.device_id != reservation_device(server) {
                // The IP is moving here (an attach finishing a move that was interrupted): off
                // the other server's port first, so it is never allowed on both. Only from a
                // server of this cluster that the move names: another cluster's reservation in
                // the same network (or a server cloudnet never put the IP on) is not ours.
                let prefix = format!("{RESERVATION_OWNER}_");
                let previous = holder.device_id.strip_prefix(&prefix);
                if !previous.is_some_and(may_take) {
                    return Err(CloudError::foreign(format!(
                        "{ip} is reserved for another server (port {}, device_id {:?}) that is \
                         not one this controller moves it from; refusing to take it",
                        holder.id, holder.device_id
                    )));
                }
                if let Some(previous) = previous {
                    let pick = Pick {
                        remove: &[ip],
                        ..Pick::default()
                    };
                    match self.read_server(previous, pick).await {
                        Ok(state) if state.holds(ip) => {
                            // Boxed: update_pairs reserves through this function.
                            Box::pin(self.update_pairs(previous, state, &[], &[ip])).await?;
                        }
                        Ok(_) => {}
                        Err(e) if e.kind == ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
                tracing::info!(%ip, port = %holder.id, from = %holder.device_id, to = server,
                    "adopting another server's reservation port");
                self.neutron.set_device(&holder.id, server).await?;
            }
            return Ok(());
        }
        Err(CloudError::retryable(format!(
            "{ip}: Neutron reports it allocated but no port holds it"
        )))
    }

    /// Deletes `server`'s reservation ports of `ips`. Another server's reservation of one of them
    /// is left alone while that server allows the IP (the IP has moved on and is in use there),
    /// but deleted when it does not: a move that failed after taking the pair off the old server
    /// leaves the reservation naming it, and a delete that follows must still free the address.
    async fn release(
        &self,
        server: &str,
        network: Option<&str>,
        ips: &[IpAddr],
    ) -> Result<(), CloudError> {
        if ips.is_empty() {
            return Ok(());
        }
        let ours = reservation_device(server);
        let ports = match network {
            Some(network) if ips.len() == 1 => self.neutron.ports_with_ip(network, ips[0]).await?,
            _ => self.neutron.ports_of(&ours).await?,
        };
        let mut released: Vec<IpAddr> = Vec::new();
        let mut foreign: Vec<(IpAddr, Port)> = Vec::new();
        for port in ports {
            let held: Vec<IpAddr> = port
                .fixed_ips
                .iter()
                .filter_map(|f| f.ip_address.parse::<IpAddr>().ok())
                .filter(|ip| ips.contains(ip))
                .collect();
            if held.is_empty() || port.device_owner != RESERVATION_OWNER {
                continue;
            }
            if port.device_id == ours {
                self.neutron.delete(&port.id).await?;
                released.extend(held);
            } else {
                foreign.extend(held.into_iter().map(|ip| (ip, port.clone())));
            }
        }
        let Some(network) = network else {
            return Ok(());
        };
        // The IPs without a reservation of ours: look for one left by a failed move. (A normal
        // detach finds every IP above, so this costs no call.)
        for ip in ips.iter().filter(|ip| !released.contains(ip)) {
            let holders = if ips.len() == 1 {
                std::mem::take(&mut foreign)
                    .into_iter()
                    .map(|(_, port)| port)
                    .collect()
            } else {
                self.neutron.ports_with_ip(network, *ip).await?
            };
            for port in holders {
                if port.device_owner != RESERVATION_OWNER || port.device_id == ours {
                    continue;
                }
                let prefix = format!("{RESERVATION_OWNER}_");
                let Some(other) = port.device_id.strip_prefix(&prefix) else {
                    continue;
                };
                let pick = Pick {
                    remove: std::slice::from_ref(ip),
                    ..Pick::default()
                };
                let allowed = match self.read_server(other, pick).await {
                    Ok(state) => state.holds(*ip),
                    Err(e) if e.kind == ErrorKind::NotFound => false,
                    Err(e) => return Err(e),
                };
                if !allowed {
                    tracing::info!(%ip, port = %port.id, server = other,
                        "deleting a reservation whose server no longer allows the IP");
                    self.neutron.delete(&port.id).await?;
                }
            }
        }
        Ok(())
    }

    /// Puts `add` on and takes `remove` off `server`'s pairs in one guarded update, starting from
    /// `state` as read. Reservation ports are the caller's business.
    async fn update_pairs(
        &self,
        server: &str,
        state: ServerPort,
        add: &[IpAddr],
        remove: &[IpAddr],
    ) -> Result<(), CloudError> {
        let pairs = Pairs {
            provider: self,
            server,
            pick: Pick {
                add,
                remove,
                ..Pick::default()
            },
            reserve: false,
        };
        // The additions are a move's, whose target the engine found free of the IP or holding
        // it as ours before the move began.
        let change = Change::new(add.to_vec(), remove.to_vec()).with_ours(add.to_vec());
        driver::apply(&pairs, server, &RETRY, &change, Some(state)).await?;
        Ok(())
    }
}

/// A server's port, for one change: one update of its whole pair list guarded by its revision.
struct Pairs<'a> {
    provider: &'a OpenStackProvider,
    server: &'a str,
    /// How to find the server's port again if it was replaced.
    pick: Pick<'a>,
    /// Whether the IPs added get their reservation ports first.
    reserve: bool,
}

#[async_trait]
impl Interface for Pairs<'_> {
    type State = ServerPort;

    async fn read(&self, last: Option<&ServerPort>) -> Result<ServerPort, CloudError> {
        match last {
            Some(state) => self.provider.reread(self.server, state, self.pick).await,
            None => self.provider.read_server(self.server, self.pick).await,
        }
    }

    async fn describe(&self, state: &ServerPort) -> Result<NodeEgress, CloudError> {
        Ok(self.provider.view(state))
    }

    async fn write(
        &self,
        state: &ServerPort,
        change: &Change,
    ) -> Result<Written<ServerPort>, CloudError> {
        let add: Vec<IpAddr> = change
            .add
            .iter()
            .copied()
            .filter(|ip| !state.holds(*ip))
            .collect();
        let remove: Vec<IpAddr> = change
            .remove
            .iter()
            .copied()
            .filter(|ip| state.holds(*ip))
            .collect();
        if add.is_empty() && remove.is_empty() {
            return Ok(Written::Unchanged);
        }
        self.provider.precheck(state, &add, &remove)?;
        if self.reserve {
            for ip in &add {
                let subnet = state
                    .subnet_of(*ip)
                    .map(|s| s.id.clone())
                    .unwrap_or_default();
                // An interrupted move of ours ends here: the ledger recorded the IP on this
                // server before the move's call, and it is taken from a server of the cluster.
                let ours = change.ours.contains(ip);
                let may_take = |previous: &str| ours && self.provider.is_member(previous);
                self.provider
                    .reserve(self.server, &state.port.network_id, &subnet, *ip, &may_take)
                    .await?;
            }
        }
        let mut pairs: Vec<Pair> = state
            .port
            .allowed_address_pairs
            .iter()
            .filter(|p| p.ip().is_none_or(|ip| !remove.contains(&ip)))
            .cloned()
            .collect();
        pairs.extend(add.iter().map(|ip| Pair {
            ip_address: ip.to_string(),
            mac_address: None,
        }));
        let port = self
            .provider
            .neutron
            .set_pairs(&state.port.id, state.port.revision_number, &pairs)
            .await?;
        let after = ServerPort {
            port,
            subnets: state.subnets.clone(),
        };
        self.provider.remember(self.server, &after);
        Ok(Written::Changed(after))
    }

    fn forget(&self) {
        self.provider.forget(self.server);
    }
}

#[async_trait]
impl CloudProvider for OpenStackProvider {
    fn public_ips(self: Arc<Self>) -> Option<Arc<dyn crate::cloud::public_ip::PublicIps>> {
        Some(self)
    }

    fn forget_vm(&self, instance: &InstanceId) {
        self.forget_server(&instance.0);
    }

    fn needs(&self) -> ProviderNeeds {
        ProviderNeeds {
            name: "openstack",
            // Every update is guarded by the port's revision: overlapping ones would only 412.
            serialize_per_node: true,
            max_batch: MAX_BATCH,
            native_move: true,
            max_read_batch: MAX_READ_BATCH,
            platform: Some(Platform::OpenStack),
            reads_before_adding: false,
        }
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        NodeTarget::from_provider_id(node_name, provider_id, server_id(provider_id))
    }

    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        let server = node.instance.0.as_str();
        let add = driver::dedup(&change.add);
        let remove = driver::dedup(&change.remove);
        let pairs = Pairs {
            provider: self,
            server,
            pick: Pick {
                node: node.internal_ips,
                remove: &remove,
                add: &add,
            },
            reserve: true,
        };
        let remembered = known.and_then(|_| self.cached(server));
        let change = Change::new(add.clone(), remove.clone()).with_ours(change.ours.clone());
        // A server that is gone (or none of whose ports holds them) holds none of the IPs; its
        // reservation ports still go.
        match driver::apply(&pairs, &node.node_name, &RETRY, &change, remembered).await? {
            None => {
                self.release(server, None, &remove).await?;
                Ok(None)
            }
            Some((state, view)) => {
                self.release(server, Some(&state.port.network_id), &remove)
                    .await?;
                Ok(Some(view))
            }
        }
    }

    async fn move_ips(
        &self,
        from: &NodeTarget,
        to: &NodeTarget,
        ips: &[IpAddr],
    ) -> Result<(), CloudError> {
        let ips = driver::dedup(ips);
        let (source, target) = (from.instance.0.as_str(), to.instance.0.as_str());
        // Off the old port first, so the IP is never allowed on both.
        let off = Pick {
            node: from.internal_ips,
            remove: &ips,
            add: &[],
        };
        match self.read_server(source, off).await {
            Ok(state) => {
                self.update_pairs(source, state, &[], &ips).await?;
            }
            Err(e) if e.kind == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let on = Pick {
            node: to.internal_ips,
            remove: &[],
            add: &ips,
        };
        let state = self.read_server(target, on).await?;
        self.precheck(&state, &ips, &[])?;
        for ip in &ips {
            let subnet = state
                .subnet_of(*ip)
                .map(|s| s.id.clone())
                .unwrap_or_default();
            // Re-points the old server's reservation port (409 → adopt), or creates one.
            let from_source = |previous: &str| previous == source;
            self.reserve(target, &state.port.network_id, &subnet, *ip, &from_source)
                .await?;
        }
        self.update_pairs(target, state, &ips, &[]).await?;
        Ok(())
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        let state = self.read_server(&node.instance.0, read_pick(node)).await?;
        Ok(self.view(&state))
    }

    /// One port list per network of the servers known, `device_id` lists for the others
    /// ([`reads`]).
    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        self.read_many(nodes).await
    }
}

/// What a read picks the server's port by: the node's InternalIPs alone.
fn read_pick(node: &NodeTarget) -> Pick<'static> {
    Pick {
        node: node.internal_ips,
        ..Pick::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test]
    async fn a_server_found_gone_leaves_no_anchor_behind() {
        let cloud = CloudConfig::parse(
            std::path::Path::new("clouds.yaml"),
            "clouds:\n  openstack:\n    auth:\n      auth_url: http://127.0.0.1:1/v3\n      \
             username: u\n      password: p\n      project_name: c\n",
        )
        .unwrap();
        let provider = OpenStackProvider::new(&OpenStackSettings {
            cloud,
            ca_pem: None,
            network_url: None,
            max_pairs: 10,
            call_timeout: Duration::from_secs(1),
        })
        .unwrap();
        let node = InternalIps {
            ipv4: Some("10.0.0.5".parse().unwrap()),
            ipv6: None,
        };
        assert_eq!(provider.anchor("s-1", node), node);
        assert_eq!(provider.anchors.lock().unwrap().len(), 1);
        let error = provider
            .server_port("s-1", Vec::new(), Pick::default())
            .await
            .unwrap_err();
        assert_eq!(error.kind, crate::cloud::ErrorKind::NotFound);
        assert!(provider.anchors.lock().unwrap().is_empty());
        assert!(provider.ports.lock().unwrap().is_empty());
    }
}
