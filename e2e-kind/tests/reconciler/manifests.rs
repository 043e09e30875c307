//! The reconciler's deployment manifests are accepted by kube-apiserver and say what the issue
//! asks: two hardened replicas under leader election with probes and the upstream mounts, a
//! PodDisruptionBudget, one overlay per cloud whose arguments the reconciler's own flag parser
//! accepts, roles granting exactly what `cloudnet_reconciler::rbac::PERMISSIONS` lists (by name
//! where the code only touches named objects), and an OpenShift component that moves everything
//! into upstream's namespace. The monitoring manifests are accepted with the prometheus-operator
//! CRDs (of the pinned module) and scrape ports that exist on what they select; the alert rules
//! pass `promtool check rules` and their unit tests, in which every alert fires and stays silent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use cloudnet_e2e::ControlPlane;
use cloudnet_e2e::harness::helm::{self, Helm};
use cloudnet_reconciler::process::Flags;
use cloudnet_reconciler::rbac::{PERMISSIONS, Scope};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kube::Api;
use serde_json::Value;

const NAMESPACE: &str = "cloudnet-system";
const UPSTREAM_NAMESPACE: &str = "openshift-cloud-network-config-controller";

fn overlay(name: &str) -> PathBuf {
    cloudnet_e2e::crate_file(&format!("../manifests/reconciler/overlays/{name}"))
}

/// The objects `kubectl apply -k dir` would send, rendered by kubectl itself.
fn render(cp: &ControlPlane, dir: &Path) -> Vec<Value> {
    let args = ["apply", "--dry-run=client", "-o", "json", "-k"];
    let stdout = cp
        .run_kubectl(args.iter().map(OsStr::new).chain([dir.as_os_str()]))
        .unwrap();
    let list: Value = serde_json::from_slice(&stdout).unwrap();
    list["items"].as_array().unwrap().clone()
}

fn apply(cp: &ControlPlane, dir: &Path) {
    cp.run_kubectl([OsStr::new("apply"), OsStr::new("-k"), dir.as_os_str()])
        .unwrap();
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn deployment_of(objects: &[Value]) -> Deployment {
    serde_json::from_value(find(objects, "Deployment", "cloudnet-reconciler").clone()).unwrap()
}

fn flags_of(deployment: &Deployment) -> Flags {
    let container = &deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    let args = std::iter::once("cloudnet-reconciler".to_owned())
        .chain(container.args.clone().unwrap_or_default());
    Flags::from_args(args).unwrap()
}

/// (scope, group, resource, verb, resourceNames) for every verb a rule grants.
type Grant = (Scope, String, String, String, Vec<String>);

fn grants(scope: Scope, rules: &[PolicyRule]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.insert((
                        scope,
                        group.clone(),
                        resource.clone(),
                        verb.clone(),
                        rule.resource_names.clone().unwrap_or_default(),
                    ));
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn manifests_apply_and_deploy_a_hardened_least_privilege_reconciler() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    apply(&cp, &overlay("aws"));
    let client = cp.client().await.unwrap();

    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get("cloudnet-reconciler")
        .await
        .unwrap();
    let flags = flags_of(&deployment);
    assert_eq!(flags.platform_type, "AWS");
    assert!(!flags.platform_region.is_empty());
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("cloudnet-reconciler")
    );
    let security = pod.security_context.unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let container = &pod.containers[0];
    let hardened = container.security_context.as_ref().unwrap();
    assert_eq!(hardened.read_only_root_filesystem, Some(true));
    assert_eq!(hardened.allow_privilege_escalation, Some(false));
    let resources = container.resources.as_ref().unwrap();
    assert!(
        resources
            .requests
            .as_ref()
            .is_some_and(|r| r.contains_key("memory"))
    );
    assert!(
        resources
            .limits
            .as_ref()
            .is_some_and(|r| r.contains_key("memory"))
    );

    // The leader identity is the pod name; the namespace is the pod's.
    let env = container.env.as_deref().unwrap();
    let field_of = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    };
    assert_eq!(field_of("POD_NAME").as_deref(), Some("metadata.name"));
    assert_eq!(
        field_of("CONTROLLER_NAMESPACE").as_deref(),
        Some("metadata.namespace")
    );

    // Probes on the metrics port, which the flags bind.
    let port = container.ports.as_deref().unwrap()[0].container_port;
    assert!(flags.metrics_bind_address.ends_with(&format!(":{port}")));
    for (probe, path) in [
        (&container.liveness_probe, "/healthz"),
        (&container.readiness_probe, "/readyz"),
    ] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
    }

    // The Secret and ConfigMap the flags name, mounted where the flags read them.
    let volumes = pod.volumes.unwrap();
    let mounts = container.volume_mounts.as_deref().unwrap();
    let mount_of = |volume: &str| {
        mounts
            .iter()
            .find(|m| m.name == volume)
            .map(|m| PathBuf::from(&m.mount_path))
    };
    let secret = volumes.iter().find(|v| v.secret.is_some()).unwrap();
    assert_eq!(
        secret.secret.as_ref().unwrap().secret_name.as_deref(),
        Some(flags.secret_name.as_str())
    );
    assert_eq!(mount_of(&secret.name), Some(flags.secret_override.clone()));
    assert_eq!(
        flags.secret_override,
        Path::new("/etc/secret/cloudprovider")
    );
    let config = volumes.iter().find(|v| v.config_map.is_some()).unwrap();
    assert_eq!(
        config.config_map.as_ref().unwrap().name,
        flags.config_name.as_str()
    );
    assert_eq!(mount_of(&config.name), Some(flags.config_override.clone()));

    Api::<PodDisruptionBudget>::namespaced(client.clone(), NAMESPACE)
        .get("cloudnet-reconciler")
        .await
        .unwrap();

    // The roles grant exactly the code's list; named objects by name only.
    let objects = render(&cp, &overlay("aws"));
    let rules = |kind: &str, name: &str| -> Vec<PolicyRule> {
        serde_json::from_value(find(&objects, kind, name)["rules"].clone()).unwrap()
    };
    let mut granted = grants(Scope::Cluster, &rules("ClusterRole", "cloudnet-reconciler"));
    granted.extend(grants(
        Scope::ControllerNamespace,
        &rules("Role", "cloudnet-reconciler"),
    ));
    granted.extend(grants(
        Scope::Events,
        &rules("Role", "cloudnet-reconciler-events"),
    ));
    let lease = cloudnet_reconciler::leader::LEASE_NAME.to_owned();
    let mut used = BTreeSet::new();
    for p in PERMISSIONS {
        let names = match (p.by_name, p.resource) {
            (false, _) => vec![],
            (true, "leases") => vec![lease.clone()],
            (true, "secrets") => vec![flags.secret_name.clone()],
            (true, "configmaps") => vec![flags.config_name.clone()],
            (true, other) => panic!("no name known for {other}"),
        };
        for verb in p.verbs {
            used.insert((
                p.scope,
                p.group.to_owned(),
                p.resource.to_owned(),
                (*verb).to_owned(),
                names.clone(),
            ));
        }
    }
    assert_eq!(granted, used);
    let events_role: Role =
        serde_json::from_value(find(&objects, "Role", "cloudnet-reconciler-events").clone())
            .unwrap();
    assert_eq!(
        events_role.metadata.namespace.as_deref(),
        Some(cloudnet_reconciler::controller::EVENT_NAMESPACE)
    );
}

#[tokio::test]
async fn every_cloud_overlay_sets_a_platform_the_flags_accept() {
    let cp = ControlPlane::shared().await.unwrap();
    for (dir, platform) in [
        ("aws", "AWS"),
        ("azure", "Azure"),
        ("gcp", "GCP"),
        ("openstack", "OpenStack"),
    ] {
        let objects = render(cp, &overlay(dir));
        let flags = flags_of(&deployment_of(&objects));
        assert_eq!(flags.platform_type, platform, "{dir}");
        assert!(
            platform
                .parse::<cloudnet_shared::Platform>()
                .is_ok_and(|p| p.as_str() == platform),
            "{dir}"
        );
    }
}

/// A path from `from` to `to`, both absolute: kustomize refuses absolute paths to other
/// kustomizations.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to[common..] {
        path.push(part);
    }
    path
}

#[tokio::test]
async fn the_openshift_component_moves_everything_into_upstreams_namespace() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let aws = overlay("aws").canonicalize().unwrap();
    let openshift = overlay("openshift").canonicalize().unwrap();
    std::fs::write(
        root.join("kustomization.yaml"),
        format!(
            "resources: [{}]\ncomponents: [{}]\n",
            relative(&root, &aws).display(),
            relative(&root, &openshift).display()
        ),
    )
    .unwrap();
    let objects = render(&cp, &root);
    for object in &objects {
        let kind = object["kind"].as_str().unwrap();
        let name = object["metadata"]["name"].as_str().unwrap();
        let namespace = object["metadata"]["namespace"].as_str();
        match (kind, name) {
            ("Namespace", _) => assert_eq!(name, UPSTREAM_NAMESPACE),
            ("ClusterRole" | "ClusterRoleBinding", _) => assert_eq!(namespace, None),
            (_, "cloudnet-reconciler-events") => {
                assert_eq!(
                    namespace,
                    Some(cloudnet_reconciler::controller::EVENT_NAMESPACE)
                );
            }
            _ => assert_eq!(namespace, Some(UPSTREAM_NAMESPACE), "{kind} {name}"),
        }
    }
    // Upstream's leader election timings, so mixed upstream and cloudnet replicas agree.
    let flags = flags_of(&deployment_of(&objects));
    assert_eq!(
        (
            flags.leader_elect_lease_duration.as_secs(),
            flags.leader_elect_renew_deadline.as_secs(),
            flags.leader_elect_retry_period.as_secs(),
        ),
        (137, 107, 26)
    );
    assert_eq!(
        flags.platform_type, "AWS",
        "the cloud overlay's arguments are kept"
    );
    // The trusted CA bundle OpenShift injects, mounted where the reconciler reads it.
    let injected = find(&objects, "ConfigMap", "trusted-ca");
    assert_eq!(
        injected["metadata"]["labels"]["config.openshift.io/inject-trusted-cabundle"],
        "true"
    );
    let pod = deployment_of(&objects).spec.unwrap().template.spec.unwrap();
    let mount = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "trusted-ca")
        .expect("the trusted CA is mounted");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "trusted-ca")
        .expect("the trusted CA volume");
    let items = volume.config_map.as_ref().and_then(|c| c.items.clone());
    let bundle = std::path::Path::new(&mount.mount_path).join(&items.unwrap()[0].path);
    assert_eq!(
        bundle,
        std::path::Path::new(cloudnet_reconciler::outbound::trust::TRUSTED_CA_BUNDLE)
    );
    apply(&cp, &root);
    let client = cp.client().await.unwrap();
    let binding = Api::<ClusterRoleBinding>::all(client.clone())
        .get("cloudnet-reconciler")
        .await
        .unwrap();
    let events = Api::<RoleBinding>::namespaced(client.clone(), "default")
        .get("cloudnet-reconciler-events")
        .await
        .unwrap();
    for subjects in [binding.subjects.unwrap(), events.subjects.unwrap()] {
        assert_eq!(subjects[0].namespace.as_deref(), Some(UPSTREAM_NAMESPACE));
    }
    Api::<Deployment>::namespaced(client, UPSTREAM_NAMESPACE)
        .get("cloudnet-reconciler")
        .await
        .unwrap();
}

/// Labels the chart puts on every object it renders, by Helm's convention, which the kustomize
/// manifests do not carry: the one difference the chart and the manifests may have.
const HELM_LABELS: [&str; 3] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
];

/// (apiVersion, kind, namespace, name): what identifies an object in a cluster.
type ObjectKey = (String, String, String, String);

fn by_key(objects: impl IntoIterator<Item = Value>) -> BTreeMap<ObjectKey, Value> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut map = BTreeMap::new();
    for object in objects {
        let meta = &object["metadata"];
        let key = (
            text(&object["apiVersion"]),
            text(&object["kind"]),
            text(&meta["namespace"]),
            text(&meta["name"]),
        );
        assert!(map.insert(key.clone(), object).is_none(), "{key:?} twice");
    }
    map
}

fn without_helm_labels(mut object: Value) -> Value {
    if let Some(labels) = object["metadata"]
        .get_mut("labels")
        .and_then(Value::as_object_mut)
    {
        for label in HELM_LABELS {
            labels.remove(label);
        }
        if labels.is_empty() {
            object["metadata"].as_object_mut().unwrap().remove("labels");
        }
    }
    object
}

/// The first place where `a` and `b` differ, as a JSON pointer with both values.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            let side =
                |m: &'_ serde_json::Map<String, Value>| m.get(k).unwrap_or(&Value::Null).clone();
            first_difference(&side(x), &side(y), &format!("{at}/{k}"))
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{at}/{i}"))),
        _ => (a != b).then(|| format!("{at}: {a} vs {b}")),
    }
}

/// The objects `kubectl kustomize dir` renders.
fn kustomize(dir: &Path) -> Vec<Value> {
    let kubectl = cloudnet_e2e::harness::controlplane::locate_binaries().unwrap();
    helm::parse_documents(&kubectl.kustomize(dir).unwrap()).unwrap()
}

/// A kustomization in `dir` with `body`, whose `{name}` placeholders become relative paths to
/// `manifests/<name>` (kustomize refuses absolute ones).
fn kustomization(dir: &Path, body: &str, names: &[&str]) -> PathBuf {
    let root = dir.canonicalize().unwrap();
    let mut text = body.to_owned();
    for name in names {
        let target = cloudnet_e2e::crate_file(&format!("../manifests/{name}"))
            .canonicalize()
            .unwrap();
        text = text.replace(
            &format!("{{{name}}}"),
            &relative(&root, &target).display().to_string(),
        );
    }
    std::fs::write(root.join("kustomization.yaml"), text).unwrap();
    root
}

/// The kustomize side of the OpenShift mode: the webhook and the AWS overlay with the openshift
/// component, and the webhook's `--ledger-namespace` set to upstream's namespace, as the
/// webhook's manifest tells an OpenShift install to do.
const OPENSHIFT_KUSTOMIZATION: &str = "\
resources: [{webhook}, {reconciler/overlays/aws}]
components: [{reconciler/overlays/openshift}]
patches:
  - target: {kind: Deployment, name: cloudnet-webhook}
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/args/5
        value: --ledger-namespace=cloudnet-system
      - op: replace
        path: /spec/template/spec/containers/0/args/5
        value: --ledger-namespace=openshift-cloud-network-config-controller
";

/// The kustomize side of the Antrea front end: the webhook and the AWS overlay with the antrea
/// component.
const ANTREA_KUSTOMIZATION: &str = "\
resources: [{webhook}, {reconciler/overlays/aws}]
components: [{reconciler/overlays/antrea}]
";

/// The kustomize side of the egress gateway front end: the webhook and the AWS overlay with the
/// egress-gateway component.
const GATEWAY_KUSTOMIZATION: &str = "\
resources: [{webhook}, {reconciler/overlays/aws}]
components: [{reconciler/overlays/egress-gateway}]
";

#[test]
fn the_chart_renders_what_the_kustomize_manifests_render() {
    let helm = Helm::locate().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let antrea_dir = tempfile::tempdir().unwrap();
    let antrea = kustomization(
        antrea_dir.path(),
        ANTREA_KUSTOMIZATION,
        &[
            "webhook",
            "reconciler/overlays/aws",
            "reconciler/overlays/antrea",
        ],
    );
    let gateway_dir = tempfile::tempdir().unwrap();
    let gateway = kustomization(
        gateway_dir.path(),
        GATEWAY_KUSTOMIZATION,
        &[
            "webhook",
            "reconciler/overlays/aws",
            "reconciler/overlays/egress-gateway",
        ],
    );
    let openshift = kustomization(
        tmp.path(),
        OPENSHIFT_KUSTOMIZATION,
        &[
            "webhook",
            "reconciler/overlays/aws",
            "reconciler/overlays/openshift",
        ],
    );
    let manifests = |dir: &str| cloudnet_e2e::crate_file(&format!("../manifests/{dir}"));
    let cases: [(&[&str], Vec<PathBuf>); 11] = [
        (&[], vec![manifests("webhook"), overlay("aws")]),
        (
            &["cloud=Azure"],
            vec![manifests("webhook"), overlay("azure")],
        ),
        (&["cloud=GCP"], vec![manifests("webhook"), overlay("gcp")]),
        (
            &["cloud=OpenStack"],
            vec![manifests("webhook"), overlay("openstack")],
        ),
        (
            &["webhook.certManager.enabled=true"],
            vec![manifests("webhook-cert-manager"), overlay("aws")],
        ),
        (&["openshift.enabled=true"], vec![openshift]),
        (&["reconciler.frontEnds.antrea.enabled=true"], vec![antrea]),
        (
            &["reconciler.frontEnds.egressGateway.enabled=true"],
            vec![gateway],
        ),
        (
            &["nodeAgent.enabled=true"],
            vec![
                manifests("webhook"),
                overlay("aws"),
                manifests("node-agent"),
            ],
        ),
        (
            &[
                "monitoring.serviceMonitor.enabled=true",
                "monitoring.prometheusRule.enabled=true",
                "monitoring.dashboard.enabled=true",
            ],
            vec![
                manifests("webhook"),
                overlay("aws"),
                manifests("monitoring/service-monitors"),
            ],
        ),
        (
            &[
                "monitoring.podMonitor.enabled=true",
                "monitoring.prometheusRule.enabled=true",
                "monitoring.dashboard.enabled=true",
            ],
            vec![
                manifests("webhook"),
                overlay("aws"),
                manifests("monitoring/pod-monitors"),
            ],
        ),
    ];
    // The chart's crds/ ships both CRDs, links to these files; kustomize installs them apart
    // (manifests/crd, manifests/gateways). Read as they are: `kubectl kustomize` rewrites the
    // schemas' `0.0` as `0`.
    let crd = std::fs::read_to_string(manifests(
        "crd/cloudprivateipconfigs.cloud.network.openshift.io.yaml",
    ))
    .unwrap();
    let gateway_crd =
        std::fs::read_to_string(manifests("gateways/egressgateways.cloudnet.io.yaml")).unwrap();
    for (set, dirs) in cases {
        helm.lint(set).unwrap();
        let chart = by_key(
            helm.template(set)
                .unwrap()
                .into_iter()
                .map(without_helm_labels),
        );
        let kustomized = by_key(
            helm::parse_documents(&crd)
                .unwrap()
                .into_iter()
                .chain(helm::parse_documents(&gateway_crd).unwrap())
                .chain(dirs.iter().flat_map(|d| kustomize(d))),
        );
        assert!(kustomized.len() > 20, "{set:?}: {kustomized:#?}");
        assert_eq!(
            chart.keys().collect::<Vec<_>>(),
            kustomized.keys().collect::<Vec<_>>(),
            "{set:?}: the chart and the manifests render different objects"
        );
        for (key, object) in &kustomized {
            if let Some(difference) = first_difference(object, &chart[key], "") {
                panic!("{set:?}: {key:?} differs at {difference} (manifests vs chart)");
            }
        }
    }
}

#[test]
fn the_charts_values_reach_the_flags_and_objects() {
    let helm = Helm::locate().unwrap();
    let set = [
        "cloud=OpenStack",
        "platform.apiUrl=https://neutron.example:9696",
        "credentials.secretName=openstack-credentials",
        "cloudConfig.name=openstack-config",
        "logFormat=text",
        "reconciler.namespace=egress",
        "reconciler.replicas=3",
        "reconciler.image.repository=registry.example/cloudnet-reconciler",
        "reconciler.image.tag=v1",
        "reconciler.image.pullPolicy=IfNotPresent",
        "reconciler.resources.limits.memory=1Gi",
        "reconciler.leaderElection.leaseDuration=90s",
        "reconciler.leaderElection.renewDeadline=70s",
        "reconciler.leaderElection.retryPeriod=10s",
        "reconciler.rateLimits.readQPS=2.5",
        "reconciler.rateLimits.readBurst=20",
        "reconciler.rateLimits.writeQPS=0",
        "reconciler.metricsPort=9191",
        "webhook.replicas=3",
        "webhook.image.tag=v1",
        "webhook.port=8443",
    ];
    helm.lint(&set).unwrap();
    let objects = helm.template(&set).unwrap();
    let reconciler = deployment_of(&objects);
    let flags = flags_of(&reconciler);
    assert_eq!(flags.platform_type, "OpenStack");
    assert_eq!(flags.platform_api_url, "https://neutron.example:9696");
    assert_eq!(flags.platform_region, "", "the region is AWS's alone");
    assert_eq!(flags.secret_name, "openstack-credentials");
    assert_eq!(flags.config_name, "openstack-config");
    assert_eq!(
        flags.log_format,
        cloudnet_reconciler::process::LogFormat::Text
    );
    assert_eq!(flags.metrics_bind_address, "0.0.0.0:9191");
    assert_eq!(
        (
            flags.leader_elect_lease_duration.as_secs(),
            flags.leader_elect_renew_deadline.as_secs(),
            flags.leader_elect_retry_period.as_secs(),
        ),
        (90, 70, 10)
    );
    assert_eq!(
        (
            flags.cloud_read_qps,
            flags.cloud_read_burst,
            flags.cloud_write_qps,
            flags.cloud_write_burst
        ),
        (Some(2.5), Some(20), Some(0.0), None)
    );
    assert_eq!(reconciler.metadata.namespace.as_deref(), Some("egress"));
    let spec = reconciler.spec.unwrap();
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.unwrap();
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("registry.example/cloudnet-reconciler:v1")
    );
    assert_eq!(container.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(container.ports.as_deref().unwrap()[0].container_port, 9191);
    let limits = container
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    assert_eq!(limits["memory"].0, "1Gi");
    // The Secret the flags name is the one mounted and the one the Role lets it watch.
    let secret = pod.volumes.iter().flatten().find_map(|v| v.secret.as_ref());
    assert_eq!(
        secret.and_then(|s| s.secret_name.as_deref()),
        Some("openstack-credentials")
    );
    let role: Role =
        serde_json::from_value(find(&objects, "Role", "cloudnet-reconciler").clone()).unwrap();
    assert!(role.rules.unwrap().iter().any(|r| {
        r.resources.as_deref() == Some(&["secrets".to_owned()][..])
            && r.resource_names.as_deref() == Some(&["openstack-credentials".to_owned()][..])
    }));

    // The webhook: its port on the pods and in the NetworkPolicy, the ledger in the reconciler's
    // namespace, text logs.
    let webhook: Deployment =
        serde_json::from_value(find(&objects, "Deployment", "cloudnet-webhook").clone()).unwrap();
    let spec = webhook.spec.unwrap();
    assert_eq!(spec.replicas, Some(3));
    let container = &spec.template.spec.unwrap().containers[0];
    let args = container.args.clone().unwrap();
    for expected in [
        "--listen-address=0.0.0.0:8443",
        "--ledger-namespace=egress",
        "--log-format=text",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    assert_eq!(container.ports.as_deref().unwrap()[0].container_port, 8443);
    assert!(container.image.as_deref().unwrap().ends_with(":v1"));
    let policy = find(&objects, "NetworkPolicy", "cloudnet-webhook");
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 8443);
    let namespaces: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "Namespace")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(namespaces, BTreeSet::from(["cloudnet", "egress"]));

    // A cloud the reconciler does not know, or every series scraped twice, is refused when
    // rendering, not when running.
    for (set, refusal) in [
        (
            &["cloud=Openstack"][..],
            "cloud must be AWS, Azure, GCP or OpenStack",
        ),
        (
            &[
                "monitoring.serviceMonitor.enabled=true",
                "monitoring.podMonitor.enabled=true",
            ][..],
            "not both",
        ),
    ] {
        let refused = helm.template(set).unwrap_err();
        assert!(format!("{refused:#}").contains(refusal), "{refused:#}");
    }

    // The chart's version is the workspace's, and so is its images' default tag.
    let chart: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(helm::chart_dir().join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    for field in ["version", "appVersion"] {
        assert_eq!(
            chart[field],
            env!("CARGO_PKG_VERSION"),
            "Chart.yaml {field}"
        );
    }
}

fn monitoring(dir: &str) -> PathBuf {
    cloudnet_e2e::crate_file(&format!("../manifests/monitoring/{dir}"))
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    let wanted = selector["matchLabels"].as_object().unwrap();
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels[k] == *v)
}

/// The container port names of the workload in `namespace` whose pods `selector` selects.
fn pod_ports(objects: &[Value], namespace: &Value, selector: &Value) -> Vec<String> {
    let deployment = objects
        .iter()
        .find(|o| {
            o["kind"] == "Deployment"
                && o["metadata"]["namespace"] == *namespace
                && labels_match(selector, &o["spec"]["template"]["metadata"]["labels"])
        })
        .unwrap_or_else(|| panic!("no Deployment in {namespace} matches {selector}"));
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect()
}

/// A monitor's `endpoint` reaches a port the pods have (`port`, by name), and over TLS verifies
/// the webhook against the CA of the Secret the webhook serves from.
fn assert_scrapes(endpoint: &Value, port: &Value, container_ports: &[String], webhook: &Value) {
    assert!(
        container_ports.iter().any(|p| port == p),
        "{endpoint}: no port {port}"
    );
    if endpoint["scheme"] == "https" {
        assert_eq!(
            endpoint["tlsConfig"]["ca"]["secret"]["name"],
            tls_secret(webhook)
        );
    }
}

/// The Secret the webhook mounts its serving certificate from.
fn tls_secret(webhook: &Value) -> &str {
    webhook["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["secret"]["secretName"].as_str())
        .unwrap()
}

#[tokio::test]
async fn monitoring_manifests_apply_with_the_operator_crds_and_scrape_ports_that_exist() {
    let crds = tokio::task::spawn_blocking(cloudnet_e2e::harness::prometheus::operator_crds)
        .await
        .unwrap()
        .unwrap();
    let cp = ControlPlane::start_with_crd().await.unwrap();
    cp.run_kubectl([
        OsStr::new("apply"),
        OsStr::new("--server-side"),
        OsStr::new("-f"),
        crds.as_os_str(),
    ])
    .unwrap();
    let established = ["wait", "--for=condition=Established", "--timeout=60s", "-f"];
    cp.run_kubectl(established.iter().map(OsStr::new).chain([crds.as_os_str()]))
        .unwrap();
    let webhook_dir = cloudnet_e2e::crate_file("../manifests/webhook");
    apply(&cp, &overlay("aws"));
    apply(&cp, &webhook_dir);
    // Strict field validation: a field the CRDs' schemas do not know is refused.
    apply(&cp, &monitoring(""));
    apply(&cp, &monitoring("pod-monitors"));

    let mut workloads = render(&cp, &overlay("aws"));
    workloads.extend(render(&cp, &webhook_dir));
    let kinds = |objects: &[Value]| -> BTreeSet<String> {
        objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    let by_service = render(&cp, &monitoring(""));
    let by_pod = render(&cp, &monitoring("pod-monitors"));
    let shared = ["PrometheusRule/cloudnet", "ConfigMap/cloudnet-dashboard"];
    let with = |kind: &str| {
        let mut set: BTreeSet<String> = shared.iter().map(|s| (*s).to_owned()).collect();
        set.insert(format!("{kind}/cloudnet-reconciler"));
        set.insert(format!("{kind}/cloudnet-webhook"));
        set
    };
    assert_eq!(kinds(&by_service), with("ServiceMonitor"));
    assert_eq!(
        kinds(&by_pod),
        with("PodMonitor"),
        "PodMonitors replace the ServiceMonitors"
    );

    let webhook = find(&workloads, "Deployment", "cloudnet-webhook");
    for monitor in by_service.iter().filter(|o| o["kind"] == "ServiceMonitor") {
        let namespace = &monitor["metadata"]["namespace"];
        let service = workloads
            .iter()
            .find(|o| {
                o["kind"] == "Service"
                    && o["metadata"]["namespace"] == *namespace
                    && labels_match(&monitor["spec"]["selector"], &o["metadata"]["labels"])
            })
            .unwrap_or_else(|| panic!("no Service for {monitor}"));
        let container_ports = pod_ports(
            &workloads,
            namespace,
            &json_selector(&service["spec"]["selector"]),
        );
        for endpoint in monitor["spec"]["endpoints"].as_array().unwrap() {
            let port = service["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == endpoint["port"])
                .unwrap_or_else(|| {
                    panic!(
                        "{} has no port {}",
                        service["metadata"]["name"], endpoint["port"]
                    )
                });
            assert_scrapes(endpoint, &port["targetPort"], &container_ports, webhook);
        }
    }
    for monitor in by_pod.iter().filter(|o| o["kind"] == "PodMonitor") {
        let container_ports = pod_ports(
            &workloads,
            &monitor["metadata"]["namespace"],
            &monitor["spec"]["selector"],
        );
        for endpoint in monitor["spec"]["podMetricsEndpoints"].as_array().unwrap() {
            assert_scrapes(endpoint, &endpoint["port"], &container_ports, webhook);
        }
    }
    // The stored rule is what the file says (nothing pruned by the CRD's schema).
    let stored = cp
        .run_kubectl([
            "get",
            "prometheusrule",
            "-n",
            NAMESPACE,
            "cloudnet",
            "-o",
            "json",
        ])
        .unwrap();
    let stored: Value = serde_json::from_slice(&stored).unwrap();
    assert_eq!(
        stored["spec"],
        find(&by_service, "PrometheusRule", "cloudnet")["spec"]
    );
    let service = find(&workloads, "Service", "cloudnet-reconciler-metrics");
    assert_eq!(
        service["spec"]["publishNotReadyAddresses"], true,
        "an unready leader is scraped too"
    );
}

/// A Service's selector as a label selector.
fn json_selector(labels: &Value) -> Value {
    serde_json::json!({ "matchLabels": labels })
}

#[test]
fn alert_rules_pass_promtool_and_each_alert_fires_and_stays_silent_in_its_tests() {
    let promtool = cloudnet_e2e::harness::prometheus::promtool().unwrap();
    let rule: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(monitoring("base/prometheus-rule.yaml")).unwrap(),
    )
    .unwrap();
    let tests_file = cloudnet_e2e::crate_file("prometheus/alerts.test.yaml");
    let tests: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&tests_file).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // JSON is YAML: promtool reads the PrometheusRule's spec as a rule file.
    std::fs::write(dir.path().join("rules.json"), rule["spec"].to_string()).unwrap();
    std::fs::copy(&tests_file, dir.path().join("alerts.test.yaml")).unwrap();
    for args in [
        ["check", "rules", "rules.json"],
        ["test", "rules", "alerts.test.yaml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let alerts: BTreeSet<String> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["alert"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(alerts.len(), 8, "{alerts:?}");
    let cases: Vec<(String, bool)> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .map(|c| {
            let fires = c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            (c["alertname"].as_str().unwrap().to_owned(), fires)
        })
        .collect();
    for alert in &alerts {
        for fires in [true, false] {
            assert!(
                cases.contains(&(alert.clone(), fires)),
                "{alert} has no case in which it {}",
                if fires { "fires" } else { "stays silent" }
            );
        }
    }
}

#[tokio::test]
async fn the_manifests_pin_their_images_to_the_workspace_version() {
    let cp = ControlPlane::shared().await.unwrap();
    let mut objects = render(cp, &overlay("aws"));
    objects.extend(render(
        cp,
        &cloudnet_e2e::crate_file("../manifests/webhook"),
    ));
    objects.extend(render(
        cp,
        &cloudnet_e2e::crate_file("../manifests/node-agent"),
    ));
    let images: Vec<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "Deployment" || o["kind"] == "DaemonSet")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
        })
        .map(|c| c["image"].as_str().unwrap())
        .collect();
    assert_eq!(images.len(), 3, "{images:?}");
    for image in images {
        assert_eq!(
            image.rsplit_once(':').map(|(_, tag)| tag),
            Some(env!("CARGO_PKG_VERSION")),
            "{image}: a release's manifests run that release's images"
        );
    }
}
