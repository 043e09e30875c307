//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API.

use anyhow::Context as _;
use cloudnet_reconciler::app;
use cloudnet_reconciler::flags::Flags;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = match Flags::from_args(std::env::args()) {
        Ok(flags) => flags,
        Err(e) => e.exit(),
    };
    app::init_logs(flags.log_format);
    app::run_process(flags).await.context("reconciler")
}
