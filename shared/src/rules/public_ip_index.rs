//! Which `EgressPublicIP` binds which private IP and which public address, for the uniqueness
//! rule: one hash lookup per side, whatever the number of bindings.
//!
//! Indexed by the keys the rule compares: the private IP as parsed (any spelling of one IP is one
//! key) and the public id's [`PublicId::key`]. A binding whose fields do not parse (stored before
//! a webhook checked them) is indexed by its raw text, so it still blocks its exact duplicate.

use std::collections::{BTreeSet, HashMap};

use crate::public_ip::{EgressPublicIPSpec, PublicId};

/// The bindings, by name and by each side.
#[derive(Clone, Debug, Default)]
pub struct PublicIpIndex {
    /// Binding name → its two keys, to unindex it when it changes or goes.
    by_name: HashMap<String, (String, String)>,
    by_private: HashMap<String, BTreeSet<String>>,
    by_public: HashMap<String, BTreeSet<String>>,
}

/// The uniqueness key of a private IP.
pub fn private_key(private_ip: &str) -> String {
    private_ip
        .parse::<std::net::IpAddr>()
        .map_or_else(|_| private_ip.to_owned(), |ip| ip.to_string())
}

/// The uniqueness key of a public id.
pub fn public_key(public_ip: &str) -> String {
    PublicId::parse(public_ip).map_or_else(|_| public_ip.to_owned(), |id| id.key())
}

impl PublicIpIndex {
    /// Records binding `name` with `spec`, replacing what it held before.
    pub fn upsert(&mut self, name: &str, spec: &EgressPublicIPSpec) {
        self.remove(name);
        let keys = (private_key(&spec.private_ip), public_key(&spec.public_ip));
        self.by_private
            .entry(keys.0.clone())
            .or_default()
            .insert(name.to_owned());
        self.by_public
            .entry(keys.1.clone())
            .or_default()
            .insert(name.to_owned());
        self.by_name.insert(name.to_owned(), keys);
    }

    /// Forgets binding `name`.
    pub fn remove(&mut self, name: &str) {
        let Some((private, public)) = self.by_name.remove(name) else {
            return;
        };
        for (map, key) in [
            (&mut self.by_private, private),
            (&mut self.by_public, public),
        ] {
            if let Some(names) = map.get_mut(&key) {
                names.remove(name);
                if names.is_empty() {
                    map.remove(&key);
                }
            }
        }
    }

    /// Another binding than `name` of the private IP `private_ip` (the first by name).
    pub fn other_with_private(&self, private_ip: &str, name: &str) -> Option<&str> {
        first_other(self.by_private.get(&private_key(private_ip)), name)
    }

    /// Another binding than `name` of the public address `public_ip` (the first by name).
    pub fn other_with_public(&self, public_ip: &str, name: &str) -> Option<&str> {
        first_other(self.by_public.get(&public_key(public_ip)), name)
    }

    /// Number of bindings indexed.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

fn first_other<'a>(names: Option<&'a BTreeSet<String>>, name: &str) -> Option<&'a str> {
    names?
        .iter()
        .map(String::as_str)
        .find(|other| *other != name)
}
