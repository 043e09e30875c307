//! The seam between the local system and the cloud it runs the reconciler against: each cloud's
//! server (moto, or one of the project's fakes) plus what the fault proxy, the webhook and the
//! reconciler need to know about it. The harness does the rest the same way for every cloud.

use std::any::Any;
use std::fmt::Debug;
use std::path::Path;

use anyhow::Result;

use crate::fakes::faultproxy::{Builder, Dialect, EC2_CREDENTIALS_REQUEST, FaultProxy};
use crate::fakes::moto::MotoServer;

/// A running cloud the local system points the reconciler at (through the fault proxy).
pub trait LocalCloud: Debug + Send + Sync + 'static {
    /// The `--platform-type` of the webhook and the reconciler (`AWS`, `GCP`, `Azure`, ...).
    fn platform(&self) -> &'static str;

    /// The cloud's own endpoint, which the fault proxy forwards to.
    fn url(&self) -> &str;

    /// How the fault proxy reads this cloud's requests and words its refusals.
    fn dialect(&self) -> Dialect;

    /// The fault proxy in front of [`Self::url`]; override for TLS or other settings.
    fn proxy_builder(&self) -> Builder {
        FaultProxy::builder(self.url(), self.dialect()).seed(5)
    }

    /// Writes the files of the credentials Secret, as it would be mounted, into `dir`.
    fn write_credentials(&self, dir: &Path) -> Result<()>;

    /// The reconciler's cloud flags beyond `--platform-type` and `--secret-override`, given the
    /// URL it must call (the fault proxy's).
    fn reconciler_flags(&self, api_url: &str) -> Vec<String>;

    /// Environment variables the reconciler needs beyond its flags (an SDK's own settings).
    fn reconciler_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The webhook's flags beyond `--platform-type`, if the cloud needs any.
    fn webhook_flags(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether a fault-proxy route (see [`Dialect`]) changes the cloud's state.
    fn is_mutation(&self, route: &str) -> bool;

    /// The concrete cloud, for tests that reach into their own fake.
    fn as_any(&self) -> &dyn Any;
}

/// The EC2 actions that change state; the suite counts them at the fault proxy.
pub const EC2_MUTATIONS: [&str; 4] = [
    "AssignPrivateIpAddresses",
    "AssignIpv6Addresses",
    "UnassignPrivateIpAddresses",
    "UnassignIpv6Addresses",
];

/// EC2 as moto serves it, in one region.
#[derive(Debug)]
pub struct Moto {
    server: MotoServer,
    region: String,
    /// Flags the reconciler gets after the cloud's own ([`Moto::with_reconciler_flags`]).
    extra_flags: Vec<String>,
}

impl Moto {
    /// Starts a moto server of its own for `region`.
    pub async fn start(region: &str) -> Result<Self> {
        Ok(Self {
            server: MotoServer::start().await?,
            region: region.to_owned(),
            extra_flags: Vec::new(),
        })
    }

    /// Gives the reconciler these flags besides EC2's (e.g. `--front-end=antrea`).
    pub fn with_reconciler_flags<'a>(mut self, flags: impl IntoIterator<Item = &'a str>) -> Self {
        self.extra_flags
            .extend(flags.into_iter().map(str::to_owned));
        self
    }

    /// The region the reconciler is told to use.
    pub fn region(&self) -> &str {
        &self.region
    }
}

impl LocalCloud for Moto {
    fn platform(&self) -> &'static str {
        "AWS"
    }

    fn url(&self) -> &str {
        self.server.url()
    }

    fn dialect(&self) -> Dialect {
        Dialect::Ec2Query
    }

    /// EC2's refusal of an address another interface holds, which moto lacks: a doubled IP
    /// fails the call here as it would in a real account. Only the actions OpenShift's
    /// CredentialsRequest allows are admitted, and the three opt-in ones of public addresses
    /// (used only once an EgressPublicIP exists: `make demo`).
    fn proxy_builder(&self) -> Builder {
        FaultProxy::builder(self.url(), self.dialect())
            .seed(5)
            .refuse_reassignment()
            .permit(
                EC2_CREDENTIALS_REQUEST
                    .into_iter()
                    .chain(super::public_ips::EC2_ACTIONS),
            )
    }

    fn write_credentials(&self, dir: &Path) -> Result<()> {
        write_aws_credentials(dir)
    }

    fn reconciler_flags(&self, api_url: &str) -> Vec<String> {
        let mut flags = aws_flags(&self.region, api_url);
        flags.extend(self.extra_flags.iter().cloned());
        flags
    }

    fn is_mutation(&self, route: &str) -> bool {
        EC2_MUTATIONS.contains(&route)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The reconciler's EC2 flags, upstream's spelling.
pub(crate) fn aws_flags(region: &str, api_url: &str) -> Vec<String> {
    vec![
        format!("--platform-region={region}"),
        format!("--platform-api-url={api_url}"),
    ]
}

/// Access keys as the mounted Secret holds them (moto accepts any).
pub(crate) fn write_aws_credentials(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("aws_access_key_id"), "AKIDCLOUDNETE2E")?;
    std::fs::write(dir.join("aws_secret_access_key"), "cloudnet-e2e-secret")?;
    Ok(())
}
