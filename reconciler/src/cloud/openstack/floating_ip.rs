//! Floating IPs that follow egress IPs (docs/public-ips.md, docs/clouds/openstack.md): the
//! floating IP sits on the egress IP's reservation port (the port holding the address in the
//! subnet's IPAM, [`super::neutron::RESERVATION_OWNER`]), with the egress IP as its fixed IP.
//! A move re-points that port at the new server (`device_id`) and keeps it, so the floating IP
//! stays where it is: only the first association is needed, and [`PublicIps::serves`] says so.
//!
//! The calls: `GET /v2.0/floatingips/{id}` (its port, fixed IP, tags and `port_details`, the
//! `fip-port-details` extension of Neutron's L3 plugin), `PUT` with `port_id` and
//! `fixed_ip_address` to associate, `PUT` with `port_id: null` guarded by
//! `If-Match: revision_number=<n>` to disassociate, so an association someone else made after
//! our read is never undone. They go through the provider's Keystone session like its port calls;
//! a policy refusal (403) names the Neutron policy rule to grant.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use cloudnet_shared::Platform;
use cloudnet_shared::public_ip::{MARKER_PLAIN, PublicId};
use hyper::Method;
use serde::Deserialize;
use serde_json::json;

use super::OpenStackProvider;
use super::client::Answer;
use super::neutron::{Port, RESERVATION_OWNER, reservation_device};
use crate::cloud::CloudError;
use crate::cloud::public_ip::{
    Association, PublicAddress, PublicIpError, PublicIps, require_marker,
};

/// How messages name the cloud.
const CLOUD: &str = "Neutron";
/// The policy rule of the read.
const GET_RULE: &str = "get_floatingip";
/// The policy rule of both updates.
const UPDATE_RULE: &str = "update_floatingip";

/// A floating IP, as far as this module reads it.
#[derive(Clone, Debug, Deserialize)]
struct FloatingIp {
    id: String,
    #[serde(default)]
    floating_ip_address: Option<String>,
    #[serde(default)]
    port_id: Option<String>,
    #[serde(default)]
    fixed_ip_address: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    revision_number: u64,
    /// The port it sits on (`fip-port-details`); absent on clouds without that extension.
    #[serde(default)]
    port_details: Option<PortDetails>,
}

#[derive(Clone, Debug, Deserialize)]
struct PortDetails {
    #[serde(default)]
    device_owner: String,
    #[serde(default)]
    device_id: String,
}

#[derive(Debug, Deserialize)]
struct FloatingIpOne {
    floatingip: FloatingIp,
}

/// Where each floating IP was last seen: the port it sat on and that port's owner, so that
/// [`PublicIps::serves`] can tell, without a call, a reservation port of ours from another port
/// with the same fixed IP (an overlapping network behind the same router).
#[derive(Debug, Default)]
pub(super) struct Placements(Mutex<HashMap<String, Placement>>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Placement {
    port: String,
    device_owner: String,
    device_id: String,
}

impl Placements {
    fn note(&self, fip: &FloatingIp) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match (&fip.port_id, &fip.port_details) {
            (Some(port), Some(details)) => {
                map.insert(
                    fip.id.clone(),
                    Placement {
                        port: port.clone(),
                        device_owner: details.device_owner.clone(),
                        device_id: details.device_id.clone(),
                    },
                );
            }
            _ => {
                map.remove(&fip.id);
            }
        }
    }

    fn get(&self, id: &str) -> Option<Placement> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }
}

/// The public-address error for a failed answer of the call `what` under policy `rule`: a
/// policy refusal names the rule, an unknown floating IP is not found, the rest keeps the
/// provider's classification.
fn refused(answer: &Answer, rule: &'static str, id: &str, what: &str) -> PublicIpError {
    match answer.status {
        403 => PublicIpError::MissingPermission {
            cloud: CLOUD,
            action: rule,
            permission: rule,
        },
        404 => PublicIpError::NotFound {
            cloud: CLOUD,
            id: id.to_owned(),
        },
        _ => PublicIpError::Cloud(answer.error(what)),
    }
}

impl FloatingIp {
    fn public_address(&self) -> PublicAddress {
        let association = self.port_id.as_ref().map(|port| Association {
            // Neutron has no association id: the port and the fixed IP undo exactly it.
            id: port.clone(),
            interface: port.clone(),
            private_ip: self
                .fixed_ip_address
                .as_deref()
                .and_then(|ip| ip.parse().ok()),
        });
        PublicAddress {
            id: self.id.clone(),
            address: self
                .floating_ip_address
                .as_deref()
                .and_then(|ip| ip.parse().ok()),
            marked: self.tags.iter().any(|t| t == MARKER_PLAIN),
            association,
        }
    }
}

impl OpenStackProvider {
    /// The floating IP `id`, read now and noted for [`PublicIps::serves`].
    async fn floating_ip(&self, id: &str) -> Result<FloatingIp, PublicIpError> {
        // Admission lets only UUIDs through; anything else never reaches a URL.
        if !matches!(PublicId::parse(id), Ok(PublicId::OpenStackFloatingIp(_))) {
            return Err(PublicIpError::NotFound {
                cloud: CLOUD,
                id: id.to_owned(),
            });
        }
        let what = format!("reading floating IP {id}");
        let answer = self
            .neutron
            .session
            .neutron(&what, Method::GET, &format!("/floatingips/{id}"), &[], None)
            .await?;
        if !answer.ok() {
            return Err(refused(&answer, GET_RULE, id, &what));
        }
        let fip = answer.json::<FloatingIpOne>(&what)?.floatingip;
        self.floating.note(&fip);
        Ok(fip)
    }

    /// `PUT /floatingips/{id}` with `body`, guarded by `revision` when given.
    async fn update_floating_ip(
        &self,
        id: &str,
        what: &str,
        revision: Option<u64>,
        body: &serde_json::Value,
    ) -> Result<FloatingIp, PublicIpError> {
        let answer = self
            .neutron
            .put(what, &format!("/floatingips/{id}"), revision, body)
            .await?;
        if !answer.ok() {
            return Err(refused(&answer, UPDATE_RULE, id, what));
        }
        let fip = answer.json::<FloatingIpOne>(what)?.floatingip;
        self.floating.note(&fip);
        Ok(fip)
    }

    /// The server and network of server port `interface`: remembered from the engine's reads,
    /// else read now.
    async fn server_of_port(&self, interface: &str) -> Result<(String, String), CloudError> {
        if let Some(known) = self.remembered_port(interface) {
            return Ok(known);
        }
        let port = self.neutron.port(interface).await?;
        Ok((port.device_id, port.network_id))
    }

    /// The reservation port of `ip` that names `server`: where the floating IP goes.
    async fn reservation_port(
        &self,
        server: &str,
        network: &str,
        ip: IpAddr,
    ) -> Result<Port, CloudError> {
        let ours = reservation_device(server);
        self.neutron
            .ports_with_ip(network, ip)
            .await?
            .into_iter()
            .find(|p| p.device_owner == RESERVATION_OWNER && p.device_id == ours)
            .ok_or_else(|| {
                // The engine reserves the IP before it allows it on the server; a move
                // re-points the reservation just before: soon there.
                CloudError::retryable(format!(
                    "{ip} has no reservation port of server {server} on network {network} yet"
                ))
            })
    }

    /// The server and network of server port `interface`, if the engine's reads remember it.
    fn remembered_port(&self, interface: &str) -> Option<(String, String)> {
        self.ports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(_, state)| state.port.id == interface)
            .map(|(server, state)| (server.clone(), state.port.network_id.clone()))
    }
}

#[async_trait]
impl PublicIps for OpenStackProvider {
    async fn public_address(&self, id: &str) -> Result<PublicAddress, PublicIpError> {
        Ok(self.floating_ip(id).await?.public_address())
    }

    async fn associate(
        &self,
        address: &PublicAddress,
        interface: &str,
        private_ip: IpAddr,
    ) -> Result<Association, PublicIpError> {
        require_marker(address, Platform::OpenStack)?;
        let (server, network) = self.server_of_port(interface).await?;
        let reservation = self.reservation_port(&server, &network, private_ip).await?;
        let made = Association {
            id: reservation.id.clone(),
            interface: reservation.id.clone(),
            private_ip: Some(private_ip),
        };
        if address.is_on(&reservation.id, private_ip) {
            return Ok(made);
        }
        let what = format!(
            "associating floating IP {} with {private_ip} (port {})",
            address.id, reservation.id
        );
        let body = json!({ "floatingip": {
            "port_id": reservation.id,
            "fixed_ip_address": private_ip.to_string(),
        }});
        // Unguarded: from wherever it is (an association left by hand included), it moves here.
        self.update_floating_ip(&address.id, &what, None, &body)
            .await?;
        Ok(made)
    }

    async fn disassociate(&self, id: &str, association: &Association) -> Result<(), PublicIpError> {
        let fip = match self.floating_ip(id).await {
            Ok(fip) => fip,
            // Gone with its association: nothing of ours is left on it.
            Err(PublicIpError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let ours = fip.port_id.as_deref() == Some(association.interface.as_str())
            && association.private_ip.is_none_or(|ip| {
                fip.fixed_ip_address.as_deref().and_then(|f| f.parse().ok()) == Some(ip)
            });
        if !ours {
            return Ok(());
        }
        let what = format!(
            "disassociating floating IP {id} from port {}",
            association.interface
        );
        // Guarded by the revision read: an association made since (412) is not ours to undo.
        self.update_floating_ip(
            id,
            &what,
            Some(fip.revision_number),
            &json!({ "floatingip": { "port_id": null } }),
        )
        .await?;
        Ok(())
    }

    /// On the private IP's reservation port of this VM's server: that port stays put across
    /// moves (the engine re-points its `device_id`), so nothing is to be done.
    fn serves(&self, address: &PublicAddress, interface: &str, private_ip: IpAddr) -> bool {
        let Some(association) = &address.association else {
            return false;
        };
        let Some(placement) = self.floating.get(&address.id) else {
            return false;
        };
        let Some((server, _)) = self.remembered_port(interface) else {
            return false;
        };
        association.private_ip == Some(private_ip)
            && placement.port == association.interface
            && placement.device_owner == RESERVATION_OWNER
            && placement.device_id == reservation_device(&server)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_floating_ip_reads_with_its_port_fixed_ip_and_marker() {
        let fip: FloatingIpOne = serde_json::from_str(
            r#"{"floatingip": {"id": "f", "floating_ip_address": "203.0.113.5",
                "port_id": "p", "fixed_ip_address": "10.0.0.40", "revision_number": 3,
                "tags": ["other", "cloudnet-egress-public-ip"],
                "port_details": {"device_owner": "OpenShiftEgressIP", "device_id": "OpenShiftEgressIP_s"}}}"#,
        )
        .unwrap();
        let read = fip.floatingip.public_address();
        assert!(read.marked);
        assert_eq!(read.address, "203.0.113.5".parse().ok());
        assert!(read.is_on("p", "10.0.0.40".parse().unwrap()));

        let bare: FloatingIpOne =
            serde_json::from_str(r#"{"floatingip": {"id": "f", "port_id": null, "tags": []}}"#)
                .unwrap();
        let read = bare.floatingip.public_address();
        assert!(!read.marked);
        assert_eq!(read.association, None);
    }

    #[test]
    fn placements_follow_the_last_read() {
        let placements = Placements::default();
        let mut fip = FloatingIp {
            id: "f".into(),
            floating_ip_address: None,
            port_id: Some("p".into()),
            fixed_ip_address: Some("10.0.0.40".into()),
            tags: Vec::new(),
            revision_number: 1,
            port_details: Some(PortDetails {
                device_owner: RESERVATION_OWNER.into(),
                device_id: reservation_device("s"),
            }),
        };
        placements.note(&fip);
        assert_eq!(placements.get("f").map(|p| p.port), Some("p".into()));
        fip.port_id = None;
        fip.port_details = None;
        placements.note(&fip);
        assert_eq!(placements.get("f"), None);
    }
}
