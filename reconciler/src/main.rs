//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API.

use std::process::ExitCode;

use cloudnet_reconciler::app;
use cloudnet_reconciler::flags::Flags;
use cloudnet_shared::report::one_line;

// One thread is plenty (the API server is the bottleneck, and the lanes wait on the cloud), and
// it keeps glibc's malloc to one arena: with 10,000 objects the multi-threaded runtime's arenas
// cost about 9 MB of the 60 MB budget. Blocking work still has tokio's blocking pool.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let flags = match Flags::from_args(std::env::args()) {
        Ok(flags) => flags,
        Err(e) => e.exit(),
    };
    app::init_logs(flags.log_format);
    match app::run_process(flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, in the log format the operator chose, naming every cause.
            tracing::error!(error = %one_line(&e), "cannot run");
            ExitCode::FAILURE
        }
    }
}
