//! The ids a cloud gives its public addresses, as `spec.publicIP` holds them: recognised by their
//! shape, so the webhook can refuse another cloud's id (or an address instead of an id) at once.
//!
//! Hand-written: each shape is a prefix and a few character classes, and no crate knows all four
//! clouds' ids.

use std::fmt;

use thiserror::Error;

use crate::ids::is_hyphenated_uuid;
use crate::platform::Platform;

/// The longest id accepted: an Azure resource id is the longest (resource group up to 90
/// characters, name up to 80), far below this.
pub const MAX_ID_BYTES: usize = 512;

/// A public address's id, by the cloud whose shape it has.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PublicId {
    /// An Elastic IP's allocation id, `eipalloc-` and 8 or 17 hex digits.
    AwsAllocation(String),
    /// A public IP's resource id,
    /// `/subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Network/publicIPAddresses/<name>`.
    AzurePublicIp(String),
    /// A Neutron floating IP's id: a UUID, lower-case and hyphenated as Neutron writes it.
    OpenStackFloatingIp(String),
}

/// Why `spec.publicIP` names no public address of any supported cloud.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum PublicIdError {
    /// A GCP address, which cannot follow an egress IP (an alias IP range cannot carry an
    /// access config).
    #[error(
        "{0:?} names a GCP address; GCP cannot give an alias IP (an egress IP) a public address of its own: give the egress traffic reserved public addresses through Cloud NAT (manual NAT IP assignment) instead"
    )]
    Gcp(String),
    /// An IP address written where the cloud's id belongs.
    #[error(
        "{0:?} is an address, not the cloud's id of one: name the public address by its AWS allocation id (eipalloc-…), Azure public IP resource id or OpenStack floating IP id"
    )]
    Address(String),
    /// Nothing recognisable.
    #[error(
        "{0:?} is no public address id: use an AWS allocation id (eipalloc- and 8 or 17 hex digits), an Azure public IP resource id (/subscriptions/<subscription>/resourceGroups/<group>/providers/Microsoft.Network/publicIPAddresses/<name>) or an OpenStack floating IP id (a UUID)"
    )]
    Unrecognised(String),
}

impl PublicId {
    /// Recognises `id` by its shape.
    pub fn parse(id: &str) -> Result<Self, PublicIdError> {
        let shown = || crate::excerpt::excerpt(id).into_owned();
        if id.len() > MAX_ID_BYTES {
            return Err(PublicIdError::Unrecognised(shown()));
        }
        if is_aws_allocation(id) {
            return Ok(Self::AwsAllocation(id.to_owned()));
        }
        if is_azure_public_ip(id) {
            return Ok(Self::AzurePublicIp(id.to_owned()));
        }
        if is_uuid(id) {
            return Ok(Self::OpenStackFloatingIp(id.to_owned()));
        }
        if is_gcp_address(id) {
            return Err(PublicIdError::Gcp(shown()));
        }
        if id.parse::<std::net::IpAddr>().is_ok() {
            return Err(PublicIdError::Address(shown()));
        }
        Err(PublicIdError::Unrecognised(shown()))
    }

    /// The cloud whose id this is.
    pub const fn platform(&self) -> Platform {
        match self {
            Self::AwsAllocation(_) => Platform::Aws,
            Self::AzurePublicIp(_) => Platform::Azure,
            Self::OpenStackFloatingIp(_) => Platform::OpenStack,
        }
    }

    /// The id as written.
    pub fn as_str(&self) -> &str {
        match self {
            Self::AwsAllocation(id) | Self::AzurePublicIp(id) | Self::OpenStackFloatingIp(id) => id,
        }
    }

    /// The key two spellings of one address share: ARM compares resource ids without regard to
    /// case, so an Azure id is lower-cased; the other clouds' ids have one spelling.
    pub fn key(&self) -> String {
        match self {
            Self::AzurePublicIp(id) => id.to_ascii_lowercase(),
            Self::AwsAllocation(id) | Self::OpenStackFloatingIp(id) => id.clone(),
        }
    }

    /// How this cloud spells its ids, for messages.
    pub const fn shape(platform: Platform) -> &'static str {
        match platform {
            Platform::Aws => "an Elastic IP allocation id (eipalloc- and 8 or 17 hex digits)",
            Platform::Azure => {
                "a public IP resource id (/subscriptions/<subscription>/resourceGroups/<group>/providers/Microsoft.Network/publicIPAddresses/<name>)"
            }
            Platform::OpenStack => "a floating IP id (a lower-case UUID)",
            Platform::Gcp => "none: GCP has no public address that can follow an egress IP",
        }
    }
}

impl fmt::Display for PublicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// EC2 allocation ids: `eipalloc-` and 8 hex digits (older) or 17 (since 2016).
fn is_aws_allocation(id: &str) -> bool {
    id.strip_prefix("eipalloc-")
        .is_some_and(|rest| matches!(rest.len(), 8 | 17) && is_lower_hex(rest))
}

/// A UUID in the 8-4-4-4-12 form, lower-case, as Neutron returns ids.
fn is_uuid(id: &str) -> bool {
    is_hyphenated_uuid(id) && !id.bytes().any(|b| b.is_ascii_uppercase())
}

/// ARM's public IP resource id. Segment names are case-insensitive in ARM; the values follow
/// ARM's naming rules: a subscription GUID, a resource group of 1–90 letters, digits, `_`, `-`,
/// `.`, `(`, `)` not ending in `.`, a name of 1–80 letters, digits, `_`, `-`, `.` that starts
/// with a letter or digit and ends with a letter, digit or `_`.
fn is_azure_public_ip(id: &str) -> bool {
    let segments: Vec<&str> = id.split('/').collect();
    let [
        "",
        subscriptions,
        subscription,
        groups,
        group,
        providers,
        namespace,
        kind,
        name,
    ] = segments.as_slice()
    else {
        return false;
    };
    let literal = |s: &str, want: &str| s.eq_ignore_ascii_case(want);
    literal(subscriptions, "subscriptions")
        && is_hyphenated_uuid(subscription)
        && literal(groups, "resourceGroups")
        && is_resource_group(group)
        && literal(providers, "providers")
        && literal(namespace, "Microsoft.Network")
        && literal(kind, "publicIPAddresses")
        && is_public_ip_name(name)
}

fn is_resource_group(group: &str) -> bool {
    (1..=90).contains(&group.len())
        && !group.ends_with('.')
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'(' | b')'))
}

fn is_public_ip_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=80).contains(&bytes.len())
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// A Compute Engine address: `projects/<p>/regions/<r>/addresses/<name>`, alone or in a URL.
fn is_gcp_address(id: &str) -> bool {
    id.contains("projects/") && id.contains("/addresses/")
}
