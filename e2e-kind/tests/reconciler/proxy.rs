#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The reconciler behind a cluster-wide proxy, as OpenShift injects one: `HTTPS_PROXY`,
//! `HTTP_PROXY` and `NO_PROXY` in its environment. For each cloud the reconciler binary runs
//! with every cloud URL it is given (the cloud API's, the token endpoint's) naming a host under
//! `cloudnet.test`, which only the test's forward proxy resolves: an object that converges proves
//! that every cloud call of the run went through the proxy. On AWS kube-apiserver is named so too
//! (through the proxy); on the other clouds, where the machine's host name resolves to loopback,
//! kube-apiserver is named by it and listed in `NO_PROXY` as `host:port`, and must be reached
//! directly. `NO_PROXY` also holds entries of every other kind that must not match. The proxy
//! counts its connections per target, and the test prints them.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cloudnet_certs::{CertificateAuthority, LeafRequest, Usage};
use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, ServerTls};
use cloudnet_e2e::fakes::forwardproxy::{ForwardProxy, test_host};
use cloudnet_e2e::fakes::gce::{OAUTH_TOKEN_CALL, OAUTH_TOKEN_PATH};
use cloudnet_e2e::fakes::openstack::Options;
use cloudnet_e2e::harness::binaries;
use cloudnet_e2e::harness::controlplane::Supervised;
use cloudnet_e2e::harness::e2e::arm::Arm;
use cloudnet_e2e::harness::e2e::ec2::{create_network, run_instances};
use cloudnet_e2e::harness::e2e::gce::Gce;
use cloudnet_e2e::harness::e2e::openstack::TOKEN_ROUTE;
use cloudnet_e2e::harness::e2e::{LocalCloud, Moto, OpenStack, ec2_client, plugin};
use cloudnet_e2e::harness::webhook::test_ca;
use kube::Client;
use serde_json::json;

/// The name every loopback service is given in URLs the reconciler sees.
fn loopback() -> String {
    test_host("loopback")
}

/// `url` with its 127.0.0.1 replaced by [`loopback`].
fn via_proxy(text: &str) -> String {
    text.replace("127.0.0.1", &loopback())
}

/// The machine's host name, if it resolves to a loopback address (so a client can reach the
/// local kube-apiserver by it directly, without the proxy).
fn loopback_hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_owned();
    let all_loopback = (name.as_str(), 0)
        .to_socket_addrs()
        .ok()?
        .all(|a: SocketAddr| a.ip().is_loopback());
    (!name.is_empty() && name != "localhost" && all_loopback).then_some(name)
}

/// One cloud behind the proxy: the control plane, the proxy and the reconciler process.
struct Proxied {
    cp: ControlPlane,
    client: Client,
    proxy: ForwardProxy,
    reconciler: Option<Supervised>,
    apiserver_target: String,
    apiserver_direct: bool,
}

impl Proxied {
    /// A control plane and a proxy. kube-apiserver is reached through the proxy when
    /// `apiserver_through_proxy`, else (where the host name resolves to loopback) directly by a
    /// `host:port` entry of `NO_PROXY`.
    async fn start(apiserver_through_proxy: bool) -> Self {
        let cp = ControlPlane::start_with_crd().await.unwrap();
        let client = cp.client().await.unwrap();
        let proxy = ForwardProxy::start().await.unwrap();
        let port = cp.server_url().rsplit(':').next().unwrap().to_owned();
        let direct = loopback_hostname().filter(|_| !apiserver_through_proxy);
        let (host, apiserver_direct) = match direct {
            Some(name) => (name, true),
            None => (test_host("kube-apiserver"), false),
        };
        Self {
            apiserver_target: format!("{host}:{port}"),
            cp,
            client,
            proxy,
            reconciler: None,
            apiserver_direct,
        }
    }

    /// The admin kubeconfig, naming kube-apiserver by [`Self::apiserver_target`] and verifying
    /// its certificate as `localhost` (one of its names).
    fn kubeconfig(&self) -> PathBuf {
        let text = std::fs::read_to_string(self.cp.kubeconfig_path()).unwrap();
        let text = text.replace(
            &format!("    server: {}", self.cp.server_url()),
            &format!(
                "    server: https://{}\n    tls-server-name: localhost",
                self.apiserver_target
            ),
        );
        assert!(text.contains("tls-server-name"), "{text}");
        let path = self.cp.dir().join("kubeconfig-proxied");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Runs the reconciler for `cloud` with `api_url` and the proxy variables.
    fn run(&mut self, cloud: &dyn LocalCloud, api_url: &str) {
        self.run_with(cloud, api_url, |_, _| {});
    }

    /// [`Self::run`], with `adjust` given the written Secret directory and the command last.
    fn run_with(
        &mut self,
        cloud: &dyn LocalCloud,
        api_url: &str,
        adjust: impl FnOnce(&Path, &mut Command),
    ) {
        let secret = self.cp.dir().join("cloud-credentials");
        cloud.write_credentials(&secret).unwrap();
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // Entries of every kind, none matching the hosts the reconciler is given, and an empty
        // one (`a,,b`, common in generated environments), which Go's rules skip.
        let mut no_proxy = vec![
            format!("{}:1", loopback()),
            String::new(),
            ".example.com".to_owned(),
            "cloudnet.example".to_owned(),
            "10.0.0.0/8".to_owned(),
            "192.0.2.1".to_owned(),
        ];
        if self.apiserver_direct {
            no_proxy.push(self.apiserver_target.clone());
        }
        let mut command = Command::new(binaries::reconciler().unwrap());
        command
            .arg("--secret-name=cloud-credentials")
            .arg(format!("--platform-type={}", cloud.platform()))
            .args(cloud.reconciler_flags(&via_proxy(api_url)))
            .arg("--secret-override")
            .arg(&secret)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg("--controller-namespace=default")
            .arg("--drift-period=0")
            .envs(
                cloud
                    .reconciler_env()
                    .into_iter()
                    .map(|(k, v)| (k, via_proxy(&v))),
            )
            // Both spellings are read; upper case wins where both are set.
            .env("HTTPS_PROXY", self.proxy.url())
            .env("https_proxy", "http://127.0.0.1:1")
            .env("http_proxy", self.proxy.url())
            .env("no_proxy", no_proxy.join(","))
            .env("RUST_LOG", "info");
        adjust(&secret, &mut command);
        rewrite_dir(&secret);
        let log = self.cp.dir().join("reconciler-proxied.log");
        self.reconciler = Some(Supervised::spawn("cloudnet-reconciler", command, &log).unwrap());
    }

    fn log_tail(&self) -> String {
        self.reconciler
            .as_ref()
            .map(|r| r.log_tail(40))
            .unwrap_or_default()
    }

    /// Registers Node `name` for the VM `provider_id` with its own address `address`.
    async fn join(&self, name: &str, provider_id: &str, address: IpAddr) {
        plugin::register_node(&self.client, name, provider_id, address)
            .await
            .unwrap();
    }

    /// Creates object `ip` on `node` and waits until it is assigned.
    async fn converge(&self, ip: &str, node: &str) {
        plugin::create(&self.client, ip, node).await.unwrap();
        plugin::wait_assigned_within(&self.client, ip, node, Duration::from_secs(90))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{e:#}\nproxy counts: {:?}\n{}",
                    self.proxy.counts(),
                    self.log_tail()
                )
            });
    }

    /// Asserts what went through the proxy and prints the counts: kube-apiserver's connections
    /// (none when `NO_PROXY` names it), and at least one to each of `cloud_urls`.
    fn assert_through_proxy(&self, platform: &str, cloud_urls: &[&str]) -> BTreeMap<String, u64> {
        let counts = self.proxy.counts();
        eprintln!("{platform} through the proxy: connections per target {counts:?}");
        let apiserver = counts.get(&self.apiserver_target).copied().unwrap_or(0);
        if self.apiserver_direct {
            assert_eq!(apiserver, 0, "NO_PROXY names kube-apiserver: {counts:?}");
        } else {
            assert!(
                apiserver > 0,
                "kube-apiserver not through the proxy: {counts:?}"
            );
        }
        for url in cloud_urls {
            let target = authority(&via_proxy(url));
            assert!(
                counts.get(&target).copied().unwrap_or(0) > 0,
                "{platform}: nothing to {target} through the proxy: {counts:?}"
            );
        }
        let unexpected: Vec<&String> = counts
            .keys()
            .filter(|t| **t != self.apiserver_target && !t.starts_with(&loopback()))
            .collect();
        assert!(unexpected.is_empty(), "{unexpected:?}");
        counts
    }
}

/// An egress IP of `subnet` (its block 4, host 10) away from the VMs' own addresses.
fn egress_ip(subnet: ipnet::Ipv4Net) -> String {
    std::net::Ipv4Addr::from(u32::from(subnet.network()) | (4 << 8) | 10).to_string()
}

/// `host:port` of `url`.
fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap().to_owned()
}

/// Rewrites 127.0.0.1 to [`loopback`] in every file of `dir` (the mounted Secret).
fn rewrite_dir(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if let Ok(text) = std::fs::read_to_string(&path) {
            std::fs::write(&path, via_proxy(&text)).unwrap();
        }
    }
}

#[tokio::test]
async fn aws_calls_and_the_apiserver_go_through_the_proxy() {
    let mut run = Proxied::start(true).await;
    let moto = Moto::start("us-west-1").await.unwrap();
    let ec2 = ec2_client(moto.region(), moto.url()).unwrap();
    let network = create_network(&ec2, "10.0.0.0/16".parse().unwrap())
        .await
        .unwrap();
    let instance = run_instances(&ec2, &network, aws_sdk_ec2::types::InstanceType::M5Large, 1)
        .await
        .unwrap()
        .remove(0);
    plugin::create_node(&run.client, "proxied-aws", &instance)
        .await
        .unwrap();
    run.run(&moto, moto.url());
    run.converge("10.0.3.10", "proxied-aws").await;
    run.assert_through_proxy("AWS", &[moto.url()]);
}

/// The GCE fake with a VM joined as Node `name`.
async fn gce_node(run: &Proxied, name: &str) -> Gce {
    let gce = Gce::start().await.unwrap();
    let vm = gce.add_vm(name).unwrap();
    run.join(name, &vm.provider_id(), IpAddr::V4(vm.network_ip))
        .await;
    gce
}

#[tokio::test]
async fn gcp_calls_go_through_the_proxy() {
    let mut run = Proxied::start(false).await;
    let gce = gce_node(&run, "proxied-gcp").await;
    run.run(&gce, gce.url());
    run.converge(&egress_ip(gce.range()), "proxied-gcp").await;
    run.assert_through_proxy("GCP", &[gce.url()]);
}

/// An `authorized_user` credential exchanging its refresh token at `base`'s token endpoint.
fn authorized_user(base: &str) -> String {
    json!({
        "type": "authorized_user",
        "client_id": "cloudnet-e2e.apps.googleusercontent.com",
        "client_secret": "cloudnet-e2e-secret",
        "refresh_token": "cloudnet-e2e-refresh",
        "token_uri": format!("{base}{OAUTH_TOKEN_PATH}"),
    })
    .to_string()
}

/// An `authorized_user` credential makes google-cloud-auth exchange its refresh token at its
/// `token_uri` (a service account's signs its own JWTs and calls no endpoint): named under
/// `cloudnet.test`, that exchange can only succeed through the proxy (google-cloud-auth's own
/// reqwest client, which reads the proxy variables itself).
#[tokio::test]
async fn gcp_oauth_token_exchange_goes_through_the_proxy() {
    let mut run = Proxied::start(false).await;
    let gce = gce_node(&run, "oauth-gcp").await;
    let user = authorized_user(gce.url());
    run.run_with(&gce, gce.url(), |secret, _| {
        std::fs::write(secret.join("service_account.json"), user).unwrap();
    });
    run.converge(&egress_ip(gce.range()), "oauth-gcp").await;
    let calls = gce.fake().calls();
    assert!(
        calls.get(OAUTH_TOKEN_CALL).copied().unwrap_or(0) >= 1,
        "no token exchange: {calls:?}"
    );
    run.assert_through_proxy("GCP (OAuth)", &[gce.url()]);
}

#[tokio::test]
async fn azure_calls_and_its_token_endpoint_go_through_the_proxy() {
    let mut run = Proxied::start(false).await;
    let arm = Arm::start().await.unwrap();
    let vm = arm.add_vm("proxied-azure").unwrap();
    run.join(
        "proxied-azure",
        &vm.ids.provider_id,
        IpAddr::V4(vm.primary_ip),
    )
    .await;
    run.run(&arm, arm.url());
    run.converge(&egress_ip(arm.range()), "proxied-azure").await;
    // Resource Manager and Entra ID are one fake here: the authority host is its URL too.
    run.assert_through_proxy("Azure", &[arm.url()]);
}

/// A VM of `openstack` (a port on a network of its own, named `name`) joined as Node `name`.
async fn openstack_vm(run: &Proxied, openstack: &OpenStack, name: &str, cidr: &str) {
    let servers = openstack.servers();
    let api = servers.api(&servers.member).await.unwrap();
    let network = api.create("network", json!({"name": name})).await.unwrap();
    let cidr: ipnet::Ipv4Net = cidr.parse().unwrap();
    let host = |n: u32| std::net::Ipv4Addr::from(u32::from(cidr.network()) + n).to_string();
    let subnet = api
        .create(
            "subnet",
            json!({"network_id": network["id"], "ip_version": 4, "cidr": cidr.to_string(),
                   "allocation_pools": [{"start": host(2), "end": host(99)}]}),
        )
        .await
        .unwrap();
    let server = format!(
        "{:08x}-e2e0-4000-8000-{:012x}",
        std::process::id(),
        u32::from(cidr.network())
    );
    let port = api
        .create(
            "port",
            json!({"network_id": network["id"], "device_id": server,
                   "device_owner": "compute:nova", "name": name,
                   "fixed_ips": [{"subnet_id": subnet["id"]}]}),
        )
        .await
        .unwrap();
    let v4: IpAddr = port["fixed_ips"][0]["ip_address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    run.join(name, &format!("openstack:///{server}"), v4).await;
}

#[tokio::test]
async fn openstack_calls_and_keystone_go_through_the_proxy() {
    let mut run = Proxied::start(false).await;
    let openstack = OpenStack::start(Options::default()).await.unwrap();
    let servers = openstack.servers();
    openstack_vm(&run, &openstack, "proxied-openstack", "10.30.0.0/24").await;
    // Neutron straight (its catalog URL), Keystone through its counting proxy.
    run.run(&openstack, &servers.neutron_url);
    run.converge("10.30.0.150", "proxied-openstack").await;
    run.assert_through_proxy(
        "OpenStack",
        &[&servers.neutron_url, openstack.keystone_proxy().url()],
    );
}

/// A TLS endpoint in front of `upstream` whose certificate (for the name the reconciler is
/// given, [`loopback`]) only `ca` signs.
async fn tls_endpoint(upstream: &str, ca: &CertificateAuthority) -> FaultProxy {
    let leaf = ca
        .issue(&LeafRequest {
            common_name: "cloudnet-e2e-endpoint",
            organizations: &[],
            alt_names: &[&loopback(), "127.0.0.1"],
            usage: Usage::Server,
            validity: time::Duration::days(1),
        })
        .unwrap();
    FaultProxy::builder(upstream, Dialect::Rest)
        .tls(ServerTls::from(&leaf))
        .start()
        .await
        .unwrap()
}

/// OpenStack's `cacert` is trusted beside the cluster's injected bundle, not instead of it:
/// Keystone's certificate is signed by the `cacert` CA alone, Neutron's by the injected
/// bundle's CA alone (as a TLS-intercepting proxy's would be), and the object converges.
#[tokio::test]
async fn openstack_cacert_is_added_to_the_injected_bundle_not_substituted() {
    let mut run = Proxied::start(false).await;
    let openstack = OpenStack::start(Options::default()).await.unwrap();
    let servers = openstack.servers();
    openstack_vm(&run, &openstack, "cacert-openstack", "10.31.0.0/24").await;
    let (cacert, injected) = (
        test_ca("openstack-cacert").unwrap(),
        test_ca("injected-ca").unwrap(),
    );
    let keystone = tls_endpoint(&servers.keystone_url, &cacert).await;
    let neutron = tls_endpoint(&servers.neutron_url, &injected).await;
    let bundle = run.cp.dir().join("tls-ca-bundle.pem");
    std::fs::write(&bundle, injected.cert_pem()).unwrap();
    let clouds_yaml = servers
        .clouds_yaml(&servers.member)
        .replace(&servers.keystone_url, keystone.url());
    run.run_with(&openstack, neutron.url(), |secret, command| {
        std::fs::write(secret.join("clouds.yaml"), &clouds_yaml).unwrap();
        std::fs::write(secret.join("cacert"), cacert.cert_pem()).unwrap();
        command.env("CLOUDNET_TRUSTED_CA_BUNDLE", &bundle);
    });
    run.converge("10.31.0.150", "cacert-openstack").await;
    assert!(keystone.counts(TOKEN_ROUTE).forwarded >= 1);
    assert!(neutron.forwarded_where(|route| route.contains("/v2.0/ports")) >= 1);
    run.assert_through_proxy("OpenStack", &[neutron.url(), keystone.url()]);
}

/// The google-cloud crates' own clients (the Compute reads and the OAuth exchange, which take no
/// client or TLS configuration from us) trust the cluster's injected bundle: the GCE fake and
/// its token endpoint answer, through the forward proxy, with a certificate only the injected
/// CA signs (as behind a TLS-intercepting proxy), and the object converges.
#[tokio::test]
async fn gcp_clients_trust_the_injected_bundle_through_the_proxy() {
    let mut run = Proxied::start(false).await;
    let gce = gce_node(&run, "trust-gcp").await;
    let injected = test_ca("injected-ca").unwrap();
    let endpoint = tls_endpoint(gce.url(), &injected).await;
    let bundle = run.cp.dir().join("tls-ca-bundle.pem");
    std::fs::write(&bundle, injected.cert_pem()).unwrap();
    let user = authorized_user(endpoint.url());
    run.run_with(&gce, endpoint.url(), |secret, command| {
        std::fs::write(secret.join("service_account.json"), user).unwrap();
        // As in a pod: the roots are the image's, no variable names others.
        command
            .env("CLOUDNET_TRUSTED_CA_BUNDLE", &bundle)
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR");
    });
    run.converge(&egress_ip(gce.range()), "trust-gcp").await;
    let calls = gce.fake().calls();
    for call in [OAUTH_TOKEN_CALL, "compute.instances.get"] {
        assert!(
            calls.get(call).copied().unwrap_or(0) >= 1,
            "no {call} through the TLS endpoint: {calls:?}"
        );
    }
    run.assert_through_proxy("GCP (injected CA)", &[endpoint.url()]);
}
