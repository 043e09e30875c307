//! The reconciler of the local system, running as its ServiceAccount, leads, says so in
//! `cloudnet_leader`, and answers its probes: `/healthz` and `/readyz` (its first lists succeeded
//! with the shipped roles).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use cloudnet_e2e::harness::e2e::{Cluster, metrics, wait};

#[tokio::test]
async fn the_reconciler_leads_reports_it_and_is_ready() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::shared(module_path!()))
        .await
        .unwrap();
    let Some(local) = cluster.local() else {
        println!("not the local system: the reconciler's endpoint is not reachable from here");
        return;
    };
    let metrics_url = local.metrics_url();
    let base = metrics_url.trim_end_matches("/metrics").to_owned();
    // The first lease takes a retry period at most; readiness follows the first lists.
    wait::until(
        Duration::from_secs(60),
        "the reconciler to lead and be ready",
        || {
            let (metrics_url, base) = (&metrics_url, &base);
            async move {
                let Ok(text) = metrics::scrape(metrics_url).await else {
                    return Ok(false);
                };
                let leading = metrics::sum(&text, "cloudnet_leader", &[]) == 1.0;
                Ok(leading && metrics::scrape(&format!("{base}/readyz")).await.is_ok())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", local.log_tails()));
    metrics::scrape(&format!("{base}/healthz")).await.unwrap();
}
