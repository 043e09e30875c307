//! The CustomResourceDefinition, assembled from the Rust types plus what a derive cannot express.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::CustomResourceExt;
use schemars::{Schema, SchemaGenerator, json_schema};

use crate::resource::CloudPrivateIPConfig;

/// Pattern of an IPv6 object name: eight groups of four lower-case hex digits joined by dots.
pub const IPV6_NAME_PATTERN: &str = r"^[0-9a-f]{4}(\.[0-9a-f]{4}){7}$";

/// The CRD to install: derived schema plus upstream's `metadata.name` restriction.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = CloudPrivateIPConfig::crd();
    crd.spec.names.list_kind = Some("CloudPrivateIPConfigList".into());
    for schema in version_schemas(&mut crd) {
        // The name is the IP, so the apiserver itself refuses names that cannot be one.
        let name = JSONSchemaProps {
            type_: Some("string".into()),
            any_of: Some(vec![
                JSONSchemaProps {
                    format: Some("ipv4".into()),
                    ..Default::default()
                },
                JSONSchemaProps {
                    pattern: Some(IPV6_NAME_PATTERN.into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let metadata = JSONSchemaProps {
            type_: Some("object".into()),
            properties: Some([("name".to_string(), name)].into()),
            ..Default::default()
        };
        schema.title = None;
        let properties = schema.properties.get_or_insert_with(Default::default);
        properties.insert("metadata".into(), metadata);
        if let Some(spec) = properties.get_mut("spec") {
            match_upstream_fields(spec);
        }
        if let Some(status) = properties.get_mut("status") {
            match_upstream_fields(status);
            status.nullable = None;
            status.required = Some(vec!["conditions".into()]);
        }
    }
    crd
}

/// The OpenAPI schema of each version of `crd`, to amend what the derive produced.
pub(crate) fn version_schemas(
    crd: &mut CustomResourceDefinition,
) -> impl Iterator<Item = &mut JSONSchemaProps> {
    crd.spec
        .versions
        .iter_mut()
        .filter_map(|v| v.schema.as_mut()?.open_api_v3_schema.as_mut())
}

/// Drops the `default`s that `#[serde(default)]` puts into the schema: the Rust types tolerate
/// missing fields when reading, but the apiserver should store what clients sent, as upstream does.
fn match_upstream_fields(object: &mut JSONSchemaProps) {
    for field in object.properties.iter_mut().flat_map(|p| p.values_mut()) {
        field.default = None;
    }
}

/// Schema of `status.conditions`: `metav1.Condition` with the apiserver-side validation upstream has.
pub(crate) fn conditions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "conditions holds exactly one condition, of type Assigned.",
        "type": "array",
        "items": {
            "description": "Condition of the IP assignment.",
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {
                    "description": "When the condition's status last changed.",
                    "type": "string",
                    "format": "date-time"
                },
                "message": {
                    "description": "Human-readable details of the last transition.",
                    "type": "string",
                    "maxLength": 32768
                },
                "observedGeneration": {
                    "description": "metadata.generation the condition was set from.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "reason": {
                    "description": "Programmatic identifier of the last transition, in CamelCase.",
                    "type": "string",
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "status": {
                    "description": "Status of the condition: True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "type": {
                    "description": "Type of the condition, in CamelCase or foo.example.com/CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                }
            }
        }
    })
}
