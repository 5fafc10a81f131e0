//! The single writer: registry events in, published snapshots out.
//!
//! Events are applied to a pending set; [`Index::flush`] translates only what changed (a re-listed
//! service whose content hash is unchanged costs a hash, not a translation), keeps the last good
//! version of a service that turned invalid, resolves resource-name collisions deterministically,
//! and builds a new [`Snapshot`] only when the served set actually differs. The served set is kept
//! per resource name as services change, so one change costs O(log n) plus one linear copy of
//! pointers into the new snapshot, never a sort.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::cache::{encode, Entry, Snapshot};
use crate::metrics::Metrics;
use crate::model::{Service, ServiceKey};
use crate::registry::RegistryEvent;
use crate::translate::{translate, TranslateConfig};

/// A service that is not (or not currently) served as the registry describes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Quarantined {
    /// The service key.
    pub key: String,
    /// Where it came from.
    pub origin: String,
    /// Every reason, each naming the field.
    pub reasons: Vec<String>,
    /// Whether an earlier valid version is still served.
    pub serving_last_good: bool,
}

/// Registry objects the adapter skipped, by scope.
pub type Problems = BTreeMap<String, Vec<String>>;

#[derive(Debug)]
struct KeyState {
    hash: u64,
    origin: String,
    /// The last valid version (served unless another key owns the name).
    entry: Option<Arc<Entry>>,
    /// Validation errors of the current registry content.
    invalid: Option<Vec<String>>,
}

/// Current services of one source, owned by the runtime's writer task.
#[derive(Debug)]
pub struct Index {
    cfg: TranslateConfig,
    metrics: Metrics,
    states: HashMap<ServiceKey, KeyState>,
    /// Resource name -> every key whose served entry has that name; the smallest key wins.
    claims: BTreeMap<Arc<str>, BTreeMap<ServiceKey, Arc<Entry>>>,
    /// Keys whose current registry content is invalid.
    invalid: BTreeSet<ServiceKey>,
    pending: BTreeMap<ServiceKey, Option<Service>>,
    problems: Problems,
    snapshot: Option<Arc<Snapshot>>,
    quarantine: Vec<Quarantined>,
    /// Nothing is published before the registry's first full set: an empty answer would make a
    /// reconnecting sink delete what it had.
    reset_seen: bool,
}

impl Index {
    /// An empty index.
    pub fn new(cfg: TranslateConfig, metrics: Metrics) -> Self {
        Self {
            cfg,
            metrics,
            states: HashMap::new(),
            claims: BTreeMap::new(),
            invalid: BTreeSet::new(),
            pending: BTreeMap::new(),
            problems: Problems::new(),
            snapshot: None,
            quarantine: Vec::new(),
            reset_seen: false,
        }
    }

    /// Records an event; nothing is translated until [`Index::flush`].
    pub fn apply(&mut self, event: RegistryEvent) {
        match event {
            RegistryEvent::Reset(services) => {
                self.reset_seen = true;
                let mut seen: BTreeMap<ServiceKey, Option<Service>> = BTreeMap::new();
                for s in services {
                    seen.insert(s.key.clone(), Some(s));
                }
                let gone: Vec<ServiceKey> = self
                    .states
                    .keys()
                    .chain(self.pending.keys())
                    .filter(|k| !seen.contains_key(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    seen.insert(k, None);
                }
                self.pending.extend(seen);
            }
            RegistryEvent::Upsert(s) => {
                self.pending.insert(s.key.clone(), Some(s));
            }
            RegistryEvent::Remove(k) => {
                self.pending.insert(k, None);
            }
            RegistryEvent::Problems { scope, problems } => {
                if problems.is_empty() {
                    self.problems.remove(&scope);
                } else {
                    self.problems.insert(scope, problems);
                }
                let n: usize = self.problems.values().map(Vec::len).sum();
                self.metrics.registry_problems.set(n as i64);
            }
        }
    }

    /// Whether events wait for a flush.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Translates pending changes; returns the new snapshot if the served set changed (always
    /// on the first call after the first `Reset`, so an empty registry is served too; never
    /// before it).
    pub fn flush(&mut self) -> Option<Arc<Snapshot>> {
        if !self.reset_seen {
            return None;
        }
        let pending = std::mem::take(&mut self.pending);
        let mut touched = false;
        for (key, change) in pending {
            touched |= self.update(key, change);
        }
        if !touched && self.snapshot.is_some() {
            return None;
        }
        let snapshot = Arc::new(self.build());
        let changed = self
            .snapshot
            .as_ref()
            .is_none_or(|old| old.version != snapshot.version);
        self.metrics.resources.set(snapshot.entries.len() as i64);
        self.metrics.quarantined.set(self.quarantine.len() as i64);
        if !changed {
            return None;
        }
        self.snapshot = Some(Arc::clone(&snapshot));
        Some(snapshot)
    }

    /// Applies one change to the key's state; true if it may change what is served.
    fn update(&mut self, key: ServiceKey, change: Option<Service>) -> bool {
        let Some(service) = change else {
            let Some(old) = self.states.remove(&key) else {
                return false;
            };
            self.invalid.remove(&key);
            if let Some(e) = old.entry {
                self.unclaim(&key, &e.name);
            }
            return true;
        };
        let hash = service.content_hash();
        if self.states.get(&key).is_some_and(|s| s.hash == hash) {
            return false;
        }
        let state = self.states.entry(key.clone()).or_insert(KeyState {
            hash,
            origin: String::new(),
            entry: None,
            invalid: None,
        });
        state.hash = hash;
        state.origin.clone_from(&service.origin);
        let origin = service.origin.clone();
        match translate(service, &self.cfg) {
            Ok(t) => {
                for (kind, w) in &t.warnings {
                    tracing::warn!(origin = %origin, warning = %w, "Dropped part of a service to keep it valid.");
                    self.metrics
                        .translation_warnings
                        .with_label_values(&[kind.as_str()])
                        .inc();
                }
                let entry = encode(&t);
                let same = state
                    .entry
                    .as_ref()
                    .is_some_and(|e| e.version == entry.version && e.name == entry.name);
                if state.invalid.take().is_some() {
                    tracing::info!(origin = %origin, "Service is valid again.");
                    self.invalid.remove(&key);
                }
                if !same {
                    let entry = Arc::new(entry);
                    let old = state.entry.replace(Arc::clone(&entry));
                    if let Some(old) = old {
                        self.unclaim(&key, &old.name);
                    }
                    self.claims
                        .entry(Arc::clone(&entry.name))
                        .or_default()
                        .insert(key, entry);
                }
                // An unchanged version still needs a rebuild if it left quarantine.
                true
            }
            Err(invalid) => {
                tracing::warn!(
                    origin = %invalid.origin,
                    errors = %invalid.errors.join("; "),
                    serving_last_good = state.entry.is_some(),
                    "Quarantined an invalid service."
                );
                state.invalid = Some(invalid.errors);
                self.invalid.insert(key);
                true
            }
        }
    }

    fn unclaim(&mut self, key: &ServiceKey, name: &Arc<str>) {
        if let Some(keys) = self.claims.get_mut(name) {
            keys.remove(key);
            if keys.is_empty() {
                self.claims.remove(name);
            }
        }
    }

    /// Builds the served set: valid (or last good) entries; of keys mapping to the same resource
    /// name, the smallest key wins and the others are quarantined.
    fn build(&mut self) -> Snapshot {
        let mut quarantine = Vec::new();
        for key in &self.invalid {
            if let Some(state) = self.states.get(key) {
                quarantine.push(Quarantined {
                    key: key.to_string(),
                    origin: state.origin.clone(),
                    reasons: state.invalid.clone().unwrap_or_default(),
                    serving_last_good: state.entry.is_some(),
                });
            }
        }
        let mut entries = Vec::with_capacity(self.claims.len());
        for (name, keys) in &self.claims {
            let mut it = keys.iter();
            let Some((winner, entry)) = it.next() else {
                continue;
            };
            entries.push(Arc::clone(entry));
            for (loser, _) in it {
                quarantine.push(Quarantined {
                    key: loser.to_string(),
                    origin: self
                        .states
                        .get(loser)
                        .map(|s| s.origin.clone())
                        .unwrap_or_default(),
                    reasons: vec![format!(
                        "metadata.name: {name} is already produced by {winner}"
                    )],
                    serving_last_good: false,
                });
            }
        }
        self.quarantine = quarantine;
        Snapshot::new(entries)
    }

    /// Services that are not served as described, with reasons.
    pub fn quarantine(&self) -> &[Quarantined] {
        &self.quarantine
    }

    /// Registry objects the adapter skipped.
    pub fn problems(&self) -> &Problems {
        &self.problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, Host, Port};

    fn mk_index() -> Index {
        Index::new(
            TranslateConfig {
                namespace: "ns".into(),
                host_suffix: "example".into(),
                export_to: vec![],
                registry: "test".into(),
                source: "test".into(),
            },
            Metrics::new("test").expect("metrics"),
        )
    }

    fn mk_service(name: &str, ip: &str) -> Service {
        let mut s = Service::new(ServiceKey::new(name), format!("test {name}"));
        s.ports.push(Port {
            number: 80,
            name: "http".into(),
            protocol: Some("HTTP".into()),
            target_port: None,
        });
        s.endpoints.push(Endpoint {
            address: ip.into(),
            ..Default::default()
        });
        s
    }

    fn names(s: &Snapshot) -> Vec<String> {
        s.entries.iter().map(|e| e.name.to_string()).collect()
    }

    #[test]
    fn first_flush_publishes_even_when_empty() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![]));
        let s = idx.flush().expect("first snapshot");
        assert!(s.entries.is_empty());
        assert!(idx.flush().is_none());
    }

    #[test]
    fn nothing_is_published_before_the_first_reset() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Problems {
            scope: "f".into(),
            problems: vec!["bad".into()],
        });
        assert!(idx.flush().is_none());
        idx.apply(RegistryEvent::Upsert(mk_service("a", "10.0.0.1")));
        assert!(idx.flush().is_none(), "an upsert is not the full set");
        idx.apply(RegistryEvent::Reset(vec![mk_service("b", "10.0.0.2")]));
        let s = idx.flush().expect("first snapshot after the reset");
        assert_eq!(names(&s), vec!["ns/b"], "the reset is authoritative");
    }

    #[test]
    fn relist_without_change_publishes_nothing() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("a", "10.0.0.1"),
            mk_service("b", "10.0.0.2"),
        ]));
        let first = idx.flush().expect("first");
        assert_eq!(names(&first), vec!["ns/a", "ns/b"]);
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("b", "10.0.0.2"),
            mk_service("a", "10.0.0.1"),
        ]));
        assert!(idx.flush().is_none(), "no-op relist must not publish");
        idx.apply(RegistryEvent::Upsert(mk_service("a", "10.0.0.1")));
        assert!(idx.flush().is_none());
    }

    #[test]
    fn reset_removes_missing_and_events_apply() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("a", "10.0.0.1"),
            mk_service("b", "10.0.0.2"),
        ]));
        idx.flush();
        idx.apply(RegistryEvent::Reset(vec![mk_service("b", "10.0.0.3")]));
        let s = idx.flush().expect("changed");
        assert_eq!(names(&s), vec!["ns/b"]);
        idx.apply(RegistryEvent::Upsert(mk_service("c", "10.0.0.4")));
        idx.apply(RegistryEvent::Remove(ServiceKey::new("b")));
        let s = idx.flush().expect("changed");
        assert_eq!(names(&s), vec!["ns/c"]);
    }

    #[test]
    fn invalid_service_keeps_last_good_and_others_flow() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("a", "10.0.0.1"),
            mk_service("b", "10.0.0.2"),
        ]));
        let first = idx.flush().expect("first");
        let a_version = first.get("ns/a").expect("a").version.clone();
        let mut bad = mk_service("a", "10.0.0.9");
        bad.ports[0].name = "Not Valid".into();
        idx.apply(RegistryEvent::Upsert(bad));
        idx.apply(RegistryEvent::Upsert(mk_service("b", "10.0.0.5")));
        let s = idx.flush().expect("b changed");
        assert_eq!(s.get("ns/a").expect("last good a").version, a_version);
        assert_ne!(
            s.get("ns/b").expect("b").version,
            first.get("ns/b").expect("b").version
        );
        let q = idx.quarantine();
        assert_eq!(q.len(), 1);
        assert!(q[0].serving_last_good);
        assert!(q[0].reasons[0].contains("spec.ports[0].name"), "{:?}", q[0]);

        // A new service that is invalid from the start is not served at all.
        let mut bad_new = mk_service("c", "10.0.0.1");
        bad_new.hosts = vec![Host::Absolute("bad_host".into())];
        idx.apply(RegistryEvent::Upsert(bad_new));
        let _ = idx.flush();
        assert_eq!(idx.quarantine().len(), 2);

        // Fixed: quarantine clears and the new version is served.
        idx.apply(RegistryEvent::Upsert(mk_service("a", "10.0.0.9")));
        let s = idx.flush().expect("a fixed");
        assert_ne!(s.get("ns/a").expect("a").version, a_version);
        assert_eq!(idx.quarantine().len(), 1);
    }

    #[test]
    fn name_collisions_are_resolved_deterministically() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("web_a", "10.0.0.1"),
            mk_service("web-a", "10.0.0.2"),
        ]));
        let s = idx.flush().expect("first");
        assert_eq!(names(&s), vec!["ns/web-a"]);
        // "web-a" < "web_a": the smaller key wins on every replica.
        let winner = s.get("ns/web-a").expect("served");
        let q = idx.quarantine();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].key, "web_a");
        // When the winner goes away the other one is served.
        idx.apply(RegistryEvent::Remove(ServiceKey::new("web-a")));
        let s = idx.flush().expect("changed");
        assert_ne!(s.get("ns/web-a").expect("served").version, winner.version);
        assert!(idx.quarantine().is_empty());
    }

    #[test]
    fn problems_replace_per_scope() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Problems {
            scope: "f1".into(),
            problems: vec!["bad".into()],
        });
        idx.apply(RegistryEvent::Problems {
            scope: "f2".into(),
            problems: vec!["worse".into()],
        });
        assert_eq!(idx.problems().len(), 2);
        idx.apply(RegistryEvent::Problems {
            scope: "f1".into(),
            problems: vec![],
        });
        assert_eq!(idx.problems().keys().collect::<Vec<_>>(), vec!["f2"]);
    }
}
