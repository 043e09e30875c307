//! The images on a one-node cluster (kubelet, containerd): the Helm chart, the network
//! operator's shape, rotation and failover.
//!
//! One test binary for the tier: each file below is a module; they share nothing but the binary.

mod node;
