//! Test support for cloudnet: the local Kubernetes control plane (real etcd and kube-apiserver),
//! moto and the fault-injection proxy for cloud endpoints, and the end-to-end suite.

pub mod cache_script;
pub mod controlplane;
pub mod e2e;
pub mod faultproxy;
pub mod moto;
pub mod webhook_bench;

pub use controlplane::ControlPlane;
