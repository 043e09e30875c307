//! The ARM NetworkInterface and PublicIPAddress schemas of API version 2024-03-01 (vendored from
//! the published REST API specification, see each file's `$comment`) and the check of a body
//! against them:
//! every property must be one the schema names, with the schema's type and, for enums, one of its
//! values. Read-only properties may be sent (ARM ignores them, and clients send back what they
//! read); the fake never takes their values from a request.

use serde_json::Value;

/// The vendored schema.
pub const NETWORK_INTERFACE_SCHEMA: &str =
    include_str!("../../../arm/networkInterface-2024-03-01.json");

/// The vendored public IP schema (an ip-configuration's `publicIPAddress`).
pub const PUBLIC_IP_ADDRESS_SCHEMA: &str =
    include_str!("../../../arm/publicIpAddress-2024-03-01.json");

/// A body checker over the vendored definitions.
#[derive(Debug)]
pub struct Schema {
    definitions: serde_json::Map<String, Value>,
}

impl Schema {
    /// The vendored NetworkInterface schema, with the PublicIPAddress one its ip-configurations
    /// reference (so `publicIPAddress` is checked in full, not as any object).
    pub fn network_interface() -> Self {
        let mut definitions = serde_json::Map::new();
        for text in [NETWORK_INTERFACE_SCHEMA, PUBLIC_IP_ADDRESS_SCHEMA] {
            let doc: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            if let Some(defs) = doc.get("definitions").and_then(Value::as_object) {
                definitions.extend(defs.clone());
            }
        }
        Self { definitions }
    }

    /// The definition `name`, if vendored.
    pub fn definition(&self, name: &str) -> Option<&Value> {
        self.definitions.get(name)
    }

    /// Every violation of definition `name` in `body`, as `path: problem` lines (empty: valid).
    pub fn check(&self, name: &str, body: &Value) -> Vec<String> {
        let mut problems = Vec::new();
        let schema = serde_json::json!({ "$ref": format!("#/definitions/{name}") });
        self.check_value(&schema, body, "$", &mut problems);
        problems
    }

    /// Whether the property at `path` (dot-separated names) of definition `name` is read-only.
    pub fn is_read_only(&self, name: &str, property: &str) -> bool {
        self.properties(name)
            .iter()
            .find_map(|(key, prop)| (key == property).then_some(prop))
            .and_then(|p| p.get("readOnly"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// The properties of definition `name`, its `allOf` bases' included.
    fn properties(&self, name: &str) -> Vec<(String, Value)> {
        let Some(def) = self.definitions.get(name) else {
            return Vec::new();
        };
        let mut out: Vec<(String, Value)> = Vec::new();
        for base in def
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(base) = base
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(local_name)
            {
                out.extend(self.properties(base));
            }
        }
        if let Some(props) = def.get("properties").and_then(Value::as_object) {
            for (key, prop) in props {
                out.retain(|(k, _)| k != key);
                out.push((key.clone(), prop.clone()));
            }
        }
        out
    }

    fn check_value(&self, schema: &Value, value: &Value, path: &str, problems: &mut Vec<String>) {
        if value.is_null() {
            return;
        }
        if let Some(external) = schema.get("external").and_then(Value::as_str) {
            // A reference into another file of the specification whose definition is vendored
            // is checked as a local one.
            if let Some(name) = external
                .split_once("#/definitions/")
                .map(|(_, name)| name)
                .filter(|name| self.definitions.contains_key(*name))
            {
                let local = serde_json::json!({ "$ref": format!("#/definitions/{name}") });
                self.check_value(&local, value, path, problems);
                return;
            }
            if !value.is_object() {
                problems.push(format!("{path}: expected an object"));
            }
            return;
        }
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            let Some(name) = local_name(reference) else {
                problems.push(format!("{path}: schema reference {reference} not vendored"));
                return;
            };
            let Some(def) = self.definitions.get(name) else {
                problems.push(format!("{path}: schema definition {name} not vendored"));
                return;
            };
            if def.get("properties").is_some() || def.get("allOf").is_some() {
                self.check_object(name, value, path, problems);
            } else {
                self.check_value(def, value, path, problems);
            }
            return;
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => match value.as_str() {
                None => problems.push(format!("{path}: expected a string")),
                Some(s) => {
                    if let Some(values) = schema.get("enum").and_then(Value::as_array)
                        && !values.iter().any(|v| v.as_str() == Some(s))
                    {
                        problems.push(format!("{path}: {s:?} is not one of {values:?}"));
                    }
                }
            },
            Some("boolean") if !value.is_boolean() => {
                problems.push(format!("{path}: expected a boolean"));
            }
            Some("integer") => match value.as_i64() {
                None => problems.push(format!("{path}: expected an integer")),
                Some(n) => {
                    let min = schema.get("minimum").and_then(Value::as_i64);
                    let max = schema.get("maximum").and_then(Value::as_i64);
                    if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
                        problems.push(format!("{path}: {n} is out of range"));
                    }
                }
            },
            Some("array") => match value.as_array() {
                None => problems.push(format!("{path}: expected an array")),
                Some(items) => {
                    if let Some(item_schema) = schema.get("items") {
                        for (i, item) in items.iter().enumerate() {
                            self.check_value(item_schema, item, &format!("{path}[{i}]"), problems);
                        }
                    }
                }
            },
            Some("object") if !value.is_object() => {
                problems.push(format!("{path}: expected an object"));
            }
            _ => {}
        }
    }

    fn check_object(&self, name: &str, value: &Value, path: &str, problems: &mut Vec<String>) {
        let Some(object) = value.as_object() else {
            problems.push(format!("{path}: expected an object ({name})"));
            return;
        };
        let properties = self.properties(name);
        for (key, item) in object {
            match properties.iter().find(|(k, _)| k == key) {
                Some((_, schema)) => {
                    self.check_value(schema, item, &format!("{path}.{key}"), problems);
                }
                None => problems.push(format!("{path}.{key}: {name} has no property {key:?}")),
            }
        }
    }
}

fn local_name(reference: &str) -> Option<&str> {
    reference.strip_prefix("#/definitions/")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    #[test]
    fn the_vendored_schema_names_its_source() {
        let doc: Value = serde_json::from_str(NETWORK_INTERFACE_SCHEMA).unwrap();
        let comment = doc["$comment"].as_str().unwrap();
        assert!(comment.contains("stable/2024-03-01/networkInterface.json"));
        assert!(comment.contains("0c9da75c963c7541b5979aa1a2af9add468d5514"));
    }

    #[test]
    fn a_well_formed_nic_passes() {
        let body = json!({
            "location": "westeurope",
            "etag": "W/\"1\"",
            "properties": {
                "provisioningState": "Succeeded",
                "ipConfigurations": [{
                    "name": "ipconfig1",
                    "properties": {
                        "privateIPAddress": "10.0.0.4",
                        "privateIPAllocationMethod": "Dynamic",
                        "privateIPAddressVersion": "IPv4",
                        "primary": true,
                        "subnet": { "id": "/subscriptions/s/x" },
                        "loadBalancerBackendAddressPools": [{ "id": "/p" }]
                    }
                }]
            }
        });
        assert_eq!(
            Schema::network_interface().check("NetworkInterface", &body),
            Vec::<String>::new()
        );
    }

    #[test]
    fn unknown_names_bad_enums_and_wrong_types_are_caught() {
        let body = json!({
            "properties": {
                "ipConfiguration": [],
                "ipConfigurations": [{
                    "name": "a",
                    "properties": {
                        "privateIpAddress": "10.0.0.4",
                        "privateIPAllocationMethod": "static",
                        "privateIPAddressVersion": "IPv5",
                        "primary": "yes"
                    }
                }]
            }
        });
        let problems = Schema::network_interface().check("NetworkInterface", &body);
        let text = problems.join("\n");
        assert_eq!(problems.len(), 5, "{text}");
        assert!(text.contains("$.properties.ipConfiguration:"), "{text}");
        assert!(text.contains("privateIpAddress"), "{text}");
        assert!(text.contains("\"static\" is not one of"), "{text}");
        assert!(text.contains("\"IPv5\" is not one of"), "{text}");
        assert!(text.contains("primary: expected a boolean"), "{text}");
    }

    #[test]
    fn a_public_ip_on_an_ip_configuration_is_checked_against_its_own_schema() {
        let doc: Value = serde_json::from_str(PUBLIC_IP_ADDRESS_SCHEMA).unwrap();
        assert!(
            doc["$comment"]
                .as_str()
                .unwrap()
                .contains("stable/2024-03-01/publicIpAddress.json")
        );
        let nic = |public: Value| {
            json!({ "properties": { "ipConfigurations": [{
                "name": "a",
                "properties": { "privateIPAddress": "10.0.0.5", "publicIPAddress": public }
            }]}})
        };
        let schema = Schema::network_interface();
        let reference = nic(json!({ "id": "/subscriptions/s/x/publicIPAddresses/p" }));
        assert_eq!(
            schema.check("NetworkInterface", &reference),
            Vec::<String>::new()
        );
        let wrong = nic(json!({
            "id": "/p",
            "sku": { "name": "Premium" },
            "properties": { "publicIPAllocationMethod": "static", "ipAdress": "1.2.3.4" }
        }));
        let problems = schema.check("NetworkInterface", &wrong);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems.iter().any(|p| p.contains("ipAdress")),
            "{problems:?}"
        );
    }

    #[test]
    fn read_only_properties_are_known_as_such() {
        let schema = Schema::network_interface();
        assert!(schema.is_read_only("NetworkInterface", "etag"));
        assert!(schema.is_read_only("NetworkInterfacePropertiesFormat", "macAddress"));
        assert!(schema.is_read_only("NetworkInterface", "name"));
        assert!(!schema.is_read_only(
            "NetworkInterfaceIPConfigurationPropertiesFormat",
            "privateIPAddress"
        ));
    }
}
