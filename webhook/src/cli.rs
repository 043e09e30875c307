//! Command-line flags, each also settable through an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use cloudnet_shared::platform::Platform;

/// cloudnet-webhook: refuses invalid CloudPrivateIPConfig requests before they reach the cloud.
///
/// Serves `/validate`, `/mutate`, `/healthz`, `/readyz` and `/metrics` on one TLS listener.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Args {
    /// The cloud: AWS, Azure, GCP or OpenStack. Unset reads it from the Nodes' providerIDs (and
    /// skips the cloud-specific rules while they name none, or more than one).
    #[arg(long, env = "CLOUDNET_PLATFORM_TYPE", value_parser = parse_platform)]
    pub platform_type: Option<Platform>,
    /// Address to serve on (TLS).
    #[arg(long, env = "CLOUDNET_LISTEN_ADDRESS", default_value = "0.0.0.0:9443")]
    pub listen_address: SocketAddr,
    /// PEM serving certificate (chain, leaf first).
    #[arg(
        long,
        env = "CLOUDNET_TLS_CERT_FILE",
        default_value = "/etc/cloudnet-webhook/tls/tls.crt"
    )]
    pub tls_cert_file: PathBuf,
    /// PEM private key of the serving certificate.
    #[arg(
        long,
        env = "CLOUDNET_TLS_KEY_FILE",
        default_value = "/etc/cloudnet-webhook/tls/tls.key"
    )]
    pub tls_key_file: PathBuf,
    /// How often to re-read the certificate files, e.g. "10s".
    #[arg(long, env = "CLOUDNET_CERT_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub cert_reload_interval: Duration,
    /// How long a watch may keep failing, or kube-apiserver stay unreachable, before the webhook
    /// counts its caches as stale: not ready, and cache-reading reviews answered 503.
    #[arg(long, env = "CLOUDNET_CACHE_STALE_AFTER", default_value = "30s", value_parser = parse_duration)]
    pub cache_stale_after: Duration,
    /// The reconciler's namespace, where its attachment ledger's ConfigMaps are: an IP the ledger
    /// shows attached or released lately counts as managed (rule 3) across webhook restarts.
    /// Without read access there (a 403), the webhook logs it once and goes on without.
    #[arg(
        long,
        env = "CLOUDNET_LEDGER_NAMESPACE",
        default_value = "cloudnet-system"
    )]
    pub ledger_namespace: String,
    /// Longest a Kubernetes API request other than a watch may take, its response included.
    /// Watches are long polls: a connection that stops answering is found by HTTP/2 pings (every
    /// 5 s of silence, closed after 5 s without an answer) and its watches restart on a new one.
    #[arg(long, env = "CLOUDNET_API_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub api_request_timeout: Duration,
    /// Log format.
    #[arg(long, env = "CLOUDNET_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Kubeconfig file; unset uses the in-cluster service account or the default kubeconfig.
    #[arg(long, env = "CLOUDNET_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn parse_platform(value: &str) -> Result<Platform, String> {
    value
        .parse()
        .map_err(|e: cloudnet_shared::platform::ParsePlatformError| e.to_string())
}

/// Parses `500ms`, `10s`, `5m` or a bare number of seconds.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration such as 10s"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "" | "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number * 60),
        _ => return Err(format!("{value:?}: unit must be ms, s or m")),
    };
    if duration.is_zero() {
        return Err("the interval must be positive".into());
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_zero() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1h").is_err());
    }

    #[test]
    fn flags_parse_platform_and_defaults() {
        let args = Args::try_parse_from(["cloudnet-webhook", "--platform-type", "AWS"]).unwrap();
        assert_eq!(args.platform_type, Some(Platform::Aws));
        assert_eq!(args.listen_address.port(), 9443);
        assert!(Args::try_parse_from(["x", "--platform-type", "Nimbus"]).is_err());
    }
}
