//! The whole system end to end: control plane, webhook and reconciler as processes, each cloud
//! behind the fault proxy; and the control-plane harness it stands on.
//!
//! One test binary for the tier: each file below is a module; they share nothing but the binary.

mod antrea;
mod azure;
mod azure_throttled;
mod controlplane;
mod controlplane_cleanup;
mod failover;
mod gateway;
mod gcp;
mod gcp_throttled;
mod health;
mod netns;
mod openstack;
mod openstack_throttled;
mod system;
mod throttled;
