#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The fault-injection proxy in front of a small echo server: routes, injected faults, counters.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cloudnet_e2e::fakes::faultproxy::{
    ActionClass, BucketLimits, Dialect, FaultProxy, RouteMatch, Rule, TokenBuckets,
};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// An upstream answering every request with `echo <method> <path> <body>`.
async fn echo_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = service_fn(|request: Request<hyper::body::Incoming>| async move {
                    let (parts, body) = request.into_parts();
                    let body = body.collect().await.unwrap().to_bytes();
                    let text = format!(
                        "echo {} {} {}",
                        parts.method,
                        parts.uri.path(),
                        String::from_utf8_lossy(&body)
                    );
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

async fn post(
    url: &str,
    body: &str,
) -> Result<(StatusCode, String), hyper_util::client::legacy::Error> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("{url}/"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

async fn get(url: &str, path: &str) -> (StatusCode, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .request(
            Request::get(format!("{url}{path}"))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn untouched_requests_are_forwarded_and_counted_per_action() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    let (status, body) = post(proxy.url(), "Action=DescribeInstances&Version=2016-11-15")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        "echo POST / Action=DescribeInstances&Version=2016-11-15"
    );
    post(proxy.url(), "Version=2016-11-15&Action=AssignIpv6Addresses")
        .await
        .unwrap();
    post(proxy.url(), "Action=AssignIpv6Addresses")
        .await
        .unwrap();
    assert_eq!(proxy.counts("DescribeInstances").forwarded, 1);
    assert_eq!(proxy.counts("AssignIpv6Addresses").forwarded, 2);
    assert_eq!(proxy.counts("AssignIpv6Addresses").injected(), 0);
    assert_eq!(proxy.forwarded_where(|r| r.starts_with("Assign")), 2);
    proxy.reset_counts();
    assert!(proxy.all_counts().is_empty());
}

#[tokio::test]
async fn throttled_route_gets_ec2_request_limit_exceeded_and_others_pass() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    proxy.set_rule(
        RouteMatch::exact("AssignPrivateIpAddresses"),
        Rule::PASS.with_throttle(1.0),
    );
    let (status, body) = post(proxy.url(), "Action=AssignPrivateIpAddresses")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("<Code>RequestLimitExceeded</Code>"), "{body}");
    assert!(body.contains("<RequestID>"), "{body}");
    let (status, _) = post(proxy.url(), "Action=DescribeInstances").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let counts = proxy.counts("AssignPrivateIpAddresses");
    assert_eq!((counts.throttled, counts.forwarded), (1, 0));

    proxy.clear_rules();
    let (status, _) = post(proxy.url(), "Action=AssignPrivateIpAddresses")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn server_errors_and_dropped_connections_are_injected() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    proxy.set_rule(
        RouteMatch::prefix("Describe"),
        Rule::PASS.with_server_error(1.0),
    );
    proxy.set_rule(
        RouteMatch::exact("UnassignIpv6Addresses"),
        Rule::PASS.with_drop(1.0),
    );
    let (status, body) = post(proxy.url(), "Action=DescribeSubnets").await.unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("<Code>InternalError</Code>"), "{body}");
    let dropped = post(proxy.url(), "Action=UnassignIpv6Addresses").await;
    assert!(
        dropped.is_err(),
        "a dropped connection yields no answer: {dropped:?}"
    );
    assert_eq!(proxy.counts("DescribeSubnets").server_errors, 1);
    assert_eq!(proxy.counts("UnassignIpv6Addresses").dropped, 1);
    assert_eq!(proxy.counts("UnassignIpv6Addresses").forwarded, 0);
}

#[tokio::test]
async fn latency_delays_only_the_matching_route() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    let latency = Duration::from_millis(300);
    proxy.set_rule(
        RouteMatch::exact("DescribeInstances"),
        Rule::PASS.with_latency(latency),
    );
    let started = Instant::now();
    let (status, _) = post(proxy.url(), "Action=DescribeInstances").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    // A lower bound only: the proxy must have waited at least the configured latency.
    assert!(started.elapsed() >= latency);
    assert_eq!(proxy.counts("DescribeInstances").forwarded, 1);
}

#[tokio::test]
async fn rest_dialect_routes_by_method_and_path_and_throttles_with_429() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Rest)
        .seed(42)
        .start()
        .await
        .unwrap();
    proxy.set_rule(
        RouteMatch::prefix("GET /compute/"),
        Rule::PASS.with_throttle(1.0),
    );
    let (status, body) = get(proxy.url(), "/compute/v1/projects/p/zones/z/instances/i").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("Rate limit"), "{body}");
    let (status, body) = get(proxy.url(), "/network/v2.0/ports").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "echo GET /network/v2.0/ports ");
    assert_eq!(
        proxy
            .counts("GET /compute/v1/projects/p/zones/z/instances/i")
            .throttled,
        1
    );
    assert_eq!(proxy.counts("GET /network/v2.0/ports").forwarded, 1);
}

#[tokio::test]
async fn partial_throttling_lets_most_calls_through() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Ec2Query)
        .seed(7)
        .start()
        .await
        .unwrap();
    proxy.set_rule(RouteMatch::Any, Rule::PASS.with_throttle(0.2));
    let mut throttled = 0;
    for _ in 0..200 {
        let (status, _) = post(proxy.url(), "Action=DescribeInstances").await.unwrap();
        throttled += u64::from(status == StatusCode::SERVICE_UNAVAILABLE);
    }
    let counts = proxy.counts("DescribeInstances");
    assert_eq!(counts.throttled, throttled);
    assert_eq!(counts.total(), 200);
    assert!(
        (20..=60).contains(&throttled),
        "about 20% of 200, got {throttled}"
    );
}

#[tokio::test]
async fn token_buckets_throttle_a_burst_beyond_one_actions_bucket_and_not_other_actions() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    proxy.set_token_buckets(TokenBuckets::ec2());
    // EC2's mutating bucket holds 50 tokens and refills 5 per second: a burst of 60 calls gets
    // 50 through, and one more for each token refilled while it lasts (on a loaded machine the
    // 60 calls took over a second).
    let mut answers = Vec::new();
    let burst = Instant::now();
    for _ in 0..60 {
        let (status, body) = post(proxy.url(), "Action=UnassignIpv6Addresses")
            .await
            .unwrap();
        answers.push((status, body));
    }
    let refilled = (burst.elapsed().as_secs_f64() * 5.0).ceil() as u64;
    let passed = answers.iter().filter(|(s, _)| *s == StatusCode::OK).count() as u64;
    let refused: Vec<_> = answers
        .iter()
        .filter(|(s, _)| *s != StatusCode::OK)
        .collect();
    assert!(
        (50..=50 + refilled).contains(&passed),
        "{passed} of 60 passed, {refilled} tokens refilled at most"
    );
    assert!(
        refused
            .iter()
            .all(|(s, body)| *s == StatusCode::SERVICE_UNAVAILABLE
                && body.contains("<Code>RequestLimitExceeded</Code>"))
    );
    let counts = proxy.counts("UnassignIpv6Addresses");
    assert_eq!((counts.forwarded, counts.throttled), (passed, 60 - passed));

    // Other actions have buckets of their own, full: another mutating one, and 60 reads (the
    // non-mutating bucket holds 100).
    let (status, _) = post(proxy.url(), "Action=UnassignPrivateIpAddresses")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    for _ in 0..60 {
        let (status, _) = post(proxy.url(), "Action=DescribeSubnets").await.unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(proxy.counts("DescribeSubnets").throttled, 0);

    proxy.clear_token_buckets();
    let (status, _) = post(proxy.url(), "Action=UnassignIpv6Addresses")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn token_buckets_refill_and_combine_with_latency_rules() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    // One token, refilled in a second.
    let one = BucketLimits {
        capacity: 1.0,
        refill_per_second: 1.0,
    };
    proxy.set_token_buckets(TokenBuckets::ec2().with_class(ActionClass::Mutating, one));
    let latency = Duration::from_millis(100);
    proxy.set_rule(RouteMatch::Any, Rule::PASS.with_latency(latency));
    let started = Instant::now();
    let (first, _) = post(proxy.url(), "Action=UnassignIpv6Addresses")
        .await
        .unwrap();
    let (second, _) = post(proxy.url(), "Action=UnassignIpv6Addresses")
        .await
        .unwrap();
    // A throttled call is slow too: both calls waited for the rule's latency.
    assert!(started.elapsed() >= 2 * latency);
    assert_eq!(first, StatusCode::OK);
    // Unless the machine stalled for the whole refill in between, the bucket was empty.
    if started.elapsed() < Duration::from_secs(1) {
        assert_eq!(second, StatusCode::SERVICE_UNAVAILABLE);
    }
    // A bounded wait for the refill: the call passes again once a token is back.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = post(proxy.url(), "Action=UnassignIpv6Addresses")
            .await
            .unwrap();
        if status == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "the bucket never refilled");
    }
    let counts = proxy.counts("UnassignIpv6Addresses");
    assert!(counts.forwarded >= 2);
    assert_eq!(counts.total(), counts.forwarded + counts.throttled);
}

#[tokio::test]
async fn a_held_request_reaches_the_upstream_when_released_even_after_its_client_gave_up() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::builder(&upstream, Dialect::Ec2Query)
        .start()
        .await
        .unwrap();
    proxy.hold(RouteMatch::exact("AssignPrivateIpAddresses"));
    let url = proxy.url().to_owned();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        post(
            &url,
            "Action=AssignPrivateIpAddresses&PrivateIpAddress.1=10.0.0.5",
        ),
    )
    .await;
    assert!(gave_up.is_err(), "held: no answer");
    // Other routes pass meanwhile.
    let (status, _) = post(&url, "Action=DescribeInstances").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(proxy.held_now(), 1);
    let counts = proxy.counts("AssignPrivateIpAddresses");
    assert_eq!((counts.held, counts.forwarded), (1, 0));

    assert_eq!(proxy.release_held(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.counts("AssignPrivateIpAddresses").forwarded == 0 {
        assert!(
            Instant::now() < deadline,
            "the released request never went on"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(proxy.counts("AssignPrivateIpAddresses").addresses, 1);
    // No longer held: the next one is answered at once.
    let (status, body) = post(&url, "Action=AssignPrivateIpAddresses").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("echo POST"), "{body}");
}
