//! Complete served sets and the differences between them.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use xxhash_rust::xxh3::Xxh3;

use super::Entry;

/// Everything served at one moment, sorted by name.
#[derive(Debug)]
pub struct Snapshot {
    /// Hash of all (name, version) pairs: equal sets have equal versions on every replica.
    pub version: String,
    /// Entries sorted by name, names unique.
    pub entries: Vec<Arc<Entry>>,
}

impl Snapshot {
    /// Builds a snapshot from entries sorted by name with unique names.
    pub fn new(entries: Vec<Arc<Entry>>) -> Self {
        debug_assert!(entries.windows(2).all(|w| w[0].name < w[1].name));
        let mut h = Xxh3::new();
        for e in &entries {
            h.update(e.name.as_bytes());
            h.update(&[0]);
            h.update(e.version.as_bytes());
            h.update(&[0]);
        }
        Self {
            version: format!("{:016x}", h.digest()),
            entries,
        }
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Entry>> {
        self.entries
            .binary_search_by(|e| (*e.name).cmp(name))
            .ok()
            .map(|i| &self.entries[i])
    }
}

/// What a sink already holds, to send it only the difference.
#[derive(Clone, Debug)]
pub enum Known {
    /// Nothing.
    Nothing,
    /// Exactly a snapshot we sent (filtered by the subscription when it names resources).
    Snapshot(Arc<Snapshot>),
    /// Names and versions the sink told us (`initial_resource_versions`).
    Versions(BTreeMap<String, String>),
}

impl Known {
    fn pairs(&self) -> Box<dyn Iterator<Item = (&str, &str)> + '_> {
        match self {
            Known::Nothing => Box::new(std::iter::empty()),
            Known::Snapshot(s) => Box::new(s.entries.iter().map(|e| (&*e.name, &*e.version))),
            Known::Versions(m) => Box::new(m.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        }
    }
}

/// Changed or new entries of `current` (passing `wanted`), and names the sink holds that are gone.
pub fn diff(
    known: &Known,
    current: &Snapshot,
    wanted: impl Fn(&str) -> bool,
) -> (Vec<Arc<Entry>>, Vec<String>) {
    let mut upserts = Vec::new();
    let mut removed = Vec::new();
    let mut old = known.pairs().peekable();
    let mut new = current
        .entries
        .iter()
        .filter(|e| wanted(&e.name))
        .peekable();
    loop {
        match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some((name, _)), None) => {
                removed.push((*name).to_string());
                old.next();
            }
            (None, Some(e)) => {
                upserts.push(Arc::clone(e));
                new.next();
            }
            (Some((name, version)), Some(e)) => match (*name).cmp(&*e.name) {
                Ordering::Less => {
                    removed.push((*name).to_string());
                    old.next();
                }
                Ordering::Greater => {
                    upserts.push(Arc::clone(e));
                    new.next();
                }
                Ordering::Equal => {
                    if *version != &*e.version {
                        upserts.push(Arc::clone(e));
                    }
                    old.next();
                    new.next();
                }
            },
        }
    }
    (upserts, removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Summary;
    use bytes::Bytes;

    fn mk_entry(name: &str, version: &str) -> Arc<Entry> {
        Arc::new(Entry {
            name: name.into(),
            version: version.into(),
            resource: Bytes::new(),
            summary: Summary {
                hosts: vec![],
                ports: 0,
                endpoints: 0,
                create_time: 0,
            },
        })
    }

    #[test]
    fn version_depends_only_on_names_and_versions() {
        let a = Snapshot::new(vec![mk_entry("a", "1"), mk_entry("b", "1")]);
        let b = Snapshot::new(vec![mk_entry("a", "1"), mk_entry("b", "1")]);
        let c = Snapshot::new(vec![mk_entry("a", "1"), mk_entry("b", "2")]);
        assert_eq!(a.version, b.version);
        assert_ne!(a.version, c.version);
        assert!(a.get("b").is_some() && a.get("c").is_none());
    }

    #[test]
    fn diff_finds_upserts_and_removals() {
        let old = Arc::new(Snapshot::new(vec![
            mk_entry("a", "1"),
            mk_entry("b", "1"),
            mk_entry("c", "1"),
        ]));
        let new = Snapshot::new(vec![
            mk_entry("b", "2"),
            mk_entry("c", "1"),
            mk_entry("d", "1"),
        ]);
        let (up, rm) = diff(&Known::Snapshot(old), &new, |_| true);
        let up: Vec<_> = up.iter().map(|e| &*e.name).collect();
        assert_eq!(up, vec!["b", "d"]);
        assert_eq!(rm, vec!["a"]);

        let (up, rm) = diff(&Known::Nothing, &new, |n| n != "c");
        assert_eq!(up.len(), 2);
        assert!(rm.is_empty());

        let known =
            Known::Versions([("c".to_string(), "1".to_string()), ("z".into(), "9".into())].into());
        let (up, rm) = diff(&known, &new, |_| true);
        let up: Vec<_> = up.iter().map(|e| &*e.name).collect();
        assert_eq!(up, vec!["b", "d"]);
        assert_eq!(rm, vec!["z"]);
    }
}
