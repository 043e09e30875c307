//! Test support for cloudnet, in three parts: `fakes` (the clouds and network pieces tests run
//! against), `harness` (the local control plane, the one-node cluster, the whole system end to
//! end) and `bench` (the benchmarks' drivers).

pub mod bench;
pub mod fakes;
pub mod harness;

pub use harness::controlplane::ControlPlane;

/// The name the test harness knows a test by, for a test that re-executes its own binary to run
/// one test only (`--exact`): pass `module_path!()` of the test's module.
pub fn test_name(module_path: &str, test: &str) -> String {
    // Test names leave out the crate, which is the test binary.
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

use std::path::PathBuf;

/// A file of this crate's checkout, by its path relative to `e2e-kind/`.
///
/// Cargo names the artifacts of workspace members by their path relative to the workspace, so
/// two checkouts sharing the cached target directory share binaries, and a binary can carry the
/// other checkout's compile-time directory. Cargo's runtime `CARGO_MANIFEST_DIR` (set for tests
/// and `cargo run`) is used when it holds the file.
pub fn crate_file(relative: &str) -> PathBuf {
    let runtime =
        std::env::var_os("CARGO_MANIFEST_DIR").map(|dir| PathBuf::from(dir).join(relative));
    match runtime {
        Some(path) if path.exists() => path,
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative),
    }
}
