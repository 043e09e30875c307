#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The webhook's GCP address rules (shared/) checked against the subnets the GCE fake serves:
//! the annotation the reconciler writes from the fake's answer, the rule's verdict on each
//! address, and the fake's own verdict when the provider attaches it agree.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use cloudnet_e2e::fakes::gce::{self, GceFake, PROJECT, ZONE};
use cloudnet_reconciler::capacity::egress_config;
use cloudnet_reconciler::cloud::gcp::{GcpProvider, GcpSettings, RetryPolicy};
use cloudnet_reconciler::cloud::pace::Pacing;
use cloudnet_reconciler::cloud::{CloudProvider, CloudProviderExt, ErrorKind};
use cloudnet_shared::Platform;
use cloudnet_shared::rules::address_index::check_address_index;

async fn provider(fake: &GceFake, secrets: &std::path::Path) -> GcpProvider {
    gce::write_service_account(secrets).unwrap();
    let mut settings = GcpSettings::new(&fake.url());
    settings.retry = RetryPolicy {
        min_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(100),
        max_attempts: 3,
        call_timeout: Duration::from_secs(20),
        operation_timeout: Duration::from_secs(30),
    };
    settings.pacing = Pacing::UNLIMITED;
    GcpProvider::from_secret_dir(&settings, secrets)
        .await
        .unwrap()
}

#[tokio::test]
async fn reserved_indices_of_the_fakes_primary_range_are_denied_and_refused_alike() {
    let fake = GceFake::start().await.unwrap();
    fake.add_standard_vm("vm-1", Ipv4Addr::new(10, 0, 0, 2))
        .unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let provider = provider(&fake, secrets.path()).await;
    let node = provider
        .resolve("vm-1", &format!("gce://{PROJECT}/{ZONE}/vm-1"))
        .await
        .unwrap();
    let view = provider.egress_config(&node).await.unwrap();
    let config = egress_config(&view, &HashSet::new(), Some(Platform::Gcp));
    assert_eq!(config.capacity.ip, Some(100));
    let primary = GceFake::standard_subnet().primary;
    assert_eq!(config.ifaddr.ipv4, Some(primary));

    let reserved = gce::reserved_in(primary);
    assert_eq!(reserved.len(), 4);
    for ip in reserved {
        let denial = check_address_index(IpAddr::V4(ip), "vm-1", &config.ifaddr, Platform::Gcp);
        assert!(denial.is_err(), "{ip} must be denied at admission");
        // What the webhook denies, GCE refuses too.
        let e = provider.attach(&node, &[IpAddr::V4(ip)]).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Permanent, "{ip}: {e}");
        assert!(e.message.contains("reserved"), "{ip}: {e}");
    }
    for ip in ["10.0.0.3", "10.0.0.100", "10.0.0.252"] {
        let ip: IpAddr = ip.parse().unwrap();
        check_address_index(ip, "vm-1", &config.ifaddr, Platform::Gcp).unwrap();
        provider.attach(&node, &[ip]).await.unwrap();
    }
    assert_eq!(fake.aliases(PROJECT, ZONE, "vm-1").len(), 3);
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn outside_the_primary_range_and_ipv6_are_denied() {
    let fake = GceFake::start().await.unwrap();
    fake.add_standard_vm("vm-1", Ipv4Addr::new(10, 0, 0, 2))
        .unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let provider = provider(&fake, secrets.path()).await;
    let node = provider
        .resolve("vm-1", &format!("gce://{PROJECT}/{ZONE}/vm-1"))
        .await
        .unwrap();
    let view = provider.egress_config(&node).await.unwrap();
    let config = egress_config(&view, &HashSet::new(), Some(Platform::Gcp));
    let v6: IpAddr = "fd00:0000:0000:0000:0000:0000:0000:0005".parse().unwrap();
    let e = check_address_index(v6, "vm-1", &config.ifaddr, Platform::Gcp).unwrap_err();
    assert!(format!("{e:?}").contains("IPv4"), "{e:?}");
    let outside: IpAddr = "10.0.1.5".parse().unwrap();
    assert!(check_address_index(outside, "vm-1", &config.ifaddr, Platform::Gcp).is_err());
    let e = provider.attach(&node, &[outside]).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent);
    // Secondary ranges hold no reserved addresses at GCE, but the annotation names only the
    // primary range, so admission keeps egress IPs in it (as upstream does).
    let secondary_first: IpAddr = "10.4.0.0".parse().unwrap();
    assert!(check_address_index(secondary_first, "vm-1", &config.ifaddr, Platform::Gcp).is_err());
    provider.attach(&node, &[secondary_first]).await.unwrap();
    assert_eq!(fake.violations(), Vec::<String>::new());
}
