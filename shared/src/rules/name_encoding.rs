//! Rule 1: the object name is the one canonical name of a usable unicast IP.

use std::net::IpAddr;

use super::{Denial, Rule};
use crate::codec;

/// The IP named by `name`, or a denial saying which name to use instead.
///
/// The codec's message already carries the fix ("use …"), so it is passed through whole.
pub fn check_name(name: &str, spec_node: &str) -> Result<IpAddr, Denial> {
    codec::decode_name(name).map_err(|error| {
        let detail = if spec_node.is_empty() {
            error.to_string()
        } else {
            format!("object for node {spec_node}: {error}")
        };
        Denial::new(Rule::NameEncoding, detail)
    })
}
