//! EC2's IAM check: an action the caller's policy does not allow is refused with HTTP 403
//! `UnauthorizedOperation` before anything else happens (no token taken, nothing changed).

use std::collections::BTreeSet;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use hyper::Response;

use super::dialect;

/// The EC2 actions OpenShift grants the cloud network config controller: its
/// CredentialsRequest `openshift-cloud-network-config-controller-aws`
/// (openshift/cluster-network-operator, `manifests/02-cncc-credentials.yaml`).
pub const CREDENTIALS_REQUEST: [&str; 9] = [
    "DescribeInstances",
    "DescribeInstanceStatus",
    "DescribeInstanceTypes",
    "UnassignPrivateIpAddresses",
    "AssignPrivateIpAddresses",
    "UnassignIpv6Addresses",
    "AssignIpv6Addresses",
    "DescribeSubnets",
    "DescribeNetworkInterfaces",
];

/// The actions a policy allows (`ec2:<Action>`, resource `*`).
#[derive(Debug)]
pub(crate) struct Policy {
    allowed: BTreeSet<String>,
}

impl Policy {
    pub(crate) fn new<'a>(actions: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            allowed: actions.into_iter().map(str::to_owned).collect(),
        }
    }

    /// EC2's refusal of `action`, if the policy does not allow it.
    pub(crate) fn refusal(&self, action: &str, request_id: u64) -> Option<Response<Full<Bytes>>> {
        if self.allowed.contains(action) {
            return None;
        }
        let message = format!(
            "You are not authorized to perform this operation. User: \
             arn:aws:iam::000000000000:user/cloudnet-e2e is not authorized to perform: \
             ec2:{action} because no identity-based policy allows the ec2:{action} action"
        );
        Some(dialect::ec2_error(
            StatusCode::FORBIDDEN,
            "UnauthorizedOperation",
            &message,
            request_id,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_actions_pass() {
        let policy = Policy::new(CREDENTIALS_REQUEST);
        assert!(policy.refusal("AssignPrivateIpAddresses", 1).is_none());
        let refused = policy.refusal("DescribeVpcs", 2);
        assert_eq!(refused.map(|r| r.status()), Some(StatusCode::FORBIDDEN));
    }
}
