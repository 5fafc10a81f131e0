//! What the API server holds of this adapter's, and what to send to make it the served set.
//!
//! Pure bookkeeping, no I/O: [`Ledger`] is built from a metadata-only list and kept current by
//! the output's own writes; [`Ledger::plan`] compares it with the newest snapshots by entry
//! version, so a request goes out only for an object whose content changed, appeared or left
//! (a re-list that changed nothing, or a restart, plans nothing).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use mcp_core::cache::Entry;

/// One object of ours as the API server holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The entry version it was written from (its `mcp-adapter/version` annotation).
    pub version: String,
    /// Its shard label.
    pub shard: Option<String>,
    /// Its uid (deletes are conditional on it: never delete a re-created object that is not
    /// ours).
    pub uid: String,
    /// `metadata.generation` after our last write: a different one at the next list means a
    /// hand edit, repaired by writing again.
    pub generation: Option<i64>,
}

/// An object the API server refused, not retried until its entry changes (or the next resync).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rejected {
    /// The entry version that was refused.
    pub version: String,
    /// The API server's answer.
    pub message: String,
}

/// What this process knows of the API server's ServiceEntries.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Ours, by `namespace/name`.
    pub written: BTreeMap<String, Written>,
    /// Names taken by an object that is not ours (a user's, another adapter's): never written,
    /// never deleted.
    pub foreign: BTreeSet<String>,
    /// Refused by the API server, by name.
    pub rejected: BTreeMap<String, Rejected>,
}

/// One request to make.
#[derive(Clone, Debug)]
pub enum Action {
    /// Server-side apply `entry` with its shard label; `owned`: the object is ours already (apply
    /// with force: a hand edit of our object is repaired, not a conflict).
    Apply {
        /// The entry.
        entry: Arc<Entry>,
        /// Shard label.
        shard: Option<String>,
        /// Already ours.
        owned: bool,
    },
    /// Delete our object `name` (it left the served set) if its uid is still `uid`.
    Delete {
        /// `namespace/name`.
        name: String,
        /// Its uid.
        uid: String,
    },
}

impl Action {
    /// `namespace/name` of the object.
    pub fn name(&self) -> &str {
        match self {
            Action::Apply { entry, .. } => &entry.name,
            Action::Delete { name, .. } => name,
        }
    }
}

/// The requests that make the API server hold the served set, and what cannot be written.
#[derive(Debug, Default)]
pub struct Plan {
    /// Requests, applies first (a renamed service is never briefly absent).
    pub actions: Vec<Action>,
    /// Served names held by someone else's object.
    pub conflicts: Vec<String>,
    /// Served names outside `--output-namespaces`.
    pub refused: Vec<String>,
}

/// The served set of one moment: each entry with its shard label.
pub type Desired = BTreeMap<Arc<str>, (Arc<Entry>, Option<String>)>;

impl Ledger {
    /// The plan from what is written to `desired`; `allowed` says which namespaces may be
    /// written.
    pub fn plan(&self, desired: &Desired, allowed: impl Fn(&str) -> bool) -> Plan {
        let mut plan = Plan::default();
        for (name, (entry, shard)) in desired {
            let name: &str = name;
            let namespace = super::object::split_name(name).0;
            if !allowed(namespace) {
                plan.refused.push(name.to_string());
                continue;
            }
            if self.foreign.contains(name) {
                plan.conflicts.push(name.to_string());
                continue;
            }
            if self
                .rejected
                .get(name)
                .is_some_and(|r| r.version == *entry.version)
            {
                continue;
            }
            let written = self.written.get(name);
            let current = written.is_some_and(|w| w.version == *entry.version && w.shard == *shard);
            if !current {
                plan.actions.push(Action::Apply {
                    entry: entry.clone(),
                    shard: shard.clone(),
                    owned: written.is_some(),
                });
            }
        }
        for (name, w) in &self.written {
            // A refused delete waits for the next resync (which clears `rejected`).
            if !desired.contains_key(name.as_str()) && !self.rejected.contains_key(name) {
                plan.actions.push(Action::Delete {
                    name: name.clone(),
                    uid: w.uid.clone(),
                });
            }
        }
        plan
    }

    /// After a fresh list: `listed` replaces what was known, except that an object whose
    /// generation moved since our own write was edited by hand and is written again.
    pub fn relisted(&self, mut listed: Ledger) -> Ledger {
        for (name, w) in listed.written.iter_mut() {
            let ours = self.written.get(name).and_then(|o| o.generation);
            if ours.is_some() && w.generation.is_some() && ours != w.generation {
                w.version.clear();
            }
        }
        listed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_core::testing::mk_entry;

    fn desired(entries: &[(&str, &str)]) -> Desired {
        entries
            .iter()
            .map(|(n, v)| {
                let e = mk_entry(n, v);
                (e.name.clone(), (e, None))
            })
            .collect()
    }

    fn written(version: &str) -> Written {
        Written {
            version: version.into(),
            shard: None,
            uid: format!("uid-{version}"),
            generation: Some(1),
        }
    }

    fn names(plan: &Plan) -> Vec<String> {
        plan.actions
            .iter()
            .map(|a| match a {
                Action::Apply { owned, .. } => format!("apply {} owned={owned}", a.name()),
                Action::Delete { uid, .. } => format!("delete {} {uid}", a.name()),
            })
            .collect()
    }

    #[test]
    fn plans_only_what_changed() {
        let mut ledger = Ledger::default();
        ledger.written.insert("ns/same".into(), written("1"));
        ledger.written.insert("ns/changed".into(), written("1"));
        ledger.written.insert("ns/gone".into(), written("1"));
        let want = desired(&[("ns/same", "1"), ("ns/changed", "2"), ("ns/new", "1")]);
        let plan = ledger.plan(&want, |_| true);
        assert_eq!(
            names(&plan),
            [
                "apply ns/changed owned=true",
                "apply ns/new owned=false",
                "delete ns/gone uid-1"
            ]
        );
        // Nothing changed: nothing to send.
        let mut after = ledger.clone();
        after.written.remove("ns/gone");
        after.written.insert("ns/changed".into(), written("2"));
        after.written.insert("ns/new".into(), written("1"));
        assert!(after.plan(&want, |_| true).actions.is_empty());
    }

    #[test]
    fn never_touches_foreign_names_and_keeps_to_its_namespaces() {
        let mut ledger = Ledger::default();
        ledger.foreign.insert("ns/users".into());
        let want = desired(&[("ns/users", "1"), ("other/x", "1"), ("ns/ok", "1")]);
        let plan = ledger.plan(&want, |ns| ns == "ns");
        assert_eq!(names(&plan), ["apply ns/ok owned=false"]);
        assert_eq!(plan.conflicts, ["ns/users"]);
        assert_eq!(plan.refused, ["other/x"]);
    }

    #[test]
    fn a_rejected_version_waits_for_a_new_one_and_shard_moves_relabel() {
        let mut ledger = Ledger::default();
        ledger.rejected.insert(
            "ns/bad".into(),
            Rejected {
                version: "1".into(),
                message: "422".into(),
            },
        );
        ledger.written.insert("ns/moved".into(), written("1"));
        let mut want = desired(&[("ns/bad", "1"), ("ns/moved", "1")]);
        if let Some((_, shard)) = want.get_mut("ns/moved") {
            *shard = Some("1-of-2".into());
        }
        assert_eq!(
            names(&ledger.plan(&want, |_| true)),
            ["apply ns/moved owned=true"]
        );
        let want = desired(&[("ns/bad", "2")]);
        assert_eq!(
            names(&ledger.plan(&want, |_| true)),
            ["apply ns/bad owned=false", "delete ns/moved uid-1"]
        );
    }

    #[test]
    fn a_hand_edit_is_written_again_after_a_relist() {
        let mut ours = Ledger::default();
        ours.written.insert("ns/a".into(), written("1"));
        ours.written.insert("ns/b".into(), written("1"));
        let mut listed = ours.clone();
        if let Some(w) = listed.written.get_mut("ns/b") {
            w.generation = Some(2);
        }
        let next = ours.relisted(listed);
        let want = desired(&[("ns/a", "1"), ("ns/b", "1")]);
        assert_eq!(
            names(&next.plan(&want, |_| true)),
            ["apply ns/b owned=true"]
        );
    }
}
