//! The attachment ledger's page format, shared by its writer (the reconciler) and its reader
//! (the webhook, which treats an IP the ledger names as managed: rule 3).
//!
//! A page is a ConfigMap labelled [`LABEL`]: [`INSTANCE_ANNOTATION`] names its VM; `data` maps
//! each attached IP's object name to the node it was attached as; [`RELEASED_ANNOTATION`] lists
//! the IPs detached from that VM lately, each with the time of the confirmed detach, as a JSON
//! object of object names to Unix seconds (`{"10.0.0.5":1764080000}`), so that an admin reads it
//! with `kubectl get cm -o yaml`. A released record lives [`RECENT_RELEASE_WINDOW`]; the
//! writer drops older ones on its next write of the page, and readers ignore them before that.

use std::collections::BTreeMap;
use std::time::Duration;

/// The label every page carries (`kubectl get configmaps -l cloudnet.io/ledger`).
pub const LABEL: &str = "cloudnet.io/ledger";
/// The label's value: the page layout's version.
pub const LABEL_VALUE: &str = "v1";
/// The annotation naming a page's VM.
pub const INSTANCE_ANNOTATION: &str = "cloudnet.io/ledger-instance";
/// The annotation holding a page's released records.
pub const RELEASED_ANNOTATION: &str = "cloudnet.io/ledger-released";

/// How long a detached or deleted object's IP stays managed. cloud-controller-manager refreshes
/// a Node's `status.addresses` every 5 minutes (`--node-status-update-frequency`), so a detached
/// IP can stay listed that long after its object is gone, plus the detach itself; twice that
/// survives one slow or failed refresh without leaving an unmanaged node IP open for long. The
/// webhook's per-process memory of deletes and the ledger's released records both last this long.
pub const RECENT_RELEASE_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Released records: object name → Unix seconds of the detach.
pub type Released = BTreeMap<String, u64>;

/// Reads a page's released records; entries that are not a name with a whole number of seconds
/// are left out (a page edited by hand must not stop the reader).
pub fn parse_released(value: &str) -> Released {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(value) else {
        return Released::new();
    };
    map.into_iter()
        .filter_map(|(name, at)| Some((name, at.as_u64()?)))
        .collect()
}

/// The annotation's value for `released`; `None` (remove the annotation) when it is empty.
pub fn format_released(released: &Released) -> Option<String> {
    if released.is_empty() {
        return None;
    }
    serde_json::to_string(released).ok()
}

/// Whether a record made at `at` is still within the window at `now` (both Unix seconds).
pub fn is_recent(at: u64, now: u64) -> bool {
    now.saturating_sub(at) < RECENT_RELEASE_WINDOW.as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_records_round_trip_and_bad_entries_are_left_out() {
        let released = Released::from([
            ("10.0.0.5".into(), 1_700_000_000),
            ("fd00.0000.0000.0000.0000.0000.0000.0001".into(), 7),
        ]);
        let text = format_released(&released).unwrap();
        assert_eq!(
            text,
            r#"{"10.0.0.5":1700000000,"fd00.0000.0000.0000.0000.0000.0000.0001":7}"#
        );
        assert_eq!(parse_released(&text), released);
        assert_eq!(format_released(&Released::new()), None);
        assert_eq!(
            parse_released(r#"{"10.0.0.5":"soon","10.0.0.6":-1,"10.0.0.7":12}"#),
            Released::from([("10.0.0.7".into(), 12)])
        );
        assert!(parse_released("not json").is_empty());
        assert!(parse_released("[1]").is_empty());
    }

    #[test]
    fn a_record_is_recent_for_the_window_and_not_after() {
        let window = RECENT_RELEASE_WINDOW.as_secs();
        assert!(is_recent(1000, 1000));
        assert!(is_recent(1000, 1000 + window - 1));
        assert!(!is_recent(1000, 1000 + window));
        // A clock that went back a little: still recent, never expired early.
        assert!(is_recent(1000, 990));
    }
}
