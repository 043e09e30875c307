//! Rule 5: the node has room for one more egress IP in the IP's capacity bucket.
//!
//! Who counts, and in which order the limit is granted, is decided here for the webhook and the
//! reconciler alike:
//!
//! * an object **occupies** a node when its `spec.node` or its `status.node` is that node: an IP
//!   on its way out (moved away or being deleted) still sits on the source until it is detached;
//! * the limit goes to the occupants in a stable order ([`Claim`]): IPs already attached to the
//!   node first, then by creation time, then by name. An object is within the limit when fewer
//!   than the limit of the other occupants of its bucket come before it. An admission request
//!   is a newcomer and comes after every occupant, so the webhook refuses it when the others
//!   already fill the bucket; the reconciler, re-checking before a cloud call, blocks only the
//!   IPs over the limit, never all pending IPs of a node.

use std::cmp::Ordering;
use std::net::IpAddr;

use k8s_openapi::jiff::Timestamp;

use super::{ClusterSnapshot, Denial, Rule, cannot_place};
use crate::annotation::{Capacity, EGRESS_IPCONFIG_ANNOTATION};
use crate::platform::{Bucket, Platform, bucket_for};
use crate::resource::CloudPrivateIPConfig;

/// Whether an object whose spec and status name these nodes occupies `node`'s capacity.
pub fn occupies(spec_node: &str, status_node: &str, node: &str) -> bool {
    !node.is_empty() && (spec_node == node || status_node == node)
}

/// An occupant's place in the line for a node's capacity bucket.
///
/// Ordered as the limit is granted: attached to the node first, then older first (an object
/// not created yet, i.e. an admission request, after every existing one), then by name, which
/// makes the order total and the same in every process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim<'a> {
    /// The object's name.
    pub name: &'a str,
    /// Already on the node: `status.node` is the node and `Assigned` is `True`.
    pub attached: bool,
    /// `metadata.creationTimestamp`; `None` for an object not created yet.
    pub created: Option<Timestamp>,
}

impl<'a> Claim<'a> {
    /// A request to admit an object: not attached, not created yet.
    pub const fn newcomer(name: &'a str) -> Self {
        Self {
            name,
            attached: false,
            created: None,
        }
    }

    /// The claim `object` makes on `node`.
    pub fn of(object: &'a CloudPrivateIPConfig, node: &str) -> Self {
        let attached = object.status_node() == Some(node)
            && object
                .assigned_condition()
                .is_some_and(|c| c.status == "True");
        Self {
            name: object.metadata.name.as_deref().unwrap_or_default(),
            attached,
            created: object.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    fn key(&self) -> (bool, bool, Option<Timestamp>, &'a str) {
        (
            !self.attached,
            self.created.is_none(),
            self.created,
            self.name,
        )
    }
}

impl Ord for Claim<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for Claim<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// How many of `others` (occupants of the same node and bucket) come before `me`; `me` itself
/// (by name) is never counted.
pub fn claims_ahead<'a>(me: &Claim<'_>, others: impl IntoIterator<Item = Claim<'a>>) -> usize {
    others
        .into_iter()
        .filter(|other| other.name != me.name && *other < *me)
        .count()
}

/// Refuses `me` (IP `ip`) on `node` unless it is within `capacity` among `others`, the
/// occupants of `node` in the bucket of `ip` (see [`occupies`], [`bucket_for`]).
///
/// The reconciler's re-check before a cloud call.
pub fn check_claim<'a>(
    ip: IpAddr,
    node: &str,
    capacity: &Capacity,
    bucket: Bucket,
    me: &Claim<'_>,
    others: impl IntoIterator<Item = Claim<'a>>,
) -> Result<(), Denial> {
    let Some(limit) = capacity.get(bucket) else {
        return Ok(());
    };
    let ahead = claims_ahead(me, others);
    if within(ahead, limit) {
        return Ok(());
    }
    Err(Denial::new(
        Rule::Capacity,
        format!(
            "{}: the node has room for {limit} {}egress IPs (capacity \"{bucket}\" in annotation {EGRESS_IPCONFIG_ANNOTATION}) and {ahead} come before this one (attached first, then the oldest, then by name); it is attached once one of them is released or moved, or pick another node",
            cannot_place(ip, node),
            family(bucket)
        ),
    ))
}

/// Whether the next IP fits when `others` already hold a place within `limit`.
fn within(others: usize, limit: i64) -> bool {
    i128::try_from(others).unwrap_or(i128::MAX) < i128::from(limit)
}

/// The family word of a bucket, for messages.
const fn family(bucket: Bucket) -> &'static str {
    match bucket {
        Bucket::Ipv4 => "ipv4 ",
        Bucket::Ipv6 => "ipv6 ",
        Bucket::Ip => "",
    }
}

/// Refuses `ip` (object `object_name`) on `node` if the node's bucket is already full.
///
/// The webhook's check: the request is a [`Claim::newcomer`], so every other occupant of the
/// bucket comes before it, and the snapshot's index counts them without a scan. The object
/// itself is never counted, so re-checking an object already on the node, or moving it, does
/// not count it twice.
pub fn check_capacity(
    ip: IpAddr,
    object_name: &str,
    node: &str,
    capacity: &Capacity,
    platform: Option<Platform>,
    cluster: &ClusterSnapshot,
) -> Result<(), Denial> {
    let bucket = bucket_for(platform, ip, capacity);
    let others = cluster.count_occupying(node, bucket, object_name);
    check_capacity_count(ip, node, capacity, bucket, others)
}

/// Refuses `ip` on `node` if `others` objects already fill `bucket` of `capacity`: the
/// decision for a newcomer, before which every occupant comes.
pub fn check_capacity_count(
    ip: IpAddr,
    node: &str,
    capacity: &Capacity,
    bucket: Bucket,
    others: usize,
) -> Result<(), Denial> {
    // A missing key means unlimited, as it does to OVN-Kubernetes.
    let Some(limit) = capacity.get(bucket) else {
        return Ok(());
    };
    if within(others, limit) {
        return Ok(());
    }
    Err(Denial::new(
        Rule::Capacity,
        format!(
            "{}: the node already carries {others} of its {limit} {}egress IPs (capacity \"{bucket}\" in annotation {EGRESS_IPCONFIG_ANNOTATION}); pick another node or release one of its IPs",
            cannot_place(ip, node),
            family(bucket)
        ),
    ))
}
