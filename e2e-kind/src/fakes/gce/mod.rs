//! A GCE fake: the few Compute v1 methods the GCP provider calls, with GCE's semantics, on a
//! free 127.0.0.1 port, speaking the real REST wire format to the real client library.
//!
//! Served: `instances.get`, `instances.list`, `instances.aggregatedList`,
//! `instances.updateNetworkInterface`,
//! `zoneOperations.get`, `zoneOperations.wait`, `subnetworks.get`. Semantics kept:
//! * NIC fingerprints are 8 random bytes in URL-safe base64 that rotate on every accepted change;
//!   a PATCH without one is a 400, with a stale one a 412 (`conditionNotMet`).
//! * PATCH semantics: a field absent from the body is unchanged; only `aliasIpRanges` may change.
//! * Aliases must lie in the NIC's subnetwork (the primary range, or the secondary range named
//!   by `subnetworkRangeName`), else a 400; an IP another NIC uses (its own address or one of
//!   its aliases) fails the operation with `IP_IN_USE_BY_ANOTHER_RESOURCE`.
//! * `instances.list` and `instances.aggregatedList` take the filter the discovery document
//!   describes, as far as names go: `(name = "a") OR (name = "b")`, one bare `name = "a"`, or one
//!   `name eq "<RE2 expression>"` matching the whole name (any other filter is a 400 and a
//!   violation). They page by `maxResults` (at most 500) and `pageToken`; the fake may cut pages
//!   shorter ([`GceFake::set_list_page_size`]), as GCE may. An aggregated page holds its instances
//!   by `zones/<zone>`, and a zone of the project with none on the page as a
//!   `NO_RESULTS_ON_PAGE` warning, as GCE answers.
//! * A change is an operation that goes PENDING → RUNNING → DONE over a configurable delay and
//!   takes effect when DONE; `wait` answers when it is DONE (or after a bound).
//! * Every request body, every response body and every query parameter is checked against the
//!   discovery document ([`schema`]); a departure is answered with a 400 and recorded in
//!   [`GceFake::violations`], which tests assert empty. Any `$apiVersion` is accepted.
//!
//! Also served, for credentials: Google's OAuth token endpoint (a refresh-token grant), and the
//! two steps of workload identity federation as OpenShift configures it: the STS token exchange
//! of a projected ServiceAccount token ([`STS_TOKEN_PATH`]) and the service account
//! impersonation (`generateAccessToken`) with the STS token. Compute calls' bearer tokens are
//! recorded ([`GceFake::bearers`]).
//!
//! Latency, throttling and 5xx come from the fault proxy in front
//! ([`crate::fakes::faultproxy::Dialect::Gce`]).

// A handler's error is the HTTP answer it sends; boxing it would buy nothing in a test server.
#![allow(clippy::result_large_err)]

pub mod schema;

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use ipnet::Ipv4Net;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use schema::Discovery;

/// The host GCE writes into `selfLink`s and resource URLs.
pub const LINK_BASE: &str = "https://www.googleapis.com/compute/v1";

/// The longest `zoneOperations.wait` holds an answer (GCE: about two minutes).
const WAIT_BOUND: Duration = Duration::from_secs(120);

/// A subnetwork the fake serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetSpec {
    /// The network's project (the host project in a shared VPC).
    pub project: String,
    /// Its region.
    pub region: String,
    /// Its name.
    pub name: String,
    /// The primary range.
    pub primary: Ipv4Net,
    /// Secondary ranges by name.
    pub secondary: Vec<(String, Ipv4Net)>,
    /// The IPv6 range of a dual-stack subnetwork (`ipv6CidrRange`).
    pub ipv6: Option<ipnet::Ipv6Net>,
}

impl SubnetSpec {
    /// The subnetwork's URL, as a NIC names it.
    pub fn url(&self) -> String {
        format!(
            "{LINK_BASE}/projects/{}/regions/{}/subnetworks/{}",
            self.project, self.region, self.name
        )
    }
}

/// A VM the fake serves: one NIC, `nic0`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSpec {
    /// The VM's project.
    pub project: String,
    /// Its zone.
    pub zone: String,
    /// Its name.
    pub name: String,
    /// The subnetwork of `nic0` (project, region, name of a [`SubnetSpec`]).
    pub subnet: (String, String, String),
    /// `nic0`'s own address.
    pub network_ip: Ipv4Addr,
}

impl InstanceSpec {
    /// The Node's providerID for this VM.
    pub fn provider_id(&self) -> String {
        format!("gce://{}/{}/{}", self.project, self.zone, self.name)
    }
}

#[derive(Clone, Debug)]
struct Alias {
    cidr: Ipv4Net,
    range: Option<String>,
}

#[derive(Debug)]
struct Vm {
    id: u64,
    spec: InstanceSpec,
    fingerprint: [u8; 8],
    aliases: Vec<Alias>,
}

#[derive(Debug)]
struct Op {
    id: u64,
    name: String,
    project: String,
    zone: String,
    target: (String, String, String),
    target_id: u64,
    created: Instant,
    /// The alias list the operation sets when it finishes.
    aliases: Vec<Alias>,
    done: Option<Result<(), (String, String)>>,
}

#[derive(Debug, Default)]
struct State {
    subnets: BTreeMap<(String, String, String), SubnetSpec>,
    vms: BTreeMap<(String, String, String), Vm>,
    ops: HashMap<(String, String, String), Op>,
    next_id: u64,
    violations: Vec<String>,
    calls: BTreeMap<String, u64>,
    operation_delay: Duration,
    require_auth: bool,
    /// The IAM permissions granted; `None` grants all.
    permissions: Option<Vec<String>>,
    /// Subject tokens the STS exchange was given, in order.
    subject_tokens: Vec<String>,
    /// Tokens the STS exchange issued.
    sts_tokens: Vec<String>,
    /// Bearer tokens on Compute calls, with their count.
    bearers: BTreeMap<String, u64>,
    /// Most items one `instances.list` page holds; `None`: as `maxResults` asks.
    list_page_size: Option<usize>,
}

/// The GCP permissions OpenShift grants the cloud network config controller: its
/// CredentialsRequest `openshift-cloud-network-config-controller-gcp`
/// (openshift/cluster-network-operator, `manifests/02-cncc-credentials.yaml`).
pub const CREDENTIALS_REQUEST: [&str; 5] = [
    "compute.instances.updateNetworkInterface",
    "compute.subnetworks.use",
    "compute.subnetworks.get",
    "compute.zoneOperations.get",
    "compute.instances.get",
];

/// The IAM permissions Compute Engine checks for a method: the method's own and, for a network
/// interface update (whose alias ranges come from the instance's subnetwork), using the subnetwork.
fn permissions_for(resource: &str, method: &str) -> &'static [&'static str] {
    match (resource, method) {
        ("instances", "get") => &["compute.instances.get"],
        ("instances", "list" | "aggregatedList") => &["compute.instances.list"],
        ("instances", "updateNetworkInterface") => &[
            "compute.instances.updateNetworkInterface",
            "compute.subnetworks.use",
        ],
        ("zoneOperations", "get" | "wait") => &["compute.zoneOperations.get"],
        ("subnetworks", "get") => &["compute.subnetworks.get"],
        _ => &[],
    }
}

struct Shared {
    state: Mutex<State>,
    discovery: Arc<Discovery>,
    changed: Notify,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running GCE fake. Dropping it stops the server.
pub struct GceFake {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for GceFake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceFake").field("addr", &self.addr).finish()
    }
}

impl Drop for GceFake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GceFake {
    /// Starts a fake that checks bodies against the installed discovery document.
    pub async fn start() -> Result<Self> {
        static DISCOVERY: tokio::sync::OnceCell<Arc<Discovery>> =
            tokio::sync::OnceCell::const_new();
        let discovery = DISCOVERY
            .get_or_try_init(|| async {
                tokio::task::spawn_blocking(Discovery::installed)
                    .await?
                    .map(Arc::new)
            })
            .await?;
        Self::with_discovery(Arc::clone(discovery)).await
    }

    /// Starts a fake that checks bodies against `discovery`.
    pub async fn with_discovery(discovery: Arc<Discovery>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the GCE fake")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_id: 1_000_000,
                operation_delay: Duration::from_millis(50),
                permissions: Some(CREDENTIALS_REQUEST.map(str::to_owned).to_vec()),
                ..State::default()
            }),
            discovery,
            changed: Notify::new(),
        });
        let task = tokio::spawn(crate::fakes::serve::accept_loop(listener, None, {
            let shared = Arc::clone(&shared);
            move |request| handle(Arc::clone(&shared), request)
        }));
        Ok(Self { shared, addr, task })
    }

    /// `http://127.0.0.1:<port>`: the `--platform-api-url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves `subnet`.
    pub fn add_subnet(&self, subnet: SubnetSpec) {
        let key = (
            subnet.project.clone(),
            subnet.region.clone(),
            subnet.name.clone(),
        );
        self.shared.state().subnets.insert(key, subnet);
    }

    /// Serves `vm`, with no aliases.
    pub fn add_instance(&self, vm: InstanceSpec) -> Result<()> {
        let mut state = self.shared.state();
        if !state.subnets.contains_key(&vm.subnet) {
            bail!("subnet {:?} is not served", vm.subnet);
        }
        state.next_id += 1;
        let vm = Vm {
            id: state.next_id,
            fingerprint: rand::random(),
            aliases: Vec::new(),
            spec: vm,
        };
        let key = (
            vm.spec.project.clone(),
            vm.spec.zone.clone(),
            vm.spec.name.clone(),
        );
        state.vms.insert(key, vm);
        Ok(())
    }

    /// Deletes a VM (its aliases go with it).
    pub fn delete_instance(&self, project: &str, zone: &str, name: &str) -> bool {
        let key = (project.to_owned(), zone.to_owned(), name.to_owned());
        self.shared.state().vms.remove(&key).is_some()
    }

    /// `nic0`'s aliases now, as `ipCidrRange` strings.
    pub fn aliases(&self, project: &str, zone: &str, name: &str) -> Vec<String> {
        self.aliases_at_once(project, zone, &[name])
            .pop()
            .unwrap_or_default()
    }

    /// The aliases of several VMs in one zone, read at one instant (a consistent snapshot), in
    /// the order of `names`.
    pub fn aliases_at_once(&self, project: &str, zone: &str, names: &[&str]) -> Vec<Vec<String>> {
        let mut state = self.shared.state();
        advance(&mut state, Instant::now());
        names
            .iter()
            .map(|name| {
                let key = (project.to_owned(), zone.to_owned(), (*name).to_owned());
                state
                    .vms
                    .get(&key)
                    .map(|vm| vm.aliases.iter().map(|a| a.cidr.to_string()).collect())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Sets `nic0`'s aliases as another client would (the fingerprint rotates).
    pub fn set_aliases(&self, project: &str, zone: &str, name: &str, cidrs: &[&str]) -> Result<()> {
        let key = (project.to_owned(), zone.to_owned(), name.to_owned());
        let mut state = self.shared.state();
        let vm = state.vms.get_mut(&key).context("no such instance")?;
        vm.aliases = cidrs
            .iter()
            .map(|c| {
                Ok(Alias {
                    cidr: c.parse().with_context(|| format!("bad CIDR {c}"))?,
                    range: None,
                })
            })
            .collect::<Result<_>>()?;
        vm.fingerprint = rand::random();
        Ok(())
    }

    /// How long an operation takes from PENDING to DONE (half of it RUNNING).
    pub fn set_operation_delay(&self, delay: Duration) {
        self.shared.state().operation_delay = delay;
    }

    /// The IAM permissions the caller holds (`None`: all). From the start the fake grants exactly
    /// [`CREDENTIALS_REQUEST`]; a call needing any other is refused with GCE's 403.
    pub fn grant(&self, permissions: Option<Vec<String>>) {
        self.shared.state().permissions = permissions;
    }

    /// The subject tokens the STS exchange received, in order.
    pub fn subject_tokens(&self) -> Vec<String> {
        self.shared.state().subject_tokens.clone()
    }

    /// The bearer tokens Compute calls carried, with how many calls carried each.
    pub fn bearers(&self) -> BTreeMap<String, u64> {
        self.shared.state().bearers.clone()
    }

    /// Cuts `instances.list` pages to `size` items (`None`: as `maxResults` asks).
    pub fn set_list_page_size(&self, size: Option<usize>) {
        self.shared.state().list_page_size = size;
    }

    /// Whether requests without `Authorization: Bearer` are refused with 401.
    pub fn require_auth(&self, on: bool) {
        self.shared.state().require_auth = on;
    }

    /// Every request or response that departed from the discovery document, or called a method
    /// the fake does not know.
    pub fn violations(&self) -> Vec<String> {
        self.shared.state().violations.clone()
    }

    /// Calls per method id (`compute.instances.updateNetworkInterface`, ...), answered or not.
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.shared.state().calls.clone()
    }
}

/// The VMs' project in [`GceFake::add_standard_vm`]'s world.
pub const PROJECT: &str = "cloudnet-test";
/// The network's project there: a shared VPC, so subnet URLs name another project.
pub const HOST_PROJECT: &str = "cloudnet-host";
/// The zone there.
pub const ZONE: &str = "us-central1-a";
/// The region there.
pub const REGION: &str = "us-central1";
/// The subnetwork there.
pub const SUBNET: &str = "nodes";

impl GceFake {
    /// The subnetwork of the standard world: primary 10.0.0.0/24 (GCE reserves .0, .1, .254
    /// and .255) and secondary range `egress` 10.4.0.0/16, in the host project.
    pub fn standard_subnet() -> SubnetSpec {
        SubnetSpec {
            project: HOST_PROJECT.into(),
            region: REGION.into(),
            name: SUBNET.into(),
            primary: Ipv4Net::new(Ipv4Addr::new(10, 0, 0, 0), 24).unwrap_or_default(),
            secondary: vec![(
                "egress".into(),
                Ipv4Net::new(Ipv4Addr::new(10, 4, 0, 0), 16).unwrap_or_default(),
            )],
            ipv6: None,
        }
    }

    /// Adds VM `name` with address `network_ip` in the standard world (subnet included).
    pub fn add_standard_vm(&self, name: &str, network_ip: Ipv4Addr) -> Result<InstanceSpec> {
        let subnet = Self::standard_subnet();
        let key = (
            subnet.project.clone(),
            subnet.region.clone(),
            subnet.name.clone(),
        );
        if !self.shared.state().subnets.contains_key(&key) {
            self.add_subnet(subnet);
        }
        let vm = InstanceSpec {
            project: PROJECT.into(),
            zone: ZONE.into(),
            name: name.into(),
            subnet: key,
            network_ip,
        };
        self.add_instance(vm.clone())?;
        Ok(vm)
    }
}

/// Writes `service_account.json` into `dir` as OpenShift's Cloud Credential Operator does for
/// workload identity (`ccoctl gcp`): an external account whose subject token is the projected
/// ServiceAccount token in `token_file`, exchanged at the fake's STS and then impersonating
/// [`IMPERSONATED_ACCOUNT`] there. Returns its path.
pub fn write_workload_identity(
    dir: &std::path::Path,
    fake_url: &str,
    token_file: &std::path::Path,
) -> Result<std::path::PathBuf> {
    let json = json!({
        "type": "external_account",
        "audience": "//iam.googleapis.com/projects/123456789/locations/global/workloadIdentityPools/cloudnet-e2e/providers/cloudnet-e2e",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": format!("{fake_url}{STS_TOKEN_PATH}"),
        "service_account_impersonation_url": format!(
            "{fake_url}/v1/projects/-/serviceAccounts/{IMPERSONATED_ACCOUNT}:generateAccessToken"
        ),
        "credential_source": {"file": token_file, "format": {"type": "text"}},
    });
    std::fs::create_dir_all(dir)?;
    let path = dir.join("service_account.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&json)?)?;
    Ok(path)
}

/// Writes a service account key file (a fresh RSA key from `openssl`, for tests only) into
/// `dir` as `service_account.json`, the secret's layout, and returns its path.
pub fn write_service_account(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let output = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .context("running openssl genpkey")?;
    if !output.status.success() {
        bail!(
            "openssl genpkey: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let key = String::from_utf8(output.stdout).context("openssl printed non-UTF-8")?;
    let json = json!({
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "0123456789abcdef",
        "private_key": key,
        "client_email": format!("cloudnet@{PROJECT}.iam.gserviceaccount.com"),
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    });
    let path = dir.join("service_account.json");
    std::fs::write(&path, json.to_string())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

type Answer = Response<Full<Bytes>>;

async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Answer, std::convert::Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "badRequest",
                "unreadable body",
            ));
        }
    };
    Ok(route(&shared, &parts, &body).await)
}

/// The path of the fake's OAuth 2.0 token endpoint (Google's is
/// `https://oauth2.googleapis.com/token`): a credential's `token_uri` may name it.
pub const OAUTH_TOKEN_PATH: &str = "/token";
/// How [`GceFake::calls`] counts the token endpoint's exchanges.
pub const OAUTH_TOKEN_CALL: &str = "oauth2.token";

/// Google's token endpoint for a refresh-token grant (an `authorized_user` credential): a
/// bearer token for any client and refresh token, refused without them as Google refuses
/// (`invalid_request`).
fn oauth_token(shared: &Shared, body: &Bytes) -> Answer {
    let n = {
        let mut state = shared.state();
        *state.calls.entry(OAUTH_TOKEN_CALL.to_owned()).or_default() += 1;
        state.next_id += 1;
        state.next_id
    };
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let field = |name: &str| request[name].as_str().filter(|v| !v.is_empty());
    if field("grant_type") != Some("refresh_token")
        || field("refresh_token").is_none()
        || field("client_id").is_none()
    {
        let body = json!({"error": "invalid_request",
                          "error_description": "grant_type refresh_token with client_id and refresh_token required"});
        let mut answer = Response::new(Full::new(Bytes::from(body.to_string())));
        *answer.status_mut() = StatusCode::BAD_REQUEST;
        return answer;
    }
    let body = json!({"access_token": format!("ya29.cloudnet-e2e-{n}"), "expires_in": 3599,
                      "token_type": "Bearer"});
    let mut answer = Response::new(Full::new(Bytes::from(body.to_string())));
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    answer
}

/// The STS token exchange's path (`https://sts.googleapis.com/v1/token` in Google's cloud).
pub const STS_TOKEN_PATH: &str = "/v1/token";
/// How [`GceFake::calls`] counts STS exchanges.
pub const STS_TOKEN_CALL: &str = "sts.token";
/// How [`GceFake::calls`] counts service account impersonations.
pub const IMPERSONATION_CALL: &str = "iamcredentials.generateAccessToken";
/// The service account a workload identity configuration impersonates.
pub const IMPERSONATED_ACCOUNT: &str = "cloud-network-config@cloudnet-e2e.iam.gserviceaccount.com";

/// STS's token exchange (RFC 8693, form-encoded as Google's STS takes it): a federated access
/// token for a subject token of the JWT type with an audience; `invalid_request` otherwise.
fn sts_token(shared: &Shared, body: &Bytes) -> Answer {
    let form = crate::fakes::form::pairs(std::str::from_utf8(body).ok());
    let field = |name: &str| {
        form.iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let mut state = shared.state();
    *state.calls.entry(STS_TOKEN_CALL.to_owned()).or_default() += 1;
    let valid = field("grant_type").as_deref()
        == Some("urn:ietf:params:oauth:grant-type:token-exchange")
        && field("subject_token_type").as_deref() == Some("urn:ietf:params:oauth:token-type:jwt")
        && field("audience").is_some();
    let Some(subject) = field("subject_token").filter(|_| valid) else {
        return json_answer(
            StatusCode::BAD_REQUEST,
            &json!({"error": "invalid_request",
                    "error_description": "token exchange of a JWT subject token with an audience required"}),
        );
    };
    state.subject_tokens.push(subject);
    state.next_id += 1;
    let token = format!("sts.cloudnet-e2e-{}", state.next_id);
    state.sts_tokens.push(token.clone());
    json_answer(
        StatusCode::OK,
        &json!({"access_token": token, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "token_type": "Bearer", "expires_in": 3599}),
    )
}

/// IAM Credentials' `generateAccessToken` for [`IMPERSONATED_ACCOUNT`]: only with a bearer token
/// STS issued (as Google requires the federated identity's token).
fn impersonate(shared: &Shared, parts: &http::request::Parts) -> Answer {
    let bearer = bearer(parts).unwrap_or_default();
    let mut state = shared.state();
    *state
        .calls
        .entry(IMPERSONATION_CALL.to_owned())
        .or_default() += 1;
    if !state.sts_tokens.contains(&bearer) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "Request had invalid authentication credentials.",
        );
    }
    state.next_id += 1;
    let expires = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(3600))
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
    json_answer(
        StatusCode::OK,
        &json!({"accessToken": format!("ya29.impersonated-{}", state.next_id),
                "expireTime": expires.to_string()}),
    )
}

/// A matched method: its resource and name, and the path's values.
struct Call {
    resource: &'static str,
    method: &'static str,
    args: Vec<String>,
}

fn match_route(method: &Method, path: &str) -> Option<Call> {
    let rest = path.strip_prefix("/compute/v1/projects/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let call = |resource, name, args: &[&str]| Call {
        resource,
        method: name,
        args: args.iter().map(|s| (*s).to_owned()).collect(),
    };
    match (method, parts.as_slice()) {
        (&Method::GET, [p, "zones", z, "instances", i]) => {
            Some(call("instances", "get", &[p, z, i]))
        }
        (&Method::GET, [p, "zones", z, "instances"]) => Some(call("instances", "list", &[p, z])),
        (&Method::GET, [p, "aggregated", "instances"]) => {
            Some(call("instances", "aggregatedList", &[p]))
        }
        (&Method::PATCH, [p, "zones", z, "instances", i, "updateNetworkInterface"]) => {
            Some(call("instances", "updateNetworkInterface", &[p, z, i]))
        }
        (&Method::GET, [p, "zones", z, "operations", o]) => {
            Some(call("zoneOperations", "get", &[p, z, o]))
        }
        (&Method::POST, [p, "zones", z, "operations", o, "wait"]) => {
            Some(call("zoneOperations", "wait", &[p, z, o]))
        }
        (&Method::GET, [p, "regions", r, "subnetworks", s]) => {
            Some(call("subnetworks", "get", &[p, r, s]))
        }
        _ => None,
    }
}

async fn route(shared: &Arc<Shared>, parts: &http::request::Parts, body: &Bytes) -> Answer {
    let path = parts.uri.path();
    if parts.method == Method::POST && path == OAUTH_TOKEN_PATH {
        return oauth_token(shared, body);
    }
    if parts.method == Method::POST && path == STS_TOKEN_PATH {
        return sts_token(shared, body);
    }
    if parts.method == Method::POST
        && path
            == format!("/v1/projects/-/serviceAccounts/{IMPERSONATED_ACCOUNT}:generateAccessToken")
    {
        return impersonate(shared, parts);
    }
    let Some(call) = match_route(&parts.method, path) else {
        let what = format!("{} {path}: no such method", parts.method);
        shared.state().violations.push(what.clone());
        return error(StatusCode::NOT_FOUND, "notFound", &what);
    };
    let info = match shared.discovery.method(call.resource, call.method) {
        Ok(info) => info,
        Err(e) => {
            shared.state().violations.push(e.to_string());
            return error(StatusCode::NOT_FOUND, "notFound", &e.to_string());
        }
    };
    *shared.state().calls.entry(info.id.clone()).or_default() += 1;
    let query = crate::fakes::form::pairs(parts.uri.query());
    let mut problems: Vec<String> = query
        .iter()
        .filter(|(k, _)| !info.query.contains(k) && !shared.discovery.is_global_parameter(k))
        .map(|(k, _)| format!("query parameter {k}: not a parameter of {}", info.id))
        .collect();
    let body_json: Option<Value> = match (&info.request, body.is_empty()) {
        (Some(schema), false) => match serde_json::from_slice(body) {
            Ok(value) => {
                problems.extend(shared.discovery.check(schema, &value));
                Some(value)
            }
            Err(e) => {
                problems.push(format!("request body is not JSON: {e}"));
                None
            }
        },
        (Some(schema), true) => {
            problems.push(format!("{}: a {schema} body is required", info.id));
            None
        }
        (None, false) => {
            problems.push(format!("{}: takes no body", info.id));
            None
        }
        (None, true) => None,
    };
    if !problems.is_empty() {
        let message = format!("{}: {}", info.id, problems.join("; "));
        shared.state().violations.push(message.clone());
        return error(StatusCode::BAD_REQUEST, "invalid", &message);
    }
    if shared.state().require_auth && !has_bearer(parts) {
        return error(StatusCode::UNAUTHORIZED, "required", "Login Required.");
    }
    if let Some(token) = bearer(parts) {
        *shared.state().bearers.entry(token).or_default() += 1;
    }
    let missing = shared.state().permissions.as_ref().and_then(|granted| {
        permissions_for(call.resource, call.method)
            .iter()
            .find(|p| !granted.iter().any(|g| g == *p))
            .copied()
    });
    if let Some(permission) = missing {
        *shared
            .state()
            .calls
            .entry(format!("403 {permission}"))
            .or_default() += 1;
        let resource = path.trim_start_matches("/compute/v1/");
        return error(
            StatusCode::FORBIDDEN,
            "forbidden",
            &format!("Required '{permission}' permission for '{resource}'"),
        );
    }
    let answer = match (call.resource, call.method) {
        ("instances", "get") => get_instance(shared, &call.args),
        ("instances", "list") => list_instances(shared, &call.args, &query),
        ("instances", "aggregatedList") => aggregated_list(shared, &call.args, &query),
        ("instances", "updateNetworkInterface") => {
            let nic = query
                .iter()
                .find(|(k, _)| k == "networkInterface")
                .map(|(_, v)| v.as_str());
            update_network_interface(shared, &call.args, nic, body_json.unwrap_or(Value::Null))
        }
        ("zoneOperations", "get") => get_operation(shared, &call.args),
        ("zoneOperations", "wait") => wait_operation(shared, &call.args).await,
        ("subnetworks", "get") => get_subnet(shared, &call.args),
        _ => Err(error(StatusCode::NOT_FOUND, "notFound", "no such method")),
    };
    match answer {
        Ok(value) => {
            if let Some(schema) = &info.response {
                let problems = shared.discovery.check(schema, &value);
                if !problems.is_empty() {
                    let message = format!("{} response: {}", info.id, problems.join("; "));
                    shared.state().violations.push(message.clone());
                    return error(StatusCode::INTERNAL_SERVER_ERROR, "backendError", &message);
                }
            }
            json_answer(StatusCode::OK, &value)
        }
        Err(answer) => answer,
    }
}

fn has_bearer(parts: &http::request::Parts) -> bool {
    bearer(parts).is_some()
}

fn bearer(parts: &http::request::Parts) -> Option<String> {
    parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

type Handled = std::result::Result<Value, Answer>;

fn key(args: &[String]) -> (String, String, String) {
    let at = |i: usize| args.get(i).cloned().unwrap_or_default();
    (at(0), at(1), at(2))
}

fn not_found(what: &str) -> Answer {
    error(
        StatusCode::NOT_FOUND,
        "notFound",
        &format!("The resource '{what}' was not found"),
    )
}

fn get_instance(shared: &Shared, args: &[String]) -> Handled {
    let mut state = shared.state();
    advance(&mut state, Instant::now());
    let (p, z, i) = key(args);
    let vm = state
        .vms
        .get(&(p.clone(), z.clone(), i.clone()))
        .ok_or_else(|| not_found(&format!("projects/{p}/zones/{z}/instances/{i}")))?;
    let subnet = state.subnets.get(&vm.spec.subnet).map(SubnetSpec::url);
    Ok(instance_json(vm, subnet.unwrap_or_default()))
}

/// Most items GCE puts on one list page (`maxResults`' default and maximum).
const MAX_RESULTS: usize = 500;

/// One page of a list's selection, as a list method's query asks for it.
struct Page {
    filter: Option<NameFilter>,
    start: usize,
    size: usize,
}

impl Page {
    /// The page `query` asks for, or the 400 GCE answers (recorded as a violation).
    fn of(shared: &Shared, query: &[(String, String)]) -> std::result::Result<Self, Answer> {
        let param = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let invalid = |message: String| {
            shared.state().violations.push(message.clone());
            error(StatusCode::BAD_REQUEST, "invalid", &message)
        };
        let filter = match param("filter") {
            None | Some("") => None,
            Some(filter) => Some(NameFilter::parse(filter).ok_or_else(|| {
                invalid(format!("Invalid value for field 'filter': '{filter}'."))
            })?),
        };
        let max = match param("maxResults") {
            None => MAX_RESULTS,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n <= MAX_RESULTS => n,
                _ => {
                    return Err(invalid(format!(
                        "Invalid value for field 'maxResults': '{v}'."
                    )));
                }
            },
        };
        let start = match param("pageToken") {
            None | Some("") => 0,
            Some(token) => token
                .strip_prefix("page-")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| {
                    invalid(format!("Invalid value for field 'pageToken': '{token}'."))
                })?,
        };
        let size = shared
            .state()
            .list_page_size
            .map_or(max, |cut| cut.min(max))
            .max(1);
        Ok(Self {
            filter,
            start,
            size,
        })
    }

    /// Of the VMs `all` (in GCE's order), the ones the filter selects on this page, and the
    /// next page's token if there is one.
    fn cut<'a>(&self, all: impl Iterator<Item = &'a Vm>) -> (Vec<&'a Vm>, Option<String>) {
        let matching: Vec<&Vm> = all
            .filter(|vm| {
                self.filter
                    .as_ref()
                    .is_none_or(|f| f.selects(&vm.spec.name))
            })
            .collect();
        let next = (self.start + self.size < matching.len())
            .then(|| format!("page-{}", self.start + self.size));
        let page = matching
            .into_iter()
            .skip(self.start)
            .take(self.size)
            .collect();
        (page, next)
    }
}

fn list_instances(shared: &Shared, args: &[String], query: &[(String, String)]) -> Handled {
    let page = Page::of(shared, query)?;
    let mut state = shared.state();
    advance(&mut state, Instant::now());
    let (p, z) = (
        args.first().cloned().unwrap_or_default(),
        args.get(1).cloned().unwrap_or_default(),
    );
    let (vms, next) = page.cut(
        state
            .vms
            .values()
            .filter(|vm| vm.spec.project == p && vm.spec.zone == z),
    );
    let items: Vec<Value> = vms
        .iter()
        .map(|vm| {
            let subnet = state.subnets.get(&vm.spec.subnet).map(SubnetSpec::url);
            instance_json(vm, subnet.unwrap_or_default())
        })
        .collect();
    let mut list = json!({
        "kind": "compute#instanceList",
        "id": format!("projects/{p}/zones/{z}/instances"),
        "selfLink": format!("{LINK_BASE}/projects/{p}/zones/{z}/instances"),
    });
    // GCE leaves an empty list out of its answers.
    if !items.is_empty() {
        list["items"] = Value::Array(items);
    }
    if let Some(next) = next {
        list["nextPageToken"] = json!(next);
    }
    Ok(list)
}

fn aggregated_list(shared: &Shared, args: &[String], query: &[(String, String)]) -> Handled {
    let page = Page::of(shared, query)?;
    let mut state = shared.state();
    advance(&mut state, Instant::now());
    let p = args.first().cloned().unwrap_or_default();
    let project = || state.vms.values().filter(|vm| vm.spec.project == p);
    let (vms, next) = page.cut(project());
    let mut items = serde_json::Map::new();
    for vm in &vms {
        let subnet = state.subnets.get(&vm.spec.subnet).map(SubnetSpec::url);
        let scope = items
            .entry(format!("zones/{}", vm.spec.zone))
            .or_insert_with(|| json!({"instances": []}));
        if let Some(list) = scope["instances"].as_array_mut() {
            list.push(instance_json(vm, subnet.unwrap_or_default()));
        }
    }
    for vm in project() {
        let scope = format!("zones/{}", vm.spec.zone);
        items.entry(scope.clone()).or_insert_with(|| {
            json!({"warning": {
                "code": "NO_RESULTS_ON_PAGE",
                "message": format!("There are no results for scope '{scope}' on this page."),
                "data": [{"key": "scope", "value": scope}],
            }})
        });
    }
    let mut list = json!({
        "kind": "compute#instanceAggregatedList",
        "id": format!("projects/{p}/aggregated/instances"),
        "items": items,
        "selfLink": format!("{LINK_BASE}/projects/{p}/aggregated/instances"),
    });
    if let Some(next) = next {
        list["nextPageToken"] = json!(next);
    }
    Ok(list)
}

/// What a list's filter selects, for the filters of names alone.
enum NameFilter {
    /// `(name = "a") OR (name = "b") ...`, or one bare `name = "a"` (quotes optional).
    Names(Vec<String>),
    /// `name eq "<expression>"` (quotes optional): an RE2 expression the whole name matches.
    Matches(regex::Regex),
}

impl NameFilter {
    fn parse(filter: &str) -> Option<Self> {
        let filter = filter.trim();
        if let Some(expression) = filter
            .strip_prefix("name")
            .and_then(|rest| rest.trim_start().strip_prefix("eq "))
        {
            let expression = unquote(expression.trim());
            return regex::Regex::new(&format!("^(?:{expression})$"))
                .ok()
                .map(Self::Matches);
        }
        name_terms(filter).map(Self::Names)
    }

    fn selects(&self, name: &str) -> bool {
        match self {
            Self::Names(names) => names.iter().any(|n| n == name),
            Self::Matches(expression) => expression.is_match(name),
        }
    }
}

/// `value` without the double quotes around it, if any.
fn unquote(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

/// The names of `(name = "a") OR (name = "b") ...`, or of one bare `name = "a"`.
fn name_terms(filter: &str) -> Option<Vec<String>> {
    let term = |t: &str| {
        let (field, value) = t.split_once('=')?;
        if field.trim() != "name" {
            return None;
        }
        let value = unquote(value.trim());
        let valid = !value.is_empty()
            && value
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        valid.then(|| value.to_owned())
    };
    if !filter.starts_with('(') {
        return term(filter).map(|name| vec![name]);
    }
    filter
        .split(" OR ")
        .map(|t| {
            t.trim()
                .strip_prefix('(')
                .and_then(|t| t.strip_suffix(')'))
                .and_then(term)
        })
        .collect()
}

fn instance_json(vm: &Vm, subnet_url: String) -> Value {
    let s = &vm.spec;
    let aliases: Vec<Value> = vm
        .aliases
        .iter()
        .map(|a| {
            let mut v = json!({"ipCidrRange": a.cidr.to_string()});
            if let Some(range) = &a.range {
                v["subnetworkRangeName"] = json!(range);
            }
            v
        })
        .collect();
    let mut nic = json!({
        "kind": "compute#networkInterface",
        "name": "nic0",
        "network": format!("{LINK_BASE}/projects/{}/global/networks/default", s.subnet.0),
        "subnetwork": subnet_url,
        "networkIP": s.network_ip.to_string(),
        "fingerprint": fingerprint(&vm.fingerprint),
        "stackType": "IPV4_ONLY",
    });
    // GCE leaves an empty list out of its answers.
    if !aliases.is_empty() {
        nic["aliasIpRanges"] = Value::Array(aliases);
    }
    json!({
        "kind": "compute#instance",
        "id": vm.id.to_string(),
        "name": s.name,
        "zone": format!("{LINK_BASE}/projects/{}/zones/{}", s.project, s.zone),
        "status": "RUNNING",
        "selfLink": format!("{LINK_BASE}/projects/{}/zones/{}/instances/{}", s.project, s.zone, s.name),
        "networkInterfaces": [nic],
    })
}

fn fingerprint(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE.encode(bytes)
}

fn update_network_interface(
    shared: &Shared,
    args: &[String],
    nic: Option<&str>,
    body: Value,
) -> Handled {
    let mut state = shared.state();
    let now = Instant::now();
    advance(&mut state, now);
    let (p, z, i) = key(args);
    let vm_key = (p.clone(), z.clone(), i.clone());
    let Some(vm) = state.vms.get(&vm_key) else {
        return Err(not_found(&format!("projects/{p}/zones/{z}/instances/{i}")));
    };
    match nic {
        Some("nic0") => {}
        Some(other) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "invalid",
                &format!("Invalid value for field 'networkInterface': '{other}'."),
            ));
        }
        None => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "required",
                "Required parameter 'networkInterface' is missing.",
            ));
        }
    }
    let Some(given) = body["fingerprint"].as_str() else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "required",
            "Required field 'fingerprint' not specified.",
        ));
    };
    let decoded = base64::engine::general_purpose::URL_SAFE
        .decode(given)
        .unwrap_or_default();
    if decoded != vm.fingerprint {
        return Err(error_with(
            StatusCode::PRECONDITION_FAILED,
            "conditionNotMet",
            "Supplied fingerprint does not match current metadata fingerprint.",
            Some(("header", "If-Match")),
        ));
    }
    // Only the alias list may change; anything else in the body must equal what is there.
    let current = instance_json(vm, String::new())["networkInterfaces"][0].clone();
    if let Some(fields) = body.as_object() {
        for (field, value) in fields {
            let fixed = matches!(field.as_str(), "name" | "network" | "networkIP" | "kind");
            if field == "fingerprint" || field == "aliasIpRanges" {
                continue;
            }
            if !fixed || current.get(field) != Some(value) {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "invalid",
                    &format!("The fake changes only aliasIpRanges, not '{field}'."),
                ));
            }
        }
    }
    let subnet = state.subnets.get(&vm.spec.subnet).cloned();
    let aliases = match body.get("aliasIpRanges") {
        // PATCH: an absent list is unchanged.
        None => vm.aliases.clone(),
        Some(list) => parse_aliases(list, subnet.as_ref())?,
    };
    let target = vm_key.clone();
    let target_id = vm.id;
    state.next_id += 1;
    let id = state.next_id;
    let name = format!("operation-{id}-{:016x}", rand::random::<u64>());
    if let Some(vm) = state.vms.get_mut(&vm_key) {
        vm.fingerprint = rand::random();
    }
    let op = Op {
        id,
        name: name.clone(),
        project: p.clone(),
        zone: z.clone(),
        target,
        target_id,
        created: now,
        aliases,
        done: None,
    };
    let delay = state.operation_delay;
    let answer = operation_json(&op, now, delay);
    state.ops.insert((p, z, name), op);
    drop(state);
    shared.changed.notify_waiters();
    Ok(answer)
}

fn parse_aliases(
    list: &Value,
    subnet: Option<&SubnetSpec>,
) -> std::result::Result<Vec<Alias>, Answer> {
    let invalid = |message: String| error(StatusCode::BAD_REQUEST, "invalid", &message);
    let items = list.as_array().cloned().unwrap_or_default();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let text = item["ipCidrRange"].as_str().unwrap_or_default();
        let cidr: Ipv4Net = text
            .parse()
            .or_else(|_| text.parse::<Ipv4Addr>().map(Ipv4Net::from))
            .map_err(|_| invalid(format!("Invalid value for field 'ipCidrRange': '{text}'.")))?;
        let range = item["subnetworkRangeName"].as_str().map(str::to_owned);
        let Some(subnet) = subnet else {
            return Err(invalid("The interface has no subnetwork.".into()));
        };
        let holder = match &range {
            None => Some(subnet.primary),
            Some(name) => subnet
                .secondary
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, net)| *net),
        };
        let Some(holder) = holder else {
            return Err(invalid(format!(
                "Secondary range '{}' does not exist in subnetwork '{}'.",
                range.unwrap_or_default(),
                subnet.name
            )));
        };
        if !holder.contains(&cidr) {
            return Err(invalid(format!(
                "Invalid IP CIDR range: {cidr} is not within {} range {holder} of subnetwork '{}'.",
                range.as_deref().unwrap_or("primary"),
                subnet.name
            )));
        }
        // GCE keeps four addresses of every primary range for itself (network, gateway,
        // second-to-last, broadcast); secondary ranges have none reserved.
        // https://cloud.google.com/vpc/docs/subnets#unusable-ip-addresses-in-every-subnet
        if range.is_none() && reserved_in(holder).iter().any(|ip| cidr.contains(ip)) {
            return Err(invalid(format!(
                "IP {cidr} is reserved in range {holder} of subnetwork '{}'.",
                subnet.name
            )));
        }
        if out
            .iter()
            .any(|a: &Alias| a.cidr.contains(&cidr.network()) || cidr.contains(&a.cidr.network()))
        {
            return Err(invalid(format!(
                "Alias IP range {cidr} overlaps another in the request."
            )));
        }
        out.push(Alias { cidr, range });
    }
    if out.len() > 100 {
        return Err(invalid(format!(
            "Exceeded limit of 100 alias IP ranges per network interface ({}).",
            out.len()
        )));
    }
    Ok(out)
}

/// The addresses GCE reserves in a primary range.
pub fn reserved_in(range: Ipv4Net) -> Vec<Ipv4Addr> {
    let first = u32::from(range.network());
    let last = u32::from(range.broadcast());
    let mut out = vec![first, first.saturating_add(1), last.saturating_sub(1), last];
    out.dedup();
    out.into_iter().map(Ipv4Addr::from).collect()
}

/// Finishes every operation whose time has come, in the order they were made.
fn advance(state: &mut State, now: Instant) {
    let delay = state.operation_delay;
    let mut due: Vec<(Instant, u64, (String, String, String))> = state
        .ops
        .iter()
        .filter(|(_, op)| op.done.is_none() && now >= op.created + delay)
        .map(|(k, op)| (op.created, op.id, k.clone()))
        .collect();
    due.sort();
    for (_, _, op_key) in due {
        let Some(op) = state.ops.get(&op_key) else {
            continue;
        };
        let (target, aliases) = (op.target.clone(), op.aliases.clone());
        let result = finish(state, &target, &aliases);
        if let Some(op) = state.ops.get_mut(&op_key) {
            op.done = Some(result);
        }
    }
}

fn finish(
    state: &mut State,
    target: &(String, String, String),
    aliases: &[Alias],
) -> std::result::Result<(), (String, String)> {
    for alias in aliases {
        let taken = state.vms.iter().find(|(k, vm)| {
            *k != target
                && (alias.cidr.contains(&vm.spec.network_ip)
                    || vm.aliases.iter().any(|a| {
                        a.cidr.contains(&alias.cidr.network())
                            || alias.cidr.contains(&a.cidr.network())
                    }))
        });
        if let Some((_, other)) = taken {
            return Err((
                "IP_IN_USE_BY_ANOTHER_RESOURCE".into(),
                format!(
                    "IP '{}' is already being used by another resource ('projects/{}/zones/{}/instances/{}').",
                    alias.cidr, other.spec.project, other.spec.zone, other.spec.name
                ),
            ));
        }
    }
    match state.vms.get_mut(target) {
        Some(vm) => {
            vm.aliases = aliases.to_vec();
            Ok(())
        }
        None => Err((
            "RESOURCE_NOT_FOUND".into(),
            format!(
                "The resource 'projects/{}/zones/{}/instances/{}' was not found",
                target.0, target.1, target.2
            ),
        )),
    }
}

fn operation_json(op: &Op, now: Instant, delay: Duration) -> Value {
    let status = match &op.done {
        Some(_) => "DONE",
        None if now >= op.created + delay / 2 => "RUNNING",
        None => "PENDING",
    };
    let (t_project, t_zone, t_name) = &op.target;
    let progress = if op.done.is_some() { 100 } else { 0 };
    let mut v = json!({
        "kind": "compute#operation",
        "id": op.id.to_string(),
        "name": op.name,
        "zone": format!("{LINK_BASE}/projects/{}/zones/{}", op.project, op.zone),
        "operationType": "updateNetworkInterface",
        "targetLink": format!("{LINK_BASE}/projects/{t_project}/zones/{t_zone}/instances/{t_name}"),
        "targetId": op.target_id.to_string(),
        "status": status,
        "user": "fake@cloudnet.test",
        "progress": progress,
        "insertTime": "2026-01-01T00:00:00.000-00:00",
        "selfLink": format!("{LINK_BASE}/projects/{}/zones/{}/operations/{}", op.project, op.zone, op.name),
    });
    if let Some(Err((code, message))) = &op.done {
        v["error"] = json!({"errors": [{"code": code, "message": message}]});
        v["httpErrorStatusCode"] = json!(400);
        v["httpErrorMessage"] = json!("BAD REQUEST");
    }
    v
}

fn get_operation(shared: &Shared, args: &[String]) -> Handled {
    let mut state = shared.state();
    let now = Instant::now();
    advance(&mut state, now);
    let delay = state.operation_delay;
    let k = key(args);
    state
        .ops
        .get(&k)
        .map(|op| operation_json(op, now, delay))
        .ok_or_else(|| {
            not_found(&format!(
                "projects/{}/zones/{}/operations/{}",
                k.0, k.1, k.2
            ))
        })
}

async fn wait_operation(shared: &Shared, args: &[String]) -> Handled {
    let k = key(args);
    let deadline = Instant::now() + WAIT_BOUND;
    loop {
        let due = {
            let mut state = shared.state();
            let now = Instant::now();
            advance(&mut state, now);
            let delay = state.operation_delay;
            let op = state.ops.get(&k).ok_or_else(|| {
                not_found(&format!(
                    "projects/{}/zones/{}/operations/{}",
                    k.0, k.1, k.2
                ))
            })?;
            if op.done.is_some() || now >= deadline {
                return Ok(operation_json(op, now, delay));
            }
            (op.created + delay).min(deadline)
        };
        tokio::time::sleep_until(due).await;
    }
}

fn get_subnet(shared: &Shared, args: &[String]) -> Handled {
    let state = shared.state();
    let k = key(args);
    let s = state.subnets.get(&k).ok_or_else(|| {
        not_found(&format!(
            "projects/{}/regions/{}/subnetworks/{}",
            k.0, k.1, k.2
        ))
    })?;
    let gateway = s
        .primary
        .hosts()
        .next()
        .map(|ip| ip.to_string())
        .unwrap_or_default();
    let secondary: Vec<Value> = s
        .secondary
        .iter()
        .map(|(name, net)| json!({"rangeName": name, "ipCidrRange": net.to_string()}))
        .collect();
    let mut subnetwork = json!({
        "kind": "compute#subnetwork",
        "id": "4242",
        "name": s.name,
        "network": format!("{LINK_BASE}/projects/{}/global/networks/default", s.project),
        "region": format!("{LINK_BASE}/projects/{}/regions/{}", s.project, s.region),
        "ipCidrRange": s.primary.to_string(),
        "gatewayAddress": gateway,
        "secondaryIpRanges": secondary,
        "stackType": "IPV4_ONLY",
        "selfLink": s.url(),
    });
    if let Some(v6) = s.ipv6 {
        subnetwork["stackType"] = json!("IPV4_IPV6");
        subnetwork["ipv6AccessType"] = json!("INTERNAL");
        subnetwork["ipv6CidrRange"] = json!(v6.to_string());
    }
    Ok(subnetwork)
}

fn error(status: StatusCode, reason: &str, message: &str) -> Answer {
    error_with(status, reason, message, None)
}

/// GCE's error body: `{"error": {"code", "message", "errors": [{"domain", "reason", ...}]}}`.
fn error_with(
    status: StatusCode,
    reason: &str,
    message: &str,
    location: Option<(&str, &str)>,
) -> Answer {
    let mut item = json!({"domain": "global", "reason": reason, "message": message});
    if let Some((kind, at)) = location {
        item["locationType"] = json!(kind);
        item["location"] = json!(at);
    }
    let body = json!({"error": {"code": status.as_u16(), "message": message, "errors": [item]}});
    json_answer(status, &body)
}

fn json_answer(status: StatusCode, body: &Value) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_filters_of_names_are_understood_and_others_refused() {
        let selects = |filter: &str, name: &str| NameFilter::parse(filter).unwrap().selects(name);
        let ors = r#"(name = "vm-1") OR (name = "vm-2")"#;
        assert!(selects(ors, "vm-1") && selects(ors, "vm-2") && !selects(ors, "vm-10"));
        assert!(selects("name = vm-1", "vm-1") && !selects("name = vm-1", "vm-2"));
        for refused in [
            r#"name = "a" OR name = "b""#,
            r#"(zone = "a")"#,
            r#"(name = "a") AND (name = "b")"#,
            r#"name eq "(""#,
        ] {
            assert!(NameFilter::parse(refused).is_none(), "{refused}");
        }
        // `eq` is RE2 matching the whole name.
        let prefix = r#"name eq "infra-.*""#;
        assert!(selects(prefix, "infra-worker-0") && !selects(prefix, "other-infra-0"));
        assert!(selects("name eq vm-.", "vm-1") && !selects("name eq vm-.", "vm-10"));
    }

    #[test]
    fn every_method_the_provider_calls_needs_only_openshifts_grant() {
        for (resource, method) in [
            ("instances", "get"),
            ("instances", "updateNetworkInterface"),
            ("zoneOperations", "get"),
            ("zoneOperations", "wait"),
            ("subnetworks", "get"),
        ] {
            let needed = permissions_for(resource, method);
            assert!(!needed.is_empty(), "{resource}.{method}");
            for p in needed {
                assert!(CREDENTIALS_REQUEST.contains(p), "{p}");
            }
        }
    }

    #[test]
    fn routes_name_the_methods() {
        let r = match_route(
            &Method::PATCH,
            "/compute/v1/projects/p/zones/z/instances/i/updateNetworkInterface",
        )
        .map(|c| (c.resource, c.method, c.args));
        assert_eq!(
            r,
            Some((
                "instances",
                "updateNetworkInterface",
                vec!["p".into(), "z".into(), "i".into()]
            ))
        );
        assert!(
            match_route(
                &Method::DELETE,
                "/compute/v1/projects/p/zones/z/instances/i"
            )
            .is_none()
        );
    }
}
