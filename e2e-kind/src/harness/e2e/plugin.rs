//! What a network plugin does through the Kubernetes API: register nodes for cloud VMs, and
//! create, move and delete CloudPrivateIPConfig objects; plus waits on what the system answers.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cloudnet_shared::annotation::{self, EgressIpConfig};
use cloudnet_shared::{
    CloudPrivateIPConfig, CloudPrivateIPConfigSpec, EGRESS_IPCONFIG_ANNOTATION, FINALIZER,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::ec2::Instance;
use super::wait;

/// How long the system may take to answer one step. A bound for a failure, not a measure of
/// speed: on a new 2-core machine under load one OpenStack step (Neutron serves a suite from one
/// sqlite thread) took over 60 s, and a move over 120 s at load 12 (Neutron leaving reads
/// unanswered for the provider's 20 s, several times over).
pub const STEP: Duration = Duration::from_secs(300);

/// The objects API.
pub fn objects(client: &Client) -> Api<CloudPrivateIPConfig> {
    Api::all(client.clone())
}

/// Registers Node `name` for the EC2 `instance`; see [`register_node`].
pub async fn create_node(client: &Client, name: &str, instance: &Instance) -> Result<()> {
    register_node(client, name, &instance.provider_id(), instance.primary_ipv4).await
}

/// Registers Node `name` for a VM as the kubelet and cloud provider would: `provider_id` in the
/// spec, the VM's own address as InternalIP through the status subresource.
pub async fn register_node(
    client: &Client,
    name: &str,
    provider_id: &str,
    address: IpAddr,
) -> Result<()> {
    let nodes = Api::<Node>::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.into()),
            ..NodeSpec::default()
        }),
        ..Node::default()
    };
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating node {name}"))?;
    let addresses = json!([{"type": "InternalIP", "address": address.to_string()}]);
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"addresses": addresses}})),
        )
        .await
        .with_context(|| format!("writing the addresses of node {name}"))?;
    Ok(())
}

/// Creates object `ip` aimed at `node`; the raw result, so denials can be inspected.
pub async fn create(
    client: &Client,
    ip: &str,
    node: &str,
) -> Result<CloudPrivateIPConfig, kube::Error> {
    let obj = CloudPrivateIPConfig::new(ip, CloudPrivateIPConfigSpec { node: node.into() });
    objects(client).create(&PostParams::default(), &obj).await
}

/// Points object `ip` at `node`.
pub async fn retarget(client: &Client, ip: &str, node: &str) -> Result<()> {
    objects(client)
        .patch(
            ip,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": node}})),
        )
        .await
        .with_context(|| format!("moving {ip} to {node}"))?;
    Ok(())
}

/// Writes on object `ip` the instance annotation earlier versions of the reconciler trusted,
/// naming `instance` for `node`: a metadata-only update, which the webhook never reviews, open to
/// anyone who may edit the objects.
pub async fn forge_instance(client: &Client, ip: &str, node: &str, instance: &str) -> Result<()> {
    let forged = json!({ "metadata": { "annotations": {
        "cloudnet.io/instance": format!("{node}={instance}"),
    } } });
    objects(client)
        .patch(ip, &PatchParams::default(), &Patch::Merge(forged))
        .await
        .with_context(|| format!("annotating {ip}"))?;
    Ok(())
}

/// Issue 28's forgery, whole: creates object `ip` on `node`, waits until it is assigned, forges
/// its instance annotation to name `instance` ([`forge_instance`]), deletes it and waits until
/// it is gone.
pub async fn delete_with_forged_instance(
    client: &Client,
    ip: &str,
    node: &str,
    instance: &str,
) -> Result<()> {
    create(client, ip, node).await?;
    wait_assigned(client, ip, node).await?;
    forge_instance(client, ip, node, instance).await?;
    delete(client, ip).await?;
    wait_gone(client, ip).await
}

/// Makes object `ip` look as the upstream controller leaves an assigned one: our finalizer on,
/// `status.node` naming `node` with `Assigned=True`, and nothing in this controller's ledger.
pub async fn shape_as_upstream(client: &Client, ip: &str, node: &str) -> Result<()> {
    let api = objects(client);
    let params = PatchParams::default();
    let finalizers = json!({ "metadata": { "finalizers": [FINALIZER] } });
    api.patch(ip, &params, &Patch::Merge(finalizers))
        .await
        .with_context(|| format!("adding the finalizer to {ip}"))?;
    let condition = json!({
        "type": "Assigned",
        "status": "True",
        "reason": "CloudResponseSuccess",
        "message": "attached by the upstream controller",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
    });
    let status = json!({ "status": { "node": node, "conditions": [condition] } });
    api.patch_status(ip, &params, &Patch::Merge(status))
        .await
        .with_context(|| format!("writing the status of {ip}"))?;
    Ok(())
}

/// Deletes object `ip`.
pub async fn delete(client: &Client, ip: &str) -> Result<()> {
    objects(client)
        .delete(ip, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting {ip}"))?;
    Ok(())
}

/// Waits for the reconciler's egress annotation on `node` and returns it decoded.
pub async fn wait_annotation(client: &Client, node: &str) -> Result<Vec<EgressIpConfig>> {
    let nodes = Api::<Node>::all(client.clone());
    wait::found(STEP, &format!("the egress annotation of {node}"), || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(node).await?;
            let value = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(EGRESS_IPCONFIG_ANNOTATION));
            Ok(match value {
                Some(value) => Some(annotation::decode(value)?),
                None => None,
            })
        }
    })
    .await
}

/// Waits until object `ip` is `Assigned=True` on `node` (spec and status agree) and carries the
/// finalizer.
pub async fn wait_assigned(client: &Client, ip: &str, node: &str) -> Result<()> {
    wait_assigned_within(client, ip, node, STEP).await
}

/// [`wait_assigned`] with its own deadline.
pub async fn wait_assigned_within(
    client: &Client,
    ip: &str,
    node: &str,
    timeout: Duration,
) -> Result<()> {
    let api = objects(client);
    wait::until(timeout, &format!("{ip} Assigned=True on {node}"), || {
        let api = api.clone();
        async move {
            let Some(obj) = api.get_opt(ip).await? else {
                bail!("{ip} disappeared");
            };
            Ok(obj.is_assigned()
                && obj.spec.node == node
                && obj.status_node() == Some(node)
                && has_finalizer(&obj))
        }
    })
    .await
}

/// Waits until object `ip` no longer exists (its finalizer was removed).
pub async fn wait_gone(client: &Client, ip: &str) -> Result<()> {
    let api = objects(client);
    wait::until(STEP, &format!("{ip} to be gone"), || {
        let api = api.clone();
        async move { Ok(api.get_opt(ip).await?.is_none()) }
    })
    .await
}

/// Whether the reconciler's finalizer is on `obj`.
pub fn has_finalizer(obj: &CloudPrivateIPConfig) -> bool {
    obj.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// The message of a request refused by an admission webhook; an error for anything else.
pub fn webhook_denial<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Result<String> {
    match result {
        Err(kube::Error::Api(status)) if status.message.contains("denied the request") => {
            Ok(status.message.to_string())
        }
        other => bail!("expected a webhook denial, got {other:?}"),
    }
}
