//! The main job on embedded defaults: the whole system (control plane, the cloud, webhook,
//! reconciler) with three VMs and their nodes, an assignment, a move and a denied request,
//! running for exploration until Ctrl-C. The one argument names the cloud: `AWS` (moto, the
//! default), `GCP` (the GCE fake), `Azure` (the ARM fake) or `OpenStack` (real Keystone and
//! Neutron). A second argument, `antrea`, shows the Antrea front end instead (AWS only):
//! Egresses of an opted-in pool, their IPs attached and failed over in the cloud; `cilium` an
//! egress gateway for Cilium (AWS only, as root): the IP on the active node in the cloud and on
//! its interface, and its failover when that node's agent stops.

use cloudnet_e2e::harness::e2e::demo::{self, DemoCloud, DemoPlugin};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cloud = match std::env::args().nth(1).filter(|a| !a.is_empty()) {
        Some(name) => name.parse()?,
        None => DemoCloud::default(),
    };
    let plugin = match std::env::args().nth(2).filter(|a| !a.is_empty()) {
        Some(name) => name.parse()?,
        None => DemoPlugin::default(),
    };
    // Both handlers are installed before anything starts, so a Ctrl-C at any point stops and
    // removes whatever is already running instead of killing this process outright.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    };
    demo::run_with(cloud, plugin, stop).await
}
