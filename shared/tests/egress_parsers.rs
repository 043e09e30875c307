//! Property tests of the egress-router parsers: no input makes them panic, and what they accept
//! round-trips.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use std::net::IpAddr;

use cloudnet_shared::egress::{
    Destination, EgressRouterSpec, RouterRef, parse_cidr, parse_destination, valid_interface_name,
    valid_pod_key,
};
use cloudnet_shared::rules::egress_router_cni::config_addresses;
use cloudnet_shared::rules::{check_cni_config, check_egress_router};
use proptest::prelude::*;

fn any_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from)
    ]
}

/// Arbitrary JSON, biased towards the egress-router config's own keys.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let key = prop_oneof![
        Just("type".to_owned()),
        Just("ip".to_owned()),
        Just("podIP".to_owned()),
        Just("ipConfig".to_owned()),
        Just("addresses".to_owned()),
        Just("gateway".to_owned()),
        Just("destinations".to_owned()),
        Just("interfaceType".to_owned()),
        Just("interfaceArgs".to_owned()),
        Just("plugins".to_owned()),
        Just("overrides".to_owned()),
        Just("name".to_owned()),
        "[a-z*-]{0,6}",
    ];
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::from("egress-router")),
        Just(serde_json::Value::from("192.168.3.10/24")),
        "[0-9a-f.:/ *A-Z-]{0,20}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(key.clone(), inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn cidrs_round_trip(ip in any_ip(), len in 0u8..=128) {
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let text = format!("{ip}/{len}");
        match parse_cidr(&text) {
            Some(cidr) => {
                prop_assert!(len <= width);
                prop_assert_eq!(cidr.ip, ip);
                prop_assert_eq!(cidr.net.prefix_len(), len);
                prop_assert!(cidr.net.contains(&ip));
            }
            None => prop_assert!(len > width),
        }
    }

    #[test]
    fn redirect_destinations_round_trip(port in 1u16.., to in any_ip(), target in proptest::option::of(1u16..), proto in 0usize..3) {
        let protocol = ["tcp", "UDP", "Sctp"][proto];
        let text = match target {
            Some(t) => format!("{port} {protocol} {to} {t}"),
            None => format!("{port} {protocol} {to}"),
        };
        match parse_destination(&text).unwrap() {
            Destination::Redirect { port: p, to: t, target_port, protocol: parsed } => {
                prop_assert_eq!(p, port);
                prop_assert_eq!(t.addr(), to);
                prop_assert_eq!(target_port, target);
                prop_assert_eq!(parsed.as_str(), protocol.to_ascii_uppercase());
            }
            other => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn string_parsers_never_panic(text in "\\PC{0,40}") {
        let _ = parse_cidr(&text);
        let _ = parse_destination(&text);
        let _ = valid_pod_key(&text);
        let _ = valid_interface_name(&text);
        let _ = config_addresses(&text);
        let _ = check_cni_config(&RouterRef::nad("n", "n"), &text, None);
    }

    #[test]
    fn pod_keys_allow_one_star_at_the_end_only(prefix in "[a-z0-9][a-z0-9.-]{0,20}", suffix in "[a-z0-9]{0,5}") {
        let star = format!("{prefix}*");
        let inner = format!("{prefix}*{suffix}*");
        let leading = format!("*{prefix}");
        prop_assert!(valid_pod_key(&star));
        prop_assert!(!valid_pod_key(&inner));
        prop_assert!(!valid_pod_key(&leading));
    }

    #[test]
    fn arbitrary_configs_and_specs_never_panic(value in json_value(), egress in any::<bool>()) {
        let mut value = value;
        if egress && let Some(map) = value.as_object_mut() {
            map.insert("type".into(), "egress-router".into());
        }
        let text = value.to_string();
        let checked = check_cni_config(&RouterRef::nad("n", "n"), &text, None);
        if let Some(Ok(checked)) = checked {
            // Whatever passes is indexed with the same addresses.
            let mut indexed = config_addresses(&text);
            let mut passed = checked.addresses;
            indexed.sort();
            passed.sort();
            prop_assert_eq!(indexed, passed);
        }
        if let Ok(spec) = serde_json::from_value::<EgressRouterSpec>(value) {
            let _ = check_egress_router(&RouterRef::egress_router("n", "n"), &spec);
        }
    }
}
