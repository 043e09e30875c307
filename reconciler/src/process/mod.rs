//! The process around the controllers: the command line ([`flags`]), one replica's life of
//! leadership terms ([`replica`]: campaign, build the cloud provider, run the controllers behind
//! the fence, stand by again), the HTTP endpoint and health ([`endpoint`]), and the signals that
//! end a run (SIGTERM; a changed credentials Secret or CA ConfigMap is [`crate::mount`]). Leader
//! election is [`crate::leader`].

pub(crate) mod endpoint;
pub mod flags;
pub mod providers;
pub(crate) mod replica;

pub(crate) use endpoint::{Health, mark_synced_when_listable, serve};
pub use flags::{Flags, LogFormat, PlatformType};
pub use replica::{AppError, init_logs, run_process};

/// Resolves with the signal's name when SIGTERM or SIGINT arrives.
pub(crate) async fn signalled() -> &'static str {
    let sigterm = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        () = sigterm => "SIGTERM",
    }
}
