//! The cloud platforms, how each counts egress-IP capacity, and which subnet indices each reserves.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

use crate::annotation::Capacity;

/// A supported cloud, spelled as upstream's `--platform-type` flag spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// Amazon EC2.
    Aws,
    /// Microsoft Azure.
    Azure,
    /// Google Compute Engine.
    Gcp,
    /// OpenStack Neutron.
    OpenStack,
}

/// How a cloud limits the number of addresses on a NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CapacityModel {
    /// Separate limits for IPv4 and IPv6 (annotation keys `ipv4` and `ipv6`).
    PerFamily,
    /// One limit shared by both families (annotation key `ip`).
    Shared,
}

impl CapacityModel {
    /// The annotation keys of this model, as a bounded metric label: `ipv4_ipv6` or `ip`.
    pub const fn keys_label(self) -> &'static str {
        match self {
            Self::PerFamily => "ipv4_ipv6",
            Self::Shared => "ip",
        }
    }

    const fn keys_spelled(self) -> &'static str {
        match self {
            Self::PerFamily => "\"ipv4\"/\"ipv6\"",
            Self::Shared => "\"ip\"",
        }
    }
}

/// A `--platform-type` value that names no supported cloud.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("unknown platform {0:?}: expected one of AWS, Azure, GCP, OpenStack")]
pub struct ParsePlatformError(pub String);

impl Platform {
    /// Every supported platform, for help texts and exhaustive tests.
    pub const ALL: [Platform; 4] = [Self::Aws, Self::Azure, Self::Gcp, Self::OpenStack];

    /// Upstream's spelling: `AWS`, `Azure`, `GCP`, `OpenStack`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Aws => "AWS",
            Self::Azure => "Azure",
            Self::Gcp => "GCP",
            Self::OpenStack => "OpenStack",
        }
    }

    /// The cloud a Node's `spec.providerID` names by its scheme (`aws://`, `azure://`, `gce://`,
    /// `openstack://`), as each cloud's cloud-controller-manager writes it.
    pub fn from_provider_id(provider_id: &str) -> Option<Self> {
        let (scheme, _) = provider_id.split_once("://")?;
        match scheme {
            "aws" => Some(Self::Aws),
            "azure" => Some(Self::Azure),
            "gce" => Some(Self::Gcp),
            "openstack" => Some(Self::OpenStack),
            _ => None,
        }
    }

    /// Whether the cloud counts IPv4 and IPv6 separately.
    pub const fn capacity_model(self) -> CapacityModel {
        match self {
            // EC2 limits per family: Ipv4AddressesPerInterface / Ipv6AddressesPerInterface.
            Self::Aws => CapacityModel::PerFamily,
            Self::Azure | Self::Gcp | Self::OpenStack => CapacityModel::Shared,
        }
    }

    /// Whether egress IPv6 can be attached at all; GCE alias IP ranges are IPv4 only.
    pub const fn supports_ipv6(self) -> bool {
        !matches!(self, Self::Gcp)
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Platform {
    type Err = ParsePlatformError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParsePlatformError(s.to_owned()))
    }
}

/// A capacity bucket of the node annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bucket {
    /// IPv4 addresses on a per-family cloud.
    Ipv4,
    /// IPv6 addresses on a per-family cloud.
    Ipv6,
    /// Addresses of both families on a shared-capacity cloud.
    Ip,
}

impl Bucket {
    /// The annotation key: `ipv4`, `ipv6` or `ip`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
            Self::Ip => "ip",
        }
    }

    /// The per-family bucket of an address.
    pub const fn family_of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::Ipv4,
            IpAddr::V6(_) => Self::Ipv6,
        }
    }

    /// Whether an address of this family is counted in this bucket.
    pub const fn holds(self, ip: IpAddr) -> bool {
        matches!(
            (self, ip),
            (Self::Ip, _) | (Self::Ipv4, IpAddr::V4(_)) | (Self::Ipv6, IpAddr::V6(_))
        )
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The bucket an address is counted in on a node with this annotation capacity.
///
/// The platform decides, unless the annotation carries only another cloud's keys (see
/// [`key_mismatch`]): then, as without a known platform, the annotation's own keys decide, so a
/// limit that is there is never read as "unlimited". Whoever wrote per-family keys counts per
/// family, so an `ipv4` key means the node's IPv4 addresses are limited separately.
pub fn bucket_for(platform: Option<Platform>, ip: IpAddr, capacity: &Capacity) -> Bucket {
    let family = Bucket::family_of(ip);
    let model = platform
        .filter(|p| key_mismatch(Some(*p), capacity).is_none())
        .map(Platform::capacity_model);
    match model {
        Some(CapacityModel::PerFamily) => family,
        Some(CapacityModel::Shared) => Bucket::Ip,
        None if capacity.get(family).is_some() => family,
        None => Bucket::Ip,
    }
}

/// The capacity model an annotation's keys speak for: per-family when it has `ipv4` or `ipv6`
/// and no `ip`, shared when it has `ip` and neither of the others, else none (no keys, or both
/// kinds, where the platform decides).
pub const fn key_model(capacity: &Capacity) -> Option<CapacityModel> {
    let per_family = capacity.ipv4.is_some() || capacity.ipv6.is_some();
    match (per_family, capacity.ip.is_some()) {
        (true, false) => Some(CapacityModel::PerFamily),
        (false, true) => Some(CapacityModel::Shared),
        _ => None,
    }
}

/// A node annotation whose capacity keys are another cloud's than the configured platform's,
/// e.g. only `ip` with `--platform-type=AWS`: a migration or a misconfigured flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyMismatch {
    /// The configured platform.
    pub platform: Platform,
    /// The model the annotation's keys speak for.
    pub keys: CapacityModel,
}

impl KeyMismatch {
    /// The annotation's keys, as a bounded metric label: `ipv4_ipv6` or `ip`.
    pub const fn keys_label(self) -> &'static str {
        self.keys.keys_label()
    }
}

impl fmt::Display for KeyMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "its capacity keys are {} but platform {} writes {}; counted with the annotation's own keys",
            self.keys.keys_spelled(),
            self.platform,
            self.platform.capacity_model().keys_spelled()
        )
    }
}

/// Whether the annotation's capacity keys belong to another model than `platform`'s.
pub fn key_mismatch(platform: Option<Platform>, capacity: &Capacity) -> Option<KeyMismatch> {
    let platform = platform?;
    let keys = key_model(capacity)?;
    (keys != platform.capacity_model()).then_some(KeyMismatch { platform, keys })
}

/// Why `ip` cannot be used in `subnet` on `platform`, if it sits at a cloud-reserved index.
///
/// Returns `None` when `ip` is not inside `subnet` (another rule reports that). Offsets are
/// computed in `u128`, so every prefix length, `/0` to `/128`, is safe; in subnets too small to
/// have a free address every offset is reserved, because the reserved offsets then cover them all.
pub fn reserved_index(platform: Platform, subnet: IpNet, ip: IpAddr) -> Option<&'static str> {
    if !subnet.contains(&ip) {
        return None;
    }
    let (offset, last) = match (subnet, ip) {
        (IpNet::V4(net), IpAddr::V4(ip)) => (
            u128::from(u32::from(ip) - u32::from(net.network())),
            u128::from(u32::from(net.hostmask())),
        ),
        (IpNet::V6(net), IpAddr::V6(ip)) => (
            u128::from(ip) - u128::from(net.network()),
            u128::from(net.hostmask()),
        ),
        _ => return None,
    };
    let ipv6 = ip.is_ipv6();
    match platform {
        // "The first four IP addresses and the last IP address in each subnet CIDR block are not
        // available": network, VPC router, DNS, future use, broadcast. The same holds for IPv6.
        // https://docs.aws.amazon.com/vpc/latest/userguide/subnet-sizing.html
        Platform::Aws => match offset {
            0 => Some("the network address"),
            1 => Some("reserved by AWS for the VPC router"),
            2 => Some("reserved by AWS for the DNS server"),
            3 => Some("reserved by AWS for future use"),
            o if o == last => Some("the last address (broadcast), reserved by AWS"),
            _ => None,
        },
        // Azure reserves x.x.x.0 (network), .1 (default gateway), .2 and .3 (Azure DNS) and the
        // last address (broadcast), in IPv4 and IPv6 subnets alike.
        // https://learn.microsoft.com/en-us/azure/virtual-network/virtual-networks-faq#are-there-any-restrictions-on-using-ip-addresses-within-these-subnets
        Platform::Azure => match offset {
            0 => Some("the network address"),
            1 => Some("the default gateway, reserved by Azure"),
            2 | 3 => Some("reserved by Azure for DNS"),
            o if o == last => Some("the last address (broadcast), reserved by Azure"),
            _ => None,
        },
        // GCE reserves network, default gateway, second-to-last ("for potential future use")
        // and broadcast in every IPv4 subnet range.
        // https://cloud.google.com/vpc/docs/subnets#unusable-ip-addresses-in-every-subnet
        Platform::Gcp => match offset {
            0 => Some("the network address"),
            1 => Some("the default gateway, reserved by Google Cloud"),
            o if o == last => Some("the broadcast address"),
            o if last.checked_sub(1) == Some(o) => {
                Some("the second-to-last address, reserved by Google Cloud")
            }
            _ => None,
        },
        // What real Neutron (29.0) reports for a subnet created with defaults: an IPv4 /24 has
        // gateway_ip .1 and the pool .2-.254 (network and broadcast are refused outright); an
        // IPv6 /64 has gateway_ip at the subnet-router anycast address (offset 0) and the pool
        // ::1 to the last address, so ::1 is an ordinary address there. A /127 has no pool.
        // Checked against the real server by e2e-kind/tests/providers/openstack_provider.rs.
        // https://docs.openstack.org/neutron/latest/admin/intro-os-networking.html
        Platform::OpenStack => match offset {
            0 if ipv6 => Some("the subnet-router anycast address, Neutron's default IPv6 gateway"),
            0 => Some("the network address"),
            1 if ipv6 && last == 1 => Some("outside Neutron's allocation pool (a /127 has none)"),
            1 if !ipv6 => Some("the default gateway of the Neutron subnet"),
            o if o == last && !ipv6 => Some("the broadcast address"),
            _ => None,
        },
    }
}

/// The reserved indices of `platform`, in words, for the fix part of a denial.
pub const fn reserved_summary(platform: Platform, ipv6: bool) -> &'static str {
    match (platform, ipv6) {
        (Platform::Aws, _) => "AWS reserves the first four and the last address of every subnet",
        (Platform::Azure, _) => {
            "Azure reserves the first four and the last address of every subnet"
        }
        (Platform::Gcp, _) => {
            "Google Cloud reserves the network, gateway, second-to-last and broadcast addresses"
        }
        (Platform::OpenStack, false) => {
            "OpenStack reserves the network, gateway and broadcast addresses"
        }
        (Platform::OpenStack, true) => {
            "OpenStack reserves the first address of an IPv6 subnet (Neutron's default gateway)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserved(platform: Platform, subnet: &str, ip: &str) -> bool {
        reserved_index(platform, subnet.parse().unwrap(), ip.parse().unwrap()).is_some()
    }

    #[test]
    fn platform_parses_upstream_spellings_in_any_case() {
        for (input, want) in [
            ("AWS", Platform::Aws),
            ("aws", Platform::Aws),
            ("Azure", Platform::Azure),
            ("AZURE", Platform::Azure),
            ("GCP", Platform::Gcp),
            ("gcp", Platform::Gcp),
            ("OpenStack", Platform::OpenStack),
            ("openstack", Platform::OpenStack),
        ] {
            assert_eq!(input.parse::<Platform>(), Ok(want), "{input}");
        }
        for bad in ["", "BareMetal", "EC2", "aws ", "gce"] {
            assert!(bad.parse::<Platform>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn provider_ids_name_their_cloud_by_scheme() {
        for (id, want) in [
            ("aws:///us-east-1a/i-0123", Some(Platform::Aws)),
            (
                "azure:///subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/v",
                Some(Platform::Azure),
            ),
            ("gce://project/zone/instance", Some(Platform::Gcp)),
            ("openstack:///4b6f2b0c", Some(Platform::OpenStack)),
            ("kind://docker/kind/kind-control-plane", None),
            ("AWS:///x", None),
            ("", None),
            ("aws", None),
        ] {
            assert_eq!(Platform::from_provider_id(id), want, "{id}");
        }
    }

    #[test]
    fn platform_display_round_trips() {
        for p in Platform::ALL {
            assert_eq!(p.to_string().parse::<Platform>(), Ok(p));
        }
        assert_eq!(Platform::OpenStack.to_string(), "OpenStack");
    }

    #[test]
    fn only_aws_counts_per_family_and_only_gcp_lacks_ipv6() {
        assert_eq!(Platform::Aws.capacity_model(), CapacityModel::PerFamily);
        assert_eq!(Platform::Azure.capacity_model(), CapacityModel::Shared);
        assert_eq!(Platform::Gcp.capacity_model(), CapacityModel::Shared);
        assert_eq!(Platform::OpenStack.capacity_model(), CapacityModel::Shared);
        assert!(Platform::Aws.supports_ipv6());
        assert!(Platform::Azure.supports_ipv6());
        assert!(!Platform::Gcp.supports_ipv6());
        assert!(Platform::OpenStack.supports_ipv6());
    }

    #[test]
    fn bucket_follows_platform_then_annotation_keys() {
        let v4: IpAddr = "10.0.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let per_family = Capacity {
            ipv4: Some(14),
            ipv6: Some(15),
            ip: None,
        };
        let shared = Capacity {
            ipv4: None,
            ipv6: None,
            ip: Some(100),
        };
        assert_eq!(
            bucket_for(Some(Platform::Aws), v4, &per_family),
            Bucket::Ipv4
        );
        assert_eq!(
            bucket_for(Some(Platform::Aws), v6, &per_family),
            Bucket::Ipv6
        );
        assert_eq!(bucket_for(Some(Platform::Azure), v6, &shared), Bucket::Ip);
        // Keys of both models: the platform decides.
        let both = Capacity {
            ip: Some(3),
            ..per_family
        };
        assert_eq!(bucket_for(Some(Platform::Aws), v4, &both), Bucket::Ipv4);
        assert_eq!(bucket_for(Some(Platform::Gcp), v4, &both), Bucket::Ip);
        assert_eq!(bucket_for(None, v4, &per_family), Bucket::Ipv4);
        assert_eq!(bucket_for(None, v6, &per_family), Bucket::Ipv6);
        assert_eq!(bucket_for(None, v4, &shared), Bucket::Ip);
        let only_v4 = Capacity {
            ipv4: Some(1),
            ..shared
        };
        assert_eq!(bucket_for(None, v6, &only_v4), Bucket::Ip);
        assert_eq!(Bucket::Ip.as_str(), "ip");
        assert!(Bucket::Ip.holds(v6) && Bucket::Ipv4.holds(v4) && !Bucket::Ipv4.holds(v6));
    }

    #[test]
    fn another_clouds_keys_are_counted_with_their_own_buckets_not_as_unlimited() {
        let v4: IpAddr = "10.0.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let only_ip = Capacity {
            ip: Some(4),
            ..Capacity::default()
        };
        let per_family = Capacity {
            ipv4: Some(14),
            ipv6: Some(15),
            ip: None,
        };
        // --platform-type=AWS on a node annotated by a shared-capacity cloud: "ip" is the limit.
        for ip in [v4, v6] {
            let bucket = bucket_for(Some(Platform::Aws), ip, &only_ip);
            assert_eq!(bucket, Bucket::Ip, "{ip}");
            assert_eq!(only_ip.get(bucket), Some(4), "{ip}");
        }
        assert_eq!(
            bucket_for(Some(Platform::Azure), v4, &per_family),
            Bucket::Ipv4
        );
        assert_eq!(
            bucket_for(Some(Platform::OpenStack), v6, &per_family),
            Bucket::Ipv6
        );
    }

    #[test]
    fn key_mismatch_is_reported_only_for_another_models_keys() {
        let only_ip = Capacity {
            ip: Some(4),
            ..Capacity::default()
        };
        let only_v4 = Capacity {
            ipv4: Some(4),
            ..Capacity::default()
        };
        let both = Capacity {
            ip: Some(4),
            ..only_v4
        };
        let none = Capacity::default();
        let cases = [
            (Some(Platform::Aws), only_ip, Some(CapacityModel::Shared)),
            (Some(Platform::Aws), only_v4, None),
            (Some(Platform::Aws), both, None),
            (Some(Platform::Aws), none, None),
            (Some(Platform::Gcp), only_v4, Some(CapacityModel::PerFamily)),
            (Some(Platform::Azure), only_ip, None),
            (Some(Platform::OpenStack), none, None),
            (None, only_ip, None),
            (None, only_v4, None),
        ];
        for (platform, capacity, want) in cases {
            let got = key_mismatch(platform, &capacity);
            assert_eq!(got.map(|m| m.keys), want, "{platform:?} {capacity:?}");
            if let (Some(m), Some(p)) = (got, platform) {
                assert_eq!(m.platform, p);
            }
        }
        let m = key_mismatch(Some(Platform::Aws), &only_ip).unwrap();
        assert_eq!(m.keys_label(), "ip");
        assert_eq!(
            m.to_string(),
            r#"its capacity keys are "ip" but platform AWS writes "ipv4"/"ipv6"; counted with the annotation's own keys"#
        );
        assert_eq!(CapacityModel::PerFamily.keys_label(), "ipv4_ipv6");
    }

    #[test]
    fn aws_and_azure_reserve_first_four_and_last() {
        for p in [Platform::Aws, Platform::Azure] {
            for ip in ["10.0.1.0", "10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.255"] {
                assert!(reserved(p, "10.0.1.0/24", ip), "{p} {ip}");
            }
            for ip in ["10.0.1.4", "10.0.1.100", "10.0.1.254"] {
                assert!(!reserved(p, "10.0.1.0/24", ip), "{p} {ip}");
            }
            for ip in [
                "fd00::",
                "fd00::1",
                "fd00::2",
                "fd00::3",
                "fd00::ffff:ffff:ffff:ffff",
            ] {
                assert!(reserved(p, "fd00::/64", ip), "{p} {ip}");
            }
            for ip in ["fd00::4", "fd00::ffff:ffff:ffff:fffe"] {
                assert!(!reserved(p, "fd00::/64", ip), "{p} {ip}");
            }
        }
    }

    #[test]
    fn gcp_reserves_network_gateway_second_to_last_and_broadcast() {
        let p = Platform::Gcp;
        for ip in ["10.0.128.0", "10.0.128.1", "10.0.143.254", "10.0.143.255"] {
            assert!(reserved(p, "10.0.128.0/20", ip), "{ip}");
        }
        for ip in ["10.0.128.2", "10.0.128.3", "10.0.143.253"] {
            assert!(!reserved(p, "10.0.128.0/20", ip), "{ip}");
        }
    }

    #[test]
    fn openstack_reserves_network_gateway_and_ipv4_broadcast_only() {
        let p = Platform::OpenStack;
        for ip in ["192.168.0.0", "192.168.0.1", "192.168.0.255"] {
            assert!(reserved(p, "192.168.0.0/24", ip), "{ip}");
        }
        for ip in ["192.168.0.2", "192.168.0.3", "192.168.0.254"] {
            assert!(!reserved(p, "192.168.0.0/24", ip), "{ip}");
        }
        assert!(reserved(p, "fd00::/64", "fd00::"));
        // Neutron's IPv6 pool starts right after its gateway, the subnet-router anycast address.
        assert!(!reserved(p, "fd00::/64", "fd00::1"));
        assert!(!reserved(p, "fd00::/64", "fd00::2"));
        assert!(!reserved(p, "fd00::/64", "fd00::ffff:ffff:ffff:ffff"));
    }

    #[test]
    fn tiny_and_huge_subnets_neither_panic_nor_leave_reserved_gaps() {
        for p in Platform::ALL {
            assert!(reserved(p, "10.0.0.4/31", "10.0.0.4"), "{p}");
            assert!(reserved(p, "10.0.0.4/31", "10.0.0.5"), "{p}");
            assert!(reserved(p, "10.0.0.4/32", "10.0.0.4"), "{p}");
            assert!(reserved(p, "fd00::4/128", "fd00::4"), "{p}");
            assert!(reserved(p, "fd00::4/127", "fd00::4"), "{p}");
            assert!(reserved(p, "fd00::4/127", "fd00::5"), "{p}");
            // /0 exercises the widest offsets without overflowing.
            assert!(reserved(p, "0.0.0.0/0", "255.255.255.255"), "{p}");
            assert!(!reserved(p, "::/0", "fd00::1234"), "{p}");
        }
        // A /30 on AWS has no free address at all; on OpenStack exactly one.
        for ip in ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"] {
            assert!(reserved(Platform::Aws, "10.0.0.0/30", ip), "{ip}");
        }
        assert!(!reserved(Platform::OpenStack, "10.0.0.0/30", "10.0.0.2"));
    }

    #[test]
    fn addresses_outside_the_subnet_or_of_the_other_family_are_not_reported() {
        assert!(!reserved(Platform::Aws, "10.0.1.0/24", "10.0.2.0"));
        assert!(!reserved(Platform::Aws, "10.0.1.0/24", "::"));
        assert!(!reserved(Platform::Aws, "fd00::/64", "10.0.1.0"));
    }
}
