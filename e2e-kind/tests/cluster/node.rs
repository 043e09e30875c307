#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The shipped images and chart on a real one-node cluster (kubelet, containerd, runc,
//! scheduler, controller-manager; e2e-kind/src/harness/cluster): the webhook and the reconciler run as
//! pods from `make images`' archives, installed by `helm install` of charts/cloudnet with the
//! values of e2e-kind/cluster/values.yaml, against moto; then end-to-end scenarios through the
//! apiserver. (The chart renders what `manifests/` renders: tests/reconciler/manifests.rs compares them.)
//!
//! One test, in order, because the cluster is one per machine and its cleanup (containers,
//! bridge, NAT rules, mounts) runs when the test drops it. Skipped, with the reason printed, only
//! where the machine lacks what a node needs (`cluster::missing_requirements`).

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use aws_sdk_ec2::types::InstanceType;
use cloudnet_e2e::fakes::faultproxy::{Dialect, EC2_CREDENTIALS_REQUEST, FaultProxy};
use cloudnet_e2e::fakes::moto::MotoServer;
use cloudnet_e2e::harness::binaries;
use cloudnet_e2e::harness::cluster::{self, NodeCluster};
use cloudnet_e2e::harness::e2e::{self, ec2, plugin, wait};
use cloudnet_shared::encode_name;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::support::{
    ORIGINAL_KEY, POD_TIMEOUT, ROTATED_KEY, ROTATION_BOUND, forwarders_from_pods, operator_values,
    wait_available,
};

/// The chart's values on this cluster (e2e-kind/cluster/values.yaml).
const VALUES: &str = "cluster/values.yaml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_manifests_and_images_run_on_a_one_node_cluster() {
    if !crate::support::machine_can_run_a_node() {
        return;
    }
    let moto = MotoServer::start().await.unwrap();
    let mut node = NodeCluster::start().await.unwrap();
    let client = node.control_plane().client().await.unwrap();
    if let Err(e) = run(&mut node, &client, moto.url()).await {
        panic!("{e:#}\n{}", node.diagnostics());
    }
}

async fn run(node: &mut NodeCluster, client: &Client, moto_url: &str) -> anyhow::Result<()> {
    // The chart, released in the reconciler's namespace, which exists first with the Secret the
    // reconciler mounts (moto's keys: any); then the README's one-shot certificate path.
    let installing = Instant::now();
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "cloudnet-system"}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "cloud-credentials", "namespace": "cloudnet-system"},
        "stringData": {
            "aws_access_key_id": ORIGINAL_KEY,
            "aws_secret_access_key": "cloudnet-e2e-secret",
        }
    }))?;
    Api::<Secret>::namespaced(client.clone(), "cloudnet-system")
        .create(&PostParams::default(), &secret)
        .await?;
    node.release_chart("install", VALUES, "cloudnet-system", moto_url)?;
    install_webhook_certs(node)?;
    wait_available(client, "cloudnet", "cloudnet-webhook").await?;
    let node_ip = node.node_ip().await?;
    node.route_service(
        "cloudnet",
        "cloudnet-webhook",
        443,
        &format!("{node_ip}:19443"),
    )
    .await?;
    wait_available(client, "cloudnet-system", "cloudnet-reconciler").await?;
    // An upgrade keeps the caBundle the script set (the chart renders none), so the webhook
    // stays trusted: the denial below goes through it.
    node.release_chart("upgrade", VALUES, "cloudnet-system", moto_url)?;
    ensure_ca_bundles(client).await?;
    eprintln!(
        "chart: installed, upgraded and both Deployments available in {:?}",
        installing.elapsed()
    );
    node_agent_heartbeats(client, node.node_name()).await?;

    let ec2 = e2e::ec2_client("us-east-1", moto_url)?;
    let network = ec2::create_network(&ec2, "10.0.0.0/16".parse()?).await?;
    let instance = ec2::run_instances(&ec2, &network, InstanceType::M5Large, 1)
        .await?
        .remove(0);
    plugin::create_node(client, "cluster-a", &instance).await?;
    plugin::wait_annotation(client, "cluster-a").await?;
    let v4 = |host: u8| {
        let mut octets = network.ipv4.broadcast().octets();
        octets[3] = host;
        IpAddr::from(octets)
    };

    // The webhook pod is in the admission path: the node's own address is refused.
    let own = encode_name(instance.primary_ipv4)?;
    let message = plugin::webhook_denial(plugin::create(client, &own, "cluster-a").await)?;
    anyhow::ensure!(message.contains("node"), "unexpected denial: {message}");

    // The reconciler pod assigns and releases an address in EC2.
    let ip = v4(40);
    let name = encode_name(ip)?;
    plugin::create(client, &name, "cluster-a").await?;
    plugin::wait_assigned(client, &name, "cluster-a").await?;
    anyhow::ensure!(ec2::addresses_of(&ec2, &instance.eni).await?.contains(&ip));
    plugin::delete(client, &name).await?;
    plugin::wait_gone(client, &name).await?;
    anyhow::ensure!(!ec2::addresses_of(&ec2, &instance.eni).await?.contains(&ip));

    // With every webhook pod deleted, a finalizer removal still goes through: the object is
    // deleted, the reconciler releases the address and removes its finalizer, and nothing waits
    // on the webhook. A spec change is refused meanwhile (failurePolicy Fail), which proves the
    // webhook really was down and on the path.
    let ip = v4(41);
    let name = encode_name(ip)?;
    plugin::create(client, &name, "cluster-a").await?;
    plugin::wait_assigned(client, &name, "cluster-a").await?;
    scale_to_zero(client, "cloudnet", "cloudnet-webhook").await?;
    let refused = plugin::objects(client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": "cluster-b"}})),
        )
        .await;
    anyhow::ensure!(
        refused.is_err(),
        "a spec change was admitted with no webhook pod: {refused:?}"
    );
    plugin::delete(client, &name).await?;
    plugin::wait_gone(client, &name).await?;
    anyhow::ensure!(!ec2::addresses_of(&ec2, &instance.eni).await?.contains(&ip));
    scale(client, "cloudnet", "cloudnet-webhook", 1).await?;
    wait_available(client, "cloudnet", "cloudnet-webhook").await?;

    let real = node.node_name().to_owned();
    crate::gateway::whole_path(client, &ec2, &network, &real, v4(47)).await?;

    rotation(
        node,
        client,
        moto_url,
        &instance,
        [v4(42), v4(43), v4(44), v4(45)],
    )
    .await?;

    cno_shape(
        node,
        client,
        moto_url,
        &network,
        &instance,
        [v4(42), v4(46)],
    )
    .await
}

/// The node agent's DaemonSet (chart value `nodeAgent.enabled`): its pod on the real node is
/// Ready (its probes answer, its caches listed with its grants) and renews the node's heartbeat
/// Lease, which the admission policy lets it write with its pod-bound token (a gateway on the node
/// later: `crate::gateway`).
async fn node_agent_heartbeats(client: &Client, node: &str) -> anyhow::Result<()> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "cloudnet-system");
    wait::until(POD_TIMEOUT, "the node agent's pod Ready", || async {
        let status = daemonsets.get("cloudnet-node").await?.status;
        Ok(status.is_some_and(|s| s.desired_number_scheduled == 1 && s.number_ready == 1))
    })
    .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "cloudnet-system");
    let name = cloudnet_shared::gateway::lease_name(node);
    let renewed = |lease: Lease| lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let first = wait::found(POD_TIMEOUT, "the heartbeat Lease", || async {
        Ok(leases.get_opt(&name).await?.and_then(renewed))
    })
    .await?;
    wait::until(POD_TIMEOUT, "the heartbeat Lease renewed again", || async {
        Ok(leases
            .get(&name)
            .await
            .ok()
            .and_then(renewed)
            .is_some_and(|t| t > first))
    })
    .await?;
    Ok(())
}

/// The controller as OpenShift's network operator deploys it (e2e-kind/cno: its namespace,
/// account, roles, ConfigMaps, NetworkPolicies and Deployment, command and arguments), with only
/// the image swapped for cloudnet's (e2e-kind/cluster/overlay/cno), replacing the shipped
/// reconciler: it adopts what that one assigned (`adopted`, Assigned on cluster-a), assigns,
/// moves and releases (`fresh`), writes a new node's annotation, and logs no refusal but the
/// optional ones.
async fn cno_shape(
    node: &NodeCluster,
    client: &Client,
    moto_url: &str,
    network: &ec2::Network,
    instance: &ec2::Instance,
    [adopted, fresh]: [IpAddr; 2],
) -> anyhow::Result<()> {
    const NAMESPACE: &str = "openshift-cloud-network-config-controller";
    const NAME: &str = "cloud-network-config-controller";
    let started = Instant::now();
    scale_to_zero(client, "cloudnet-system", "cloudnet-reconciler").await?;

    // What the operator's Deployment expects to find: a control-plane node, its namespace, the
    // Secret Cloud Credential Operator writes, the injected trusted CA bundle.
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    let role = json!({"metadata": {"labels": {"node-role.kubernetes.io/master": ""}}});
    nodes
        .patch(
            node.node_name(),
            &PatchParams::default(),
            &Patch::Merge(role),
        )
        .await?;
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "cloud-credentials", "namespace": NAMESPACE},
        "stringData": {
            "aws_access_key_id": ORIGINAL_KEY,
            "aws_secret_access_key": "cloudnet-e2e-secret",
        }
    }))?;
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    let trusted: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "trusted-ca", "namespace": NAMESPACE},
        "data": {"ca-bundle.crt": node.control_plane().ca_pem()},
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &trusted)
        .await?;

    let moto: SocketAddr = moto_url.trim_start_matches("http://").parse()?;
    let (ec2_forwarder, api_forwarder) = forwarders_from_pods(node, moto).await?;
    let values = operator_values(
        &ec2_forwarder,
        &[("@APISERVER_PORT@", api_forwarder.addr().port().to_string())],
    );
    let values: Vec<(&str, &str)> = values.iter().map(|(k, v)| (*k, v.as_str())).collect();
    node.apply_rendered("cluster/overlay/cno", &values)?;
    wait_available(client, NAMESPACE, NAME).await?;

    let ec2 = e2e::ec2_client("us-east-1", moto_url)?;
    let second = ec2::run_instances(&ec2, network, InstanceType::M5Large, 1)
        .await?
        .remove(0);
    plugin::create_node(client, "cluster-b", &second).await?;
    plugin::wait_annotation(client, "cluster-b").await?;
    let fresh_name = encode_name(fresh)?;
    plugin::create(client, &fresh_name, "cluster-a").await?;
    plugin::wait_assigned(client, &fresh_name, "cluster-a").await?;
    anyhow::ensure!(
        ec2::addresses_of(&ec2, &instance.eni)
            .await?
            .contains(&fresh)
    );
    for (ip, name) in [
        (adopted, encode_name(adopted)?),
        (fresh, fresh_name.clone()),
    ] {
        plugin::retarget(client, &name, "cluster-b").await?;
        plugin::wait_assigned(client, &name, "cluster-b").await?;
        anyhow::ensure!(!ec2::addresses_of(&ec2, &instance.eni).await?.contains(&ip));
        anyhow::ensure!(ec2::addresses_of(&ec2, &second.eni).await?.contains(&ip));
    }
    plugin::delete(client, &fresh_name).await?;
    plugin::wait_gone(client, &fresh_name).await?;
    anyhow::ensure!(!ec2::addresses_of(&ec2, &second.eni).await?.contains(&fresh));

    // Refusals: only the optional grants the operator does not give, once each.
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app=cloud-network-config-controller"))
        .await?;
    let pod = list
        .items
        .first()
        .ok_or_else(|| anyhow::anyhow!("no controller pod"))?;
    let logs = node.container_log(pod, "controller")?;
    let refusals: Vec<&str> = logs
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    let optional = ["Events are forbidden", "the lease cannot be watched"];
    anyhow::ensure!(
        refusals
            .iter()
            .all(|l| optional.iter().any(|o| l.contains(o))),
        "refused: {refusals:#?}"
    );
    anyhow::ensure!(refusals.len() <= optional.len(), "refused: {refusals:#?}");
    eprintln!(
        "CNO shape: deployed, adopted, assigned, moved and released in {:?}; refusals {refusals:?}",
        started.elapsed()
    );
    Ok(())
}

/// Credential rotation with the shipped Deployment's two replicas: EC2 (moto behind the fault
/// proxy) accepts only the new key from the moment the Secret names it, as when the old key is
/// deactivated right after the rotation. The design: the leader sees the Secret change, drains
/// and exits 0 to load the new files (one container restart); a replica whose mounted files are
/// older than the Secret neither campaigns nor is ready until the kubelet refreshes them (its
/// periodic pod sync: 10 s in this harness); nothing else restarts. The replica that stood by
/// through the rotation then takes over (the leader's pod deleted) and acts with the new key.
async fn rotation(
    node: &NodeCluster,
    client: &Client,
    moto_url: &str,
    instance: &ec2::Instance,
    ips: [IpAddr; 4],
) -> anyhow::Result<()> {
    let scenario = Instant::now();
    // Two replicas need two metrics ports, so they leave the host's network for the pod network
    // and reach the apiserver and EC2 on the host through forwarders on the bridge's side.
    let proxy = FaultProxy::builder(moto_url, Dialect::Ec2Query)
        .permit(EC2_CREDENTIALS_REQUEST)
        .start()
        .await?;
    let (ec2_forwarder, api_forwarder) = forwarders_from_pods(node, proxy.addr()).await?;
    let host = cluster::HOST_FROM_PODS;
    let patch = json!({"spec": {
        "replicas": 2,
        "template": {"spec": {
            "hostNetwork": false,
            // The name the apiserver's certificate carries.
            "hostAliases": [{"ip": host, "hostnames": ["kubernetes.default.svc"]}],
            "containers": [{
                "name": "reconciler",
                "args": [
                    "--platform-type=AWS",
                    "--platform-region=us-east-1",
                    format!("--platform-api-url=http://{host}:{}", ec2_forwarder.addr().port()),
                    "--secret-name=cloud-credentials",
                    "--config-name=kube-cloud-config",
                    "--metrics-bind-address=0.0.0.0:19090",
                    "--log-format=json",
                ],
                "env": [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "kubernetes.default.svc"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": api_forwarder.addr().port().to_string()},
                ],
            }],
        }},
    }});
    Api::<Deployment>::namespaced(client.clone(), "cloudnet-system")
        .patch(
            "cloudnet-reconciler",
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await?;
    let selector = "app.kubernetes.io/name=cloudnet-reconciler";
    wait_pods_ready(client, selector, 2).await?;
    let named = |ip: IpAddr| encode_name(ip).map(|name| (ip, name));
    let [before, after, settled] = [named(ips[0])?, named(ips[1])?, named(ips[2])?];
    plugin::create(client, &before.1, "cluster-a").await?;
    plugin::wait_assigned(client, &before.1, "cluster-a").await?;
    let restarts_before = restarts(client, selector).await?;

    // The rotation, and the old key refused from the same moment.
    proxy.accept_only_key(Some(ROTATED_KEY));
    proxy.reset_key_counts();
    let started = Instant::now();
    let rotated = json!({"stringData": {
        "aws_access_key_id": ROTATED_KEY,
        "aws_secret_access_key": "cloudnet-e2e-secret-rotated",
    }});
    Api::<Secret>::namespaced(client.clone(), "cloudnet-system")
        .patch(
            "cloud-credentials",
            &PatchParams::default(),
            &Patch::Merge(rotated),
        )
        .await?;
    plugin::create(client, &after.1, "cluster-a").await?;
    plugin::wait_assigned_within(client, &after.1, "cluster-a", ROTATION_BOUND).await?;
    let converged = started.elapsed();
    wait_pods_ready(client, selector, 2).await?;
    let ready = started.elapsed();

    // Settled: a new object costs no refusal, and the old key never got through.
    let refused = proxy
        .key_counts()
        .get(ORIGINAL_KEY)
        .copied()
        .unwrap_or_default();
    plugin::create(client, &settled.1, "cluster-a").await?;
    plugin::wait_assigned(client, &settled.1, "cluster-a").await?;
    let counts = proxy.key_counts();
    let old = counts.get(ORIGINAL_KEY).copied().unwrap_or_default();
    let new = counts.get(ROTATED_KEY).copied().unwrap_or_default();
    let restarted = restarts(client, selector).await? - restarts_before;

    // The replica that stood by through the rotation takes over and acts with the new key too:
    // the leader's pod is deleted and the Deployment scaled to one right after, so the ReplicaSet
    // keeps the replica that stood by (a replacement it may have created meanwhile is still
    // Pending, and goes first). A scale-down alone lets the ReplicaSet choose, and it removes a
    // not-ready pod before any other, whatever its deletion cost: the standby is not ready for
    // as long as the kubelet takes to refresh its files when it won the lease during the
    // leader's reload with files older than the Secret (and released it at once).
    let leader = lease_holder(client).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), "cloudnet-system");
    pods.delete(&leader, &DeleteParams::default()).await?;
    scale(client, "cloudnet-system", "cloudnet-reconciler", 1).await?;
    let standby = wait::found(ROTATION_BOUND, "the standby to lead", || async {
        Ok(lease_holder(client)
            .await
            .ok()
            .filter(|holder| *holder != leader))
    })
    .await?;
    let survivors = pods.list(&ListParams::default().labels(selector)).await?;
    anyhow::ensure!(
        survivors
            .items
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some(standby.as_str())),
        "{standby} leads, not the replica that stood by"
    );
    let taken_over = standby;
    let (failover, failover_name) = (&ips[3], encode_name(ips[3])?);
    plugin::create(client, &failover_name, "cluster-a").await?;
    plugin::wait_assigned_within(client, &failover_name, "cluster-a", ROTATION_BOUND).await?;
    let after_failover = proxy.key_counts();
    let old_after = after_failover
        .get(ORIGINAL_KEY)
        .copied()
        .unwrap_or_default();
    eprintln!(
        "rotation: new object Assigned {converged:?} after the rotation, both replicas ready after \
         {ready:?}; old key {old:?}, new key {new:?}; container restarts {restarted}; after \
         {leader}'s deletion {taken_over} leads, counts {after_failover:?}; scenario took {:?}",
        scenario.elapsed()
    );
    anyhow::ensure!(
        old_after == old,
        "the standby that took over used the old key: {old:?} then {old_after:?}"
    );
    anyhow::ensure!(
        old.accepted == 0,
        "a call with the old key got through: {old:?}"
    );
    anyhow::ensure!(
        old.refused == refused.refused,
        "refusals of the old key went on after both replicas were ready: {refused:?} then {old:?}"
    );
    anyhow::ensure!(new.accepted > 0, "no call with the new key: {counts:?}");
    anyhow::ensure!(
        restarted <= 1,
        "{restarted} container restarts; the design allows the leader's one exit to reload"
    );
    let ec2 = e2e::ec2_client("us-east-1", moto_url)?;
    let held = ec2::addresses_of(&ec2, &instance.eni).await?;
    for ip in [&before.0, &after.0, &settled.0, failover] {
        anyhow::ensure!(held.contains(ip), "{ip} is not on the ENI: {held:?}");
    }
    Ok(())
}

/// The reconciler replica holding the Lease.
async fn lease_holder(client: &Client) -> anyhow::Result<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), "cloudnet-system")
        .get("cloud-network-config-controller-lock")
        .await?;
    lease
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
        .ok_or_else(|| anyhow::anyhow!("nobody holds the lease"))
}

/// Waits until exactly `count` pods match `selector`, every one Running and Ready.
async fn wait_pods_ready(client: &Client, selector: &str, count: usize) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(client.clone(), "cloudnet-system");
    wait::until(
        POD_TIMEOUT,
        &format!("{count} ready pods {selector}"),
        || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default().labels(selector)).await?;
                let ready = |pod: &Pod| {
                    pod.metadata.deletion_timestamp.is_none()
                        && pod.status.as_ref().is_some_and(|s| {
                            s.phase.as_deref() == Some("Running")
                                && s.conditions
                                    .iter()
                                    .flatten()
                                    .any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                };
                Ok(list.items.len() == count && list.items.iter().all(ready))
            }
        },
    )
    .await
}

/// The container restarts of the pods matching `selector`, summed.
async fn restarts(client: &Client, selector: &str) -> anyhow::Result<i32> {
    let pods = Api::<Pod>::namespaced(client.clone(), "cloudnet-system")
        .list(&ListParams::default().labels(selector))
        .await?;
    Ok(pods
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .map(|c| c.restart_count)
        .sum())
}

/// Every webhook of both configurations has a caBundle.
async fn ensure_ca_bundles(client: &Client) -> anyhow::Result<()> {
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("cloudnet-webhook")
        .await?;
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("cloudnet-webhook")
        .await?;
    let bundles: Vec<bool> = mutating
        .webhooks
        .iter()
        .flatten()
        .map(|w| &w.client_config)
        .chain(
            validating
                .webhooks
                .iter()
                .flatten()
                .map(|w| &w.client_config),
        )
        .map(|c| c.ca_bundle.as_ref().is_some_and(|b| !b.0.is_empty()))
        .collect();
    // One mutating entry (CloudPrivateIPConfig) and seven validating ones (CloudPrivateIPConfig,
    // EgressRouter, NetworkAttachmentDefinition, EgressPublicIP, Antrea's ExternalIPPool and
    // Egress, EgressGateway).
    anyhow::ensure!(
        bundles.len() == 8 && bundles.iter().all(|b| *b),
        "caBundle set on {bundles:?}"
    );
    Ok(())
}

fn install_webhook_certs(node: &NodeCluster) -> anyhow::Result<()> {
    let kubectl = node.control_plane().kubectl();
    let script = cloudnet_e2e::crate_file("../certs/install-webhook-certs.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .env(binaries::CERTS_ENV, binaries::certs()?)
        .env("KUBECTL", kubectl.get_program())
        .env("KUBECONFIG", node.control_plane().kubeconfig_path())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "install-webhook-certs.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

async fn scale(client: &Client, namespace: &str, name: &str, replicas: i32) -> anyhow::Result<()> {
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    Ok(())
}

/// Scales Deployment `namespace/name` (whose pods carry `app.kubernetes.io/name=<name>`) to zero
/// and waits until its pods are gone.
async fn scale_to_zero(client: &Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    scale(client, namespace, name, 0).await?;
    wait_no_pods(client, namespace, &format!("app.kubernetes.io/name={name}")).await
}

async fn wait_no_pods(client: &Client, namespace: &str, selector: &str) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    wait::until(POD_TIMEOUT, &format!("no pods {selector}"), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels(selector)).await?;
            Ok(list.items.is_empty())
        }
    })
    .await
}
