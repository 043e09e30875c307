//! Where the webhook and reconciler binaries under test are found.
//!
//! Other packages' binaries have no `CARGO_BIN_EXE_*` in this crate's tests, so the suite takes
//! them from the environment (`CLOUDNET_WEBHOOK_BIN`, `CLOUDNET_RECONCILER_BIN`) or else from
//! the profile directory of the running test executable (`<target>/debug/`), where
//! `cargo build --workspace --all-targets` (run by `make test` before the tests)
//! puts them.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// Environment variable naming the webhook binary.
pub const WEBHOOK_ENV: &str = "CLOUDNET_WEBHOOK_BIN";
/// Environment variable naming the reconciler binary.
pub const RECONCILER_ENV: &str = "CLOUDNET_RECONCILER_BIN";
/// Environment variable naming the certificate tool (`certs/install-webhook-certs.sh` reads it too).
pub const CERTS_ENV: &str = "CLOUDNET_CERTS_BIN";

/// The `cloudnet-webhook` binary.
pub fn webhook() -> Result<PathBuf> {
    locate("cloudnet-webhook", WEBHOOK_ENV)
}

/// The `cloudnet-reconciler` binary.
pub fn reconciler() -> Result<PathBuf> {
    locate("cloudnet-reconciler", RECONCILER_ENV)
}

/// The `cloudnet-webhook-certs` binary, for `certs/install-webhook-certs.sh` (which would otherwise
/// `cargo run` it, resolving features anew).
pub fn certs() -> Result<PathBuf> {
    locate("cloudnet-webhook-certs", CERTS_ENV)
}

fn locate(name: &str, env: &str) -> Result<PathBuf> {
    let path = match std::env::var_os(env) {
        Some(path) => PathBuf::from(path),
        None => profile_dir()?.join(name),
    };
    if !path.is_file() {
        bail!(
            "{} not found: run `cargo build --workspace --all-targets` with the \
             same CARGO_TARGET_DIR first, or set {env}",
            path.display()
        );
    }
    Ok(path)
}

/// `<target>/<profile>`: test executables live in its `deps/` subdirectory.
fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the test executable")?;
    let dir = exe
        .parent()
        .filter(|deps| deps.ends_with("deps"))
        .and_then(std::path::Path::parent)
        .or_else(|| exe.parent())
        .context("the test executable has no parent directory")?;
    Ok(dir.to_path_buf())
}
