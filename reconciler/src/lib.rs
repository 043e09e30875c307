//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API, reports the result
//! in each `CloudPrivateIPConfig`'s status and annotates every node with its subnet and capacity.

pub mod cloud;

/// Annotation on a `CloudPrivateIPConfig` recording the cloud instance its IP was attached to, so
/// the IP can still be detached after the Node object is gone. Our own domain: upstream's
/// `cloud.network.openshift.io` prefix is reserved for the upstream contract.
pub const INSTANCE_ANNOTATION: &str = "cloudnet.io/instance";
