//! SPEC §2.1 and §3 rule 1: exactly one name per usable IP, and helpful refusals for the rest.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cloudnet_shared::codec::{NameError, UnusableKind, canonical_name, decode_name, encode_name};
use proptest::prelude::*;

const CANONICAL: &[(&str, &str)] = &[
    ("10.0.0.5", "10.0.0.5"),
    ("1.2.3.4", "1.2.3.4"),
    ("192.168.100.200", "192.168.100.200"),
    ("255.255.255.254", "255.255.255.254"),
    ("100.64.0.1", "100.64.0.1"),
    (
        "fc00.f853.0ccd.e793.0000.0000.0000.0054",
        "fc00:f853:ccd:e793::54",
    ),
    ("2001.0db8.0000.0000.0000.0000.0000.0001", "2001:db8::1"),
    (
        "fd00.0010.0000.0000.ffff.ffff.ffff.ffff",
        "fd00:10::ffff:ffff:ffff:ffff",
    ),
];

#[test]
fn canonical_names_decode_to_their_ip_and_encode_back() {
    for (name, ip) in CANONICAL {
        let ip: IpAddr = ip.parse().unwrap();
        assert_eq!(decode_name(name), Ok(ip), "{name}");
        assert_eq!(encode_name(ip).as_deref(), Ok(*name), "{ip}");
        assert_eq!(canonical_name(name).as_deref(), Ok(*name), "{name}");
    }
}

#[test]
fn spec_example_encodes_as_documented() {
    let ip: IpAddr = "fc00:f853:ccd:e793::54".parse().unwrap();
    assert_eq!(
        encode_name(ip).unwrap(),
        "fc00.f853.0ccd.e793.0000.0000.0000.0054"
    );
}

/// Spellings of a usable IP that are not its name: refused by `decode_name` with the name to
/// use, mapped to that name by `canonical_name`.
const ALTERNATIVE_SPELLINGS: &[(&str, &str)] = &[
    (
        "FC00.F853.0CCD.E793.0000.0000.0000.0054",
        "fc00.f853.0ccd.e793.0000.0000.0000.0054",
    ),
    (
        "fc00.f853.ccd.e793.0.0.0.54",
        "fc00.f853.0ccd.e793.0000.0000.0000.0054",
    ),
    (
        "Fc00.f853.0CCd.e793.0000.0000.0000.0054",
        "fc00.f853.0ccd.e793.0000.0000.0000.0054",
    ),
    ("010.0.0.5", "10.0.0.5"),
    ("10.000.000.005", "10.0.0.5"),
    // Leading zeros are decimal, never octal: 010 is ten, not eight.
    ("192.168.010.077", "192.168.10.77"),
];

const RAW_IPV6: &[(&str, &str)] = &[
    (
        "fc00:f853:ccd:e793::54",
        "fc00.f853.0ccd.e793.0000.0000.0000.0054",
    ),
    (
        "FC00:F853:0CCD:E793:0000:0000:0000:0054",
        "fc00.f853.0ccd.e793.0000.0000.0000.0054",
    ),
    ("2001:db8::1", "2001.0db8.0000.0000.0000.0000.0000.0001"),
    ("fd00::", "fd00.0000.0000.0000.0000.0000.0000.0000"),
];

#[test]
fn non_canonical_spellings_are_refused_with_the_canonical_name() {
    for (input, canonical) in ALTERNATIVE_SPELLINGS {
        let err = decode_name(input).unwrap_err();
        assert_eq!(
            err,
            NameError::NonCanonical {
                name: (*input).into(),
                canonical: (*canonical).into()
            },
            "{input}"
        );
        assert_eq!(err.suggestion(), Some(*canonical));
        assert_eq!(
            err.to_string(),
            format!("name {input:?} is not canonical: use {canonical:?}")
        );
        assert_eq!(canonical_name(input).as_deref(), Ok(*canonical), "{input}");
    }
}

#[test]
fn raw_ipv6_names_are_refused_with_the_canonical_name() {
    for (input, canonical) in RAW_IPV6 {
        let err = decode_name(input).unwrap_err();
        assert!(
            matches!(&err, NameError::RawIpv6 { canonical: c, .. } if c == canonical),
            "{input}: {err:?}"
        );
        assert_eq!(err.suggestion(), Some(*canonical));
        assert!(err.to_string().contains(canonical), "{err}");
        assert_eq!(canonical_name(input).as_deref(), Ok(*canonical), "{input}");
    }
}

#[test]
fn ipv4_mapped_ipv6_is_refused_in_favour_of_the_ipv4_name() {
    for input in [
        "::ffff:10.0.0.5",
        "::ffff:a00:5",
        "0000.0000.0000.0000.0000.ffff.0a00.0005",
        "0.0.0.0.0.FFFF.a00.5",
    ] {
        let err = decode_name(input).unwrap_err();
        assert_eq!(
            err,
            NameError::Ipv4Mapped {
                name: input.into(),
                ipv4: "10.0.0.5".into()
            },
            "{input}"
        );
        assert_eq!(err.suggestion(), Some("10.0.0.5"));
        assert!(err.to_string().contains("use \"10.0.0.5\""), "{err}");
        // Even the lenient form refuses: there must be one object per IP, under the IPv4 name.
        assert_eq!(canonical_name(input), Err(err));
    }
    let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 5).to_ipv6_mapped());
    assert!(matches!(
        encode_name(mapped),
        Err(NameError::Ipv4Mapped { ipv4, .. }) if ipv4 == "10.0.0.5"
    ));
}

#[test]
fn unusable_addresses_are_refused_in_every_spelling() {
    use UnusableKind::*;
    let cases: &[(&str, UnusableKind)] = &[
        ("0.0.0.0", Unspecified),
        ("000.0.0.0", Unspecified),
        ("::", Unspecified),
        ("0000.0000.0000.0000.0000.0000.0000.0000", Unspecified),
        ("127.0.0.1", Loopback),
        ("127.255.0.9", Loopback),
        ("::1", Loopback),
        ("0000.0000.0000.0000.0000.0000.0000.0001", Loopback),
        ("224.0.0.1", Multicast),
        ("239.255.255.250", Multicast),
        ("ff02.0000.0000.0000.0000.0000.0000.0001", Multicast),
        ("ff02::1", Multicast),
        ("169.254.169.254", LinkLocal),
        ("fe80.0000.0000.0000.0000.0000.0000.0001", LinkLocal),
        ("febf::1", LinkLocal),
        ("255.255.255.255", Broadcast),
        // Mapped forms of unusable IPv4 must not suggest the unusable IPv4 name.
        ("::ffff:127.0.0.1", Loopback),
        ("::ffff:255.255.255.255", Broadcast),
    ];
    for (input, kind) in cases {
        let want = NameError::Unusable {
            name: (*input).into(),
            kind: *kind,
        };
        assert_eq!(decode_name(input), Err(want.clone()), "{input}");
        assert_eq!(canonical_name(input), Err(want.clone()), "{input}");
        assert_eq!(want.suggestion(), None);
        assert!(
            want.to_string().contains(kind.describe()),
            "{input}: {want}"
        );
        if let Ok(ip) = input.parse::<IpAddr>() {
            assert!(
                matches!(encode_name(ip), Err(NameError::Unusable { kind: k, .. }) if k == *kind),
                "{input}"
            );
        }
    }
}

#[test]
fn names_that_are_no_ip_are_refused() {
    for input in [
        "",
        "worker-1",
        "10.0.0",
        "10.0.0.5.6",
        "256.0.0.1",
        "1.2.3.-4",
        "+1.2.3.4",
        "1.2.3.+4",
        "10.0.0.5 ",
        " 10.0.0.5",
        "10.0.0.5/32",
        "10..0.5",
        "0x0a.0.0.5",
        "fc00.f853.0ccd.e793.0000.0000.0000",
        "fc00.f853.0ccd.e793.0000.0000.0000.0054.0000",
        "fc00.f853.0ccd.e793.0000.0000.0000.00054",
        "fc00.f853.0ccd.e793.0000.0000.0000.005g",
        "fc00.f853.0ccd.e793.0000..0000.0054",
        "fc00.f853.0ccd.e793.0000.0000.0000.+054",
        "fe80::1%eth0",
        "fc00:::1",
        "fc00.f853.0ccd.e793::54",
    ] {
        let err = decode_name(input).unwrap_err();
        assert_eq!(err, NameError::NotAnIp { name: input.into() }, "{input:?}");
        assert_eq!(err.suggestion(), None);
        assert_eq!(canonical_name(input), Err(err), "{input:?}");
    }
}

#[test]
fn not_an_ip_message_shows_both_valid_forms() {
    let msg = decode_name("worker-1").unwrap_err().to_string();
    assert!(msg.contains("\"worker-1\" is not an IP address"), "{msg}");
    assert!(msg.contains("10.0.0.5"), "{msg}");
    assert!(
        msg.contains("fc00.f853.0ccd.e793.0000.0000.0000.0054"),
        "{msg}"
    );
}

fn is_usable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unicast_link_local()
                || v6.to_ipv4_mapped().is_some())
        }
    }
}

fn usable_ipv4() -> impl Strategy<Value = IpAddr> {
    any::<u32>()
        .prop_map(|n| IpAddr::V4(Ipv4Addr::from(n)))
        .prop_filter("usable", |ip| is_usable(*ip))
}

/// IPv6 with many zero and small groups, so compression and unpadded groups actually occur.
fn usable_ipv6() -> impl Strategy<Value = IpAddr> {
    let group = prop_oneof![Just(0u16), 0u16..0x100, any::<u16>()];
    proptest::array::uniform8(group)
        .prop_map(|g| IpAddr::V6(Ipv6Addr::from(g)))
        .prop_filter("usable", |ip| is_usable(*ip))
}

fn usable_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![usable_ipv4(), usable_ipv6()]
}

/// Every other way a person or a tool might spell `ip`.
fn alternative_spellings(ip: IpAddr) -> Vec<String> {
    let canonical = encode_name(ip).unwrap();
    let mut out = vec![ip.to_string(), ip.to_string().to_uppercase()];
    match ip {
        IpAddr::V4(v4) => {
            out.push(
                v4.octets()
                    .iter()
                    .map(|o| format!("{o:03}"))
                    .collect::<Vec<_>>()
                    .join("."),
            );
            out.push(
                v4.octets()
                    .iter()
                    .map(|o| format!("0{o}"))
                    .collect::<Vec<_>>()
                    .join("."),
            );
        }
        IpAddr::V6(v6) => {
            out.push(canonical.to_uppercase());
            out.push(
                v6.segments()
                    .iter()
                    .map(|g| format!("{g:x}"))
                    .collect::<Vec<_>>()
                    .join("."),
            );
            out.push(
                v6.segments()
                    .iter()
                    .map(|g| format!("{g:04x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
            );
        }
    }
    out.retain(|s| *s != canonical);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn encode_then_decode_round_trips(ip in usable_ip()) {
        let name = encode_name(ip).unwrap();
        prop_assert_eq!(decode_name(&name), Ok(ip));
        prop_assert_eq!(canonical_name(&name), Ok(name.clone()));
        // Names must fit the CRD's name schema.
        match ip {
            IpAddr::V4(v4) => prop_assert_eq!(&name, &v4.to_string()),
            IpAddr::V6(_) => {
                prop_assert_eq!(name.len(), 39);
                prop_assert!(name.split('.').all(|g| g.len() == 4 && g.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))));
            }
        }
    }

    #[test]
    fn different_ips_never_share_a_name(a in usable_ip(), b in usable_ip()) {
        prop_assume!(a != b);
        prop_assert_ne!(encode_name(a).unwrap(), encode_name(b).unwrap());
    }

    #[test]
    fn every_other_spelling_is_refused_but_canonicalised(ip in usable_ip()) {
        let canonical = encode_name(ip).unwrap();
        for spelling in alternative_spellings(ip) {
            let err = decode_name(&spelling).unwrap_err();
            prop_assert_eq!(err.suggestion(), Some(canonical.as_str()), "{}", spelling);
            prop_assert_eq!(canonical_name(&spelling), Ok(canonical.clone()), "{}", spelling);
        }
    }

    #[test]
    fn decoding_any_string_never_panics_and_accepts_only_canonical_names(s in "\\PC{0,48}") {
        if let Ok(ip) = decode_name(&s) {
            prop_assert_eq!(encode_name(ip), Ok(s.clone()));
        }
        if let Ok(name) = canonical_name(&s) {
            prop_assert!(decode_name(&name).is_ok());
        }
    }

    #[test]
    fn decoding_ip_like_strings_accepts_only_canonical_names(s in "[0-9a-fA-F:.]{1,40}") {
        if let Ok(ip) = decode_name(&s) {
            prop_assert_eq!(encode_name(ip), Ok(s.clone()));
        }
        match canonical_name(&s) {
            Ok(name) => prop_assert_eq!(decode_name(&name).map(encode_name), Ok(Ok(name))),
            Err(err) => {
                if let Some(suggestion) = err.suggestion() {
                    let mapped = matches!(err, NameError::Ipv4Mapped { .. });
                    prop_assert!(mapped, "{:?}", err);
                    prop_assert!(decode_name(suggestion).is_ok());
                }
            }
        }
    }
}

#[test]
fn a_name_longer_than_any_spelling_is_refused_with_a_short_quote() {
    // The shape that cost the webhook most: a body-sized name of dots and digits.
    let huge = format!("10.0.0.5{}", ".".repeat(1 << 20));
    let err = decode_name(&huge).unwrap_err();
    assert!(matches!(err, NameError::NotAnIp { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.len() < 512, "{} bytes", message.len());
    assert!(message.contains("1048584 bytes"), "{message}");
    assert!(canonical_name(&huge).is_err());
    // The longest real spelling is still read.
    assert_eq!(
        canonical_name("0000:0000:0000:0000:0000:ffff:10.0.0.5"),
        Err(NameError::Ipv4Mapped {
            name: "0000:0000:0000:0000:0000:ffff:10.0.0.5".into(),
            ipv4: "10.0.0.5".into()
        })
    );
}
