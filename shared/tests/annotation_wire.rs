//! SPEC §2.4: the egress-ipconfig annotation value is byte-identical to upstream's.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use cloudnet_shared::annotation::{
    Capacity, EGRESS_IPCONFIG_ANNOTATION, EgressIpConfig, IfAddr, decode, encode,
};
use cloudnet_shared::platform::Bucket;

/// Values as upstream writes them; each must survive decode → encode unchanged.
const UPSTREAM_VALUES: &[&str] = &[
    // GCP
    r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.128.0/17"},"capacity":{"ip":100}}]"#,
    // AWS, per family
    r#"[{"interface":"eni-0123","ifaddr":{"ipv4":"10.0.128.0/20","ipv6":"fd00:10:0:1::/64"},"capacity":{"ipv4":14,"ipv6":15}}]"#,
    // Azure, dual stack, shared capacity
    r#"[{"interface":"worker-1-nic","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd00::/64"},"capacity":{"ip":255}}]"#,
    // OpenStack, IPv6 only
    r#"[{"interface":"a1b2c3d4-port","ifaddr":{"ipv6":"2001:db8:0:1::/64"},"capacity":{"ip":8}}]"#,
    // A full node still writes its zero.
    r#"[{"interface":"eni-0123","ifaddr":{"ipv4":"10.0.128.0/20"},"capacity":{"ipv4":0,"ipv6":0}}]"#,
    r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.128.0/17"},"capacity":{"ip":-3}}]"#,
    r#"[{"interface":"nic0","ifaddr":{},"capacity":{}}]"#,
    "[]",
];

#[test]
fn upstream_values_round_trip_byte_for_byte() {
    for value in UPSTREAM_VALUES {
        let configs = decode(value).unwrap();
        assert_eq!(encode(&configs), *value);
    }
}

#[test]
fn gcp_value_decodes_to_shared_capacity() {
    let configs = decode(UPSTREAM_VALUES[0]).unwrap();
    assert_eq!(
        configs,
        vec![EgressIpConfig {
            interface: "nic0".into(),
            ifaddr: IfAddr {
                ipv4: Some("10.0.128.0/17".parse().unwrap()),
                ipv6: None,
            },
            capacity: Capacity {
                ipv4: None,
                ipv6: None,
                ip: Some(100),
            },
        }]
    );
    let capacity = configs[0].capacity;
    assert_eq!(capacity.get(Bucket::Ip), Some(100));
    assert_eq!(capacity.get(Bucket::Ipv4), None, "absent key = unlimited");
}

#[test]
fn aws_value_decodes_to_per_family_capacity() {
    let config = decode(UPSTREAM_VALUES[1]).unwrap().remove(0);
    assert_eq!(config.interface, "eni-0123");
    assert_eq!(
        config.ifaddr.ipv6,
        Some("fd00:10:0:1::/64".parse().unwrap())
    );
    assert_eq!(config.capacity.get(Bucket::Ipv4), Some(14));
    assert_eq!(config.capacity.get(Bucket::Ipv6), Some(15));
    assert_eq!(config.capacity.get(Bucket::Ip), None);
}

#[test]
fn encode_writes_keys_in_upstream_order_and_keeps_zero() {
    let config = EgressIpConfig {
        interface: "eni-1".into(),
        ifaddr: IfAddr::new(
            Some("10.0.0.0/24".parse().unwrap()),
            Some("fd00::/64".parse().unwrap()),
        ),
        capacity: Capacity {
            ipv4: Some(0),
            ipv6: Some(2),
            ip: Some(3),
        },
    };
    assert_eq!(
        encode(&[config]),
        r#"[{"interface":"eni-1","ifaddr":{"ipv4":"10.0.0.0/24","ipv6":"fd00::/64"},"capacity":{"ipv4":0,"ipv6":2,"ip":3}}]"#
    );
}

#[test]
fn absent_families_and_buckets_are_omitted() {
    let config = EgressIpConfig {
        interface: "nic0".into(),
        ifaddr: IfAddr::default(),
        capacity: Capacity::default(),
    };
    assert_eq!(
        encode(&[config]),
        r#"[{"interface":"nic0","ifaddr":{},"capacity":{}}]"#
    );
}

#[test]
fn host_bits_are_cleared_when_building_decoding_and_encoding() {
    let built = IfAddr::new(
        Some("10.0.128.77/17".parse().unwrap()),
        Some("fd00:10:0:1::5/64".parse().unwrap()),
    );
    assert_eq!(built.ipv4, Some("10.0.128.0/17".parse().unwrap()));
    assert_eq!(built.ipv6, Some("fd00:10:0:1::/64".parse().unwrap()));

    let decoded = decode(
        r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.200.9/17","ipv6":"fd00::1/64"},"capacity":{"ip":100}}]"#,
    )
    .unwrap();
    assert_eq!(
        encode(&decoded),
        r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.128.0/17","ipv6":"fd00::/64"},"capacity":{"ip":100}}]"#
    );

    // Even a struct literal that skipped `IfAddr::new` is written as a network CIDR.
    let raw = EgressIpConfig {
        interface: "nic0".into(),
        ifaddr: IfAddr {
            ipv4: Some("10.0.0.9/24".parse().unwrap()),
            ipv6: None,
        },
        capacity: Capacity {
            ip: Some(1),
            ..Capacity::default()
        },
    };
    assert_eq!(
        encode(&[raw]),
        r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ip":1}}]"#
    );
}

#[test]
fn unknown_keys_are_ignored() {
    let configs = decode(
        r#"[{"interface":"nic0","mac":"aa:bb","ifaddr":{"ipv4":"10.0.0.0/24","extra":"x"},"capacity":{"ip":7,"future":1}},{"interface":"nic1","ifaddr":{},"capacity":{}}]"#,
    )
    .unwrap();
    assert_eq!(configs.len(), 2);
    assert_eq!(configs[0].capacity.ip, Some(7));
    assert_eq!(
        encode(&configs),
        r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ip":7}},{"interface":"nic1","ifaddr":{},"capacity":{}}]"#
    );
}

#[test]
fn missing_sections_and_empty_strings_read_as_absent() {
    let configs = decode(r#"[{"interface":"nic0","ifaddr":{"ipv4":"","ipv6":null}}]"#).unwrap();
    assert_eq!(configs[0].ifaddr, IfAddr::default());
    assert_eq!(configs[0].capacity, Capacity::default());
}

#[test]
fn malformed_values_are_refused_with_the_annotation_and_the_culprit_named() {
    for (value, culprit) in [
        ("", "EOF"),
        ("{not json", "expected a sequence"),
        ("[{\"interface\":", "EOF"),
        (
            r#"{"interface":"nic0","ifaddr":{},"capacity":{}}"#,
            "expected a sequence",
        ),
        (
            r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.0.0"},"capacity":{}}]"#,
            "\"10.0.0.0\" is not a CIDR",
        ),
        (
            r#"[{"interface":"nic0","ifaddr":{"ipv4":"fd00::/64"},"capacity":{}}]"#,
            "\"fd00::/64\" is not a CIDR",
        ),
        (
            r#"[{"interface":"nic0","ifaddr":{},"capacity":{"ip":"100"}}]"#,
            "invalid type: string \"100\"",
        ),
        (
            r#"[{"interface":"nic0","ifaddr":{},"capacity":{"ip":1.5}}]"#,
            "invalid type: floating point",
        ),
    ] {
        let message = decode(value).unwrap_err().to_string();
        assert!(
            message.contains(EGRESS_IPCONFIG_ANNOTATION),
            "{value}: {message}"
        );
        assert!(message.contains(culprit), "{value}: {message}");
    }
}
