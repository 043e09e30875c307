//! The benchmarks' drivers (not tests; `make bench-*`): the API floor, EC2 through moto, the GCP
//! engine, and the webhook's load.

pub mod api_floor;
#[cfg(feature = "aws")]
pub mod aws;
#[cfg(all(feature = "aws", feature = "gcp"))]
pub mod gcp;
pub mod webhook;
