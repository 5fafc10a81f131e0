//! Immutable values many endpoints share: label sets and repeated strings.
//!
//! A registry of 1M endpoints has 1M label maps but few distinct ones (pods of one deployment
//! carry the same labels), and its localities, networks and service accounts repeat across
//! endpoints. Each distinct value is stored once, interned process-wide (see `intern` for why
//! process-wide), and an endpoint holds a pointer. Equality, ordering and hashing are by content,
//! so sharing is invisible to everything but memory: two equal services compare and
//! [`super::Service::content_hash`] equal however their values were built.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::intern::Interner;
use super::Labels;

static LABEL_SETS: Interner<LabelData> = Interner::new();
static STRINGS: Interner<str> = Interner::new();

/// Endpoint labels: an immutable, shared, key-ordered set of `key=value` pairs.
///
/// Built from a [`Labels`] map (`LabelSet::from(map)`, `map.into()`, or `collect()`); equal
/// sets built anywhere in the process share one allocation, and the empty set allocates nothing.
/// The pairs are stored back to back in one string instead of a `BTreeMap` per endpoint: a
/// 3-label map costs ~700 bytes of heap (one B-tree node sized for 11 pairs, six strings), a set
/// ~160 bytes (three allocations), once per distinct content. Read it with [`LabelSet::get`] and
/// [`LabelSet::iter`]; to change it, [`LabelSet::to_labels`], edit, and convert back.
#[derive(Clone, Default)]
pub struct LabelSet(Option<Arc<LabelData>>);

struct LabelData {
    /// Content hash (xxh3 of every key and value), computed once: hashing a set is one write.
    hash: u64,
    /// Key 0, value 0, key 1, value 1, ... in key order, with no separator.
    text: Box<str>,
    /// End offset in `text` of each key and value.
    ends: Box<[usize]>,
}

impl LabelData {
    fn pair(&self, i: usize) -> (&str, &str) {
        let start = if i == 0 { 0 } else { self.ends[2 * i - 1] };
        let mid = self.ends[2 * i];
        let end = self.ends[2 * i + 1];
        (&self.text[start..mid], &self.text[mid..end])
    }

    fn len(&self) -> usize {
        self.ends.len() / 2
    }
}

/// Content hash of key-ordered pairs. 0xff never occurs in UTF-8, so it separates unambiguously.
fn pairs_hash<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> u64 {
    let mut h = Xxh3::new();
    for (k, v) in pairs {
        h.update(k.as_bytes());
        h.update(&[0xff]);
        h.update(v.as_bytes());
        h.update(&[0xff]);
    }
    h.digest()
}

impl LabelSet {
    /// The empty set (no allocation).
    pub const fn new() -> Self {
        Self(None)
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |d| d.len())
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let d = self.0.as_ref()?;
        let (mut lo, mut hi) = (0, d.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (k, v) = d.pair(mid);
            match k.cmp(key) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Some(v),
            }
        }
        None
    }

    /// Whether `key` is set.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The pairs in key order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            data: self.0.as_deref(),
            next: 0,
            end: self.len(),
        }
    }

    /// A mutable copy, to build a different set from this one.
    pub fn to_labels(&self) -> Labels {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The content hash `Hash` feeds (equal sets, equal hash; 0 for the empty set).
    fn content_hash(&self) -> u64 {
        self.0.as_ref().map_or(0, |d| d.hash)
    }

    /// Whether both are the same allocation (or both empty): equal without comparing content.
    pub(crate) fn ptr_eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl From<&Labels> for LabelSet {
    /// Interns the map's content: a set already alive is shared without allocating.
    fn from(labels: &Labels) -> Self {
        if labels.is_empty() {
            return Self::new();
        }
        let pairs = || labels.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let hash = pairs_hash(pairs());
        let data = LABEL_SETS.intern(
            hash,
            |d| {
                d.len() == labels.len()
                    && labels
                        .iter()
                        .enumerate()
                        .all(|(i, (k, v))| d.pair(i) == (k.as_str(), v.as_str()))
            },
            || {
                let mut text = String::with_capacity(
                    labels.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>(),
                );
                let mut ends = Vec::with_capacity(2 * labels.len());
                for (k, v) in pairs() {
                    text.push_str(k);
                    ends.push(text.len());
                    text.push_str(v);
                    ends.push(text.len());
                }
                Arc::new(LabelData {
                    hash,
                    text: text.into_boxed_str(),
                    ends: ends.into_boxed_slice(),
                })
            },
        );
        Self(Some(data))
    }
}

impl From<Labels> for LabelSet {
    fn from(labels: Labels) -> Self {
        Self::from(&labels)
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for LabelSet {
    /// Later pairs win over earlier ones with the same key, as in a map.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let map: Labels = iter
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        Self::from(&map)
    }
}

impl PartialEq for LabelSet {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other)
            || match (&self.0, &other.0) {
                (Some(a), Some(b)) => a.hash == b.hash && a.ends == b.ends && a.text == b.text,
                _ => false,
            }
    }
}

impl Eq for LabelSet {}

impl PartialEq<Labels> for LabelSet {
    fn eq(&self, other: &Labels) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .eq(other.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

impl Hash for LabelSet {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.content_hash());
    }
}

impl Ord for LabelSet {
    /// The order of the equivalent `BTreeMap`s: pairs compared lexicographically.
    fn cmp(&self, other: &Self) -> Ordering {
        if self.ptr_eq(other) {
            return Ordering::Equal;
        }
        self.iter().cmp(other.iter())
    }
}

impl PartialOrd for LabelSet {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for LabelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Iterator over a [`LabelSet`]'s pairs, in key order.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    data: Option<&'a LabelData>,
    next: usize,
    end: usize,
}

impl fmt::Debug for LabelData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries((0..self.len()).map(|i| self.pair(i)))
            .finish()
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let pair = self.data?.pair(self.next);
        self.next += 1;
        Some(pair)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a LabelSet {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// An immutable string that repeats across endpoints (network, locality, service account):
/// equal strings built anywhere in the process share one allocation.
///
/// Equality, ordering and hashing are those of `str`.
#[derive(Clone)]
pub struct SharedStr(Arc<str>);

impl From<&str> for SharedStr {
    /// Interns `s`: a string already alive is shared without allocating.
    fn from(s: &str) -> Self {
        Self(STRINGS.intern(xxh3_64(s.as_bytes()), |v| v == s, || Arc::from(s)))
    }
}

impl From<String> for SharedStr {
    fn from(s: String) -> Self {
        Self::from(s.as_str())
    }
}

impl From<&String> for SharedStr {
    fn from(s: &String) -> Self {
        Self::from(s.as_str())
    }
}

impl Deref for SharedStr {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq for SharedStr {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl Eq for SharedStr {}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl Hash for SharedStr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (*self.0).hash(state);
    }
}

impl Ord for SharedStr {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

impl PartialOrd for SharedStr {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_set_reads_like_its_map() {
        let m = map(&[("zone", "a"), ("app", "web"), ("version", "v1"), ("", "")]);
        let s = LabelSet::from(&m);
        assert_eq!(s.len(), 4);
        assert!(!s.is_empty());
        assert_eq!(s.get("app"), Some("web"));
        assert_eq!(s.get("zone"), Some("a"));
        assert_eq!(s.get(""), Some(""));
        assert_eq!(s.get("nope"), None);
        assert!(s.contains_key("version"));
        let pairs: Vec<_> = s.iter().collect();
        assert_eq!(
            pairs,
            vec![("", ""), ("app", "web"), ("version", "v1"), ("zone", "a")]
        );
        assert_eq!(s.iter().len(), 4);
        assert_eq!(s.to_labels(), m);
        assert_eq!(s, m);
        assert_eq!(format!("{s:?}"), format!("{m:?}"));
    }

    #[test]
    fn equal_sets_share_one_allocation_and_the_empty_set_none() {
        let a = LabelSet::from(map(&[("app", "shared-test"), ("v", "1")]));
        let b: LabelSet = [("v", "1"), ("app", "shared-test")].into_iter().collect();
        assert!(a.ptr_eq(&b));
        let c = LabelSet::from(map(&[("app", "shared-test"), ("v", "2")]));
        assert!(!a.ptr_eq(&c));
        assert_ne!(a, c);
        assert!(LabelSet::from(Labels::new()).ptr_eq(&LabelSet::default()));
        assert!(LabelSet::default().is_empty());
        assert_eq!(LabelSet::default().iter().next(), None);
    }

    /// Content, not sharing, decides equality, order and hash; boundaries between keys and
    /// values are part of the content.
    #[test]
    fn equality_order_and_hash_follow_content() {
        let ab_c = LabelSet::from(map(&[("ab", "c")]));
        let a_bc = LabelSet::from(map(&[("a", "bc")]));
        assert_ne!(ab_c, a_bc);
        assert_ne!(ab_c.content_hash(), a_bc.content_hash());
        let two = LabelSet::from(map(&[("a", ""), ("b", "c")]));
        assert_ne!(two, a_bc);

        let sets = [
            map(&[]),
            map(&[("a", "1")]),
            map(&[("a", "1"), ("b", "1")]),
            map(&[("a", "2")]),
            map(&[("b", "0")]),
        ];
        for x in &sets {
            for y in &sets {
                let (sx, sy) = (LabelSet::from(x), LabelSet::from(y));
                assert_eq!(sx.cmp(&sy), x.cmp(y), "{x:?} vs {y:?}");
                assert_eq!(sx == sy, x == y);
            }
        }
        let mut seen = BTreeMap::new();
        seen.insert(LabelSet::from(&sets[1]), 1);
        assert_eq!(seen.get(&LabelSet::from(map(&[("a", "1")]))), Some(&1));
    }

    #[test]
    fn shared_strings_are_interned_and_compare_as_str() {
        let a = SharedStr::from("us-east-1/us-east-1a");
        let b = SharedStr::from(String::from("us-east-1/us-east-1a"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, b);
        assert_eq!(a, "us-east-1/us-east-1a");
        assert_eq!(&*a, "us-east-1/us-east-1a");
        let (x, y) = (SharedStr::from("a"), SharedStr::from("b"));
        assert!(x < y);
        assert_eq!(
            format!("{a} {a:?}"),
            "us-east-1/us-east-1a \"us-east-1/us-east-1a\""
        );
        use std::hash::BuildHasher;
        let state = std::hash::RandomState::new();
        assert_eq!(state.hash_one(&a), state.hash_one("us-east-1/us-east-1a"));
    }
}
