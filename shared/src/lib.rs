//! Shared core of cloudnet: the `CloudPrivateIPConfig`, `EgressPublicIP` and `EgressGateway`
//! resources, the IP⇄name codec, the node egress annotation and the admission rules. Pure code: no I/O, no clocks, no
//! Kubernetes client, so the webhook and the reconciler make the same decisions.

pub mod annotation;
pub mod antrea;
pub mod codec;
pub mod crd;
pub mod egress;
pub mod excerpt;
pub mod gateway;
pub mod ids;
pub mod ledger;
pub mod node;
pub mod platform;
pub mod proxy;
pub mod public_ip;
pub mod report;
pub mod resource;
pub mod rules;
pub mod upstream_text;

pub use annotation::{Capacity, EGRESS_IPCONFIG_ANNOTATION, EgressIpConfig, IfAddr};
pub use codec::{NameError, canonical_name, decode_name, encode_name};
pub use crd::crd;
pub use node::{EgressState, InternalIps, NodeInfo};
pub use platform::{Bucket, CapacityModel, Platform};
pub use resource::{
    AssignedReason, CONDITION_ASSIGNED, CloudPrivateIPConfig, CloudPrivateIPConfigSpec,
    CloudPrivateIPConfigStatus, FINALIZER, FRONT_END_LABEL,
};
pub use rules::{ClusterSnapshot, Denial, ObjectView, Operation, Rule, Verdict, review};
