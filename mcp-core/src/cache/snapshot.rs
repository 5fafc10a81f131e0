//! Complete served sets and the differences between them.
//!
//! One registry change must cost O(changed · log n), not O(n), at 100k services: a snapshot made
//! from the previous one with a few changes ([`Snapshot::with_changes`]) shares its entries'
//! chunks, updates its version from the changed entries alone, and records which names changed
//! since its recent ancestors, so [`diff`] against an ancestor a delta stream acknowledged only
//! looks at those names.
//!
//! A stream that has to remember a set it sent after a newer one was published keeps its
//! [`SnapshotNames`] (names and versions, no resources), shared by every stream that needs the
//! same one, so a slow sink never keeps an old set's resource bytes alive.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::entries::{Change, Entries};
use super::Entry;

/// Most steps of history a snapshot keeps (a stream that acknowledged an older one gets the full
/// comparison).
const MAX_STEPS: usize = 64;

/// Identifies snapshot objects within the process, for history; never sent anywhere.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, AtomicOrdering::Relaxed)
}

/// Names that changed between the snapshot `from` and the next one.
#[derive(Clone, Debug)]
struct Step {
    from: u64,
    names: Arc<[Arc<str>]>,
}

/// Everything served at one moment, sorted by name.
#[derive(Debug)]
pub struct Snapshot {
    /// Hash of the set of (name, version) pairs: equal sets have equal versions on every replica,
    /// whatever order the changes came in.
    pub version: String,
    entries: Entries,
    /// Wrapping sum of [`pair_hash`] over the entries: order-independent, so a change updates it
    /// by subtracting the old pair and adding the new one.
    sum: u64,
    id: u64,
    /// The steps that led here from recent ancestors, oldest first; the last one's names changed
    /// from the direct parent. Names only: no old entry is kept alive.
    history: Arc<[Step]>,
    /// The [`SnapshotNames`] of this snapshot while some stream holds them (built once, shared).
    names: Mutex<Weak<SnapshotNames>>,
}

/// The names and versions of one snapshot, without its resources: what a delta stream keeps of a
/// set it sent once a newer set exists (see [`Known::forget_resources`]). It keeps the
/// snapshot's identity, so [`diff`] against it still only looks at the names changed since.
#[derive(Debug)]
pub struct SnapshotNames {
    id: u64,
    /// (name, version), sorted by name; the strings are the entries' own.
    pairs: Vec<(Arc<str>, Arc<str>)>,
}

impl SnapshotNames {
    /// The version of `name`.
    fn version(&self, name: &str) -> Option<&str> {
        self.pairs
            .binary_search_by(|(n, _)| (**n).cmp(name))
            .ok()
            .map(|i| &*self.pairs[i].1)
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

/// Hash of one (name, version) pair.
fn pair_hash(e: &Entry) -> u64 {
    xxh3_64_with_seed(e.version.as_bytes(), xxh3_64(e.name.as_bytes()))
}

/// The snapshot version of a set with `len` entries whose pair hashes sum to `sum`.
fn version_of(sum: u64, len: usize) -> String {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&sum.to_le_bytes());
    buf[8..].copy_from_slice(&(len as u64).to_le_bytes());
    format!("{:016x}", xxh3_64(&buf))
}

impl Snapshot {
    /// Builds a snapshot from entries sorted by name with unique names.
    pub fn new(entries: Vec<Arc<Entry>>) -> Self {
        let sum = entries
            .iter()
            .fold(0u64, |s, e| s.wrapping_add(pair_hash(e)));
        let entries = Entries::from_sorted(entries);
        Self {
            version: version_of(sum, entries.len()),
            entries,
            sum,
            id: next_id(),
            history: Arc::from([]),
            names: Mutex::new(Weak::new()),
        }
    }

    /// This snapshot with `changes` applied (sorted by name, names unique; `None` removes), or
    /// `None` if none changes a served (name, version). Costs O(changes · log n + n / 512) and
    /// shares everything else with `self`.
    pub fn with_changes(&self, changes: Vec<Change>) -> Option<Self> {
        let mut sum = self.sum;
        let effective: Vec<Change> = changes
            .into_iter()
            .filter(|(name, new)| {
                let old = self.entries.get(name);
                let same = match (old, new) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a.version == b.version,
                    _ => false,
                };
                if !same {
                    if let Some(a) = old {
                        sum = sum.wrapping_sub(pair_hash(a));
                    }
                    if let Some(b) = new {
                        sum = sum.wrapping_add(pair_hash(b));
                    }
                }
                !same
            })
            .collect();
        if effective.is_empty() {
            return None;
        }
        let entries = self.entries.with_changes(&effective);
        let names: Arc<[Arc<str>]> = effective.into_iter().map(|(n, _)| n).collect();
        let history = self.extended_history(
            Step {
                from: self.id,
                names,
            },
            entries.len(),
        );
        Some(Self {
            version: version_of(sum, entries.len()),
            entries,
            sum,
            id: next_id(),
            history,
            names: Mutex::new(Weak::new()),
        })
    }

    /// This snapshot's names and versions without its resources, built on first use and shared
    /// while anyone holds them: twenty slow streams holding the same old set hold one copy.
    pub fn names(&self) -> Arc<SnapshotNames> {
        let mut cached = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(names) = cached.upgrade() {
            return names;
        }
        let names = Arc::new(SnapshotNames {
            id: self.id,
            pairs: self
                .iter()
                .map(|e| (Arc::clone(&e.name), Arc::clone(&e.version)))
                .collect(),
        });
        *cached = Arc::downgrade(&names);
        names
    }

    /// `self`'s history plus `step`, dropping the oldest steps once there are more than
    /// [`MAX_STEPS`] or once their names outnumber a sixteenth of the set (then the full
    /// comparison is about as cheap).
    fn extended_history(&self, step: Step, len: usize) -> Arc<[Step]> {
        let budget = len / 16 + 64;
        let mut total = step.names.len();
        if total > budget {
            return Arc::from([]);
        }
        let mut keep = 0;
        for s in self.history.iter().rev().take(MAX_STEPS - 1) {
            if total + s.names.len() > budget {
                break;
            }
            total += s.names.len();
            keep += 1;
        }
        let start = self.history.len() - keep;
        self.history[start..]
            .iter()
            .cloned()
            .chain(std::iter::once(step))
            .collect()
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Entry>> {
        self.entries.get(name)
    }

    /// Entries in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &Arc<Entry>> + '_ {
        self.entries.iter()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is served.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Names that may differ between the snapshot `ancestor` (an id) and `self`, sorted; `None`
    /// if `ancestor` is not within `self`'s history.
    fn changed_since(&self, ancestor: u64) -> Option<BTreeSet<&str>> {
        if ancestor == self.id {
            return Some(BTreeSet::new());
        }
        let at = self.history.iter().position(|s| s.from == ancestor)?;
        Some(
            self.history[at..]
                .iter()
                .flat_map(|s| s.names.iter().map(|n| &**n))
                .collect(),
        )
    }
}

/// What a sink already holds, to send it only the difference.
#[derive(Clone, Debug)]
pub enum Known {
    /// Nothing.
    Nothing,
    /// Exactly a snapshot we sent (filtered by the subscription when it names resources).
    Snapshot(Arc<Snapshot>),
    /// The names and versions of a snapshot we sent, once a newer one exists.
    Names(Arc<SnapshotNames>),
    /// Names and versions the sink told us (`initial_resource_versions`).
    Versions(BTreeMap<String, String>),
}

impl Known {
    /// Every (name, version) held, sorted by name.
    pub fn pairs(&self) -> Box<dyn Iterator<Item = (&str, &str)> + '_> {
        match self {
            Known::Nothing => Box::new(std::iter::empty()),
            Known::Snapshot(s) => Box::new(s.iter().map(|e| (&*e.name, &*e.version))),
            Known::Names(n) => Box::new(n.pairs.iter().map(|(k, v)| (&**k, &**v))),
            Known::Versions(m) => Box::new(m.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        }
    }

    /// The version held for `name`.
    pub fn version(&self, name: &str) -> Option<&str> {
        match self {
            Known::Nothing => None,
            Known::Snapshot(s) => s.get(name).map(|e| &*e.version),
            Known::Names(n) => n.version(name),
            Known::Versions(m) => m.get(name).map(String::as_str),
        }
    }

    /// The snapshot this is (or was taken from), for [`diff`]'s walk through history.
    fn snapshot_id(&self) -> Option<u64> {
        match self {
            Known::Snapshot(s) => Some(s.id),
            Known::Names(n) => Some(n.id),
            Known::Nothing | Known::Versions(_) => None,
        }
    }

    /// Keeps only the names and versions of a held snapshot, so that its resources can be freed
    /// once nothing else uses them (a slow sink's stream, after a newer set was published).
    pub fn forget_resources(&mut self) {
        if let Known::Snapshot(s) = self {
            *self = Known::Names(s.names());
        }
    }
}

/// Changed or new entries of `current`, and names the sink holds that are gone, both in name
/// order. When the sink holds an ancestor of `current` (the usual delta stream, one or a few
/// changes behind), only the names changed since are looked at.
pub fn diff(known: &Known, current: &Snapshot) -> (Vec<Arc<Entry>>, Vec<String>) {
    if let Some(names) = known.snapshot_id().and_then(|id| current.changed_since(id)) {
        let mut upserts = Vec::new();
        let mut removed = Vec::new();
        for name in names {
            match (known.version(name), current.get(name)) {
                (Some(_), None) => removed.push(name.to_string()),
                (None, Some(e)) => upserts.push(Arc::clone(e)),
                (Some(a), Some(b)) if a != &*b.version => upserts.push(Arc::clone(b)),
                _ => {}
            }
        }
        return (upserts, removed);
    }
    full_diff(known, current)
}

/// [`diff`] by merging both complete lists.
fn full_diff(known: &Known, current: &Snapshot) -> (Vec<Arc<Entry>>, Vec<String>) {
    let mut upserts = Vec::new();
    let mut removed = Vec::new();
    let mut old = known.pairs().peekable();
    let mut new = current.iter().peekable();
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
    use crate::testing::{mk_entry, Rng};

    #[test]
    fn version_depends_only_on_names_and_versions() {
        let a = Snapshot::new(vec![mk_entry("a", "1"), mk_entry("b", "1")]);
        let b = Snapshot::new(vec![mk_entry("a", "1"), mk_entry("b", "1")]);
        let c = Snapshot::new(vec![mk_entry("a", "1"), mk_entry("b", "2")]);
        let d = Snapshot::new(vec![mk_entry("a", "1")]);
        assert_eq!(a.version, b.version);
        assert_ne!(a.version, c.version);
        assert_ne!(a.version, d.version);
        assert_ne!(
            Snapshot::new(vec![]).version,
            Snapshot::new(vec![mk_entry("a", "")]).version
        );
        assert!(a.get("b").is_some() && a.get("c").is_none());
        // Made by changes, in any order, the same set has the same version.
        let via = d
            .with_changes(vec![("b".into(), Some(mk_entry("b", "2")))])
            .expect("changed")
            .with_changes(vec![("b".into(), Some(mk_entry("b", "1")))])
            .expect("changed");
        assert_eq!(via.version, a.version);
        assert!(
            via.with_changes(vec![("a".into(), Some(mk_entry("a", "1")))])
                .is_none(),
            "same version: no change"
        );
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
        let (up, rm) = diff(&Known::Snapshot(old), &new);
        let up: Vec<_> = up.iter().map(|e| &*e.name).collect();
        assert_eq!(up, vec!["b", "d"]);
        assert_eq!(rm, vec!["a"]);

        let (up, rm) = diff(&Known::Nothing, &new);
        assert_eq!(up.len(), 3);
        assert!(rm.is_empty());

        let known =
            Known::Versions([("c".to_string(), "1".to_string()), ("z".into(), "9".into())].into());
        let (up, rm) = diff(&known, &new);
        let up: Vec<_> = up.iter().map(|e| &*e.name).collect();
        assert_eq!(up, vec!["b", "d"]);
        assert_eq!(rm, vec!["z"]);
    }

    fn pairs(d: &(Vec<Arc<Entry>>, Vec<String>)) -> (Vec<(String, String)>, Vec<String>) {
        (
            d.0.iter()
                .map(|e| (e.name.to_string(), e.version.to_string()))
                .collect(),
            d.1.clone(),
        )
    }

    /// Random batches of changes: every snapshot made incrementally equals one built from
    /// scratch (entries and version), and the diff through history equals the full merge for
    /// ancestors at every distance and for unrelated snapshots.
    #[test]
    fn incremental_snapshots_and_diffs_match_the_full_computation() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut model: BTreeMap<String, Arc<Entry>> = BTreeMap::new();
        let mut chain: Vec<Arc<Snapshot>> = vec![Arc::new(Snapshot::new(vec![]))];
        let mut with_history = 0;
        for round in 0..400 {
            let count = match round % 40 {
                0 => 1500,
                _ => rng.below(8) + 1,
            };
            let mut batch: BTreeMap<String, Option<Arc<Entry>>> = BTreeMap::new();
            for _ in 0..count {
                let name = format!("ns/s{:04}", rng.below(2000));
                // Few versions, so some changes restore what was there before.
                let e = (rng.below(4) != 0).then(|| mk_entry(&name, &format!("v{}", rng.below(3))));
                batch.insert(name, e);
            }
            let mut next = model.clone();
            for (n, e) in &batch {
                match e {
                    Some(e) => next.insert(n.clone(), Arc::clone(e)),
                    None => next.remove(n),
                };
            }
            let changes: Vec<Change> = batch
                .into_iter()
                .map(|(n, e)| (Arc::from(n.as_str()), e))
                .collect();
            let last = chain.last().expect("one at least");
            let scratch = Snapshot::new(next.values().cloned().collect());
            let Some(snap) = last.with_changes(changes) else {
                assert_eq!(scratch.version, last.version, "no change, same set");
                continue;
            };
            model = next;
            assert_eq!(snap.version, scratch.version, "round {round}");
            assert_eq!(snap.entries, scratch.entries, "round {round}");
            let snap = Arc::new(snap);
            chain.push(Arc::clone(&snap));
            for back in [1, 2, 3, 5, 10, 40, 100] {
                let Some(old) = chain.len().checked_sub(back + 1).map(|i| &chain[i]) else {
                    break;
                };
                let known = Known::Snapshot(Arc::clone(old));
                with_history += usize::from(snap.changed_since(old.id).is_some());
                let full = pairs(&full_diff(&known, &snap));
                assert_eq!(
                    pairs(&diff(&known, &snap)),
                    full,
                    "round {round}, {back} back"
                );
                // Holding only the old set's names and versions changes nothing.
                let mut names = known.clone();
                names.forget_resources();
                assert!(matches!(names, Known::Names(_)));
                assert_eq!(
                    pairs(&diff(&names, &snap)),
                    full,
                    "round {round}, {back} back"
                );
            }
            let unrelated = Known::Snapshot(Arc::new(Snapshot::new(
                chain[chain.len() / 2].iter().cloned().collect(),
            )));
            assert_eq!(
                pairs(&diff(&unrelated, &snap)),
                pairs(&full_diff(&unrelated, &snap))
            );
        }
        assert!(with_history > 1000, "the fast path ran: {with_history}");
    }

    /// The names a stream keeps of an old set hold none of its resources and are built once
    /// however many streams keep them.
    #[test]
    fn names_hold_no_resources_and_are_shared() {
        let old = Arc::new(Snapshot::new(vec![mk_entry("a", "1"), mk_entry("b", "1")]));
        let resource = old.get("a").map(Arc::clone).expect("a");
        let mut one = Known::Snapshot(Arc::clone(&old));
        let mut two = Known::Snapshot(Arc::clone(&old));
        one.forget_resources();
        two.forget_resources();
        match (&one, &two) {
            (Known::Names(x), Known::Names(y)) => {
                assert!(Arc::ptr_eq(x, y), "one copy for both streams");
                assert_eq!(x.len(), 2);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(one.version("b"), Some("1"));
        assert_eq!(one.version("z"), None);
        drop(old);
        assert_eq!(Arc::strong_count(&resource), 1, "the entries were freed");
    }

    #[test]
    fn history_is_bounded() {
        let mut s = Snapshot::new(vec![]);
        for i in 0..200 {
            let n = format!("ns/{i}");
            s = s
                .with_changes(vec![(Arc::from(n.as_str()), Some(mk_entry(&n, "1")))])
                .expect("changed");
        }
        assert_eq!(s.history.len(), MAX_STEPS);
        let big: Vec<Change> = (0..1000)
            .map(|i| {
                let n = format!("ns/big{i:04}");
                (Arc::from(n.as_str()), Some(mk_entry(&n, "1")))
            })
            .collect();
        let s = s.with_changes(big).expect("changed");
        assert!(
            s.history.is_empty(),
            "more names than a full comparison costs"
        );
    }
}
