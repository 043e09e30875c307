//! OpenStack as the local system's cloud: real Keystone and Neutron ([`OpenStackServers`]), the
//! reconciler reaching Neutron through the suite's fault proxy and Keystone through a proxy of
//! its own, which counts the tokens it asks for.

use std::any::Any;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::cloud::LocalCloud;
use crate::fakes::faultproxy::{Dialect, FaultProxy};
use crate::fakes::openstack::{Api, OpenStackServers, Options};

/// Keystone's route for issuing a token, as the Keystone proxy counts it.
pub const TOKEN_ROUTE: &str = "POST /v3/auth/tokens";

/// Real Keystone and Neutron, with the reconciler's credentials for a member of project
/// `cloudnet`.
#[derive(Debug)]
pub struct OpenStack {
    // Field order is drop order: the proxy before the servers it forwards to.
    keystone: FaultProxy,
    servers: OpenStackServers,
}

impl OpenStack {
    /// Starts a pair of servers with `options` and a proxy in front of Keystone.
    pub async fn start(options: Options) -> Result<Self> {
        let servers = OpenStackServers::start(options).await?;
        let keystone = FaultProxy::builder(servers.keystone_url.clone(), Dialect::Rest)
            .start()
            .await?;
        Ok(Self { keystone, servers })
    }

    /// The servers, for the suite's own set-up and reads (straight to Neutron, not proxied).
    pub fn servers(&self) -> &OpenStackServers {
        &self.servers
    }

    /// The proxy the reconciler reaches Keystone through.
    pub fn keystone_proxy(&self) -> &FaultProxy {
        &self.keystone
    }

    /// Tokens Keystone issued to the reconciler so far.
    pub fn tokens_issued(&self) -> u64 {
        self.keystone.counts(TOKEN_ROUTE).forwarded
    }
}

impl LocalCloud for OpenStack {
    fn platform(&self) -> &'static str {
        "OpenStack"
    }

    fn url(&self) -> &str {
        &self.servers.neutron_url
    }

    fn dialect(&self) -> Dialect {
        Dialect::Rest
    }

    fn write_credentials(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        // The cloud's clouds.yaml, except that Keystone is reached through the counting proxy.
        let yaml = self
            .servers
            .clouds_yaml(&self.servers.member)
            .replace(&self.servers.keystone_url, self.keystone.url());
        std::fs::write(dir.join("clouds.yaml"), yaml)?;
        Ok(())
    }

    fn reconciler_flags(&self, api_url: &str) -> Vec<String> {
        // Neutron through the fault proxy instead of the catalog's URL.
        vec![format!("--platform-api-url={api_url}")]
    }

    fn is_mutation(&self, route: &str) -> bool {
        is_neutron_mutation(route)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Whether a Neutron route (`METHOD /v2.0/...`) changes a port: reservation ports created or
/// deleted, pairs or device ids updated.
pub fn is_neutron_mutation(route: &str) -> bool {
    let Some((method, path)) = route.split_once(' ') else {
        return false;
    };
    matches!(method, "POST" | "PUT" | "DELETE") && path.starts_with("/v2.0/ports")
}

/// Whether a route is a `PUT` of one port (the pair updates and re-pointed reservations).
pub fn is_port_update(route: &str) -> bool {
    route.starts_with("PUT /v2.0/ports/")
}

/// Routes `subnet` (the member's) to a new external network `name` with IPv4 prefix `cidr`, as
/// floating IPs need (Neutron's L3 service plugin on, [`Options::floating_ips`]): only the admin
/// makes a network external; the member's router has its gateway there and an interface on
/// `subnet`. Returns the external network's id.
pub async fn route_to_external(
    admin: &Api,
    member: &Api,
    name: &str,
    cidr: &str,
    subnet: &str,
) -> Result<String> {
    let external = id_of(
        &admin
            .create("network", json!({"name": name, "router:external": true}))
            .await?,
    )?;
    admin
        .create(
            "subnet",
            json!({"network_id": external, "ip_version": 4, "cidr": cidr}),
        )
        .await?;
    let router = id_of(
        &member
            .create(
                "router",
                json!({"name": format!("{name}-router"),
                       "external_gateway_info": {"network_id": external}}),
            )
            .await?,
    )?;
    let path = format!("/routers/{router}/add_router_interface");
    let (status, body) = member
        .neutron("PUT", &path, Some(&json!({ "subnet_id": subnet })))
        .await?;
    if status != 200 {
        bail!("PUT {path} answered {status}: {body}");
    }
    Ok(external)
}

/// A new floating IP of the member's on `external`, with `tags`: its id.
pub async fn floating_ip(member: &Api, external: &str, tags: &[&str]) -> Result<String> {
    let fip = id_of(
        &member
            .create("floatingip", json!({ "floating_network_id": external }))
            .await?,
    )?;
    for tag in tags {
        let path = format!("/floatingips/{fip}/tags/{tag}");
        let (status, body) = member.neutron("PUT", &path, None).await?;
        if status != 201 {
            bail!("PUT {path} answered {status}: {body}");
        }
    }
    Ok(fip)
}

/// Floating IP `fip` as Neutron shows it now.
pub async fn show_floating_ip(api: &Api, fip: &str) -> Result<Value> {
    let path = format!("/floatingips/{fip}");
    let (status, body) = api.neutron("GET", &path, None).await?;
    if status != 200 {
        bail!("GET {path} answered {status}: {body}");
    }
    Ok(body["floatingip"].clone())
}

/// The fault-proxy route of an update of floating IP `fip` (an association or its undoing).
pub fn floating_ip_update(fip: &str) -> String {
    format!("PUT /v2.0/floatingips/{fip}")
}

fn id_of(created: &Value) -> Result<String> {
    created["id"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no id in {created}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_writes_are_mutations_and_reads_are_not() {
        assert!(is_neutron_mutation("POST /v2.0/ports"));
        assert!(is_neutron_mutation("PUT /v2.0/ports/abc"));
        assert!(is_neutron_mutation("DELETE /v2.0/ports/abc"));
        assert!(!is_neutron_mutation("GET /v2.0/ports"));
        assert!(!is_neutron_mutation("GET /v2.0/subnets/abc"));
        assert!(!is_neutron_mutation("POST /v3/auth/tokens"));
        assert!(is_port_update("PUT /v2.0/ports/abc"));
        assert!(!is_port_update("POST /v2.0/ports"));
    }
}
