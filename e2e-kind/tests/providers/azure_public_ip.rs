#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Azure public IPs that follow an egress IP (docs/clouds/azure.md), the Azure provider against
//! the ARM fake (public IP resources; `publicIPAddress` on ip-configurations checked against the
//! published schema, held by one configuration at a time, joined with
//! `publicIPAddresses/join/action`): bound on the egress IP's ip-configuration, after a move bound
//! on the other NIC's, the edits waiting on one NIC in one PUT (a refused one split out),
//! undone only where we set it, moved off a configuration someone else put it
//! on, never over an update made between our read and our write, never without the marker; a
//! refused permission is named; ids ARM writes with another case of the resource group are the
//! same ids. Each test starts its own fake.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::aws_elastic_ip::refused_unmarked;
use super::azure_provider::{RG, SUB, secret, settings};
use cloudnet_e2e::fakes::arm::{ArmConfig, ArmFake, CREDENTIALS_REQUEST, VmIds, configs};
use cloudnet_e2e::fakes::faultproxy::{Dialect, FaultProxy, RouteMatch};
use cloudnet_reconciler::cloud::azure::{AzureProvider, Environment};
use cloudnet_reconciler::cloud::public_ip::{PublicIpError, PublicIps};
use cloudnet_reconciler::cloud::{CloudProvider, CloudProviderExt, ErrorKind, NodeTarget};
use cloudnet_shared::public_ip::{AssociatedReason, MARKER_PLAIN, MARKER_VALUE};
use serde_json::{Value, json};

const READ: &str = "Microsoft.Network/publicIPAddresses/read";
const JOIN: &str = "Microsoft.Network/publicIPAddresses/join/action";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// OpenShift's grant plus `extra`.
fn granted(extra: &[&str]) -> ArmConfig {
    ArmConfig {
        permissions: Some(
            CREDENTIALS_REQUEST
                .iter()
                .chain(extra)
                .map(|p| (*p).to_owned())
                .collect(),
        ),
        ..ArmConfig::default()
    }
}

/// Two VMs in one subnet, the egress IP attached to the first by the engine's provider, which
/// reaches ARM through a proxy (to hold a request when a test needs it).
struct World {
    fake: ArmFake,
    proxy: FaultProxy,
    provider: AzureProvider,
    vms: Vec<VmIds>,
    nodes: Vec<NodeTarget>,
    /// Each VM's interface as the engine sees it (the NIC's name).
    interfaces: Vec<String>,
    egress_ip: IpAddr,
}

async fn world(config: ArmConfig) -> World {
    world_echoing(config, false).await
}

/// [`world`], ARM writing its references to other resources with another case of the resource
/// group from the start when `other_case` ([`ArmFake::echo_ids_in_other_case`]).
async fn world_echoing(config: ArmConfig, other_case: bool) -> World {
    let fake = ArmFake::start(config).await.unwrap();
    fake.echo_ids_in_other_case(other_case);
    let subnet = fake
        .add_subnet(SUB, "net-rg", "vnet", "workers", &["10.0.0.0/16"])
        .unwrap();
    let proxy = FaultProxy::builder(fake.url(), Dialect::Arm)
        .start()
        .await
        .unwrap();
    let mut s = settings(fake.url(), secret());
    s.environment = Environment {
        // Tokens are the fake's, for its own URL; Resource Manager is reached through the proxy.
        token_audience: fake.url().to_owned(),
        ..Environment::at(proxy.url(), fake.url()).unwrap()
    };
    let provider = AzureProvider::new(&s).unwrap();
    let (mut vms, mut nodes, mut interfaces) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..2u8 {
        let name = format!("worker-{i}");
        let vm = fake.add_vm(SUB, RG, &name, &subnet, ip(&format!("10.0.0.{}", 4 + i)));
        let node = provider.resolve(&name, &vm.provider_id).await.unwrap();
        interfaces.push(provider.egress_config(&node).await.unwrap().interface);
        vms.push(vm);
        nodes.push(node);
    }
    let egress_ip = ip("10.0.1.20");
    provider.attach(&nodes[0], &[egress_ip]).await.unwrap();
    World {
        fake,
        proxy,
        provider,
        vms,
        nodes,
        interfaces,
        egress_ip,
    }
}

impl World {
    fn public_ip(&self, name: &str, tags: &[(&str, &str)]) -> String {
        self.fake
            .add_public_ip(SUB, RG, name, ip("198.51.100.10"), tags)
    }

    fn puts(&self) -> u64 {
        self.fake.counts().get("PUT nic").copied().unwrap_or(0)
    }

    /// The public IP ids on VM `vm`'s NIC, by configuration name.
    fn public_ips_on(&self, vm: usize) -> Vec<(String, String)> {
        let doc = self.fake.nic(&self.vms[vm].nic).unwrap();
        configs(&doc)
            .iter()
            .filter_map(|c| {
                let public = c["properties"]["publicIPAddress"]["id"].as_str()?;
                Some((c["name"].as_str()?.to_owned(), public.to_owned()))
            })
            .collect()
    }

    /// Someone else's edit of the configuration `config` of VM `vm`'s NIC.
    fn edit_config(&self, vm: usize, config: &str, edit: impl Fn(&mut Value)) {
        self.fake.edit_nic(&self.vms[vm].nic, |doc| {
            for c in doc["properties"]["ipConfigurations"]
                .as_array_mut()
                .unwrap()
            {
                if c["name"] == config {
                    edit(&mut c["properties"]);
                }
            }
        });
    }

    /// Every NIC PUT carried `If-Match` and matched the published schema.
    fn assert_clean(&self) {
        assert!(self.fake.if_match_seen().iter().all(Option::is_some));
        assert_eq!(self.fake.schema_violations(), Vec::<String>::new());
    }
}

#[tokio::test]
async fn a_marked_public_ip_goes_on_the_egress_ips_configuration_follows_a_move_and_is_kept_when_undone()
 {
    let w = world(granted(&[READ, JOIN])).await;
    let id = w.public_ip("egress-a", &[(MARKER_PLAIN, MARKER_VALUE), ("team", "a")]);
    let read = w.provider.public_address(&id).await.unwrap();
    assert!(read.id.eq_ignore_ascii_case(&id));
    assert!(read.marked);
    assert_eq!(read.address, Some(ip("198.51.100.10")));
    assert_eq!(read.association, None);
    assert!(!w.provider.serves(&read, &w.interfaces[0], w.egress_ip));

    // Bind: on the ip-configuration holding the egress IP, in one guarded PUT.
    let puts = w.puts();
    let made = w
        .provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap();
    assert_eq!(w.puts(), puts + 1);
    assert!(
        made.id.ends_with("/ipConfigurations/worker-0_10.0.1.20"),
        "{made:?}"
    );
    assert_eq!(
        w.fake.public_ip_config(&id).as_deref(),
        Some(made.id.as_str())
    );
    let read = w.provider.public_address(&id).await.unwrap();
    assert_eq!(read.association.as_ref(), Some(&made));
    assert!(w.provider.serves(&read, &w.interfaces[0], w.egress_ip));
    w.provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap();
    assert_eq!(w.puts(), puts + 1, "associating where it is costs no PUT");

    // Move, as the engine makes it on Azure: off the old NIC (the configuration goes, and the
    // public IP with it), onto the new one; then the public IP follows.
    w.provider
        .detach(&w.nodes[0], &[w.egress_ip])
        .await
        .unwrap();
    w.provider
        .attach(&w.nodes[1], &[w.egress_ip])
        .await
        .unwrap();
    let read = w.provider.public_address(&id).await.unwrap();
    assert_eq!(read.association, None);
    assert!(!w.provider.serves(&read, &w.interfaces[1], w.egress_ip));
    let followed = w
        .provider
        .associate(&read, &w.interfaces[1], w.egress_ip)
        .await
        .unwrap();
    assert_eq!(followed.interface, w.interfaces[1]);
    assert_eq!(
        w.public_ips_on(1),
        [("worker-1_10.0.1.20".to_owned(), id.clone())]
    );
    assert_eq!(w.public_ips_on(0), []);

    // The engine's next change of that NIC keeps the public IP where it is.
    w.provider
        .attach(&w.nodes[1], &[ip("10.0.1.21")])
        .await
        .unwrap();
    assert_eq!(w.public_ips_on(1).len(), 1);

    // Delete: taken off, the public IP itself kept.
    w.provider.disassociate(&id, &followed).await.unwrap();
    assert_eq!(w.public_ips_on(1), []);
    assert_eq!(w.fake.public_ip_config(&id), None);
    assert_eq!(
        w.fake.public_ip(&id).unwrap()["properties"]["ipAddress"],
        "198.51.100.10"
    );
    w.assert_clean();
}

#[tokio::test]
async fn a_public_ip_someone_else_moved_or_removed_is_taken_back_and_only_ours_is_undone() {
    let w = world(granted(&[READ, JOIN])).await;
    let id = w.public_ip("egress-b", &[(MARKER_PLAIN, MARKER_VALUE)]);
    let reference = json!({ "id": id });

    // Left on another NIC's configuration: taken off there first (Azure refuses it on two).
    w.edit_config(1, "ipconfig1", |p| p["publicIPAddress"] = reference.clone());
    let read = w.provider.public_address(&id).await.unwrap();
    let there = read.association.clone().unwrap();
    assert_eq!(there.interface, w.interfaces[1]);
    assert_eq!(there.private_ip, Some(ip("10.0.0.5")));
    let made = w
        .provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap();
    assert_eq!(w.public_ips_on(1), []);
    assert_eq!(
        w.public_ips_on(0),
        [("worker-0_10.0.1.20".to_owned(), id.clone())]
    );

    // Drift: someone removes it; the read shows it, and associating puts it back.
    w.edit_config(0, "worker-0_10.0.1.20", |p| {
        p.as_object_mut().unwrap().remove("publicIPAddress");
    });
    let read = w.provider.public_address(&id).await.unwrap();
    assert_eq!(read.association, None);
    assert_eq!(
        w.provider
            .associate(&read, &w.interfaces[0], w.egress_ip)
            .await
            .unwrap(),
        made
    );
    assert_eq!(
        w.fake.public_ip_config(&id).as_deref(),
        Some(made.id.as_str())
    );

    // Someone moves it to their own configuration: undoing ours leaves theirs alone.
    w.edit_config(0, "worker-0_10.0.1.20", |p| {
        p.as_object_mut().unwrap().remove("publicIPAddress");
    });
    w.edit_config(1, "ipconfig1", |p| p["publicIPAddress"] = reference.clone());
    let puts = w.puts();
    w.provider.disassociate(&id, &made).await.unwrap();
    assert_eq!(w.puts(), puts, "no PUT for someone else's association");
    assert_eq!(w.public_ips_on(1), [("ipconfig1".to_owned(), id.clone())]);
    w.assert_clean();
}

#[tokio::test]
async fn a_nic_update_between_our_read_and_our_write_is_never_overwritten() {
    let w = world(granted(&[READ, JOIN])).await;
    let id = w.public_ip("egress-c", &[(MARKER_PLAIN, MARKER_VALUE)]);
    let read = w.provider.public_address(&id).await.unwrap();
    w.proxy.hold(RouteMatch::prefix("PUT "));
    let other_writer = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while w.proxy.held_now() == 0 {
            assert!(Instant::now() < deadline, "our PUT never reached the proxy");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The engine (or anyone) changes the NIC after our read.
        w.fake.edit_nic(&w.vms[0].nic, |doc| {
            let mut added = doc["properties"]["ipConfigurations"][0].clone();
            added["name"] = json!("other_10.0.1.99");
            added["properties"]["privateIPAddress"] = json!("10.0.1.99");
            added["properties"]["primary"] = json!(false);
            doc["properties"]["ipConfigurations"]
                .as_array_mut()
                .unwrap()
                .push(added);
        });
        w.proxy.release_held();
    };
    let (answer, ()) = tokio::join!(
        w.provider.associate(&read, &w.interfaces[0], w.egress_ip),
        other_writer
    );
    let error = answer.unwrap_err();
    assert!(
        matches!(
            &error,
            PublicIpError::Cloud(e) if e.kind == ErrorKind::Conflict
        ),
        "{error:?}"
    );
    assert!(error.is_transient(), "a 412 is tried again");
    assert_eq!(w.public_ips_on(0), []);
    assert!(
        w.fake
            .nic_addresses(&w.vms[0].nic)
            .contains(&ip("10.0.1.99"))
    );

    // Tried again: bound, and the other writer's configuration is still there.
    w.provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap();
    assert_eq!(w.public_ips_on(0).len(), 1);
    assert!(
        w.fake
            .nic_addresses(&w.vms[0].nic)
            .contains(&ip("10.0.1.99"))
    );
    w.assert_clean();
}

#[tokio::test]
async fn a_public_ip_without_the_marker_is_never_associated() {
    let w = world(granted(&[READ, JOIN])).await;
    let puts = w.puts();
    for (i, tags) in [
        &[][..],
        &[(MARKER_PLAIN, "false")][..],
        &[("cloudnet.io/egress-public-ip", MARKER_VALUE)][..],
    ]
    .into_iter()
    .enumerate()
    {
        let id = w.public_ip(&format!("unmarked-{i}"), tags);
        let read = w.provider.public_address(&id).await.unwrap();
        refused_unmarked(
            &w.provider,
            &read,
            &w.interfaces[0],
            w.egress_ip,
            "the tag cloudnet-egress-public-ip=true",
        )
        .await;
        assert_eq!(w.fake.public_ip_config(&id), None);
    }
    assert_eq!(w.puts(), puts, "refused before any PUT");
}

#[tokio::test]
async fn each_missing_permission_is_named_and_an_unknown_public_ip_is_not_found() {
    // Without the read.
    let w = world(granted(&[])).await;
    let id = w.public_ip("egress-d", &[(MARKER_PLAIN, MARKER_VALUE)]);
    let error = w.provider.public_address(&id).await.unwrap_err();
    assert_eq!(
        error,
        PublicIpError::MissingPermission {
            cloud: "Azure",
            action: "PublicIPAddresses_Get",
            permission: READ,
        }
    );
    assert!(
        error
            .to_string()
            .contains(&format!("lack the permission {READ}")),
        "{error}"
    );
    assert_eq!(error.reason(), AssociatedReason::PermissionDenied);

    // With the read, without the join: the NIC PUT is refused and nothing changes.
    let w = world(granted(&[READ])).await;
    let id = w.public_ip("egress-e", &[(MARKER_PLAIN, MARKER_VALUE)]);
    let read = w.provider.public_address(&id).await.unwrap();
    let error = w
        .provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            PublicIpError::MissingPermission {
                permission: JOIN,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(!error.is_transient());
    assert_eq!(w.public_ips_on(0), []);
    // The egress IPs themselves need none of this.
    w.provider
        .attach(&w.nodes[0], &[ip("10.0.1.22")])
        .await
        .unwrap();

    let unknown = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/publicIPAddresses/none"
    );
    for id in [unknown.as_str(), "/subscriptions/../publicIPAddresses/x"] {
        let error = w.provider.public_address(id).await.unwrap_err();
        assert!(matches!(error, PublicIpError::NotFound { .. }), "{error:?}");
        assert!(!error.is_transient());
    }
}

#[tokio::test]
async fn bindings_on_one_nic_share_one_put_and_a_refused_one_is_split_out_of_it() {
    let w = world(granted(&[READ, JOIN])).await;
    let privates = [w.egress_ip, ip("10.0.1.21"), ip("10.0.1.22")];
    w.provider
        .attach(&w.nodes[0], &privates[1..])
        .await
        .unwrap();
    let ids: Vec<String> = (0..3u8)
        .map(|i| {
            w.fake.add_public_ip(
                SUB,
                RG,
                &format!("shared-{i}"),
                ip(&format!("198.51.100.{}", 30 + i)),
                &[(MARKER_PLAIN, MARKER_VALUE)],
            )
        })
        .collect();
    let mut reads = Vec::new();
    for id in &ids {
        reads.push(w.provider.public_address(id).await.unwrap());
    }
    let nic = &w.interfaces[0];
    let associate_all = |reads: &[cloudnet_reconciler::cloud::public_ip::PublicAddress]| {
        let reads = reads.to_vec();
        let provider = &w.provider;
        async move {
            let (a, b, c) = tokio::join!(
                provider.associate(&reads[0], nic, privates[0]),
                provider.associate(&reads[1], nic, privates[1]),
                provider.associate(&reads[2], nic, privates[2]),
            );
            [a, b, c]
        }
    };

    // Three bindings whose egress IPs sit on one NIC, associated at once (a failover that moved
    // them together): one PUT carries all three.
    let puts = w.puts();
    let made = associate_all(&reads).await;
    assert_eq!(w.puts(), puts + 1, "one NIC PUT for the three: {made:?}");
    let made: Vec<_> = made.into_iter().map(Result::unwrap).collect();
    for (i, association) in made.iter().enumerate() {
        assert_eq!(
            w.fake.public_ip_config(&ids[i]).as_deref(),
            Some(association.id.as_str())
        );
        assert_eq!(association.private_ip, Some(privates[i]));
    }

    // Undone together too.
    let puts = w.puts();
    let (a, b, c) = tokio::join!(
        w.provider.disassociate(&ids[0], &made[0]),
        w.provider.disassociate(&ids[1], &made[1]),
        w.provider.disassociate(&ids[2], &made[2]),
    );
    a.unwrap();
    b.unwrap();
    c.unwrap();
    assert_eq!(w.puts(), puts + 1, "one NIC PUT takes the three off");
    assert_eq!(w.public_ips_on(0), []);

    // After our reads, someone puts the third public IP on the other NIC: ARM refuses the
    // shared PUT, and the edits are made again one by one, so only the third binding hears of
    // it and the other two are associated.
    let reference = json!({ "id": ids[2] });
    w.edit_config(1, "ipconfig1", |p| p["publicIPAddress"] = reference.clone());
    let puts = w.puts();
    let [a, b, c] = associate_all(&reads).await;
    assert_eq!(a.unwrap(), made[0]);
    assert_eq!(b.unwrap(), made[1]);
    let refused = c.unwrap_err();
    assert!(!refused.is_transient(), "{refused:?}");
    assert!(
        refused.to_string().contains("PublicIPAddressInUse"),
        "{refused}"
    );
    assert_eq!(
        w.puts(),
        puts + 4,
        "the refused PUT of three, then one PUT for each"
    );
    assert_eq!(w.public_ips_on(0).len(), 2);
    assert_eq!(
        w.public_ips_on(1),
        [("ipconfig1".to_owned(), ids[2].clone())]
    );
    w.assert_clean();
}

/// ARM writes the public IP's `ipConfiguration` (and the VM's NIC, the configuration's public
/// IP) with another case of the resource group than the NIC's own id. The association read back
/// is still the one recorded when it was made (the controller undoes only that one), still
/// serves the egress IP, and is undone by the recorded id as by the one read.
#[tokio::test]
async fn ids_arm_writes_in_another_case_are_read_served_and_undone_as_the_same_ids() {
    let w = world_echoing(granted(&[READ, JOIN]), true).await;
    let id = w.public_ip("egress-case", &[(MARKER_PLAIN, MARKER_VALUE)]);
    let read = w.provider.public_address(&id).await.unwrap();
    let made = w
        .provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap();
    let echoed = w.fake.public_ip_config(&id).unwrap();
    assert!(
        echoed != made.id && echoed.eq_ignore_ascii_case(&made.id),
        "the fake names the configuration in another case: {echoed} for {}",
        made.id
    );

    // Read back: the association recorded, byte for byte, and it serves the egress IP there.
    let read = w.provider.public_address(&id).await.unwrap();
    assert_eq!(read.association.as_ref(), Some(&made));
    assert!(w.provider.serves(&read, &w.interfaces[0], w.egress_ip));
    assert!(!w.provider.serves(&read, &w.interfaces[1], w.egress_ip));
    let puts = w.puts();
    assert_eq!(
        w.provider
            .associate(&read, &w.interfaces[0], w.egress_ip)
            .await
            .unwrap(),
        made
    );
    assert_eq!(w.puts(), puts, "already associated: no PUT");

    // Someone puts it on the other NIC: read there, taken off there (the NIC named in another
    // case) and put back on ours.
    w.edit_config(0, "worker-0_10.0.1.20", |p| {
        p.as_object_mut().unwrap().remove("publicIPAddress");
    });
    let reference = json!({ "id": id });
    w.edit_config(1, "ipconfig1", |p| p["publicIPAddress"] = reference.clone());
    let read = w.provider.public_address(&id).await.unwrap();
    let there = read.association.clone().unwrap();
    assert_eq!(
        (there.interface.as_str(), there.private_ip),
        (w.interfaces[1].as_str(), Some(ip("10.0.0.5")))
    );
    assert!(!w.provider.serves(&read, &w.interfaces[0], w.egress_ip));
    assert_eq!(
        w.provider
            .associate(&read, &w.interfaces[0], w.egress_ip)
            .await
            .unwrap(),
        made
    );
    assert_eq!(w.public_ips_on(1), []);

    // Undone by the association recorded, and (made again) by the one read.
    w.provider.disassociate(&id, &made).await.unwrap();
    assert_eq!(w.fake.public_ip_config(&id), None);
    let read = w.provider.public_address(&id).await.unwrap();
    let made = w
        .provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap();
    let read = w.provider.public_address(&id).await.unwrap();
    w.provider
        .disassociate(&read.id, read.association.as_ref().unwrap())
        .await
        .unwrap();
    assert_eq!(w.fake.public_ip_config(&id), None);
    assert_eq!(w.public_ips_on(0), []);
    assert!(made.id.ends_with("/ipConfigurations/worker-0_10.0.1.20"));
    w.assert_clean();
}

/// What a missing `publicIPAddresses/join/action` breaks once a public IP sits on a NIC: ARM
/// checks it on every PUT whose body carries a public IP, so the egress IPs' own changes of
/// that NIC that leave the public IP there are refused, naming the join; a PUT that leaves no
/// public IP passes (the binding's delete, its egress IP's move away), and the association on
/// the new NIC is the binding's `PermissionDenied` (docs/clouds/azure.md, docs/public-ips.md).
#[tokio::test]
async fn without_the_join_permission_a_nic_holding_a_public_ip_takes_only_puts_that_leave_none() {
    let w = world(granted(&[READ, JOIN])).await;
    let id = w.public_ip("egress-join", &[(MARKER_PLAIN, MARKER_VALUE)]);
    let (other, more) = (ip("10.0.1.21"), ip("10.0.1.22"));
    w.provider.attach(&w.nodes[0], &[other]).await.unwrap();
    let read = w.provider.public_address(&id).await.unwrap();
    let made = w
        .provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap();
    let names_join = |e: cloudnet_reconciler::cloud::CloudError| {
        assert!(e.message.contains(JOIN), "{e}");
        assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    };

    // Withdrawn: the engine's changes that leave the public IP on the NIC are refused.
    w.fake.revoke(&[JOIN]);
    names_join(w.provider.attach(&w.nodes[0], &[more]).await.unwrap_err());
    names_join(w.provider.detach(&w.nodes[0], &[other]).await.unwrap_err());
    let on = w.fake.nic_addresses(&w.vms[0].nic);
    assert!(on.contains(&other) && !on.contains(&more), "{on:?}");

    // The binding's delete leaves none: it passes, and with it the egress IPs' changes again.
    w.provider.disassociate(&id, &made).await.unwrap();
    assert_eq!(w.fake.public_ip_config(&id), None);
    w.provider.attach(&w.nodes[0], &[more]).await.unwrap();

    // So does a move of the bound egress IP away; the association on the new NIC is refused.
    w.fake.revoke(&[]);
    let read = w.provider.public_address(&id).await.unwrap();
    w.provider
        .associate(&read, &w.interfaces[0], w.egress_ip)
        .await
        .unwrap();
    w.fake.revoke(&[JOIN]);
    w.provider
        .detach(&w.nodes[0], &[w.egress_ip])
        .await
        .unwrap();
    assert_eq!(w.fake.public_ip_config(&id), None);
    w.provider
        .attach(&w.nodes[1], &[w.egress_ip])
        .await
        .unwrap();
    let read = w.provider.public_address(&id).await.unwrap();
    let refused = w
        .provider
        .associate(&read, &w.interfaces[1], w.egress_ip)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        PublicIpError::MissingPermission {
            cloud: "Azure",
            action: "NetworkInterfaces_CreateOrUpdate",
            permission: JOIN,
        }
    );
    assert_eq!(refused.reason(), AssociatedReason::PermissionDenied);
    assert_eq!(w.fake.public_ip_config(&id), None);
    w.provider
        .detach(&w.nodes[0], &[other, more])
        .await
        .unwrap();
    w.assert_clean();
}
