//! `gce://<project>/<zone>/<instance>`: the providerID the GCP cloud provider writes on Nodes.

use thiserror::Error;

/// A GCE instance as named by a Node's providerID.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GceInstance {
    /// The project that owns the VM (not necessarily the network's: shared VPC).
    pub project: String,
    /// The VM's zone, e.g. `us-central1-a`.
    pub zone: String,
    /// The VM's name.
    pub name: String,
}

impl GceInstance {
    /// The form kept in [`super::super::InstanceId`]: `<project>/<zone>/<instance>`.
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.project, self.zone, self.name)
    }

    /// Parses the [`Self::key`] form back.
    pub fn from_key(key: &str) -> Result<Self, ProviderIdError> {
        parse_parts(key).ok_or_else(|| ProviderIdError(key.to_owned()))
    }
}

/// A providerID that does not name a GCE instance.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error(
    "providerID {0:?} is not of the form gce://<project>/<zone>/<instance> (is the node on GCP?)"
)]
pub struct ProviderIdError(pub String);

/// The instance a `gce://` providerID names.
pub fn parse(provider_id: &str) -> Result<GceInstance, ProviderIdError> {
    provider_id
        .strip_prefix("gce://")
        .and_then(parse_parts)
        .ok_or_else(|| ProviderIdError(provider_id.to_owned()))
}

fn parse_parts(rest: &str) -> Option<GceInstance> {
    let mut parts = rest.split('/');
    let (project, zone, name) = (parts.next()?, parts.next()?, parts.next()?);
    let valid = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
    (parts.next().is_none() && valid(project) && valid(zone) && valid(name)).then(|| GceInstance {
        project: project.to_owned(),
        zone: zone.to_owned(),
        name: name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_project_zone_and_instance() {
        let got = parse("gce://my-project/us-central1-a/node-1").unwrap();
        assert_eq!(
            got,
            GceInstance {
                project: "my-project".into(),
                zone: "us-central1-a".into(),
                name: "node-1".into(),
            }
        );
        assert_eq!(GceInstance::from_key(&got.key()).unwrap(), got);
    }

    #[test]
    fn refuses_other_shapes() {
        for bad in [
            "",
            "gce://",
            "gce://p/z",
            "gce://p/z/",
            "gce:///z/i",
            "gce://p/z/i/extra",
            "aws:///us-east-1a/i-0123",
            "gce://p/z/i j",
            "GCE://p/z/i",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn the_error_names_the_expected_form() {
        let e = parse("aws:///x").unwrap_err().to_string();
        assert!(e.contains("gce://<project>/<zone>/<instance>"), "{e}");
        assert!(e.contains("aws:///x"), "{e}");
    }
}
