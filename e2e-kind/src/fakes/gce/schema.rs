//! Checks JSON bodies against the Compute v1 discovery document's schemas, so the fake refuses
//! what GCE would not parse and answers only what the real API could answer.
//!
//! Discovery schemas are a small JSON-Schema dialect: `type` (object, array, string, integer,
//! number, boolean, any), `properties`, `additionalProperties`, `items`, `$ref` by schema id,
//! `enum`, and `format` (`int64`/`uint64` travel as decimal strings, `byte` as base64). The
//! checks are strict where a client could go wrong: an unknown property, a wrong type, an enum
//! value that does not exist, a number sent for an int64 string, bytes that are not base64.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use serde_json::Value;

/// The discovery document, parsed.
#[derive(Debug)]
pub struct Discovery {
    doc: Value,
}

/// A method of the document: HTTP method, path template under `compute/v1/`, body schemas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodInfo {
    /// `compute.instances.get` and the like.
    pub id: String,
    /// The request body's schema id, if the method takes one.
    pub request: Option<String>,
    /// The response body's schema id.
    pub response: Option<String>,
    /// The query parameters the method declares (global ones aside).
    pub query: Vec<String>,
}

impl Discovery {
    /// The document at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let doc: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing {}", path.display()))?;
        if doc["schemas"].as_object().is_none() {
            bail!("{} has no schemas", path.display());
        }
        Ok(Self { doc })
    }

    /// The document `gce/discovery.sh` installs (pinned PyPI `google-api-python-client`), or
    /// the file `$CLOUDNET_GCE_DISCOVERY` names.
    pub fn installed() -> Result<Self> {
        Self::load(&locate()?)
    }

    /// The method `resource.method` (e.g. `instances`, `updateNetworkInterface`).
    pub fn method(&self, resource: &str, method: &str) -> Result<MethodInfo> {
        let m = &self.doc["resources"][resource]["methods"][method];
        if !m.is_object() {
            bail!("the discovery document has no method {resource}.{method}");
        }
        let query = m["parameters"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, p)| p["location"] == "query")
            .map(|(name, _)| name.clone())
            .collect();
        let schema = |v: &Value| v["$ref"].as_str().map(str::to_owned);
        Ok(MethodInfo {
            id: m["id"].as_str().unwrap_or_default().to_owned(),
            request: schema(&m["request"]),
            response: schema(&m["response"]),
            query,
        })
    }

    /// Whether `name` is a query parameter every method takes (`alt`, `fields`, ...) or the
    /// client's `$`-prefixed system parameters (`$alt`, `$apiVersion`; any API version).
    pub fn is_global_parameter(&self, name: &str) -> bool {
        let bare = name.strip_prefix('$').unwrap_or(name);
        bare == "apiVersion" || self.doc["parameters"].get(bare).is_some()
    }

    /// Every way `value` departs from schema `id`, as `path: problem` lines.
    pub fn check(&self, id: &str, value: &Value) -> Vec<String> {
        let mut problems = Vec::new();
        match self.doc["schemas"].get(id) {
            Some(schema) => self.check_value(schema, value, id, &mut problems, 0),
            None => problems.push(format!("{id}: no such schema")),
        }
        problems
    }

    fn check_value(
        &self,
        schema: &Value,
        value: &Value,
        at: &str,
        problems: &mut Vec<String>,
        depth: usize,
    ) {
        if depth > 64 {
            problems.push(format!("{at}: nested too deep"));
            return;
        }
        if let Some(reference) = schema["$ref"].as_str() {
            match self.doc["schemas"].get(reference) {
                Some(target) => self.check_value(target, value, at, problems, depth + 1),
                None => problems.push(format!("{at}: unknown schema {reference}")),
            }
            return;
        }
        let kind = schema["type"].as_str().unwrap_or("any");
        match (kind, value) {
            ("any", _) => {}
            ("object", Value::Object(map)) => {
                let properties = schema["properties"].as_object();
                let extra = &schema["additionalProperties"];
                for (key, item) in map {
                    let at = format!("{at}.{key}");
                    match properties.and_then(|p| p.get(key)) {
                        Some(property) => {
                            self.check_value(property, item, &at, problems, depth + 1);
                        }
                        None if extra.is_object() => {
                            self.check_value(extra, item, &at, problems, depth + 1);
                        }
                        None => problems.push(format!("{at}: unknown property")),
                    }
                }
            }
            ("array", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{at}[{i}]");
                    self.check_value(&schema["items"], item, &at, problems, depth + 1);
                }
            }
            ("string", Value::String(s)) => check_string(schema, s, at, problems),
            ("integer", Value::Number(n)) if n.is_i64() || n.is_u64() => {}
            ("number", Value::Number(_)) | ("boolean", Value::Bool(_)) => {}
            (kind, value) => problems.push(format!("{at}: expected {kind}, got {value}")),
        }
    }
}

fn check_string(schema: &Value, s: &str, at: &str, problems: &mut Vec<String>) {
    if let Some(values) = schema["enum"].as_array()
        && !values.iter().any(|v| v == s)
    {
        problems.push(format!("{at}: {s:?} is not one of the enum's values"));
    }
    match schema["format"].as_str() {
        Some("int64") if s.parse::<i64>().is_err() => {
            problems.push(format!("{at}: {s:?} is not an int64"));
        }
        Some("uint64") if s.parse::<u64>().is_err() => {
            problems.push(format!("{at}: {s:?} is not a uint64"));
        }
        Some("byte") if !is_base64(s) => {
            problems.push(format!("{at}: {s:?} is not base64"));
        }
        _ => {}
    }
}

/// Google's `byte` format: base64, either alphabet, padding optional.
fn is_base64(s: &str) -> bool {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
    URL_SAFE.decode(s).is_ok() || URL_SAFE_NO_PAD.decode(s).is_ok() || STANDARD.decode(s).is_ok()
}

/// Environment variable naming a `compute.v1.json` to use instead of installing the package.
pub const DISCOVERY_ENV: &str = "CLOUDNET_GCE_DISCOVERY";

/// The discovery document's path: `$CLOUDNET_GCE_DISCOVERY`, else what `gce/discovery.sh` prints.
pub fn locate() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(DISCOVERY_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let script = crate::crate_file("gce/discovery.sh");
    let output = Command::new("bash")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let path = String::from_utf8(output.stdout).context("discovery.sh printed non-UTF-8")?;
    Ok(PathBuf::from(path.trim()))
}
