//! Where this process runs, and a lock only one process of an identity can hold there.
//!
//! The containers of a pod share its network namespace, so a process restarted in the same pod
//! finds the same site, and an abstract Unix socket (Linux: named in the network namespace, no
//! file, released by the kernel when its process dies however it dies) is a lock that a live
//! earlier process still holds and a dead one does not. Holding it is what lets a restarted
//! process take its own pod's Lease at once: the process that wrote it cannot be running.

use std::time::Duration;

/// How often a waiting process tries the lock: a failed bind costs one system call, and the
/// sooner it notices the end of the other process, the sooner it resumes the Lease.
const LOCK_POLL: Duration = Duration::from_millis(200);

/// The lock for one (cluster, namespace, Lease, identity), held until dropped.
#[derive(Debug)]
pub(crate) struct SiteLock {
    #[cfg(target_os = "linux")]
    _socket: Option<std::os::unix::net::UnixListener>,
    site: String,
}

impl SiteLock {
    /// Takes the lock for `scope`, waiting while another process holds it. Where no lock can be
    /// had (another OS, an odd sandbox) it returns at once, without a site: such a process never
    /// takes a Lease before it expires.
    pub(crate) async fn acquire(scope: &str) -> Self {
        let name = lock_name(scope);
        let mut told = false;
        loop {
            match bind(&name) {
                Bound::Held(lock) => return lock,
                Bound::Unsupported(reason) => {
                    tracing::warn!(%reason, "no process lock: a restarted process waits for its own lease to expire");
                    return Self::none();
                }
                Bound::Busy => {
                    if !told {
                        tracing::info!(
                            "another process with this identity runs in this pod; waiting for it to end"
                        );
                        told = true;
                    }
                    tokio::time::sleep(LOCK_POLL).await;
                }
            }
        }
    }

    /// Where the holder runs (empty when unknown).
    pub(crate) fn site(&self) -> &str {
        &self.site
    }

    fn none() -> Self {
        Self {
            #[cfg(target_os = "linux")]
            _socket: None,
            site: String::new(),
        }
    }
}

enum Bound {
    Held(SiteLock),
    Busy,
    Unsupported(String),
}

#[cfg(target_os = "linux")]
fn bind(name: &str) -> Bound {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};

    let Some(site) = current_site() else {
        return Bound::Unsupported("the boot id or network namespace is unreadable".into());
    };
    let address = match SocketAddr::from_abstract_name(name.as_bytes()) {
        Ok(address) => address,
        Err(e) => return Bound::Unsupported(e.to_string()),
    };
    match UnixListener::bind_addr(&address) {
        Ok(socket) => Bound::Held(SiteLock {
            _socket: Some(socket),
            site,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Bound::Busy,
        Err(e) => Bound::Unsupported(e.to_string()),
    }
}

#[cfg(not(target_os = "linux"))]
fn bind(_name: &str) -> Bound {
    Bound::Unsupported("abstract Unix sockets are Linux-only".into())
}

/// `<boot id>:<network namespace>`: the same for the containers of one pod, different for a pod
/// of the same name elsewhere, or after a reboot.
#[cfg(target_os = "linux")]
fn current_site() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let netns = std::fs::read_link("/proc/self/ns/net").ok()?;
    let (boot, netns) = (boot.trim(), netns.to_string_lossy());
    (!boot.is_empty() && !netns.is_empty()).then(|| format!("{boot}:{netns}"))
}

/// A short, stable lock name for `scope` (FNV-1a, whose value never changes between builds, so
/// an old and a new build of the same pod exclude each other).
fn lock_name(scope: &str) -> String {
    let hash = scope.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("cloudnet-reconciler-leader-{hash:016x}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn lock_names_are_stable_and_differ_by_scope() {
        assert_eq!(
            lock_name("a"),
            "cloudnet-reconciler-leader-af63dc4c8601ec8c"
        );
        assert_ne!(
            lock_name("https://10.0.0.1/ns/lease/pod-a"),
            lock_name("https://10.0.0.1/ns/lease/pod-b")
        );
    }

    #[cfg(target_os = "linux")]
    #[tokio::test(start_paused = true)]
    async fn a_second_holder_waits_until_the_first_is_dropped() {
        let scope = format!("test-{}-{}", std::process::id(), line!());
        let first = SiteLock::acquire(&scope).await;
        assert!(!first.site().is_empty());
        let second = tokio::spawn({
            let scope = scope.clone();
            async move { SiteLock::acquire(&scope).await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!second.is_finished());
        drop(first);
        let second = second.await.unwrap();
        assert!(!second.site().is_empty());
        // Another scope is another lock.
        let other = SiteLock::acquire(&format!("{scope}-other")).await;
        assert_eq!(other.site(), second.site());
    }
}
