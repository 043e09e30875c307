//! Command line and environment, upstream-compatible (SPEC §2.5).

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

use cloudnet_shared::Platform;
use cloudnet_shared::platform::ParsePlatformError;

use crate::cloud::pace::{Pacing, RateOverride};

/// Flags of upstream's cloud-network-config-controller, plus our own tunables.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "cloudnet-reconciler",
    about = "Attaches egress IPs to cloud VMs"
)]
pub struct Flags {
    /// Name of the Secret holding the cloud credentials.
    #[arg(long)]
    pub secret_name: String,
    /// The cloud: AWS, Azure, GCP or OpenStack.
    #[arg(long, value_parser = parse_platform_type)]
    pub platform_type: PlatformType,
    /// Cloud region.
    #[arg(long, default_value = "")]
    pub platform_region: String,
    /// Custom cloud API endpoint.
    #[arg(long, default_value = "")]
    pub platform_api_url: String,
    /// Directory where the credentials Secret is mounted.
    #[arg(long, default_value = "/etc/secret/cloudprovider")]
    pub secret_override: PathBuf,
    /// Seconds between reads of the mounted credentials and cloud config (`--secret-override`,
    /// `--config-override`): a change on disk drains and restarts the process as a change of the
    /// objects does, also where the objects are not readable through the API (a hosted control
    /// plane mounts them from the management cluster). An unchanged read costs no cloud call.
    #[arg(long, value_parser = parse_positive_seconds, default_value = "30")]
    pub credentials_poll_period: Duration,
    /// Name of the ConfigMap holding the cloud config and CA bundle.
    #[arg(long, default_value = "kube-cloud-config")]
    pub config_name: String,
    /// Directory where that ConfigMap is mounted.
    #[arg(long, default_value = "/kube-cloud-config")]
    pub config_override: PathBuf,
    /// CA bundle for a custom AWS endpoint.
    #[arg(long, default_value = "")]
    pub platform_aws_ca_override: String,
    /// Azure environment (AzurePublicCloud, AzureUSGovernmentCloud, ...).
    #[arg(long, default_value = "")]
    pub platform_azure_environment: String,
    /// Path to a kubeconfig; in-cluster configuration when empty.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,
    /// Namespace of the Lease, Secret and ConfigMap, and of the attachment ledger's ConfigMaps.
    #[arg(
        long,
        env = "CONTROLLER_NAMESPACE",
        default_value = "openshift-cloud-network-config-controller"
    )]
    pub controller_namespace: String,
    /// Name of this controller (pod name prefix for the leader identity).
    #[arg(
        long,
        env = "CONTROLLER_NAME",
        default_value = "cloud-network-config-controller"
    )]
    pub controller_name: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// How long a standby waits, from when it first sees the lease unchanged, before taking it.
    /// With the renew deadline it sets the split-brain margin: a cut-off leader stops calling the
    /// cloud `lease duration - renew deadline` (20 s by default) before any standby may take over.
    /// A leader's death is taken over within the lease duration plus a retry period (65 s by
    /// default). Upstream's (and the `openshift` overlay's) is 137 s.
    #[arg(long, value_parser = parse_seconds, default_value = "60")]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps acting without a successful renewal, by its own clock from the
    /// last one it saw succeed. An apiserver outage up to this minus a retry period (35 s by
    /// default) goes unnoticed; a longer one makes the leader stop every cloud call, step down
    /// and campaign again in the same process (it never exits for it). Must be shorter than the
    /// lease duration. Upstream's is 107 s.
    #[arg(long, value_parser = parse_seconds, default_value = "40")]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and a standby looks at the lease: one small Lease write per
    /// period. Upstream's is 26 s.
    #[arg(long, value_parser = parse_seconds, default_value = "5")]
    pub leader_elect_retry_period: Duration,
    /// Seconds between drift checks of attached IPs against the cloud (0: off; the orphan sweep
    /// then reads the VMs it released IPs from itself, every quarter of --orphan-grace, for as
    /// long as their released records last).
    #[arg(long, value_parser = parse_seconds, default_value = "300")]
    pub drift_period: Duration,
    /// Network plugins whose own objects cloudnet follows, besides the CloudPrivateIPConfigs a
    /// plugin writes itself: `antrea` (Egresses of ExternalIPPools labelled
    /// `cloudnet.io/attach-egress-ips=true`), `egress-gateway` (EgressGateways; docs/gateways.md).
    /// Repeat, or separate with commas. None by default.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub front_end: Vec<FrontEndKind>,
    /// Namespace of the node agents' heartbeat Leases (`--front-end=egress-gateway`); default:
    /// the controller namespace.
    #[arg(long)]
    pub node_lease_namespace: Option<String>,
    /// Milliseconds after a node agent's last heartbeat when its node stops being eligible as
    /// an egress gateway, and the gateways active on it fail over (`--front-end=egress-gateway`).
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(500..))]
    pub heartbeat_timeout_ms: u64,
    /// Seconds an attachment ledger entry that no object claims is left alone before the orphan
    /// sweep detaches its IP (at least 1).
    #[arg(long, value_parser = parse_orphan_grace, default_value = "120")]
    pub orphan_grace: Duration,
    /// Address of the Prometheus metrics endpoint.
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_bind_address: String,
    /// Milliseconds without a new IP (for any node: a burst spread over many nodes reaches each
    /// at a fraction of its rate) after which an idle lane stops gathering and makes its cloud
    /// call (0: call at once).
    #[arg(long, default_value_t = 100)]
    pub coalesce_window_ms: u64,
    /// Most milliseconds an idle node's lane keeps gathering while IPs keep arriving (it gathers
    /// longer while the cloud rate limit has no budget). Also how long after the latest IP a
    /// burst counts as going on: meanwhile a call leaves rate budget for every other node that
    /// received an IP within this time.
    #[arg(long, default_value_t = 1000)]
    pub batch_max_wait_ms: u64,
    /// Seconds one cloud call (the provider's own retries included) may hold a node's lane;
    /// after that its IPs fail with a retryable error and the lane moves on.
    #[arg(long, value_parser = parse_seconds, default_value = "120")]
    pub cloud_call_deadline: Duration,
    /// Sustained calls per second of each cloud read API (default: the cloud's published rate
    /// for that API; 0: no limit).
    #[arg(long)]
    pub cloud_read_qps: Option<f64>,
    /// Burst of each cloud read API (default: the cloud's published burst for that API).
    #[arg(long)]
    pub cloud_read_burst: Option<u32>,
    /// Sustained calls per second of each mutating cloud API (default: the cloud's published
    /// rate for that API; 0: no limit).
    #[arg(long)]
    pub cloud_write_qps: Option<f64>,
    /// Burst of each mutating cloud API (default: the cloud's published burst for that API).
    #[arg(long)]
    pub cloud_write_burst: Option<u32>,
    /// Most Kubernetes API requests awaiting their response at once (over HTTP/2 they share one
    /// connection; an apiserver that speaks only HTTP/1.1 gets one connection per request in
    /// flight); watches hold a slot only until their response starts. Reconciles beyond it wait
    /// before building their request, so a burst of waiting reconciles holds little memory.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub api_concurrency: u16,
    /// Seconds a Kubernetes API request other than a watch may take, its response included;
    /// then it fails and is retried on a connection that answers. Watches are long polls: a
    /// connection that stops answering is found by HTTP/2 pings (every 5 s of silence, closed
    /// after 5 s without an answer) and its watches restart on a new one.
    #[arg(long, value_parser = parse_positive_seconds, default_value = "30")]
    pub api_request_timeout: Duration,
    /// Seconds to wait at start for the files the kubeconfig names (`tokenFile`,
    /// `certificate-authority`, client certificate and key) when they are not there yet, as when
    /// a sidecar writes the token; then the process exits naming the missing ones.
    #[arg(long, value_parser = parse_seconds, default_value = "60")]
    pub kubeconfig_wait: Duration,
    /// Most objects reconciled at once. A reconcile hands its IP to the node's lane and ends
    /// without waiting for the cloud call, so this bounds only the reconciles writing to the
    /// Kubernetes API (each costs about 2 kB while it waits for one of the API slots), not how
    /// many IPs can share a node's call.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent_reconciles: u16,
    /// Latency of every call of the `Memory` platform (demos, tests and benchmarks only).
    #[arg(long, default_value_t = 0, hide = true)]
    pub memory_latency_ms: u64,
    /// Neutron's `max_allowed_address_pairs` (OpenStack only): the API does not expose it.
    #[arg(long, default_value_t = 10)]
    pub platform_openstack_max_address_pairs: usize,
}

impl Flags {
    /// Parses a full argv (program name first), accepting upstream's single-dash spellings.
    /// `--version` (or `-version`) prints [`version`].
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, clap::Error> {
        let matches = Self::command()
            .version(version(std::env::var(RELEASE_VERSION_ENV).ok().as_deref()))
            .try_get_matches_from(normalize_args(args))?;
        Self::from_arg_matches(&matches)
    }

    /// The changes the flags make to the cloud's published rates.
    pub fn pacing(&self) -> Pacing {
        Pacing {
            read: RateOverride {
                burst: self.cloud_read_burst,
                per_second: self.cloud_read_qps,
            },
            write: RateOverride {
                burst: self.cloud_write_burst,
                per_second: self.cloud_write_qps,
            },
        }
    }
}

/// The OpenShift release the network operator deploys the controller for (its Deployment sets
/// it; upstream reports it as the operand's version).
pub(crate) const RELEASE_VERSION_ENV: &str = "RELEASE_VERSION";

/// What `--version` prints after the program name: cloudnet's version, then the OpenShift
/// release when `RELEASE_VERSION` names one, so that an admin who swapped the image sees both.
pub(crate) fn version(release: Option<&str>) -> &'static str {
    let own = env!("CARGO_PKG_VERSION");
    match release.map(str::trim).filter(|r| !r.is_empty()) {
        // clap keeps the version for the process's life; it is built once per start.
        Some(release) => Box::leak(format!("{own} (OpenShift release {release})").into_boxed_str()),
        None => own,
    }
}

/// A plugin front end (docs/plugins/).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FrontEndKind {
    /// Antrea's Egress (`crd.antrea.io/v1beta1`).
    Antrea,
    /// cloudnet's own `EgressGateway` (`cloudnet.io/v1alpha1`): HA egress gateways for Cilium's
    /// egress gateway or any plugin that needs the IP on a node (docs/gateways.md).
    EgressGateway,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let s = s.trim_end_matches('s');
    s.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|e| format!("{s:?} is not a number of seconds: {e}"))
}

/// At least a second.
fn parse_positive_seconds(s: &str) -> Result<Duration, String> {
    let seconds = parse_seconds(s)?;
    if seconds.is_zero() {
        return Err("must be at least 1 second".to_owned());
    }
    Ok(seconds)
}

/// At least a second: the grace covers the object watch showing a claim late, and with none the
/// sweep would release an IP whose object the watch has not delivered yet.
fn parse_orphan_grace(s: &str) -> Result<Duration, String> {
    let grace = parse_seconds(s)?;
    if grace < Duration::from_secs(1) {
        return Err("must be at least 1 second".to_owned());
    }
    Ok(grace)
}

/// The long flag names, for [`normalize_args`].
fn long_names() -> Vec<String> {
    Flags::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .chain(["help".to_owned(), "version".to_owned()])
        .collect()
}

/// The `--platform-type` value: one of the clouds, or the hidden in-memory platform (demos,
/// tests and benchmarks), parsed once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlatformType {
    /// A cloud, spelled as upstream spells it (`AWS`, `Azure`, `GCP`, `OpenStack`; any case).
    Cloud(Platform),
    /// The in-memory cloud (`memory`, any case; not listed in the help), in builds with the
    /// `memory-cloud` feature only (tests and the benchmark): the shipped binary refuses it.
    #[cfg(feature = "memory-cloud")]
    Memory,
}

impl PlatformType {
    /// The flag's canonical spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Cloud(platform) => platform.as_str(),
            #[cfg(feature = "memory-cloud")]
            Self::Memory => "memory",
        }
    }

    /// Whether the platform's provider reads mounted credentials (every cloud does).
    pub const fn reads_files(self) -> bool {
        match self {
            Self::Cloud(_) => true,
            #[cfg(feature = "memory-cloud")]
            Self::Memory => false,
        }
    }
}

impl std::fmt::Display for PlatformType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `spelling` is this platform's canonical spelling.
impl PartialEq<&str> for PlatformType {
    fn eq(&self, spelling: &&str) -> bool {
        self.as_str() == *spelling
    }
}

/// Parses `--platform-type`: the clouds as [`Platform`] parses them, or `memory` where built in.
fn parse_platform_type(value: &str) -> Result<PlatformType, ParsePlatformError> {
    #[cfg(feature = "memory-cloud")]
    if value.eq_ignore_ascii_case(PlatformType::Memory.as_str()) {
        return Ok(PlatformType::Memory);
    }
    value.parse().map(PlatformType::Cloud)
}

/// Rewrites upstream's single-dash long flags (`-secret-name=x`, `-kubeconfig x`) to the
/// double-dash form clap parses; anything else is left alone.
pub(crate) fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let names = long_names();
    args.into_iter()
        .map(|arg| {
            let Some(rest) = arg.strip_prefix('-') else {
                return arg;
            };
            if rest.starts_with('-') {
                return arg;
            }
            let name = rest.split_once('=').map_or(rest, |(n, _)| n);
            if names.iter().any(|n| n == name) {
                format!("-{arg}")
            } else {
                arg
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        let argv = std::iter::once("cloudnet-reconciler".to_owned())
            .chain(args.iter().map(|s| (*s).to_owned()));
        Flags::try_parse_from(normalize_args(argv))
    }

    #[test]
    fn single_and_double_dash_spellings_are_equivalent() {
        let single = parse(&[
            "-secret-name=creds",
            "-platform-type",
            "AWS",
            "-platform-region=us-east-1",
            "-kubeconfig",
            "/k",
        ])
        .unwrap();
        let double = parse(&[
            "--secret-name",
            "creds",
            "--platform-type=AWS",
            "--platform-region",
            "us-east-1",
            "--kubeconfig=/k",
        ])
        .unwrap();
        assert_eq!(single.secret_name, "creds");
        assert_eq!(single.platform_type, "AWS");
        assert_eq!(single.platform_region, double.platform_region);
        assert_eq!(single.kubeconfig, "/k");
        assert_eq!(
            single.secret_override,
            PathBuf::from("/etc/secret/cloudprovider")
        );
        assert_eq!(single.config_name, "kube-cloud-config");
    }

    #[test]
    fn unknown_single_dash_flags_and_values_are_untouched() {
        let args = normalize_args(["bin", "-x", "-secret-name", "-not-a-flag"].map(String::from));
        assert_eq!(args, ["bin", "-x", "--secret-name", "-not-a-flag"]);
    }

    #[test]
    fn pacing_flags_override_the_clouds_rates_class_by_class() {
        use crate::cloud::pace::Rate;
        let published = Rate {
            burst: 100,
            per_second: 5.0,
        };
        let flags = parse(&["-secret-name=x", "-platform-type=AWS"]).unwrap();
        assert_eq!(flags.pacing(), Pacing::PUBLISHED);
        let args = [
            "-secret-name=x",
            "-platform-type=AWS",
            "--cloud-write-qps=0",
        ];
        let pacing = parse(&args).unwrap().pacing();
        assert_eq!(pacing.rate(false, published), published);
        assert!(!pacing.rate(true, published).is_limited());
        let args = [
            "-secret-name=x",
            "-platform-type=AWS",
            "--cloud-read-burst=7",
        ];
        assert_eq!(
            parse(&args).unwrap().pacing().rate(false, published),
            Rate {
                burst: 7,
                per_second: 5.0
            }
        );
    }

    #[test]
    fn default_leader_timings_are_valid_and_leave_a_split_brain_margin() {
        use crate::leader::record::Timings;
        let flags = parse(&["-secret-name=x", "-platform-type=AWS"]).unwrap();
        let timings = Timings::new(
            flags.leader_elect_lease_duration,
            flags.leader_elect_renew_deadline,
            flags.leader_elect_retry_period,
        )
        .unwrap();
        assert_eq!(
            timings.lease - timings.renew_deadline,
            Duration::from_secs(20),
            "the margin the flags' help states"
        );
        // Upstream's timings (the openshift overlay's) are accepted too.
        let upstream = parse(&[
            "-secret-name=x",
            "-platform-type=AWS",
            "--leader-elect-lease-duration=137s",
            "--leader-elect-renew-deadline=107s",
            "--leader-elect-retry-period=26s",
        ])
        .unwrap();
        assert!(
            Timings::new(
                upstream.leader_elect_lease_duration,
                upstream.leader_elect_renew_deadline,
                upstream.leader_elect_retry_period,
            )
            .is_ok()
        );
    }

    #[test]
    fn orphan_grace_below_a_second_is_refused_in_one_line() {
        let base = ["-secret-name=x", "-platform-type=AWS"];
        let zero = parse(&[&base[..], &["-orphan-grace=0"]].concat()).unwrap_err();
        let message = zero.to_string();
        let first = message.lines().next().unwrap_or_default();
        assert!(
            first.contains("--orphan-grace") && first.contains("at least 1 second"),
            "{message}"
        );
        let one = parse(&[&base[..], &["-orphan-grace=1"]].concat()).unwrap();
        assert_eq!(one.orphan_grace, Duration::from_secs(1));
    }

    /// The arguments OpenShift's network operator renders for the controller
    /// (cluster-network-operator bindata/cloud-network-config-controller/self-hosted/
    /// controller.yaml), every template value empty but the platform type.
    const CNO_ARGS: [&str; 8] = [
        "-platform-type",
        "AWS",
        "-platform-region=",
        "-platform-api-url=",
        "-platform-aws-ca-override=",
        "-platform-azure-environment=",
        "-secret-name",
        "cloud-credentials",
    ];

    #[test]
    fn the_network_operators_arguments_parse_with_their_empty_values() {
        let flags = Flags::from_args(
            std::iter::once("cloud-network-config-controller")
                .chain(CNO_ARGS)
                .map(String::from),
        )
        .unwrap();
        assert_eq!(flags.platform_type, "AWS");
        assert_eq!(flags.secret_name, "cloud-credentials");
        assert_eq!(flags.platform_region, "");
        assert_eq!(flags.platform_api_url, "");
        assert_eq!(flags.platform_aws_ca_override, "");
        assert_eq!(flags.platform_azure_environment, "");
        // With values, as on a cluster whose infrastructure names them.
        let filled = parse(&[
            "-platform-type",
            "Azure",
            "-platform-region=eastus",
            "-platform-api-url=https://management.example/",
            "-platform-aws-ca-override=/etc/pki/ca.pem",
            "-platform-azure-environment=AzureUSGovernmentCloud",
            "-secret-name",
            "cloud-credentials",
        ])
        .unwrap();
        assert_eq!(filled.platform_region, "eastus");
        assert_eq!(filled.platform_api_url, "https://management.example/");
        assert_eq!(filled.platform_aws_ca_override, "/etc/pki/ca.pem");
        assert_eq!(filled.platform_azure_environment, "AzureUSGovernmentCloud");
    }

    #[test]
    fn version_is_asked_for_with_either_dash_and_names_the_release() {
        for spelling in ["--version", "-version", "-V"] {
            let e =
                Flags::from_args(["cloud-network-config-controller", spelling].map(String::from))
                    .unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::DisplayVersion,
                "{spelling}"
            );
        }
        let own = env!("CARGO_PKG_VERSION");
        assert_eq!(version(None), own);
        assert_eq!(version(Some(" ")), own);
        assert_eq!(
            version(Some("4.18.0")),
            format!("{own} (OpenShift release 4.18.0)")
        );
    }

    #[test]
    fn secret_name_is_required() {
        assert!(parse(&["-platform-type=AWS"]).is_err());
    }
}
