//! The Kubernetes side: the watches that make the [`crate::plan::Snapshot`] ([`watches`]), the
//! heartbeat Lease ([`heartbeat`]) and the node's labels ([`labels`]).

pub mod heartbeat;
pub mod labels;
pub mod watches;
