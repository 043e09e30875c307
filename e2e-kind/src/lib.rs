//! Test support for cloudnet: the local Kubernetes control plane (real etcd and kube-apiserver),
//! moto and the fault-injection proxy for cloud endpoints, and the end-to-end suite.

pub mod api_floor;
#[cfg(feature = "azure")]
pub mod arm;
#[cfg(feature = "aws")]
pub mod aws_bench;
pub mod binaries;
pub mod cache_script;
#[cfg(feature = "aws")]
pub mod cluster;
pub mod controlplane;
#[cfg(feature = "aws")]
pub mod e2e;
pub mod faultproxy;
pub mod form;
pub mod forwardproxy;
#[cfg(feature = "gcp")]
pub mod gce;
#[cfg(all(feature = "aws", feature = "gcp"))]
pub mod gcp_bench;
pub mod helm;
pub mod moto;
pub mod openstack;
pub mod prometheus;
pub mod serve;
pub mod tcpcut;
pub mod webhook_bench;

pub use controlplane::ControlPlane;

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
