//! Catalog changes that no list of names explains, waiting a moment for a service's own query
//! to explain them before they cost a sweep.
//!
//! An instance added to, moved in or removed from an existing service moves the catalog's index
//! by one Raft entry and leaves its name -> tags map as it was. When that service holds its own
//! query, the query answers with the same index: the entry is explained, and nothing else can
//! hide in one entry. The two answers come from two blocking queries woken by the same write,
//! in either order and usually within milliseconds; an entry still unexplained after
//! [`GRACE`] is swept (every service without its own query), as are several entries at once.
//! A `/v1/txn` that changes instances of two services in one entry, one of them watched, is
//! taken as the watched one's alone (the same limit as a transaction that adds a name).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

/// How long an unexplained entry waits for an own query's answer.
pub(super) const GRACE: Duration = Duration::from_millis(100);

/// Most own-query answer indexes remembered (answers to check changes never meet a catalog
/// entry of theirs; the oldest are forgotten).
const REMEMBERED: usize = 1024;

/// Catalog entries waiting for an explanation, and the indexes own queries answered with.
#[derive(Debug, Default)]
pub(super) struct Unexplained {
    /// Catalog indexes (one entry each) no answer has explained yet.
    pending: BTreeSet<u64>,
    /// Indexes own queries answered with, not yet matched.
    answered: BTreeSet<u64>,
    /// When the pending entries are swept.
    deadline: Option<Instant>,
}

impl Unexplained {
    /// A service's own query answered with `index`.
    pub(super) fn answered(&mut self, index: u64) {
        if !self.pending.remove(&index) {
            self.answered.insert(index);
            while self.answered.len() > REMEMBERED {
                self.answered.pop_first();
            }
        }
        if self.pending.is_empty() {
            self.deadline = None;
        }
    }

    /// The catalog moved by the one entry `index` and its names did not: explained already, or
    /// waiting.
    pub(super) fn catalog(&mut self, index: u64) {
        if !self.answered.remove(&index) {
            self.pending.insert(index);
            self.deadline.get_or_insert_with(|| Instant::now() + GRACE);
        }
        // Answers older than this entry can no longer explain one.
        self.answered = self.answered.split_off(&index);
    }

    /// When the pending entries are due for a sweep.
    pub(super) fn due(&self) -> Option<Instant> {
        self.deadline
    }

    /// A sweep of every service without its own query is done or decided: nothing waits.
    pub(super) fn clear(&mut self) {
        self.pending.clear();
        self.deadline = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_answer_explains_its_entry_in_either_order() {
        let mut u = Unexplained::default();
        u.answered(7);
        u.catalog(7);
        assert_eq!(u.due(), None, "answer first");
        u.catalog(8);
        let due = u.due().expect("waiting");
        assert_eq!(due, Instant::now() + GRACE);
        u.answered(8);
        assert_eq!(u.due(), None, "catalog first");
        u.catalog(9);
        u.catalog(10);
        u.answered(10);
        assert!(u.due().is_some(), "9 still unexplained");
        u.clear();
        assert_eq!(u.due(), None);
        // A check change's answer is forgotten once the catalog passes it.
        u.answered(11);
        u.catalog(12);
        u.answered(13);
        u.clear();
        u.catalog(11);
        assert!(u.due().is_some(), "11 was forgotten at 12");
    }

    #[test]
    fn remembers_a_bounded_number_of_answers() {
        let mut u = Unexplained::default();
        for i in 0..(REMEMBERED as u64 * 3) {
            u.answered(i);
        }
        assert_eq!(u.answered.len(), REMEMBERED);
    }
}
