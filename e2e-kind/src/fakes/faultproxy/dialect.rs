//! How a cloud API names its routes and how it words a refusal, per wire protocol.

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::Full;

/// The wire protocol in front of which the proxy stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// EC2's query API: the route is the `Action` form parameter (body or query string);
    /// throttling is HTTP 503 with the `RequestLimitExceeded` XML error.
    Ec2Query,
    /// A REST/JSON API (the GCP, Azure and OpenStack fakes): the route is `METHOD /path`;
    /// throttling is HTTP 429.
    Rest,
    /// Azure Resource Manager (the ARM fake): routes as [`Dialect::Rest`]; throttling is HTTP 429
    /// with ARM's `TooManyRequests` or the network provider's `RetryableError` code (alternating)
    /// and `Retry-After`; server errors carry ARM's error envelope.
    Arm,
    /// GCE's Compute v1 REST API: the route is the method id (`instances.updateNetworkInterface`,
    /// `zoneOperations.wait`, ...), so counts and rules do not depend on project, zone or VM;
    /// throttling is HTTP 429 with reason `rateLimitExceeded`, server errors `backendError`.
    Gce,
}

impl Dialect {
    /// The route of a request, as rules and counters name it.
    pub(crate) fn route(
        self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        body: &[u8],
    ) -> String {
        match self {
            Self::Ec2Query => form_value(body, "Action")
                .or_else(|| query.and_then(|q| form_value(q.as_bytes(), "Action")))
                .unwrap_or_else(|| format!("{method} {path}")),
            Self::Rest => format!("{method} {path}"),
            Self::Arm => format!("{method} {path}"),
            Self::Gce => gce_route(method, path),
        }
    }

    /// How many addresses a request names (see [`crate::fakes::faultproxy::RouteCounts::addresses`]).
    pub(crate) fn addresses(self, body: &[u8], query: Option<&str>) -> u64 {
        match self {
            Self::Ec2Query => form_pairs(body)
                .chain(form_pairs(query.unwrap_or("").as_bytes()))
                .map(|(key, value)| match key.split_once('.') {
                    Some(("PrivateIpAddress" | "Ipv6Addresses", _)) => 1,
                    None if key == "SecondaryPrivateIpAddressCount"
                        || key == "Ipv6AddressCount" =>
                    {
                        value.parse().unwrap_or(0)
                    }
                    _ => 0,
                })
                .sum(),
            Self::Rest => 0,
            // The ip-configurations a NIC PUT carries.
            Self::Arm => std::str::from_utf8(body)
                .map(|text| text.matches("\"privateIPAddress\"").count() as u64)
                .unwrap_or(0),
            Self::Gce => gce_aliases(body),
        }
    }

    /// The answer to a throttled request.
    pub(crate) fn throttled(self, request_id: u64) -> Response<Full<Bytes>> {
        match self {
            Self::Ec2Query => ec2_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "RequestLimitExceeded",
                "Request limit exceeded.",
                request_id,
            ),
            Self::Rest => json_error(StatusCode::TOO_MANY_REQUESTS, "Rate limit exceeded."),
            Self::Arm => {
                let code = if request_id.is_multiple_of(2) {
                    "TooManyRequests"
                } else {
                    "RetryableError"
                };
                let mut response = arm_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    code,
                    "The request is being throttled. Retry after the time in the Retry-After header.",
                );
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                response
            }
            Self::Gce => gce_error(
                StatusCode::TOO_MANY_REQUESTS,
                "rateLimitExceeded",
                "Rate Limit Exceeded",
            ),
        }
    }

    /// The answer to a request failed with a server error.
    pub(crate) fn server_error(self, request_id: u64) -> Response<Full<Bytes>> {
        match self {
            Self::Ec2Query => ec2_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "An internal error has occurred.",
                request_id,
            ),
            Self::Rest => json_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal error."),
            Self::Arm => arm_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "An error occurred.",
            ),
            Self::Gce => gce_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "backendError",
                "The service is currently unavailable.",
            ),
        }
    }
}

/// The first value of `key` in an `application/x-www-form-urlencoded` string.
fn form_value(form: &[u8], key: &str) -> Option<String> {
    form_pairs(form).find_map(|(k, v)| (k == key && !v.is_empty()).then(|| v.to_owned()))
}

/// The key/value pairs of an `application/x-www-form-urlencoded` string (empty if not UTF-8).
/// Not percent-decoded: the keys and values the proxy reads (action names, `InstanceId.1`,
/// instance and interface ids) are plain ASCII letters, digits, dots and dashes.
pub(crate) fn form_pairs(form: &[u8]) -> impl Iterator<Item = (&str, &str)> {
    std::str::from_utf8(form)
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
}

/// EC2's answer refusing a request as a client error (HTTP 400 with EC2's error `code`).
pub(crate) fn refused(code: &str, message: &str, request_id: u64) -> Response<Full<Bytes>> {
    ec2_error(StatusCode::BAD_REQUEST, code, message, request_id)
}

pub(crate) fn ec2_error(
    status: StatusCode,
    code: &str,
    message: &str,
    request_id: u64,
) -> Response<Full<Bytes>> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
         <Message>{message}</Message></Error></Errors>\
         <RequestID>faultproxy-{request_id:016x}</RequestID></Response>"
    );
    answer(status, "text/xml;charset=UTF-8", body)
}

fn json_error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = format!(
        "{{\"error\":{{\"code\":{},\"message\":\"{message}\"}}}}",
        status.as_u16()
    );
    answer(status, "application/json", body)
}

fn arm_error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = format!("{{\"error\":{{\"code\":\"{code}\",\"message\":\"{message}\"}}}}");
    answer(status, "application/json; charset=utf-8", body)
}

/// The Compute method a request calls, by the shape of its path under `/compute/v1/projects/<p>/`.
fn gce_route(method: &Method, path: &str) -> String {
    let parts: Vec<&str> = path
        .strip_prefix("/compute/v1/projects/")
        .unwrap_or("")
        .split('/')
        .collect();
    let known = match (method.as_str(), parts.as_slice()) {
        ("GET", [_, "zones", _, "instances", _]) => Some("instances.get"),
        ("GET", [_, "zones", _, "instances"]) => Some("instances.list"),
        ("GET", [_, "aggregated", "instances"]) => Some("instances.aggregatedList"),
        ("PATCH", [_, "zones", _, "instances", _, "updateNetworkInterface"]) => {
            Some("instances.updateNetworkInterface")
        }
        ("GET", [_, "zones", _, "operations", _]) => Some("zoneOperations.get"),
        ("POST", [_, "zones", _, "operations", _, "wait"]) => Some("zoneOperations.wait"),
        ("GET", [_, "regions", _, "subnetworks", _]) => Some("subnetworks.get"),
        _ => None,
    };
    known.map_or_else(|| format!("{method} {path}"), str::to_owned)
}

/// How many alias ranges an `updateNetworkInterface` body carries.
fn gce_aliases(body: &[u8]) -> u64 {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["aliasIpRanges"].as_array().map(Vec::len))
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0)
}

/// GCE's error body, with the `reason` clients classify by.
fn gce_error(status: StatusCode, reason: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"error": {"code": status.as_u16(), "message": message,
        "errors": [{"domain": "usageLimits", "reason": reason, "message": message}]}});
    answer(status, "application/json", body.to_string())
}

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec2_route_is_the_action_parameter() {
        let body = b"Version=2016-11-15&Action=AssignPrivateIpAddresses&NetworkInterfaceId=eni-1";
        let route = Dialect::Ec2Query.route(&Method::POST, "/", None, body);
        assert_eq!(route, "AssignPrivateIpAddresses");
        let route = Dialect::Ec2Query.route(&Method::GET, "/", Some("Action=DescribeRegions"), b"");
        assert_eq!(route, "DescribeRegions");
        let route = Dialect::Ec2Query.route(&Method::GET, "/moto-api/", None, b"");
        assert_eq!(route, "GET /moto-api/");
    }

    #[test]
    fn ec2_addresses_are_the_listed_and_counted_ones() {
        let assign = b"Action=AssignPrivateIpAddresses&NetworkInterfaceId=eni-1\
                       &PrivateIpAddress.1=10.0.0.5&PrivateIpAddress.2=10.0.0.6";
        assert_eq!(Dialect::Ec2Query.addresses(assign, None), 2);
        let v6 = b"Action=UnassignIpv6Addresses&Ipv6Addresses.1=fc00%3A%3A1";
        assert_eq!(Dialect::Ec2Query.addresses(v6, None), 1);
        let counted = b"Action=AssignPrivateIpAddresses&SecondaryPrivateIpAddressCount=3";
        assert_eq!(Dialect::Ec2Query.addresses(counted, None), 3);
        let describe = b"Action=DescribeNetworkInterfaces&NetworkInterfaceId.1=eni-1\
                         &Filter.1.Name=addresses.private-ip-address&Filter.1.Value.1=10.0.0.5";
        assert_eq!(Dialect::Ec2Query.addresses(describe, None), 0);
        assert_eq!(Dialect::Rest.addresses(b"PrivateIpAddress.1=x", None), 0);
    }

    #[test]
    fn rest_route_is_method_and_path() {
        let route = Dialect::Rest.route(&Method::PATCH, "/compute/v1/x", Some("a=b"), b"{}");
        assert_eq!(route, "PATCH /compute/v1/x");
    }

    #[test]
    fn arm_throttle_is_a_429_with_retry_after_and_an_arm_code() {
        let response = Dialect::Arm.throttled(2);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let other = Dialect::Arm.throttled(3);
        assert_ne!(
            format!("{:?}", response.body()),
            format!("{:?}", other.body())
        );
        assert_eq!(
            Dialect::Arm.server_error(1).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let put = br#"{"properties":{"ipConfigurations":[{"properties":{"privateIPAddress":"10.0.0.4"}},{"properties":{"privateIPAddress":"10.0.0.5"}}]}}"#;
        assert_eq!(Dialect::Arm.addresses(put, None), 2);
    }

    #[test]
    fn gce_routes_are_method_ids_and_throttling_names_its_reason() {
        let path = "/compute/v1/projects/p/zones/z/instances/vm-1/updateNetworkInterface";
        let route = Dialect::Gce.route(&Method::PATCH, path, Some("networkInterface=nic0"), b"");
        assert_eq!(route, "instances.updateNetworkInterface");
        let wait = "/compute/v1/projects/p/zones/z/operations/op-1/wait";
        assert_eq!(
            Dialect::Gce.route(&Method::POST, wait, None, b""),
            "zoneOperations.wait"
        );
        let body = br#"{"fingerprint":"AA==","aliasIpRanges":[{"ipCidrRange":"10.0.0.5/32"}]}"#;
        assert_eq!(Dialect::Gce.addresses(body, None), 1);
        let throttled = Dialect::Gce.throttled(1);
        assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            Dialect::Gce.server_error(1).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn ec2_throttle_is_a_503_request_limit_exceeded() {
        let response = Dialect::Ec2Query.throttled(1);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let rest = Dialect::Rest.throttled(1);
        assert_eq!(rest.status(), StatusCode::TOO_MANY_REQUESTS);
    }
}
