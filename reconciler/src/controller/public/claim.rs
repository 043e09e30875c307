//! Which of two bindings claiming one private IP or one public address keeps it. Admission
//! refuses the second binding, but two webhook replicas can admit both at the same instant, each
//! before its cache saw the other: the older binding (creationTimestamp, then name) wins, and the
//! other is marked `Conflict` until the older one is gone.

use std::net::IpAddr;

use cloudnet_shared::public_ip::EgressPublicIP;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

/// Whether `a` and `b` claim the same private IP or the same public address. Public ids compare
/// without regard to case (Azure's resource ids; the others are lower case).
fn overlap(a: &EgressPublicIP, b: &EgressPublicIP) -> bool {
    let private = |x: &EgressPublicIP| x.spec.private_ip.parse::<IpAddr>().ok();
    let same_private = match (private(a), private(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.spec.private_ip == b.spec.private_ip,
    };
    same_private || a.spec.public_ip.eq_ignore_ascii_case(&b.spec.public_ip)
}

/// What orders bindings by age: creationTimestamp (whole seconds), then name.
fn age(binding: &EgressPublicIP) -> (Option<Time>, String) {
    (
        binding.metadata.creation_timestamp.clone(),
        binding.name_any(),
    )
}

/// The oldest other binding that claims what `binding` claims and came before it, if any: then
/// `binding` must leave the address alone.
pub(crate) fn rival<'a>(
    binding: &EgressPublicIP,
    others: impl IntoIterator<Item = &'a EgressPublicIP>,
) -> Option<&'a EgressPublicIP> {
    others
        .into_iter()
        .filter(|other| overlap(binding, other) && age(other) < age(binding))
        .min_by_key(|other| age(other))
}

/// Every other binding that claims part of what `binding` claims: those to look at again when
/// it goes or gives way.
pub(crate) fn overlapping<'a>(
    binding: &'a EgressPublicIP,
    others: impl IntoIterator<Item = &'a EgressPublicIP> + 'a,
) -> impl Iterator<Item = &'a EgressPublicIP> + 'a {
    others
        .into_iter()
        .filter(move |other| other.name_any() != binding.name_any() && overlap(binding, other))
}

/// Another binding, not being deleted, of `binding`'s public address, if any. The association
/// of that address is then the other binding's to keep or move: `binding` must never undo it,
/// whether it gives way or is deleted. On Azure and OpenStack both bindings would record the
/// same id for it (the ip-configuration, the reservation port), so the recorded id alone cannot
/// tell whose it is.
pub(crate) fn keeper<'a>(
    binding: &EgressPublicIP,
    others: impl IntoIterator<Item = &'a EgressPublicIP>,
) -> Option<&'a EgressPublicIP> {
    others.into_iter().find(|other| {
        other.name_any() != binding.name_any()
            && other.metadata.deletion_timestamp.is_none()
            && other
                .spec
                .public_ip
                .eq_ignore_ascii_case(&binding.spec.public_ip)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloudnet_shared::public_ip::EgressPublicIPSpec;

    fn binding(name: &str, private: &str, public: &str, second: i64) -> EgressPublicIP {
        let mut b = EgressPublicIP::new(
            name,
            EgressPublicIPSpec {
                private_ip: private.into(),
                public_ip: public.into(),
            },
        );
        b.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(second).unwrap_or_default(),
        ));
        b
    }

    #[test]
    fn the_older_of_two_bindings_of_one_private_ip_or_one_public_address_wins() {
        let first = binding("b-first", "10.0.0.5", "eipalloc-0123456789abcdef0", 100);
        let same_ip = binding("a-later", "10.0.0.5", "eipalloc-0123456789abcdef1", 200);
        let same_public = binding("c-later", "10.0.0.6", "EIPALLOC-0123456789ABCDEF0", 200);
        let unrelated = binding("d", "10.0.0.7", "eipalloc-0123456789abcdef2", 50);
        let all = [
            first.clone(),
            same_ip.clone(),
            same_public.clone(),
            unrelated.clone(),
        ];
        assert!(rival(&first, &all).is_none());
        assert_eq!(
            rival(&same_ip, &all).map(ResourceExt::name_any),
            Some("b-first".into())
        );
        assert_eq!(
            rival(&same_public, &all).map(ResourceExt::name_any),
            Some("b-first".into())
        );
        assert!(rival(&unrelated, &all).is_none());
    }

    #[test]
    fn a_live_binding_of_the_same_public_address_keeps_its_association() {
        let first = binding("a", "10.0.0.5", "eipalloc-0123456789abcdef0", 100);
        let twin = binding("b", "10.0.0.5", "EIPALLOC-0123456789ABCDEF0", 100);
        let other_public = binding("c", "10.0.0.5", "eipalloc-0123456789abcdef1", 100);
        let all = [first.clone(), twin.clone(), other_public.clone()];
        assert_eq!(
            keeper(&first, &all).map(ResourceExt::name_any),
            Some("b".into())
        );
        assert_eq!(
            keeper(&twin, &all).map(ResourceExt::name_any),
            Some("a".into())
        );
        assert!(keeper(&other_public, &all).is_none(), "its own address");
        let mut deleting = twin.clone();
        deleting.metadata.deletion_timestamp = first.metadata.creation_timestamp.clone();
        assert!(
            keeper(&first, &[first.clone(), deleting]).is_none(),
            "going too"
        );
        let names: Vec<_> = overlapping(&first, &all)
            .map(ResourceExt::name_any)
            .collect();
        assert_eq!(names, ["b", "c"]);
    }

    #[test]
    fn created_in_the_same_second_the_name_decides() {
        let a = binding("a", "10.0.0.5", "eipalloc-0123456789abcdef0", 100);
        let b = binding("b", "10.0.0.5", "eipalloc-0123456789abcdef1", 100);
        let all = [a.clone(), b.clone()];
        assert!(rival(&a, &all).is_none());
        assert_eq!(rival(&b, &all).map(ResourceExt::name_any), Some("a".into()));
    }
}
