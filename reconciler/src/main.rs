//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API.

use std::process::ExitCode;

use cloudnet_reconciler::outbound::trust;
use cloudnet_reconciler::process::{self, Flags};
use cloudnet_shared::report::one_line;

fn main() -> ExitCode {
    let flags = match Flags::from_args(std::env::args()) {
        Ok(flags) => flags,
        Err(e) => e.exit(),
    };
    process::init_logs(flags.log_format);
    // SAFETY: the process has one thread yet: the runtime is built below.
    #[allow(unsafe_code)]
    unsafe {
        trust::export_for_foreign_clients();
    }
    // One thread is plenty (the API server is the bottleneck, and the lanes wait on the cloud),
    // and it keeps glibc's malloc to one arena: with 10,000 objects the multi-threaded runtime's
    // arenas cost about 9 MB of the 60 MB budget. Blocking work still has tokio's blocking pool.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot run: building the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(process::run_process(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, in the log format the operator chose, naming every cause.
            tracing::error!(error = %one_line(&e), "cannot run");
            ExitCode::FAILURE
        }
    }
}
