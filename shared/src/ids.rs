//! Identifier shapes that the admission rules and the cloud providers both check.

/// Whether `id` is a UUID in its hyphenated 8-4-4-4-12 form, in either case (Neutron and Nova
/// ids, ARM subscriptions).
pub fn is_hyphenated_uuid(id: &str) -> bool {
    // `Uuid::try_parse` also takes the simple, braced and URN forms; none is 36 long.
    id.len() == 36 && uuid::Uuid::try_parse(id).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_hyphenated_form_in_either_case() {
        assert!(is_hyphenated_uuid("8f6a1c2e-3b4d-4e5f-9a0b-1c2d3e4f5a6b"));
        assert!(is_hyphenated_uuid("8F6A1C2E-3B4D-4E5F-9A0B-1C2D3E4F5A6B"));
        for other in [
            "8f6a1c2e3b4d4e5f9a0b1c2d3e4f5a6b",
            "{8f6a1c2e-3b4d-4e5f-9a0b-1c2d3e4f5a6b}",
            "urn:uuid:8f6a1c2e-3b4d-4e5f-9a0b-1c2d3e4f5a6b",
            "8f6a1c2e-3b4d-4e5f-9a0b1-c2d3e4f5a6b",
            "8f6a1c2e-3b4d-4e5f-9a0b-1c2d3e4f5a6g",
            "",
        ] {
            assert!(!is_hyphenated_uuid(other), "{other}");
        }
    }
}
