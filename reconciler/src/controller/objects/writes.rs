//! The object controller's writes to the API: status (through [`crate::controller::status`]),
//! the finalizer, and Events. Each waits for one of the API slots ([`super::EngineConfig::api_requests`])
//! and every object a write returns is kept until the cache shows it ([`crate::index::Written`]).

use std::sync::Arc;

use cloudnet_shared::{AssignedReason, CloudPrivateIPConfig, FINALIZER};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Context, Error, lock};
use crate::controller::status::next_status;

impl Context {
    /// Keeps the object a write returned until the cache catches up with it.
    pub(super) fn remember(&self, mut obj: CloudPrivateIPConfig) -> Arc<CloudPrivateIPConfig> {
        self.metrics.api_writes.inc();
        // Never read, and most of a written object's size (the cache drops them too).
        obj.metadata.managed_fields = None;
        let obj = Arc::new(obj);
        self.written.remember(&obj);
        obj
    }

    pub(super) fn forget(&self, name: &str) {
        self.written.forget(name);
        self.retries.reset(name);
        lock(&self.drifted).remove(name);
    }

    /// Runs the API request `request` makes once one of the API slots is free. The request is
    /// built only then, and boxed: kube's request futures are kilobytes, and a reconcile's
    /// future is as large as its largest await.
    pub(super) async fn with_api_slot<F, Fut>(&self, request: F) -> Fut::Output
    where
        F: FnOnce() -> Fut,
        Fut: Future,
    {
        // An error only if the semaphore were closed, which it never is.
        let _slot = self.api_slots.acquire().await;
        Box::pin(request()).await
    }

    pub(super) async fn event(
        &self,
        obj: &CloudPrivateIPConfig,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.with_api_slot(|| async move {
            self.events
                .publish(&obj.object_ref(&()), warning, reason, note)
                .await;
        })
        .await;
    }

    pub(super) async fn write_status(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
        node: &str,
        reason: AssignedReason,
        message: &str,
    ) -> Result<Arc<CloudPrivateIPConfig>, Error> {
        let Some(status) = next_status(
            obj.status.as_ref(),
            node,
            reason,
            message,
            obj.metadata.generation,
            Timestamp::now(),
        ) else {
            return Ok(Arc::clone(obj));
        };
        tracing::debug!(object = %obj.name_any(), node, reason = reason.as_str(), "writing status");
        // Guarded by the resourceVersion the decision was made on: a write still in flight from
        // a process that has since died, or from a deposed leader, must fail rather than land
        // after a newer status and point status.node away from where the IP really is.
        // Built once a slot is free: a reconcile waiting for one holds no JSON tree.
        let written = self
            .with_api_slot(|| async move {
                let patch = json!({
                    "metadata": { "resourceVersion": obj.resource_version() },
                    "status": status,
                });
                let (name, params) = (obj.name_any(), PatchParams::default());
                self.api
                    .patch_status(&name, &params, &Patch::Merge(&patch))
                    .await
            })
            .await?;
        Ok(self.remember(written))
    }

    /// Puts the finalizer on the object, guarded by its resourceVersion so a concurrent change is
    /// never overwritten.
    pub(super) async fn ensure_finalizer(
        &self,
        obj: &Arc<CloudPrivateIPConfig>,
    ) -> Result<Arc<CloudPrivateIPConfig>, Error> {
        if obj.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Arc::clone(obj));
        }
        tracing::debug!(object = %obj.name_any(), "adding the finalizer");
        let written = self
            .with_api_slot(|| async move {
                let mut finalizers = obj.finalizers().to_vec();
                finalizers.push(FINALIZER.to_owned());
                let patch = json!({ "metadata": {
                    "resourceVersion": obj.resource_version(),
                    "finalizers": finalizers,
                }});
                let (name, params) = (obj.name_any(), PatchParams::default());
                self.api.patch(&name, &params, &Patch::Merge(&patch)).await
            })
            .await?;
        Ok(self.remember(written))
    }

    pub(super) async fn release_finalizer(&self, obj: &CloudPrivateIPConfig) -> Result<(), Error> {
        tracing::debug!(
            object = %obj.name_any(),
            resource_version = obj.resource_version().unwrap_or_default(),
            "releasing the finalizer"
        );
        let released = self
            .with_api_slot(|| async move {
                let finalizers: Vec<&String> = obj
                    .finalizers()
                    .iter()
                    .filter(|f| *f != FINALIZER)
                    .collect();
                let patch = json!({ "metadata": {
                    "resourceVersion": obj.resource_version(),
                    "finalizers": finalizers,
                }});
                let (name, params) = (obj.name_any(), PatchParams::default());
                self.api.patch(&name, &params, &Patch::Merge(&patch)).await
            })
            .await;
        match released {
            Ok(_) => {
                self.metrics.api_writes.inc();
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
