//! Real Keystone and Neutron (PyPI `keystone`, `neutron`) on free 127.0.0.1 ports, installed once
//! into a versioned Python venv in the cache by `openstack/venv.sh` and started by
//! `openstack/servers.py` (sqlite, no agents, a fake message transport, gunicorn 1×1).
//!
//! [`OpenStackServers::admin`] and [`OpenStackServers::member`] give authenticated JSON access for
//! test set-up (networks, subnets, "server" ports with `device_owner=compute:nova`: no Nova).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::harness::controlplane::{Supervised, cache_root};

/// Environment variable naming an existing venv that holds Keystone, Neutron and gunicorn.
pub const VENV_ENV: &str = "CLOUDNET_OPENSTACK_VENV";
/// How long both servers may take to answer on a loaded 2-core machine (about 16 s idle, 73 s
/// on a new CI machine compiling beside them); servers.py gets the same deadline.
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long one set-up request may go unanswered. Set-up is not a measurement: on a loaded
/// machine Neutron (one sqlite thread, shared by every test of a suite) took over 60 s for a bulk
/// create of 130 ports.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// The per-request timeout of the providers tests build over these servers. Their checks count
/// calls, never time them, and one Neutron thread serves every test of a suite: on a loaded 2-core
/// machine a list of 64 servers' ports waited over 60 s behind other tests' bulk creates.
pub const PROVIDER_CALL_TIMEOUT: Duration = REQUEST_TIMEOUT;
/// How long a set-up request refused for its token keeps authenticating again: a count of
/// logins was not enough at load 12 (two suites on two cores), where each fresh 60 s token
/// expired in Neutron's queue four times in a row.
const LOGINS_FOR: Duration = REQUEST_TIMEOUT;

/// Options of one pair of servers.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Keystone's `[token] expiration`, in seconds.
    pub token_expiration_secs: u32,
    /// Neutron's `max_allowed_address_pairs`.
    pub max_pairs: u32,
    /// Whether Neutron caches Keystone's token validations (its default, 5 minutes); without,
    /// a revoked token is refused at once.
    pub token_cache: bool,
    /// Neutron's `pagination_max_limit`: every list comes in pages of at most this many items
    /// (unset: only a list that asks for pages with `limit`).
    pub pagination_max_limit: Option<u32>,
    /// Whether Neutron runs its L3 router service plugin: routers, external networks and
    /// floating IPs (with `port_details`); off, those resources do not exist.
    pub floating_ips: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            token_expiration_secs: 3600,
            max_pairs: 10,
            token_cache: true,
            pagination_max_limit: None,
            floating_ips: false,
        }
    }
}

/// A user's password credentials, as servers.py created them.
#[derive(Clone, Debug)]
pub struct User {
    /// User name (domain `Default`).
    pub username: String,
    /// Password.
    pub password: String,
    /// Project name (domain `Default`).
    pub project: String,
}

/// A running Keystone and Neutron. Dropping it stops both and removes the run directory.
#[derive(Debug)]
pub struct OpenStackServers {
    process: Supervised,
    dir: PathBuf,
    /// Keystone's URL (without `/v3`).
    pub keystone_url: String,
    /// Neutron's URL (without `/v2.0`).
    pub neutron_url: String,
    /// The cloud admin.
    pub admin: User,
    /// A `member` of project `cloudnet`: the reconciler's credentials.
    pub member: User,
    /// A `reader` of project `cloudnet`: Neutron's default policy refuses it every write.
    pub reader: User,
    /// How long servers.py took from start to both servers answering.
    pub startup: Duration,
}

impl OpenStackServers {
    /// Starts a fresh pair of servers.
    pub async fn start(options: Options) -> Result<Self> {
        let venv = tokio::task::spawn_blocking(locate_venv).await??;
        let dir = tempdir()?;
        let mut command = Command::new(venv.join("bin/python"));
        command
            .arg(crate::crate_file("openstack/servers.py"))
            .arg(&dir)
            .arg("--token-expiration")
            .arg(options.token_expiration_secs.to_string())
            .arg("--max-pairs")
            .arg(options.max_pairs.to_string())
            .arg("--ready-timeout")
            .arg(READY_TIMEOUT.as_secs().to_string());
        if !options.token_cache {
            command.arg("--no-token-cache");
        }
        if let Some(limit) = options.pagination_max_limit {
            command.arg("--pagination-max-limit").arg(limit.to_string());
        }
        if options.floating_ips {
            command.arg("--floating-ips");
        }
        let mut process =
            Supervised::spawn("openstack servers", command, &dir.join("servers.log"))?;
        let ready = dir.join("ready.json");
        let deadline = Instant::now() + READY_TIMEOUT;
        let text = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                break text;
            }
            if let Some(status) = process.exited() {
                bail!("servers.py exited with {status}\n{}", process.log_tail(30));
            }
            if Instant::now() > deadline {
                bail!(
                    "Keystone and Neutron not ready within {READY_TIMEOUT:?}\n{}",
                    process.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let ready: Value = serde_json::from_str(&text).context("ready.json")?;
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let user = |v: &Value| User {
            username: s(&v["username"]),
            password: s(&v["password"]),
            project: s(&v["project"]),
        };
        Ok(Self {
            keystone_url: s(&ready["keystone_url"]),
            neutron_url: s(&ready["neutron_url"]),
            admin: user(&ready["admin"]),
            member: user(&ready["member"]),
            reader: user(&ready["reader"]),
            startup: Duration::from_secs_f64(ready["startup_seconds"].as_f64().unwrap_or(0.0)),
            process,
            dir,
        })
    }

    /// The run directory (configs, sqlite files, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `clouds.yaml` text for `user`, cloud entry `openstack`.
    pub fn clouds_yaml(&self, user: &User) -> String {
        format!(
            "clouds:\n  openstack:\n    auth:\n      auth_url: {}/v3\n      username: {}\n      \
             password: {}\n      project_name: {}\n      user_domain_name: Default\n      \
             project_domain_name: Default\n    region_name: RegionOne\n    interface: public\n",
            self.keystone_url, user.username, user.password, user.project
        )
    }

    /// A JSON client authenticated as `user`; it authenticates again when Neutron refuses its
    /// token, so it outlives short token lifetimes.
    pub async fn api(&self, user: &User) -> Result<Api> {
        let api = Api {
            token: Arc::new(Mutex::new(String::new())),
            neutron: format!("{}/v2.0", self.neutron_url),
            login: Some(Arc::new((self.keystone_url.clone(), user.clone()))),
        };
        api.login().await?;
        Ok(api)
    }
}

impl Drop for OpenStackServers {
    fn drop(&mut self) {
        // servers.py stops the gunicorn process groups on SIGTERM; a plain kill would orphan them.
        let _ = Command::new("kill")
            .args(["-TERM", &self.process.pid().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.process.exited().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.process.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An authenticated JSON client of Neutron.
#[derive(Clone, Debug)]
pub struct Api {
    token: Arc<Mutex<String>>,
    neutron: String,
    /// Keystone's URL and the user, to authenticate again when the token expires.
    login: Option<Arc<(String, User)>>,
}

impl Api {
    /// Gets a fresh token from Keystone.
    async fn login(&self) -> Result<()> {
        let Some(login) = self.login.as_ref() else {
            bail!("no credentials to authenticate with");
        };
        let (keystone, user) = (&login.0, &login.1);
        let body = json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": user.username, "domain": {"id": "default"}, "password": user.password}}},
            "scope": {"project": {"name": user.project, "domain": {"id": "default"}}}}});
        let (status, headers, answer) = self
            .send_once(
                "POST",
                &format!("{keystone}/v3/auth/tokens"),
                Some(&body),
                None,
                false,
            )
            .await?;
        if status != 201 {
            bail!("authenticating {}: HTTP {status}: {answer}", user.username);
        }
        let token = headers
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .context("no X-Subject-Token")?
            .to_owned();
        *self.token.lock().unwrap_or_else(PoisonError::into_inner) = token;
        Ok(())
    }

    /// One request; a 401 (the token expired) authenticates again and repeats it, for up to
    /// [`LOGINS_FOR`]: on a loaded machine a fresh token can expire while the request waits in
    /// Neutron's queue (one sqlite thread serves a whole suite).
    async fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<(u16, http::HeaderMap, Value)> {
        let started = Instant::now();
        let mut answer = self.send_once(method, url, body, if_match, true).await?;
        while answer.0 == 401 && self.login.is_some() && started.elapsed() < LOGINS_FOR {
            self.login().await?;
            answer = self.send_once(method, url, body, if_match, true).await?;
        }
        Ok(answer)
    }

    async fn send_once(
        &self,
        method: &str,
        url: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
        with_token: bool,
    ) -> Result<(u16, http::HeaderMap, Value)> {
        let token = self
            .token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut request = http::Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .header("accept", "application/json");
        if with_token && !token.is_empty() {
            request = request.header("x-auth-token", token);
        }
        if let Some(guard) = if_match {
            request = request.header("if-match", guard);
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let response = tokio::time::timeout(
            REQUEST_TIMEOUT,
            client.request(request.body(Full::new(body))?),
        )
        .await
        .with_context(|| format!("{method} {url}: no answer within {REQUEST_TIMEOUT:?}"))??;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await?.to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Ok((status, headers, value))
    }

    /// `method` on Keystone's `path` (after `/v3`) with this client's token: status and JSON.
    pub async fn keystone(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let Some(login) = self.login.as_ref() else {
            bail!("a frozen client knows no Keystone");
        };
        let url = format!("{}/v3{path}", login.0);
        let (status, _, value) = self.send(method, &url, body, None).await?;
        Ok((status, value))
    }

    /// A client that keeps the current token until it expires: Neutron refuses its calls (401)
    /// once Keystone's token lifetime has passed, which is how a test observes that moment.
    pub fn frozen(&self) -> Self {
        let token = self
            .token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Self {
            token: Arc::new(Mutex::new(token)),
            neutron: self.neutron.clone(),
            login: None,
        }
    }

    /// `method` on Neutron's `path` (after `/v2.0`): status and JSON body.
    pub async fn neutron(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let (status, _, value) = self
            .send(method, &format!("{}{path}", self.neutron), body, None)
            .await?;
        Ok((status, value))
    }

    /// `PUT` with `If-Match: revision_number=<revision>`.
    pub async fn put_if(&self, path: &str, revision: u64, body: &Value) -> Result<(u16, Value)> {
        let guard = format!("revision_number={revision}");
        let (status, _, value) = self
            .send(
                "PUT",
                &format!("{}{path}", self.neutron),
                Some(body),
                Some(&guard),
            )
            .await?;
        Ok((status, value))
    }

    /// Creates `kind` (`network`, `subnet`, `port`) from `fields`; its JSON.
    pub async fn create(&self, kind: &str, fields: Value) -> Result<Value> {
        let (status, value) = self
            .neutron("POST", &format!("/{kind}s"), Some(&json!({ kind: fields })))
            .await?;
        if status != 201 {
            bail!("creating {kind}: HTTP {status}: {value}");
        }
        Ok(value[kind].clone())
    }

    /// Creates one `kind` per entry of `each` in one bulk call (`POST /<kind>s` with a list);
    /// their JSON, in order.
    pub async fn create_many(&self, kind: &str, each: Vec<Value>) -> Result<Vec<Value>> {
        let plural = format!("{kind}s");
        let (status, value) = self
            .neutron(
                "POST",
                &format!("/{plural}"),
                Some(&json!({ &plural: each })),
            )
            .await?;
        if status != 201 {
            bail!("creating {plural}: HTTP {status}: {value}");
        }
        match value[&plural].as_array() {
            Some(created) => Ok(created.clone()),
            None => bail!("creating {plural}: no list in the answer: {value}"),
        }
    }

    /// A port, read now.
    pub async fn port(&self, id: &str) -> Result<Value> {
        let (status, value) = self.neutron("GET", &format!("/ports/{id}"), None).await?;
        if status != 200 {
            bail!("reading port {id}: HTTP {status}: {value}");
        }
        Ok(value["port"].clone())
    }
}

/// The venv holding Keystone, Neutron and gunicorn: `$CLOUDNET_OPENSTACK_VENV`, or else the one
/// `openstack/venv.sh` installs into the cache (a no-op once installed). Blocking; memoised.
pub fn locate_venv() -> Result<PathBuf> {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    if let Some(found) = FOUND.get() {
        return Ok(found.clone());
    }
    let venv = match std::env::var_os(VENV_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => crate::harness::cache_script::run(&crate::crate_file("openstack/venv.sh"))?,
    };
    if !venv.join("bin/keystone-manage").is_file() {
        bail!("{} holds no bin/keystone-manage", venv.display());
    }
    Ok(FOUND.get_or_init(|| venv).clone())
}

fn tempdir() -> Result<PathBuf> {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = cache_root()
        .join("run")
        .join(format!("openstack-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
