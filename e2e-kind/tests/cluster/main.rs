//! The images on a one-node cluster (kubelet, containerd): the Helm chart, the network
//! operator's shapes (self-hosted and hosted control plane), rotation and failover; and the
//! reconciler image's shell.
//!
//! One test binary for the tier: each file below is a module; they share nothing but the binary
//! (and `support`'s helpers).

mod gateway;
mod hosted;
mod image;
mod node;
mod support;
