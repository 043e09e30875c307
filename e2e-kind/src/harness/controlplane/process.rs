//! Child processes that cannot outlive the test process.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

type SpawnJob = (Command, mpsc::SyncSender<io::Result<Child>>);

/// A child process, killed when dropped and, through `PR_SET_PDEATHSIG`, when this process dies
/// without dropping it (a panic that aborts, a static never dropped, SIGKILL).
#[derive(Debug)]
pub struct Supervised {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &'static str, mut command: Command, log: &Path) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own process group: a Ctrl-C in the terminal reaches only the harness, which
            // then stops the children in order.
            .process_group(0);
        die_with_parent(&mut command);
        let child =
            spawn_from_long_lived_thread(command).with_context(|| format!("starting {name}"))?;
        Ok(Self {
            name,
            child,
            log: log.to_path_buf(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has already exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for the process to exit: its status, or an error carrying the tail
    /// of its log if it still runs.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "{} did not exit within {timeout:?}\n{}",
                    self.name,
                    self.log_tail(40)
                );
            }
            // `Child` offers no async wait; std's blocking one would hold a runtime thread.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The last `lines` lines of the process's output, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            // The end of a long log is what explains a failure; skip to the last 64 KiB.
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
            let _ = file.read_to_string(&mut text);
        }
        let all: Vec<&str> = text.lines().collect();
        let tail = &all[all.len().saturating_sub(lines)..];
        format!(
            "--- last {} lines of {} ({}) ---\n{}",
            tail.len(),
            self.name,
            self.log.display(),
            tail.join("\n")
        )
    }

    /// Asks the process to end (SIGTERM, as the kubelet does), without waiting for it.
    pub fn terminate(&self) -> Result<()> {
        self.signal("TERM")
    }

    /// Sends signal `name` (`TERM`, `STOP`, `CONT`, ...) to the process.
    pub fn signal(&self, name: &str) -> Result<()> {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.pid().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -{name} {} failed", self.pid());
        Ok(())
    }

    /// Kills the process and reaps it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. Test
/// threads end with their test, so every child is forked from one thread that lives as long as
/// the process; the child then dies exactly when this process does.
fn spawn_from_long_lived_thread(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<io::Result<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("cloudnet-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })?;
        Ok(jobs)
    });
    let jobs = spawner
        .as_ref()
        .map_err(|e| io::Error::new(e.kind(), e.to_string()))?;
    let (reply, result) = mpsc::sync_channel(1);
    jobs.send((command, reply))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| io::Error::other("spawner thread is gone"))?
}

#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only prctl and getppid,
    // both async-signal-safe; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then nobody would kill us.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::other("parent exited during spawn"));
            }
            Ok(())
        });
    }
}
