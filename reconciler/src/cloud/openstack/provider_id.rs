//! Node `spec.providerID` → Nova server UUID.

use cloudnet_shared::ids::is_hyphenated_uuid;
use thiserror::Error;

/// A providerID that names no Nova server. The message says what was expected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ProviderIdError {
    /// The providerID is empty (the cloud provider has not initialised the node yet).
    #[error("providerID is empty; the node is not initialised by the OpenStack cloud provider yet")]
    Empty,
    /// The scheme is not `openstack://`.
    #[error("providerID {0:?} is not an OpenStack one: expected openstack:///<server-uuid>")]
    NotOpenStack(String),
    /// The last path segment is not a UUID.
    #[error("providerID {0:?} does not end in a server UUID: expected openstack:///<server-uuid>")]
    NoServer(String),
}

/// The server UUID named by `provider_id`: `openstack:///<uuid>`, or `openstack://<region>/<uuid>`
/// as the cloud provider writes it for multi-region clouds. Returned in lower case, as Nova and
/// Neutron write it in `device_id`.
pub fn server_id(provider_id: &str) -> Result<String, ProviderIdError> {
    let trimmed = provider_id.trim();
    if trimmed.is_empty() {
        return Err(ProviderIdError::Empty);
    }
    let rest = trimmed
        .strip_prefix("openstack://")
        .ok_or_else(|| ProviderIdError::NotOpenStack(provider_id.to_owned()))?;
    let id = match rest.split('/').collect::<Vec<_>>().as_slice() {
        // `openstack:///<uuid>` (empty region) and `openstack://<region>/<uuid>`.
        [_, id] => *id,
        _ => return Err(ProviderIdError::NoServer(provider_id.to_owned())),
    };
    if is_hyphenated_uuid(id) {
        Ok(id.to_ascii_lowercase())
    } else {
        Err(ProviderIdError::NoServer(provider_id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const UUID: &str = "8f6a1c2e-3b4d-4e5f-9a0b-1c2d3e4f5a6b";

    #[test]
    fn accepts_the_cloud_providers_forms() {
        assert_eq!(server_id(&format!("openstack:///{UUID}")).unwrap(), UUID);
        assert_eq!(
            server_id(&format!("openstack://RegionOne/{UUID}")).unwrap(),
            UUID
        );
        assert_eq!(
            server_id(&format!("openstack:///{}", UUID.to_uppercase())).unwrap(),
            UUID
        );
    }

    #[test]
    fn refuses_anything_else_saying_what_was_expected() {
        assert_eq!(server_id(" "), Err(ProviderIdError::Empty));
        assert!(matches!(
            server_id(&format!("aws:///{UUID}")),
            Err(ProviderIdError::NotOpenStack(_))
        ));
        for bad in [
            "openstack:///".to_owned(),
            "openstack:///not-a-uuid".to_owned(),
            format!("openstack://{UUID}"),
            format!("openstack:///a/{UUID}"),
            format!("openstack:///{}", &UUID[1..]),
        ] {
            let err = server_id(&bad).unwrap_err();
            assert!(matches!(err, ProviderIdError::NoServer(_)), "{bad}: {err}");
            assert!(err.to_string().contains("openstack:///<server-uuid>"));
        }
    }
}
