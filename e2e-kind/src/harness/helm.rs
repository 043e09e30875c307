//! The helm CLI (built from its Go module by `helm/build.sh`) run on `charts/cloudnet`: lint,
//! render and install, for the chart tests and the cluster test.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Environment variable naming the directory holding `helm` (`e2e-kind/helm/build.sh` prints it).
pub const HELM_BIN_ENV: &str = "CLOUDNET_HELM_BIN";

/// The chart's directory in this checkout.
pub fn chart_dir() -> PathBuf {
    crate::crate_file("../charts/cloudnet")
}

/// A helm binary, with a private configuration and cache (no repository, plugin or registry
/// state of the machine's user leaks in).
#[derive(Clone, Debug)]
pub struct Helm {
    bin: PathBuf,
    home: PathBuf,
}

impl Helm {
    /// `helm` from `$CLOUDNET_HELM_BIN`, or else built by `helm/build.sh` (a no-op once cached).
    /// Blocking; memoised for the process.
    pub fn locate() -> Result<Self> {
        static FOUND: OnceLock<Helm> = OnceLock::new();
        if let Some(found) = FOUND.get() {
            return Ok(found.clone());
        }
        let dir = match std::env::var_os(HELM_BIN_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => crate::harness::cache_script::run(&crate::crate_file("helm/build.sh"))?,
        };
        let bin = dir.join("helm");
        if !bin.is_file() {
            bail!("{} is missing", bin.display());
        }
        let home = crate::harness::controlplane::cache_root()
            .join("helm")
            .join("home");
        Ok(FOUND.get_or_init(|| Self { bin, home }).clone())
    }

    /// Runs helm with `args`: its stdout, or an error carrying its stderr.
    pub fn run<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(&self.bin);
        for (var, dir) in [
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_DATA_HOME", "data"),
        ] {
            command.env(var, self.home.join(dir));
        }
        let output = command.args(args).output().context("running helm")?;
        if !output.status.success() {
            bail!(
                "helm failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8(output.stdout)?)
    }

    /// `helm lint --strict` of the chart with `--set` values `set`.
    pub fn lint(&self, set: &[&str]) -> Result<String> {
        let chart = chart_dir();
        let mut args = vec![
            OsStr::new("lint"),
            OsStr::new("--strict"),
            chart.as_os_str(),
        ];
        args.extend(set_args(set));
        self.run(args)
    }

    /// The objects `helm template --include-crds` renders from the chart with `--set` values
    /// `set`, as release `cloudnet` in namespace `default`.
    pub fn template(&self, set: &[&str]) -> Result<Vec<Value>> {
        let chart = chart_dir();
        let mut args = vec![
            OsStr::new("template"),
            OsStr::new("cloudnet"),
            chart.as_os_str(),
            OsStr::new("--include-crds"),
        ];
        args.extend(set_args(set));
        parse_documents(&self.run(args)?)
    }

    /// `helm install` (or `helm upgrade`: `verb`) of release `cloudnet` of the chart into
    /// `namespace` of the cluster `kubeconfig` names, with the values file `values`; it returns
    /// once the objects are written (no `--wait`).
    pub fn release(
        &self,
        verb: &str,
        kubeconfig: &Path,
        namespace: &str,
        values: &Path,
    ) -> Result<String> {
        let chart = chart_dir();
        self.run([
            OsStr::new(verb),
            OsStr::new("cloudnet"),
            chart.as_os_str(),
            OsStr::new("--kubeconfig"),
            kubeconfig.as_os_str(),
            OsStr::new("--namespace"),
            OsStr::new(namespace),
            OsStr::new("--values"),
            values.as_os_str(),
        ])
    }
}

fn set_args<'a>(set: &'a [&'a str]) -> impl Iterator<Item = &'a OsStr> {
    set.iter()
        .flat_map(|s| [OsStr::new("--set"), OsStr::new(*s)])
}

/// The Kubernetes objects of a multi-document YAML stream (empty documents skipped).
pub fn parse_documents(yaml: &str) -> Result<Vec<Value>> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(yaml).context("parsing rendered YAML")?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}
