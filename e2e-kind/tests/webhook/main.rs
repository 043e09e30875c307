//! The webhook through the real kube-apiserver: admission rules, availability, certificates and
//! their rotation, deployment manifests.
//!
//! One test binary for the tier: each file below is a module; they share nothing but the binary.

mod admission;
mod antrea;
mod availability;
mod certs_install;
mod down_admission;
mod egress;
mod gateway;
mod manifests;
mod public_ip;
mod rotation;
mod undecodable;
