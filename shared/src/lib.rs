//! Shared core of cloudnet: the `CloudPrivateIPConfig` resource, the IP⇄name codec, the node
//! egress annotation and the admission rules. Pure code: no I/O, no clocks, no Kubernetes client,
//! so the webhook and the reconciler make the same decisions.

pub mod crd;
pub mod resource;

pub use crd::crd;
pub use resource::{
    AssignedReason, CONDITION_ASSIGNED, CloudPrivateIPConfig, CloudPrivateIPConfigSpec,
    CloudPrivateIPConfigStatus, FINALIZER,
};
