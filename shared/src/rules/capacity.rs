//! Rule 5: the node has room for one more egress IP in the IP's capacity bucket.

use std::net::IpAddr;

use super::{ClusterSnapshot, Denial, Rule, cannot_place};
use crate::annotation::{Capacity, EGRESS_IPCONFIG_ANNOTATION};
use crate::platform::{Bucket, Platform, bucket_for};

/// Refuses `ip` (object `object_name`) on `node` if the node's bucket is already full.
///
/// The object itself is never counted, so re-checking an object already aimed at the node, or
/// moving it, does not count it twice.
pub fn check_capacity(
    ip: IpAddr,
    object_name: &str,
    node: &str,
    capacity: &Capacity,
    platform: Option<Platform>,
    cluster: &ClusterSnapshot,
) -> Result<(), Denial> {
    let bucket = bucket_for(platform, ip, capacity);
    let others = cluster.count_on_node(node, bucket, object_name);
    check_capacity_count(ip, node, capacity, bucket, others)
}

/// Refuses `ip` on `node` if `others` objects already fill `bucket` of `capacity`.
///
/// For callers that count themselves (the reconciler, from its own cache).
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
    let carried = i128::try_from(others).unwrap_or(i128::MAX);
    if carried < i128::from(limit) {
        return Ok(());
    }
    let family = match bucket {
        Bucket::Ipv4 => "ipv4 ",
        Bucket::Ipv6 => "ipv6 ",
        Bucket::Ip => "",
    };
    Err(Denial::new(
        Rule::Capacity,
        format!(
            "{}: the node already carries {others} of its {limit} {family}egress IPs (capacity \"{bucket}\" in annotation {EGRESS_IPCONFIG_ANNOTATION}); pick another node or release one of its IPs",
            cannot_place(ip, node)
        ),
    ))
}
