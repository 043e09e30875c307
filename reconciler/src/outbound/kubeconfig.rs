//! The apiserver client's configuration from a kubeconfig, built here instead of by kube-rs's
//! loader (`Config::from_custom_kubeconfig`): that loader also reads `HTTPS_PROXY` and
//! `NO_PROXY` with a parser of its own, which refuses an empty `NO_PROXY` entry (`a,,b`, common
//! in generated environments) where Go's rules, ours ([`cloudnet_shared::proxy`]), skip it, and
//! which compares `NO_PROXY` with the proxy's URL rather than the apiserver's. What the loader
//! takes from the kubeconfig (public fields all) is taken here the same way; the proxy is left
//! to [`super::proxy`], unless the cluster entry names its own `proxy-url` (client-go lets that
//! override the environment).

use base64::Engine as _;
use hyper::Uri;
use kube::config::{AuthInfo, ExecAuthCluster, Kubeconfig};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use thiserror::Error;

/// A kubeconfig that names no usable cluster.
#[derive(Debug, Error)]
pub(crate) enum KubeconfigError {
    /// Neither a current context nor one to use.
    #[error("the kubeconfig sets no current-context")]
    NoCurrentContext,
    /// The current context is not among the contexts.
    #[error("context {0:?} is not in the kubeconfig")]
    Context(String),
    /// The context's cluster is not among the clusters.
    #[error("cluster {0:?} of the current context is not in the kubeconfig")]
    Cluster(String),
    /// The cluster has no or a malformed `server`.
    #[error("cluster {0:?}: server: {1}")]
    Server(String, String),
    /// The cluster's certificate authority cannot be read.
    #[error("cluster {0:?}: certificate authority: {1}")]
    CertificateAuthority(String, String),
    /// The cluster's `proxy-url` is malformed.
    #[error("cluster {0:?}: proxy-url: {1}")]
    ProxyUrl(String, String),
}

/// The client configuration of `kubeconfig`'s current context, and its cluster's own
/// `proxy-url` if it sets one.
pub(crate) fn config(
    kubeconfig: Kubeconfig,
) -> Result<(kube::Config, Option<Uri>), KubeconfigError> {
    let context_name = kubeconfig
        .current_context
        .clone()
        .ok_or(KubeconfigError::NoCurrentContext)?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| KubeconfigError::Context(context_name.clone()))?;
    let name = context.cluster.clone();
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| KubeconfigError::Cluster(name.clone()))?;
    // client-go does not fail on a missing user, nor does kube-rs.
    let mut user = context
        .user
        .as_ref()
        .and_then(|user| kubeconfig.auth_infos.iter().find(|u| u.name == *user))
        .and_then(|u| u.auth_info.clone())
        .unwrap_or_else(AuthInfo::default);
    if let Some(exec) = &mut user.exec
        && exec.provide_cluster_info
    {
        let info = ExecAuthCluster::try_from(&cluster)
            .map_err(|e| KubeconfigError::CertificateAuthority(name.clone(), e.to_string()))?;
        exec.cluster = Some(info);
    }
    let server = cluster
        .server
        .as_deref()
        .ok_or_else(|| KubeconfigError::Server(name.clone(), "not set".to_owned()))?;
    let cluster_url: Uri = server.parse().map_err(|e: hyper::http::uri::InvalidUri| {
        KubeconfigError::Server(name.clone(), e.to_string())
    })?;
    let proxy = cluster
        .proxy_url
        .as_deref()
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<Uri>()
                .map_err(|e| KubeconfigError::ProxyUrl(name.clone(), e.to_string()))
        })
        .transpose()?;
    let mut config = kube::Config::new(cluster_url);
    config.default_namespace = context.namespace.unwrap_or_else(|| "default".to_owned());
    config.root_cert = certificate_authority(&cluster)
        .map_err(|e| KubeconfigError::CertificateAuthority(name.clone(), e))?;
    config.accept_invalid_certs = cluster.insecure_skip_tls_verify.unwrap_or(false);
    config.disable_compression = cluster.disable_compression.unwrap_or(false);
    config.tls_server_name = cluster.tls_server_name;
    config.auth_info = user;
    Ok((config, proxy))
}

/// The DER certificates of the cluster's `certificate-authority-data` (base64 PEM) or
/// `certificate-authority` (a PEM file), the data winning as in kube-rs and client-go.
fn certificate_authority(cluster: &kube::config::Cluster) -> Result<Option<Vec<Vec<u8>>>, String> {
    let pem = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| format!("certificate-authority-data: {e}"))?,
        (None, Some(path)) => std::fs::read(path).map_err(|e| format!("{path}: {e}"))?,
        (None, None) => return Ok(None),
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate in it".to_owned());
    }
    Ok(Some(certs))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBBjCBraADAgECAgEBMAoGCCqGSM49BAMCMAAwHhcNMjYwMTAxMDAwMDAwWhcN\n-----END CERTIFICATE-----\n";

    fn kubeconfig(cluster_extra: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1
kind: Config
current-context: c
contexts:
- name: c
  context: {{cluster: k, user: u, namespace: ns}}
clusters:
- name: k
  cluster:
    server: https://api.example:6443
    tls-server-name: localhost
{cluster_extra}
users:
- name: u
  user: {{token: t}}
"
        ))
        .unwrap()
    }

    #[test]
    fn the_current_context_decides_cluster_user_and_namespace() {
        let (config, proxy) = config(kubeconfig("")).unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://api.example:6443/");
        assert_eq!(config.default_namespace, "ns");
        assert_eq!(config.tls_server_name.as_deref(), Some("localhost"));
        assert!(config.auth_info.token.is_some());
        assert!(config.root_cert.is_none());
        assert_eq!(config.proxy_url, None);
        assert_eq!(proxy, None);
    }

    #[test]
    fn the_clusters_own_proxy_url_is_returned_apart() {
        let (_, proxy) = config(kubeconfig("    proxy-url: http://proxy:3128")).unwrap();
        assert_eq!(proxy.unwrap().to_string(), "http://proxy:3128/");
    }

    #[test]
    fn a_certificate_authority_that_is_not_pem_is_named() {
        let data = base64::engine::general_purpose::STANDARD.encode("not a certificate");
        let err = config(kubeconfig(&format!(
            "    certificate-authority-data: {data}"
        )))
        .unwrap_err();
        assert!(err.to_string().contains("certificate authority"), "{err}");
        let data = base64::engine::general_purpose::STANDARD.encode(CA);
        let (config, _) = config(kubeconfig(&format!(
            "    certificate-authority-data: {data}"
        )))
        .unwrap();
        assert_eq!(config.root_cert.map(|c| c.len()), Some(1));
    }

    #[test]
    fn a_missing_context_is_named() {
        let mut kc = kubeconfig("");
        kc.current_context = Some("other".into());
        assert!(matches!(config(kc), Err(KubeconfigError::Context(c)) if c == "other"));
    }
}
