//! How the process reaches kube-apiserver and the clouds: through the proxy the environment
//! names for each destination, trusting the CAs a cluster injects. Every client is built from
//! here, so the apiserver, each cloud API and each token endpoint follow the same rules.

pub(crate) mod kubeconfig;
pub(crate) mod proxy;
pub mod trust;
