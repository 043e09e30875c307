//! Test support for cloudnet: the local Kubernetes control plane (real etcd and kube-apiserver),
//! and later the cloud fakes and the end-to-end suite.

pub mod controlplane;
pub mod e2e;
pub mod faultproxy;
pub mod moto;
pub mod webhook_bench;

pub use controlplane::ControlPlane;
