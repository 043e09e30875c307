//! The egress-router admission rules through the real kube-apiserver: EgressRouters and
//! egress-router NetworkAttachmentDefinitions are refused with the webhook's message, unrelated
//! NetworkAttachmentDefinitions pass, and the webhooks are registered from the deployment
//! manifest itself (rules and matchConditions), pointed at the in-process webhook by URL.
//!
//! Two private control planes: one with the full EgressRouter schema (as openshift/api defines
//! it), one with a schemaless EgressRouter CRD, on which the values the full schema refuses first
//! reach the webhook. On the second, the webhook starts before either CRD exists: it must be
//! ready at once (its CloudPrivateIPConfig duty does not wait) and pick the CRDs up once they
//! are installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::webhook::{
    SecretDir, base64_encode, create_node, serving_cert, test_ca,
};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use cloudnet_webhook::Settings;
use cloudnet_webhook::cache::{egress_router_resource, nad_resource};
use cloudnet_webhook::tls::CertPaths;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, ObjectMeta, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "egress";

pub(crate) struct Harness {
    pub(crate) cp: &'static ControlPlane,
    /// Where the webhook serves, and the CA of its certificate (`antrea` reads its metrics).
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) ca_pem: String,
}

/// The harness with the full EgressRouter schema; also serves `public_ip`'s tests.
pub(crate) fn full() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        Harness::start(
            "crds/egressrouters.network.operator.openshift.io.yaml",
            false,
        )
    })
}

fn schemaless() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| Harness::start("crds/egressrouters-schemaless.yaml", true))
}

impl Harness {
    /// A control plane with both CRDs, the fixtures, the webhook on its own runtime and its
    /// registration; returns once the webhook's caches demonstrably hold the fixtures.
    fn start(router_crd: &'static str, crds_after_webhook: bool) -> Harness {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let cp: &'static ControlPlane =
                    Box::leak(Box::new(ControlPlane::start_with_crd().await.unwrap()));
                if !crds_after_webhook {
                    install_crds(cp, router_crd);
                }
                let client = cp.client().await.unwrap();
                // Antrea's CRDs for `antrea`'s tests; nothing else here reads them.
                cloudnet_e2e::harness::e2e::antrea::install_crds(&client)
                    .await
                    .unwrap();
                let ca = test_ca("egress-test-ca").unwrap();
                let certs =
                    SecretDir::create(&cp.dir().join("webhook-tls"), &serving_cert(&ca).unwrap())
                        .unwrap();
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let settings = Settings {
                    platform: Some(Platform::Aws),
                    cert_paths: CertPaths {
                        cert: certs.cert_path(),
                        key: certs.key_path(),
                    },
                    cert_reload_interval: Duration::from_secs(1),
                    cache_stale_after: cloudnet_webhook::freshness::STALE_AFTER,
                    ledger_namespace: "cloudnet-system".into(),
                };
                tokio::spawn(cloudnet_webhook::run(
                    listener,
                    client.clone(),
                    settings,
                    std::future::pending(),
                ));
                if crds_after_webhook {
                    wait_ready(addr, ca.cert_pem()).await;
                    install_crds(cp, router_crd);
                }
                fixtures(&client).await;
                register(cp, &client, &format!("https://{addr}"), ca.cert_pem()).await;
                wait_for_fixtures(&client).await;
                tx.send(Harness {
                    cp,
                    addr,
                    ca_pem: ca.cert_pem().to_owned(),
                })
                .unwrap();
                std::future::pending::<()>().await;
            });
        });
        rx.recv_timeout(Duration::from_secs(300))
            .expect("harness starts")
    }
}

fn install_crds(cp: &ControlPlane, router_crd: &str) {
    kubectl(cp, &["apply", "-f"], router_crd);
    kubectl(cp, &["apply", "-f"], "../manifests/public-ips/");
    // As docs/gateways.md installs it: the kustomization, not the directory's files.
    kubectl(cp, &["apply", "-k"], "../manifests/gateways");
    kubectl(
        cp,
        &["apply", "-f"],
        "crds/network-attachment-definitions.k8s.cni.cncf.io.yaml",
    );
    for crd in [
        "egressrouters.network.operator.openshift.io",
        "network-attachment-definitions.k8s.cni.cncf.io",
        "egresspublicips.cloudnet.io",
        "egressgateways.cloudnet.io",
    ] {
        let status = cp
            .kubectl()
            .args(["wait", "--for=condition=Established", "--timeout=60s"])
            .arg(format!("crd/{crd}"))
            .output()
            .unwrap();
        assert!(status.status.success(), "{crd} established");
    }
}

/// Polls the webhook's `/readyz` until it answers 200.
async fn wait_ready(addr: std::net::SocketAddr, ca_pem: &str) {
    let tls = cloudnet_e2e::bench::webhook::load::client_config(ca_pem).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let answer =
            match cloudnet_e2e::bench::webhook::load::Connection::open(addr, tls.clone()).await {
                Ok(mut connection) => connection
                    .request("GET", "/readyz", Default::default())
                    .await
                    .ok(),
                Err(_) => None,
            };
        if matches!(answer, Some((200, _))) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook never became ready without the egress-router CRDs: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn kubectl(cp: &ControlPlane, args: &[&str], file: &str) -> Vec<u8> {
    let file = cloudnet_e2e::crate_file(file);
    cp.run_kubectl(
        args.iter()
            .map(std::ffi::OsStr::new)
            .chain([file.as_os_str()]),
    )
    .unwrap()
}

/// Registers the manifest's egress-router, EgressPublicIP, Antrea and EgressGateway webhooks, with
/// their rules and matchConditions as they are, at `url` instead of the in-cluster Service.
async fn register(cp: &ControlPlane, client: &Client, url: &str, ca_pem: &str) {
    let rendered = kubectl(
        cp,
        &["create", "--dry-run=client", "-o", "json", "-f"],
        "../manifests/webhook/webhookconfigurations.yaml",
    );
    // One JSON document per manifest document.
    let documents: Vec<Value> = serde_json::Deserializer::from_slice(&rendered)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    let validating = documents
        .iter()
        .find(|item| item["kind"] == "ValidatingWebhookConfiguration")
        .unwrap();
    let webhooks: Vec<Value> = validating["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|webhook| {
            let path = webhook["clientConfig"]["service"]["path"].as_str()?;
            if !matches!(
                path,
                "/validate-egressrouter"
                    | "/validate-nad"
                    | "/validate-egresspublicip"
                    | "/validate-antrea-externalippool"
                    | "/validate-antrea-egress"
                    | "/validate-egressgateway"
            ) {
                return None;
            }
            let mut webhook = webhook.clone();
            webhook["clientConfig"] = json!({"url": format!("{url}{path}"), "caBundle": base64_encode(ca_pem.as_bytes())});
            Some(webhook)
        })
        .collect();
    assert_eq!(webhooks.len(), 6);
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "cloudnet-egress-test"},
        "webhooks": webhooks,
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// A node, a CloudPrivateIPConfig and an EgressRouter whose addresses others must not take.
async fn fixtures(client: &Client) {
    create_node(client, "eg-node", &["192.168.50.5"], None)
        .await
        .unwrap();
    Api::<CloudPrivateIPConfig>::all(client.clone())
        .create(
            &PostParams::default(),
            &CloudPrivateIPConfig {
                metadata: ObjectMeta {
                    name: Some("192.168.50.20".into()),
                    ..Default::default()
                },
                spec: CloudPrivateIPConfigSpec {
                    node: "eg-node".into(),
                },
                status: None,
            },
        )
        .await
        .unwrap();
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    routers(client)
        .create(
            &PostParams::default(),
            &router("taken", spec("192.168.50.30/24")),
        )
        .await
        .unwrap();
}

/// The apiserver picks the configuration up asynchronously and the webhook learns the fixtures
/// through its watches: poll dry-run creates until each fixture is refused for its own reason.
async fn wait_for_fixtures(client: &Client) {
    for (ip, expected) in [
        ("192.168.50.30/24", "EgressRouter egress/taken already uses"),
        ("192.168.50.20/24", "CloudPrivateIPConfig 192.168.50.20"),
        ("192.168.50.5/24", "node eg-node"),
    ] {
        let deadline = Instant::now() + WAIT;
        loop {
            let result = routers(client)
                .create(&dry_run(), &router("probe", spec(ip)))
                .await;
            if let Err(kube::Error::Api(status)) = &result
                && status.message.contains(expected)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "webhook never refused {ip}: {result:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

pub(crate) fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

fn routers(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NS, &egress_router_resource())
}

fn nads(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NS, &nad_resource())
}

fn spec(ip: &str) -> Value {
    json!({
        "mode": "Redirect",
        "networkInterface": {"macvlan": {"mode": "Bridge", "master": "eth1"}},
        "addresses": [{"ip": ip, "gateway": "192.168.50.1"}],
        "redirect": {
            "redirectRules": [{"destinationIP": "203.0.113.26", "port": 8080, "protocol": "TCP", "targetPort": 80}],
            "fallbackIP": "203.0.113.27"
        }
    })
}

fn object(resource: &ApiResource, name: &str, data: Value) -> DynamicObject {
    let mut object = DynamicObject::new(name, resource).within(NS);
    object.data = data;
    object
}

fn router(name: &str, spec: Value) -> DynamicObject {
    object(&egress_router_resource(), name, json!({"spec": spec}))
}

fn nad(name: &str, config: &Value) -> DynamicObject {
    object(
        &nad_resource(),
        name,
        json!({"spec": {"config": config.to_string()}}),
    )
}

/// `spec()` with the value at `pointer` replaced.
fn spec_with(pointer: &str, value: Value) -> Value {
    let mut spec = spec("192.168.50.10/24");
    *spec.pointer_mut(pointer).unwrap() = value;
    spec
}

pub(crate) async fn client(harness: fn() -> &'static Harness) -> Client {
    let harness = tokio::task::spawn_blocking(harness).await.unwrap();
    harness.cp.client().await.unwrap()
}

/// The webhook's message in a refusal; panics when the request was not refused by the webhook.
pub(crate) fn denial<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            let prefix = "admission webhook \"";
            assert!(
                status.message.starts_with(prefix)
                    && status.message.contains("denied the request: "),
                "not a webhook denial: {status:?}"
            );
            status
                .message
                .split_once("denied the request: ")
                .unwrap()
                .1
                .to_owned()
        }
        other => panic!("expected a webhook denial, got {other:?}"),
    }
}

async fn router_denial(harness: fn() -> &'static Harness, spec: Value) -> String {
    denial(
        routers(&client(harness).await)
            .create(&dry_run(), &router("r1", spec))
            .await,
    )
}

async fn nad_denial(config: Value) -> String {
    denial(
        nads(&client(full).await)
            .create(&dry_run(), &nad("n1", &config))
            .await,
    )
}

#[tokio::test]
async fn a_valid_egress_router_and_its_operator_made_nad_are_admitted() {
    let client = client(full).await;
    let created = routers(&client)
        .create(
            &PostParams::default(),
            &router("web", spec("192.168.50.40/24")),
        )
        .await
        .unwrap();
    // The network operator's NetworkAttachmentDefinition for it, with the same address.
    let config = json!({"cniVersion": "0.4.0", "type": "egress-router", "name": "web", "ip": {
        "addresses": ["192.168.50.40/24"], "gateway": "192.168.50.1",
        "destinations": ["8080 TCP 203.0.113.26 80", "203.0.113.27"]
    }});
    let mut own = nad("web", &config);
    own.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "network.operator.openshift.io/v1".into(),
            kind: "EgressRouter".into(),
            name: "web".into(),
            uid: created.metadata.uid.clone().unwrap(),
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    let deadline = Instant::now() + WAIT;
    // Retried while the webhook's watch has not seen the router yet: either way it is admitted.
    loop {
        match nads(&client).create(&PostParams::default(), &own).await {
            Ok(_) => break,
            Err(error) => assert!(Instant::now() < deadline, "{error:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A standalone NetworkAttachmentDefinition may not take the same address.
    let message = loop {
        let result = nads(&client)
            .create(&dry_run(), &nad("thief", &config))
            .await;
        if result.is_err() || Instant::now() > deadline {
            break denial(result);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        message,
        "egress_router_conflict: NetworkAttachmentDefinition egress/thief uses 192.168.50.40, which EgressRouter egress/web already uses; give each egress router its own address"
    );
}

#[tokio::test]
async fn egress_router_addresses_are_checked_with_their_messages() {
    let cases = [
        (
            spec("192.168.50.10"),
            "egress_router_address: EgressRouter egress/r1: spec.addresses[0].ip \"192.168.50.10\" has no prefix length; write it in CIDR form with its network's prefix length, e.g. \"192.168.50.10/24\"",
        ),
        (
            spec_with("/addresses/0/gateway", json!("192.168.51.1")),
            "egress_router_address: EgressRouter egress/r1: spec.addresses[0].gateway 192.168.51.1 is outside 192.168.50.0/24 (spec.addresses[0].ip 192.168.50.10/24); use a gateway inside the address's network, or correct the address's prefix length",
        ),
        (
            spec_with("/addresses/0/gateway", json!("192.168.50.10")),
            "egress_router_address: EgressRouter egress/r1: spec.addresses[0].gateway 192.168.50.10 is the router's own address (spec.addresses[0].ip); set the next hop's IP, another address of that network",
        ),
        (
            spec_with("/addresses", json!([])),
            "egress_router_address: EgressRouter egress/r1: spec.addresses lists no address; add at least one {ip: <address>/<prefix length>, gateway: <next hop>}",
        ),
        (
            spec_with(
                "/addresses",
                json!([{"ip": "192.168.50.10/24"}, {"ip": "192.168.50.10/25"}]),
            ),
            "egress_router_address: EgressRouter egress/r1: spec.addresses[1].ip 192.168.50.10 repeats spec.addresses[0]; list each address once",
        ),
        (
            spec_with("/networkInterface/macvlan/master", json!("eth0/1")),
            "egress_router_interface: EgressRouter egress/r1: spec.networkInterface.macvlan.master \"eth0/1\" is no Linux interface name (1-15 characters, no '/', ':' or whitespace); name the node's interface, or leave master out to infer it from the address",
        ),
        (
            spec_with(
                "/redirect/redirectRules/0/destinationIP",
                json!("203.0.113.0/24"),
            ),
            "egress_router_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[0].destinationIP \"203.0.113.0/24\" is no IP address; set the remote destination's IP (IPv4 or IPv6, no prefix length)",
        ),
        (
            spec_with(
                "/redirect/redirectRules",
                json!([
                    {"destinationIP": "203.0.113.26", "port": 8080, "protocol": "TCP"},
                    {"destinationIP": "203.0.113.28", "port": 8080, "protocol": "TCP"}
                ]),
            ),
            "egress_router_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[1] redirects TCP port 8080 again (redirectRules[0] already does); keep one rule per port and protocol",
        ),
        (
            spec_with("/redirect/fallbackIP", json!("gateway.example")),
            "egress_router_redirect: EgressRouter egress/r1: spec.redirect.fallbackIP \"gateway.example\" is no IP address; set the IP that traffic no rule matches goes to, or leave fallbackIP out",
        ),
        (
            spec_with("/redirect", json!({})),
            "egress_router_redirect: EgressRouter egress/r1: spec.redirect has neither redirectRules nor a fallbackIP, so the router would forward nothing; add a redirect rule or set fallbackIP",
        ),
        (
            spec("192.168.50.5/24"),
            "egress_router_conflict: EgressRouter egress/r1 uses 192.168.50.5, which is an address of node eg-node (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must not be taken by a router; pick an unused address of the router's network",
        ),
        (
            spec("192.168.50.20/24"),
            "egress_router_conflict: EgressRouter egress/r1 uses 192.168.50.20, which is the egress IP of CloudPrivateIPConfig 192.168.50.20 that the cloud attaches to a node; pick an address no CloudPrivateIPConfig uses",
        ),
        (
            spec("192.168.50.30/24"),
            "egress_router_conflict: EgressRouter egress/r1 uses 192.168.50.30, which EgressRouter egress/taken already uses; give each egress router its own address",
        ),
    ];
    for (spec, message) in cases {
        assert_eq!(router_denial(full, spec).await, message);
    }
    let mut no_redirect = spec("192.168.50.10/24");
    no_redirect.as_object_mut().unwrap().remove("redirect");
    assert_eq!(
        router_denial(full, no_redirect).await,
        "egress_router_redirect: EgressRouter egress/r1: spec.redirect is missing, and Redirect mode needs it; add spec.redirect with redirectRules or a fallbackIP"
    );
}

#[tokio::test]
async fn values_the_schema_refuses_first_are_refused_by_the_webhook_without_it() {
    let cases = [
        (
            spec_with("/mode", json!("Forward")),
            "egress_router_mode: EgressRouter egress/r1: spec.mode is \"Forward\", but Redirect is the only mode; set spec.mode to Redirect (or leave it out)",
        ),
        (
            spec_with("/networkInterface/macvlan/mode", json!("bridge")),
            "egress_router_interface: EgressRouter egress/r1: spec.networkInterface.macvlan.mode is \"bridge\", which is not one of Bridge, Private, VEPA, Passthru; use one of them (Bridge is the default)",
        ),
        (
            spec_with("/redirect/redirectRules/0/protocol", json!("tcp")),
            "egress_router_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[0].protocol \"tcp\" is not TCP, UDP or SCTP; use one of them, in capitals",
        ),
        (
            spec_with("/redirect/redirectRules/0/port", json!(0)),
            "egress_router_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[0].port 0 is not a port number (1-65535); set the port clients send to",
        ),
        (
            spec_with("/redirect/redirectRules/0/targetPort", json!(70000)),
            "egress_router_redirect: EgressRouter egress/r1: spec.redirect.redirectRules[0].targetPort 70000 is not a port number (1-65535); set the destination's port, or leave targetPort out to keep 8080",
        ),
    ];
    for (spec, message) in cases {
        assert_eq!(router_denial(schemaless, spec.clone()).await, message);
        // With the full schema, kube-apiserver refuses the same value before any webhook runs.
        let result = routers(&client(full).await)
            .create(&dry_run(), &router("r1", spec))
            .await;
        match result {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{status:?}");
                assert!(!status.message.contains("denied the request"), "{status:?}");
            }
            other => panic!("expected a schema refusal, got {other:?}"),
        }
    }
    // Absent fields are the schema's defaults on the full CRD, and the webhook's on the other.
    for harness in [full as fn() -> &'static Harness, schemaless] {
        let minimal = json!({"addresses": [{"ip": "192.168.50.11/24"}], "redirect": {"fallbackIP": "203.0.113.27"}});
        routers(&client(harness).await)
            .create(&dry_run(), &router("r-min", minimal))
            .await
            .unwrap();
    }
}

fn cni(body: Value) -> Value {
    let mut config = json!({"cniVersion": "0.4.0", "name": "n1", "type": "egress-router"});
    config
        .as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    config
}

#[tokio::test]
async fn egress_router_cni_configs_are_checked_with_their_messages() {
    let at = "NetworkAttachmentDefinition egress/n1: spec.config";
    let block = json!({"addresses": ["192.168.50.12/24"], "gateway": "192.168.50.1"});
    let cases = [
        (cni(json!({})), format!("egress_router_cni: {at}: sets none of ip, podIP and ipConfig; set exactly one of them")),
        (
            cni(json!({"ip": block, "podIP": {"db": block}})),
            format!("egress_router_cni: {at}: sets ip and podIP; set exactly one of ip, podIP and ipConfig"),
        ),
        (
            cni(json!({"podIP": {"db*x": block}})),
            format!("egress_router_cni: {at}: podIP key \"db*x\" is no pod name; use a pod's name (lowercase letters, digits, '-' and '.') or a name prefix followed by a single trailing *"),
        ),
        (
            cni(json!({"ipConfig": {"namespace": "egress"}})),
            format!("egress_router_cni: {at}: ipConfig.name is missing; name the ConfigMap that holds the ip or podIP configuration"),
        ),
        (
            cni(json!({"ipConfig": {"name": "ips", "overrides": {"addresses": ["192.168.50.12"]}}})),
            format!("egress_router_address: {at}: ipConfig.overrides.addresses[0] \"192.168.50.12\" has no prefix length; write it in CIDR form with its network's prefix length, e.g. \"192.168.50.12/24\""),
        ),
        (
            cni(json!({"ip": {"addresses": "192.168.50.12/24"}})),
            format!("egress_router_cni: {at}: the egress-router configuration is not what the plugin reads (invalid type: string \"192.168.50.12/24\", expected a sequence); write addresses and destinations as lists of strings, gateway and interfaceArgs values as strings, podIP as an object"),
        ),
        (
            cni(json!({"ip": {"addresses": ["192.168.50.12/24"], "gateway": "10.0.0.1"}})),
            format!("egress_router_address: {at}: ip.gateway 10.0.0.1 is outside 192.168.50.0/24 (ip.addresses[0] 192.168.50.12/24); use a gateway inside the address's network, or correct the address's prefix length"),
        ),
        (
            cni(json!({"ip": {"addresses": ["192.168.50.12/24"], "destinations": ["10.1.0.0/99"]}})),
            format!("egress_router_redirect: {at}: ip.destinations[0] \"10.1.0.0/99\" has \"10.1.0.0/99\", which is no IP address or CIDR; write a CIDR such as \"203.0.113.0/24\" or a rule such as \"80 TCP 203.0.113.26 8080\""),
        ),
        (
            cni(json!({"interfaceType": "vxlan", "ip": block})),
            format!("egress_router_interface: {at}: interfaceType \"vxlan\" is not one of macvlan, ipvlan or aws-elastic-ip (AWS only); use one of them"),
        ),
        (
            cni(json!({"interfaceArgs": {"mode": "bridged"}, "ip": block})),
            format!("egress_router_interface: {at}: interfaceArgs.mode \"bridged\" is not a macvlan mode of the kernel (bridge, private, vepa, passthru); use one of them, in lower case"),
        ),
        (
            json!({"cniVersion": "0.4.0", "name": "n1", "plugins": [{"type": "tuning"}, cni(json!({"ip": {"addresses": ["192.168.50.5/24"]}}))]}),
            "egress_router_conflict: NetworkAttachmentDefinition egress/n1 uses 192.168.50.5, which is an address of node eg-node (status.addresses) that no CloudPrivateIPConfig manages, and a node's own IP must not be taken by a router; pick an unused address of the router's network".to_owned(),
        ),
        (
            cni(json!({"podIP": {"a-*": {"addresses": ["192.168.50.20/24"]}}})),
            "egress_router_conflict: NetworkAttachmentDefinition egress/n1 uses 192.168.50.20, which is the egress IP of CloudPrivateIPConfig 192.168.50.20 that the cloud attaches to a node; pick an address no CloudPrivateIPConfig uses".to_owned(),
        ),
        (
            cni(json!({"ip": {"addresses": ["192.168.50.30/24"]}})),
            "egress_router_conflict: NetworkAttachmentDefinition egress/n1 uses 192.168.50.30, which EgressRouter egress/taken already uses; give each egress router its own address".to_owned(),
        ),
    ];
    for (config, message) in cases {
        assert_eq!(nad_denial(config).await, message);
    }
    // On AWS (the webhook's --platform-type here) aws-elastic-ip is allowed.
    nads(&client(full).await)
        .create(
            &dry_run(),
            &nad(
                "eip",
                &cni(json!({"interfaceType": "aws-elastic-ip", "ip": block})),
            ),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn unrelated_nads_are_admitted() {
    let client = client(full).await;
    let macvlan = json!({"cniVersion": "0.3.1", "type": "macvlan", "master": "eth0", "ipam": {"type": "dhcp"}});
    nads(&client)
        .create(&PostParams::default(), &nad("plain-macvlan", &macvlan))
        .await
        .unwrap();
    // Mentions the plugin, so it passes the match condition, but is a bridge config: the webhook
    // lets it through at once.
    let bridge = json!({"cniVersion": "0.3.1", "name": "egress-router-lookalike", "type": "bridge", "ipam": {"type": "host-local", "subnet": "192.168.50.0/24"}});
    nads(&client)
        .create(&PostParams::default(), &nad("lookalike", &bridge))
        .await
        .unwrap();
    // Not even JSON: none of the webhook's business.
    let raw = object(
        &nad_resource(),
        "raw",
        json!({"spec": {"config": "egress-router? not JSON"}}),
    );
    nads(&client)
        .create(&PostParams::default(), &raw)
        .await
        .unwrap();
}
