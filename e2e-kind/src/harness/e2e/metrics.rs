//! Reading the reconciler's Prometheus endpoint: the suite compares its own count of batches
//! with the calls EC2 saw at the proxy, and checks that the shipped dashboard queries only
//! metrics the binaries expose.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The exposition text at `url`.
pub async fn scrape(url: &str) -> Result<String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = http::Request::get(url).body(Empty::new())?;
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .context("the metrics endpoint did not answer within 10s")??;
    if !response.status().is_success() {
        bail!("{url} answered {}", response.status());
    }
    let body = response.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The sum of every sample of `metric` whose labels include all of `labels` (`key="value"`).
pub fn sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(metric)?;
            let (selector, value) = match rest.strip_prefix('{') {
                Some(rest) => rest.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            labels
                .iter()
                .all(|l| selector.split(',').any(|s| s == *l))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Sum of `metric` samples for one reconciler operation (`operation="…"`), as a count.
pub fn operation_count(text: &str, metric: &str, operation: &str) -> u64 {
    sum(text, metric, &[&format!("operation=\"{operation}\"")]) as u64
}

/// Whether the exposition `text` has a sample of `metric` (exactly that name, e.g. a histogram's
/// `_bucket` series or a counter's `_total`).
pub fn exposes(text: &str, metric: &str) -> bool {
    text.lines().any(|line| {
        line.strip_prefix(metric)
            .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
    })
}

/// Whether `metric` is one of the egress gateway front end's, which have series only where
/// gateways exist (a family with none is not exposed at all): the dashboard's check of those runs
/// in the reconciler tier's gateway test, the rest in the e2e tier's throttled system.
pub fn is_gateway_metric(metric: &str) -> bool {
    ["cloudnet_egress_gateway_", "cloudnet_node_agent_"]
        .iter()
        .any(|prefix| metric.starts_with(prefix))
}

/// Every `cloudnet_*` metric name the PromQL strings of a Grafana dashboard (its panels' `expr`
/// and its variables' queries) name.
pub fn dashboard_metrics(dashboard: &serde_json::Value) -> std::collections::BTreeSet<String> {
    fn walk(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr" | "query" | "definition", serde_json::Value::String(s)) => {
                            out.push(s.clone());
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut queries = Vec::new();
    walk(dashboard, &mut queries);
    queries
        .iter()
        .flat_map(|q| {
            q.match_indices("cloudnet_").map(move |(at, _)| {
                q[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_every_metric_a_query_reads_and_finds_exact_samples() {
        let dashboard = serde_json::json!({
            "panels": [{"targets": [{"expr": "sum(rate(cloudnet_a_total[5m])) / cloudnet_b{x=\"y\"}"}]}],
            "templating": {"list": [{"query": {"query": "label_values(cloudnet_c, job)"}}]}
        });
        let names: Vec<String> = dashboard_metrics(&dashboard).into_iter().collect();
        assert_eq!(names, ["cloudnet_a_total", "cloudnet_b", "cloudnet_c"]);
        let text = "# HELP cloudnet_b x\ncloudnet_b_bucket{le=\"1\"} 1\ncloudnet_c 3\n";
        assert!(exposes(text, "cloudnet_c"));
        assert!(exposes(text, "cloudnet_b_bucket"));
        assert!(
            !exposes(text, "cloudnet_b"),
            "only a HELP line and another series"
        );
    }

    use super::*;

    #[test]
    fn sums_only_samples_with_every_label() {
        let text = "# TYPE x histogram\n\
                    x_count{provider=\"aws\",operation=\"attach\"} 3\n\
                    x_count{provider=\"aws\",operation=\"detach\"} 2\n\
                    x_count_total 9\n\
                    x_count 1\n";
        assert_eq!(sum(text, "x_count", &["operation=\"attach\""]), 3.0);
        assert_eq!(sum(text, "x_count", &["provider=\"aws\""]), 5.0);
        assert_eq!(sum(text, "x_count", &[]), 6.0);
    }
}
