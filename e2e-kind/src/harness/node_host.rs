//! A node's host for the egress gateways' benchmark and tests: a network namespace of its own
//! (a thread that left the process's namespace with `unshare(CLONE_NEWNET)`; the namespace goes
//! with the thread, so nothing is left under `/run/netns`) holding a veth pair whose `eth0`
//! carries the node's address in its cloud subnet, and the real node agent (`cloudnet-node`, its
//! library) on that namespace, which can be stopped, as a powered-off VM's agent stops, and
//! started again. Needs root (CAP_SYS_ADMIN for the namespace, CAP_NET_ADMIN in it), as the
//! agent's own tests do.

use std::fs::File;
use std::net::IpAddr;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use cloudnet_node::metrics::Metrics;
use cloudnet_node::netlink::Netlink;
use cloudnet_node::plan::{Host, HostAddress};
use cloudnet_node::{Settings, run};
use futures::TryStreamExt;
use nix::sched::{CloneFlags, setns, unshare};
use rtnetlink::{Handle, LinkUnspec, LinkVeth};
use tokio::sync::{mpsc, oneshot};

/// The device the node's address is on, as a VM's first interface.
pub const DEVICE: &str = "eth0";

/// What the host's thread is asked to do.
enum Command {
    /// Start the agent (nothing when it runs).
    Start,
    /// Stop the agent and answer once it returned (nothing when it is stopped).
    Stop(oneshot::Sender<()>),
    /// Answer with the namespace's links and addresses.
    Read(oneshot::Sender<Result<Host>>),
}

/// One node's namespace and agent; dropping it stops both.
pub struct NodeHost {
    node: String,
    commands: mpsc::UnboundedSender<Command>,
}

impl NodeHost {
    /// Sets up the namespace with `address/prefix_len` on [`DEVICE`] and starts the agent of
    /// `settings.node`, acting with `client` (its requests leave from the process's namespace).
    pub async fn start(
        client: kube::Client,
        settings: Settings,
        address: IpAddr,
        prefix_len: u8,
    ) -> Result<Self> {
        let node = settings.node.clone();
        let (commands, receiver) = mpsc::unbounded_channel();
        let (ready_tx, ready) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("host-{node}"))
            .spawn(move || host_thread(client, settings, address, prefix_len, receiver, ready_tx))
            .context("spawning a node host's thread")?;
        ready
            .await
            .map_err(|_| anyhow!("node host {node}: its thread ended during set-up"))??;
        let host = Self { node, commands };
        host.start_agent()?;
        Ok(host)
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Starts the agent again after [`NodeHost::stop_agent`]: it converges from the API alone.
    pub fn start_agent(&self) -> Result<()> {
        self.commands
            .send(Command::Start)
            .map_err(|_| anyhow!("node host {}: its thread ended", self.node))
    }

    /// Stops the agent, as when its VM is powered off: no more heartbeats, the addresses stay.
    pub async fn stop_agent(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Stop(tx))
            .map_err(|_| anyhow!("node host {}: its thread ended", self.node))?;
        rx.await
            .map_err(|_| anyhow!("node host {}: its thread ended", self.node))
    }

    /// Every address in the namespace.
    pub async fn addresses(&self) -> Result<Vec<HostAddress>> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Read(tx))
            .map_err(|_| anyhow!("node host {}: its thread ended", self.node))?;
        Ok(rx
            .await
            .map_err(|_| anyhow!("node host {}: its thread ended", self.node))??
            .addresses)
    }

    /// Whether `ip` is on [`DEVICE`] as the agent adds it: a host address carrying its mark.
    pub async fn holds(&self, ip: IpAddr) -> Result<bool> {
        Ok(self.holding(&[ip]).await? == 1)
    }

    /// How many of `ips` are on the namespace's devices as the agent adds them, from one read.
    pub async fn holding(&self, ips: &[IpAddr]) -> Result<usize> {
        let addresses = self.addresses().await?;
        Ok(ips
            .iter()
            .filter(|ip| {
                addresses.iter().any(|a| {
                    a.ip == **ip
                        && a.ours
                        && a.prefix_len == cloudnet_node::netlink::host_prefix(**ip)
                })
            })
            .count())
    }
}

/// The host's thread: the namespace, then a current-thread runtime serving the commands until
/// the [`NodeHost`] is dropped.
fn host_thread(
    client: kube::Client,
    settings: Settings,
    address: IpAddr,
    prefix_len: u8,
    mut commands: mpsc::UnboundedReceiver<Command>,
    ready: oneshot::Sender<Result<()>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(anyhow!("a node host's runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let namespace = match Namespace::create(address, prefix_len).await {
            Ok(namespace) => namespace,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let mut running: Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)> = None;
        while let Some(command) = commands.recv().await {
            match command {
                Command::Start if running.is_none() => match namespace.connect() {
                    Ok(netlink) => {
                        running = Some(spawn_agent(client.clone(), settings.clone(), netlink));
                    }
                    Err(e) => tracing::error!(node = %settings.node, "node host: {e:#}"),
                },
                Command::Start => {}
                Command::Stop(done) => {
                    if let Some((stop, task)) = running.take() {
                        let _ = stop.send(());
                        let _ = task.await;
                    }
                    let _ = done.send(());
                }
                Command::Read(answer) => {
                    let host = match namespace.connect() {
                        Ok(netlink) => netlink.host().await.map_err(anyhow::Error::from),
                        Err(e) => Err(e),
                    };
                    let _ = answer.send(host);
                }
            }
        }
    });
}

/// Runs the agent on its own task until told to stop.
fn spawn_agent(
    client: kube::Client,
    settings: Settings,
    netlink: Netlink,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::task::spawn(async move {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let node = settings.node.clone();
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = run(client, netlink, settings, metrics, Arc::default(), shutdown).await {
            tracing::error!(%node, "node agent: {e}");
        }
    });
    (stop, task)
}

/// The node's namespace, and the process's to come back to.
struct Namespace {
    process: File,
    node: File,
}

impl Namespace {
    /// Leaves the process's namespace for a new one, sets up [`DEVICE`] (with `address`), its
    /// veth peer and `lo`, and comes back.
    async fn create(address: IpAddr, prefix_len: u8) -> Result<Self> {
        let process = File::open("/proc/thread-self/ns/net").context("the process's namespace")?;
        unshare(CloneFlags::CLONE_NEWNET)
            .context("unshare(CLONE_NEWNET): a node host needs root")?;
        let node = File::open("/proc/thread-self/ns/net").context("the node's namespace");
        let set_up = match rtnetlink::new_connection() {
            Ok((connection, handle, _)) => {
                tokio::spawn(connection);
                set_up_links(&handle, address, prefix_len).await
            }
            Err(e) => Err(e.into()),
        };
        setns(&process, CloneFlags::CLONE_NEWNET).context("back to the process's namespace")?;
        set_up?;
        Ok(Self {
            process,
            node: node?,
        })
    }

    /// A connection of the agent's kind opened in the node's namespace (its socket stays there).
    fn connect(&self) -> Result<Netlink> {
        setns(&self.node, CloneFlags::CLONE_NEWNET).context("entering the node's namespace")?;
        let netlink = Netlink::connect();
        setns(&self.process, CloneFlags::CLONE_NEWNET)
            .context("back to the process's namespace")?;
        Ok(netlink?)
    }
}

async fn set_up_links(handle: &Handle, address: IpAddr, prefix_len: u8) -> Result<()> {
    handle
        .link()
        .add(LinkVeth::new(DEVICE, "peer0").build())
        .execute()
        .await?;
    for name in [DEVICE, "peer0", "lo"] {
        let index = link_index(handle, name).await?;
        handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await?;
    }
    let index = link_index(handle, DEVICE).await?;
    handle
        .address()
        .add(index, address, prefix_len)
        .execute()
        .await?;
    Ok(())
}

async fn link_index(handle: &Handle, name: &str) -> Result<u32> {
    Ok(handle
        .link()
        .get()
        .match_name(name.to_owned())
        .execute()
        .try_next()
        .await?
        .with_context(|| format!("link {name}"))?
        .header
        .index)
}
