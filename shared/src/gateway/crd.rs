//! The `EgressGateway` CustomResourceDefinition: the derived schema plus the bounds a derive
//! cannot express, so kube-apiserver refuses what could never work before any webhook is called:
//! a name too long for the node label's key, no egress IP, too many, a spelling longer than any IP.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use kube::CustomResourceExt;
use schemars::{Schema, SchemaGenerator};

use super::{EgressGateway, MAX_EGRESS_IPS, MAX_NAME_BYTES};

/// The longest canonical spelling of an IP (a full IPv6 address, eight groups of four).
const MAX_IP_BYTES: i64 = 39;
/// A DNS label, as a label key's name part must be.
const NAME_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// The CRD to install.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = EgressGateway::crd();
    crd.spec.names.list_kind = Some("EgressGatewayList".into());
    crd.spec.names.short_names = Some(vec!["egw".into()]);
    for schema in crate::crd::version_schemas(&mut crd) {
        schema.title = None;
        let name = JSONSchemaProps {
            type_: Some("string".into()),
            max_length: Some(i64::try_from(MAX_NAME_BYTES).unwrap_or(i64::MAX)),
            pattern: Some(NAME_PATTERN.into()),
            ..Default::default()
        };
        let metadata = JSONSchemaProps {
            type_: Some("object".into()),
            properties: Some([("name".to_string(), name)].into()),
            ..Default::default()
        };
        let properties = schema.properties.get_or_insert_with(Default::default);
        properties.insert("metadata".into(), metadata);
        if let Some(ips) = properties
            .get_mut("spec")
            .and_then(|spec| spec.properties.as_mut())
            .and_then(|p| p.get_mut("egressIPs"))
        {
            ips.min_items = Some(1);
            ips.max_items = Some(i64::try_from(MAX_EGRESS_IPS).unwrap_or(i64::MAX));
            ips.x_kubernetes_list_type = Some("set".into());
            if let Some(JSONSchemaPropsOrArray::Schema(item)) = ips.items.as_mut() {
                item.min_length = Some(1);
                item.max_length = Some(MAX_IP_BYTES);
            }
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

/// Schema of `status.conditions`: `metav1.Condition` with the apiserver-side validation, as the
/// CloudPrivateIPConfig's, with this resource's description.
pub(crate) fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = crate::crd::conditions_schema(generator);
    schema.insert(
        "description".into(),
        "conditions holds exactly one condition, of type Ready.".into(),
    );
    schema
}
