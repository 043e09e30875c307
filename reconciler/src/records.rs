//! The instance records of the watched objects, held beside kube's object cache rather than in it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cloudnet_shared::CloudPrivateIPConfig;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::INSTANCE_ANNOTATION;
use crate::cloud::InstanceId;

/// The instance record ([`INSTANCE_ANNOTATION`]) of each watched object. The watch takes every
/// object's annotations out before kube's cache stores it: a one-entry annotation map costs about
/// 600 bytes an object there (a B-tree leaf sized for eleven entries), the record alone a fifth
/// of that, and no other annotation is ever read.
#[derive(Debug, Default)]
pub struct Records {
    inner: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Object name to its record, for the objects the cache holds.
    by_object: HashMap<String, Box<str>>,
    /// A relist in progress: the cache keeps its old objects until it is done, and so do we.
    relist: Option<HashMap<String, Box<str>>>,
}

impl Records {
    /// Follows one event of the object watch, before the cache's writer: takes each object's
    /// annotations out and keeps its record.
    pub fn take(&self, event: &mut Event<CloudPrivateIPConfig>) {
        let mut state = self.lock();
        match event {
            Event::Apply(obj) => {
                let name = obj.name_any();
                match take_record(obj) {
                    Some(record) => state.by_object.insert(name, record),
                    None => state.by_object.remove(&name),
                };
            }
            // The cache's writer drops the object: nothing reads its annotations.
            Event::Delete(obj) => {
                state.by_object.remove(&obj.name_any());
            }
            Event::Init => state.relist = Some(HashMap::new()),
            Event::InitApply(obj) => {
                if let Some(record) = take_record(obj) {
                    let listed = state.relist.get_or_insert_with(HashMap::new);
                    listed.insert(obj.name_any(), record);
                }
            }
            Event::InitDone => state.by_object = state.relist.take().unwrap_or_default(),
        }
    }

    /// The instance `obj` records for `node`: from its own annotations when it still has them
    /// (an object one of our writes returned, or read from the API), else the record the watch
    /// took out of its cached version.
    pub fn instance(&self, obj: &CloudPrivateIPConfig, node: &str) -> Option<InstanceId> {
        match &obj.metadata.annotations {
            Some(annotations) => instance_in(annotations.get(INSTANCE_ANNOTATION)?, node),
            None => instance_in(self.lock().by_object.get(&obj.name_any())?, node),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The record written on an object for `node`'s VM `instance`.
pub fn record(node: &str, instance: &InstanceId) -> String {
    format!("{node}={instance}")
}

/// The instance a record names for `node`, if it names that node.
fn instance_in(record: &str, node: &str) -> Option<InstanceId> {
    let (recorded_node, instance) = record.split_once('=')?;
    (recorded_node == node && !instance.is_empty()).then(|| InstanceId(instance.to_owned()))
}

fn take_record(obj: &mut CloudPrivateIPConfig) -> Option<Box<str>> {
    let mut annotations = obj.metadata.annotations.take()?;
    annotations
        .remove(INSTANCE_ANNOTATION)
        .map(String::into_boxed_str)
}

#[cfg(test)]
mod tests {
    use cloudnet_shared::CloudPrivateIPConfigSpec;

    use super::*;

    fn object(name: &str, record: Option<&str>) -> CloudPrivateIPConfig {
        let mut obj =
            CloudPrivateIPConfig::new(name, CloudPrivateIPConfigSpec { node: "n1".into() });
        if let Some(record) = record {
            obj.annotations_mut()
                .insert(INSTANCE_ANNOTATION.into(), record.into());
        }
        obj.annotations_mut().insert("other".into(), "x".into());
        obj
    }

    /// Feeds `event` and returns the object it carried, as the cache would store it.
    fn fed(
        records: &Records,
        event: fn(CloudPrivateIPConfig) -> Event<CloudPrivateIPConfig>,
        obj: CloudPrivateIPConfig,
    ) -> CloudPrivateIPConfig {
        let mut event = event(obj);
        records.take(&mut event);
        match event {
            Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => o,
            Event::Init | Event::InitDone => unreachable!("events carrying an object only"),
        }
    }

    fn instance(records: &Records, obj: &CloudPrivateIPConfig) -> Option<String> {
        records.instance(obj, "n1").map(|i| i.0)
    }

    #[test]
    fn the_cache_gets_no_annotations_and_the_record_stays_readable() {
        let records = Records::default();
        let cached = fed(&records, Event::Apply, object("a", Some("n1=i-1")));
        assert_eq!(cached.metadata.annotations, None);
        assert_eq!(instance(&records, &cached).as_deref(), Some("i-1"));
        assert_eq!(
            records.instance(&cached, "n2"),
            None,
            "recorded for another node"
        );
        // An object that still has its annotations speaks for itself.
        let written = object("a", Some("n1=i-2"));
        assert_eq!(instance(&records, &written).as_deref(), Some("i-2"));
        assert_eq!(instance(&records, &object("a", None)), None);
    }

    #[test]
    fn records_follow_changes_deletes_and_relists() {
        let records = Records::default();
        let a = fed(&records, Event::Apply, object("a", Some("n1=i-1")));
        let b = fed(&records, Event::Apply, object("b", Some("n1=i-2")));
        fed(&records, Event::Apply, object("a", None));
        assert_eq!(instance(&records, &a), None, "the record was removed");
        fed(&records, Event::Delete, object("b", Some("n1=i-2")));
        assert_eq!(instance(&records, &b), None);

        fed(&records, Event::Apply, object("a", Some("n1=i-1")));
        let mut init = Event::Init;
        records.take(&mut init);
        let c = fed(&records, Event::InitApply, object("c", Some("n1=i-3")));
        // Until the relist is done, the cache holds the old objects, and so do the records.
        assert_eq!(instance(&records, &a).as_deref(), Some("i-1"));
        assert_eq!(instance(&records, &c), None);
        let mut done = Event::InitDone;
        records.take(&mut done);
        assert_eq!(instance(&records, &a), None, "gone from the relist");
        assert_eq!(instance(&records, &c).as_deref(), Some("i-3"));
    }
}
