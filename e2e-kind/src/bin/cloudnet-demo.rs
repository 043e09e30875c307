//! The main job on embedded defaults: the whole system (control plane, a cloud, webhook,
//! reconciler) with three VMs and their nodes, an assignment, a move and a denied request, running
//! for exploration until Ctrl-C. The cloud is EC2 on moto, or with the argument `OpenStack` real
//! Keystone and Neutron.

use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let platform: cloudnet_shared::Platform = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "AWS".to_owned())
        .parse()?;
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
    cloudnet_e2e::e2e::demo::run(platform, stop).await
}
