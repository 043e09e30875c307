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
pub mod ledger;
pub mod metrics;
pub mod mount;
pub mod nodes;
pub mod objects;
pub mod outbound;
pub mod plan;
pub mod process;
pub mod providers;
pub mod rbac;
pub mod retries;
pub mod run;
pub mod status;
pub mod sweep;
