//! Creates a CA and a serving certificate for the webhook Service, writes them as files and as a
//! Secret manifest, and prints the caBundle for the webhook configurations.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::Parser;
use cloudnet_certs::{CertificateAuthority, LeafRequest, Usage};

/// Generate the webhook's CA and serving certificate.
#[derive(Debug, Parser)]
#[command(name = "cloudnet-webhook-certs", version, about)]
struct Args {
    /// Name of the webhook Service.
    #[arg(long, default_value = "cloudnet-webhook")]
    service: String,
    /// Namespace of the webhook Service and Secret.
    #[arg(long, default_value = "cloudnet")]
    namespace: String,
    /// Name of the Secret manifest written.
    #[arg(long, default_value = "cloudnet-webhook-tls")]
    secret_name: String,
    /// Further subject alternative names (DNS names or IPs), e.g. 127.0.0.1 for local runs.
    #[arg(long = "extra-san")]
    extra_sans: Vec<String>,
    /// Lifetime of both certificates in days.
    #[arg(long, default_value_t = 365)]
    validity_days: i64,
    /// Directory to write ca.crt, tls.crt, tls.key and secret.yaml into.
    #[arg(long, default_value = "webhook-certs")]
    out_dir: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let validity = time::Duration::days(args.validity_days);
    let ca = CertificateAuthority::generate(&format!("{} CA", args.service), validity)?;
    let (service, namespace) = (&args.service, &args.namespace);
    let mut sans = vec![
        service.clone(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    sans.extend(args.extra_sans.iter().cloned());
    let alt_names: Vec<&str> = sans.iter().map(String::as_str).collect();
    let leaf = ca.issue(&LeafRequest {
        common_name: &format!("{service}.{namespace}.svc"),
        organizations: &[],
        alt_names: &alt_names,
        usage: Usage::Server,
        validity,
    })?;

    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    write(&args.out_dir.join("ca.crt"), ca.cert_pem(), 0o644)?;
    write(&args.out_dir.join("tls.crt"), &leaf.cert_pem, 0o644)?;
    write(&args.out_dir.join("tls.key"), &leaf.key_pem, 0o600)?;
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {}\n  namespace: {namespace}\ntype: kubernetes.io/tls\ndata:\n  ca.crt: {}\n  tls.crt: {}\n  tls.key: {}\n",
        args.secret_name,
        STANDARD.encode(ca.cert_pem()),
        STANDARD.encode(&leaf.cert_pem),
        STANDARD.encode(&leaf.key_pem),
    );
    // The manifest holds the private key: same permissions as tls.key.
    write(&args.out_dir.join("secret.yaml"), &secret, 0o600)?;
    eprintln!(
        "wrote ca.crt, tls.crt, tls.key and secret.yaml to {} (SANs: {}); caBundle:",
        args.out_dir.display(),
        sans.join(", ")
    );
    println!("{}", STANDARD.encode(ca.cert_pem()));
    Ok(())
}

fn write(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
