//! A name-sorted set of entries that a new version can share with the previous one.
//!
//! A snapshot of 100k services used to be one `Vec<Arc<Entry>>`: changing one service copied
//! 100k pointers (100k atomic increments, and as many decrements when the old snapshot dropped).
//! Here the entries are cut into chunks of about [`CHUNK`] entries, each behind its own `Arc`;
//! a change copies the list of chunk pointers (n / [`CHUNK`] of them) and rebuilds only the
//! chunks it touches. Iteration stays a walk over contiguous slices, and lookup two binary
//! searches.

use std::sync::Arc;

use super::Entry;

/// Target chunk length: big enough that iteration is slice-speed and the chunk list short (200
/// chunks at 100k entries), small enough that rebuilding a chunk costs a few microseconds.
const CHUNK: usize = 512;

/// A change to apply: the name and its new entry, or `None` to remove it.
pub type Change = (Arc<str>, Option<Arc<Entry>>);

/// Entries sorted by name, names unique. Cloning is cheap (chunk pointers only).
#[derive(Clone, Debug, Default)]
pub struct Entries {
    /// Non-empty chunks, each sorted, in name order.
    chunks: Vec<Arc<[Arc<Entry>]>>,
    len: usize,
}

impl Entries {
    /// Entries from a list sorted by name with unique names.
    pub fn from_sorted(entries: Vec<Arc<Entry>>) -> Self {
        debug_assert!(entries.windows(2).all(|w| w[0].name < w[1].name));
        let len = entries.len();
        let mut chunks = Vec::with_capacity(len.div_ceil(CHUNK));
        push_chunks(&mut chunks, entries);
        Self { chunks, len }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &Arc<Entry>> + '_ {
        Iter {
            inner: self.chunks.iter().flat_map(|c| c.iter()),
            left: self.len,
        }
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Entry>> {
        let chunk = self.chunks.get(self.chunk_of(name))?;
        chunk
            .binary_search_by(|e| (*e.name).cmp(name))
            .ok()
            .map(|i| &chunk[i])
    }

    /// The chunk that holds `name`, or would hold it (the last one for names past the end).
    fn chunk_of(&self, name: &str) -> usize {
        let i = self
            .chunks
            .partition_point(|c| c.last().is_some_and(|e| &*e.name < name));
        i.min(self.chunks.len().saturating_sub(1))
    }

    /// A copy with `changes` (sorted by name, names unique) applied; chunks no change falls in
    /// are shared with `self`.
    pub fn with_changes(&self, changes: &[Change]) -> Self {
        debug_assert!(changes.windows(2).all(|w| w[0].0 < w[1].0));
        if self.chunks.is_empty() {
            return Self::from_sorted(changes.iter().filter_map(|(_, e)| e.clone()).collect());
        }
        let mut chunks = Vec::with_capacity(self.chunks.len() + 1);
        let mut len = 0;
        let mut rest = changes;
        let mut next = 0;
        while let Some((name, _)) = rest.first() {
            let at = self.chunk_of(name);
            // Chunks before the one this change falls in are kept as they are.
            for c in &self.chunks[next..at] {
                len += c.len();
                chunks.push(Arc::clone(c));
            }
            let chunk = &self.chunks[at];
            // Changes up to this chunk's last name, or all that are left for the last chunk.
            let take = if at + 1 == self.chunks.len() {
                rest.len()
            } else {
                let last = chunk.last().map(|e| &*e.name).unwrap_or_default();
                rest.partition_point(|(n, _)| &**n <= last)
            };
            let merged = merge(chunk, &rest[..take]);
            len += merged.len();
            push_split(&mut chunks, merged);
            rest = &rest[take..];
            next = at + 1;
        }
        for c in &self.chunks[next..] {
            len += c.len();
            chunks.push(Arc::clone(c));
        }
        let out = Self { chunks, len };
        // Removals can leave many small chunks; cut them anew once they double the count.
        if out.chunks.len() > 2 * out.len.div_ceil(CHUNK) + 4 {
            return Self::from_sorted(out.iter().cloned().collect());
        }
        out
    }
}

/// `chunk` with `changes` (sorted, all within or past its range) applied.
fn merge(chunk: &[Arc<Entry>], changes: &[Change]) -> Vec<Arc<Entry>> {
    let mut out = Vec::with_capacity(chunk.len() + changes.len());
    let mut old = chunk.iter().peekable();
    for (name, new) in changes {
        while let Some(e) = old.next_if(|e| e.name < *name) {
            out.push(Arc::clone(e));
        }
        old.next_if(|e| e.name == *name);
        if let Some(e) = new {
            out.push(Arc::clone(e));
        }
    }
    out.extend(old.cloned());
    out
}

/// Appends `entries` as one chunk, or several if it grew past twice the target; nothing if empty.
fn push_split(chunks: &mut Vec<Arc<[Arc<Entry>]>>, entries: Vec<Arc<Entry>>) {
    if entries.len() <= 2 * CHUNK {
        if !entries.is_empty() {
            chunks.push(Arc::from(entries));
        }
        return;
    }
    push_chunks(chunks, entries);
}

/// Appends `entries` cut into chunks of [`CHUNK`], moving the pointers (no reference count is
/// touched: at 100k entries that would be 100k atomic increments and as many decrements).
fn push_chunks(chunks: &mut Vec<Arc<[Arc<Entry>]>>, entries: Vec<Arc<Entry>>) {
    let mut it = entries.into_iter();
    loop {
        let chunk: Vec<Arc<Entry>> = it.by_ref().take(CHUNK).collect();
        if chunk.is_empty() {
            return;
        }
        chunks.push(Arc::from(chunk));
    }
}

/// Iterator over every chunk's entries, knowing its length (for `ExactSizeIterator`).
struct Iter<I> {
    inner: I,
    left: usize,
}

impl<'a, I: Iterator<Item = &'a Arc<Entry>>> Iterator for Iter<I> {
    type Item = &'a Arc<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        let e = self.inner.next()?;
        self.left -= 1;
        Some(e)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<'a, I: Iterator<Item = &'a Arc<Entry>>> ExactSizeIterator for Iter<I> {}

impl PartialEq for Entries {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{mk_entry, Rng};

    fn names(e: &Entries) -> Vec<String> {
        e.iter().map(|e| e.name.to_string()).collect()
    }

    #[test]
    fn changes_match_a_sorted_vec() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut model: std::collections::BTreeMap<String, Arc<Entry>> = Default::default();
        let mut entries = Entries::default();
        for round in 0..300 {
            // Mostly small batches, sometimes one that rewrites a good part of the set.
            let count = if round % 50 == 7 {
                3000
            } else {
                rng.below(20) + 1
            };
            let mut batch: std::collections::BTreeMap<String, Option<Arc<Entry>>> =
                Default::default();
            for _ in 0..count {
                let name = format!("ns/s{:05}", rng.below(6000));
                let e = (rng.below(3) != 0).then(|| mk_entry(&name, &format!("{round}")));
                batch.insert(name, e);
            }
            for (n, e) in &batch {
                match e {
                    Some(e) => model.insert(n.clone(), Arc::clone(e)),
                    None => model.remove(n),
                };
            }
            let changes: Vec<Change> = batch
                .into_iter()
                .map(|(n, e)| (Arc::from(n.as_str()), e))
                .collect();
            let before = names(&entries);
            let next = entries.with_changes(&changes);
            assert_eq!(names(&entries), before, "the old set is untouched");
            entries = next;
            assert_eq!(entries.len(), model.len());
            assert_eq!(entries.iter().len(), model.len());
            assert!(entries
                .iter()
                .zip(model.values())
                .all(|(a, b)| Arc::ptr_eq(a, b)));
            assert!(entries
                .chunks
                .iter()
                .all(|c| !c.is_empty() && c.len() <= 2 * CHUNK));
            for _ in 0..20 {
                let name = format!("ns/s{:05}", rng.below(6000));
                assert_eq!(
                    entries.get(&name).map(|e| &e.version),
                    model.get(&name).map(|e| &e.version)
                );
            }
        }
    }

    #[test]
    fn one_change_shares_the_other_chunks() {
        let all: Vec<_> = (0..10 * CHUNK)
            .map(|i| mk_entry(&format!("ns/s{i:06}"), "1"))
            .collect();
        let a = Entries::from_sorted(all);
        let b = a.with_changes(&[(Arc::from("ns/s000700"), Some(mk_entry("ns/s000700", "2")))]);
        let shared = a
            .chunks
            .iter()
            .zip(&b.chunks)
            .filter(|(x, y)| Arc::ptr_eq(x, y))
            .count();
        assert_eq!(shared, a.chunks.len() - 1);
        assert_eq!(b.get("ns/s000700").map(|e| &*e.version), Some("2"));
        assert!(a.get("ns/zzz").is_none() && a.get("a").is_none());
    }
}
