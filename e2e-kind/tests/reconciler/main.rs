//! The reconciler against the real kube-apiserver (memory cloud or moto): transitions, foreign
//! addresses, ledger, leadership, process, resilience, economy, proxies, RBAC, manifests,
//! start-up errors, the network operator's deployment shape.
//!
//! One test binary for the tier: each file below is a module; they share nothing but the binary.

mod support;

mod checks;
mod cno;
mod economy;
mod flags_reference;
mod foreign;
mod leadership;
mod ledger;
mod manifests;
mod process;
mod proxy;
mod rbac;
mod reads;
mod resilience;
mod startup_errors;
mod transitions;
