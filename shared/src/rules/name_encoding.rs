//! Rule 1: the object name is the one canonical name of a usable unicast IP.

use std::net::IpAddr;

use super::{Denial, Rule, cannot_place};
use crate::codec;

/// The IP named by `name`, or a denial saying which name to use instead.
pub fn check_name(name: &str, spec_node: &str) -> Result<IpAddr, Denial> {
    codec::decode_name(name).map_err(|error| {
        let fix = match error.suggestion() {
            Some(name) => format!("recreate the object with the name {name:?}"),
            None => "name the object after the unicast IP to attach".to_owned(),
        };
        Denial::new(
            Rule::NameEncoding,
            format!(
                "{}: {error}; {fix}",
                cannot_place(format!("{name:?}"), spec_node)
            ),
        )
    })
}
