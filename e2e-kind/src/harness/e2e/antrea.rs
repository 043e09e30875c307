//! Antrea's part in the tests: its CRDs installed, and its two writers played exactly as
//! `../shared/docs/antrea-egress.md` records them, since neither antrea-controller nor the agent
//! can run here (their Go module is not served):
//! - antrea-controller allocates `spec.egressIP` from the pool with a merge patch of the object;
//! - the agent that holds the IP writes the whole status with a PUT of `/status` carrying the
//!   resourceVersion it read (retried on 409): `{egressNode, egressIP}` plus `IPAssigned`, or,
//!   when no node can take it, both empty and `IPAssigned False AssignmentError`.
//!
//! The CRDs are cloudnet's model of Antrea 2.x's `crd.antrea.io/v1beta1` (`cloudnet_shared::antrea`):
//! the same group, version, kinds, scope, status subresource and field names.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cloudnet_shared::antrea::{
    Egress, EgressCondition, EgressSpec, EgressStatus, ExternalIPPool, ExternalIPPoolSpec, IpRange,
    OPT_IN_LABEL, OPT_IN_VALUE,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use serde_json::json;

/// How long a CRD may take to be served on a loaded machine.
const SERVED_WITHIN: Duration = Duration::from_secs(60);

/// Installs the Egress and ExternalIPPool CRDs (unless there already) and waits until both
/// are served.
pub async fn install_crds(client: &Client) -> Result<()> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in [Egress::crd(), ExternalIPPool::crd()] {
        match crds.create(&PostParams::default(), &crd).await {
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            other => {
                other.with_context(|| format!("installing {:?}", crd.metadata.name))?;
            }
        }
    }
    let give_up = Instant::now() + SERVED_WITHIN;
    loop {
        let egresses = Api::<Egress>::all(client.clone())
            .list(&ListParams::default().limit(1))
            .await;
        let pools = Api::<ExternalIPPool>::all(client.clone())
            .list(&ListParams::default().limit(1))
            .await;
        if egresses.is_ok() && pools.is_ok() {
            return Ok(());
        }
        if Instant::now() > give_up {
            bail!("Antrea's CRDs are not served after {SERVED_WITHIN:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates ExternalIPPool `name` over `cidr`, opted in to cloudnet when `opted_in`.
pub async fn create_pool(client: &Client, name: &str, cidr: &str, opted_in: bool) -> Result<()> {
    let mut pool = ExternalIPPool::new(
        name,
        ExternalIPPoolSpec {
            ip_ranges: vec![IpRange {
                cidr: cidr.to_owned(),
                ..IpRange::default()
            }],
            ..ExternalIPPoolSpec::default()
        },
    );
    if opted_in {
        pool.metadata.labels = Some([(OPT_IN_LABEL.to_owned(), OPT_IN_VALUE.to_owned())].into());
    }
    Api::<ExternalIPPool>::all(client.clone())
        .create(&PostParams::default(), &pool)
        .await
        .with_context(|| format!("creating ExternalIPPool {name}"))?;
    Ok(())
}

/// Sets or removes the opt-in label of pool `name`.
pub async fn set_opt_in(client: &Client, name: &str, opted_in: bool) -> Result<()> {
    let value = opted_in.then_some(OPT_IN_VALUE);
    Api::<ExternalIPPool>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {OPT_IN_LABEL: value}}})),
        )
        .await
        .with_context(|| format!("labelling ExternalIPPool {name}"))?;
    Ok(())
}

/// Creates Egress `name` from `pool` (no IP yet: antrea-controller's to allocate).
pub async fn create_egress(client: &Client, name: &str, pool: &str) -> Result<()> {
    let egress = Egress::new(
        name,
        EgressSpec {
            external_ip_pool: pool.to_owned(),
            ..EgressSpec::default()
        },
    );
    Api::<Egress>::all(client.clone())
        .create(&PostParams::default(), &egress)
        .await
        .with_context(|| format!("creating Egress {name}"))?;
    Ok(())
}

/// Egress `name` of `pool` as Antrea brings one up: created, `ip` allocated by antrea-controller,
/// then held on `node` by its agent.
pub async fn egress_held_on(
    client: &Client,
    name: &str,
    pool: &str,
    ip: &str,
    node: &str,
) -> Result<()> {
    create_egress(client, name, pool).await?;
    allocate(client, name, ip).await?;
    agent_writes(client, name, node, ip).await?;
    Ok(())
}

/// antrea-controller's allocation: `spec.egressIP` set with a merge patch of the object.
pub async fn allocate(client: &Client, egress: &str, ip: &str) -> Result<()> {
    Api::<Egress>::all(client.clone())
        .patch(
            egress,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"egressIP": ip}})),
        )
        .await
        .with_context(|| format!("allocating {ip} to Egress {egress}"))?;
    Ok(())
}

/// The agent's status write: the IP held on `node` (empty: no node can take it), as a PUT of
/// the whole status with the resourceVersion read, retried on 409 as the agent retries. Returns
/// when the PUT that took was sent: the change is in the API no earlier.
pub async fn agent_writes(
    client: &Client,
    egress: &str,
    node: &str,
    ip: &str,
) -> Result<std::time::Instant> {
    let api = Api::<Egress>::all(client.clone());
    let condition = if node.is_empty() {
        EgressCondition {
            type_: "IPAssigned".into(),
            status: "False".into(),
            reason: "AssignmentError".into(),
            message: "Failed to assign the IP to EgressNode: no Node available".into(),
            last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        }
    } else {
        EgressCondition {
            type_: "IPAssigned".into(),
            status: "True".into(),
            reason: "Assigned".into(),
            message: "EgressIP is successfully assigned to EgressNode".into(),
            last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        }
    };
    for _ in 0..10 {
        let mut current = api.get_status(egress).await?;
        let mut conditions = current.status.take().unwrap_or_default().conditions;
        conditions.retain(|c| c.type_ != "IPAssigned");
        conditions.insert(0, condition.clone());
        current.status = Some(EgressStatus {
            egress_node: node.to_owned(),
            egress_ip: if node.is_empty() {
                String::new()
            } else {
                ip.to_owned()
            },
            conditions,
        });
        let sent = std::time::Instant::now();
        match api
            .replace_status(egress, &PostParams::default(), &current)
            .await
        {
            Ok(_) => return Ok(sent),
            Err(kube::Error::Api(status)) if status.is_conflict() => continue,
            Err(e) => return Err(e).context("the agent's status write"),
        }
    }
    bail!("the agent's status write of Egress {egress} met a conflict ten times")
}
