//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API, reports the result
//! in each `CloudPrivateIPConfig`'s status and annotates every node with its subnet and capacity.

pub mod app;
pub mod capacity;
pub mod cloud;
pub mod events;
pub mod fence;
pub mod flags;
pub mod interfaces;
pub mod lanes;
pub mod leader;
pub mod metrics;
pub mod mount;
pub mod nodes;
pub mod objects;
pub mod outbound;
pub mod plan;
pub mod process;
pub mod providers;
pub mod rbac;
pub mod records;
pub mod retries;
pub mod run;
pub mod status;

/// Annotation on a `CloudPrivateIPConfig` recording the cloud instance its IP was attached to, as
/// `<node>=<instance>`, so the IP can still be detached after the Node object is gone. Our own
/// domain: upstream's `cloud.network.openshift.io` prefix is reserved for the upstream contract.
pub const INSTANCE_ANNOTATION: &str = "cloudnet.io/instance";
