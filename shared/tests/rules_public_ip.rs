//! The EgressPublicIP rules, one table row per check with the rule that must refuse it: the
//! private IP's spelling and family, each cloud's id shape, GCP's refusal, uniqueness on both
//! sides, and the immutable spec.

#![allow(clippy::unwrap_used, reason = "test fixtures are literals")]

use cloudnet_shared::platform::Platform;
use cloudnet_shared::public_ip::{EgressPublicIPSpec, PublicId};
use cloudnet_shared::rules::{Operation, PublicIpIndex, Rule, review_public_ip};

const AWS_ID: &str = "eipalloc-0123456789abcdef0";
const AZURE_ID: &str = "/subscriptions/0b1f6471-1bf0-4dda-aec3-111122223333/resourceGroups/egress-rg/providers/Microsoft.Network/publicIPAddresses/egress-pip-1";
const OPENSTACK_ID: &str = "2f245a7b-796b-4f26-9cf9-9e82d248fda7";

fn spec(private_ip: &str, public_ip: &str) -> EgressPublicIPSpec {
    EgressPublicIPSpec {
        private_ip: private_ip.into(),
        public_ip: public_ip.into(),
    }
}

fn create(
    name: &str,
    spec: &EgressPublicIPSpec,
    index: &PublicIpIndex,
    platform: Option<Platform>,
) -> Result<Vec<String>, (Rule, String)> {
    let verdict = review_public_ip(Operation::Create, name, Some(spec), None, index, platform);
    match verdict.denial {
        None => Ok(verdict.warnings),
        Some(denial) => Err((denial.rule, denial.message)),
    }
}

/// The answer to creating binding `b1` with no other binding around.
fn create_alone(
    private_ip: &str,
    public_ip: &str,
    platform: Option<Platform>,
) -> Result<Vec<String>, (Rule, String)> {
    create(
        "b1",
        &spec(private_ip, public_ip),
        &PublicIpIndex::default(),
        platform,
    )
}

fn refused_by(private_ip: &str, public_ip: &str, platform: Option<Platform>) -> Option<Rule> {
    create_alone(private_ip, public_ip, platform)
        .err()
        .map(|(rule, _)| rule)
}

#[test]
fn each_clouds_id_is_admitted_on_that_cloud() {
    for (platform, id, private_ip) in [
        (Platform::Aws, AWS_ID, "10.0.0.5"),
        (Platform::Aws, "eipalloc-0a1b2c3d", "10.0.0.5"),
        (Platform::Azure, AZURE_ID, "10.0.0.5"),
        (Platform::Azure, AZURE_ID, "fc00:f853:ccd:e793::54"),
        (Platform::OpenStack, OPENSTACK_ID, "192.168.1.20"),
    ] {
        assert_eq!(
            create(
                "b1",
                &spec(private_ip, id),
                &PublicIpIndex::default(),
                Some(platform)
            ),
            Ok(Vec::new()),
            "{platform:?} {id} {private_ip}"
        );
    }
}

#[test]
fn azure_ids_are_read_without_regard_to_case() {
    let shouted = AZURE_ID
        .replace("resourceGroups", "RESOURCEGROUPS")
        .replace(
            "Microsoft.Network/publicIPAddresses",
            "microsoft.network/PublicIpAddresses",
        );
    assert_eq!(
        refused_by("10.0.0.5", &shouted, Some(Platform::Azure)),
        None
    );
    assert_eq!(
        PublicId::parse(&shouted).unwrap().key(),
        PublicId::parse(AZURE_ID).unwrap().key()
    );
}

#[test]
fn a_private_ip_that_is_no_canonical_usable_address_is_refused_with_the_spelling_to_use() {
    for (private_ip, platform, wanted) in [
        ("10.0.0.05", Platform::Aws, Some("use \"10.0.0.5\"")),
        (
            "fc00.f853.0ccd.e793.0000.0000.0000.0054",
            Platform::Azure,
            Some("use \"fc00:f853:ccd:e793::54\""),
        ),
        (
            "FC00:F853:CCD:E793::54",
            Platform::Azure,
            Some("use \"fc00:f853:ccd:e793::54\""),
        ),
        (
            "fc00:f853:0ccd:e793:0:0:0:54",
            Platform::Azure,
            Some("use \"fc00:f853:ccd:e793::54\""),
        ),
        ("10.0.0.5/32", Platform::Aws, None),
        ("", Platform::Aws, None),
        ("node-a", Platform::Aws, None),
        ("127.0.0.1", Platform::Aws, Some("loopback")),
        ("224.0.0.5", Platform::Aws, Some("multicast")),
        ("0.0.0.0", Platform::Aws, Some("unspecified")),
        ("169.254.169.254", Platform::Aws, Some("link-local")),
        ("::ffff:10.0.0.5", Platform::Azure, Some("10.0.0.5")),
        ("fc00::54", Platform::Aws, Some("Elastic IPs are IPv4 only")),
        (
            "fc00::54",
            Platform::OpenStack,
            Some("floating IPs are IPv4 only"),
        ),
    ] {
        let id = match platform {
            Platform::Aws => AWS_ID,
            Platform::Azure => AZURE_ID,
            _ => OPENSTACK_ID,
        };
        let (rule, message) = create_alone(private_ip, id, Some(platform)).expect_err(private_ip);
        assert_eq!(rule, Rule::PublicIpPrivate, "{private_ip}: {message}");
        assert!(
            message.starts_with("public_ip_private: privateIP"),
            "{message}"
        );
        if let Some(wanted) = wanted {
            assert!(message.contains(wanted), "{private_ip}: {message}");
        }
    }
}

#[test]
fn a_public_id_of_the_wrong_shape_or_cloud_is_refused_naming_the_clouds_shape() {
    for (public_ip, platform, wanted) in [
        (
            AZURE_ID,
            Some(Platform::Aws),
            "publicIP \"/subscriptions/0b1f6471-1bf0-4dda-aec3-111122223333/resourceGroups/egress-rg/providers/Microsoft.Network/publicIPAddresses/egress-pip-1\" is Azure's kind of id, but the cluster runs on AWS: use an Elastic IP allocation id",
        ),
        (AWS_ID, Some(Platform::OpenStack), "use a floating IP id"),
        (
            OPENSTACK_ID,
            Some(Platform::Azure),
            "use a public IP resource id",
        ),
        (
            "eipalloc-0123",
            Some(Platform::Aws),
            "is no public address id",
        ),
        (
            "eipalloc-0123456789ABCDEF0",
            Some(Platform::Aws),
            "is no public address id",
        ),
        (
            "eipassoc-0123456789abcdef0",
            Some(Platform::Aws),
            "on AWS, an Elastic IP allocation id",
        ),
        (
            "3.120.4.5",
            Some(Platform::Aws),
            "is an address, not the cloud's id of one",
        ),
        (
            "2F245A7B-796B-4F26-9CF9-9E82D248FDA7",
            Some(Platform::OpenStack),
            "is no public address id",
        ),
        (
            "/subscriptions/0b1f6471-1bf0-4dda-aec3-111122223333/resourceGroups/egress-rg/providers/Microsoft.Network/networkInterfaces/nic-1",
            Some(Platform::Azure),
            "is no public address id",
        ),
        (
            "/subscriptions/not-a-guid/resourceGroups/egress-rg/providers/Microsoft.Network/publicIPAddresses/pip",
            Some(Platform::Azure),
            "is no public address id",
        ),
        (
            "/subscriptions/0b1f6471-1bf0-4dda-aec3-111122223333/resourceGroups/egress-rg/providers/Microsoft.Network/publicIPAddresses/-pip",
            Some(Platform::Azure),
            "is no public address id",
        ),
        ("", None, "is no public address id"),
        (&"x".repeat(100_000), None, "is no public address id"),
    ] {
        let (rule, message) = create_alone("10.0.0.5", public_ip, platform).expect_err(public_ip);
        assert_eq!(rule, Rule::PublicIpId, "{message}");
        assert!(message.contains(wanted), "{public_ip}: {message}");
        assert!(
            message.len() <= cloudnet_shared::rules::MESSAGE_BYTES,
            "{}",
            message.len()
        );
    }
}

#[test]
fn gcp_is_refused_with_cloud_nat_named_as_the_alternative() {
    for (public_ip, platform) in [
        (AWS_ID, Some(Platform::Gcp)),
        (
            "projects/p/regions/us-central1/addresses/egress-1",
            Some(Platform::Gcp),
        ),
        (
            "https://www.googleapis.com/compute/v1/projects/p/regions/us-central1/addresses/egress-1",
            None,
        ),
    ] {
        let (rule, message) = create_alone("10.0.0.5", public_ip, platform).expect_err(public_ip);
        assert_eq!(rule, Rule::PublicIpPlatform, "{message}");
        assert!(message.contains("Cloud NAT"), "{message}");
        assert!(message.contains("reserved"), "{message}");
    }
}

#[test]
fn an_unknown_cloud_takes_the_id_shape_for_the_cloud_and_warns() {
    let warnings = create(
        "b1",
        &spec("fc00::54", AZURE_ID),
        &PublicIpIndex::default(),
        None,
    )
    .unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("taken as Azure's"), "{warnings:?}");
    assert_eq!(
        refused_by("fc00::54", AWS_ID, None),
        Some(Rule::PublicIpPrivate),
        "an Elastic IP is IPv4"
    );
}

#[test]
fn each_private_ip_and_each_public_address_is_bound_once() {
    let mut index = PublicIpIndex::default();
    index.upsert("first", &spec("10.0.0.5", AZURE_ID));
    index.upsert("unreadable", &spec("not-an-ip", "junk"));
    let other_pip = AZURE_ID.replace("egress-pip-1", "egress-pip-2");
    for (name, candidate, holder) in [
        ("second", spec("10.0.0.5", &other_pip), Some("first")),
        (
            "second",
            // The same resource id in other case: ARM reads both as one.
            spec("10.0.0.6", &AZURE_ID.to_uppercase()),
            Some("first"),
        ),
        ("second", spec("10.0.0.6", &other_pip), None),
        ("first", spec("10.0.0.5", AZURE_ID), None),
    ] {
        match (
            create(name, &candidate, &index, Some(Platform::Azure)),
            holder,
        ) {
            (Ok(_), None) => {}
            (Err((rule, message)), Some(holder)) => {
                assert_eq!(rule, Rule::PublicIpConflict, "{message}");
                assert!(
                    message.contains(&format!("EgressPublicIP {holder} already binds")),
                    "{message}"
                );
                assert!(
                    message.contains(&format!("delete {holder} first")),
                    "{message}"
                );
            }
            (answer, holder) => {
                panic!("{candidate:?} by {name}: {answer:?}, expected holder {holder:?}")
            }
        }
    }
    index.remove("first");
    assert!(
        create(
            "second",
            &spec("10.0.0.5", AZURE_ID),
            &index,
            Some(Platform::Azure)
        )
        .is_ok()
    );
    assert_eq!(index.len(), 1);
    index.remove("unreadable");
    assert!(index.is_empty());
}

#[test]
fn the_spec_never_changes_but_metadata_updates_and_deletes_always_pass() {
    let index = PublicIpIndex::default();
    let old = spec("10.0.0.5", AWS_ID);
    let moved = spec("10.0.0.6", AWS_ID);
    let verdict = review_public_ip(
        Operation::Update,
        "b1",
        Some(&moved),
        Some(&old),
        &index,
        Some(Platform::Aws),
    );
    let denial = verdict.denial.unwrap();
    assert_eq!(denial.rule, Rule::PublicIpImmutable);
    assert!(
        denial.message.contains("10.0.0.5 → 10.0.0.6"),
        "{}",
        denial.message
    );
    assert!(
        denial
            .message
            .contains("delete it and create a new binding"),
        "{}",
        denial.message
    );
    // Same spec on a cloud that would refuse it today (GCP): still passes, or it could never be
    // relabelled or have a finalizer removed.
    assert!(
        review_public_ip(
            Operation::Update,
            "b1",
            Some(&old),
            Some(&old),
            &index,
            Some(Platform::Gcp)
        )
        .allowed()
    );
    assert!(
        review_public_ip(
            Operation::Delete,
            "b1",
            None,
            Some(&old),
            &index,
            Some(Platform::Gcp)
        )
        .allowed()
    );
    let missing = review_public_ip(
        Operation::Create,
        "b1",
        None,
        None,
        &index,
        Some(Platform::Aws),
    );
    assert_eq!(missing.denial.unwrap().rule, Rule::BadInput);
}

#[test]
fn reasons_map_to_condition_statuses() {
    use cloudnet_shared::public_ip::AssociatedReason as R;
    assert_eq!(
        (R::Associated.as_str(), R::Associated.status()),
        ("Associated", "True")
    );
    assert_eq!(R::Pending.status(), "Unknown");
    for reason in [
        R::EgressIPNotAttached,
        R::MarkerMissing,
        R::PublicIPNotFound,
        R::PermissionDenied,
        R::Conflict,
        R::CloudError,
    ] {
        assert_eq!(reason.status(), "False", "{}", reason.as_str());
    }
}
