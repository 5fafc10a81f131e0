//! What an adapter has reported as `Problems`, so it sends only what changed.
//!
//! Every adapter reports skipped registry objects per scope (a file, a service) and must send a
//! scope again when its problems change, send an empty list once when they clear, and send
//! nothing while they stay the same. A new watch starts from nothing ([`ProblemLedger::forget`]):
//! the core may still hold scopes from the watch before, and the new one re-sends what it finds.

use std::collections::{BTreeMap, BTreeSet};

use crate::registry::RegistryEvent;

/// Problems by scope, as last sent to the core.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProblemLedger {
    sent: BTreeMap<String, Vec<String>>,
}

impl ProblemLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `problems` for one `scope`; the event to send if it differs from what was sent.
    pub fn update(&mut self, scope: &str, problems: Vec<String>) -> Option<RegistryEvent> {
        let before = self.sent.get(scope).map_or(&[][..], Vec::as_slice);
        if before == problems.as_slice() {
            return None;
        }
        if problems.is_empty() {
            self.sent.remove(scope);
        } else {
            self.sent.insert(scope.to_string(), problems.clone());
        }
        Some(RegistryEvent::Problems {
            scope: scope.to_string(),
            problems,
        })
    }

    /// Records `problems` for `scope` and returns the event whatever was sent before (a new
    /// watch's first report, when the core may hold scopes this ledger never saw).
    pub fn record(&mut self, scope: &str, problems: Vec<String>) -> RegistryEvent {
        if problems.is_empty() {
            self.sent.remove(scope);
        } else {
            self.sent.insert(scope.to_string(), problems.clone());
        }
        RegistryEvent::Problems {
            scope: scope.to_string(),
            problems,
        }
    }

    /// Replaces every scope with `now` (a scope missing from it is cleared); the events to send.
    pub fn replace_all(&mut self, now: BTreeMap<String, Vec<String>>) -> Vec<RegistryEvent> {
        let gone: BTreeSet<String> = self
            .sent
            .keys()
            .filter(|s| !now.contains_key(*s))
            .cloned()
            .collect();
        let mut events: Vec<RegistryEvent> = gone
            .into_iter()
            .filter_map(|scope| self.update(&scope, Vec::new()))
            .collect();
        events.extend(now.into_iter().filter_map(|(s, p)| self.update(&s, p)));
        events
    }

    /// Forgets what was sent (a new watch re-sends everything it finds).
    pub fn forget(&mut self) {
        self.sent.clear();
    }

    /// Scopes with problems now.
    pub fn scopes(&self) -> impl Iterator<Item = &str> {
        self.sent.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope_of(e: &RegistryEvent) -> (&str, usize) {
        match e {
            RegistryEvent::Problems { scope, problems } => (scope, problems.len()),
            other => panic!("not a Problems event: {other:?}"),
        }
    }

    #[test]
    fn sends_changes_and_clears_once() {
        let mut l = ProblemLedger::new();
        assert!(l.update("a", vec![]).is_none(), "nothing to clear");
        let e = l.update("a", vec!["bad port".into()]).expect("new");
        assert_eq!(scope_of(&e), ("a", 1));
        assert!(
            l.update("a", vec!["bad port".into()]).is_none(),
            "unchanged"
        );
        let e = l.update("a", vec![]).expect("cleared");
        assert_eq!(scope_of(&e), ("a", 0));
        assert!(l.update("a", vec![]).is_none(), "cleared once");
    }

    #[test]
    fn replace_all_clears_missing_scopes() {
        let mut l = ProblemLedger::new();
        l.update("a", vec!["x".into()]);
        l.update("b", vec!["y".into()]);
        let events = l.replace_all([("b".to_string(), vec!["y".to_string()])].into());
        let got: Vec<_> = events.iter().map(scope_of).collect();
        assert_eq!(got, vec![("a", 0)]);
        assert_eq!(l.scopes().collect::<Vec<_>>(), vec!["b"]);
        l.forget();
        assert_eq!(
            l.replace_all([("b".to_string(), vec!["y".to_string()])].into())
                .len(),
            1
        );
    }
}
