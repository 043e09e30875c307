//! Which proxy, if any, a request to a URL goes through, by the environment a cluster injects:
//! `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` (upper case first, then lower case).
//!
//! The rules are Go's `golang.org/x/net/http/httpproxy`, which the upstream controller and every
//! OpenShift component follow, so one `NO_PROXY` means the same to all of them. The clients'
//! own matchers differ (hyper-util's, used by reqwest and the AWS SDK, ignores `host:port`
//! entries; kube-rs matches `NO_PROXY` against the proxy's URL rather than the destination), so
//! every client here asks this one instead:
//! - `localhost` and loopback addresses are never proxied;
//! - `*` bypasses the proxy for every host;
//! - `10.0.0.0/8` (a CIDR) and `10.1.2.3` (an address, optionally `:port`) match those IPs;
//! - `example.com` matches that host and its subdomains, `.example.com` (or `*.example.com`)
//!   only its subdomains, either optionally with `:port` (the destination's port, its scheme's
//!   default when the URL names none).

use std::net::IpAddr;

use ipnet::IpNet;

/// The proxy settings of the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyRules {
    http: Option<String>,
    https: Option<String>,
    bypass: Vec<Bypass>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Bypass {
    All,
    Network(IpNet),
    Address(IpAddr, Option<u16>),
    Domain {
        /// Lower case, with a leading dot.
        suffix: String,
        /// Whether the domain itself matches too (an entry without a leading dot).
        exact_too: bool,
        port: Option<u16>,
    },
}

impl ProxyRules {
    /// The rules from the variables `var` returns (the process environment, in a binary:
    /// `ProxyRules::from_vars(|name| std::env::var(name).ok())`).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let any = |upper: &str, lower: &str| {
            var(upper)
                .filter(|v| !v.trim().is_empty())
                .or_else(|| var(lower).filter(|v| !v.trim().is_empty()))
                .map(|v| v.trim().to_owned())
        };
        Self {
            http: any("HTTP_PROXY", "http_proxy").map(with_scheme),
            https: any("HTTPS_PROXY", "https_proxy").map(with_scheme),
            bypass: any("NO_PROXY", "no_proxy")
                .map(|list| parse_bypass(&list))
                .unwrap_or_default(),
        }
    }

    /// The rules from variables given as (name, value) pairs, as a caller holding them rather
    /// than an environment (a test, a tool) has them.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        Self::from_vars(|name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        })
    }

    /// The proxy URLs configured (HTTP's, then HTTPS's).
    pub fn proxies(&self) -> impl Iterator<Item = &str> {
        self.http.iter().chain(&self.https).map(String::as_str)
    }

    /// Whether no proxy is configured at all.
    pub fn is_empty(&self) -> bool {
        self.http.is_none() && self.https.is_none()
    }

    /// The proxy URL for a request to `host` (a name, an IP, or an IPv6 address in brackets) on
    /// `port` (the scheme's default when `None`) over `scheme` (`http` or `https`), or `None`
    /// to connect directly.
    pub fn proxy_for(&self, scheme: &str, host: &str, port: Option<u16>) -> Option<&str> {
        let proxy = match scheme.to_ascii_lowercase().as_str() {
            "https" => self.https.as_deref(),
            "http" => self.http.as_deref(),
            _ => None,
        }?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let port = port.unwrap_or(if scheme.eq_ignore_ascii_case("https") {
            443
        } else {
            80
        });
        (!self.bypasses(&host, port)).then_some(proxy)
    }

    fn bypasses(&self, host: &str, port: u16) -> bool {
        if host == "localhost" {
            return true;
        }
        let ip = host.parse::<IpAddr>().ok();
        if ip.is_some_and(|ip| ip.is_loopback()) {
            return true;
        }
        let port_matches = |wanted: &Option<u16>| wanted.is_none_or(|wanted| wanted == port);
        self.bypass.iter().any(|entry| match (entry, ip) {
            (Bypass::All, _) => true,
            (Bypass::Network(net), Some(ip)) => net.contains(&ip),
            (Bypass::Address(address, wanted), Some(ip)) => *address == ip && port_matches(wanted),
            (
                Bypass::Domain {
                    suffix,
                    exact_too,
                    port: wanted,
                },
                None,
            ) => {
                let matches = host.ends_with(suffix.as_str())
                    || (*exact_too && suffix.strip_prefix('.') == Some(host));
                matches && port_matches(wanted)
            }
            _ => false,
        })
    }
}

/// A proxy given as `host:port` is an HTTP proxy, as Go reads it.
fn with_scheme(proxy: String) -> String {
    if proxy.contains("://") {
        proxy
    } else {
        format!("http://{proxy}")
    }
}

fn parse_bypass(list: &str) -> Vec<Bypass> {
    list.split(',')
        .map(|entry| entry.trim().to_ascii_lowercase())
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            if entry == "*" {
                return Bypass::All;
            }
            if let Ok(net) = entry.parse::<IpNet>() {
                return Bypass::Network(net);
            }
            let (host, port) = split_port(&entry);
            if let Ok(ip) = host.parse::<IpAddr>() {
                return Bypass::Address(ip, port);
            }
            let host = host.strip_prefix('*').unwrap_or(host).trim_end_matches('.');
            match host.strip_prefix('.') {
                Some(_) => Bypass::Domain {
                    suffix: host.to_owned(),
                    exact_too: false,
                    port,
                },
                None => Bypass::Domain {
                    suffix: format!(".{host}"),
                    exact_too: true,
                    port,
                },
            }
        })
        .collect()
}

/// `host:port` split, `[v6]:port` and `[v6]` unbracketed; a bare IPv6 address has no port.
fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (entry, None),
        };
    }
    match entry.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(port) => (host, Some(port)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(vars: &[(&str, &str)]) -> ProxyRules {
        ProxyRules::from_pairs(vars)
    }

    #[test]
    fn both_cases_are_read_upper_case_first() {
        let upper = rules(&[
            ("HTTPS_PROXY", "http://upper:3128"),
            ("https_proxy", "http://lower:3128"),
            ("http_proxy", "proxy.local:8080"),
        ]);
        assert_eq!(
            upper.proxy_for("https", "ec2.us-east-1.amazonaws.com", None),
            Some("http://upper:3128")
        );
        assert_eq!(
            upper.proxy_for("http", "metadata.example", None),
            Some("http://proxy.local:8080"),
            "a proxy without a scheme is an HTTP proxy"
        );
        let lower = rules(&[("https_proxy", "http://lower:3128"), ("no_proxy", "*")]);
        assert_eq!(lower.proxy_for("https", "example.com", None), None);
        assert!(rules(&[("HTTPS_PROXY", " ")]).is_empty());
        assert_eq!(
            rules(&[("HTTP_PROXY", "http://p:1")]).proxy_for("https", "example.com", None),
            None,
            "HTTP_PROXY is for http URLs only"
        );
    }

    #[test]
    fn no_proxy_entries_match_as_go_matches_them() {
        let r = rules(&[
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("HTTP_PROXY", "http://proxy:3128"),
            (
                "NO_PROXY",
                " api-int.cluster.example ,.svc,*.cluster.local, 10.0.0.0/16,172.30.0.1, \
                 keystone.example:5000,192.168.1.1:8443,[fd00::1]:443,fd01::/64,EXAMPLE.org",
            ),
        ]);
        let direct = [
            ("https", "api-int.cluster.example", None),
            ("https", "API-INT.cluster.example.", None),
            ("https", "sub.api-int.cluster.example", None),
            ("https", "kubernetes.default.svc", None),
            ("https", "a.b.cluster.local", None),
            ("https", "10.0.255.1", None),
            ("https", "172.30.0.1", Some(6443)),
            ("https", "keystone.example", Some(5000)),
            ("https", "192.168.1.1", Some(8443)),
            ("https", "[fd00::1]", None),
            ("https", "fd01::5", None),
            ("https", "example.org", None),
            ("http", "www.example.org", None),
            // Never proxied, whatever NO_PROXY says.
            ("https", "localhost", Some(8080)),
            ("https", "127.0.0.1", Some(8080)),
            ("https", "[::1]", None),
        ];
        for (scheme, host, port) in direct {
            assert_eq!(r.proxy_for(scheme, host, port), None, "{host}:{port:?}");
        }
        let proxied = [
            ("https", "svc", None),
            ("https", "cluster.local", None),
            ("https", "10.1.0.1", None),
            ("https", "keystone.example", None),
            ("https", "keystone.example", Some(443)),
            ("https", "192.168.1.1", None),
            ("https", "[fd00::1]", Some(8443)),
            ("https", "notexample.org", None),
            ("https", "ec2.us-east-1.amazonaws.com", None),
        ];
        for (scheme, host, port) in proxied {
            assert_eq!(
                r.proxy_for(scheme, host, port),
                Some("http://proxy:3128"),
                "{host}:{port:?}"
            );
        }
    }
}
