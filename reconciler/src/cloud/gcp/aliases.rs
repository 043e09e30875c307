//! The pure arithmetic of `nic0`'s alias list: which list a change produces, where each alias
//! comes from (the primary range or a named secondary range), and what a subnetwork URL names.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use crate::cloud::Change;

/// Aliases GCE allows on one network interface.
pub const MAX_ALIASES: usize = 100;

/// One entry of a NIC's `aliasIpRanges`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alias {
    /// `ipCidrRange` as GCE reports it (`10.0.0.5/32`; a bare address also means /32).
    pub cidr: String,
    /// `subnetworkRangeName`: the secondary range the alias comes from, `None` for the primary.
    pub range: Option<String>,
}

impl Alias {
    /// The single address this alias is, if it is one (/32 or a bare address).
    pub fn single(&self) -> Option<Ipv4Addr> {
        match self.cidr.split_once('/') {
            None => self.cidr.parse().ok(),
            Some((ip, "32")) => ip.parse().ok(),
            Some(_) => None,
        }
    }

    /// The address that stands for this alias in the interface's address list: itself, or the
    /// network address of a wider range (which still takes one of the NIC's alias slots).
    pub fn address(&self) -> Option<IpAddr> {
        self.single().map(IpAddr::V4).or_else(|| {
            self.cidr
                .parse::<Ipv4Net>()
                .ok()
                .map(|net| IpAddr::V4(net.network()))
        })
    }
}

/// A subnetwork's ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubnetRanges {
    /// The primary range (`ipCidrRange`).
    pub primary: Option<Ipv4Net>,
    /// The secondary ranges by name (`secondaryIpRanges`).
    pub secondary: Vec<(String, Ipv4Net)>,
    /// The IPv6 range of a dual-stack subnetwork (`ipv6CidrRange`): only reported in the node
    /// annotation, as upstream does; aliases are IPv4.
    pub ipv6: Option<Ipv6Net>,
}

/// Why a change cannot become an alias list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AliasError {
    /// GCP is IPv4 only.
    #[error("{0} is IPv6; GCP alias IP ranges are IPv4 only")]
    Ipv6(IpAddr),
    /// Neither the primary nor a secondary range of the subnet holds the IP.
    #[error("{ip} lies in no range of subnetwork {subnet} ({ranges})")]
    OutsideSubnet {
        /// The IP.
        ip: IpAddr,
        /// The subnetwork's name.
        subnet: String,
        /// Its ranges, for the message.
        ranges: String,
    },
    /// The list would be longer than GCE allows.
    #[error("interface nic0 would hold {count} alias IP ranges, more than the 100 GCE allows")]
    TooMany {
        /// The length of the list asked for.
        count: usize,
    },
}

/// The alias list after `change`: current aliases minus the removed IPs, plus the added IPs that
/// are not on it yet (each in the range that holds it), in a stable order. `None` when the list
/// would not change, so no call is needed.
pub fn next_list(
    current: &[Alias],
    change: &Change,
    subnet_name: &str,
    ranges: &SubnetRanges,
) -> Result<Option<Vec<Alias>>, AliasError> {
    let mut list: Vec<Alias> = current
        .iter()
        .filter(|alias| {
            alias
                .single()
                .is_none_or(|ip| !change.remove.contains(&IpAddr::V4(ip)))
        })
        .cloned()
        .collect();
    let held = |list: &[Alias], ip: Ipv4Addr| list.iter().any(|a| a.single() == Some(ip));
    for ip in &change.add {
        let IpAddr::V4(v4) = ip else {
            return Err(AliasError::Ipv6(*ip));
        };
        if held(&list, *v4) {
            continue;
        }
        let range = range_of(*v4, ranges).ok_or_else(|| AliasError::OutsideSubnet {
            ip: *ip,
            subnet: subnet_name.to_owned(),
            ranges: describe(ranges),
        })?;
        list.push(Alias {
            cidr: format!("{v4}/32"),
            range,
        });
    }
    if list.len() > MAX_ALIASES && list.len() > current.len() {
        return Err(AliasError::TooMany { count: list.len() });
    }
    Ok((list != current).then_some(list))
}

/// The range that holds `ip`: `Some(None)` for the primary, `Some(Some(name))` for a secondary.
pub fn range_of(ip: Ipv4Addr, ranges: &SubnetRanges) -> Option<Option<String>> {
    if ranges.primary.is_some_and(|net| net.contains(&ip)) {
        return Some(None);
    }
    ranges
        .secondary
        .iter()
        .find(|(_, net)| net.contains(&ip))
        .map(|(name, _)| Some(name.clone()))
}

fn describe(ranges: &SubnetRanges) -> String {
    let mut parts: Vec<String> = ranges.primary.iter().map(|n| n.to_string()).collect();
    parts.extend(
        ranges
            .secondary
            .iter()
            .map(|(name, n)| format!("{name} {n}")),
    );
    if parts.is_empty() {
        "no ranges".into()
    } else {
        parts.join(", ")
    }
}

/// Project, region and name of a subnetwork URL
/// (`https://www.googleapis.com/compute/v1/projects/<p>/regions/<r>/subnetworks/<s>`, or the
/// partial `projects/<p>/regions/<r>/subnetworks/<s>`). The project is the network's, which
/// differs from the VM's in a shared VPC.
pub fn subnet_parts(url: &str) -> Option<(String, String, String)> {
    let at = url.find("projects/")?;
    let mut parts = url[at..].split('/');
    match (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    ) {
        ("projects", p, "regions", r, "subnetworks", s)
            if !p.is_empty() && !r.is_empty() && !s.is_empty() && parts.next().is_none() =>
        {
            Some((p.to_owned(), r.to_owned(), s.to_owned()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn alias(cidr: &str, range: Option<&str>) -> Alias {
        Alias {
            cidr: cidr.into(),
            range: range.map(Into::into),
        }
    }

    fn ranges() -> SubnetRanges {
        SubnetRanges {
            primary: "10.0.0.0/24".parse().ok(),
            secondary: vec![("pods".into(), "10.4.0.0/16".parse().unwrap())],
            ipv6: None,
        }
    }

    fn change(add: &[&str], remove: &[&str]) -> Change {
        Change::new(
            add.iter().map(|s| ip(s)).collect(),
            remove.iter().map(|s| ip(s)).collect(),
        )
    }

    #[test]
    fn additions_and_removals_make_one_list() {
        let current = [alias("10.0.0.5/32", None), alias("10.0.0.6/32", None)];
        let got = next_list(
            &current,
            &change(&["10.0.0.7", "10.4.1.1"], &["10.0.0.5"]),
            "s",
            &ranges(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            vec![
                alias("10.0.0.6/32", None),
                alias("10.0.0.7/32", None),
                alias("10.4.1.1/32", Some("pods")),
            ]
        );
    }

    #[test]
    fn an_unchanged_list_needs_no_call() {
        let current = [alias("10.0.0.5", None)];
        let same = next_list(
            &current,
            &change(&["10.0.0.5"], &["10.0.0.9"]),
            "s",
            &ranges(),
        );
        assert_eq!(same.unwrap(), None);
    }

    #[test]
    fn removing_the_last_alias_gives_an_empty_list() {
        let current = [alias("10.0.0.5/32", None)];
        let got = next_list(&current, &change(&[], &["10.0.0.5"]), "s", &ranges());
        assert_eq!(got.unwrap(), Some(Vec::new()));
    }

    #[test]
    fn wider_ranges_nobody_manages_are_kept() {
        let current = [alias("10.4.8.0/28", Some("pods"))];
        let got = next_list(
            &current,
            &change(&["10.0.0.9"], &["10.4.8.0"]),
            "s",
            &ranges(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(got[0], alias("10.4.8.0/28", Some("pods")));
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn refuses_outside_the_subnet_and_ipv6() {
        let e = next_list(&[], &change(&["192.168.0.1"], &[]), "s", &ranges()).unwrap_err();
        assert!(matches!(e, AliasError::OutsideSubnet { .. }));
        assert!(e.to_string().contains("10.0.0.0/24"), "{e}");
        let e = next_list(&[], &change(&["fd00::1"], &[]), "s", &ranges()).unwrap_err();
        assert_eq!(e, AliasError::Ipv6(ip("fd00::1")));
    }

    #[test]
    fn refuses_more_than_a_hundred() {
        let current: Vec<Alias> = (1..=100)
            .map(|i| alias(&format!("10.4.0.{i}/32"), Some("pods")))
            .collect();
        let e = next_list(&current, &change(&["10.0.0.9"], &[]), "s", &ranges()).unwrap_err();
        assert_eq!(e, AliasError::TooMany { count: 101 });
        // A swap keeps the length and is allowed.
        let ok = next_list(
            &current,
            &change(&["10.0.0.9"], &["10.4.0.1"]),
            "s",
            &ranges(),
        );
        assert_eq!(ok.unwrap().unwrap().len(), 100);
    }

    #[test]
    fn alias_addresses() {
        assert_eq!(alias("10.0.0.5/32", None).address(), Some(ip("10.0.0.5")));
        assert_eq!(alias("10.0.0.5", None).address(), Some(ip("10.0.0.5")));
        assert_eq!(alias("10.0.0.16/28", None).single(), None);
        assert_eq!(alias("10.0.0.16/28", None).address(), Some(ip("10.0.0.16")));
    }

    #[test]
    fn subnet_urls_name_the_networks_project_and_region() {
        let full = "https://www.googleapis.com/compute/v1/projects/host-proj/regions/us-central1/subnetworks/shared";
        assert_eq!(
            subnet_parts(full),
            Some(("host-proj".into(), "us-central1".into(), "shared".into()))
        );
        assert_eq!(
            subnet_parts("projects/p/regions/r/subnetworks/s"),
            Some(("p".into(), "r".into(), "s".into()))
        );
        for bad in [
            "",
            "projects/p/zones/z/subnetworks/s",
            "projects/p/regions/r/subnetworks/",
        ] {
            assert_eq!(subnet_parts(bad), None, "{bad}");
        }
    }
}
