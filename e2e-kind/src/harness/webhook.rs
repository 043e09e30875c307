//! Support for the webhook's integration tests and its load benchmark: serving certificates in a
//! Secret-mount layout, webhook registration against a control plane, and node fixtures.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cloudnet_certs::{CertificateAuthority, Issued, LeafRequest, Usage};
use cloudnet_shared::EGRESS_IPCONFIG_ANNOTATION;
use cloudnet_shared::annotation::{self, Capacity, EgressIpConfig, IfAddr};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::binaries;
use crate::harness::controlplane::FIELD_MANAGER;

/// A new CA valid for a day.
pub fn test_ca(name: &str) -> Result<CertificateAuthority> {
    Ok(CertificateAuthority::generate(
        name,
        time::Duration::days(1),
    )?)
}

/// A serving certificate for the webhook on 127.0.0.1 (and `localhost`).
pub fn serving_cert(ca: &CertificateAuthority) -> Result<Issued> {
    Ok(ca.issue(&LeafRequest {
        common_name: "cloudnet-webhook",
        organizations: &[],
        alt_names: &["127.0.0.1", "localhost"],
        usage: Usage::Server,
        validity: time::Duration::days(1),
    })?)
}

/// A directory laid out like a kubelet Secret mount: `tls.crt -> ..data/tls.crt`,
/// `..data -> ..<version>`, so a new version appears by one atomic symlink swap.
#[derive(Debug)]
pub struct SecretDir {
    root: PathBuf,
    version: usize,
}

impl SecretDir {
    /// Creates the layout under `root` holding `pair`.
    pub fn create(root: &Path, pair: &Issued) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        let mut dir = Self {
            root: root.to_owned(),
            version: 0,
        };
        dir.rotate(pair)?;
        for file in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(file), root.join(file))?;
        }
        Ok(dir)
    }

    /// Publishes `pair` the way the kubelet does: write a new directory, then rename a fresh
    /// `..data` symlink over the old one.
    pub fn rotate(&mut self, pair: &Issued) -> Result<()> {
        self.version += 1;
        let name = format!(
            "..2026_01_01_00_00_{:02}.{}",
            self.version,
            std::process::id()
        );
        let dir = self.root.join(&name);
        std::fs::create_dir(&dir)?;
        std::fs::write(dir.join("tls.crt"), &pair.cert_pem)?;
        std::fs::write(dir.join("tls.key"), &pair.key_pem)?;
        let tmp = self.root.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp)?;
        std::fs::rename(&tmp, self.root.join("..data")).context("swapping ..data")?;
        Ok(())
    }

    /// The certificate path the webhook reads.
    pub fn cert_path(&self) -> PathBuf {
        self.root.join("tls.crt")
    }

    /// The key path the webhook reads.
    pub fn key_path(&self) -> PathBuf {
        self.root.join("tls.key")
    }
}

/// Registers validating and mutating webhook configurations named `name` that send
/// CloudPrivateIPConfig CREATE/UPDATE to `https://<addr>/validate` and `/mutate`.
pub async fn register_webhooks(
    client: &Client,
    name: &str,
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<()> {
    let ca_bundle = base64_encode(ca_pem.as_bytes());
    let webhook = |path: &str| {
        json!({
            "name": format!("{path}.cloudnet.openshift.io"),
            "clientConfig": {"url": format!("https://{addr}/{path}"), "caBundle": ca_bundle},
            "rules": [{
                "apiGroups": ["cloud.network.openshift.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["cloudprivateipconfigs"],
                "scope": "Cluster",
            }],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        })
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let validating: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [webhook("validate")],
    }))?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(name, &params, &Patch::Apply(&validating))
        .await
        .context("registering the validating webhook")?;
    let mut mutating = webhook("mutate");
    mutating["reinvocationPolicy"] = json!("Never");
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [mutating],
    }))?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(name, &params, &Patch::Apply(&mutating))
        .await
        .context("registering the mutating webhook")?;
    Ok(())
}

/// The egress annotation value for one NIC.
pub fn egress_annotation(
    ipv4: Option<&str>,
    ipv6: Option<&str>,
    capacity: Capacity,
) -> Result<String> {
    let config = EgressIpConfig {
        interface: "eni-0".into(),
        ifaddr: IfAddr::new(
            ipv4.map(str::parse).transpose()?,
            ipv6.map(str::parse).transpose()?,
        ),
        capacity,
    };
    Ok(annotation::encode(&[config]))
}

/// Creates a Node with `addresses` as InternalIPs (written through the status subresource, as
/// the kubelet does) and, when given, the egress annotation.
pub async fn create_node(
    client: &Client,
    name: &str,
    addresses: &[&str],
    egress: Option<&str>,
) -> Result<()> {
    let api = Api::<Node>::all(client.clone());
    let mut node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
    }))?;
    if let Some(value) = egress {
        node.metadata.annotations =
            Some([(EGRESS_IPCONFIG_ANNOTATION.to_owned(), value.to_owned())].into());
    }
    api.create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating node {name}"))?;
    let addresses: Vec<_> = addresses
        .iter()
        .map(|a| json!({"type": "InternalIP", "address": a}))
        .collect();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"addresses": addresses}})),
    )
    .await
    .with_context(|| format!("writing addresses of node {name}"))?;
    Ok(())
}

/// The `cloudnet-webhook` command serving on `addr` with the pair in `certs`, watching the cluster
/// `kubeconfig` names; callers add what else their test needs.
pub fn webhook_command(
    addr: SocketAddr,
    certs: &SecretDir,
    kubeconfig: &Path,
) -> Result<std::process::Command> {
    let mut command = std::process::Command::new(binaries::webhook()?);
    command
        .arg(format!("--listen-address={addr}"))
        .arg("--tls-cert-file")
        .arg(certs.cert_path())
        .arg("--tls-key-file")
        .arg(certs.key_path())
        .arg("--kubeconfig")
        .arg(kubeconfig);
    Ok(command)
}

/// Whether a TLS handshake with the webhook at `addr` succeeds when trusting only `ca_pem`, i.e.
/// whether it now serves a certificate that CA issued.
pub async fn serves_cert_from(addr: SocketAddr, ca_pem: &[u8]) -> bool {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let Ok(ca) = rustls::pki_types::CertificateDer::from_pem_slice(ca_pem) else {
        return false;
    };
    if roots.add(ca).is_err() {
        return false;
    }
    let Ok(config) = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions() else {
        return false;
    };
    let config = config.with_root_certificates(roots).with_no_client_auth();
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
            stream,
        )
        .await
        .is_ok()
}

/// Standard base64, as a caBundle wants it.
pub fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
