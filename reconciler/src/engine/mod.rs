//! The engine between the controllers and the cloud: the per-VM lanes that batch the controllers'
//! IPs into one call per VM ([`lanes`]), the cached view of each VM's interface they keep current
//! ([`interfaces`]), read in list calls gathered across VMs ([`reads`]), the attachment ledger
//! written before every call ([`ledger`]), and the fence that lets a cloud call run only while
//! this replica leads ([`fence`]). It knows nothing of the objects or the nodes: it takes IPs per
//! VM and answers each with its own result.

pub(crate) mod fence;
pub(crate) mod interfaces;
pub(crate) mod lanes;
pub mod ledger;
pub(crate) mod reads;

pub use fence::FencedCloud;
pub use interfaces::Interfaces;
pub use lanes::{Gather, Lanes, Mutation};
pub use ledger::Ledger;
