//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API, reports the result
//! in each `CloudPrivateIPConfig`'s status and annotates every node with its subnet and capacity.
//!
//! Laid out by layer; a module depends only on those below it:
//!
//! ```text
//! process/      main's process: flags, leadership terms, endpoint  (+ leader/, providers, rbac)
//!   └ controller/   the object and node controllers, the sweep, the pure plan
//!       └ engine/       per-VM lanes, interface views, attachment ledger, leadership fence
//!           └ cloud/        one provider per cloud behind one trait
//! ```
//!
//! Beside the layers: [`index`] (the object cache by node, and our own writes the cache has not
//! shown yet: the controllers'), [`capacity`] (the node annotation's value, pure), [`metrics`]
//! (every layer reports there), [`mount`] and [`outbound`] (the mounted credentials, and how every
//! client reaches the network: below the clouds too). The in-memory cloud (`cloud::memory`) is
//! built only with the `memory-cloud` feature (tests and the benchmark) and in unit tests.

pub mod capacity;
pub mod cloud;
pub mod controller;
pub mod engine;
pub(crate) mod index;
pub mod leader;
pub mod metrics;
pub(crate) mod mount;
pub mod outbound;
pub mod process;
pub(crate) mod providers;
pub mod rbac;
pub(crate) mod retries;
