#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Antrea's Egress on every cloud, one story each cloud's file tells on its own system: the
//! Antrea front end (run in this process, the code the reconciler runs with `--front-end
//! antrea`) over the shared control plane, the shipped reconciler attaching in that cloud's fake
//! or real part, and Antrea's writers played by the harness (`harness::e2e::antrea`, as
//! `../shared/docs/antrea-egress.md` records them). The cloud's own view of each node's
//! interface is read after every step.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cloudnet_e2e::harness::e2e::{antrea, plugin, wait};
use cloudnet_reconciler::metrics::Metrics;
use cloudnet_shared::antrea::Egress;
use cloudnet_shared::encode_name;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::events::Reporter;
use kube::{Api, Client};

/// A failure bound for one step on a loaded machine, not a speed measure (`make bench-antrea`
/// measures that).
const STEP: Duration = Duration::from_secs(90);

/// Installs Antrea's CRDs and starts the front end, which runs until the test's runtime ends.
/// One per system at a time: it plans for every opted-in pool there, as the leader does.
pub async fn start_front_end(client: &Client) {
    antrea::install_crds(client).await.unwrap();
    let reporter = Reporter {
        controller: "cloudnet-reconciler".into(),
        instance: Some("e2e".into()),
    };
    tokio::spawn(cloudnet_reconciler::frontend::antrea::run(
        client.clone(),
        reporter,
        Arc::new(Metrics::default()),
        std::future::pending(),
    ));
}

/// Egress `<prefix>-web` of pool `<prefix>` (holding `ip` alone) follows Antrea from `nodes[0]`
/// to `nodes[1]` and leaves the cloud with the Egress; `on(node)` reads the addresses the
/// cloud shows on that node's interface.
pub async fn an_egress_ip_follows_antrea<F, Fut>(
    client: &Client,
    prefix: &str,
    ip: IpAddr,
    [from, to]: [&str; 2],
    on: F,
) where
    F: Fn(&str) -> Fut,
    Fut: Future<Output = BTreeSet<IpAddr>>,
{
    let (pool, egress, text) = (prefix.to_owned(), format!("{prefix}-web"), ip.to_string());
    let cidr = format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 });
    antrea::create_pool(client, &pool, &cidr, true)
        .await
        .unwrap();
    antrea::create_egress(client, &egress, &pool).await.unwrap();
    antrea::allocate(client, &egress, &text).await.unwrap();

    let shown = |node: &str| {
        let on = &on;
        let node = node.to_owned();
        async move { on(&node).await.contains(&ip) }
    };
    antrea::agent_writes(client, &egress, from, &text)
        .await
        .unwrap();
    wait::until(STEP, &format!("{ip} on {from}'s interface"), || async {
        Ok(shown(from).await)
    })
    .await
    .unwrap();
    plugin::wait_assigned(client, &encode_name(ip).unwrap(), from)
        .await
        .unwrap();

    // Antrea's failover: the new holder writes its own name over the old one.
    antrea::agent_writes(client, &egress, to, &text)
        .await
        .unwrap();
    wait::until(STEP, &format!("{ip} moved to {to}'s interface"), || async {
        Ok(shown(to).await && !shown(from).await)
    })
    .await
    .unwrap();

    // The Egress deleted: the object goes and the cloud lets go of the address.
    Api::<Egress>::all(client.clone())
        .delete(&egress, &DeleteParams::default())
        .await
        .unwrap();
    let objects = plugin::objects(client);
    let name = encode_name(ip).unwrap();
    wait::until(
        STEP,
        &format!("{ip} gone from the cloud and the API"),
        || async { Ok(!shown(to).await && objects.get_opt(&name).await?.is_none()) },
    )
    .await
    .unwrap();
}

/// Egress `<prefix>-full` of pool `<prefix>-full` (holding `ip` alone), placed by Antrea on
/// `node`, whose interface has no room left: the cloud is not called for it, `on(node)` never
/// shows it, and the Egress carries a `CapacityReached` warning saying why.
pub async fn a_full_node_is_told_on_the_egress<F, Fut>(
    client: &Client,
    prefix: &str,
    ip: IpAddr,
    node: &str,
    on: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = BTreeSet<IpAddr>>,
{
    plugin::wait_annotation(client, node).await.unwrap();
    let (name, text) = (format!("{prefix}-full"), ip.to_string());
    let cidr = format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 });
    antrea::create_pool(client, &name, &cidr, true)
        .await
        .unwrap();
    antrea::egress_held_on(client, &name, &name, &text, node)
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let note = wait::found(
        STEP,
        &format!("CapacityReached on Egress {name}"),
        || async {
            let found = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                        && e.reason.as_deref() == Some("CapacityReached")
                });
            Ok(found.map(|e| (e.type_, e.note)))
        },
    )
    .await
    .unwrap();
    assert_eq!(note.0.as_deref(), Some("Warning"));
    let note = note.1.unwrap_or_default();
    assert!(
        note.starts_with(&format!("egress IP {ip}: ")) && note.contains("capacity"),
        "{note}"
    );
    assert!(!on().await.contains(&ip), "{ip} attached to a full node");
    Api::<Egress>::all(client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}
