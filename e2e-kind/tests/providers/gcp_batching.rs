#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The engine's lanes over the GCP provider against the GCE fake, under latency and throttling:
//! 200 IPs over 20 VMs attach, move and delete with at most one forwarded PATCH per (VM, batch)
//! pair, and every body the fake saw matched the discovery document.

use std::time::Duration;

use cloudnet_e2e::bench::gcp::{Params, run};

#[tokio::test]
async fn two_hundred_ips_over_twenty_vms_take_one_patch_per_vm_and_batch() {
    let outcome = run(Params {
        objects: 200,
        nodes: 20,
        moved: 40,
        latency: Duration::from_millis(50),
        throttle: 0.2,
        operation_delay: Duration::from_millis(50),
    })
    .await
    .unwrap();
    println!("{outcome:#?}");
    assert_eq!(outcome.violations, Vec::<String>::new());
    // A move is two changes (a detach, then an attach elsewhere).
    for (phase, changes_per_ip) in [(outcome.attach, 1), (outcome.moves, 2), (outcome.delete, 1)] {
        assert!(phase.batches > 0, "{phase:?}");
        // Serialized per VM, nothing else writes: no 412, so each change is one PATCH.
        assert!(phase.patches <= phase.batches, "{phase:?}");
        assert!(
            phase.patches < phase.ips * changes_per_ip,
            "{phase:?}: batching must beat one call per change"
        );
    }
    assert!(
        outcome.attach.patches_injected > 0,
        "throttling was injected"
    );
}
