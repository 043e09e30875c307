//! Admission of Antrea's ExternalIPPools and Egresses through the real kube-apiserver, registered
//! from the shipped webhook configuration (`egress::full`'s harness, webhook on AWS, Antrea's CRDs
//! from `cloudnet_shared::antrea`): an opted-in pool is refused for each reason with the webhook's
//! message, a good one is admitted, a pool without the opt-in label is never sent, and an Egress's
//! static IP outside its opted-in pool is refused while one inside is admitted.
//!
//! One test, so that the webhook's request count for the pool endpoint moves only by its steps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use cloudnet_e2e::bench::webhook::load::{Connection, client_config};
use cloudnet_e2e::harness::webhook::create_node;
use cloudnet_shared::antrea::{
    Egress, EgressSpec, ExternalIPPool, ExternalIPPoolSpec, IpRange, OPT_IN_LABEL, OPT_IN_VALUE,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::egress::{Harness, client, denial, dry_run, full};

const WAIT: Duration = Duration::from_secs(60);
const SUBNET: &str = "192.168.70.0/24";
const POOL_ENDPOINT: &str = "validate_antrea_externalippool";

fn pool(name: &str, ranges: &[&str], opted_in: bool) -> ExternalIPPool {
    let mut pool = ExternalIPPool::new(
        name,
        ExternalIPPoolSpec {
            ip_ranges: ranges
                .iter()
                .map(|text| match text.split_once('-') {
                    Some((start, end)) => IpRange {
                        start: start.into(),
                        end: end.into(),
                        ..IpRange::default()
                    },
                    None => IpRange {
                        cidr: (*text).into(),
                        ..IpRange::default()
                    },
                })
                .collect(),
            subnet_info: None,
            node_selector: LabelSelector {
                match_labels: Some([("antrea-egress".to_owned(), "yes".to_owned())].into()),
                ..LabelSelector::default()
            },
        },
    );
    if opted_in {
        pool.metadata.labels = Some([(OPT_IN_LABEL.to_owned(), OPT_IN_VALUE.to_owned())].into());
    }
    pool
}

fn egress(name: &str, ip: &str, pool: &str) -> Egress {
    Egress::new(
        name,
        EgressSpec {
            egress_ip: ip.into(),
            external_ip_pool: pool.into(),
            ..EgressSpec::default()
        },
    )
}

/// The webhook's count of reviews on the pool endpoint, all outcomes, from its `/metrics`.
async fn pool_reviews(harness: &Harness) -> u64 {
    let tls = client_config(&harness.ca_pem).unwrap();
    let mut connection = Connection::open(harness.addr, tls).await.unwrap();
    let (status, body) = connection
        .request("GET", "/metrics", Default::default())
        .await
        .unwrap();
    assert_eq!(status, 200);
    let prefix = format!("cloudnet_webhook_requests_total{{endpoint=\"{POOL_ENDPOINT}\",");
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|line| line.starts_with(&prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Held by every test that writes an opted-in pool, so this one's count of pool reviews moves
/// only by its own steps.
pub(crate) static POOL_WRITES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn antrea_pools_and_egresses_are_admitted_through_the_apiserver_by_the_shared_rules() {
    let _pools = POOL_WRITES.lock().await;
    let client = client(full).await;
    let harness = tokio::task::spawn_blocking(full).await.unwrap();
    // Two egress nodes of 192.168.70.0/24, four IPv4 egress IPs each.
    let annotation = format!(
        r#"[{{"interface":"eni-0a","ifaddr":{{"ipv4":"{SUBNET}"}},"capacity":{{"ipv4":4,"ipv6":4}}}}]"#
    );
    let nodes = Api::<Node>::all(client.clone());
    for (name, address) in [("an-a", "192.168.70.5"), ("an-b", "192.168.70.6")] {
        create_node(&client, name, &[address], Some(&annotation))
            .await
            .unwrap();
        let labels = json!({"metadata": {"labels": {"antrea-egress": "yes"}}});
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&labels))
            .await
            .unwrap();
    }
    let pools = Api::<ExternalIPPool>::all(client.clone());

    // The webhook learns the nodes' labels and annotations through its watch: until it holds
    // both, the pool passes a dry run with a warning, or is refused for one node's room.
    let oversized = pool("an-big", &["192.168.70.100-192.168.70.108"], true);
    let expected = "capacity: ExternalIPPool an-big holds 9 IPv4 addresses, but the 2 nodes its nodeSelector picks can hold 8 egress IPs between them (capacity \"ipv4\" in annotation cloud.network.openshift.io/egress-ipconfig); shrink spec.ipRanges to at most 8 addresses, or select more nodes";
    let deadline = Instant::now() + WAIT;
    loop {
        let result = pools.create(&dry_run(), &oversized).await;
        if result.is_err() && denial(result) == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the oversized pool was never refused for both nodes' room"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let outside = pool("an-outside", &["192.168.80.0/28"], true);
    assert_eq!(
        denial(pools.create(&dry_run(), &outside).await),
        "address_index: ExternalIPPool an-outside: ipRanges[0] (192.168.80.0/28) reaches 192.168.80.0, which AWS cannot attach to node an-a that the nodeSelector picks: it is outside the node's subnet 192.168.70.0/24, and the cloud only attaches addresses of the NIC's own subnet; keep the range inside 192.168.70.0/24, or narrow the nodeSelector to nodes of the range's subnet"
    );
    let reserved = pool("an-reserved", &["192.168.70.1-192.168.70.3"], true);
    let message = denial(pools.create(&dry_run(), &reserved).await);
    assert!(
        message.starts_with("address_index: ExternalIPPool an-reserved: ipRanges[0] (192.168.70.1-192.168.70.3) reaches 192.168.70.1, which AWS cannot attach to node an-a"),
        "{message}"
    );
    assert!(
        message.contains("reserved by AWS for the VPC router"),
        "{message}"
    );
    let own = pool("an-own", &["192.168.70.4-192.168.70.7"], true);
    assert_eq!(
        denial(pools.create(&dry_run(), &own).await),
        "node_ip: ExternalIPPool an-own: ipRanges[0] (192.168.70.4-192.168.70.7) holds 192.168.70.5, an address of node an-a (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must never be moved or detached; leave 192.168.70.5 out of the pool's ranges"
    );
    // The nodes have no IPv6 subnet, so AWS cannot attach the pool's IPv6 addresses to them.
    let ipv6 = pool("an-ipv6", &["fd00:70::100-fd00:70::101"], true);
    let message = denial(pools.create(&dry_run(), &ipv6).await);
    assert!(message.contains("the node has no IPv6 subnet"), "{message}");

    // A pool without the label is not sent at all, however wrong its ranges; an opted-in one is.
    let before = pool_reviews(harness).await;
    pools
        .create(
            &PostParams::default(),
            &pool("an-plain", &["192.168.80.0/24"], false),
        )
        .await
        .unwrap();
    assert_eq!(
        pool_reviews(harness).await,
        before,
        "the unlabelled pool was sent"
    );
    let good = pool("an-good", &["192.168.70.100-192.168.70.107"], true);
    pools.create(&PostParams::default(), &good).await.unwrap();
    assert_eq!(
        pool_reviews(harness).await,
        before + 1,
        "the opted-in pool was sent"
    );
    // Removing the label is never refused and not sent; Antrea's status writes never are.
    let status = json!({"status": {"usage": {"total": 8, "used": 1}}});
    pools
        .patch_status("an-good", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(
        pool_reviews(harness).await,
        before + 1,
        "a status write was sent"
    );

    // Egresses: the webhook learns the opted-in pool through its watch.
    let egresses = Api::<Egress>::all(client.clone());
    let stray = egress("an-stray", "192.168.70.120", "an-good");
    let deadline = Instant::now() + WAIT;
    let message = loop {
        let result = egresses.create(&dry_run(), &stray).await;
        if result.is_err() {
            break denial(result);
        }
        assert!(
            Instant::now() < deadline,
            "the stray Egress IP was never refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        message,
        "antrea_egress_ip: Egress an-stray: spec.egressIP 192.168.70.120 is outside ExternalIPPool an-good (192.168.70.100-192.168.70.107), whose IPs cloudnet attaches; pick an address in the pool's ranges, or leave the IP empty for Antrea to allocate one"
    );
    egresses
        .create(
            &PostParams::default(),
            &egress("an-web", "192.168.70.101", "an-good"),
        )
        .await
        .unwrap();
    // Moving it out of the pool is refused too; a pool not opted in is Antrea's business alone.
    let moved = json!({"spec": {"egressIP": "192.168.70.130"}});
    let result = egresses
        .patch("an-web", &PatchParams::default(), &Patch::Merge(&moved))
        .await;
    assert!(
        denial(result).starts_with("antrea_egress_ip: Egress an-web: spec.egressIP 192.168.70.130 is outside ExternalIPPool an-good"),
    );
    egresses
        .create(&dry_run(), &egress("an-other", "10.1.2.3", "an-plain"))
        .await
        .unwrap();

    // Opting the pool out is admitted without the webhook, and its Egresses are then unchecked.
    let opt_out = json!({"metadata": {"labels": {OPT_IN_LABEL: null}}});
    pools
        .patch("an-good", &PatchParams::default(), &Patch::Merge(&opt_out))
        .await
        .unwrap();
    assert_eq!(
        pool_reviews(harness).await,
        before + 1,
        "opting out was sent"
    );
    let deadline = Instant::now() + WAIT;
    while egresses.create(&dry_run(), &stray).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "an opted-out pool's Egress is still checked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
