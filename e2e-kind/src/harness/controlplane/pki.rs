//! Certificates and keys for one local control plane.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cloudnet_certs::{CertificateAuthority, LeafRequest, Usage, signing_key};
use time::Duration;

/// Files written into a control plane's run directory.
#[derive(Clone, Debug)]
pub struct Pki {
    /// CA certificate: signs the apiserver serving certificate and the admin client certificate.
    pub ca_cert: PathBuf,
    /// CA certificate, PEM text.
    pub ca_pem: String,
    /// kube-apiserver serving certificate and key.
    pub serving_cert: PathBuf,
    /// Key of `serving_cert`.
    pub serving_key: PathBuf,
    /// Admin client certificate (group `system:masters`) and key.
    pub admin_cert: PathBuf,
    /// Key of `admin_cert`.
    pub admin_key: PathBuf,
    /// Service-account token signing key.
    pub service_account_key: PathBuf,
    /// Public half of `service_account_key`, for verifying tokens.
    pub service_account_pub: PathBuf,
}

/// The admin user's name in the generated kubeconfig.
pub const ADMIN_USER: &str = "cloudnet-admin";

impl Pki {
    /// Generates a CA and every certificate the control plane needs, into `dir`.
    pub fn generate(dir: &Path) -> Result<Self> {
        let validity = Duration::days(2);
        let ca = CertificateAuthority::generate("cloudnet-local-ca", validity)?;
        let serving = ca.issue(&LeafRequest {
            common_name: "kube-apiserver",
            organizations: &[],
            alt_names: &[
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
            usage: Usage::Server,
            validity,
        })?;
        let admin = ca.issue(&LeafRequest {
            common_name: ADMIN_USER,
            organizations: &["system:masters"],
            alt_names: &[],
            usage: Usage::Client,
            validity,
        })?;
        let write = |name: &str, contents: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, contents)
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        let service_account = signing_key()?;
        Ok(Self {
            ca_cert: write("ca.crt", ca.cert_pem())?,
            ca_pem: ca.cert_pem().to_string(),
            serving_cert: write("apiserver.crt", &serving.cert_pem)?,
            serving_key: write("apiserver.key", &serving.key_pem)?,
            admin_cert: write("admin.crt", &admin.cert_pem)?,
            admin_key: write("admin.key", &admin.key_pem)?,
            service_account_key: write("service-account.key", &service_account.private_pem)?,
            service_account_pub: write("service-account.pub", &service_account.public_pem)?,
        })
    }
}
