//! The monitoring fixtures, found through the environment or else installed by
//! `prometheus/fixtures.sh` (a no-op once cached): promtool, built from the pinned
//! `github.com/prometheus/prometheus` module, and the prometheus-operator CRDs of the pinned
//! `github.com/prometheus-operator/prometheus-operator` module.

use std::path::PathBuf;

use anyhow::{Result, bail};

/// Environment variable naming the directory that holds `promtool`.
pub const PROMTOOL_DIR_ENV: &str = "CLOUDNET_PROMTOOL_BIN";
/// Environment variable naming the directory that holds the prometheus-operator CRDs.
pub const OPERATOR_CRDS_ENV: &str = "CLOUDNET_PROMETHEUS_CRDS";

fn fixture(env: &str, args: &[&str]) -> Result<PathBuf> {
    match std::env::var_os(env) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => crate::harness::cache_script::run_with(
            &crate::crate_file("prometheus/fixtures.sh"),
            args,
        ),
    }
}

/// The promtool binary. Blocking.
pub fn promtool() -> Result<PathBuf> {
    let path = fixture(PROMTOOL_DIR_ENV, &[])?.join("promtool");
    if !path.is_file() {
        bail!("{} is missing", path.display());
    }
    Ok(path)
}

/// The directory of the ServiceMonitor, PodMonitor and PrometheusRule CRDs. Blocking.
pub fn operator_crds() -> Result<PathBuf> {
    let dir = fixture(OPERATOR_CRDS_ENV, &["crds"])?;
    if !dir.is_dir() {
        bail!("{} is missing", dir.display());
    }
    Ok(dir)
}
