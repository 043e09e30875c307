//! The reconciler against the real kube-apiserver (memory cloud or moto): transitions, foreign
//! addresses, ledger, leadership, process, resilience, economy, proxies, RBAC, manifests,
//! start-up errors, the network operator's deployment shape, the hosted control plane's shape,
//! and connections to kube-apiserver that stop answering.
//!
//! One test binary for the tier: each file below is a module; they share nothing but the binary.

mod support;

mod antrea;
mod checks;
mod cno;
mod economy;
mod flags_reference;
mod foreign;
mod gateway;
mod holes;
mod hosted;
mod leadership;
mod ledger;
mod manifests;
mod process;
mod proxy;
mod public_follow;
mod public_ips;
mod rbac;
mod reads;
mod resilience;
mod slots;
mod startup_errors;
mod transitions;
