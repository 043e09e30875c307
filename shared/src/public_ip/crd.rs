//! The `EgressPublicIP` CustomResourceDefinition: the derived schema plus the bounds a derive
//! cannot express, so kube-apiserver refuses oversized fields before any webhook is called.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::CustomResourceExt;
use schemars::{Schema, SchemaGenerator};

use super::EgressPublicIP;
use super::id::MAX_ID_BYTES;

/// The longest canonical spelling of an IP (a full IPv6 address, eight groups of four).
const MAX_IP_BYTES: i64 = 39;

/// The CRD to install.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = EgressPublicIP::crd();
    crd.spec.names.list_kind = Some("EgressPublicIPList".into());
    for schema in crate::crd::version_schemas(&mut crd) {
        schema.title = None;
        let properties = schema.properties.get_or_insert_with(Default::default);
        if let Some(spec) = properties.get_mut("spec") {
            bound(spec, "privateIP", MAX_IP_BYTES);
            bound(
                spec,
                "publicIP",
                i64::try_from(MAX_ID_BYTES).unwrap_or(i64::MAX),
            );
        }
        if let Some(status) = properties.get_mut("status") {
            status.nullable = None;
            for field in status.properties.iter_mut().flat_map(|p| p.values_mut()) {
                field.default = None;
            }
        }
    }
    crd
}

fn bound(object: &mut JSONSchemaProps, field: &str, max: i64) {
    if let Some(field) = object.properties.as_mut().and_then(|p| p.get_mut(field)) {
        field.min_length = Some(1);
        field.max_length = Some(max);
    }
}

/// Schema of `status.conditions`: `metav1.Condition` with the apiserver-side validation, as the
/// CloudPrivateIPConfig's, with this resource's description.
pub(crate) fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = crate::crd::conditions_schema(generator);
    schema.insert(
        "description".into(),
        "conditions holds exactly one condition, of type Associated.".into(),
    );
    schema
}
