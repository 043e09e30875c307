//! IP ⇄ object name: the one canonical spelling of an egress IP as a `CloudPrivateIPConfig` name.
//!
//! Object names cannot hold `:`, so IPv6 is written as its eight groups, each padded to four
//! lower-case hex digits, joined by dots (`fc00:f853:ccd:e793::54` →
//! `fc00.f853.0ccd.e793.0000.0000.0000.0054`). Exactly one name per IP matters: the name is the
//! lock that stops two clients from claiming the same IP, and two spellings of one IP would let
//! both succeed.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

use crate::excerpt::excerpt;

/// Why an address can never be an egress IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnusableKind {
    /// `0.0.0.0` or `::`.
    Unspecified,
    /// `127.0.0.0/8` or `::1`.
    Loopback,
    /// `224.0.0.0/4` or `ff00::/8`.
    Multicast,
    /// `169.254.0.0/16` or `fe80::/10`.
    LinkLocal,
    /// `255.255.255.255`.
    Broadcast,
}

impl UnusableKind {
    /// Short noun phrase for messages, e.g. "a loopback address".
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Unspecified => "the unspecified address",
            Self::Loopback => "a loopback address",
            Self::Multicast => "a multicast address",
            Self::LinkLocal => "a link-local address",
            Self::Broadcast => "the limited broadcast address",
        }
    }
}

impl fmt::Display for UnusableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// Why a name is not the canonical name of a usable IP.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum NameError {
    /// The name is no recognisable spelling of an IP address.
    #[error(
        "name {name:?} is not an IP address: use an IPv4 address such as \"10.0.0.5\" or an IPv6 \
         address written as eight dot-separated groups of four lower-case hex digits such as \
         \"fc00.f853.0ccd.e793.0000.0000.0000.0054\""
    )]
    NotAnIp {
        /// The name as given (a prefix, when it is long).
        name: String,
    },
    /// The name spells a usable IP, but not in the canonical way.
    #[error("name {name:?} is not canonical: use {canonical:?}")]
    NonCanonical {
        /// The name as given.
        name: String,
        /// The canonical name of the same IP.
        canonical: String,
    },
    /// The name is an IPv6 address written with colons, which object names cannot hold.
    #[error(
        "name {name:?} is an IPv6 address written with colons, which object names cannot hold: \
         use {canonical:?}"
    )]
    RawIpv6 {
        /// The name as given.
        name: String,
        /// The canonical name of the same IP.
        canonical: String,
    },
    /// The name is an IPv4-mapped IPv6 address; the IPv4 name is the only one for that IP.
    #[error(
        "name {name:?} is an IPv4-mapped IPv6 address, a second name for an IPv4 address: use {ipv4:?}"
    )]
    Ipv4Mapped {
        /// The name as given.
        name: String,
        /// The canonical name of the embedded IPv4 address.
        ipv4: String,
    },
    /// The name spells an address that can never be an egress IP.
    #[error(
        "name {name:?} is {kind}, which cannot be an egress IP: use a unicast address of the node's subnet"
    )]
    Unusable {
        /// The name as given.
        name: String,
        /// What kind of address it is.
        kind: UnusableKind,
    },
}

impl NameError {
    /// The name to use instead, when the input meant a usable IP.
    pub fn suggestion(&self) -> Option<&str> {
        match self {
            Self::NonCanonical { canonical, .. } | Self::RawIpv6 { canonical, .. } => {
                Some(canonical)
            }
            Self::Ipv4Mapped { ipv4, .. } => Some(ipv4),
            Self::NotAnIp { .. } | Self::Unusable { .. } => None,
        }
    }
}

/// The canonical name of a usable IP.
pub fn encode_name(ip: IpAddr) -> Result<String, NameError> {
    check_usable(ip, || display_name(ip))?;
    Ok(display_name(ip))
}

/// Decodes a name that must already be canonical; any other spelling is refused.
pub fn decode_name(name: &str) -> Result<IpAddr, NameError> {
    let ip = parse_lenient(name)?;
    check_usable(ip, || name.to_owned())?;
    let canonical = display_name(ip);
    if canonical == name {
        return Ok(ip);
    }
    if name.contains(':') {
        Err(NameError::RawIpv6 {
            name: name.to_owned(),
            canonical,
        })
    } else {
        Err(NameError::NonCanonical {
            name: name.to_owned(),
            canonical,
        })
    }
}

/// Maps any recognisable spelling of a usable IP to its canonical name.
///
/// Accepts raw IPv6 (colons, compressed, any case), dotted IPv6 with unpadded or upper-case
/// groups, and IPv4 with leading zeros (read as decimal, never octal, because that is what
/// whoever wrote `010.0.0.5` meant in a name derived from a decimal address).
pub fn canonical_name(input: &str) -> Result<String, NameError> {
    let ip = parse_lenient(input)?;
    check_usable(ip, || input.to_owned())?;
    Ok(display_name(ip))
}

/// Longer than any recognisable spelling of an IP: the longest is a raw IPv6 address with an
/// embedded IPv4 one, `0000:0000:0000:0000:0000:0000:255.255.255.255` (45 characters).
pub const MAX_SPELLING_BYTES: usize = 64;

fn parse_lenient(input: &str) -> Result<IpAddr, NameError> {
    let not_an_ip = || NameError::NotAnIp {
        name: excerpt(input).into_owned(),
    };
    // Refused before any splitting or copying, so the cost of a name is bounded whatever its
    // length (names of custom resources have no length limit of their own).
    if input.len() > MAX_SPELLING_BYTES {
        return Err(not_an_ip());
    }
    if input.contains(':') {
        return input
            .parse::<Ipv6Addr>()
            .map(IpAddr::V6)
            .map_err(|_| not_an_ip());
    }
    let parts: Vec<&str> = input.split('.').collect();
    match parts.len() {
        4 => parse_dotted_ipv4(&parts)
            .map(IpAddr::V4)
            .ok_or_else(not_an_ip),
        8 => parse_dotted_ipv6(&parts)
            .map(IpAddr::V6)
            .ok_or_else(not_an_ip),
        _ => Err(not_an_ip()),
    }
}

fn parse_dotted_ipv4(parts: &[&str]) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    for (octet, part) in octets.iter_mut().zip(parts) {
        // `u8::from_str` would accept a leading '+', which is no spelling of an IP.
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    Some(Ipv4Addr::from(octets))
}

fn parse_dotted_ipv6(parts: &[&str]) -> Option<Ipv6Addr> {
    let mut groups = [0u16; 8];
    for (group, part) in groups.iter_mut().zip(parts) {
        if part.is_empty() || part.len() > 4 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *group = u16::from_str_radix(part, 16).ok()?;
    }
    Some(Ipv6Addr::from(groups))
}

/// Refuses addresses that can never be egress IPs; `name` is only built on error.
fn check_usable(ip: IpAddr, name: impl Fn() -> String) -> Result<(), NameError> {
    if let IpAddr::V6(v6) = ip
        && let Some(v4) = v6.to_ipv4_mapped()
    {
        // An unusable IPv4 stays unusable however it is written; suggesting it would mislead.
        if let Some(kind) = unusable_kind(IpAddr::V4(v4)) {
            return Err(NameError::Unusable { name: name(), kind });
        }
        return Err(NameError::Ipv4Mapped {
            name: name(),
            ipv4: v4.to_string(),
        });
    }
    match unusable_kind(ip) {
        Some(kind) => Err(NameError::Unusable { name: name(), kind }),
        None => Ok(()),
    }
}

fn unusable_kind(ip: IpAddr) -> Option<UnusableKind> {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Some(UnusableKind::Unspecified),
        IpAddr::V4(v4) if v4.is_loopback() => Some(UnusableKind::Loopback),
        IpAddr::V4(v4) if v4.is_multicast() => Some(UnusableKind::Multicast),
        IpAddr::V4(v4) if v4.is_link_local() => Some(UnusableKind::LinkLocal),
        IpAddr::V4(v4) if v4.is_broadcast() => Some(UnusableKind::Broadcast),
        IpAddr::V6(v6) if v6.is_unspecified() => Some(UnusableKind::Unspecified),
        IpAddr::V6(v6) if v6.is_loopback() => Some(UnusableKind::Loopback),
        IpAddr::V6(v6) if v6.is_multicast() => Some(UnusableKind::Multicast),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some(UnusableKind::LinkLocal),
        _ => None,
    }
}

/// The canonical spelling, without the usability check.
fn display_name(ip: IpAddr) -> String {
    match ip {
        // std prints IPv4 as a dotted quad without leading zeros, which is the canonical form.
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => v6
            .segments()
            .iter()
            .map(|group| format!("{group:04x}"))
            .collect::<Vec<_>>()
            .join("."),
    }
}
