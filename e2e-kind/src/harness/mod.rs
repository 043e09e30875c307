//! What the tests stand on: the local control plane, the one-node cluster, the whole system end
//! to end, the binaries under test, the webhook's certificates and registration, and the cached
//! tools (helm, promtool, Cilium's CRDs) the scripts install.

pub mod binaries;
pub mod cache_script;
pub mod cilium;
#[cfg(feature = "aws")]
pub mod cluster;
pub mod controlplane;
#[cfg(feature = "aws")]
pub mod e2e;
pub mod helm;
pub mod node_host;
pub mod prometheus;
pub mod webhook;
