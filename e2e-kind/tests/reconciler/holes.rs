//! Connections to kube-apiserver that stop answering, as a remote apiserver behind a load
//! balancer or a rolling hosted control plane leaves them: a forwarder ([`TcpCut`]'s hole) passes
//! no byte on any open connection and holds new ones unanswered for 10, 20 or 45 s; every
//! connection of before and during the hole stays dead for good. The reconciler process (default
//! leader timings and request timeout) stays up, and an object created when the hole closes is
//! Assigned within 15 s: its dead connections are found by HTTP/2 pings, its requests time out
//! and are retried on new connections, its watches restart.
//!
//! Each hole is its own test with its own control plane, so they run side by side.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant, SystemTime};

use crate::support::{assigned_within, control_plane, create, create_node_object};
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::fakes::tcpcut::TcpCut;
use cloudnet_e2e::harness::controlplane::Supervised;
use cloudnet_reconciler::leader::LEASE_NAME;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

/// What the issue fixes: an object created as the hole closes is Assigned within this.
const AFTER_THE_HOLE: Duration = Duration::from_secs(15);

/// The reconciler through a forwarder the test can open a hole in.
struct Behind {
    process: Supervised,
    forwarder: TcpCut,
}

impl Behind {
    async fn start(cp: &ControlPlane, name: &'static str) -> Self {
        let forwarder = TcpCut::start(cp.apiserver_addr().unwrap()).await.unwrap();
        let kubeconfig = cp
            .kubeconfig_via(forwarder.addr(), &format!("{name}.kubeconfig"))
            .unwrap();
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // The default leader timings and request timeout: what a hole is measured against.
        let args = [
            format!("-kubeconfig={}", kubeconfig.display()),
            "-secret-name=cloud-credentials".into(),
            "-platform-type=Memory".into(),
            "--controller-namespace=default".into(),
            "--drift-period=0".into(),
            format!("--metrics-bind-address={metrics}"),
        ];
        let mut command = crate::process::entry_command(&args);
        command.env(
            "RUST_LOG",
            std::env::var("CLOUDNET_HOLES_LOG")
                .unwrap_or_else(|_| "info,kube_runtime=debug".into()),
        );
        let process =
            Supervised::spawn(name, command, &cp.dir().join(format!("{name}.log"))).unwrap();
        Self { process, forwarder }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.process.exited() {
            panic!(
                "the reconciler exited: {status}\n{}",
                self.process.log_tail(40)
            );
        }
    }
}

/// When the reconciler last renewed its Lease, by its clock (the same machine's).
async fn renewed(admin: &Client) -> Option<SystemTime> {
    let lease = Api::<Lease>::namespaced(admin.clone(), "default")
        .get_opt(LEASE_NAME)
        .await
        .ok()??;
    let renew = lease.spec?.renew_time?.0;
    let nanos = u64::try_from(renew.as_nanosecond()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos))
}

async fn ride_out(hole: Duration, name: &'static str, prefix: &str) {
    let (cp, admin) = control_plane().await;
    let node = format!("{name}-node");
    create_node_object(&admin, &node).await;
    let mut reconciler = Behind::start(&cp, name).await;
    let before = format!("{prefix}.1");
    create(&admin, &before, &node).await;
    assigned_within(
        &admin,
        &mut reconciler.process,
        &before,
        &node,
        Duration::from_secs(90),
    )
    .await;

    let opened = (Instant::now(), SystemTime::now());
    reconciler.forwarder.open_hole();
    // The hole's length is the scenario: the test waits it out, checking the process lives.
    while opened.0.elapsed() < hole {
        reconciler.assert_running();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    reconciler.forwarder.close_hole();
    let closed = (Instant::now(), SystemTime::now());
    eprintln!(
        "{name}: hole opened at {:?}, closed at {:?}",
        opened.1, closed.1
    );
    let after = format!("{prefix}.2");
    create(&admin, &after, &node).await;
    let took = assigned_within(
        &admin,
        &mut reconciler.process,
        &after,
        &node,
        AFTER_THE_HOLE,
    )
    .await;
    let assigned = closed.0 + took;
    // The first Lease renewal after the hole opened: the reconciler's first write that got through.
    let mut first_write = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while first_write.is_none() && Instant::now() < deadline {
        first_write = renewed(&admin).await.filter(|at| *at > closed.1);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_write = first_write.and_then(|at| at.duration_since(opened.1).ok());
    eprintln!(
        "hole of {hole:?}: first successful write (a Lease renewal) {first_write:?} after the \
         connections went dead; the object created as the hole closed was Assigned {:?} after it \
         closed ({:?} after it opened)",
        assigned - closed.0,
        assigned - opened.0,
    );
    reconciler.assert_running();
    // Asked for a log level, the run shows its log whatever the outcome (the run directory goes).
    if std::env::var_os("CLOUDNET_HOLES_LOG").is_some() {
        eprintln!("{}", reconciler.process.log_tail(600));
    }
}

#[tokio::test]
async fn the_reconciler_rides_out_a_10s_hole() {
    ride_out(Duration::from_secs(10), "hole-10", "10.45.10").await;
}

#[tokio::test]
async fn the_reconciler_rides_out_a_20s_hole() {
    ride_out(Duration::from_secs(20), "hole-20", "10.45.20").await;
}

#[tokio::test]
async fn the_reconciler_rides_out_a_45s_hole() {
    ride_out(Duration::from_secs(45), "hole-45", "10.45.45").await;
}
