//! EgressGateway admission through the real kube-apiserver, with the CRD installed from
//! `manifests/gateways` and the webhook registered from the shipped configuration (`egress::full`'s
//! harness, webhook on AWS): each refusal with the webhook's message (spelling, a node's own IP,
//! outside the picked nodes' subnet, a reserved index, the other family, a bad selector, another
//! gateway's IP, an opted-in Antrea pool's, a CloudPrivateIPConfig's), a repeated IP refused by
//! the CRD itself, a good gateway admitted with its status and label writes; and a
//! CloudPrivateIPConfig created for a gateway's IP refused unless it is the gateway front end's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::{Duration, Instant};

use cloudnet_e2e::harness::webhook::{base64_encode, create_node};
use cloudnet_shared::antrea::{
    ExternalIPPool, ExternalIPPoolSpec, IpRange, OPT_IN_LABEL, OPT_IN_VALUE,
};
use cloudnet_shared::gateway::{EgressGateway, EgressGatewaySpec, FRONT_END};
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec, FRONT_END_LABEL};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::antrea::POOL_WRITES;
use crate::egress::{client, denial, dry_run, full};

const WAIT: Duration = Duration::from_secs(60);
const SUBNET: &str = "192.168.90.0/24";
/// The label that sends this test's CloudPrivateIPConfigs (and only them) to `/validate`.
const PROBE_LABEL: &str = "cloudnet-test/gateway";

fn gateway(name: &str, ips: &[&str]) -> EgressGateway {
    EgressGateway::new(
        name,
        EgressGatewaySpec {
            node_selector: LabelSelector {
                match_labels: Some([("gw-test".to_owned(), "yes".to_owned())].into()),
                ..LabelSelector::default()
            },
            egress_ips: ips.iter().map(|ip| (*ip).to_owned()).collect(),
        },
    )
}

fn object(name: &str, front_end: Option<&str>) -> CloudPrivateIPConfig {
    let mut labels = std::collections::BTreeMap::from([(PROBE_LABEL.to_owned(), "yes".to_owned())]);
    if let Some(front_end) = front_end {
        labels.insert(FRONT_END_LABEL.to_owned(), front_end.to_owned());
    }
    CloudPrivateIPConfig {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: CloudPrivateIPConfigSpec {
            node: String::new(),
        },
        status: None,
    }
}

/// Repeats `attempt` until it is refused with a message `accept` takes (the webhook learns the
/// cluster through its watches), and returns that message.
async fn refused_once_known<T, F>(
    what: &str,
    mut attempt: impl FnMut() -> F,
    accept: impl Fn(&str) -> bool,
) -> String
where
    T: std::fmt::Debug,
    F: Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let result = attempt().await;
        if result.is_err() {
            let message = denial(result);
            if accept(&message) {
                return message;
            }
        }
        assert!(Instant::now() < deadline, "{what} was never refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn gateways_are_admitted_through_the_apiserver_by_the_shared_rules() {
    let client = client(full).await;
    // Two gateway nodes of 192.168.90.0/24, twenty IPv4 egress IPs each.
    let annotation = format!(
        r#"[{{"interface":"eni-0g","ifaddr":{{"ipv4":"{SUBNET}"}},"capacity":{{"ipv4":20,"ipv6":20}}}}]"#
    );
    let nodes = Api::<Node>::all(client.clone());
    for (name, address) in [("gw-a", "192.168.90.5"), ("gw-b", "192.168.90.6")] {
        create_node(&client, name, &[address], Some(&annotation))
            .await
            .unwrap();
    }
    // gw-a last: the Node watch delivers in order, so once the webhook picks gw-a it has seen
    // every write above.
    for name in ["gw-b", "gw-a"] {
        let labels = json!({"metadata": {"labels": {"gw-test": "yes"}}});
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&labels))
            .await
            .unwrap();
    }
    let gateways = Api::<EgressGateway>::all(client.clone());
    let dry = dry_run();

    // Once the webhook holds both nodes' labels, an address outside their subnet is refused for
    // the first of them by name, gw-a; while it holds only gw-b's, the refusal names gw-b, so the
    // wait is for gw-a's name.
    let outside = gateway("gw-outside", &["192.168.91.5"]);
    let message = refused_once_known(
        "an address outside the nodes' subnet",
        || gateways.create(&dry, &outside),
        |message| message.starts_with("address_index:") && message.contains(" to node gw-a "),
    )
    .await;
    assert_eq!(
        message,
        "address_index: EgressGateway gw-outside: egressIPs[0] 192.168.91.5 cannot be attached by AWS to node gw-a that the nodeSelector picks: it is outside the node's subnet 192.168.90.0/24, and the cloud only attaches addresses of the NIC's own subnet; pick an address in 192.168.90.0/24, or narrow the nodeSelector to nodes of the subnet of 192.168.91.5"
    );
    // (gateway, its IPs, the webhook's refusal)
    let table = [
        (
            "gw-spelling",
            vec!["192.168.90.050"],
            "egress_gateway_ip: EgressGateway gw-spelling: egressIPs[0] \"192.168.90.050\" is not an IP address in canonical form: use \"192.168.90.50\"",
        ),
        (
            "gw-node",
            vec!["192.168.90.100", "192.168.90.6"],
            "node_ip: EgressGateway gw-node: egressIPs[1] 192.168.90.6 is an address of node gw-b (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must never be moved or detached; pick an unused address of the nodes' subnet",
        ),
        (
            "gw-reserved",
            vec!["192.168.90.1"],
            "address_index: EgressGateway gw-reserved: egressIPs[0] 192.168.90.1 cannot be attached by AWS to node gw-a that the nodeSelector picks: it is reserved by AWS for the VPC router in subnet 192.168.90.0/24 (AWS reserves the first four and the last address of every subnet); pick another address in 192.168.90.0/24",
        ),
    ];
    for (name, ips, expected) in table {
        let result = gateways.create(&dry_run(), &gateway(name, &ips)).await;
        assert_eq!(denial(result), expected, "{name}");
    }
    // The nodes have no IPv6 subnet.
    let ipv6 = gateway("gw-ipv6", &["fd00:90::100"]);
    let message = denial(gateways.create(&dry_run(), &ipv6).await);
    assert!(message.contains("the node has no IPv6 subnet"), "{message}");
    // An operator a label selector does not have (the CRD's schema leaves it to the webhook).
    let mut operator = gateway("gw-operator", &["192.168.90.100"]);
    operator.spec.node_selector = serde_json::from_value(json!({
        "matchExpressions": [{"key": "gw-test", "operator": "Gt", "values": ["1"]}]
    }))
    .unwrap();
    let message = denial(gateways.create(&dry_run(), &operator).await);
    assert!(
        message
            .starts_with("bad_input: EgressGateway gw-operator: spec.nodeSelector cannot be read"),
        "{message}"
    );
    // A repeated IP never reaches the webhook: the CRD's list is a set.
    match gateways
        .create(
            &dry_run(),
            &gateway("gw-twice", &["192.168.90.100", "192.168.90.100"]),
        )
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert!(status.message.contains("Duplicate value"), "{status:?}");
        }
        other => panic!("a repeated IP was admitted: {other:?}"),
    }

    // A good gateway is admitted; the reconciler's status write and a label change pass even
    // though its IP is a claim now.
    gateways
        .create(
            &PostParams::default(),
            &gateway("gw-one", &["192.168.90.100"]),
        )
        .await
        .unwrap();
    let status = json!({"status": {"activeNode": "gw-a"}});
    gateways
        .patch_status("gw-one", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let labels = json!({"metadata": {"labels": {"team": "payments"}}});
    gateways
        .patch("gw-one", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap();

    // Another gateway's IP, once the webhook's watch holds the first gateway.
    let second = gateway("gw-two", &["192.168.90.101", "192.168.90.100"]);
    let message = refused_once_known(
        "another gateway's IP",
        || gateways.create(&dry, &second),
        |_| true,
    )
    .await;
    assert_eq!(
        message,
        "egress_gateway_conflict: EgressGateway gw-two: egressIPs[1] 192.168.90.100 is an egress IP of EgressGateway gw-one already, and an egress IP has one gateway; pick another address, or remove 192.168.90.100 from gw-one first"
    );
    // Adding it to an admitted gateway by an update is refused the same way.
    let grow = json!({"spec": {"egressIPs": ["192.168.90.102"]}});
    gateways
        .create(
            &PostParams::default(),
            &gateway("gw-three", &["192.168.90.103"]),
        )
        .await
        .unwrap();
    let result = gateways
        .patch(
            "gw-three",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"egressIPs": ["192.168.90.103", "192.168.90.100"]}})),
        )
        .await;
    assert!(
        denial(result).starts_with("egress_gateway_conflict: EgressGateway gw-three: egressIPs[1] 192.168.90.100 is an egress IP of EgressGateway gw-one"),
    );
    gateways
        .patch("gw-three", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .unwrap();

    // A CloudPrivateIPConfig's IP.
    Api::<CloudPrivateIPConfig>::all(client.clone())
        .create(&PostParams::default(), &object("192.168.90.150", None))
        .await
        .unwrap();
    let held = gateway("gw-held", &["192.168.90.150"]);
    let message = refused_once_known(
        "a CloudPrivateIPConfig's IP",
        || gateways.create(&dry, &held),
        |_| true,
    )
    .await;
    assert_eq!(
        message,
        "egress_gateway_conflict: EgressGateway gw-held: egressIPs[0] 192.168.90.150 is held by CloudPrivateIPConfig 192.168.90.150 which is not this gateway's (a network plugin's, an admin's or another front end's); pick another address, or delete that CloudPrivateIPConfig first"
    );

    // An opted-in Antrea pool's IP (the pool's own webhook admits the pool first).
    {
        let _pools = POOL_WRITES.lock().await;
        let mut pool = ExternalIPPool::new(
            "gw-pool",
            ExternalIPPoolSpec {
                ip_ranges: vec![IpRange {
                    cidr: "192.168.90.128/28".into(),
                    ..IpRange::default()
                }],
                subnet_info: None,
                node_selector: LabelSelector {
                    match_labels: Some([("gw-test".to_owned(), "yes".to_owned())].into()),
                    ..LabelSelector::default()
                },
            },
        );
        pool.metadata.labels = Some([(OPT_IN_LABEL.to_owned(), OPT_IN_VALUE.to_owned())].into());
        Api::<ExternalIPPool>::all(client.clone())
            .create(&PostParams::default(), &pool)
            .await
            .unwrap();
    }
    let pooled = gateway("gw-pooled", &["192.168.90.130"]);
    let message = refused_once_known(
        "an opted-in pool's IP",
        || gateways.create(&dry, &pooled),
        |_| true,
    )
    .await;
    assert_eq!(
        message,
        "egress_gateway_conflict: EgressGateway gw-pooled: egressIPs[0] 192.168.90.130 lies in Antrea ExternalIPPool gw-pool, whose IPs cloudnet attaches for Antrea's Egresses; pick an address outside the pool's ranges, or take it out of the pool first"
    );

    // The reverse: `/validate`, registered here for this test's objects only, refuses a
    // CloudPrivateIPConfig of a gateway's IP unless it carries the gateway front end's label.
    let harness = tokio::task::spawn_blocking(full).await.unwrap();
    let probe: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "cloudnet-gateway-test"},
        "webhooks": [{
            "name": "validate.gateway-test.cloudnet.io",
            "clientConfig": {
                "url": format!("https://{}/validate", harness.addr),
                "caBundle": base64_encode(harness.ca_pem.as_bytes()),
            },
            "rules": [{
                "apiGroups": ["cloud.network.openshift.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["cloudprivateipconfigs"],
                "scope": "Cluster",
            }],
            "objectSelector": {"matchLabels": {PROBE_LABEL: "yes"}},
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        }],
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &probe)
        .await
        .unwrap();
    let objects = Api::<CloudPrivateIPConfig>::all(client.clone());
    let plugins = object("192.168.90.100", None);
    let message = refused_once_known(
        "a plugin's CloudPrivateIPConfig of a gateway's IP",
        || objects.create(&dry, &plugins),
        |_| true,
    )
    .await;
    assert_eq!(
        message,
        "egress_gateway_conflict: cannot create CloudPrivateIPConfig 192.168.90.100: 192.168.90.100 is an egress IP of EgressGateway gw-one, whose CloudPrivateIPConfigs cloudnet's reconciler creates (label cloudnet.io/front-end=egress-gateway); pick another address, or remove 192.168.90.100 from EgressGateway gw-one first"
    );
    objects
        .create(&dry_run(), &object("192.168.90.100", Some(FRONT_END)))
        .await
        .unwrap();
}
