//! What the reconciler's attachment ledger says about each IP, for rule 3: an IP the ledger shows
//! attached to a VM, or released from one within the window, belongs to a CloudPrivateIPConfig,
//! never to a node, even when the Node still lists it and this process never saw its object (a
//! replica started after the delete). The per-process memory of deletes (`deleted.rs`) stays:
//! it covers deletes the reconciler has not released yet, and clusters where the webhook may not
//! read the ledger.
//!
//! The pages are ConfigMaps in the reconciler's namespace (format: `cloudnet_shared::ledger`).
//! Only names are kept: per page, each name it gives with the Unix second its released record
//! ends (`None` for an attached IP); the snapshot keeps the count of pages naming each.

use std::collections::HashMap;

use cloudnet_shared::ClusterSnapshot;
use cloudnet_shared::ledger::{RECENT_RELEASE_WINDOW, RELEASED_ANNOTATION, parse_released};
use kube::ResourceExt;
use kube::api::DynamicObject;

/// Each page's names: name → the Unix second its released record ends, `None` while attached.
type Names = HashMap<String, Option<u64>>;

/// The names each ledger page gives to the snapshot.
#[derive(Debug, Default)]
pub struct LedgerNames {
    pages: HashMap<String, Names>,
}

impl LedgerNames {
    /// Takes in page `key` as the watch delivered it, at Unix second `now`.
    pub fn upsert(
        &mut self,
        snapshot: &mut ClusterSnapshot,
        key: &str,
        page: &DynamicObject,
        now: u64,
    ) {
        let names = page_names(page, now);
        self.remove(snapshot, key);
        for name in names.keys() {
            snapshot.ledger_name(name);
        }
        if !names.is_empty() {
            self.pages.insert(key.to_owned(), names);
        }
    }

    /// Forgets page `key`.
    pub fn remove(&mut self, snapshot: &mut ClusterSnapshot, key: &str) {
        for name in self.pages.remove(key).unwrap_or_default().keys() {
            snapshot.ledger_forget(name);
        }
    }

    /// Ends the released records whose window has passed at Unix second `now`.
    pub fn expire(&mut self, snapshot: &mut ClusterSnapshot, now: u64) {
        self.pages.retain(|_, names| {
            names.retain(|name, ends| {
                let keep = ends.is_none_or(|ends| now < ends);
                if !keep {
                    snapshot.ledger_forget(name);
                }
                keep
            });
            !names.is_empty()
        });
    }

    /// How many names the pages give, counted per page.
    pub fn len(&self) -> usize {
        self.pages.values().map(HashMap::len).sum()
    }

    /// Whether no page names anything.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }
}

/// A page's names at `now`: its `data` keys (attached), and its released records still within the
/// window. Not decoded: the snapshot is keyed by object name, which the keys already are.
fn page_names(page: &DynamicObject, now: u64) -> Names {
    let window = RECENT_RELEASE_WINDOW.as_secs();
    let mut names: Names = page
        .annotations()
        .get(RELEASED_ANNOTATION)
        .map(|value| parse_released(value))
        .unwrap_or_default()
        .into_iter()
        .map(|(name, at)| (name, at.saturating_add(window)))
        .filter(|(_, ends)| now < *ends)
        .map(|(name, ends)| (name, Some(ends)))
        .collect();
    if let Some(serde_json::Value::Object(data)) = page.data.get("data") {
        names.extend(data.keys().map(|name| (name.clone(), None)));
    }
    names
}

#[cfg(test)]
mod tests {
    use kube::api::ApiResource;

    use super::*;

    fn page(data: serde_json::Value, released: Option<&str>) -> DynamicObject {
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let mut page = DynamicObject::new("cloudnet-ledger-0", &resource).within("cloudnet-system");
        page.data = serde_json::json!({ "data": data });
        if let Some(released) = released {
            page.metadata.annotations =
                Some([(RELEASED_ANNOTATION.into(), released.into())].into());
        }
        page
    }

    #[test]
    fn attached_and_recently_released_ips_are_managed_until_their_record_ends() {
        let window = RECENT_RELEASE_WINDOW.as_secs();
        let mut snapshot = ClusterSnapshot::default();
        let mut names = LedgerNames::default();
        let p = page(
            serde_json::json!({ "10.0.0.5": "n1" }),
            Some(r#"{"10.0.0.6":1000,"10.0.0.7":1}"#),
        );
        names.upsert(&mut snapshot, "p", &p, 1000);
        assert!(snapshot.is_managed("10.0.0.5"));
        assert!(snapshot.is_managed("10.0.0.6"));
        assert!(!snapshot.is_managed("10.0.0.7"), "released too long ago");
        names.expire(&mut snapshot, 1000 + window - 1);
        assert!(snapshot.is_managed("10.0.0.6"));
        names.expire(&mut snapshot, 1000 + window);
        assert!(!snapshot.is_managed("10.0.0.6"));
        assert!(snapshot.is_managed("10.0.0.5"), "attached: no end");
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_name_on_two_pages_stays_managed_until_both_let_go() {
        let mut snapshot = ClusterSnapshot::default();
        let mut names = LedgerNames::default();
        let on = page(serde_json::json!({ "10.0.0.5": "n1" }), None);
        names.upsert(&mut snapshot, "a", &on, 0);
        names.upsert(&mut snapshot, "b", &on, 0);
        // An update replaces what the page gave before.
        names.upsert(&mut snapshot, "a", &page(serde_json::json!({}), None), 0);
        assert!(snapshot.is_managed("10.0.0.5"));
        names.remove(&mut snapshot, "b");
        assert!(!snapshot.is_managed("10.0.0.5"));
        assert!(names.is_empty());
    }
}
