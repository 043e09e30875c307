//! The admission rules of `EgressPublicIP` (docs/public-ips.md): the private IP is one canonical
//! unicast address the cloud's public addresses can serve, the public id has the cloud's shape,
//! GCP is refused with its alternative, each private IP and each public address is bound once, and
//! a binding's spec never changes (so the reconciler never has to guess what it associated before).

use std::net::IpAddr;

use super::public_ip_index::PublicIpIndex;
use super::{Denial, Operation, Rule, Verdict};
use crate::codec::{canonical_name, decode_name, encode_name};
use crate::platform::Platform;
use crate::public_ip::{EgressPublicIPSpec, PublicId, PublicIdError};

/// The whole admission decision for one `EgressPublicIP` request named `name`.
///
/// `new` is the spec after the operation, `old` the one before (updates only; `None` when
/// unreadable, which reviews the change in full). `platform` is `None` when the cloud is unknown:
/// the public id is then checked against every cloud's shape.
pub fn review_public_ip(
    operation: Operation,
    name: &str,
    new: Option<&EgressPublicIPSpec>,
    old: Option<&EgressPublicIPSpec>,
    index: &PublicIpIndex,
    platform: Option<Platform>,
) -> Verdict {
    let new = match super::reviewable(operation, new, "", "EgressPublicIP") {
        Ok(new) => new,
        Err(verdict) => return verdict,
    };
    if operation == Operation::Update
        && let Some(old) = old
    {
        // Metadata-only updates pass whatever the rules say today; a spec change never does.
        return match check_unchanged(name, old, new) {
            Ok(()) => Verdict::allow(),
            Err(denial) => denial.into(),
        };
    }
    match check_binding(name, new, index, platform) {
        Ok(verdict) => verdict,
        Err(denial) => denial.into(),
    }
}

/// The rules for a new binding, in the order a reader fixes them: the cloud, each field, then
/// the other bindings.
fn check_binding(
    name: &str,
    spec: &EgressPublicIPSpec,
    index: &PublicIpIndex,
    platform: Option<Platform>,
) -> Result<Verdict, Denial> {
    if platform == Some(Platform::Gcp) {
        return Err(Denial::new(Rule::PublicIpPlatform, GCP_REFUSAL));
    }
    let id = check_public_id(&spec.public_ip, platform)?;
    check_private_ip(&spec.private_ip, platform.unwrap_or(id.platform()))?;
    check_unique(name, spec, index)?;
    let mut verdict = Verdict::allow();
    if platform.is_none() {
        verdict = verdict.with_warning(format!(
            "the webhook does not know the cloud yet (no --platform-type, no Node with a providerID), so {id} was taken as {}'s",
            id.platform().as_str()
        ));
    }
    Ok(verdict)
}

/// Why GCP is refused, and what to use there instead.
pub const GCP_REFUSAL: &str = "GCP cannot bind a public address to an egress IP: an egress IP is an alias IP range, and GCP gives public addresses (access configs) to a NIC's primary address only; to give egress traffic fixed public addresses on GCP, use Cloud NAT with reserved addresses (manual NAT IP assignment) on the nodes' subnet";

/// `spec.privateIP` is the canonical spelling of a usable unicast IP of a family the cloud's
/// public addresses serve.
pub fn check_private_ip(private_ip: &str, platform: Platform) -> Result<IpAddr, Denial> {
    let deny = |detail: String| Denial::new(Rule::PublicIpPrivate, detail);
    let ip = match private_ip.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => {
            // Any other spelling of an IP (the CloudPrivateIPConfig name's, leading zeros) is
            // named back in the spelling to use.
            let suggestion = canonical_name(private_ip)
                .and_then(|name| decode_name(&name))
                .map(|ip| format!(": use {:?}", ip.to_string()))
                .unwrap_or_else(|_| {
                    ": use an IPv4 address such as \"10.0.0.5\" or an IPv6 address such as \"fc00::54\"".into()
                });
            return Err(deny(format!(
                "privateIP {:?} is not an IP address in canonical form{suggestion}",
                crate::excerpt::excerpt(private_ip)
            )));
        }
    };
    if let Err(error) = encode_name(ip) {
        return Err(deny(format!(
            "privateIP {private_ip}: {error}; name the egress IP as its CloudPrivateIPConfig does"
        )));
    }
    let canonical = ip.to_string();
    if canonical != private_ip {
        return Err(deny(format!(
            "privateIP {private_ip:?} is not canonical: use {canonical:?}"
        )));
    }
    if ip.is_ipv6() && matches!(platform, Platform::Aws | Platform::OpenStack) {
        let what = match platform {
            Platform::Aws => "Elastic IPs",
            _ => "floating IPs",
        };
        return Err(deny(format!(
            "privateIP {ip} is IPv6, but {what} are IPv4 only: bind the public address to an IPv4 egress IP (an IPv6 egress IP is reachable as it is where the subnet routes IPv6 publicly)"
        )));
    }
    Ok(ip)
}

/// `spec.publicIP` is an id of the cloud in use (or, while it is unknown, of any supported one).
pub fn check_public_id(public_ip: &str, platform: Option<Platform>) -> Result<PublicId, Denial> {
    let id = PublicId::parse(public_ip).map_err(|error| match error {
        PublicIdError::Gcp(_) => Denial::new(Rule::PublicIpPlatform, format!("publicIP {error}")),
        PublicIdError::Address(_) | PublicIdError::Unrecognised(_) => {
            let fix = platform.map_or_else(String::new, |p| {
                format!(" (on {}, {})", p.as_str(), PublicId::shape(p))
            });
            Denial::new(Rule::PublicIpId, format!("publicIP {error}{fix}"))
        }
    })?;
    match platform {
        Some(platform) if platform != id.platform() => Err(Denial::new(
            Rule::PublicIpId,
            format!(
                "publicIP {:?} is {}'s kind of id, but the cluster runs on {}: use {}",
                id.as_str(),
                id.platform().as_str(),
                platform.as_str(),
                PublicId::shape(platform)
            ),
        )),
        _ => Ok(id),
    }
}

/// No other binding holds the private IP or the public address: one public address per egress
/// IP, and one egress IP per public address (a second would pull it away on every reconcile).
pub fn check_unique(
    name: &str,
    spec: &EgressPublicIPSpec,
    index: &PublicIpIndex,
) -> Result<(), Denial> {
    if let Some(other) = index.other_with_private(&spec.private_ip, name) {
        return Err(Denial::new(
            Rule::PublicIpConflict,
            format!(
                "EgressPublicIP {other} already binds a public address to {}: an egress IP takes one public address; delete {other} first to bind another",
                spec.private_ip
            ),
        ));
    }
    if let Some(other) = index.other_with_public(&spec.public_ip, name) {
        return Err(Denial::new(
            Rule::PublicIpConflict,
            format!(
                "EgressPublicIP {other} already binds {} to an egress IP: a public address follows one egress IP; delete {other} first to move it",
                spec.public_ip
            ),
        ));
    }
    Ok(())
}

/// An update keeps the spec: the reconciler must know what it associated to undo it, and a new
/// pair is a new binding.
pub fn check_unchanged(
    name: &str,
    old: &EgressPublicIPSpec,
    new: &EgressPublicIPSpec,
) -> Result<(), Denial> {
    if old == new {
        return Ok(());
    }
    Err(Denial::new(
        Rule::PublicIpImmutable,
        format!(
            "the spec of EgressPublicIP {name} cannot change (privateIP {} → {}, publicIP {} → {}): delete it and create a new binding",
            old.private_ip, new.private_ip, old.public_ip, new.public_ip
        ),
    ))
}
