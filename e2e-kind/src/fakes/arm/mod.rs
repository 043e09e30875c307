//! A fake of Azure Resource Manager for the Azure provider: just the calls it makes, speaking
//! ARM's wire format to the real SDK clients, with ARM's semantics:
//!
//! * the token endpoint (`POST /<tenant>/oauth2/v2.0/token`, client secret or federated
//!   assertion) and bearer tokens checked on every other call, their scope included
//!   (`InvalidAuthenticationTokenAudience` unless it is the configured audience's `/.default`);
//! * the metadata endpoint (`GET /metadata/endpoints?api-version=1.0`) naming the token
//!   authority and audience, as Azure Stack Hub's Resource Manager answers it;
//! * every request's `User-Agent`, recorded;
//! * VM GET (network profile), NIC GET/PUT, VNet and subnet GET, async-operation status GET;
//! * a resource group's NIC list (`NetworkInterfaces_List`), paged with `nextLink` (on the host
//!   the request named, as ARM answers) when [`ArmFake::set_list_page_size`] cuts it;
//! * etags that change on every write (the PUT and the end of its operation), 412 on a stale
//!   `If-Match`, full-replace PUT (a writable field left out is dropped; read-only ones are
//!   ignored and kept), every PUT body checked against the vendored ARM schema
//!   ([`schema::Schema`]);
//! * `Azure-AsyncOperation` (+ `Retry-After` when configured): `InProgress` until the operation's
//!   time is up, then `Succeeded` or, when a failure was queued, `Failed` with ARM's error;
//!   `AnotherOperationInProgress` (409) for a write while one runs;
//! * 256 ip-configurations per NIC, `PrivateIPAddressIsAllocated` for an address another NIC
//!   (or configuration) holds, the subnet's reserved addresses (first four, last) refused,
//!   addresses outside the subnet refused;
//! * public IP resources (GET, checked against the vendored PublicIPAddress schema): an
//!   ip-configuration's `publicIPAddress` must name one that exists and no other configuration
//!   holds (`PublicIPAddressInUse`), is kept as its id alone, needs
//!   `Microsoft.Network/publicIPAddresses/join/action` on every NIC PUT that carries it (ARM's
//!   linked access check), and shows on the public IP as its read-only `ipConfiguration`;
//! * on request ([`ArmFake::echo_ids_in_other_case`]), the references ARM writes into one
//!   resource's answer to another resource (a public IP's `ipConfiguration`, an
//!   ip-configuration's `publicIPAddress`, a VM's network interfaces, a NIC's `virtualMachine`)
//!   spelled with another case of the resource group than that resource's own id, as ARM does:
//!   its ids are case-insensitive and it does not keep one spelling of a group everywhere.
//!
//! Latency, throttling and 5xx come from the fault proxy in front of it
//! ([`crate::fakes::faultproxy::Dialect::Arm`]).

pub mod schema;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use schema::Schema;

/// Most ip-configurations ARM allows on one NIC.
pub const MAX_IP_CONFIGS: usize = 256;

/// The Azure actions OpenShift grants the cloud network config controller: its
/// CredentialsRequest `openshift-cloud-network-config-controller-azure`
/// (openshift/cluster-network-operator, `manifests/02-cncc-credentials.yaml`).
pub const CREDENTIALS_REQUEST: [&str; 7] = [
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Network/networkInterfaces/write",
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Network/virtualNetworks/read",
    "Microsoft.Network/virtualNetworks/subnets/join/action",
    "Microsoft.Network/loadBalancers/backendAddressPools/read",
    "Microsoft.Network/loadBalancers/backendAddressPools/join/action",
];

/// How the fake behaves.
#[derive(Clone, Debug)]
pub struct ArmConfig {
    /// The actions the caller's role grants; `None` grants every action.
    pub permissions: Option<Vec<String>>,
    /// How long a NIC update's operation stays `InProgress`.
    pub operation_time: Duration,
    /// `Retry-After` (seconds) on write answers, operation polls and 409s; `None` sends none.
    /// [`ArmFake::set_retry_after`] changes it at run time.
    pub retry_after: Option<u64>,
    /// The region of every resource.
    pub location: String,
    /// The audience tokens must be asked for (scope `<audience>/.default`), which the metadata
    /// endpoint names; `None` is the fake's own URL.
    pub audience: Option<String>,
    /// The login endpoint the metadata endpoint names; `None` is the fake's own URL.
    pub login_endpoint: Option<String>,
    /// The public key (PKCS#1 `RSAPublicKey` DER) of the one certificate an application may
    /// authenticate with: a client assertion whose header names a certificate (`x5t`) must be
    /// signed by it (RS256), with the token URL as `aud`; `None` refuses every such assertion.
    pub client_certificate_key: Option<Vec<u8>>,
}

impl Default for ArmConfig {
    fn default() -> Self {
        Self {
            permissions: Some(CREDENTIALS_REQUEST.map(str::to_owned).to_vec()),
            operation_time: Duration::from_millis(100),
            retry_after: None,
            location: "westeurope".into(),
            audience: None,
            login_endpoint: None,
            client_certificate_key: None,
        }
    }
}

/// The ids of a VM the fake made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmIds {
    /// The VM's resource id.
    pub vm: String,
    /// Its NIC's resource id.
    pub nic: String,
    /// The Node `spec.providerID` naming it.
    pub provider_id: String,
}

/// A subnet the fake knows.
#[derive(Clone, Debug)]
struct SubnetState {
    id: String,
    prefixes: Vec<ipnet::IpNet>,
}

/// A NIC: the stored document (without etag and provisioning state), its etag counter, and the
/// operation running on it.
#[derive(Clone, Debug)]
struct NicState {
    doc: Value,
    etag: u64,
    /// The running operation and the document to restore if it fails.
    running: Option<(String, Instant, Value)>,
}

#[derive(Clone, Debug)]
struct Operation {
    nic: String,
    done_at: Instant,
    failure: Option<(String, String)>,
    finished: Option<Value>,
}

#[derive(Debug, Default)]
struct State {
    /// Replaces [`ArmConfig::operation_time`] once set.
    operation_time: Option<Duration>,
    /// Issued tokens and the scope each was asked for.
    tokens: Vec<(String, String)>,
    /// Every `User-Agent` seen, by route class.
    agents: BTreeMap<String, std::collections::BTreeSet<String>>,
    grants: Vec<String>,
    vms: HashMap<String, String>,
    nics: HashMap<String, NicState>,
    subnets: HashMap<String, SubnetState>,
    operations: HashMap<String, Operation>,
    next_operation: u64,
    failures: Vec<(String, String)>,
    counts: BTreeMap<String, u64>,
    if_match: Vec<Option<String>>,
    violations: Vec<String>,
    bodies: Vec<Value>,
    /// Public IPs by key: their stored documents (without `ipConfiguration`, which is derived).
    public_ips: HashMap<String, Value>,
    /// Most NICs one list page holds; `None`: all of them.
    list_page_size: Option<usize>,
    /// Actions taken back from the caller's role since the start, whatever it grants.
    revoked: Vec<String>,
    /// Whether references to other resources spell the resource group in another case.
    other_case: bool,
    /// `Retry-After` (seconds) on write answers, operation polls and 409s: at first
    /// [`ArmConfig::retry_after`].
    retry_after: Option<u64>,
}

#[derive(Debug)]
struct Shared {
    config: ArmConfig,
    schema: Schema,
    url: String,
    state: Mutex<State>,
}

impl Shared {
    /// The audience tokens must be asked for.
    fn audience(&self) -> String {
        self.config
            .audience
            .clone()
            .unwrap_or_else(|| self.url.clone())
    }
}

/// A running fake. Dropping it closes the port.
#[derive(Debug)]
pub struct ArmFake {
    url: String,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for ArmFake {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn key(id: &str) -> String {
    id.trim_end_matches('/').to_ascii_lowercase()
}

impl ArmFake {
    /// Binds 127.0.0.1 on a free port and serves on the calling tokio runtime.
    pub async fn start(config: ArmConfig) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the ARM fake's port")?;
        let addr: SocketAddr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let state = State {
            retry_after: config.retry_after,
            ..State::default()
        };
        let shared = Arc::new(Shared {
            config,
            schema: Schema::network_interface(),
            url: url.clone(),
            state: Mutex::new(state),
        });
        let accept = tokio::spawn(crate::fakes::serve::accept_loop(listener, None, {
            let shared = Arc::clone(&shared);
            move |request| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(handle(&shared, request).await) }
            }
        }));
        Ok(Self {
            url,
            shared,
            accept,
        })
    }

    /// `http://127.0.0.1:<port>`: Resource Manager and the token authority both.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a subnet (IPv4 and/or IPv6 prefixes) and returns its id.
    pub fn add_subnet(
        &self,
        subscription: &str,
        group: &str,
        vnet: &str,
        subnet: &str,
        prefixes: &[&str],
    ) -> Result<String> {
        let id = format!(
            "/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Network/virtualNetworks/{vnet}/subnets/{subnet}"
        );
        let prefixes = prefixes
            .iter()
            .map(|p| p.parse().with_context(|| format!("prefix {p}")))
            .collect::<Result<Vec<ipnet::IpNet>>>()?;
        self.state().subnets.insert(
            key(&id),
            SubnetState {
                id: id.clone(),
                prefixes,
            },
        );
        Ok(id)
    }

    /// Adds a VM with one NIC whose primary ip-configuration holds `primary_ip` on `subnet_id`.
    pub fn add_vm(
        &self,
        subscription: &str,
        group: &str,
        name: &str,
        subnet_id: &str,
        primary_ip: IpAddr,
    ) -> VmIds {
        let vm = format!(
            "/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{name}"
        );
        let nic = format!(
            "/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Network/networkInterfaces/{name}-nic"
        );
        let doc = json!({
            "id": nic,
            "name": format!("{name}-nic"),
            "type": "Microsoft.Network/networkInterfaces",
            "location": self.shared.config.location,
            "properties": {
                "virtualMachine": { "id": vm },
                "macAddress": "00-0D-3A-00-00-01",
                "primary": true,
                "enableIPForwarding": false,
                "nicType": "Standard",
                "ipConfigurations": [{
                    "name": "ipconfig1",
                    "properties": {
                        "privateIPAddress": primary_ip.to_string(),
                        "privateIPAllocationMethod": "Dynamic",
                        "privateIPAddressVersion": if primary_ip.is_ipv4() { "IPv4" } else { "IPv6" },
                        "primary": true,
                        "subnet": { "id": subnet_id }
                    }
                }]
            }
        });
        let mut state = self.state();
        state.vms.insert(key(&vm), nic.clone());
        state.nics.insert(
            key(&nic),
            NicState {
                doc,
                etag: 1,
                running: None,
            },
        );
        VmIds {
            provider_id: format!("azure://{vm}"),
            vm,
            nic,
        }
    }

    /// Deletes a VM and its NIC.
    pub fn delete_vm(&self, vm: &str) {
        let mut state = self.state();
        if let Some(nic) = state.vms.remove(&key(vm)) {
            state.nics.remove(&key(&nic));
        }
    }

    /// Adds a static IPv4 Standard public IP `address` named `name`, tagged with `tags`, and
    /// returns its resource id.
    pub fn add_public_ip(
        &self,
        subscription: &str,
        group: &str,
        name: &str,
        address: IpAddr,
        tags: &[(&str, &str)],
    ) -> String {
        let id = format!(
            "/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Network/publicIPAddresses/{name}"
        );
        let tags: serde_json::Map<String, Value> = tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let doc = json!({
            "id": id,
            "name": name,
            "type": "Microsoft.Network/publicIPAddresses",
            "location": self.shared.config.location,
            "tags": tags,
            "sku": { "name": "Standard", "tier": "Regional" },
            "properties": {
                "publicIPAllocationMethod": "Static",
                "publicIPAddressVersion": if address.is_ipv4() { "IPv4" } else { "IPv6" },
                "ipAddress": address.to_string(),
                "idleTimeoutInMinutes": 4,
                "ipTags": []
            }
        });
        self.state().public_ips.insert(key(&id), doc);
        id
    }

    /// The public IP as a GET would answer it.
    pub fn public_ip(&self, id: &str) -> Option<Value> {
        let state = self.state();
        state
            .public_ips
            .get(&key(id))
            .map(|doc| rendered_public_ip(&state, doc))
    }

    /// The id of the ip-configuration public IP `id` sits on, as its `ipConfiguration` shows it.
    pub fn public_ip_config(&self, id: &str) -> Option<String> {
        self.public_ip(id)?["properties"]["ipConfiguration"]["id"]
            .as_str()
            .map(str::to_owned)
    }

    /// Takes `actions` back from the caller's role (an admin editing the role assignment), in
    /// place of any taken back before; an empty list gives them all back.
    pub fn revoke(&self, actions: &[&str]) {
        self.state().revoked = actions.iter().map(|a| (*a).to_owned()).collect();
    }

    /// Cuts NIC list pages to `size` NICs (`None`: one page).
    pub fn set_list_page_size(&self, size: Option<usize>) {
        self.state().list_page_size = size;
    }

    /// From now on (`true`) or no longer, writes the references to other resources in its
    /// answers with another case of the resource group than the referenced resource's own id
    /// (upper case, or lower case when the group is upper case already): a public IP's
    /// `ipConfiguration`, an ip-configuration's `publicIPAddress`, a VM's network interfaces, a
    /// NIC's `virtualMachine`. ARM does this; its ids are case-insensitive.
    pub fn echo_ids_in_other_case(&self, on: bool) {
        self.state().other_case = on;
    }

    /// The `Retry-After` (seconds) of the answers from now on, in place of
    /// [`ArmConfig::retry_after`]; `None` sends none.
    pub fn set_retry_after(&self, seconds: Option<u64>) {
        self.state().retry_after = seconds;
    }

    /// The NIC document as a GET would answer it.
    pub fn nic(&self, nic: &str) -> Option<Value> {
        let state = self.state();
        state
            .nics
            .get(&key(nic))
            .map(|n| rendered(n, state.other_case))
    }

    /// The addresses on a NIC, in list order.
    pub fn nic_addresses(&self, nic: &str) -> Vec<IpAddr> {
        self.nic(nic).map(|doc| addresses(&doc)).unwrap_or_default()
    }

    /// Another writer's edit of a NIC (a human, another controller): `edit` changes the stored
    /// document and the etag moves on.
    pub fn edit_nic(&self, nic: &str, edit: impl FnOnce(&mut Value)) {
        let mut state = self.state();
        if let Some(n) = state.nics.get_mut(&key(nic)) {
            edit(&mut n.doc);
            n.etag += 1;
        }
    }

    /// Puts the ip-configuration holding `ip` into a load-balancer backend pool, as the cloud
    /// provider's service controller does for the node's configurations.
    pub fn add_to_lb_pool(&self, nic: &str, ip: IpAddr, pool_id: &str) {
        self.edit_nic(nic, |doc| {
            for config in configs_mut(doc) {
                if config_ip(config) == Some(ip) {
                    config["properties"]["loadBalancerBackendAddressPools"] =
                        json!([{ "id": pool_id }]);
                }
            }
        });
    }

    /// The load-balancer pools of the ip-configuration holding `ip`.
    pub fn lb_pools(&self, nic: &str, ip: IpAddr) -> usize {
        let Some(doc) = self.nic(nic) else { return 0 };
        configs(&doc)
            .iter()
            .find(|c| config_ip(c) == Some(ip))
            .and_then(|c| {
                c["properties"]["loadBalancerBackendAddressPools"]
                    .as_array()
                    .map(Vec::len)
            })
            .unwrap_or(0)
    }

    /// The addresses of each NIC in `nics`, in list order, read at one instant (under one lock,
    /// so a move cannot slip between two reads).
    pub fn addresses_at_once(&self, nics: &[&str]) -> Vec<Vec<IpAddr>> {
        let state = self.state();
        nics.iter()
            .map(|nic| {
                state
                    .nics
                    .get(&key(nic))
                    .map(|n| addresses(&n.doc))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// How long the NIC updates started from now on stay `InProgress`.
    pub fn set_operation_time(&self, time: Duration) {
        self.state().operation_time = Some(time);
    }

    /// Makes the next NIC update's operation end `Failed` with `code` and `message`.
    pub fn fail_next_operation(&self, code: &str, message: &str) {
        self.state()
            .failures
            .push((code.to_owned(), message.to_owned()));
    }

    /// Calls per route class (`GET vm`, `GET nic`, `PUT nic`, `GET subnet`, `GET vnet`,
    /// `GET operation`, `POST token`) and per answer (`PUT nic 412`, ...).
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.state().counts.clone()
    }

    /// The `If-Match` of every NIC PUT, in order.
    pub fn if_match_seen(&self) -> Vec<Option<String>> {
        self.state().if_match.clone()
    }

    /// Every schema violation found in a PUT body (each also refused with 400).
    pub fn schema_violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// Every NIC PUT body, in order.
    pub fn put_bodies(&self) -> Vec<Value> {
        self.state().bodies.clone()
    }

    /// The grant types of the token requests (`client_secret`, `client_assertion` for a
    /// federated token, `client_certificate` for a certificate's signed assertion, `refused
    /// client_certificate`), in order.
    pub fn grants(&self) -> Vec<String> {
        self.state().grants.clone()
    }

    /// The scopes tokens were asked for, in order.
    pub fn token_scopes(&self) -> Vec<String> {
        self.state().tokens.iter().map(|(_, s)| s.clone()).collect()
    }

    /// Every `User-Agent` sent, by route class (`GET metadata`, `POST token`, `GET nic`, ...;
    /// an empty string for a request without one).
    pub fn user_agents(&self) -> BTreeMap<String, std::collections::BTreeSet<String>> {
        self.state().agents.clone()
    }
}

/// The ip-configurations of a NIC document.
pub fn configs(doc: &Value) -> Vec<Value> {
    doc["properties"]["ipConfigurations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn configs_mut(doc: &mut Value) -> impl Iterator<Item = &mut Value> {
    doc["properties"]["ipConfigurations"]
        .as_array_mut()
        .into_iter()
        .flatten()
}

/// The address of an ip-configuration document.
pub fn config_ip(config: &Value) -> Option<IpAddr> {
    config["properties"]["privateIPAddress"]
        .as_str()?
        .parse()
        .ok()
}

/// Every address of a NIC document.
pub fn addresses(doc: &Value) -> Vec<IpAddr> {
    configs(doc).iter().filter_map(config_ip).collect()
}

fn etag(n: u64) -> String {
    format!("W/\"{n:016x}\"")
}

/// `id` with its resource group in another case: upper case, or lower case when it is upper
/// case already (see [`ArmFake::echo_ids_in_other_case`]).
fn in_other_case(id: &str) -> String {
    let mut segments: Vec<String> = id.split('/').map(str::to_owned).collect();
    if let Some(at) = segments
        .iter()
        .position(|s| s.eq_ignore_ascii_case("resourceGroups"))
        && let Some(group) = segments.get_mut(at + 1)
    {
        *group = if group.chars().any(|c| c.is_ascii_lowercase()) {
            group.to_ascii_uppercase()
        } else {
            group.to_ascii_lowercase()
        };
    }
    segments.join("/")
}

/// The reference `id` as an answer writes it.
fn reference(id: &str, other_case: bool) -> String {
    if other_case {
        in_other_case(id)
    } else {
        id.to_owned()
    }
}

/// Rewrites the string at `pointer` in `doc` as a reference ([`reference`]).
fn echo_at(doc: &mut Value, pointer: &str, other_case: bool) {
    if let Some(id) = doc.pointer_mut(pointer)
        && let Some(text) = id.as_str()
    {
        *id = json!(reference(text, other_case));
    }
}

/// A NIC as GET answers it: stored document + etag + provisioning states + sub-resource ids,
/// references to other resources written as [`reference`] does.
fn rendered(nic: &NicState, other_case: bool) -> Value {
    let mut doc = nic.doc.clone();
    echo_at(&mut doc, "/properties/virtualMachine/id", other_case);
    let state = if nic.running.is_some() {
        "Updating"
    } else {
        "Succeeded"
    };
    let nic_id = doc["id"].as_str().unwrap_or_default().to_owned();
    doc["etag"] = json!(etag(nic.etag));
    doc["properties"]["provisioningState"] = json!(state);
    for config in configs_mut(&mut doc) {
        let name = config["name"].as_str().unwrap_or_default().to_owned();
        config["id"] = json!(format!("{nic_id}/ipConfigurations/{name}"));
        config["etag"] = json!(etag(nic.etag));
        config["type"] = json!("Microsoft.Network/networkInterfaces/ipConfigurations");
        config["properties"]["provisioningState"] = json!(state);
        echo_at(config, "/properties/publicIPAddress/id", other_case);
    }
    doc
}

/// The public IP a configuration document names, if any.
fn config_public_ip(config: &Value) -> Option<&str> {
    config["properties"]["publicIPAddress"]["id"].as_str()
}

/// The id of the ip-configuration holding public IP `public_key`, if one does.
fn holder_of_public_ip(state: &State, public_key: &str) -> Option<String> {
    state.nics.values().find_map(|nic| {
        configs(&nic.doc).iter().find_map(|config| {
            let name = config["name"].as_str()?;
            (key(config_public_ip(config)?) == public_key).then(|| {
                format!(
                    "{}/ipConfigurations/{name}",
                    nic.doc["id"].as_str().unwrap_or_default()
                )
            })
        })
    })
}

/// A public IP as GET answers it: the stored document, its provisioning state, and the
/// ip-configuration holding it (ARM's read-only `ipConfiguration`).
fn rendered_public_ip(state: &State, doc: &Value) -> Value {
    let mut doc = doc.clone();
    doc["etag"] = json!(etag(1));
    doc["properties"]["provisioningState"] = json!("Succeeded");
    let id = doc["id"].as_str().map(key).unwrap_or_default();
    if let Some(config) = holder_of_public_ip(state, &id) {
        doc["properties"]["ipConfiguration"] =
            json!({ "id": reference(&config, state.other_case) });
    }
    doc
}

fn arm_error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({ "error": { "code": code, "message": message } });
    json_answer(status, &body)
}

fn json_answer(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

fn with_retry_after(
    mut response: Response<Full<Bytes>>,
    retry_after: Option<u64>,
) -> Response<Full<Bytes>> {
    if let Some(secs) = retry_after
        && let Ok(value) = http::HeaderValue::from_str(&secs.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

async fn handle(shared: &Shared, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return arm_error(
                StatusCode::BAD_REQUEST,
                "InvalidRequestContent",
                "unreadable body",
            );
        }
    };
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or("").to_owned();
    let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
    let agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let audience = shared.audience();
    if parts.method == Method::POST && path.ends_with("/oauth2/v2.0/token") {
        bump(&mut state, "POST token");
        note_agent(&mut state, "POST token", agent);
        let audience = format!("{}{path}", shared.url);
        return token(&mut state, &body, &audience, &shared.config);
    }
    if parts.method == Method::GET && path.trim_end_matches('/') == "/metadata/endpoints" {
        bump(&mut state, "GET metadata");
        note_agent(&mut state, "GET metadata", agent);
        return metadata(shared, &audience, &query);
    }
    let bearer = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let issued = bearer.and_then(|t| state.tokens.iter().find(|(known, _)| known == t).cloned());
    let scope = format!("{}/.default", audience.trim_end_matches('/'));
    if let Some((_, asked)) = &issued
        && *asked != scope
    {
        bump(&mut state, "401 audience");
        return arm_error(
            StatusCode::UNAUTHORIZED,
            "InvalidAuthenticationTokenAudience",
            &format!(
                "The access token has been obtained for wrong audience or resource '{asked}'. It \
                 should exactly match with one of the allowed audiences '{audience}'."
            ),
        );
    }
    if issued.is_none() {
        bump(&mut state, "401");
        return arm_error(
            StatusCode::UNAUTHORIZED,
            "AuthenticationFailed",
            "Authentication failed. The 'Authorization' header is missing or invalid.",
        );
    }
    if !query.split('&').any(|p| p.starts_with("api-version=")) {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        );
    }
    let lower = path.to_ascii_lowercase();
    let segments: Vec<&str> = lower.trim_matches('/').split('/').collect();
    // The resource type before the last name: `GET networkinterfaces`, `GET operations`, ...
    let class = format!(
        "{} {}",
        parts.method,
        segments.iter().rev().nth(1).copied().unwrap_or_default()
    );
    note_agent(&mut state, &class, agent);
    let holds = |action: &str| {
        let granted = shared
            .config
            .permissions
            .as_ref()
            .is_none_or(|granted| granted.iter().any(|g| g.eq_ignore_ascii_case(action)));
        granted && !state.revoked.iter().any(|r| r.eq_ignore_ascii_case(action))
    };
    if let Some(action) = actions(&parts.method, &segments, &body)
        .into_iter()
        .find(|action| !holds(action))
    {
        bump(&mut state, &format!("403 {action}"));
        return arm_error(
            StatusCode::FORBIDDEN,
            "AuthorizationFailed",
            &format!(
                "The client 'cloudnet-e2e' with object id 'cloudnet-e2e' does not have \
                 authorization to perform action '{action}' over scope '{path}' or the scope is \
                 invalid. If access was recently granted, please refresh your credentials."
            ),
        );
    }
    let if_match = parts
        .headers
        .get(header::IF_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| shared.url.clone(), |h| format!("http://{h}"));
    let answer = match (parts.method.clone(), segments.as_slice()) {
        (
            Method::GET,
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "networkinterfaces",
            ],
        ) => {
            bump(&mut state, "GET nic list");
            settle(&mut state, shared);
            list_nics(&state, &host, &path, &lower, &query)
        }
        (
            Method::GET,
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachines",
                _,
            ],
        ) => {
            bump(&mut state, "GET vm");
            get_vm(&state, &lower)
        }
        (
            Method::GET,
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "networkinterfaces",
                _,
            ],
        ) => {
            bump(&mut state, "GET nic");
            settle(&mut state, shared);
            match state.nics.get(&key(&lower)) {
                Some(nic) => json_answer(StatusCode::OK, &rendered(nic, state.other_case)),
                None => not_found("Microsoft.Network/networkInterfaces", &path),
            }
        }
        (
            Method::PUT,
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "networkinterfaces",
                _,
            ],
        ) => {
            bump(&mut state, "PUT nic");
            settle(&mut state, shared);
            state.if_match.push(if_match.clone());
            put_nic(&mut state, shared, &lower, if_match.as_deref(), &body)
        }
        (
            Method::GET,
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "publicipaddresses",
                _,
            ],
        ) => {
            bump(&mut state, "GET public ip");
            settle(&mut state, shared);
            match state.public_ips.get(&key(&lower)) {
                Some(doc) => json_answer(StatusCode::OK, &rendered_public_ip(&state, doc)),
                None => not_found("Microsoft.Network/publicIPAddresses", &path),
            }
        }
        (
            Method::GET,
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "virtualnetworks",
                _,
                "subnets",
                _,
            ],
        ) => {
            bump(&mut state, "GET subnet");
            match state.subnets.get(&key(&lower)) {
                Some(subnet) => json_answer(StatusCode::OK, &subnet_doc(subnet)),
                None => not_found("Microsoft.Network/virtualNetworks/subnets", &path),
            }
        }
        (
            Method::GET,
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "virtualnetworks",
                _,
            ],
        ) => {
            bump(&mut state, "GET vnet");
            let prefix = format!("{}/subnets/", key(&lower));
            let subnets: Vec<Value> = state
                .subnets
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(_, s)| subnet_doc(s))
                .collect();
            if subnets.is_empty() {
                not_found("Microsoft.Network/virtualNetworks", &path)
            } else {
                json_answer(
                    StatusCode::OK,
                    &json!({ "id": path, "name": segments.last(), "location": shared.config.location, "properties": { "subnets": subnets, "provisioningState": "Succeeded" } }),
                )
            }
        }
        (
            Method::GET,
            [
                "subscriptions",
                _,
                "providers",
                "microsoft.network",
                "locations",
                _,
                "operations",
                id,
            ],
        ) => {
            bump(&mut state, "GET operation");
            settle(&mut state, shared);
            match state.operations.get(*id) {
                Some(op) => {
                    let doc = match &op.finished {
                        Some(doc) => doc.clone(),
                        None => json!({ "status": "InProgress" }),
                    };
                    with_retry_after(json_answer(StatusCode::OK, &doc), state.retry_after)
                }
                None => not_found("operations", &path),
            }
        }
        _ => arm_error(
            StatusCode::NOT_FOUND,
            "InvalidResourceType",
            &format!("no route for {} {path}", parts.method),
        ),
    };
    let class = match parts.method {
        Method::PUT => "PUT nic",
        _ => "GET",
    };
    if !answer.status().is_success() {
        bump(&mut state, &format!("{class} {}", answer.status().as_u16()));
    }
    answer
}

/// The actions ARM's access check requires of a call: the resource's own read or write, and for
/// a NIC write the linked-access checks on what its ip-configurations join (every one names a
/// subnet; some name load balancer pools or a public IP). Linked access is checked on every
/// resource the body references, not only on the ones the PUT changes.
fn actions(method: &Method, segments: &[&str], body: &[u8]) -> Vec<&'static str> {
    match (method, segments) {
        (&Method::GET, [.., "microsoft.compute", "virtualmachines", _]) => {
            vec!["Microsoft.Compute/virtualMachines/read"]
        }
        (&Method::GET, [.., "microsoft.network", "networkinterfaces", _])
        | (&Method::GET, [.., "microsoft.network", "networkinterfaces"]) => {
            vec!["Microsoft.Network/networkInterfaces/read"]
        }
        (&Method::PUT, [.., "microsoft.network", "networkinterfaces", _]) => {
            let mut needed = vec![
                "Microsoft.Network/networkInterfaces/write",
                "Microsoft.Network/virtualNetworks/subnets/join/action",
            ];
            let doc = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
            let properties = doc
                .pointer("/properties/ipConfigurations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("properties"));
            let (mut joins_pools, mut joins_public_ip) = (false, false);
            for p in properties {
                joins_pools |= p["loadBalancerBackendAddressPools"]
                    .as_array()
                    .is_some_and(|pools| !pools.is_empty());
                joins_public_ip |= p["publicIPAddress"].is_object();
            }
            if joins_pools {
                needed.push("Microsoft.Network/loadBalancers/backendAddressPools/join/action");
            }
            if joins_public_ip {
                needed.push("Microsoft.Network/publicIPAddresses/join/action");
            }
            needed
        }
        (&Method::GET, [.., "microsoft.network", "publicipaddresses", _]) => {
            vec!["Microsoft.Network/publicIPAddresses/read"]
        }
        (&Method::GET, [.., "microsoft.network", "virtualnetworks", _, "subnets", _]) => {
            vec!["Microsoft.Network/virtualNetworks/subnets/read"]
        }
        (&Method::GET, [.., "microsoft.network", "virtualnetworks", _]) => {
            vec!["Microsoft.Network/virtualNetworks/read"]
        }
        _ => Vec::new(),
    }
}

fn note_agent(state: &mut State, class: &str, agent: String) {
    state
        .agents
        .entry(class.to_owned())
        .or_default()
        .insert(agent);
}

/// The metadata endpoint's answer: the login endpoint and audience tokens are to come from.
fn metadata(shared: &Shared, audience: &str, query: &str) -> Response<Full<Bytes>> {
    if crate::fakes::form::value(query, "api-version").is_none() {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        );
    }
    let login = shared
        .config
        .login_endpoint
        .clone()
        .unwrap_or_else(|| format!("{}/", shared.url));
    json_answer(
        StatusCode::OK,
        &json!({
            "galleryEndpoint": "",
            "graphEndpoint": "https://graph.windows.net/",
            "portalEndpoint": "",
            "authentication": { "loginEndpoint": login, "audiences": [audience] }
        }),
    )
}

fn bump(state: &mut State, route: &str) {
    *state.counts.entry(route.to_owned()).or_default() += 1;
}

fn not_found(kind: &str, path: &str) -> Response<Full<Bytes>> {
    arm_error(
        StatusCode::NOT_FOUND,
        "ResourceNotFound",
        &format!("The Resource '{kind}' under '{path}' was not found."),
    )
}

/// Checks a certificate's client assertion as Entra ID does: signed (RS256) by the registered
/// certificate's key, for this token URL, by and about the client; `Err` says why not.
fn check_certificate_assertion(
    assertion: &str,
    client_id: &str,
    audience: &str,
    key: Option<&[u8]>,
) -> Result<(), String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = assertion.split('.').collect();
    if parts.len() != 3 {
        return Err("AADSTS50027: the assertion is not a JWT".into());
    }
    let decode = |part: &str| -> Result<Value, String> {
        let bytes = b64.decode(part).map_err(|_| "AADSTS50027: bad base64url")?;
        serde_json::from_slice(&bytes).map_err(|_| "AADSTS50027: bad JSON".to_owned())
    };
    let (header, claims) = (decode(parts[0])?, decode(parts[1])?);
    if header["alg"] != "RS256" || header["x5c"].as_array().is_none_or(Vec::is_empty) {
        return Err(format!("AADSTS5002738: unexpected header {header}"));
    }
    let key = key.ok_or("AADSTS700027: no certificate is registered for the application")?;
    let signature = b64
        .decode(parts[2])
        .map_err(|_| "AADSTS50027: bad signature encoding")?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, key)
        .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
        .map_err(|_| "AADSTS700027: Client assertion contains an invalid signature.")?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    if claims["aud"] != audience
        || claims["iss"] != client_id
        || claims["sub"] != client_id
        || claims["exp"].as_i64().is_none_or(|exp| exp <= now)
    {
        return Err(format!(
            "AADSTS50013: assertion claims {claims} do not fit client {client_id} at {audience}"
        ));
    }
    Ok(())
}

fn token(
    state: &mut State,
    body: &[u8],
    audience: &str,
    config: &ArmConfig,
) -> Response<Full<Bytes>> {
    let form = String::from_utf8_lossy(body);
    let field = |name: &str| {
        form.split('&')
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_owned())
    };
    let grant = field("grant_type").unwrap_or_default();
    let has_secret = field("client_secret").is_some_and(|s| !s.is_empty());
    let has_assertion = field("client_assertion").is_some_and(|s| !s.is_empty());
    if grant != "client_credentials"
        || field("client_id").is_none()
        || !(has_secret || has_assertion)
    {
        return json_answer(
            StatusCode::BAD_REQUEST,
            &json!({ "error": "invalid_request", "error_description": "AADSTS900144: a required parameter is missing" }),
        );
    }
    let assertion = crate::fakes::form::value(&form, "client_assertion").unwrap_or_default();
    let names_certificate = assertion
        .split('.')
        .next()
        .and_then(|h| {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h)
                .ok()
        })
        .and_then(|h| serde_json::from_slice::<Value>(&h).ok())
        .is_some_and(|h| h.get("x5t").is_some());
    if names_certificate {
        let client = crate::fakes::form::value(&form, "client_id").unwrap_or_default();
        if let Err(why) = check_certificate_assertion(
            &assertion,
            &client,
            audience,
            config.client_certificate_key.as_deref(),
        ) {
            state.grants.push("refused client_certificate".into());
            return json_answer(
                StatusCode::UNAUTHORIZED,
                &json!({ "error": "invalid_client", "error_description": why }),
            );
        }
    }
    state.grants.push(if names_certificate {
        "client_certificate".into()
    } else if has_assertion {
        "client_assertion".into()
    } else {
        "client_secret".into()
    });
    let token = format!("fake-arm-token-{}", state.tokens.len() + 1);
    let scope = crate::fakes::form::value(&form, "scope").unwrap_or_default();
    state.tokens.push((token.clone(), scope));
    json_answer(
        StatusCode::OK,
        &json!({ "token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token }),
    )
}

/// A resource group's NICs (`lower` is the list's path, lower-cased), by id, one page from
/// `$skiptoken` on; the next page's link names `host`, as the request did.
fn list_nics(
    state: &State,
    host: &str,
    path: &str,
    lower: &str,
    query: &str,
) -> Response<Full<Bytes>> {
    let prefix = format!("{lower}/");
    let mut nics: Vec<(&String, &NicState)> = state
        .nics
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .collect();
    nics.sort_by_key(|(k, _)| *k);
    let skip = match crate::fakes::form::value(query, "$skiptoken") {
        None => 0,
        Some(token) => match token.parse::<usize>() {
            Ok(n) => n,
            Err(_) => {
                return arm_error(
                    StatusCode::BAD_REQUEST,
                    "InvalidSkipToken",
                    &format!("The skip token '{token}' is not valid."),
                );
            }
        },
    };
    let size = state.list_page_size.unwrap_or(usize::MAX).max(1);
    let value: Vec<Value> = nics
        .iter()
        .skip(skip)
        .take(size)
        .map(|(_, nic)| rendered(nic, state.other_case))
        .collect();
    let mut body = json!({ "value": value });
    if skip.saturating_add(size) < nics.len() {
        let api = crate::fakes::form::value(query, "api-version").unwrap_or_default();
        body["nextLink"] = json!(format!(
            "{host}{path}?api-version={api}&$skiptoken={}",
            skip + size
        ));
    }
    json_answer(StatusCode::OK, &body)
}

fn get_vm(state: &State, path: &str) -> Response<Full<Bytes>> {
    match state.vms.get(&key(path)) {
        Some(nic) => json_answer(
            StatusCode::OK,
            &json!({
                "id": path,
                "name": path.rsplit('/').next(),
                "type": "Microsoft.Compute/virtualMachines",
                "properties": {
                    "provisioningState": "Succeeded",
                    "networkProfile": { "networkInterfaces": [{ "id": reference(nic, state.other_case), "properties": { "primary": true } }] }
                }
            }),
        ),
        None => not_found("Microsoft.Compute/virtualMachines", path),
    }
}

fn subnet_doc(subnet: &SubnetState) -> Value {
    let prefixes: Vec<String> = subnet.prefixes.iter().map(ToString::to_string).collect();
    let mut properties = json!({ "provisioningState": "Succeeded" });
    if let [only] = prefixes.as_slice() {
        properties["addressPrefix"] = json!(only);
    } else {
        properties["addressPrefixes"] = json!(prefixes);
    }
    json!({
        "id": subnet.id,
        "name": subnet.id.rsplit('/').next(),
        "type": "Microsoft.Network/virtualNetworks/subnets",
        "properties": properties
    })
}

/// Finishes every operation whose time is up.
fn settle(state: &mut State, shared: &Shared) {
    let now = Instant::now();
    let due: Vec<String> = state
        .operations
        .iter()
        .filter(|(_, op)| op.finished.is_none() && op.done_at <= now)
        .map(|(id, _)| id.clone())
        .collect();
    for id in due {
        let Some(op) = state.operations.get(&id).cloned() else {
            continue;
        };
        let finished = match &op.failure {
            None => json!({ "status": "Succeeded" }),
            Some((code, message)) => {
                json!({ "status": "Failed", "error": { "code": code, "message": message } })
            }
        };
        if let Some(nic) = state.nics.get_mut(&op.nic) {
            if let Some((_, _, before)) = nic.running.take()
                && op.failure.is_some()
            {
                nic.doc = before;
            }
            // The end of the operation is a write too: provisioning state and etag move on.
            nic.etag += 1;
        }
        if let Some(stored) = state.operations.get_mut(&id) {
            stored.finished = Some(finished);
        }
        let _ = shared;
    }
}

fn put_nic(
    state: &mut State,
    shared: &Shared,
    path: &str,
    if_match: Option<&str>,
    body: &[u8],
) -> Response<Full<Bytes>> {
    let config = &shared.config;
    let nic_key = key(path);
    let Some(current) = state.nics.get(&nic_key).cloned() else {
        // Creating NICs is not what the provider does.
        return not_found("Microsoft.Network/networkInterfaces", path);
    };
    let Ok(body): std::result::Result<Value, _> = serde_json::from_slice(body) else {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "InvalidRequestFormat",
            "Cannot parse the request.",
        );
    };
    state.bodies.push(body.clone());
    let problems = shared.schema.check("NetworkInterface", &body);
    if !problems.is_empty() {
        let text = problems.join("; ");
        state.violations.extend(problems);
        return arm_error(
            StatusCode::BAD_REQUEST,
            "InvalidRequestFormat",
            &format!("Cannot parse the request: {text}"),
        );
    }
    if let Some(expected) = if_match
        && expected != "*"
        && expected != etag(current.etag)
    {
        return arm_error(
            StatusCode::PRECONDITION_FAILED,
            "PreconditionFailed",
            &format!(
                "The condition specified using HTTP conditional header(s) is not met: If-Match {expected} does not match the current etag."
            ),
        );
    }
    if let Some((op, _, _)) = &current.running {
        let retry_after = state.retry_after;
        return with_retry_after(
            arm_error(
                StatusCode::CONFLICT,
                "AnotherOperationInProgress",
                &format!(
                    "Another operation on this or dependent resource is in progress. To retry later, use the operation {op}."
                ),
            ),
            retry_after,
        );
    }
    let new_doc = match replaced(state, &nic_key, &current.doc, &body) {
        Ok(doc) => doc,
        Err((code, message)) => return arm_error(StatusCode::BAD_REQUEST, &code, &message),
    };
    state.next_operation += 1;
    let op_id = format!("op-{:08}", state.next_operation);
    let failure = (!state.failures.is_empty()).then(|| state.failures.remove(0));
    let done_at = Instant::now() + state.operation_time.unwrap_or(config.operation_time);
    state.operations.insert(
        op_id.clone(),
        Operation {
            nic: nic_key.clone(),
            done_at,
            failure,
            finished: None,
        },
    );
    let (other_case, retry_after) = (state.other_case, state.retry_after);
    let Some(nic) = state.nics.get_mut(&nic_key) else {
        return not_found("Microsoft.Network/networkInterfaces", path);
    };
    nic.running = Some((op_id.clone(), done_at, current.doc.clone()));
    nic.doc = new_doc;
    nic.etag += 1;
    let answer = rendered(nic, other_case);
    let subscription = path.split('/').nth(2).unwrap_or_default();
    let status_url = format!(
        "{}/subscriptions/{subscription}/providers/Microsoft.Network/locations/{}/operations/{op_id}?api-version=2024-03-01",
        shared.url, config.location
    );
    let mut response = with_retry_after(json_answer(StatusCode::OK, &answer), retry_after);
    if let Ok(value) = http::HeaderValue::from_str(&status_url) {
        response.headers_mut().insert("azure-asyncoperation", value);
    }
    response
}

/// The stored document a PUT of `body` leaves: the body's writable fields replace the stored
/// ones (full replace), read-only fields stay as stored. `Err` is ARM's refusal.
fn replaced(
    state: &State,
    nic_key: &str,
    stored: &Value,
    body: &Value,
) -> std::result::Result<Value, (String, String)> {
    let mut doc = json!({
        "id": stored["id"],
        "name": stored["name"],
        "type": stored["type"],
        "location": stored["location"],
    });
    if let Some(tags) = body.get("tags") {
        doc["tags"] = tags.clone();
    }
    let mut properties = serde_json::Map::new();
    let body_props = body["properties"].as_object().cloned().unwrap_or_default();
    let read_only = [
        "virtualMachine",
        "privateEndpoint",
        "tapConfigurations",
        "macAddress",
        "primary",
        "vnetEncryptionSupported",
        "hostedWorkloads",
        "dscpConfiguration",
        "resourceGuid",
        "provisioningState",
    ];
    for (k, v) in &body_props {
        if !read_only.contains(&k.as_str()) {
            properties.insert(k.clone(), v.clone());
        }
    }
    for k in read_only {
        if let Some(v) = stored["properties"].get(k)
            && k != "provisioningState"
        {
            properties.insert(k.to_owned(), v.clone());
        }
    }
    let configs = properties
        .get("ipConfigurations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if configs.is_empty() {
        return Err((
            "NetworkInterfaceMustHaveAtLeastOneIpConfiguration".into(),
            "A network interface must have at least one IP configuration.".into(),
        ));
    }
    if configs.len() > MAX_IP_CONFIGS {
        return Err((
            "MaxNumberOfIpConfigurationsPerNicReached".into(),
            format!(
                "Network interface has {} IP configurations; at most {MAX_IP_CONFIGS} are allowed.",
                configs.len()
            ),
        ));
    }
    let primaries = configs
        .iter()
        .filter(|c| c["properties"]["primary"].as_bool() == Some(true))
        .count();
    if primaries != 1 && configs.len() > 1 {
        return Err((
            "NetworkInterfaceMustHaveExactlyOnePrimaryIpConfiguration".into(),
            format!(
                "Network interface must have exactly one primary IP configuration, has {primaries}."
            ),
        ));
    }
    let mut names: Vec<String> = Vec::new();
    let mut seen: Vec<IpAddr> = Vec::new();
    let mut public_ips: Vec<String> = Vec::new();
    let mut clean = Vec::with_capacity(configs.len());
    for config in &configs {
        let name = config["name"].as_str().unwrap_or_default().to_owned();
        if !valid_name(&name) {
            return Err((
                "InvalidResourceName".into(),
                format!(
                    "Resource name {name:?} is invalid. The name can be up to 80 characters long. It must begin with a word character, and it must end with a word character or with '_'. The name may contain word characters or '.', '-', '_'."
                ),
            ));
        }
        if names.iter().any(|n| n.eq_ignore_ascii_case(&name)) {
            return Err((
                "DuplicateResourceName".into(),
                format!("Network interface has two IP configurations named {name}."),
            ));
        }
        names.push(name.clone());
        let props = &config["properties"];
        let Some(ip) = config_ip(config) else {
            return Err((
                "PrivateIPAddressRequired".into(),
                format!(
                    "IP configuration {name} has no private IP address (the fake allocates none)."
                ),
            ));
        };
        let version = props["privateIPAddressVersion"].as_str().unwrap_or("IPv4");
        if (version == "IPv6") != ip.is_ipv6() {
            return Err((
                "PrivateIPAddressVersionMismatch".into(),
                format!("IP configuration {name}: address {ip} is not {version}."),
            ));
        }
        let subnet_id = props["subnet"]["id"].as_str().unwrap_or_default();
        let Some(subnet) = state.subnets.get(&key(subnet_id)) else {
            return Err((
                "InvalidResourceReference".into(),
                format!(
                    "Resource {subnet_id} referenced by IP configuration {name} was not found."
                ),
            ));
        };
        let Some(prefix) = subnet.prefixes.iter().find(|p| p.contains(&ip)) else {
            return Err((
                "PrivateIPAddressNotInSubnet".into(),
                format!(
                    "Private static IP address {ip} does not belong to the range of subnet prefix {:?}.",
                    subnet
                        .prefixes
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                ),
            ));
        };
        if reserved(prefix, ip) {
            return Err((
                "PrivateIPAddressInReservedRange".into(),
                format!(
                    "Private static IP address {ip} falls within reserved IP range of subnet prefix {prefix}."
                ),
            ));
        }
        if seen.contains(&ip) {
            return Err((
                "PrivateIPAddressIsAllocated".into(),
                format!(
                    "IP configuration {name} is using the private IP address {ip} which is already allocated to another IP configuration of this network interface."
                ),
            ));
        }
        seen.push(ip);
        let holder = state
            .nics
            .iter()
            .find(|(k, n)| k.as_str() != nic_key && addresses(&n.doc).contains(&ip));
        if let Some((other, _)) = holder {
            return Err((
                "PrivateIPAddressIsAllocated".into(),
                format!(
                    "IP configuration {name} is using the private IP address {ip} which is already allocated to resource {other}."
                ),
            ));
        }
        let public_ip = match config_public_ip(config) {
            None => None,
            Some(public) => Some(public_ip_for(
                state,
                nic_key,
                &name,
                public,
                &mut public_ips,
            )?),
        };
        let mut kept = json!({ "name": name, "properties": {} });
        if let Some(p) = props.as_object() {
            for (k, v) in p {
                if k != "provisioningState" && k != "privateLinkConnectionProperties" {
                    kept["properties"][k] = v.clone();
                }
            }
        }
        // ARM keeps the reference only; whatever else the body says of the public IP is ignored.
        if let Some(id) = public_ip {
            kept["properties"]["publicIPAddress"] = json!({ "id": id });
        }
        clean.push(kept);
    }
    properties.insert("ipConfigurations".into(), Value::Array(clean));
    doc["properties"] = Value::Object(properties);
    Ok(doc)
}

/// The stored id of public IP `public`, which configuration `name` of NIC `nic_key` names: it
/// must exist, and neither another NIC's configuration nor another of this body
/// (`already`) may hold it. `Err` is ARM's refusal.
fn public_ip_for(
    state: &State,
    nic_key: &str,
    name: &str,
    public: &str,
    already: &mut Vec<String>,
) -> std::result::Result<String, (String, String)> {
    let public_key = key(public);
    let Some(doc) = state.public_ips.get(&public_key) else {
        return Err((
            "InvalidResourceReference".into(),
            format!("Resource {public} referenced by IP configuration {name} was not found."),
        ));
    };
    // This NIC's stored configurations do not count: the body replaces them all.
    let elsewhere = holder_of_public_ip(state, &public_key)
        .filter(|holder| !key(holder).starts_with(&format!("{nic_key}/")))
        .map(|holder| format!("IP configuration {holder}"));
    let twice = already
        .contains(&public_key)
        .then(|| "another IP configuration of this network interface".to_owned());
    if let Some(holder) = elsewhere.or(twice) {
        return Err((
            "PublicIPAddressInUse".into(),
            format!(
                "Public IP address {public} is already in use by {holder}; it cannot be used by IP configuration {name}."
            ),
        ));
    }
    already.push(public_key);
    Ok(doc["id"].as_str().unwrap_or(public).to_owned())
}

/// ARM's reserved addresses of a subnet prefix: the first four and the last.
fn reserved(prefix: &ipnet::IpNet, ip: IpAddr) -> bool {
    let (offset, last) = match (prefix, ip) {
        (ipnet::IpNet::V4(net), IpAddr::V4(v4)) => (
            u128::from(u32::from(v4) - u32::from(net.network())),
            u128::from(u32::from(net.broadcast()) - u32::from(net.network())),
        ),
        (ipnet::IpNet::V6(net), IpAddr::V6(v6)) => (
            u128::from(v6) - u128::from(net.network()),
            u128::from(net.broadcast()) - u128::from(net.network()),
        ),
        _ => return false,
    };
    offset < 4 || offset == last
}

fn valid_name(name: &str) -> bool {
    let chars_ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let last_ok = name
        .chars()
        .last()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    chars_ok && first_ok && last_ok && name.len() <= 80
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_call_needs_the_actions_arm_checks() {
        let path = path_segments;
        let subnet = path("microsoft.network/virtualnetworks/v/subnets/w");
        assert_eq!(
            actions(&Method::GET, &subnet, b""),
            ["Microsoft.Network/virtualNetworks/subnets/read"]
        );
        let vnet = path("microsoft.network/virtualnetworks/v");
        assert_eq!(
            actions(&Method::GET, &vnet, b""),
            ["Microsoft.Network/virtualNetworks/read"]
        );
        let nic = path("microsoft.network/networkinterfaces/n");
        let plain = br#"{"properties":{"ipConfigurations":[{"properties":{}}]}}"#;
        assert_eq!(actions(&Method::PUT, &nic, plain).len(), 2);
        let pooled = br#"{"properties":{"ipConfigurations":[{"properties":{"loadBalancerBackendAddressPools":[{"id":"p"}]}}]}}"#;
        assert!(
            actions(&Method::PUT, &nic, pooled)
                .contains(&"Microsoft.Network/loadBalancers/backendAddressPools/join/action")
        );
        // Everything the provider calls is within OpenShift's grant but the subnet read.
        for call in [&nic, &vnet, &path("microsoft.compute/virtualmachines/m")] {
            for action in actions(&Method::GET, call, b"") {
                assert!(CREDENTIALS_REQUEST.contains(&action), "{action}");
            }
        }
        assert!(!CREDENTIALS_REQUEST.contains(&"Microsoft.Network/virtualNetworks/subnets/read"));
    }

    #[test]
    fn reserved_are_the_first_four_and_the_last() {
        let net: ipnet::IpNet = "10.0.0.0/24".parse().unwrap();
        for a in ["10.0.0.0", "10.0.0.1", "10.0.0.3", "10.0.0.255"] {
            assert!(reserved(&net, a.parse().unwrap()), "{a}");
        }
        assert!(!reserved(&net, "10.0.0.4".parse().unwrap()));
        let v6: ipnet::IpNet = "fd00::/64".parse().unwrap();
        assert!(reserved(&v6, "fd00::3".parse().unwrap()));
        assert!(!reserved(&v6, "fd00::4".parse().unwrap()));
    }

    fn state_with_nic() -> (State, Value) {
        let subnet = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/w";
        let mut state = State::default();
        state.subnets.insert(
            key(subnet),
            SubnetState {
                id: subnet.into(),
                prefixes: vec!["10.0.0.0/16".parse().unwrap()],
            },
        );
        let stored = json!({
            "id": "/n", "name": "n", "type": "Microsoft.Network/networkInterfaces", "location": "x",
            "properties": {
                "macAddress": "00-01",
                "dnsSettings": { "dnsServers": ["10.0.0.10"] },
                "ipConfigurations": [{ "name": "ipconfig1", "properties": {
                    "privateIPAddress": "10.0.0.4", "primary": true, "subnet": { "id": subnet } } }]
            }
        });
        (state, stored)
    }

    #[test]
    fn a_put_replaces_writable_fields_and_keeps_read_only_ones() {
        let (state, stored) = state_with_nic();
        let mut body = stored.clone();
        body["properties"]
            .as_object_mut()
            .unwrap()
            .remove("dnsSettings");
        body["properties"]["macAddress"] = json!("ff-ff");
        let doc = replaced(&state, "/other", &stored, &body).unwrap();
        assert!(doc["properties"].get("dnsSettings").is_none(), "{doc}");
        assert_eq!(doc["properties"]["macAddress"], "00-01");
    }

    #[test]
    fn more_than_256_configurations_are_refused() {
        let (state, stored) = state_with_nic();
        let mut body = stored.clone();
        let subnet = stored["properties"]["ipConfigurations"][0]["properties"]["subnet"].clone();
        let list = body["properties"]["ipConfigurations"]
            .as_array_mut()
            .unwrap();
        for i in 0..256u32 {
            let a = std::net::Ipv4Addr::from(0x0a00_0100 + i).to_string();
            list.push(json!({ "name": format!("x_{a}"), "properties": { "privateIPAddress": a, "subnet": subnet } }));
        }
        let (code, _) = replaced(&state, "/other", &stored, &body).unwrap_err();
        assert_eq!(code, "MaxNumberOfIpConfigurationsPerNicReached");
        list_pop(&mut body);
        assert!(replaced(&state, "/other", &stored, &body).is_ok());
    }

    fn list_pop(body: &mut Value) {
        body["properties"]["ipConfigurations"]
            .as_array_mut()
            .unwrap()
            .pop();
    }

    #[test]
    fn a_public_ip_is_kept_as_its_id_held_once_and_shown_where_it_sits() {
        let (mut state, stored) = state_with_nic();
        let public =
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/publicIPAddresses/p";
        state.public_ips.insert(
            key(public),
            json!({ "id": public, "name": "p", "properties": { "ipAddress": "198.51.100.7" } }),
        );
        let with = |config: usize, extra: Value| {
            let mut body = stored.clone();
            body["properties"]["ipConfigurations"][config]["properties"]["publicIPAddress"] = extra;
            body
        };
        let body = with(0, json!({ "id": public.to_uppercase(), "location": "x" }));
        let nic = path_segments("microsoft.network/networkinterfaces/n");
        assert!(
            actions(&Method::PUT, &nic, body.to_string().as_bytes())
                .contains(&"Microsoft.Network/publicIPAddresses/join/action")
        );
        let doc = replaced(&state, "/n", &stored, &body).unwrap();
        let kept = &doc["properties"]["ipConfigurations"][0]["properties"]["publicIPAddress"];
        assert_eq!(kept, &json!({ "id": public }));
        state.nics.insert(
            key("/n"),
            NicState {
                doc,
                etag: 1,
                running: None,
            },
        );
        let shown = rendered_public_ip(&state, &state.public_ips[&key(public)]);
        assert_eq!(
            shown["properties"]["ipConfiguration"]["id"],
            "/n/ipConfigurations/ipconfig1"
        );
        assert_eq!(
            Schema::network_interface().check("PublicIPAddress", &shown),
            Vec::<String>::new()
        );

        // Another NIC may not take it while this one holds it; the holder itself may move it.
        let mut elsewhere = body.clone();
        elsewhere["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] =
            json!("10.0.0.9");
        let (code, _) = replaced(&state, "/other", &stored, &elsewhere).unwrap_err();
        assert_eq!(code, "PublicIPAddressInUse");
        assert!(replaced(&state, "/n", &stored, &body).is_ok());
        let (code, _) =
            replaced(&state, "/n", &stored, &with(0, json!({ "id": "/nope" }))).unwrap_err();
        assert_eq!(code, "InvalidResourceReference");
    }

    fn path_segments(tail: &str) -> Vec<&'static str> {
        format!("subscriptions/s/resourcegroups/rg/providers/{tail}")
            .leak()
            .split('/')
            .collect()
    }

    #[test]
    fn a_reference_in_other_case_changes_the_resource_group_alone() {
        let id = "/subscriptions/s/resourceGroups/Cluster-rg/providers/Microsoft.Network/networkInterfaces/n";
        let upper = in_other_case(id);
        assert_eq!(
            upper,
            "/subscriptions/s/resourceGroups/CLUSTER-RG/providers/Microsoft.Network/networkInterfaces/n"
        );
        assert_eq!(
            in_other_case(&upper),
            "/subscriptions/s/resourceGroups/cluster-rg/providers/Microsoft.Network/networkInterfaces/n"
        );
        assert_eq!(reference(id, false), id);
        assert_eq!(
            in_other_case("/n/ipConfigurations/c"),
            "/n/ipConfigurations/c"
        );
    }

    #[test]
    fn names_follow_arms_rule() {
        assert!(valid_name("worker-0_10.0.0.5"));
        assert!(valid_name("worker-0_fd00--5"));
        assert!(!valid_name("worker-0_fd00::5"));
        assert!(!valid_name("-x"));
        assert!(!valid_name(&"a".repeat(81)));
    }
}
