//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API.

use std::process::ExitCode;

use cloudnet_reconciler::outbound::trust;
use cloudnet_reconciler::process::{self, Flags};
use cloudnet_shared::report::one_line;

/// jemalloc instead of glibc's malloc: at 5,000 nodes and 20,000 objects (`make bench-scale`)
/// the reconciler peaked 7 MB lower with it, glibc keeping freed chunks in its heap between the
/// caches' growth steps (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts: one arena (the runtime has one thread), dirty pages
/// given back after a second and then at once rather than kept for reuse. `_RJEM_MALLOC_CONF`
/// in the environment still overrides them.
#[repr(transparent)]
pub struct MallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a static, immutable C string.
#[allow(unsafe_code)]
unsafe impl Sync for MallocConf {}

/// The embedded jemalloc reads its options from this symbol (its `malloc_conf`, prefixed).
#[allow(unsafe_code, non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: MallocConf =
    MallocConf(c"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

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
    // and the allocator's one arena then sees no contention: with 10,000 objects the
    // multi-threaded runtime's arenas (glibc's, then) cost about 9 MB of the 60 MB budget.
    // Blocking work still has tokio's blocking pool.
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn jemalloc_starts_with_our_options() {
        // jemalloc's default is four arenas a CPU: one means it read `malloc_conf`.
        assert_eq!(tikv_jemalloc_ctl::opt::narenas::read().unwrap(), 1);
    }
}
