//! Neutron's port and subnet resources, and the handful of calls the provider makes.

use std::net::IpAddr;

use hyper::Method;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::client::{Answer, Session};
use crate::cloud::CloudError;

/// Ports one page of a network's list asks for (`limit`).
pub const PAGE: usize = 500;

/// `device_owner` of the reservation ports (upstream's value: existing clusters' ports match).
pub const RESERVATION_OWNER: &str = "OpenShiftEgressIP";

/// `device_id` of the reservation ports of `server`.
pub fn reservation_device(server: &str) -> String {
    format!("{RESERVATION_OWNER}_{server}")
}

/// `name` of the reservation port of `ip`.
pub fn reservation_name(ip: IpAddr) -> String {
    format!("egressip-{ip}")
}

/// A Neutron port, as far as the provider reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct Port {
    /// Port UUID.
    pub id: String,
    /// The network it is on.
    pub network_id: String,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// The server (or our reservation marker) it belongs to.
    #[serde(default)]
    pub device_id: String,
    /// `compute:<zone>` for a server's port, [`RESERVATION_OWNER`] for ours.
    #[serde(default)]
    pub device_owner: String,
    /// Its own addresses.
    #[serde(default)]
    pub fixed_ips: Vec<FixedIp>,
    /// The extra addresses it may send from.
    #[serde(default)]
    pub allowed_address_pairs: Vec<Pair>,
    /// Bumped by every change; `If-Match` guards updates with it.
    #[serde(default)]
    pub revision_number: u64,
    /// Creation time, to pick the first of several ports in a stable way.
    #[serde(default)]
    pub created_at: String,
}

/// One address of a port.
#[derive(Clone, Debug, Deserialize)]
pub struct FixedIp {
    /// The subnet it is from.
    pub subnet_id: String,
    /// The address.
    pub ip_address: String,
}

/// One allowed-address-pairs entry: an address or CIDR, and optionally a MAC.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Pair {
    /// An address or a CIDR.
    pub ip_address: String,
    /// A MAC other than the port's own, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
}

impl Pair {
    /// The single address this entry allows (a `/32` or `/128` counts as one), if it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        if let Ok(ip) = self.ip_address.parse::<IpAddr>() {
            return Some(ip);
        }
        let net = self.ip_address.parse::<IpNet>().ok()?;
        (net.prefix_len() == net.max_prefix_len()).then(|| net.addr())
    }
}

/// A subnet's id and CIDR.
#[derive(Clone, Debug, Deserialize)]
pub struct Subnet {
    /// Subnet UUID.
    pub id: String,
    /// Its CIDR.
    pub cidr: IpNet,
}

#[derive(Deserialize)]
struct PortOne {
    port: Port,
}

#[derive(Deserialize)]
struct PortList {
    ports: Vec<Port>,
    /// `next` (and `previous`) when the list was cut into pages.
    #[serde(default)]
    ports_links: Vec<Link>,
}

#[derive(Deserialize)]
struct Link {
    rel: String,
}

#[derive(Deserialize)]
struct SubnetOne {
    subnet: Subnet,
}

/// Percent-encodes a query value (Neutron's filters hold `=` and `:`).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The outcome of creating a reservation port.
#[derive(Debug)]
pub enum Created {
    /// The port was created.
    Reserved,
    /// The address is already allocated to another port.
    InUse(CloudError),
}

/// The Neutron calls, over an authenticated session.
#[derive(Debug)]
pub struct Neutron {
    /// The Keystone session that carries the calls.
    pub session: Session,
}

impl Neutron {
    /// Every port of the list `query` selects, page after page: Neutron cuts a list into pages
    /// when asked to (`limit`) and when the deployment caps every list (`pagination_max_limit`),
    /// and marks each page but the last with a `next` link. The next page is asked for as
    /// Neutron's API reference documents it, `marker=<last id seen>` on the same query (rather
    /// than by the link's URL, whose host is whatever Neutron believes it is reached as).
    async fn list(&self, what: &str, query: &str) -> Result<Vec<Port>, CloudError> {
        let mut ports = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let path = match &marker {
                None => format!("/ports?{query}"),
                Some(last) => format!("/ports?{query}&marker={}", encode(last)),
            };
            let answer = self
                .session
                .neutron(what, Method::GET, &path, &[], None)
                .await?;
            if !answer.ok() {
                return Err(answer.error(what));
            }
            let page = answer.json::<PortList>(what)?;
            let next = page.ports_links.iter().any(|l| l.rel == "next");
            let last = page.ports.last().map(|p| p.id.clone());
            ports.extend(page.ports);
            match last {
                Some(last) if next => {
                    if marker.as_ref() == Some(&last) {
                        return Err(CloudError::retryable(format!(
                            "{what}: Neutron answered the page after port {last} with that port \
                             again"
                        )));
                    }
                    marker = Some(last);
                }
                _ => return Ok(ports),
            }
        }
    }

    /// The ports whose `device_id` is `device`.
    pub async fn ports_of(&self, device: &str) -> Result<Vec<Port>, CloudError> {
        self.list(
            &format!("listing the ports of {device}"),
            &format!("device_id={}", encode(device)),
        )
        .await
    }

    /// The ports whose `device_id` is one of `devices`, in one list call (Neutron takes a
    /// filter repeated as "any of").
    pub async fn ports_of_many(&self, devices: &[&str]) -> Result<Vec<Port>, CloudError> {
        let query: Vec<String> = devices
            .iter()
            .map(|d| format!("device_id={}", encode(d)))
            .collect();
        self.list(
            &format!("listing the ports of {} servers", devices.len()),
            &query.join("&"),
        )
        .await
    }

    /// The ports on `network` whose `device_owner` is `owner`, [`PAGE`] a call.
    pub async fn ports_on(&self, network: &str, owner: &str) -> Result<Vec<Port>, CloudError> {
        self.list(
            &format!("listing the {owner} ports of network {network}"),
            &format!(
                "network_id={}&device_owner={}&limit={PAGE}",
                encode(network),
                encode(owner)
            ),
        )
        .await
    }

    /// The ports holding `ip` as a fixed address on `network`.
    pub async fn ports_with_ip(&self, network: &str, ip: IpAddr) -> Result<Vec<Port>, CloudError> {
        self.list(
            &format!("looking up the port of {ip}"),
            &format!(
                "network_id={}&fixed_ips={}",
                encode(network),
                encode(&format!("ip_address={ip}"))
            ),
        )
        .await
    }

    /// One port, read now.
    pub async fn port(&self, id: &str) -> Result<Port, CloudError> {
        let what = format!("reading port {id}");
        let answer = self
            .session
            .neutron(&what, Method::GET, &format!("/ports/{id}"), &[], None)
            .await?;
        if !answer.ok() {
            return Err(answer.error(&what));
        }
        Ok(answer.json::<PortOne>(&what)?.port)
    }

    /// One subnet.
    pub async fn subnet(&self, id: &str) -> Result<Subnet, CloudError> {
        let what = format!("reading subnet {id}");
        let answer = self
            .session
            .neutron(&what, Method::GET, &format!("/subnets/{id}"), &[], None)
            .await?;
        if !answer.ok() {
            return Err(answer.error(&what));
        }
        Ok(answer.json::<SubnetOne>(&what)?.subnet)
    }

    /// Creates `server`'s reservation port for `ip` in `subnet` of `network`.
    pub async fn create_reservation(
        &self,
        server: &str,
        network: &str,
        subnet: &str,
        ip: IpAddr,
    ) -> Result<Created, CloudError> {
        let what = format!("reserving {ip} (creating port {})", reservation_name(ip));
        let body = json!({ "port": {
            "network_id": network,
            "name": reservation_name(ip),
            "device_owner": RESERVATION_OWNER,
            "device_id": reservation_device(server),
            "fixed_ips": [{ "subnet_id": subnet, "ip_address": ip.to_string() }],
        }});
        let answer = self
            .session
            .neutron(&what, Method::POST, "/ports", &[], Some(&body))
            .await?;
        if answer.ok() {
            return Ok(Created::Reserved);
        }
        let error = answer.api_error();
        if answer.status == 409 && error.kind == "IpAddressAlreadyAllocated" {
            return Ok(Created::InUse(error.into_cloud(&what)));
        }
        Err(error.into_cloud(&what))
    }

    /// Sets `port`'s pairs to `pairs`, if its revision is still `revision`; the port as it is
    /// afterwards. A stale revision answers 412 (a retryable error).
    pub async fn set_pairs(
        &self,
        port: &str,
        revision: u64,
        pairs: &[Pair],
    ) -> Result<Port, CloudError> {
        let what = format!("updating the allowed-address-pairs of port {port}");
        self.update(
            &what,
            port,
            Some(revision),
            &json!({ "port": { "allowed_address_pairs": pairs } }),
        )
        .await
    }

    /// Points reservation port `port` at `server`.
    pub async fn set_device(&self, port: &str, server: &str) -> Result<Port, CloudError> {
        let what = format!("moving reservation port {port} to server {server}");
        self.update(
            &what,
            port,
            None,
            &json!({ "port": { "device_id": reservation_device(server) } }),
        )
        .await
    }

    /// `PUT` of `body` on `path` (after `/v2.0`), guarded by `If-Match: revision_number=<n>`
    /// when `revision` is given: a resource changed since answers 412.
    pub async fn put(
        &self,
        what: &str,
        path: &str,
        revision: Option<u64>,
        body: &Value,
    ) -> Result<Answer, CloudError> {
        let guard = revision.map(|r| format!("revision_number={r}"));
        let headers: Vec<(&str, &str)> = guard
            .as_deref()
            .map(|g| ("if-match", g))
            .into_iter()
            .collect();
        self.session
            .neutron(what, Method::PUT, path, &headers, Some(body))
            .await
    }

    async fn update(
        &self,
        what: &str,
        port: &str,
        revision: Option<u64>,
        body: &Value,
    ) -> Result<Port, CloudError> {
        let answer = self
            .put(what, &format!("/ports/{port}"), revision, body)
            .await?;
        if !answer.ok() {
            return Err(answer.error(what));
        }
        Ok(answer.json::<PortOne>(what)?.port)
    }

    /// Deletes `port`; one already gone is a success.
    pub async fn delete(&self, port: &str) -> Result<(), CloudError> {
        let what = format!("deleting reservation port {port}");
        let answer = self
            .session
            .neutron(&what, Method::DELETE, &format!("/ports/{port}"), &[], None)
            .await?;
        if answer.ok() || answer.status == 404 {
            Ok(())
        } else {
            Err(answer.error(&what))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_count_single_addresses_and_filters_are_encoded() {
        let pair = |s: &str| Pair {
            ip_address: s.into(),
            mac_address: None,
        };
        assert_eq!(
            pair("10.0.0.5").ip(),
            Some("10.0.0.5".parse().unwrap_or(IpAddr::from([0; 4])))
        );
        assert_eq!(pair("10.0.0.5/32").ip(), "10.0.0.5".parse().ok());
        assert_eq!(pair("fd00::5/128").ip(), "fd00::5".parse().ok());
        assert_eq!(pair("10.0.0.0/24").ip(), None);
        assert_eq!(encode("ip_address=fd00::5"), "ip_address%3Dfd00%3A%3A5");
        assert_eq!(
            serde_json::to_string(&pair("10.0.0.5")).ok().as_deref(),
            Some(r#"{"ip_address":"10.0.0.5"}"#)
        );
    }
}
