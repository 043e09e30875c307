//! A provider that reads the mounted credentials again when the cloud refuses a call as such
//! (an authentication failure is one: revoked keys, an expired secret), and reports when the
//! files have changed since the provider was built from them. The process then drains and
//! restarts with the new files instead of failing every call until someone restarts it. The
//! files are small and a refusal is rare, so every refusal looks; nothing else does.

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;

use super::{
    Change, CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget,
    ProviderNeeds, Spend,
};
use crate::mount::{Loaded, Mounts};

/// `inner`, watching its mounted files on refusals.
pub struct RereadOnRefusal {
    inner: Arc<dyn CloudProvider>,
    mounts: Mounts,
    loaded: Loaded,
    changed: watch::Sender<bool>,
}

impl RereadOnRefusal {
    /// Wraps `inner`, built from `loaded` as read from `mounts`; the receiver turns `true` once a
    /// refusal finds the files changed.
    pub fn new(
        inner: Arc<dyn CloudProvider>,
        mounts: Mounts,
        loaded: Loaded,
    ) -> (Self, watch::Receiver<bool>) {
        let (changed, receiver) = watch::channel(false);
        let this = Self {
            inner,
            mounts,
            loaded,
            changed,
        };
        (this, receiver)
    }

    fn check<T>(&self, result: Result<T, CloudError>) -> Result<T, CloudError> {
        if let Err(e) = &result
            && e.kind == ErrorKind::Permanent
            && !*self.changed.borrow()
            && Loaded::read(&self.mounts) != self.loaded
        {
            tracing::warn!(
                error = %e,
                "the cloud refused a call and the mounted credentials changed since they were \
                 loaded: restarting to load them"
            );
            self.changed.send_replace(true);
        }
        result
    }
}

#[async_trait]
impl CloudProvider for RereadOnRefusal {
    fn needs(&self) -> ProviderNeeds {
        self.inner.needs()
    }

    fn forget_vm(&self, instance: &InstanceId) {
        self.inner.forget_vm(instance);
    }

    fn public_ips(self: Arc<Self>) -> Option<Arc<dyn super::public_ip::PublicIps>> {
        Arc::clone(&self.inner).public_ips()
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        self.check(self.inner.resolve(node_name, provider_id).await)
    }

    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        self.check(self.inner.apply(node, change, known).await)
    }

    async fn write_budget(&self, spend: Spend) {
        self.inner.write_budget(spend).await;
    }

    async fn move_ips(
        &self,
        from: &NodeTarget,
        to: &NodeTarget,
        ips: &[IpAddr],
    ) -> Result<(), CloudError> {
        self.check(self.inner.move_ips(from, to, ips).await)
    }

    async fn release_from_other_interfaces(
        &self,
        node: &NodeTarget,
        ip: IpAddr,
    ) -> Result<bool, CloudError> {
        self.check(self.inner.release_from_other_interfaces(node, ip).await)
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        self.check(self.inner.egress_config(node).await)
    }

    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        let answers = self.inner.egress_configs(nodes).await;
        answers
            .into_iter()
            .map(|answer| self.check(answer))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::cloud::CloudProviderExt;
    use crate::cloud::memory::{MemoryCloud, MemoryConfig, Op, VmSpec, provider_id};

    #[tokio::test]
    async fn a_refusal_after_the_files_changed_asks_for_a_restart_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("aws_access_key_id"), "AKIDOLD").unwrap();
        let mounts = Mounts {
            namespace: "ns".into(),
            secret: "cloud-credentials".into(),
            secret_dir: dir.path().to_path_buf(),
            configmap: "kube-cloud-config".into(),
            configmap_dir: dir.path().join("absent"),
        };
        let cloud = MemoryCloud::new(MemoryConfig::default());
        cloud.add_vm("a", VmSpec::ipv4("10.0.0.1".parse().unwrap(), 10));
        let target = cloud.resolve("a", &provider_id("a")).await.unwrap();
        let (provider, mut changed) = RereadOnRefusal::new(
            Arc::new(cloud.clone()),
            mounts.clone(),
            Loaded::read(&mounts),
        );
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        let refused = || CloudError::permanent("AuthFailure: the key was revoked");

        // Refused with the files unchanged: nothing to reload.
        cloud.fail_next(Op::Attach, None, 1, refused());
        provider.attach(&target, &[ip]).await.unwrap_err();
        assert!(!*changed.borrow_and_update());
        // The kubelet swaps the files; a retryable failure does not look, a refusal does.
        std::fs::write(dir.path().join("aws_access_key_id"), "AKIDNEW").unwrap();
        cloud.fail_next(Op::Attach, None, 1, CloudError::retryable("timeout"));
        provider.attach(&target, &[ip]).await.unwrap_err();
        assert!(!*changed.borrow_and_update());
        cloud.fail_next(Op::Attach, None, 1, refused());
        let error = provider.attach(&target, &[ip]).await.unwrap_err();
        assert_eq!(
            error.kind,
            ErrorKind::Permanent,
            "the error still reaches the engine"
        );
        assert!(*changed.borrow_and_update());
    }
}
