//! Finds kube-apiserver, etcd and kubectl, building them into the cache on first use.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// Environment variable naming a directory that already holds the three binaries.
pub const BIN_DIR_ENV: &str = "CLOUDNET_CONTROLPLANE_BIN";

/// Paths of the control plane binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// etcd.
    pub etcd: PathBuf,
    /// kubectl, for the demo and for debugging.
    pub kubectl: PathBuf,
}

impl Binaries {
    fn in_dir(dir: &Path) -> Result<Self> {
        let binaries = Self {
            kube_apiserver: dir.join("kube-apiserver"),
            etcd: dir.join("etcd"),
            kubectl: dir.join("kubectl"),
        };
        for path in [&binaries.kube_apiserver, &binaries.etcd, &binaries.kubectl] {
            if !path.is_file() {
                bail!("{} is missing", path.display());
            }
        }
        Ok(binaries)
    }

    /// What `kubectl kustomize dir` renders (no apiserver needed), or an error with kubectl's
    /// stderr.
    pub fn kustomize(&self, dir: &Path) -> Result<String> {
        let out = std::process::Command::new(&self.kubectl)
            .arg("kustomize")
            .arg(dir)
            .output()
            .context("running kubectl kustomize")?;
        if !out.status.success() {
            bail!(
                "kubectl kustomize {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }
}

/// The binaries, from `$CLOUDNET_CONTROLPLANE_BIN` or else built by `controlplane/build.sh`
/// (a no-op once cached). Blocking; the result is memoised for the process.
pub fn locate() -> Result<Binaries> {
    static FOUND: OnceLock<Binaries> = OnceLock::new();
    if let Some(found) = FOUND.get() {
        return Ok(found.clone());
    }
    let dir = match std::env::var_os(BIN_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => build()?,
    };
    let binaries = Binaries::in_dir(&dir)
        .with_context(|| format!("control plane binaries in {}", dir.display()))?;
    Ok(FOUND.get_or_init(|| binaries).clone())
}

fn build() -> Result<PathBuf> {
    crate::harness::cache_script::run(&crate::crate_file("controlplane/build.sh"))
}
