//! Which `EgressGateway` claims which egress IP, for the claim rules (`gateway.rs`): one hash
//! lookup per IP, whatever the number of gateways.
//!
//! Indexed by the parsed IP, so any spelling of one address is one key; a spelling that does not
//! parse (stored before the webhook checked it) claims nothing, as the reconciler cannot attach
//! it either.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

/// The gateways' egress IPs, by gateway and by IP.
#[derive(Clone, Debug, Default)]
pub struct GatewayIndex {
    /// Gateway name → its IPs, to unindex it when it changes or goes.
    by_name: HashMap<String, Vec<IpAddr>>,
    /// A set, so that two gateways briefly claiming one IP (written while no webhook ran) cannot
    /// make the index forget the survivor when one goes.
    by_ip: HashMap<IpAddr, BTreeSet<String>>,
}

impl GatewayIndex {
    /// Records gateway `name` with the egress IPs `ips` (as written), replacing what it held.
    pub fn upsert<'a>(&mut self, name: &str, ips: impl IntoIterator<Item = &'a str>) {
        self.remove(name);
        let mut parsed: Vec<IpAddr> = ips
            .into_iter()
            .filter_map(|text| text.parse().ok())
            .collect();
        parsed.sort_unstable();
        parsed.dedup();
        for ip in &parsed {
            self.by_ip.entry(*ip).or_default().insert(name.to_owned());
        }
        self.by_name.insert(name.to_owned(), parsed);
    }

    /// Forgets gateway `name`.
    pub fn remove(&mut self, name: &str) {
        let Some(ips) = self.by_name.remove(name) else {
            return;
        };
        for ip in ips {
            if let Some(names) = self.by_ip.get_mut(&ip) {
                names.remove(name);
                if names.is_empty() {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }

    /// A gateway claiming `ip` (the first by name), if any.
    pub fn claiming(&self, ip: IpAddr) -> Option<&str> {
        self.by_ip
            .get(&ip)
            .and_then(|names| names.first())
            .map(String::as_str)
    }

    /// A gateway other than `name` claiming `ip` (the first by name), if any.
    pub fn other_claiming(&self, ip: IpAddr, name: &str) -> Option<&str> {
        self.by_ip
            .get(&ip)?
            .iter()
            .find(|other| *other != name)
            .map(String::as_str)
    }

    /// Number of gateways indexed.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether no gateway is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_claim_goes_with_its_gateway_and_survives_a_second_claimant() {
        let mut index = GatewayIndex::default();
        index.upsert("a", ["10.0.0.5", "fc00::5", "not-an-ip"]);
        index.upsert("b", ["10.0.0.5"]);
        assert_eq!(index.claiming(ip("10.0.0.5")), Some("a"));
        assert_eq!(index.other_claiming(ip("10.0.0.5"), "a"), Some("b"));
        assert_eq!(index.other_claiming(ip("fc00::5"), "a"), None);
        index.remove("a");
        assert_eq!(index.claiming(ip("10.0.0.5")), Some("b"));
        assert_eq!(index.claiming(ip("fc00::5")), None);
        // An update replaces the IPs it held.
        index.upsert("b", ["10.0.0.6"]);
        assert_eq!(index.claiming(ip("10.0.0.5")), None);
        assert_eq!(index.len(), 1);
    }
}
