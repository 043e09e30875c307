//! moto's EC2 server (PyPI `moto[server]`) on a free 127.0.0.1 port, installed once into a
//! versioned Python venv in the cache by `moto/venv.sh`.
//!
//! moto keeps its state per account and region, so tests of one binary can share one server
//! ([`MotoServer::shared`]) as long as each uses its own region; a test that needs a pristine
//! server starts its own ([`MotoServer::start`], about two seconds).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::harness::controlplane::{Supervised, cache_root};

/// Environment variable naming an existing venv that holds `bin/moto_server`.
pub const VENV_ENV: &str = "CLOUDNET_MOTO_VENV";
/// How long moto may take to answer after start on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Start attempts: a port picked as free can be taken by a parallel test before moto binds it.
const START_ATTEMPTS: usize = 3;

/// A running moto server. Dropping it kills the process and removes its log.
#[derive(Debug)]
pub struct MotoServer {
    process: Supervised,
    url: String,
    log: PathBuf,
}

impl MotoServer {
    /// Starts a fresh moto server of its own.
    pub async fn start() -> Result<Self> {
        let venv = tokio::task::spawn_blocking(locate_venv).await??;
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            let log = log_path()?;
            let mut command = Command::new(venv.join("bin/moto_server"));
            command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
            let mut process = Supervised::spawn("moto_server", command, &log)?;
            let url = format!("http://127.0.0.1:{port}");
            match wait_ready(&url, &mut process).await {
                Ok(()) => return Ok(Self { process, url, log }),
                Err(e) => {
                    let e = e.context(process.log_tail(20));
                    drop(process);
                    let _ = std::fs::remove_file(&log);
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("moto did not start")))
    }

    /// One moto server shared by every test of this test binary; tests sharing it must each use
    /// their own region. Its process dies with the test process.
    pub async fn shared() -> Result<&'static Self> {
        static SHARED: tokio::sync::OnceCell<MotoServer> = tokio::sync::OnceCell::const_new();
        SHARED.get_or_try_init(Self::start).await
    }

    /// The endpoint URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Forgets every resource in every region.
    pub async fn reset(&self) -> Result<()> {
        let status = request(&format!("{}/moto-api/reset", self.url), "POST").await?;
        if status != 200 {
            bail!("moto reset answered HTTP {status}");
        }
        Ok(())
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        self.process.stop();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The venv holding `bin/moto_server`: `$CLOUDNET_MOTO_VENV`, or else the one `moto/venv.sh`
/// installs into the cache (a no-op once installed). Blocking; memoised for the process.
pub fn locate_venv() -> Result<PathBuf> {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    if let Some(found) = FOUND.get() {
        return Ok(found.clone());
    }
    let venv = match std::env::var_os(VENV_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => install_venv()?,
    };
    if !venv.join("bin/moto_server").is_file() {
        bail!("{} holds no bin/moto_server", venv.display());
    }
    Ok(FOUND.get_or_init(|| venv).clone())
}

fn install_venv() -> Result<PathBuf> {
    crate::harness::cache_script::run(&crate::crate_file("moto/venv.sh"))
}

async fn wait_ready(url: &str, process: &mut Supervised) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let probe = format!("{url}/moto-api/reset");
    loop {
        if let Some(status) = process.exited() {
            bail!("moto_server exited early with {status}");
        }
        let answer = match request(&probe, "POST").await {
            Ok(200) => return Ok(()),
            Ok(status) => format!("HTTP {status}"),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!("moto not ready within {READY_TIMEOUT:?}; last answer: {answer}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn request(url: &str, method: &str) -> Result<u16> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .body(Empty::new())?;
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .context("moto did not answer within 10s")??;
    let status = response.status().as_u16();
    // Drain the body so the connection closes cleanly.
    let _ = response.into_body().collect().await;
    Ok(status)
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// `<cache>/moto/<pid>-<n>.log`; logs of dead processes are swept first.
fn log_path() -> Result<PathBuf> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = cache_root().join("moto");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name.to_str().and_then(|n| n.split('-').next());
            if pid.is_some_and(|p| p.parse::<u32>().is_ok() && !Path::new("/proc").join(p).exists())
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    Ok(dir.join(format!(
        "{}-{}.log",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )))
}
