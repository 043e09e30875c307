//! Reading the reconciler's Prometheus endpoint: the suite compares its own count of batches
//! with the calls EC2 saw at the proxy.

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

#[cfg(test)]
mod tests {
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
