//! Process-wide interning of the immutable values endpoints share ([`super::LabelSet`],
//! [`super::SharedStr`]).
//!
//! Why process-wide and not an interner each conversion creates and passes down:
//! - adapters keep their convert signatures: `labels: map.into()` is the whole change, where a
//!   per-conversion interner would be one more argument through every adapter's convert path;
//! - sharing spans conversions. A re-list builds a new model while the old one is still alive
//!   (the adapter's, or the Reset in flight), and with one table the new model shares every label
//!   set and string with the old: in `benches/model_size.rs` (1M endpoints) a second, equal model
//!   costs 268 B/endpoint instead of the first one's 370, where a per-conversion interner would
//!   pay the full 370 again. Localities, networks and service accounts repeat across services,
//!   so they are stored once per registry, not once per service or conversion.
//!
//! The price is one uncontended lock and one table probe per value built: building that model is
//! no slower than building the old per-endpoint maps (0.9-1.2 s vs 0.6-1.5 s for 1M endpoints on
//! the shared 2-core bench machine), since a hit allocates nothing.
//!
//! The table holds [`Weak`] references, so it never keeps a value alive: a value is freed when its
//! last model drops it (dropping takes no lock). Dead entries are swept when the table has
//! doubled since the last sweep, which bounds it to twice the live values (plus a small floor)
//! at an amortized O(1) per insert.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// Below this many entries the table is never swept (sweeping a tiny table is pure overhead).
const SWEEP_FLOOR: usize = 1024;

/// The table is keyed by xxh3 content hashes already; hashing them again would only cost time.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `u64` keys; this keeps the type total.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

struct Table<T: ?Sized> {
    /// Content hash -> the value with that content, if still alive.
    map: HashMap<u64, Weak<T>, BuildHasherDefault<PassThrough>>,
    /// Entries left by the last sweep.
    swept_len: usize,
}

/// A weak set of shared values, one per content.
pub(super) struct Interner<T: ?Sized> {
    table: Mutex<Table<T>>,
}

impl<T: ?Sized> Interner<T> {
    pub(super) const fn new() -> Self {
        Self {
            table: Mutex::new(Table {
                map: HashMap::with_hasher(BuildHasherDefault::new()),
                swept_len: 0,
            }),
        }
    }

    /// The live value whose content hashes to `hash` and satisfies `same`, else a new one from
    /// `make`, remembered for the next caller. Two different contents with equal 64-bit hashes
    /// are both correct values; the second is just not shared.
    pub(super) fn intern(
        &self,
        hash: u64,
        same: impl FnOnce(&T) -> bool,
        make: impl FnOnce() -> Arc<T>,
    ) -> Arc<T> {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(live) = table.map.get(&hash).and_then(Weak::upgrade) {
            if same(&live) {
                return live;
            }
            drop(table);
            return make();
        }
        let value = make();
        table.map.insert(hash, Arc::downgrade(&value));
        table.sweep_if_due();
        value
    }

    /// Entries in the table, dead or alive (tests check the sweep bound).
    #[cfg(test)]
    pub(super) fn table_len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map
            .len()
    }
}

impl<T: ?Sized> Table<T> {
    fn sweep_if_due(&mut self) {
        if self.map.len() < SWEEP_FLOOR.max(2 * self.swept_len) {
            return;
        }
        self.map.retain(|_, v| v.strong_count() > 0);
        if self.map.capacity() > 4 * self.map.len().max(SWEEP_FLOOR) {
            self.map.shrink_to_fit();
        }
        self.swept_len = self.map.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_content_is_shared_and_dead_entries_are_swept() {
        let interner: Interner<str> = Interner::new();
        let a = interner.intern(1, |v| v == "a", || Arc::from("a"));
        let b = interner.intern(1, |v| v == "a", || Arc::from("a"));
        assert!(Arc::ptr_eq(&a, &b));
        // A collision with different content gets its own, unshared value.
        let c = interner.intern(1, |v| v == "c", || Arc::from("c"));
        assert_eq!(&*c, "c");
        assert!(Arc::ptr_eq(
            &a,
            &interner.intern(1, |v| v == "a", || Arc::from("a"))
        ));

        // Values that died are swept: the table stays bounded by twice the live ones.
        let live: Vec<Arc<str>> = (0..100u64)
            .map(|i| interner.intern(1000 + i, |_| true, || Arc::from(i.to_string())))
            .collect();
        for i in 0..100_000u64 {
            drop(interner.intern(1_000_000 + i, |_| true, || Arc::from(i.to_string())));
        }
        assert!(
            interner.table_len() <= 2 * SWEEP_FLOOR,
            "{}",
            interner.table_len()
        );
        // The live ones survived every sweep.
        for (i, v) in live.iter().enumerate() {
            let again = interner.intern(1000 + i as u64, |_| true, || Arc::from("new"));
            assert!(Arc::ptr_eq(v, &again));
        }
    }
}
