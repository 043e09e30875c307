//! The command line, each flag also settable through the environment (the DaemonSet sets
//! `NODE_NAME` and `POD_NAMESPACE` from the downward API).

use std::time::Duration;

use clap::{Parser, ValueEnum};

/// cloudnet-node: puts the egress gateways' IPs this node holds on its interface, labels the
/// node, and renews the node's heartbeat Lease.
#[derive(Clone, Debug, Parser)]
#[command(name = "cloudnet-node", version, about)]
pub struct Flags {
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Namespace of the heartbeat Lease (the agent's own: the downward API's
    /// metadata.namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: String,
    /// Seconds between heartbeats (fractions allowed); also the period of the resync of the
    /// host's addresses, behind the netlink notifications.
    #[arg(long, env = "CLOUDNET_HEARTBEAT_INTERVAL", default_value = "1", value_parser = parse_seconds)]
    pub heartbeat_interval: Duration,
    /// leaseDurationSeconds written in the heartbeat Lease.
    #[arg(long, env = "CLOUDNET_LEASE_DURATION_SECONDS", default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..))]
    pub lease_duration_seconds: i32,
    /// Address of /metrics, /healthz and /readyz (the pod shares the host's network).
    #[arg(long, env = "CLOUDNET_METRICS_ADDRESS", default_value = "0.0.0.0:9881")]
    pub metrics_address: String,
    /// The device every egress IP goes on. Unset: the link with an address in the subnet the
    /// node's egress-ipconfig annotation gives for the IP.
    #[arg(long, env = "CLOUDNET_INTERFACE")]
    pub interface: Option<String>,
    /// Path to a kubeconfig; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Log format.
    #[arg(long, env = "CLOUDNET_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// A positive number of seconds, fractions allowed.
fn parse_seconds(value: &str) -> Result<Duration, String> {
    let seconds: f64 = value
        .parse()
        .map_err(|e| format!("{value:?} is not a number of seconds: {e}"))?;
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("{value:?}: must be more than 0 seconds"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{value:?}: {e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn defaults_and_fractions() {
        let flags =
            Flags::try_parse_from(["cloudnet-node", "--node-name=a", "--lease-namespace=ns"])
                .unwrap();
        assert_eq!(flags.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(flags.lease_duration_seconds, 3);
        assert_eq!(flags.interface, None);
        let flags = Flags::try_parse_from([
            "cloudnet-node",
            "--node-name=a",
            "--lease-namespace=ns",
            "--heartbeat-interval=0.5",
        ])
        .unwrap();
        assert_eq!(flags.heartbeat_interval, Duration::from_millis(500));
        for bad in ["0", "-1", "x"] {
            assert!(
                Flags::try_parse_from([
                    "cloudnet-node",
                    "--node-name=a",
                    "--lease-namespace=ns",
                    &format!("--heartbeat-interval={bad}"),
                ])
                .is_err(),
                "{bad}"
            );
        }
    }
}
