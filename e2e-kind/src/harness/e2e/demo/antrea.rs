//! The demo of the Antrea front end on EC2 (moto): the reconciler runs with
//! `--front-end antrea`; an opted-in ExternalIPPool and two Egresses, Antrea's controller and
//! agents played as the tests play them ([`crate::harness::e2e::antrea`]); the
//! CloudPrivateIPConfigs the front end keeps, their IPs on the right ENIs, an Elastic IP bound to
//! one Egress IP, and a failover moved in the cloud with the public address following.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cloudnet_shared::antrea::{OPT_IN_LABEL, OPT_IN_VALUE};
use cloudnet_shared::encode_name;

use super::aws::{host_v4, show_enis, workers};
use super::{kubectl, public, step};
use crate::harness::e2e::local::{self, NAMESPACE, RECONCILER_ACCOUNT};
use crate::harness::e2e::{Cluster, antrea, ec2, plugin};

/// The flag that turns the front end on.
pub(super) const FLAG: &str = "--front-end=antrea";
const POOL: &str = "egress-pool";
/// The two Egresses, the host part of each one's IP, and the node whose agent first holds it.
const EGRESSES: [(&str, u8, &str); 2] = [("web", 20, "worker-a"), ("db", 21, "worker-b")];
/// How long the front end may take to see the CRDs and permissions it started without.
const FRONT_END_WITHIN: Duration = Duration::from_secs(120);

/// The walk-through, then how to explore the running system.
pub(super) async fn show(cluster: &Cluster) -> Result<()> {
    let local = cluster.local().context("the demo runs locally")?;
    super::running(local, FLAG);
    let client = cluster.client().await?;
    let ec2 = cluster.ec2()?;

    step("install Antrea's CRDs (Egress, ExternalIPPool) and grant the front end its permissions");
    antrea::install_crds(&client).await?;
    local::apply_antrea_rbac(local.control_plane())?;
    println!(
        "manifests/reconciler/overlays/antrea/rbac.yaml applied: ClusterRole \
         cloudnet-reconciler-antrea bound to {NAMESPACE}/{RECONCILER_ACCOUNT} (list, watch \
         egresses and externalippools; create, delete cloudprivateipconfigs)"
    );
    let (network, instances) = workers(
        &client,
        &ec2,
        "a Node for each EC2 instance; the reconciler annotates them",
    )
    .await?;

    let cidr = format!("{}/28", host_v4(&network, 16));
    step(&format!(
        "an admin opts ExternalIPPool {POOL} ({cidr}) in: label {OPT_IN_LABEL}={OPT_IN_VALUE}"
    ));
    antrea::create_pool(&client, POOL, &cidr, true).await?;
    kubectl(cluster, &["get", "externalippools", "-L", OPT_IN_LABEL])?;

    step(
        "two Egresses of the pool; antrea-controller allocates their IPs, an agent on each chosen \
         node holds one (status.egressNode)",
    );
    for (name, host, node) in EGRESSES {
        let ip = host_v4(&network, host).to_string();
        antrea::egress_held_on(&client, name, POOL, &ip, node).await?;
    }
    show_egresses(cluster)?;
    for (_, host, node) in EGRESSES {
        let name = encode_name(host_v4(&network, host))?;
        plugin::wait_assigned_within(&client, &name, node, FRONT_END_WITHIN).await?;
    }
    println!("\nthe front end keeps a CloudPrivateIPConfig of each Egress IP on its node:");
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_enis(&ec2, &instances).await?;

    let (web, web_host, _) = EGRESSES[0];
    let web_ip = host_v4(&network, web_host);
    step(&format!(
        "an admin binds a public address to Egress {web}'s IP {web_ip} (EgressPublicIP; the \
         reconciler looks for its CRD every 30 s)"
    ));
    let eip = public::bind(&client, &ec2, &web_ip.to_string()).await?;
    public::wait_associated(&client, "worker-a").await?;
    kubectl(cluster, &["get", "egresspublicips", "-o", "wide"])?;
    public::show_address(&ec2, &eip).await?;

    step(&format!(
        "worker-a fails: Antrea fails Egress {web} over to worker-c (its agent writes the status)"
    ));
    let started = Instant::now();
    antrea::agent_writes(&client, web, "worker-c", &web_ip.to_string()).await?;
    let in_cloud = wait_on_eni(&ec2, &instances[2].eni, web_ip).await?;
    println!(
        "{web_ip} on worker-c's ENI {} in EC2 {:.2} s after the agent's status write",
        instances[2].eni,
        in_cloud.duration_since(started).as_secs_f64()
    );
    plugin::wait_assigned(&client, &encode_name(web_ip)?, "worker-c").await?;
    public::wait_associated(&client, "worker-c").await?;
    println!(
        "its public address associated on worker-c {:.2} s after the status write",
        started.elapsed().as_secs_f64()
    );
    show_egresses(cluster)?;
    kubectl(cluster, &["get", "cloudprivateipconfigs"])?;
    show_enis(&ec2, &instances).await?;
    kubectl(cluster, &["get", "egresspublicips", "-o", "wide"])?;
    public::show_address(&ec2, &eip).await?;

    super::explore(
        local,
        "egresses,externalippools,cloudprivateipconfigs,egresspublicips -o yaml",
        &super::ec2_hint(local),
        "cloudnet_front_end_writes_total",
    )?;
    Ok(())
}

fn show_egresses(cluster: &Cluster) -> Result<()> {
    kubectl(
        cluster,
        &[
            "get",
            "egresses",
            "-o",
            "custom-columns=NAME:.metadata.name,POOL:.spec.externalIPPool,EGRESS IP:.status.egressIP,EGRESS NODE:.status.egressNode,IP ASSIGNED:.status.conditions[?(@.type==\"IPAssigned\")].status",
        ],
    )
}

/// Polls EC2 (straight to moto, every 20 ms) until `eni` holds `ip`; returns when it was seen.
async fn wait_on_eni(ec2: &aws_sdk_ec2::Client, eni: &str, ip: IpAddr) -> Result<Instant> {
    let give_up = Instant::now() + FRONT_END_WITHIN;
    loop {
        if ec2::addresses_of(ec2, eni).await?.contains(&ip) {
            return Ok(Instant::now());
        }
        if Instant::now() > give_up {
            bail!("{ip} not on {eni} after {FRONT_END_WITHIN:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
