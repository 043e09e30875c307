//! The webhook's deployment manifests are accepted by kube-apiserver and say what SPEC §3 and the
//! operations brief require: the resource only (mutating: CREATE, Ignore; validating: CREATE/UPDATE,
//! Fail, metadata-only updates filtered by a match condition), no side effects, a short
//! timeout, two hardened replicas and read-only RBAC; egress routers on their own paths, with
//! NetworkAttachmentDefinitions filtered to egress-router configs by a match condition; and no
//! shipped role that may write EgressGateways (only admins do).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use cloudnet_e2e::ControlPlane;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;

fn assert_rules(rules: &[RuleWithOperations], operations: &[&str]) {
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(rule.operations.as_deref().unwrap(), operations);
    // "cloudprivateipconfigs" alone does not match the status subresource.
    assert_eq!(
        rule.resources.as_deref().unwrap(),
        ["cloudprivateipconfigs"]
    );
    assert_eq!(
        rule.api_groups.as_deref().unwrap(),
        ["cloud.network.openshift.io"]
    );
}

#[tokio::test]
async fn manifests_apply_and_configure_a_strict_hardened_webhook() {
    let cp = ControlPlane::start_with_crd().await.unwrap();
    let dir = cloudnet_e2e::crate_file("../manifests/webhook");
    cp.run_kubectl(["apply".as_ref(), "-k".as_ref(), dir.as_os_str()])
        .unwrap();

    let client = cp.client().await.unwrap();
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("cloudnet-webhook")
        .await
        .unwrap();
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("cloudnet-webhook")
        .await
        .unwrap();
    let webhooks = validating.webhooks.unwrap();
    let v = &webhooks[0];
    let m = &mutating.webhooks.unwrap()[0];
    // Mutating: CREATE only and Ignore; validating: Fail, metadata-only updates filtered out.
    assert_eq!(v.match_conditions.as_ref().map(Vec::len), Some(1));
    for (rules, operations, failure, side_effects, timeout, versions) in [
        (
            &v.rules,
            &["CREATE", "UPDATE"][..],
            &v.failure_policy,
            &v.side_effects,
            v.timeout_seconds,
            &v.admission_review_versions,
        ),
        (
            &m.rules,
            &["CREATE"][..],
            &m.failure_policy,
            &m.side_effects,
            m.timeout_seconds,
            &m.admission_review_versions,
        ),
    ] {
        assert_rules(rules.as_deref().unwrap(), operations);
        let expected = if operations == ["CREATE"] {
            "Ignore"
        } else {
            "Fail"
        };
        assert_eq!(failure.as_deref(), Some(expected));
        assert_eq!(side_effects, "None");
        assert!(timeout.unwrap() <= 5);
        assert_eq!(versions, &["v1"]);
    }

    let egress: Vec<_> = webhooks[1..]
        .iter()
        .map(|w| {
            let rule = &w.rules.as_deref().unwrap()[0];
            assert_eq!(rule.operations.as_deref().unwrap(), ["CREATE", "UPDATE"]);
            // Antrea's Egresses of every pool pass this entry: it must not stop Antrea while the
            // webhook is down.
            let policy = if rule.resources.as_deref().unwrap()[0] == "egresses" {
                "Ignore"
            } else {
                "Fail"
            };
            assert_eq!(w.failure_policy.as_deref(), Some(policy), "{}", w.name);
            assert_eq!(w.side_effects, "None");
            assert!(w.timeout_seconds.unwrap() <= 5);
            let service = w.client_config.service.as_ref().unwrap();
            (
                rule.api_groups.as_deref().unwrap()[0].as_str(),
                rule.resources.as_deref().unwrap()[0].as_str(),
                service.path.as_deref().unwrap(),
                w.match_conditions.as_ref().map(Vec::len),
            )
        })
        .collect();
    assert_eq!(
        egress,
        [
            (
                "network.operator.openshift.io",
                "egressrouters",
                "/validate-egressrouter",
                None
            ),
            (
                "k8s.cni.cncf.io",
                "network-attachment-definitions",
                "/validate-nad",
                Some(1)
            ),
            (
                "cloudnet.io",
                "egresspublicips",
                "/validate-egresspublicip",
                Some(1)
            ),
            (
                "crd.antrea.io",
                "externalippools",
                "/validate-antrea-externalippool",
                Some(1)
            ),
            (
                "crd.antrea.io",
                "egresses",
                "/validate-antrea-egress",
                Some(1)
            ),
            (
                "cloudnet.io",
                "egressgateways",
                "/validate-egressgateway",
                Some(1)
            ),
        ]
    );
    // Only opted-in pools are sent; an Egress names no pool label, so every one with an IP is.
    let selectors: Vec<_> = webhooks[4..]
        .iter()
        .map(|w| {
            w.object_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone())
        })
        .collect();
    assert_eq!(
        selectors,
        [
            Some(
                [(
                    cloudnet_shared::antrea::OPT_IN_LABEL.to_owned(),
                    cloudnet_shared::antrea::OPT_IN_VALUE.to_owned()
                )]
                .into()
            ),
            None,
            None
        ]
    );

    let role = Api::<ClusterRole>::all(client.clone())
        .get("cloudnet-webhook")
        .await
        .unwrap();
    for rule in role.rules.unwrap() {
        let resources = rule.resources.unwrap();
        match resources[0].as_str() {
            "nodes" | "cloudprivateipconfigs" => {
                assert_eq!(rule.verbs, ["get", "list", "watch"]);
            }
            "egressrouters"
            | "network-attachment-definitions"
            | "egresspublicips"
            | "externalippools"
            | "egressgateways" => {
                assert_eq!(rule.verbs, ["list", "watch"]);
            }
            other => panic!("unexpected resource {other}"),
        }
        assert_eq!(resources.len(), 1);
    }

    let deployment = Api::<Deployment>::namespaced(client.clone(), "cloudnet")
        .get("cloudnet-webhook")
        .await
        .unwrap();
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    // Preferred anti-affinity: a required rule stalls a surge rollout on two nodes.
    let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
    assert!(
        anti.required_during_scheduling_ignored_during_execution
            .is_none()
    );
    assert!(
        anti.preferred_during_scheduling_ignored_during_execution
            .is_some()
    );
    let rolling = spec.strategy.unwrap().rolling_update.unwrap();
    assert_eq!(
        rolling.max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0))
    );
    let pre_stop = pod.containers[0]
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap();
    assert!(pre_stop.sleep.as_ref().unwrap().seconds >= 3);
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    let container = &pod.containers[0];
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert!(container.readiness_probe.is_some() && container.liveness_probe.is_some());
    let policy = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
        client.clone(),
        "cloudnet",
    )
    .get("cloudnet-webhook")
    .await
    .unwrap();
    let ingress = policy.spec.unwrap().ingress.unwrap();
    assert_eq!(ingress.len(), 1);
    let port = &ingress[0].ports.as_ref().unwrap()[0];
    assert_eq!(
        port.port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(9443))
    );
    Api::<PodDisruptionBudget>::namespaced(client, "cloudnet")
        .get("cloudnet-webhook")
        .await
        .unwrap();
}

/// Whether an RBAC rule grants a verb other than reading on EgressGateways themselves (their
/// `/status` is the reconciler's to write).
fn writes_gateways(rule: &serde_json::Value) -> bool {
    let listed = |field: &str, value: &str| {
        rule[field]
            .as_array()
            .is_some_and(|items| items.iter().any(|item| item == value || item == "*"))
    };
    let reads = ["get", "list", "watch"];
    let writes = rule["verbs"].as_array().is_some_and(|verbs| {
        verbs
            .iter()
            .any(|verb| !verb.as_str().is_some_and(|verb| reads.contains(&verb)))
    });
    listed("apiGroups", cloudnet_shared::gateway::GROUP)
        && listed("resources", "egressgateways")
        && writes
}

#[test]
fn no_shipped_role_writes_egressgateways() {
    let helm = cloudnet_e2e::harness::helm::Helm::locate().unwrap();
    let kubectl = cloudnet_e2e::harness::controlplane::locate_binaries().unwrap();
    let mut objects = helm
        .template(&[
            "reconciler.frontEnds.antrea.enabled=true",
            "reconciler.frontEnds.egressGateway.enabled=true",
            "nodeAgent.enabled=true",
        ])
        .unwrap();
    objects.extend(helm.template(&["openshift.enabled=true"]).unwrap());
    for dir in [
        "webhook",
        "gateways",
        "reconciler/overlays/aws",
        "node-agent",
    ] {
        let dir = cloudnet_e2e::crate_file(&format!("../manifests/{dir}"));
        let text = kubectl.kustomize(&dir).unwrap();
        objects.extend(cloudnet_e2e::harness::helm::parse_documents(&text).unwrap());
    }
    let roles: Vec<_> = objects
        .iter()
        .filter(|object| matches!(object["kind"].as_str(), Some("Role" | "ClusterRole")))
        .collect();
    assert!(roles.len() >= 3, "{roles:#?}");
    for role in roles {
        for rule in role["rules"].as_array().into_iter().flatten() {
            assert!(
                !writes_gateways(rule),
                "{} {} may write EgressGateways: {rule}",
                role["kind"],
                role["metadata"]["name"]
            );
        }
    }
}
