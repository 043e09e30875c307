//! Reads of many servers at once ([`CloudProvider::egress_configs`]), in as few port lists as
//! Neutron allows.
//!
//! A server whose port the provider remembers is read with the others on that port's network:
//! one list of the network's ports of that `device_owner` (`compute:nova`), [`PAGE`] ports a
//! call, so that a drift period of a thousand servers on one network costs two calls. The
//! others (at start-up, after a leader change) are listed by `device_id`, [`MAX_DEVICE_IDS`]
//! servers a call, which teaches the provider their network for the next time.
//!
//! A network's list holds only that network's server ports: reservation ports and other
//! owners' ports are not in it, but the ports of other projects' servers on a shared network
//! are (their pages cost calls too). So it settles a server only when its ports there hold the
//! one [`choose`] picks by the node's InternalIPs; a server with no port there (gone, or moved)
//! or whose choice fails there is read by `device_id`, and gets exactly the answer of a read
//! of its own. Two things only a `device_id` read sees: a port of the server on another network
//! whose subnet also holds the node's InternalIP (the choice is then ambiguous), and ports on
//! other networks of a server whose node's InternalIPs are unknown.
//!
//! [`CloudProvider::egress_configs`]: crate::cloud::CloudProvider::egress_configs
//! [`choose`]: super::ports::choose
//! [`PAGE`]: super::neutron::PAGE

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;

use super::neutron::Port;
use super::{OpenStackProvider, read_pick};
use crate::cloud::driver;
use crate::cloud::{CloudError, NodeEgress, NodeTarget};

/// Most servers one `device_id` list names (`device_id=<uuid>&`, 47 characters each): about
/// 3 KB of query, so that the request line stays inside 4 KB, the smallest default of the
/// servers Neutron runs under (gunicorn's `limit_request_line`, uWSGI's `buffer-size`).
pub const MAX_DEVICE_IDS: usize = 64;

/// List calls of one read that run at once (as many as the engine ran when it gathered reads
/// [`MAX_DEVICE_IDS`] servers a call).
const LISTS_IN_FLIGHT: usize = 4;

/// One server's answer.
type Answer = Result<NodeEgress, CloudError>;

/// A network and a `device_owner`: the servers whose remembered port has both are listed
/// together.
type Group = (String, String);

impl OpenStackProvider {
    /// One answer per node, in order; see the module's header.
    pub(super) async fn read_many(&self, nodes: &[NodeTarget]) -> Vec<Answer> {
        let mut groups: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
        let mut by_device: Vec<usize> = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            match self.cached(&node.instance.0) {
                Some(state) => groups
                    .entry((state.port.network_id, state.port.device_owner))
                    .or_default()
                    .push(i),
                None => by_device.push(i),
            }
        }
        let mut answers = driver::Answers::new(nodes.len());
        let lists = groups
            .into_iter()
            .map(|(group, members)| self.read_group(nodes, group, members));
        let mut lists = futures::stream::iter(lists).buffer_unordered(LISTS_IN_FLIGHT);
        while let Some((settled, unsettled)) = lists.next().await {
            for (i, answer) in settled {
                answers.set(i, answer);
            }
            by_device.extend(unsettled);
        }
        by_device.sort_unstable();
        let chunks: Vec<Vec<usize>> = by_device
            .chunks(MAX_DEVICE_IDS)
            .map(<[usize]>::to_vec)
            .collect();
        let lists = chunks
            .into_iter()
            .map(|chunk| self.read_devices(nodes, chunk));
        let mut lists = futures::stream::iter(lists).buffer_unordered(LISTS_IN_FLIGHT);
        while let Some(settled) = lists.next().await {
            for (i, answer) in settled {
                answers.set(i, answer);
            }
        }
        // Every server was answered by a list: none is left to a single read.
        answers.finish(self, nodes).await
    }

    /// The nodes `members` of `group` from one list of the group's ports: the answers it
    /// settles, and the nodes left for a `device_id` read. A failed list fails every member.
    async fn read_group(
        &self,
        nodes: &[NodeTarget],
        (network, owner): Group,
        members: Vec<usize>,
    ) -> (Vec<(usize, Answer)>, Vec<usize>) {
        let ports = match self.neutron.ports_on(&network, &owner).await {
            Ok(ports) => ports,
            Err(e) => {
                let failed = members.into_iter().map(|i| (i, Err(e.clone()))).collect();
                return (failed, Vec::new());
            }
        };
        let by_server = by_server(ports);
        let mut settled = Vec::with_capacity(members.len());
        let mut unsettled = Vec::new();
        for i in members {
            let node = &nodes[i];
            let server = node.instance.0.as_str();
            let Some(ports) = by_server.get(server) else {
                unsettled.push(i);
                continue;
            };
            // Without the node's InternalIPs a single port is chosen as it is: only a read of
            // all the server's ports knows it is the only one.
            if self.anchor(server, node.internal_ips).is_empty() {
                unsettled.push(i);
                continue;
            }
            match self
                .server_port(server, ports.clone(), read_pick(node))
                .await
            {
                Ok(state) => settled.push((i, Ok(self.view(&state)))),
                Err(e) => {
                    tracing::debug!(server, %network, error = %e,
                        "not settled by its network's port list; reading it by device_id");
                    unsettled.push(i);
                }
            }
        }
        (settled, unsettled)
    }

    /// The nodes `chunk` from one list of their servers' ports (`device_id` repeated); a server
    /// none of whose ports the list holds does not exist. A failed list fails every node.
    async fn read_devices(&self, nodes: &[NodeTarget], chunk: Vec<usize>) -> Vec<(usize, Answer)> {
        let mut servers: Vec<&str> = chunk
            .iter()
            .map(|&i| nodes[i].instance.0.as_str())
            .collect();
        servers.sort_unstable();
        servers.dedup();
        let by_server = match self.neutron.ports_of_many(&servers).await {
            Ok(ports) => by_server(ports),
            Err(e) => return chunk.iter().map(|&i| (i, Err(e.clone()))).collect(),
        };
        let mut answers = Vec::with_capacity(chunk.len());
        for i in chunk {
            let node = &nodes[i];
            let server = node.instance.0.as_str();
            let ports = by_server.get(server).cloned().unwrap_or_default();
            let answer = self.server_port(server, ports, read_pick(node)).await;
            answers.push((i, answer.map(|state| self.view(&state))));
        }
        answers
    }
}

/// `ports` by their `device_id`.
fn by_server(ports: Vec<Port>) -> HashMap<String, Vec<Port>> {
    let mut by_server: HashMap<String, Vec<Port>> = HashMap::new();
    for port in ports {
        by_server
            .entry(port.device_id.clone())
            .or_default()
            .push(port);
    }
    by_server
}
