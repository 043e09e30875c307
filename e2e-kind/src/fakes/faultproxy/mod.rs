//! A fault-injection reverse proxy for cloud endpoints: it stands between a provider under test
//! and its cloud (moto, or one of the REST fakes) and, per route, adds latency, answers with
//! throttling errors or 500s, or drops the connection, as the test sets at run time through the
//! [`FaultProxy`] handle, or meters every route with a token bucket of its own as EC2 does
//! ([`FaultProxy::set_token_buckets`]). It counts every call per route, forwarded and injected,
//! so a test can assert how many cloud calls a behaviour cost. It can serve TLS with a test CA, so a provider's
//! custom-CA path runs for real. In front of EC2 it also plays EC2's part for terminated
//! instances, which moto does not ([`FaultProxy::terminate`]), and, when built with
//! [`Builder::refuse_reassignment`], EC2's refusal to assign an address another interface holds,
//! and with [`Builder::exact_associations`] the private IP of an Elastic IP's association.
//! It can hold a route's requests (or those of them whose body carries a text) until the test
//! lets them go ([`FaultProxy::hold`], [`FaultProxy::hold_carrying`]): a late call.

mod associations;
mod buckets;
mod dialect;
mod hold;
mod keys;
mod permissions;
mod reassignment;
mod rules;
mod termination;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use associations::Associations;
use buckets::Meter;
pub use buckets::{ActionClass, BucketLimits, TokenBucket, TokenBuckets};
pub use dialect::Dialect;
use hold::Holds;
use keys::AccessKeys;
pub use keys::KeyCounts;
pub use permissions::CREDENTIALS_REQUEST as EC2_CREDENTIALS_REQUEST;
use permissions::Policy;
use rules::Rules;
pub use rules::{Fate, RouteMatch, Rule};
pub use termination::TerminationPhase;
use termination::Terminations;

/// Calls seen on one route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteCounts {
    /// Sent on to the upstream.
    pub forwarded: u64,
    /// Answered with a throttling error by the proxy (a rule's draw or an empty token bucket).
    pub throttled: u64,
    /// Answered with a 500 by the proxy.
    pub server_errors: u64,
    /// Connections closed by the proxy without an answer.
    pub dropped: u64,
    /// Answered `…NotFound` by the proxy in EC2's place, for a terminated instance.
    pub not_found: u64,
    /// Answered `InvalidIPAddress.InUse` by the proxy in EC2's place: an address another
    /// interface holds, without `AllowReassignment` (see [`Builder::refuse_reassignment`]).
    pub refused: u64,
    /// Answered `UnauthorizedOperation` by the proxy in EC2's place: an action the policy does
    /// not allow (see [`Builder::permit`]).
    pub unauthorized: u64,
    /// Addresses named by the forwarded calls (EC2: the `PrivateIpAddress.N` and
    /// `Ipv6Addresses.N` parameters, plus any `SecondaryPrivateIpAddressCount` or
    /// `Ipv6AddressCount`), so IPs per call can be read at the proxy alone.
    pub addresses: u64,
    /// Held at the proxy until released ([`FaultProxy::hold`]); then counted as whatever became
    /// of them.
    pub held: u64,
}

impl RouteCounts {
    /// Calls the proxy answered or dropped itself.
    pub fn injected(&self) -> u64 {
        self.throttled
            + self.server_errors
            + self.dropped
            + self.not_found
            + self.refused
            + self.unauthorized
    }

    /// Every call seen.
    pub fn total(&self) -> u64 {
        self.forwarded + self.injected()
    }

    fn record(&mut self, fate: Fate) {
        match fate {
            Fate::Forward => self.forwarded += 1,
            Fate::Throttle => self.throttled += 1,
            Fate::ServerError => self.server_errors += 1,
            Fate::Drop => self.dropped += 1,
        }
    }
}

/// One forwarded call the proxy kept ([`Builder::record`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Its route (EC2: the action).
    pub route: String,
    /// Its form parameters, not percent-decoded.
    pub params: Vec<(String, String)>,
}

impl Recorded {
    /// The first value of parameter `key`.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find_map(|(k, v)| (k == key).then_some(v.as_str()))
    }
}

/// A call of a recorded route ([`Builder::record`]) that the upstream answered with success,
/// stamped when the answer came back through the proxy: when the cloud had done what it asked.
#[derive(Clone, Debug)]
pub struct Answered {
    /// When the upstream's answer reached the proxy.
    pub at: Instant,
    /// The call.
    pub call: Recorded,
}

/// A serving certificate and key (PEM) for a proxy that speaks TLS.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// Certificate chain, leaf first.
    pub cert_pem: String,
    /// The leaf's private key.
    pub key_pem: String,
}

impl From<&cloudnet_certs::Issued> for ServerTls {
    fn from(issued: &cloudnet_certs::Issued) -> Self {
        Self {
            cert_pem: issued.cert_pem.clone(),
            key_pem: issued.key_pem.clone(),
        }
    }
}

/// How to start a [`FaultProxy`].
#[derive(Debug)]
pub struct Builder {
    upstream: String,
    dialect: Dialect,
    tls: Option<ServerTls>,
    seed: u64,
    refuse_reassignment: bool,
    exact_associations: bool,
    policy: Option<Vec<String>>,
    record: Vec<String>,
}

impl Builder {
    /// In front of EC2: allow only these actions (IAM's check), refusing any other with EC2's
    /// 403 `UnauthorizedOperation`. [`EC2_CREDENTIALS_REQUEST`] is what OpenShift grants.
    pub fn permit<'a>(mut self, actions: impl IntoIterator<Item = &'a str>) -> Self {
        self.policy = Some(actions.into_iter().map(str::to_owned).collect());
        self
    }

    /// In front of EC2: refuse `AssignPrivateIpAddresses` naming an IPv4 address that another
    /// interface holds (unless it sets `AllowReassignment=true`) with EC2's
    /// `InvalidIPAddress.InUse`, as real EC2 does and moto does not. Costs one upstream
    /// `DescribeNetworkInterfaces` per such request.
    pub fn refuse_reassignment(mut self) -> Self {
        self.refuse_reassignment = true;
        self
    }

    /// In front of EC2: answer `DescribeAddresses` with the private IP each association was made
    /// with, as real EC2 does and moto does not (it shows the ENI's primary address).
    pub fn exact_associations(mut self) -> Self {
        self.exact_associations = true;
        self
    }

    /// Keep the parameters of every forwarded call of these routes (EC2: actions), for
    /// [`FaultProxy::recorded`] (and those answered with success, for [`FaultProxy::answered`]): what a fake does not itself keep (moto ignores
    /// `AssociateAddress`'s `PrivateIpAddress`) can be asserted on what was asked of it.
    pub fn record<'a>(mut self, routes: impl IntoIterator<Item = &'a str>) -> Self {
        self.record = routes.into_iter().map(str::to_owned).collect();
        self
    }

    /// Serve TLS with this certificate instead of plain HTTP.
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Seed of the random draws (default 0), so a failing run can be replayed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Binds 127.0.0.1 on a free port and starts serving on the calling tokio runtime.
    pub async fn start(self) -> Result<FaultProxy> {
        let upstream: Uri = self
            .upstream
            .parse()
            .with_context(|| format!("upstream URL {:?}", self.upstream))?;
        if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
            bail!("upstream must be an http://host:port URL, got {upstream}");
        }
        let acceptor = self.tls.as_ref().map(acceptor).transpose()?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy port")?;
        let addr = listener.local_addr()?;
        let scheme = if acceptor.is_some() { "https" } else { "http" };
        let shared = Arc::new(Shared {
            upstream,
            dialect: self.dialect,
            refuse_reassignment: self.refuse_reassignment && self.dialect == Dialect::Ec2Query,
            associations: (self.exact_associations && self.dialect == Dialect::Ec2Query)
                .then(Mutex::default),
            policy: self
                .policy
                .filter(|_| self.dialect == Dialect::Ec2Query)
                .map(|actions| Policy::new(actions.iter().map(String::as_str))),
            rules: Mutex::new(Rules::new(self.seed)),
            counts: Mutex::new(BTreeMap::new()),
            terminations: Mutex::new(Terminations::default()),
            keys: Mutex::new(AccessKeys::default()),
            meter: Mutex::new(None),
            holds: Mutex::new(Holds::default()),
            record: self.record,
            recorded: Mutex::default(),
            answered: Mutex::default(),
            arrivals: Mutex::default(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            next_request_id: AtomicU64::new(1),
        });
        let accept = tokio::spawn(crate::fakes::serve::accept_loop(listener, acceptor, {
            let shared = Arc::clone(&shared);
            move |request| receive(Arc::clone(&shared), request)
        }));
        Ok(FaultProxy {
            url: format!("{scheme}://{addr}"),
            addr,
            shared,
            accept,
        })
    }
}

/// A running proxy. Dropping it closes the port and every open connection.
#[derive(Debug)]
pub struct FaultProxy {
    url: String,
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy in front of `upstream` (an `http://` URL) speaking `dialect`.
    pub fn builder(upstream: impl Into<String>, dialect: Dialect) -> Builder {
        Builder {
            upstream: upstream.into(),
            dialect,
            tls: None,
            seed: 0,
            refuse_reassignment: false,
            exact_associations: false,
            policy: None,
            record: Vec::new(),
        }
    }

    /// The URL clients use, `http://127.0.0.1:<port>` (or `https://`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Applies `rule` to the routes `matcher` selects, replacing an earlier rule for `matcher`.
    pub fn set_rule(&self, matcher: RouteMatch, rule: Rule) {
        lock(&self.shared.rules).set(matcher, rule);
    }

    /// Removes every rule: requests are forwarded untouched.
    pub fn clear_rules(&self) {
        lock(&self.shared.rules).clear();
    }

    /// Meters every route with a token bucket of its own, sized by `buckets`, all full now; a
    /// call finding its bucket empty gets the dialect's throttling answer (counted as
    /// `throttled`). Rules still apply to the calls a bucket admits, and their latency to every
    /// call. Replaces earlier buckets.
    pub fn set_token_buckets(&self, buckets: TokenBuckets) {
        *lock(&self.shared.meter) = Some(Meter::new(buckets));
    }

    /// Ends token-bucket metering.
    pub fn clear_token_buckets(&self) {
        *lock(&self.shared.meter) = None;
    }

    /// Restarts the random draws from `seed`.
    pub fn reseed(&self, seed: u64) {
        lock(&self.shared.rules).reseed(seed);
    }

    /// The calls seen on `route` so far.
    pub fn counts(&self, route: &str) -> RouteCounts {
        lock(&self.shared.counts)
            .get(route)
            .copied()
            .unwrap_or_default()
    }

    /// When the first and the latest call reached the proxy (their bodies read), whatever
    /// became of them: a test that polls learns when calls came, not when it looked.
    pub fn arrivals(&self) -> Option<(Instant, Instant)> {
        *lock(&self.shared.arrivals)
    }

    /// The calls seen so far, per route.
    pub fn all_counts(&self) -> BTreeMap<String, RouteCounts> {
        lock(&self.shared.counts).clone()
    }

    /// The calls forwarded so far on every route `select` accepts.
    pub fn forwarded_where(&self, select: impl Fn(&str) -> bool) -> u64 {
        lock(&self.shared.counts)
            .iter()
            .filter(|(route, _)| select(route))
            .map(|(_, c)| c.forwarded)
            .sum()
    }

    /// The forwarded calls of the routes given to [`Builder::record`], oldest first: each route
    /// with its form parameters (body, then query string).
    pub fn recorded(&self) -> Vec<Recorded> {
        lock(&self.shared.recorded).clone()
    }

    /// Of those calls, the ones the upstream answered with success from the `skip`th on, oldest
    /// answer first, each stamped when its answer came back.
    pub fn answered(&self, skip: usize) -> Vec<Answered> {
        lock(&self.shared.answered)
            .iter()
            .skip(skip)
            .cloned()
            .collect()
    }

    /// Sets every counter back to zero.
    pub fn reset_counts(&self) {
        lock(&self.shared.counts).clear();
    }

    /// From now on shows EC2 `instance` as real EC2 shows a terminated one: its `enis` (the
    /// interfaces deleted with it, the primary one at least) answer
    /// `InvalidNetworkInterfaceID.NotFound` and leave every listing; the instance is
    /// [`TerminationPhase::Listed`] for `listed_for` (`None`: until [`Self::forget`]), then
    /// [`TerminationPhase::Gone`]. Terminate it in moto too, so moto's own answers agree.
    pub fn terminate(&self, instance: &str, enis: &[&str], listed_for: Option<Duration>) {
        lock(&self.shared.terminations).terminate(instance, enis, listed_for, Instant::now());
    }

    /// Moves a terminated `instance` to [`TerminationPhase::Gone`] now; false if
    /// [`Self::terminate`] was not called for it.
    pub fn forget(&self, instance: &str) -> bool {
        lock(&self.shared.terminations).forget(instance, Instant::now())
    }

    /// From now on only calls signed with access key `key` pass (EC2 dialect); any other key
    /// gets EC2's `AuthFailure`, as after a rotation that deactivated the old key. `None`: every
    /// key passes again.
    pub fn accept_only_key(&self, key: Option<&str>) {
        lock(&self.shared.keys).accept_only(key.map(str::to_owned));
    }

    /// The calls seen so far per signing access key (EC2 dialect).
    pub fn key_counts(&self) -> BTreeMap<String, KeyCounts> {
        lock(&self.shared.keys).counts()
    }

    /// Sets the per-key counters back to zero.
    pub fn reset_key_counts(&self) {
        lock(&self.shared.keys).reset_counts();
    }

    /// From now on holds the requests `matcher` selects at the proxy, before anything else
    /// happens to them, until [`Self::release_held`]; a held request then goes on as if it had
    /// just arrived, even if its client has given up meanwhile (a late call).
    pub fn hold(&self, matcher: RouteMatch) {
        lock(&self.shared.holds).hold(matcher);
    }

    /// [`Self::hold`] for the requests `matcher` selects whose body carries `text` (ASCII case
    /// ignored): one writer's PUT of a resource held while another's goes through.
    pub fn hold_carrying(&self, matcher: RouteMatch, text: &str) {
        lock(&self.shared.holds).hold_where(matcher, Some(text));
    }

    /// How many requests are held now.
    pub fn held_now(&self) -> usize {
        lock(&self.shared.holds).waiting()
    }

    /// Stops holding and lets every held request go on; returns how many were held.
    pub fn release_held(&self) -> usize {
        lock(&self.shared.holds).release()
    }

    /// The phase of `instance`, if it was terminated through [`Self::terminate`].
    pub fn termination_phase(&self, instance: &str) -> Option<TerminationPhase> {
        lock(&self.shared.terminations).phase(instance, Instant::now())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the connection tasks; aborting it drops (and aborts) them all.
        self.accept.abort();
        // Held requests wait in tasks of their own: they end unsent.
        lock(&self.shared.holds).abandon();
    }
}

#[derive(Debug)]
struct Shared {
    upstream: Uri,
    dialect: Dialect,
    refuse_reassignment: bool,
    associations: Option<Mutex<Associations>>,
    policy: Option<Policy>,
    rules: Mutex<Rules>,
    counts: Mutex<BTreeMap<String, RouteCounts>>,
    terminations: Mutex<Terminations>,
    keys: Mutex<AccessKeys>,
    meter: Mutex<Option<Meter>>,
    holds: Mutex<Holds>,
    record: Vec<String>,
    recorded: Mutex<Vec<Recorded>>,
    answered: Mutex<Vec<Answered>>,
    /// When the first and the latest call reached the proxy.
    arrivals: Mutex<Option<(Instant, Instant)>>,
    client: Client<HttpConnector, Full<Bytes>>,
    next_request_id: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Counters and rules stay meaningful even if a holder panicked.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn acceptor(tls: &ServerTls) -> Result<TlsAcceptor> {
    let certs = CertificateDer::pem_slice_iter(tls.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("parsing the proxy certificate")?;
    let key =
        PrivateKeyDer::from_pem_slice(tls.key_pem.as_bytes()).context("parsing the proxy key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("building the proxy TLS config")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Reads a request and handles it; a held one is handled in a task of its own, so that it still
/// reaches the upstream after its client has gone.
async fn receive(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let route = shared
        .dialect
        .route(&parts.method, parts.uri.path(), parts.uri.query(), &body);
    {
        let now = Instant::now();
        let mut arrivals = lock(&shared.arrivals);
        *arrivals = Some((arrivals.map_or(now, |(first, _)| first), now));
    }
    let Some(held) = lock(&shared.holds).wait(&route, &body) else {
        return handle(shared, parts, body, route).await;
    };
    lock(&shared.counts).entry(route.clone()).or_default().held += 1;
    let late = tokio::spawn(async move {
        // A proxy dropped meanwhile drops the sender too: the request is then simply lost.
        held.await.ok()?;
        Some(handle(shared, parts, body, route).await)
    });
    match late.await {
        Ok(Some(answer)) => answer,
        _ => Err(std::io::Error::other("held request dropped with the proxy")),
    }
}

/// Returning an error makes hyper close the connection without an answer: an injected drop.
async fn handle(
    shared: Arc<Shared>,
    parts: http::request::Parts,
    body: Bytes,
    route: String,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    if let Some(refusal) = key_refusal(&shared, &parts.headers) {
        return Ok(refusal);
    }
    if let Some(policy) = &shared.policy {
        let request_id = shared.next_request_id.fetch_add(1, Ordering::Relaxed);
        if let Some(refusal) = policy.refusal(&route, request_id) {
            lock(&shared.counts).entry(route).or_default().unauthorized += 1;
            return Ok(refusal);
        }
    }
    // EC2 takes the token on arrival, whatever then becomes of the call.
    let admitted = lock(&shared.meter)
        .as_mut()
        .is_none_or(|meter| meter.admit(&route, Instant::now()));
    let (rule, fate) = {
        let mut rules = lock(&shared.rules);
        let rule = rules.rule_for(&route);
        let fate = if admitted {
            rules.draw(&rule)
        } else {
            Fate::Throttle
        };
        (rule, fate)
    };
    // A throttled or failed call never reaches EC2, so EC2's own refusals only stand in for a
    // forwarded one.
    let refusal = match (fate, shared.dialect) {
        (Fate::Forward, Dialect::Ec2Query) => {
            let params = || {
                dialect::form_pairs(&body).chain(dialect::form_pairs(
                    parts.uri.query().unwrap_or("").as_bytes(),
                ))
            };
            let not_found = lock(&shared.terminations).refusal(params(), Instant::now());
            match not_found {
                Some(refusal) => Some((refusal, false)),
                None if shared.refuse_reassignment && route == "AssignPrivateIpAddresses" => {
                    in_use_refusal(&shared, &parts, params())
                        .await
                        .map(|refusal| (refusal, true))
                }
                None => None,
            }
        }
        _ => None,
    };
    {
        let mut counts = lock(&shared.counts);
        let counts = counts.entry(route.clone()).or_default();
        match refusal {
            Some((_, true)) => counts.refused += 1,
            Some((_, false)) => counts.not_found += 1,
            None => counts.record(fate),
        }
        if refusal.is_none() && fate == Fate::Forward {
            counts.addresses += shared.dialect.addresses(&body, parts.uri.query());
        }
    }
    if refusal.is_none() && fate == Fate::Forward && shared.record.contains(&route) {
        let params = dialect::form_pairs(&body)
            .chain(dialect::form_pairs(
                parts.uri.query().unwrap_or("").as_bytes(),
            ))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        lock(&shared.recorded).push(Recorded {
            route: route.clone(),
            params,
        });
    }
    if !rule.latency.is_zero() {
        tokio::time::sleep(rule.latency).await;
    }
    let request_id = shared.next_request_id.fetch_add(1, Ordering::Relaxed);
    if let Some((refusal, _)) = refusal {
        return Ok(dialect::refused(refusal.code, &refusal.message, request_id));
    }
    match fate {
        Fate::Drop => Err(std::io::Error::other("fault injected: connection dropped")),
        Fate::Throttle => Ok(shared.dialect.throttled(request_id)),
        Fate::ServerError => Ok(shared.dialect.server_error(request_id)),
        Fate::Forward => {
            let rewrite = shared.dialect == Dialect::Ec2Query && route.starts_with("Describe");
            let query = parts.uri.query().unwrap_or("").to_owned();
            let answer = forward(&shared, parts, body.clone(), rewrite).await;
            if answer.status().is_success() && shared.record.contains(&route) {
                let params = dialect::form_pairs(&body)
                    .chain(dialect::form_pairs(query.as_bytes()))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                lock(&shared.answered).push(Answered {
                    at: Instant::now(),
                    call: Recorded {
                        route: route.clone(),
                        params,
                    },
                });
            }
            match &shared.associations {
                Some(associations) => {
                    exact_association(associations, &route, &body, &query, answer).await
                }
                None => Ok(answer),
            }
        }
    }
}

/// `answer` to a forwarded call of `route` as EC2 gives it where moto keeps no association's
/// private IP: an `AssociateAddress` is noted, a `DescribeAddresses` corrected.
async fn exact_association(
    associations: &Mutex<Associations>,
    route: &str,
    body: &[u8],
    query: &str,
    answer: Response<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    if !answer.status().is_success() || !matches!(route, "AssociateAddress" | "DescribeAddresses") {
        return Ok(answer);
    }
    let (mut parts, full) = answer.into_parts();
    let bytes = full
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let edited = if route == "AssociateAddress" {
        let params = dialect::form_pairs(body).chain(dialect::form_pairs(query.as_bytes()));
        lock(associations).made(params, &text);
        None
    } else {
        lock(associations).rewrite(&text)
    };
    let bytes = match edited {
        Some(edited) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            Bytes::from(edited)
        }
        None => bytes,
    };
    Ok(Response::from_parts(parts, Full::new(bytes)))
}

/// EC2 checks the signature before anything else: a call signed with a key it does not accept
/// is refused whatever it asks, and costs no token.
fn key_refusal(shared: &Shared, headers: &http::HeaderMap) -> Option<Response<Full<Bytes>>> {
    if shared.dialect != Dialect::Ec2Query {
        return None;
    }
    lock(&shared.keys).refusal(headers, || {
        shared.next_request_id.fetch_add(1, Ordering::Relaxed)
    })
}

/// EC2's `InvalidIPAddress.InUse` for an `AssignPrivateIpAddresses` with these parameters, if
/// another interface holds one of its addresses: which one does is read from the upstream (with
/// the request's own headers, so the same account and region answer). An upstream that cannot be
/// read refuses nothing: the request is then forwarded as it is.
async fn in_use_refusal<'a>(
    shared: &Shared,
    parts: &http::request::Parts,
    params: impl Iterator<Item = (&'a str, &'a str)>,
) -> Option<termination::Refusal> {
    let request = reassignment::AssignRequest::parse(params)?;
    let mut describe = Request::new(());
    *describe.method_mut() = http::Method::POST;
    *describe.uri_mut() = Uri::from_static("/");
    *describe.headers_mut() = parts.headers.clone();
    let (mut describe, ()) = describe.into_parts();
    describe.headers.remove(header::CONTENT_LENGTH);
    describe.headers.insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    let body = Bytes::from_static(b"Action=DescribeNetworkInterfaces&Version=2016-11-15");
    // Rewritten as EC2 would answer: a terminated instance's deleted interfaces hold nothing.
    let answer = forward(shared, describe, body, true).await;
    if !answer.status().is_success() {
        return None;
    }
    let text = answer.into_body().collect().await.ok()?.to_bytes();
    let holders = reassignment::holders(std::str::from_utf8(&text).ok()?)?;
    request.refusal(&holders)
}

/// Sends the request upstream and returns its answer; with `rewrite`, an answer EC2 would give
/// differently for a terminated instance is edited first.
async fn forward(
    shared: &Shared,
    mut parts: http::request::Parts,
    body: Bytes,
    rewrite: bool,
) -> Response<Full<Bytes>> {
    let mut uri = shared.upstream.clone().into_parts();
    uri.path_and_query = parts.uri.path_and_query().cloned();
    parts.uri = match Uri::from_parts(uri) {
        Ok(uri) => uri,
        Err(e) => return bad_gateway(format!("building the upstream URL: {e}")),
    };
    // The upstream speaks HTTP/1.1 whatever the client spoke to us.
    parts.version = http::Version::HTTP_11;
    parts.headers.remove(header::CONNECTION);
    let response = match shared
        .client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(response) => response,
        Err(e) => return bad_gateway(format!("upstream unreachable: {e}")),
    };
    let (mut parts, body) = response.into_parts();
    let mut body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return bad_gateway(format!("reading the upstream answer: {e}")),
    };
    if rewrite && parts.status.is_success() {
        let edited = std::str::from_utf8(&body)
            .ok()
            .and_then(|text| lock(&shared.terminations).rewrite(text, Instant::now()));
        if let Some(edited) = edited {
            body = Bytes::from(edited);
            parts.headers.remove(header::CONTENT_LENGTH);
        }
    }
    // hyper sets the framing for the buffered body itself.
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts.headers.remove(header::CONNECTION);
    Response::from_parts(parts, Full::new(body))
}

fn bad_gateway(message: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message)));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}
