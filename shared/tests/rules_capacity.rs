//! SPEC §3 rule 5 as the reconciler applies it: who occupies a node, and which occupants get
//! the node's limit (attached first, then oldest, then by name), so only the IPs over the limit
//! are blocked, whatever order they are looked at in.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use std::net::IpAddr;

use cloudnet_shared::platform::Bucket;
use cloudnet_shared::rules::{Claim, Rule, check_claim, claims_ahead, occupies};
use cloudnet_shared::{CONDITION_ASSIGNED, CloudPrivateIPConfigStatus};
use cloudnet_shared::{Capacity, CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

fn at(second: i64) -> Option<Timestamp> {
    Some(Timestamp::from_second(1_700_000_000 + second).unwrap())
}

fn claim(name: &str, attached: bool, created: Option<Timestamp>) -> Claim<'_> {
    Claim {
        name,
        attached,
        created,
    }
}

fn limit(n: i64) -> Capacity {
    Capacity {
        ip: Some(n),
        ..Capacity::default()
    }
}

/// The names of `claims` that are within `capacity`, each judged against all the others.
fn within<'a>(claims: &[Claim<'a>], capacity: &Capacity) -> Vec<&'a str> {
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    claims
        .iter()
        .filter(|me| {
            check_claim(ip, "n1", capacity, Bucket::Ip, me, claims.iter().copied()).is_ok()
        })
        .map(|c| c.name)
        .collect()
}

#[test]
fn an_object_occupies_the_node_of_its_spec_or_its_status() {
    for (spec, status, node, want) in [
        ("n1", "", "n1", true),
        ("n1", "n1", "n1", true),
        // Moved away, not yet detached: still on the source.
        ("n2", "n1", "n1", true),
        ("n2", "n1", "n2", true),
        // Parked or being deleted, still attached.
        ("", "n1", "n1", true),
        ("n2", "", "n1", false),
        ("", "", "n1", false),
        ("", "", "", false),
    ] {
        assert_eq!(
            occupies(spec, status, node),
            want,
            "{spec:?} {status:?} {node:?}"
        );
    }
}

#[test]
fn the_limit_goes_to_attached_then_oldest_then_by_name() {
    let mut claims = [
        claim("10.0.0.4", false, at(0)),
        claim("10.0.0.3", false, at(0)),
        claim("10.0.0.2", false, at(5)),
        claim("10.0.0.9", true, at(9)),
        claim("10.0.0.1", false, None),
        claim("10.0.0.8", true, at(1)),
    ];
    claims.sort();
    let order: Vec<&str> = claims.iter().map(|c| c.name).collect();
    assert_eq!(
        order,
        [
            "10.0.0.8", "10.0.0.9", "10.0.0.3", "10.0.0.4", "10.0.0.2", "10.0.0.1"
        ]
    );
}

#[test]
fn four_pending_ips_on_a_node_with_room_for_two_block_only_the_newest_two() {
    let claims = [
        claim("10.0.0.11", false, at(3)),
        claim("10.0.0.12", false, at(1)),
        claim("10.0.0.13", false, at(2)),
        claim("10.0.0.14", false, at(1)),
    ];
    assert_eq!(within(&claims, &limit(2)), ["10.0.0.12", "10.0.0.14"]);
    assert_eq!(within(&claims, &limit(0)), Vec::<&str>::new());
    assert_eq!(within(&claims, &limit(-3)), Vec::<&str>::new());
    assert_eq!(within(&claims, &limit(9)).len(), 4);
    assert_eq!(
        within(&claims, &Capacity::default()).len(),
        4,
        "no key: unlimited"
    );
}

#[test]
fn an_attached_ip_keeps_its_place_before_older_pending_ones() {
    // The capacity shrank under an attached IP, or an older object was moved in later.
    let claims = [
        claim("10.0.0.21", false, at(0)),
        claim("10.0.0.22", true, at(50)),
        claim("10.0.0.23", false, at(10)),
    ];
    assert_eq!(within(&claims, &limit(2)), ["10.0.0.21", "10.0.0.22"]);
    assert_eq!(within(&claims, &limit(1)), ["10.0.0.22"]);
}

#[test]
fn an_object_is_never_counted_ahead_of_itself_and_a_newcomer_comes_last() {
    let me = claim("10.0.0.5", false, at(0));
    let others = [
        me,
        claim("10.0.0.6", false, at(1)),
        claim("10.0.0.7", true, at(2)),
    ];
    assert_eq!(claims_ahead(&me, others), 1);
    assert_eq!(claims_ahead(&Claim::newcomer("10.0.0.8"), others), 3);
    // The request for an object already on the node is not counted against itself.
    assert_eq!(claims_ahead(&Claim::newcomer("10.0.0.6"), others), 2);
}

#[test]
fn the_denial_names_rule_ip_node_and_how_many_come_first() {
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    let others = [
        claim("10.0.0.1", true, at(0)),
        claim("10.0.0.2", false, at(0)),
    ];
    let denial = check_claim(
        ip,
        "n1",
        &limit(2),
        Bucket::Ip,
        &claim("10.0.0.9", false, at(1)),
        others,
    )
    .unwrap_err();
    assert_eq!(denial.rule, Rule::Capacity);
    assert!(
        denial
            .message
            .starts_with("capacity: cannot place 10.0.0.9 on node n1: the node has room for 2 egress IPs (capacity \"ip\" in annotation cloud.network.openshift.io/egress-ipconfig) and 2 come before this one (attached first, then the oldest, then by name)"),
        "{}",
        denial.message
    );
}

fn object(
    name: &str,
    status_node: &str,
    assigned: Option<&str>,
    created: Option<Timestamp>,
) -> CloudPrivateIPConfig {
    let mut object =
        CloudPrivateIPConfig::new(name, CloudPrivateIPConfigSpec { node: "n2".into() });
    object.metadata.creation_timestamp = created.map(Time);
    object.status = Some(CloudPrivateIPConfigStatus {
        node: status_node.into(),
        conditions: assigned
            .map(|status| Condition {
                type_: CONDITION_ASSIGNED.into(),
                status: status.into(),
                reason: "CloudResponseSuccess".into(),
                message: String::new(),
                observed_generation: None,
                last_transition_time: Time(at(0).unwrap()),
            })
            .into_iter()
            .collect(),
    });
    object
}

#[test]
fn a_claim_is_attached_only_where_the_status_says_assigned_true() {
    let on_n1 = object("10.0.0.5", "n1", Some("True"), at(7));
    assert_eq!(Claim::of(&on_n1, "n1"), claim("10.0.0.5", true, at(7)));
    // Its claim on the target of its move is a pending one.
    assert_eq!(Claim::of(&on_n1, "n2"), claim("10.0.0.5", false, at(7)));
    for assigned in [Some("Unknown"), Some("False"), None] {
        let pending = object("10.0.0.6", "n1", assigned, None);
        assert_eq!(
            Claim::of(&pending, "n1"),
            claim("10.0.0.6", false, None),
            "{assigned:?}"
        );
    }
}

proptest! {
    /// Whatever the occupants and the limit, exactly min(limit, occupants) are within it, and
    /// each object's verdict is the same whichever order the others are listed in.
    #[test]
    fn exactly_the_limit_is_granted(
        specs in proptest::collection::btree_map(0u8..40, (any::<bool>(), proptest::option::of(0i64..5)), 0..12),
        cap in -1i64..14,
    ) {
        let names: Vec<String> = specs.keys().map(|k| format!("10.0.0.{k}")).collect();
        let claims: Vec<Claim<'_>> = names
            .iter()
            .zip(specs.values())
            .map(|(name, (attached, created))| claim(name, *attached, created.and_then(at)))
            .collect();
        let granted = within(&claims, &limit(cap));
        let want = usize::try_from(cap.max(0)).unwrap().min(claims.len());
        prop_assert_eq!(granted.len(), want);
        let mut reversed = claims.clone();
        reversed.reverse();
        let mut granted_reversed = within(&reversed, &limit(cap));
        granted_reversed.reverse();
        prop_assert_eq!(granted, granted_reversed);
    }
}
