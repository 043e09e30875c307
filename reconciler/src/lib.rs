//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API, reports the result
//! in each `CloudPrivateIPConfig`'s status and annotates every node with its subnet and capacity.
//!
//! Laid out by layer. Dependencies point one way, downward; no module imports one above it:
//!
//! ```text
//! process/  →  controller/  →  engine/  →  cloud/  →  outbound/, mount
//!    └──────→  frontend/  (the Kubernetes API only: it writes CloudPrivateIPConfigs)
//! ```
//!
//! - [`process`]: main's process: the flags, one replica's leadership terms, the HTTP endpoint,
//!   and `providers` (the kube clients and the cloud built from the flags). It uses [`leader`]
//!   (election, which opens and closes the engine's fence) and everything below.
//! - [`frontend`]: plugin front ends (Antrea): plugin objects in, CloudPrivateIPConfigs out,
//!   marked as theirs; they reach the controllers only through those objects.
//! - [`controller`]: the object and node controllers, the orphan sweep, the drift check and the
//!   pure plan; it uses the engine, `index` and [`capacity`].
//! - [`engine`]: per-VM lanes, the interface views, the attachment ledger, the leadership fence;
//!   it uses only the cloud.
//! - [`cloud`]: one provider per cloud behind one trait; it uses only [`outbound`] (how every
//!   client reaches the network) and `mount` (the mounted credentials' files).
//!
//! Beside the layers: `index` (the object cache by node, and our own writes the cache has not
//! shown yet; read by the controllers, it imports nothing of the crate), [`capacity`] (the node
//! annotation's value, pure, over the cloud's data), [`metrics`] (every layer reports there; it
//! reads the cloud's error kinds and capacity's `Room`), [`rbac`] (the API permissions of every
//! layer), `events` (Kubernetes Events, for the controllers' objects and the front ends' plugin
//! objects alike). The in-memory cloud (`cloud::memory`) is compiled only with the `memory-cloud` feature
//! (the e2e tests and the benchmark) and in unit tests: the shipped binary refuses
//! `--platform-type memory` as an unsupported platform.

pub mod capacity;
pub mod cloud;
pub mod controller;
pub mod engine;
pub(crate) mod events;
pub mod frontend;
pub(crate) mod index;
pub mod leader;
pub mod metrics;
pub(crate) mod mount;
pub mod outbound;
pub mod process;
pub mod rbac;
