//! The node annotation's value (SPEC §2.4), computed from what the cloud reports.

use std::collections::HashSet;
use std::net::IpAddr;

use cloudnet_shared::platform::bucket_for;
use cloudnet_shared::{Bucket, Capacity, EgressIpConfig, IfAddr, Platform};

use crate::cloud::NodeEgress;

/// The annotation element for a node whose primary interface is `egress`.
///
/// Capacity is the cloud limit minus the addresses on the interface that no object manages for
/// this node (`managed`: IPs of objects whose spec.node or status.node is the node). Managed IPs
/// never reduce it, because the network plugin does its own accounting of those; a result of 0
/// or below is still written, as a missing key would read as "unlimited".
pub fn egress_config(
    egress: &NodeEgress,
    managed: &HashSet<IpAddr>,
    platform: Option<Platform>,
) -> EgressIpConfig {
    let used = |bucket: Bucket| -> i64 {
        let n = egress
            .addresses
            .iter()
            .filter(|ip| !managed.contains(ip))
            .filter(|ip| bucket_for(platform, **ip, &egress.capacity) == bucket)
            .count();
        i64::try_from(n).unwrap_or(i64::MAX)
    };
    let left = |bucket: Bucket| {
        egress
            .capacity
            .get(bucket)
            .map(|limit| limit.saturating_sub(used(bucket)))
    };
    EgressIpConfig {
        interface: egress.interface.clone(),
        ifaddr: IfAddr::new(egress.ipv4_subnet, egress.ipv6_subnet),
        capacity: Capacity {
            ipv4: left(Bucket::Ipv4),
            ipv6: left(Bucket::Ipv6),
            ip: left(Bucket::Ip),
        },
    }
}

/// How full one capacity bucket of a node is, for `cloudnet_node_egress_ips_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Room {
    /// The bucket (the metric's `family`: `ipv4`, `ipv6`, or `ip` where both share one limit).
    pub(crate) bucket: Bucket,
    /// What the annotation offers the managed IPs (may be 0 or below: see [`egress_config`]).
    pub(crate) capacity: i64,
    /// Managed IPs that name the node (spec or status) and fall in this bucket.
    pub(crate) used: i64,
}

/// The room of each bucket the annotation `config` limits, with `managed` (the IPs of the
/// objects naming the node) as what uses it. An unlimited bucket has no room to run out of.
pub(crate) fn room(
    config: &EgressIpConfig,
    managed: &HashSet<IpAddr>,
    platform: Option<Platform>,
) -> Vec<Room> {
    [Bucket::Ipv4, Bucket::Ipv6, Bucket::Ip]
        .into_iter()
        .filter_map(|bucket| {
            let capacity = config.capacity.get(bucket)?;
            let used = managed
                .iter()
                .filter(|ip| bucket_for(platform, **ip, &config.capacity) == bucket)
                .count();
            Some(Room {
                bucket,
                capacity,
                used: i64::try_from(used).unwrap_or(i64::MAX),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use cloudnet_shared::annotation::encode;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn egress(capacity: Capacity, addresses: &[&str]) -> NodeEgress {
        NodeEgress {
            interface: "eni-1".into(),
            ipv4_subnet: "10.0.128.7/17".parse().ok(),
            ipv6_subnet: None,
            capacity,
            addresses: addresses.iter().map(|a| ip(a)).collect(),
            ..NodeEgress::default()
        }
    }

    #[test]
    fn unmanaged_addresses_reduce_capacity_and_managed_ones_do_not() {
        let e = egress(
            Capacity {
                ip: Some(10),
                ..Capacity::default()
            },
            &["10.0.128.5", "10.0.128.6", "10.0.128.7"],
        );
        let managed: HashSet<IpAddr> = [ip("10.0.128.7")].into();
        let config = egress_config(&e, &managed, Some(Platform::Gcp));
        assert_eq!(
            encode(&[config]),
            r#"[{"interface":"eni-1","ifaddr":{"ipv4":"10.0.128.0/17"},"capacity":{"ip":8}}]"#
        );
    }

    #[test]
    fn per_family_buckets_count_their_own_family_and_zero_is_kept() {
        let e = egress(
            Capacity {
                ipv4: Some(2),
                ipv6: Some(5),
                ip: None,
            },
            &["10.0.128.5", "10.0.128.6", "10.0.128.9", "fd00::5"],
        );
        let config = egress_config(&e, &HashSet::new(), Some(Platform::Aws));
        assert_eq!(config.capacity.ipv4, Some(-1));
        assert_eq!(config.capacity.ipv6, Some(4));
        assert_eq!(config.capacity.ip, None);
        assert!(encode(&[config]).contains(r#""capacity":{"ipv4":-1,"ipv6":4}"#));
    }

    #[test]
    fn room_counts_managed_ips_per_limited_bucket() {
        let managed: HashSet<IpAddr> = [ip("10.0.128.5"), ip("10.0.128.6"), ip("fd00::5")].into();
        let per_family = egress(
            Capacity {
                ipv4: Some(10),
                ipv6: Some(10),
                ip: None,
            },
            &["10.0.128.7", "10.0.128.5"],
        );
        let config = egress_config(&per_family, &managed, Some(Platform::Aws));
        assert_eq!(
            room(&config, &managed, Some(Platform::Aws)),
            [
                // 10.0.128.7 is unmanaged: it takes one place; the managed ones count as used.
                Room {
                    bucket: Bucket::Ipv4,
                    capacity: 9,
                    used: 2
                },
                Room {
                    bucket: Bucket::Ipv6,
                    capacity: 10,
                    used: 1
                },
            ]
        );
        let shared = egress(
            Capacity {
                ip: Some(4),
                ..Capacity::default()
            },
            &[],
        );
        let config = egress_config(&shared, &managed, Some(Platform::Gcp));
        assert_eq!(
            room(&config, &managed, Some(Platform::Gcp)),
            [Room {
                bucket: Bucket::Ip,
                capacity: 4,
                used: 3
            }]
        );
        let unlimited = egress(Capacity::default(), &[]);
        let config = egress_config(&unlimited, &managed, None);
        assert!(room(&config, &managed, None).is_empty());
    }
}
