//! Runs a script that installs something into the cache once and prints where it is.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Runs `script` (e.g. `controlplane/build.sh`, `moto/venv.sh`) and returns the directory it
/// prints on its last line. Its progress on stderr goes to ours, so a first, slow install shows.
pub fn run(script: &Path) -> Result<PathBuf> {
    run_with(script, &[])
}

/// [`run`] with arguments (e.g. `prometheus/fixtures.sh crds`).
pub fn run_with(script: &Path, args: &[&str]) -> Result<PathBuf> {
    let output = Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed with {}", script.display(), output.status);
    }
    let stdout = String::from_utf8(output.stdout)
        .with_context(|| format!("{} printed a non-UTF-8 path", script.display()))?;
    let dir = stdout
        .lines()
        .last()
        .filter(|l| !l.is_empty())
        .with_context(|| format!("{} printed no directory", script.display()))?;
    Ok(PathBuf::from(dir))
}
