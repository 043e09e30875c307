//! The benchmarks' drivers (not tests; `make bench-*`): the API floor, EC2 through moto, the GCP
//! engine, the webhook's load, and the scale benchmark; plus the two process probes they share.

pub mod api_floor;
#[cfg(feature = "aws")]
pub mod aws;
#[cfg(all(feature = "aws", feature = "gcp"))]
pub mod gcp;
#[cfg(feature = "aws")]
pub mod scale;
pub mod webhook;

use std::net::SocketAddr;

/// A free 127.0.0.1 port: bound, read, released for a child process to bind.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The peak resident set of process `pid` (`VmHWM`), 0 if unreadable.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
