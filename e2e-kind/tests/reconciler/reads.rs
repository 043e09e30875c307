//! Reads gathered across VMs, counted at the fault proxy in front of moto (not by the
//! reconciler's own metrics): a reconciler started over many instances with their Nodes reads
//! them in one or two `DescribeInstances` calls, not one per instance, and a drift period reads
//! every known instance again in one call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use cloudnet_e2e::bench::aws::startup::{self, StartupParams};

/// Enough instances that per-VM reads would show, few enough to start quickly.
const NODES: usize = 60;

#[tokio::test]
async fn a_start_over_many_instances_and_a_drift_period_read_them_in_one_or_two_calls() {
    let params = StartupParams {
        nodes: NODES,
        ec2_buckets: false,
        reconciler_args: vec!["--drift-period=4".into()],
        timeout: Duration::from_secs(60),
    };
    let started = startup::start(&params).await.unwrap();
    eprintln!("{}", startup::summary(&params, &started));
    let at_start = started.describe_instances();
    assert!(
        (1..=2).contains(&at_start),
        "{at_start} DescribeInstances calls to annotate {NODES} nodes\n{}",
        started.reconciler.log_tail(20)
    );

    // The next drift period reads every instance again, in one call.
    let reads = || started.proxy.counts("DescribeInstances").total();
    let deadline = Instant::now() + Duration::from_secs(30);
    while reads() == at_start {
        assert!(Instant::now() < deadline, "no drift read within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(reads(), at_start + 1, "one call for {NODES} instances");
}

/// Not a test: prints what a start costs under EC2's token buckets, for the node counts in
/// `CLOUDNET_STARTUP_NODES` (default `300,1000`). Run with `--ignored --nocapture`; point
/// `CLOUDNET_RECONCILER_BIN` at another build to compare.
#[tokio::test]
#[ignore = "a measurement of minutes, not a test"]
async fn measure_a_start_under_ec2_buckets() {
    let counts = std::env::var("CLOUDNET_STARTUP_NODES").unwrap_or_else(|_| "300,1000".into());
    for nodes in counts
        .split(',')
        .map(|n| n.trim().parse::<usize>().unwrap())
    {
        let params = StartupParams {
            nodes,
            ec2_buckets: true,
            reconciler_args: Vec::new(),
            timeout: Duration::from_secs(300),
        };
        let started = startup::start(&params).await.unwrap();
        eprintln!("startup: {}", startup::summary(&params, &started));
    }
}
