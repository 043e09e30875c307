//! Leader election between reconciler processes on the real control plane: a leader cut off from
//! kube-apiserver stops calling the cloud before its lease can expire for the standby, and stays
//! running as a standby; a leader whose kube-apiserver is down for many lease durations stops
//! calling the cloud, keeps running, and leads again once it is back; a clean exit
//! hands the lease over at once; a second process of the same pod waits while the first lives and
//! resumes its lease at once when it dies; a standby reads the credentials only when it takes over.
//!
//! Each replica reaches EC2 (moto, one region per test) through a fault proxy of its own, which
//! counts every call it sees, so the calls of each replica are counted apart. A replica that is to
//! be cut off reaches kube-apiserver through a [`TcpCut`].
//!
//! Replicas are this test binary re-executed to run only `leadership_replica_entry`, which calls
//! `cloudnet_reconciler::process::run_process` on a single-threaded runtime exactly as `main` does
//! (see process.rs for why not the binary).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{
    control_plane, create, events_about, force_delete, ledger_entries, wait_assigned, wait_until,
};
use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteCounts, RouteMatch, ServerTls};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::fakes::tcpcut::TcpCut;
use cloudnet_e2e::harness::controlplane::Supervised;
use cloudnet_e2e::harness::e2e::ec2::{create_network, holders_of, moto_settings, run_instances};
use cloudnet_e2e::harness::e2e::local;
use cloudnet_e2e::harness::e2e::plugin::create_node;
use cloudnet_e2e::harness::webhook::{serving_cert, test_ca};
use cloudnet_reconciler::cloud::aws::build_sdk_client;
use cloudnet_reconciler::process as app;
use cloudnet_reconciler::process::Flags;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ARGS_ENV: &str = "CLOUDNET_LEADERSHIP_TEST_ARGS";
/// Upstream's Lease, in the namespace the replicas are given.
const LEASE: &str = "cloud-network-config-controller-lock";
const NAMESPACE: &str = "default";
pub(crate) const NODE: &str = "leadership-node";
/// How late after its deadline a call may still be seen: timer and scheduling delays of a loaded
/// machine, and the proxy reading the request.
const SLACK: Duration = Duration::from_millis(500);

/// Lease timings given to the replicas, in seconds.
#[derive(Clone, Copy, Debug)]
struct Timings {
    lease: u64,
    renew: u64,
    retry: u64,
}

/// Short, so a cut-off test takes seconds.
const SHORT: Timings = Timings {
    lease: 6,
    renew: 4,
    retry: 2,
};
/// client-go's defaults.
const DEFAULT: Timings = Timings {
    lease: 15,
    renew: 10,
    retry: 2,
};
/// How long the outage test keeps kube-apiserver down, in seconds, unless
/// `CLOUDNET_OUTAGE_SECS` says otherwise (300 is the outage the issue names; run it by hand).
const OUTAGE_SECS: u64 = 25;

#[test]
#[ignore = "entry point of the replica processes the other tests start"]
fn leadership_replica_entry() {
    let Ok(args) = std::env::var(ARGS_ENV) else {
        return;
    };
    let argv = std::iter::once("cloudnet-reconciler".to_owned())
        .chain(args.split('\u{1f}').map(str::to_owned));
    let flags = Flags::from_args(argv).unwrap();
    app::init_logs(flags.log_format);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(app::run_process(flags)).unwrap();
}

/// The cluster and the cloud the replicas of one test share: a control plane of its own, and one
/// moto instance (in the test's own region) registered as Node [`NODE`].
pub(crate) struct World {
    pub(crate) cp: ControlPlane,
    pub(crate) client: Client,
    region: &'static str,
    /// EC2 (moto) in the test's region, read directly, not through any replica's proxy.
    ec2: aws_sdk_ec2::Client,
}

impl World {
    pub(crate) async fn create(region: &'static str) -> Self {
        let (cp, client) = control_plane().await;
        let moto = MotoServer::shared().await.unwrap();
        let settings = moto_settings(moto.url(), region);
        let ec2 = build_sdk_client(&settings.client, &settings.credentials).unwrap();
        let network = create_network(&ec2, "10.0.0.0/16".parse().unwrap())
            .await
            .unwrap();
        let instance = run_instances(&ec2, &network, InstanceType::M5Large, 1)
            .await
            .unwrap()
            .remove(0);
        create_node(&client, NODE, &instance).await.unwrap();
        Self {
            cp,
            client,
            region,
            ec2,
        }
    }

    /// A fault proxy in front of moto that only one replica uses.
    pub(crate) async fn proxy(&self) -> FaultProxy {
        let moto = MotoServer::shared().await.unwrap();
        FaultProxy::builder(moto.url(), Dialect::Ec2Query)
            .start()
            .await
            .unwrap()
    }

    /// A kubeconfig `name` reaching kube-apiserver through a [`TcpCut`] the test can cut.
    async fn cuttable_kubeconfig(&self, name: &str) -> (TcpCut, PathBuf) {
        let apiserver = self.cp.apiserver_addr().unwrap();
        let partition = TcpCut::start(apiserver).await.unwrap();
        let kubeconfig = self.cp.kubeconfig_via(partition.addr(), name).unwrap();
        (partition, kubeconfig)
    }

    /// A directory laid out like the mounted credentials Secret.
    pub(crate) fn secret_dir(&self, name: &str, key_id: &str) -> PathBuf {
        let dir = self.cp.dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        write_atomically(&dir.join("aws_access_key_id"), key_id.as_bytes());
        write_atomically(&dir.join("aws_secret_access_key"), b"leadership-secret");
        dir
    }

    /// The Lease's spec, if the Lease exists.
    async fn lease(&self) -> Option<LeaseSpec> {
        Api::<Lease>::namespaced(self.client.clone(), NAMESPACE)
            .get_opt(LEASE)
            .await
            .ok()
            .flatten()
            .and_then(|lease| lease.spec)
    }

    /// The holder identity, empty when nobody holds the Lease.
    pub(crate) async fn holder(&self) -> String {
        self.lease()
            .await
            .and_then(|spec| spec.holder_identity)
            .unwrap_or_default()
    }

    /// Waits until someone other than `old` holds the Lease.
    pub(crate) async fn wait_takeover(&self, old: &str) {
        wait_until(
            Duration::from_secs(60),
            "the standby to take over",
            || async move {
                let holder = self.holder().await;
                !holder.is_empty() && holder != old
            },
        )
        .await;
    }

    /// `replica-a` (reaching kube-apiserver through `kubeconfig_a`, EC2 through `ec2_a`)
    /// leading, and `replica-b` (the admin kubeconfig, `ec2_b`) serving as its standby; with
    /// the holder identity of the first. Neither checks for drift: a replica calls the cloud only
    /// for what the test does, so a count of its calls means what the test says (a drift read
    /// that passed the fence the moment before a SIGSTOP would reach EC2 after the SIGCONT).
    pub(crate) async fn leader_and_standby(
        &self,
        kubeconfig_a: &Path,
        ec2_a: &str,
        ec2_b: &str,
        secrets: &Path,
    ) -> (Replica, String, Replica) {
        let quiet = |pod, kubeconfig, ec2_url| Options {
            drift_period: 0,
            ..Options::short(pod, kubeconfig, ec2_url, secrets)
        };
        let mut a = Replica::start(self, &quiet("replica-a", kubeconfig_a, ec2_a));
        let holder_a = self.wait_for_a_holder(&mut a).await;
        let mut b = Replica::start(self, &quiet("replica-b", self.cp.kubeconfig_path(), ec2_b));
        b.wait_serving().await;
        (a, holder_a, b)
    }

    /// Waits until the Lease has a holder and returns it.
    pub(crate) async fn wait_for_a_holder(&self, replica: &mut Replica) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let holder = self.holder().await;
            if !holder.is_empty() {
                return holder;
            }
            replica.assert_running();
            assert!(
                Instant::now() < deadline,
                "nobody took the lease\n{}",
                replica.process.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Replaces `path` in one step, as the kubelet swaps a Secret mount's files.
fn write_atomically(path: &Path, content: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Every call the proxy has seen.
pub(crate) fn calls(proxy: &FaultProxy) -> u64 {
    proxy.all_counts().values().map(RouteCounts::total).sum()
}

/// The value of `cloudnet_leader` in a `/metrics` body.
fn leader_gauge(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("cloudnet_leader "))
        .and_then(|value| value.trim().parse().ok())
}

/// One reconciler process.
pub(crate) struct Replica {
    pub(crate) process: Supervised,
    metrics: String,
}

/// How to start a replica.
pub(crate) struct Options<'a> {
    /// `POD_NAME`, the identity the replica holds the lease under.
    pod: &'static str,
    /// Distinguishes the logs of processes of one pod.
    log: &'a str,
    kubeconfig: &'a Path,
    ec2_url: &'a str,
    secret_dir: &'a Path,
    ca_bundle: Option<&'a Path>,
    timings: Timings,
    /// Seconds between the leader's drift checks (`--drift-period`; 0: none, so the leader
    /// calls the cloud only for what the test does).
    drift_period: u64,
    /// More environment variables.
    env: &'a [(&'a str, &'a str)],
    /// More flags.
    args: &'a [&'a str],
}

impl<'a> Options<'a> {
    /// Replica `pod` (its log named after it) with short timings, no CA bundle, no more env.
    pub(crate) fn short(
        pod: &'static str,
        kubeconfig: &'a Path,
        ec2_url: &'a str,
        secret_dir: &'a Path,
    ) -> Self {
        Self {
            pod,
            log: pod,
            kubeconfig,
            ec2_url,
            secret_dir,
            ca_bundle: None,
            timings: SHORT,
            drift_period: 1,
            env: &[],
            args: &[],
        }
    }
}

impl Replica {
    pub(crate) fn start(world: &World, options: &Options<'_>) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let metrics = format!("127.0.0.1:{port}");
        let mut args = vec![
            format!("-kubeconfig={}", options.kubeconfig.display()),
            "-secret-name=cloud-credentials".into(),
            "-platform-type=AWS".into(),
            format!("-platform-region={}", world.region),
            format!("-platform-api-url={}", options.ec2_url),
            format!("-secret-override={}", options.secret_dir.display()),
            format!("--controller-namespace={NAMESPACE}"),
            format!("--leader-elect-lease-duration={}", options.timings.lease),
            format!("--leader-elect-renew-deadline={}", options.timings.renew),
            format!("--leader-elect-retry-period={}", options.timings.retry),
            format!("--drift-period={}", options.drift_period),
            format!("--metrics-bind-address={metrics}"),
        ];
        if let Some(ca) = options.ca_bundle {
            args.push(format!("-platform-aws-ca-override={}", ca.display()));
        }
        args.extend(options.args.iter().map(|arg| (*arg).to_owned()));
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                cloudnet_e2e::test_name(module_path!(), "leadership_replica_entry").as_str(),
                "--ignored",
                "--nocapture",
            ])
            .env(ARGS_ENV, args.join("\u{1f}"))
            .env("POD_NAME", options.pod)
            .env("RUST_LOG", "info")
            .envs(options.env.iter().copied());
        let log = world.cp.dir().join(format!("{}.log", options.log));
        let process = Supervised::spawn(options.pod, command, &log).unwrap();
        Self { process, metrics }
    }

    pub(crate) fn assert_running(&mut self) {
        if let Some(status) = self.process.exited() {
            panic!("replica exited: {status}\n{}", self.process.log_tail(40));
        }
    }

    /// Waits until the metrics endpoint answers, which the process opens before campaigning.
    pub(crate) async fn wait_serving(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.serves_metrics().await {
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "metrics endpoint not up\n{}",
                self.process.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn serves_metrics(&self) -> bool {
        self.scrape().await.is_some()
    }

    /// The `/metrics` body, or `None` while the endpoint does not answer 200.
    async fn scrape(&self) -> Option<String> {
        self.get("/metrics")
            .await
            .and_then(|(status, body)| (status == 200).then_some(body))
    }

    /// The status and body of a GET of `path` on the metrics endpoint.
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = tokio::net::TcpStream::connect(&self.metrics).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    }
}

#[tokio::test]
async fn a_leader_cut_off_from_the_apiserver_stops_calling_the_cloud_before_the_standby_takes_over()
{
    let world = World::create("eu-west-3").await;
    let (proxy_a, proxy_b) = (world.proxy().await, world.proxy().await);
    let (partition, kubeconfig_a) = world.cuttable_kubeconfig("kubeconfig-a").await;
    let secrets = world.secret_dir("secret", "AKIDLEADERSHIP");
    let options = |pod, kubeconfig, ec2_url| Options {
        pod,
        log: pod,
        kubeconfig,
        ec2_url,
        secret_dir: &secrets,
        ca_bundle: None,
        env: &[],
        args: &[],
        timings: SHORT,
        drift_period: 1,
    };
    let mut a = Replica::start(&world, &options("replica-a", &kubeconfig_a, proxy_a.url()));
    let holder_a = world.wait_for_a_holder(&mut a).await;
    create(&world.client, "10.0.15.1", NODE).await;
    wait_assigned(&world.client, "10.0.15.1", NODE).await;
    let mut b = Replica::start(
        &world,
        &options("replica-b", world.cp.kubeconfig_path(), proxy_b.url()),
    );
    b.wait_serving().await;
    // The leader is calling the cloud (its drift checks), and keeps doing so until it stops.
    let before = calls(&proxy_a);
    wait_until(Duration::from_secs(30), "the leader's drift checks", || {
        std::future::ready(calls(&proxy_a) >= before + 2)
    })
    .await;
    assert_eq!(calls(&proxy_b), 0, "the standby called the cloud");

    let cut = Instant::now();
    partition.cut();
    // Every 20 ms, until the Lease has changed hands, the standby has called the cloud, and the
    // old leader has had three drift periods past both its renew deadline and the takeover to
    // call it again. When each proxy saw its calls is the proxy's own stamp: a slow read of the
    // Lease here must not make a call look late.
    let renew = Duration::from_secs(SHORT.renew);
    let mut takeover: Option<Instant> = None;
    let give_up = cut + Duration::from_secs(60);
    loop {
        let now = Instant::now();
        if takeover.is_none() {
            let holder = world.holder().await;
            if !holder.is_empty() && holder != holder_a {
                takeover = Some(now);
            }
        }
        if let Some(t) = takeover
            && calls(&proxy_b) > 0
            && now > t.max(cut + renew) + Duration::from_secs(3)
        {
            break;
        }
        assert!(
            now < give_up,
            "the standby did not take over within a minute\n{}",
            b.process.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let takeover = takeover.unwrap();
    let last_call_a = proxy_a
        .arrivals()
        .map(|(_, last)| last)
        .filter(|last| *last > cut)
        .unwrap_or(cut);
    let first_call_b = proxy_b.arrivals().unwrap().0;
    eprintln!(
        "cut-off takeover: lease taken {:?} after the cut (lease {} s, renew deadline {} s); \
         old leader's last cloud call {:?} after the cut, new leader's first {:?} after it",
        takeover - cut,
        SHORT.lease,
        SHORT.renew,
        last_call_a - cut,
        first_call_b - cut,
    );
    assert!(
        last_call_a <= cut + renew + SLACK,
        "the cut-off leader still called the cloud {:?} after the cut (renew deadline {renew:?})\n{}",
        last_call_a - cut,
        a.process.log_tail(40)
    );
    assert!(
        first_call_b > last_call_a,
        "both replicas called the cloud at once"
    );
    // The new leader acts: an object created now is attached through its own path to the cloud.
    create(&world.client, "10.0.15.2", NODE).await;
    wait_assigned(&world.client, "10.0.15.2", NODE).await;
    assert!(proxy_b.counts("AssignPrivateIpAddresses").forwarded >= 1);
    // The old leader stepped down without exiting (unlike client-go's), and once it reaches
    // kube-apiserver again it stands by: the new leader keeps the Lease and only it calls EC2.
    wait_until(
        Duration::from_secs(30),
        "the old leader to report standby",
        || {
            let a = &a;
            async move {
                a.scrape()
                    .await
                    .is_some_and(|m| leader_gauge(&m) == Some(0))
            }
        },
    )
    .await;
    partition.restore();
    let quiet = calls(&proxy_a);
    let watch_until = Instant::now() + Duration::from_secs(3 * SHORT.lease);
    while Instant::now() < watch_until {
        a.assert_running();
        assert_eq!(
            calls(&proxy_a),
            quiet,
            "the deposed leader called the cloud again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(
        world.holder().await,
        holder_a,
        "the deposed leader took the lease back"
    );
    b.assert_running();
}

/// Issue 28's late call: an attach sent by a leader before it lost its lease lands on EC2 after
/// the next term has already released the IP (its object was forced out meanwhile), so no ledger
/// entry names it any more; the ledger's released record does, and the new leader's sweep takes
/// the IP off the VM again. Nothing else is called.
#[tokio::test]
async fn a_late_attach_landing_after_the_next_term_released_its_ip_is_swept_off_the_vm() {
    let world = World::create("eu-central-2").await;
    let (proxy_a, proxy_b) = (world.proxy().await, world.proxy().await);
    let (partition, kubeconfig_a) = world.cuttable_kubeconfig("kubeconfig-a").await;
    let secrets = world.secret_dir("secret", "AKIDLEADERSHIP");
    let options = |pod, kubeconfig, ec2_url| Options {
        args: &["--orphan-grace=2"],
        ..Options::short(pod, kubeconfig, ec2_url, &secrets)
    };
    let mut a = Replica::start(&world, &options("replica-a", &kubeconfig_a, proxy_a.url()));
    world.wait_for_a_holder(&mut a).await;
    let ip = "10.0.15.9";
    proxy_a.hold(RouteMatch::exact("AssignPrivateIpAddresses"));
    create(&world.client, ip, NODE).await;
    wait_until(Duration::from_secs(30), "the leader's attach held", || {
        std::future::ready(proxy_a.held_now() >= 1)
    })
    .await;
    assert_eq!(
        ledger_entries(&world.client, ip).await.len(),
        1,
        "recorded before the call"
    );

    // The leader loses the apiserver (and with it the lease); the object is forced out.
    partition.cut();
    force_delete(&world.client, ip).await;
    let mut b = Replica::start(
        &world,
        &options("replica-b", world.cp.kubeconfig_path(), proxy_b.url()),
    );
    b.wait_serving().await;
    wait_until(
        Duration::from_secs(60),
        "the new term to release the unclaimed entry",
        || {
            let client = world.client.clone();
            async move { ledger_entries(&client, ip).await.is_empty() }
        },
    )
    .await;
    assert!(
        holders_of(&world.ec2, ip.parse().unwrap())
            .await
            .unwrap()
            .is_empty(),
        "nothing on EC2 yet: the attach is still held"
    );

    // The held attach lands now.
    assert!(proxy_a.release_held() >= 1);
    wait_until(Duration::from_secs(30), "the late attach to land", || {
        std::future::ready(proxy_a.counts("AssignPrivateIpAddresses").forwarded >= 1)
    })
    .await;
    wait_until(
        Duration::from_secs(60),
        "the sweep to take the late IP off the VM",
        || {
            let ec2 = world.ec2.clone();
            let unassigned = proxy_b.counts("UnassignPrivateIpAddresses").forwarded;
            async move {
                unassigned >= 1
                    && holders_of(&ec2, ip.parse().unwrap())
                        .await
                        .unwrap()
                        .is_empty()
            }
        },
    )
    .await;
    let events = events_about(&world.client, NODE).await;
    assert!(
        events
            .iter()
            .any(|(t, r, note)| t == "Warning" && r == "OrphanReleased" && note.contains(ip)),
        "{events:?}"
    );
    // The new leader attached nothing and detached only that IP.
    let (assigned, unassigned) = (
        proxy_b.counts("AssignPrivateIpAddresses"),
        proxy_b.counts("UnassignPrivateIpAddresses"),
    );
    assert_eq!(assigned.total(), 0, "{:?}", proxy_b.all_counts());
    assert_eq!(
        unassigned.addresses, unassigned.forwarded,
        "one IP per call"
    );
    assert!(ledger_entries(&world.client, ip).await.is_empty());
    b.assert_running();
}

#[tokio::test]
async fn a_clean_exit_releases_the_lease_and_the_standby_takes_over_at_once() {
    let world = World::create("eu-south-1").await;
    let (proxy_a, proxy_b) = (world.proxy().await, world.proxy().await);
    let secrets = world.secret_dir("secret", "AKIDLEADERSHIP");
    let kubeconfig = world.cp.kubeconfig_path().to_path_buf();
    let options = |pod, ec2_url| Options {
        pod,
        log: pod,
        kubeconfig: &kubeconfig,
        ec2_url,
        secret_dir: &secrets,
        ca_bundle: None,
        env: &[],
        args: &[],
        timings: DEFAULT,
        drift_period: 1,
    };
    let mut a = Replica::start(&world, &options("replica-a", proxy_a.url()));
    let holder_a = world.wait_for_a_holder(&mut a).await;
    create(&world.client, "10.0.15.1", NODE).await;
    wait_assigned(&world.client, "10.0.15.1", NODE).await;
    let mut b = Replica::start(&world, &options("replica-b", proxy_b.url()));
    b.wait_serving().await;

    let sigterm = Instant::now();
    a.process.signal("TERM").unwrap();
    let status = a.process.wait_exit(Duration::from_secs(30)).await.unwrap();
    assert!(status.success(), "{status}\n{}", a.process.log_tail(40));
    let exited = Instant::now();
    world.wait_takeover(&holder_a).await;
    let takeover = sigterm.elapsed();
    eprintln!(
        "clean-exit takeover: lease taken {takeover:?} after SIGTERM ({:?} after the exit; \
         lease {} s)",
        exited.elapsed(),
        DEFAULT.lease
    );
    assert!(
        takeover < Duration::from_secs(DEFAULT.lease) / 3,
        "the standby took over {takeover:?} after SIGTERM: the lease was not released\n{}",
        b.process.log_tail(40)
    );
    create(&world.client, "10.0.15.2", NODE).await;
    wait_assigned(&world.client, "10.0.15.2", NODE).await;
    assert!(proxy_b.counts("AssignPrivateIpAddresses").forwarded >= 1);
}

#[tokio::test]
async fn a_second_process_of_the_same_pod_waits_while_the_first_lives_then_resumes_at_once() {
    let world = World::create("sa-east-1").await;
    let (proxy_first, proxy_second) = (world.proxy().await, world.proxy().await);
    let secrets = world.secret_dir("secret", "AKIDLEADERSHIP");
    let kubeconfig = world.cp.kubeconfig_path().to_path_buf();
    let options = |log, ec2_url| Options {
        pod: "replica-a",
        log,
        kubeconfig: &kubeconfig,
        ec2_url,
        secret_dir: &secrets,
        ca_bundle: None,
        env: &[],
        args: &[],
        timings: DEFAULT,
        drift_period: 1,
    };
    let mut first = Replica::start(&world, &options("replica-a-first", proxy_first.url()));
    world.wait_for_a_holder(&mut first).await;
    create(&world.client, "10.0.15.1", NODE).await;
    wait_assigned(&world.client, "10.0.15.1", NODE).await;

    // A second process with the same identity (a container started again in the same pod while
    // the first still runs) must not act while the first lives.
    let mut second = Replica::start(&world, &options("replica-a-second", proxy_second.url()));
    second.wait_serving().await;
    let acquired = world.lease().await.unwrap().acquire_time;
    let watch_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < watch_until {
        assert_eq!(
            calls(&proxy_second),
            0,
            "the second process called the cloud"
        );
        assert_eq!(world.lease().await.unwrap().acquire_time, acquired);
        second.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The first dies without releasing the lease (SIGKILL, an OOM kill): the second takes it over
    // at once instead of waiting for it to expire.
    let killed = Instant::now();
    first.process.signal("KILL").unwrap();
    first
        .process
        .wait_exit(Duration::from_secs(10))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        "the lease to be acquired again",
        || {
            let world = &world;
            let acquired = &acquired;
            async move { world.lease().await.unwrap().acquire_time != *acquired }
        },
    )
    .await;
    let resumed = killed.elapsed();
    eprintln!(
        "same-pod restart: lease acquired again {resumed:?} after SIGKILL (lease {} s)",
        DEFAULT.lease
    );
    assert!(
        resumed < Duration::from_secs(DEFAULT.lease) / 3,
        "the second process took {resumed:?} to take over its own pod's lease\n{}",
        second.process.log_tail(40)
    );
    assert_eq!(
        world.holder().await,
        "replica-a",
        "the identity is the pod name"
    );
    create(&world.client, "10.0.15.2", NODE).await;
    wait_assigned(&world.client, "10.0.15.2", NODE).await;
    assert!(proxy_second.counts("AssignPrivateIpAddresses").forwarded >= 1);
}

#[tokio::test]
async fn a_standby_reads_credentials_rotated_while_it_waited_when_it_takes_over() {
    let world = World::create("ca-central-1").await;
    let proxy_a = world.proxy().await;
    // The standby's path to EC2 is TLS with a certificate of a CA it learns only by the rotation.
    let (old_ca, new_ca) = (test_ca("old-ca").unwrap(), test_ca("new-ca").unwrap());
    let leaf = serving_cert(&new_ca).unwrap();
    let moto = MotoServer::shared().await.unwrap();
    let proxy_b = FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .tls(ServerTls::from(&leaf))
        .start()
        .await
        .unwrap();
    let kubeconfig = world.cp.kubeconfig_path().to_path_buf();
    let secrets_a = world.secret_dir("secret-a", "AKIDLEADERSHIP");
    let mut a = Replica::start(
        &world,
        &Options::short("replica-a", &kubeconfig, proxy_a.url(), &secrets_a),
    );
    world.wait_for_a_holder(&mut a).await;
    create(&world.client, "10.0.15.1", NODE).await;
    wait_assigned(&world.client, "10.0.15.1", NODE).await;

    let secrets_b = world.secret_dir("secret-b", "AKIDBEFOREROTATION");
    let ca_file = world.cp.dir().join("ca-bundle.pem");
    write_atomically(&ca_file, old_ca.cert_pem().as_bytes());
    let mut b = Replica::start(
        &world,
        &Options {
            ca_bundle: Some(&ca_file),
            ..Options::short("replica-b", &kubeconfig, proxy_b.url(), &secrets_b)
        },
    );
    b.wait_serving().await;
    // The rotation lands while B waits: new keys, and the CA of the endpoint's new certificate.
    world.secret_dir("secret-b", "AKIDAFTERROTATION");
    write_atomically(&ca_file, new_ca.cert_pem().as_bytes());

    a.process.signal("TERM").unwrap();
    let status = a.process.wait_exit(Duration::from_secs(30)).await.unwrap();
    assert!(status.success(), "{status}\n{}", a.process.log_tail(40));
    create(&world.client, "10.0.15.2", NODE).await;
    let assigned = tokio::spawn({
        let client = world.client.clone();
        async move { wait_assigned(&client, "10.0.15.2", NODE).await }
    })
    .await;
    assert!(
        assigned.is_ok(),
        "the new leader could not attach: it does not use the rotated files\n{}",
        b.process.log_tail(40)
    );
    assert!(proxy_b.counts("AssignPrivateIpAddresses").forwarded >= 1);
    b.assert_running();
}

#[tokio::test]
async fn a_leader_rides_out_an_apiserver_outage_many_leases_long_and_leads_again_in_process() {
    let outage = Duration::from_secs(
        std::env::var("CLOUDNET_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(OUTAGE_SECS),
    );
    let mut world = World::create("ap-northeast-3").await;
    let proxy = world.proxy().await;
    let secrets = world.secret_dir("secret", "AKIDLEADERSHIP");
    let kubeconfig = world.cp.kubeconfig_path().to_path_buf();
    let mut a = Replica::start(
        &world,
        &Options::short("replica-a", &kubeconfig, proxy.url(), &secrets),
    );
    world.wait_for_a_holder(&mut a).await;
    create(&world.client, "10.0.14.1", NODE).await;
    wait_assigned(&world.client, "10.0.14.1", NODE).await;
    let before = calls(&proxy);
    wait_until(Duration::from_secs(30), "the leader's drift checks", || {
        std::future::ready(calls(&proxy) >= before + 2)
    })
    .await;
    assert_eq!(a.get("/readyz").await, Some((200, "leading".to_owned())));

    let stopped = Instant::now();
    world.cp.stop_apiserver();
    let renew = Duration::from_secs(SHORT.renew);
    let mut stood_by = None;
    while stopped.elapsed() < outage {
        if stood_by.is_none()
            && a.scrape()
                .await
                .is_some_and(|m| leader_gauge(&m) == Some(0))
        {
            stood_by = Some(stopped.elapsed());
        }
        a.assert_running();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The proxy's own stamp, not when this loop looked.
    let last_call = proxy
        .arrivals()
        .map(|(_, last)| last)
        .filter(|last| *last > stopped)
        .unwrap_or(stopped);
    eprintln!(
        "apiserver outage of {outage:?} (lease {} s, renew deadline {} s): last cloud call \
         {:?} after the stop, standby reported {stood_by:?} after it",
        SHORT.lease,
        SHORT.renew,
        last_call - stopped,
    );
    assert!(
        last_call <= stopped + renew + SLACK,
        "the leader still called the cloud {:?} after kube-apiserver stopped (renew deadline \
         {renew:?})\n{}",
        last_call - stopped,
        a.process.log_tail(40)
    );
    assert!(
        stood_by.is_some(),
        "the process never reported standing by\n{}",
        a.process.log_tail(40)
    );
    assert_eq!(a.get("/readyz").await, Some((200, "standby".to_owned())));

    let restarted = Instant::now();
    world.cp.start_apiserver().await.unwrap();
    let ready = restarted.elapsed();
    // The same process leads again and converges a new object.
    create(&world.client, "10.0.14.2", NODE).await;
    wait_assigned(&world.client, "10.0.14.2", NODE).await;
    let converged = restarted.elapsed();
    eprintln!(
        "after the restart: kube-apiserver ready in {ready:?}, a new object assigned {converged:?} \
         after the restart"
    );
    a.assert_running();
    assert!(proxy.counts("AssignPrivateIpAddresses").forwarded >= 2);
    let metrics = a.scrape().await.unwrap();
    assert_eq!(leader_gauge(&metrics), Some(1), "{metrics}");
    let lost = metrics
        .lines()
        .find_map(|line| line.strip_prefix("cloudnet_leader_lost_total "))
        .and_then(|value| value.trim().parse::<u64>().ok());
    assert!(
        lost.is_some_and(|n| n >= 1),
        "the lost lease is not counted:\n{metrics}"
    );
    assert_eq!(a.get("/readyz").await, Some((200, "leading".to_owned())));
    // Its log is a file, not a terminal: no colour codes in it.
    let log = a.process.log_tail(usize::MAX);
    assert!(!log.contains('\u{1b}'), "escape codes in the log:\n{log}");
}

/// A moto endpoint behind TLS whose certificate only `ca` signs.
async fn tls_endpoint(ca: &cloudnet_certs::CertificateAuthority) -> FaultProxy {
    let leaf = serving_cert(ca).unwrap();
    let moto = MotoServer::shared().await.unwrap();
    FaultProxy::builder(moto.url(), Dialect::Ec2Query)
        .tls(ServerTls::from(&leaf))
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_clusters_trusted_bundle_is_added_to_the_roots_beside_a_clouds_own_ca() {
    let world = World::create("il-central-1").await;
    // The endpoint's certificate is signed by a CA only the cluster's trusted bundle holds, as a
    // TLS-intercepting proxy's would be; the cloud's own CA override names another CA.
    let (injected, custom) = (
        test_ca("injected-ca").unwrap(),
        test_ca("custom-ca").unwrap(),
    );
    let endpoint = tls_endpoint(&injected).await;
    let bundle = world.cp.dir().join("tls-ca-bundle.pem");
    write_atomically(&bundle, injected.cert_pem().as_bytes());
    let custom_file = world.cp.dir().join("custom-ca.pem");
    write_atomically(&custom_file, custom.cert_pem().as_bytes());
    let secrets = world.secret_dir("secret", "AKIDLEADERSHIP");
    let kubeconfig = world.cp.kubeconfig_path().to_path_buf();
    let bundle_path = bundle.display().to_string();
    let env = [("CLOUDNET_TRUSTED_CA_BUNDLE", bundle_path.as_str())];
    let mut a = Replica::start(
        &world,
        &Options {
            ca_bundle: Some(&custom_file),
            env: &env,
            ..Options::short("replica-a", &kubeconfig, endpoint.url(), &secrets)
        },
    );
    world.wait_for_a_holder(&mut a).await;
    create(&world.client, "10.0.13.1", NODE).await;
    let assigned = tokio::spawn({
        let client = world.client.clone();
        async move { wait_assigned(&client, "10.0.13.1", NODE).await }
    })
    .await;
    assert!(
        assigned.is_ok(),
        "the endpoint signed by the cluster's CA was not trusted\n{}",
        a.process.log_tail(40)
    );
    assert!(endpoint.counts("AssignPrivateIpAddresses").forwarded >= 1);
    a.assert_running();
}

/// Creates or replaces the credentials Secret `cloud-credentials` with access key `key_id`.
async fn put_secret(world: &World, key_id: &str) {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Patch, PatchParams};
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("cloud-credentials".into()),
            ..kube::api::ObjectMeta::default()
        },
        data: Some(
            [
                ("aws_access_key_id", key_id.as_bytes()),
                ("aws_secret_access_key", b"leadership-secret".as_slice()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ByteString(v.to_vec())))
            .collect(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(world.client.clone(), NAMESPACE)
        .patch(
            "cloud-credentials",
            &PatchParams::apply("cloudnet-test").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_replica_with_mounted_credentials_older_than_the_secret_waits_unready_until_refreshed() {
    let world = World::create("me-central-1").await;
    let proxy = world.proxy().await;
    // The Secret holds the rotated key; the volume still the old one (the kubelet refreshes it
    // a minute or two later).
    put_secret(&world, "AKIDROTATED").await;
    let secrets = world.secret_dir("secret", "AKIDBEFORE");
    let kubeconfig = world.cp.kubeconfig_path().to_path_buf();
    let mut a = Replica::start(
        &world,
        &Options::short("replica-a", &kubeconfig, proxy.url(), &secrets),
    );
    a.wait_serving().await;
    let watch_until = Instant::now() + Duration::from_secs(2 * SHORT.lease);
    while Instant::now() < watch_until {
        a.assert_running();
        let (status, body) = a.get("/readyz").await.unwrap();
        assert_eq!(status, 503, "ready with stale credentials: {body}");
        assert_eq!(
            world.holder().await,
            "",
            "campaigned with stale credentials"
        );
        assert_eq!(calls(&proxy), 0, "called the cloud with stale credentials");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The kubelet refreshes the volume: the replica campaigns, leads and acts.
    world.secret_dir("secret", "AKIDROTATED");
    world.wait_for_a_holder(&mut a).await;
    create(&world.client, "10.0.12.1", NODE).await;
    wait_assigned(&world.client, "10.0.12.1", NODE).await;
    assert_eq!(a.get("/readyz").await, Some((200, "leading".to_owned())));

    // A rotation after the files were loaded: the baseline is what was loaded, so the process
    // drains and exits 0 to load the new files.
    put_secret(&world, "AKIDROTATEDAGAIN").await;
    let status = a.process.wait_exit(Duration::from_secs(30)).await.unwrap();
    assert!(status.success(), "{status}\n{}", a.process.log_tail(40));
}

/// Grants the reconciler's ServiceAccount (from the shipped manifests) what it needs in
/// [`NAMESPACE`], except `list` on ConfigMaps: the attachment ledger cannot be loaded.
async fn grant_all_but_configmaps_list(world: &World) {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    let rule = |resource: &str, group: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    let role = Role {
        metadata: kube::api::ObjectMeta {
            name: Some("ledger-unlistable".into()),
            ..kube::api::ObjectMeta::default()
        },
        rules: Some(vec![
            rule(
                "leases",
                "coordination.k8s.io",
                &["get", "list", "watch", "create", "update"],
            ),
            rule("secrets", "", &["get", "list", "watch"]),
            rule("configmaps", "", &["get", "watch", "create", "patch"]),
        ]),
    };
    let binding = RoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some("ledger-unlistable".into()),
            ..kube::api::ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "ledger-unlistable".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: local::RECONCILER_ACCOUNT.into(),
            namespace: Some(local::NAMESPACE.into()),
            ..Subject::default()
        }]),
    };
    let params = PostParams::default();
    Api::<Role>::namespaced(world.client.clone(), NAMESPACE)
        .create(&params, &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(world.client.clone(), NAMESPACE)
        .create(&params, &binding)
        .await
        .unwrap();
}

/// A leader whose Role lacks `list` on ConfigMaps cannot load the attachment ledger: within a
/// lease duration it reports not ready and releases the Lease, and the standby, which has the
/// grant, leads and acts. The first stays unready while it stands by.
#[tokio::test]
async fn a_leader_that_cannot_load_the_ledger_releases_the_lease_to_a_standby_that_can() {
    let world = World::create("ap-southeast-4").await;
    let (proxy_a, proxy_b) = (world.proxy().await, world.proxy().await);
    local::apply_rbac(&world.cp).unwrap();
    grant_all_but_configmaps_list(&world).await;
    let kubeconfig_a = local::service_account_kubeconfig(
        &world.cp,
        &world.client,
        local::NAMESPACE,
        local::RECONCILER_ACCOUNT,
    )
    .await
    .unwrap();
    let secrets = world.secret_dir("secret", "AKIDLEADERSHIP");
    let (mut a, holder_a, mut b) = world
        .leader_and_standby(&kubeconfig_a, proxy_a.url(), proxy_b.url(), &secrets)
        .await;
    assert_eq!(holder_a, "replica-a");
    wait_until(Duration::from_secs(60), "the standby to take over", || {
        let world = &world;
        async move { world.holder().await == "replica-b" }
    })
    .await;
    create(&world.client, "10.0.11.1", NODE).await;
    let assigned = tokio::spawn({
        let client = world.client.clone();
        async move { wait_assigned(&client, "10.0.11.1", NODE).await }
    })
    .await;
    assert!(
        assigned.is_ok(),
        "the new leader did not attach\nB: {}\nA: {}",
        b.process.log_tail(60),
        a.process.log_tail(30)
    );
    assert!(proxy_b.counts("AssignPrivateIpAddresses").forwarded >= 1);
    assert_eq!(proxy_a.counts("AssignPrivateIpAddresses").forwarded, 0);
    let (status, body) = a.get("/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("attachment ledger"), "{body}");
    a.assert_running();
    b.assert_running();
    assert_eq!(b.get("/readyz").await, Some((200, "leading".to_owned())));
}
