//! The files a kubeconfig names, waited for at start.
//!
//! On a hosted control plane the kubeconfig is mounted with the pod, but its `tokenFile` is
//! written by a sidecar that starts beside the controller, and its certificate authority can be a
//! volume the kubelet fills a moment later. Exiting on a missing file would only restart the
//! container into a crash loop with a growing back-off, so the process waits, bounded, and says so.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::Kubeconfig;
use tokio::time::Instant;

/// How often the files are looked for while waiting.
const POLL: Duration = Duration::from_millis(200);

/// The files the current context of `kubeconfig` reads: its cluster's `certificate-authority`
/// unless the data is inline, and its user's `tokenFile` (unless a token is inline),
/// `client-certificate` and `client-key` (unless inline).
pub fn referenced(kubeconfig: &Kubeconfig) -> Vec<PathBuf> {
    let Some(context) = kubeconfig
        .current_context
        .as_ref()
        .and_then(|name| kubeconfig.contexts.iter().find(|c| c.name == *name))
        .and_then(|c| c.context.as_ref())
    else {
        return Vec::new();
    };
    let mut files = Vec::new();
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref());
    if let Some(cluster) = cluster
        && cluster.certificate_authority_data.is_none()
        && let Some(path) = &cluster.certificate_authority
    {
        files.push(path.into());
    }
    let user = context
        .user
        .as_ref()
        .and_then(|name| kubeconfig.auth_infos.iter().find(|u| u.name == *name))
        .and_then(|u| u.auth_info.as_ref());
    if let Some(user) = user {
        if user.token.is_none()
            && let Some(path) = &user.token_file
        {
            files.push(path.into());
        }
        if user.client_certificate_data.is_none()
            && let Some(path) = &user.client_certificate
        {
            files.push(path.into());
        }
        if user.client_key_data.is_none()
            && let Some(path) = &user.client_key
        {
            files.push(path.into());
        }
    }
    files
}

/// Files still missing when the wait ended.
#[derive(Debug, thiserror::Error)]
#[error("{} still missing after {waited:?} (--kubeconfig-wait)", names(.missing))]
pub struct Missing {
    /// The files.
    pub missing: Vec<PathBuf>,
    /// How long the process waited.
    pub waited: Duration,
}

fn names(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn missing(files: &[PathBuf]) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|path| !Path::new(path).exists())
        .cloned()
        .collect()
}

/// Returns once every file of `files` exists, or fails after `bound` naming those still missing.
/// Logs once when it starts waiting and once when the files appear.
pub async fn wait_for(files: &[PathBuf], bound: Duration) -> Result<(), Missing> {
    let mut absent = missing(files);
    if absent.is_empty() {
        return Ok(());
    }
    let start = Instant::now();
    tracing::info!(
        files = %names(&absent),
        bound = ?bound,
        "waiting for the files the kubeconfig names (a sidecar or the kubelet writes them)"
    );
    loop {
        if start.elapsed() >= bound {
            return Err(Missing {
                missing: absent,
                waited: bound,
            });
        }
        tokio::time::sleep(POLL.min(bound.saturating_sub(start.elapsed()))).await;
        absent = missing(files);
        if absent.is_empty() {
            tracing::info!(after = ?start.elapsed(), "the kubeconfig's files are there");
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
current-context: c
contexts:
- name: c
  context: {cluster: k, user: u}
clusters:
- name: k
  cluster: {server: 'https://api:6443', certificate-authority: /hosted-ca/ca.crt}
- name: other
  cluster: {server: 'https://other:6443', certificate-authority: /other/ca.crt}
users:
- name: u
  user: {tokenFile: /var/run/secrets/hosted_cluster/token}
";

    #[test]
    fn the_current_contexts_files_are_named_and_inline_data_is_not() {
        let kubeconfig = Kubeconfig::from_yaml(KUBECONFIG).unwrap();
        assert_eq!(
            referenced(&kubeconfig),
            [
                PathBuf::from("/hosted-ca/ca.crt"),
                PathBuf::from("/var/run/secrets/hosted_cluster/token")
            ]
        );
        let inline = KUBECONFIG
            .replace(
                "certificate-authority: /hosted-ca/ca.crt",
                "certificate-authority-data: eA==",
            )
            .replace(
                "{tokenFile: /var/run/secrets/hosted_cluster/token}",
                "{token: t}",
            );
        assert!(referenced(&Kubeconfig::from_yaml(&inline).unwrap()).is_empty());
    }

    #[tokio::test]
    async fn a_file_that_appears_ends_the_wait_and_one_that_does_not_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        let writer = {
            let token = token.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                std::fs::write(token, "t").unwrap();
            })
        };
        wait_for(std::slice::from_ref(&token), Duration::from_secs(30))
            .await
            .unwrap();
        writer.await.unwrap();
        let absent = dir.path().join("ca.crt");
        let err = wait_for(&[token, absent.clone()], Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(err.missing, [absent]);
        assert!(err.to_string().contains("ca.crt still missing"), "{err}");
    }
}
