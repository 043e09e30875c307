//! Whether the `EgressPublicIP` CRD is installed. It is opt-in: a cluster without it must see
//! neither an error nor a request loop, so the controller looks once at start and then every
//! [`LOOK_PERIOD`], and stops (and waits again) if the CRD is removed.

use std::time::Duration;

use cloudnet_shared::public_ip::EgressPublicIP;
use kube::Api;
use kube::api::ListParams;

/// How often the CRD's presence is looked at.
pub(crate) const LOOK_PERIOD: Duration = Duration::from_secs(30);

/// Whether kube-apiserver serves bindings: a list of at most one answers; a 404 means the CRD is
/// not installed.
async fn served(api: &Api<EgressPublicIP>) -> Result<bool, kube::Error> {
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Resolves once the CRD is served, looking every `period`.
pub(crate) async fn installed(api: &Api<EgressPublicIP>, period: Duration) {
    let mut said = false;
    loop {
        match served(api).await {
            Ok(true) => return,
            Ok(false) if !said => {
                said = true;
                tracing::info!(
                    "the EgressPublicIP CRD is not installed: public addresses are not managed (looked at again every {}s)",
                    period.as_secs()
                );
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "looking for the EgressPublicIP CRD"),
        }
        tokio::time::sleep(period).await;
    }
}

/// Resolves once the CRD is no longer served, looking every `period`.
pub(crate) async fn removed(api: &Api<EgressPublicIP>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        if let Ok(false) = served(api).await {
            tracing::info!(
                "the EgressPublicIP CRD was removed: public addresses are no longer managed"
            );
            return;
        }
    }
}
