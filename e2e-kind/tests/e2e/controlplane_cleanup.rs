//! No etcd or kube-apiserver outlives the test process that started it, however that process ends.

// Test code: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cloudnet_e2e::ControlPlane;

const PID_FILE_ENV: &str = "CLOUDNET_TEST_PID_FILE";
const MODE_ENV: &str = "CLOUDNET_TEST_EXIT_MODE";

/// Run only as a child of `children_die_with_the_test_process`: starts a control plane, records
/// its pids, then ends the process the way the parent asked.
#[tokio::test]
#[ignore = "driven by children_die_with_the_test_process"]
async fn owner_that_dies() {
    let pid_file = std::env::var(PID_FILE_ENV).expect("run by the parent test");
    let cp = ControlPlane::start().await.expect("control plane starts");
    let pids = cp.pids().map(|p| p.to_string()).join(" ");
    std::fs::write(&pid_file, pids).unwrap();
    match std::env::var(MODE_ENV).as_deref() {
        // No destructor runs: only the kernel's parent-death signal can stop the children.
        Ok("abort") => std::process::abort(),
        // Unwinding drops the control plane.
        _ => panic!("the owner panics on purpose"),
    }
}

fn is_gone(pid: &str) -> bool {
    // A killed child that nobody reaped yet is a zombie: dead all the same.
    match std::fs::read_to_string(Path::new("/proc").join(pid).join("stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn children_die_with_the_test_process() {
    for mode in ["panic", "abort"] {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pids");
        // Output captured: the owner's own failing summary must not read as this suite's.
        let owner = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                cloudnet_e2e::test_name(module_path!(), "owner_that_dies").as_str(),
                "--ignored",
            ])
            .env(PID_FILE_ENV, &pid_file)
            .env(MODE_ENV, mode)
            .output()
            .unwrap();
        assert!(!owner.status.success(), "{mode}: the owner must fail");
        let pids = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|_| panic!("{mode}: the owner never recorded its pids"));
        let pids: Vec<&str> = pids.split_whitespace().collect();
        assert_eq!(pids.len(), 2, "{mode}: {pids:?}");
        let deadline = Instant::now() + Duration::from_secs(15);
        for pid in &pids {
            while !is_gone(pid) {
                assert!(
                    Instant::now() < deadline,
                    "{mode}: process {pid} outlived its owner"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
