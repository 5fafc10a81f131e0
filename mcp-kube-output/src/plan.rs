//! What the API server holds of this adapter's, and what to send to make it the served set.
//!
//! Pure bookkeeping, no I/O: [`Ledger`] is built from a metadata-only list and kept current by
//! the output's own writes; [`Ledger::plan`] compares it with the newest snapshots by entry
//! version, so a request goes out only for an object whose content changed, appeared or left
//! (a re-list that changed nothing, or a restart, plans nothing).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

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
    /// Written by this adapter under another shard layout (`--shard i/n` with another `n`, or
    /// none) whose writer is gone: taken over when this process serves its name; deleted only
    /// once a second list still finds it unclaimed (the new layout's process that serves it may
    /// not have listed yet), counted here in lists.
    pub stranded: Option<u32>,
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
    /// with force: a hand edit of our object is repaired, not a conflict), conditional on `uid`
    /// when known (a user's object re-created under the name is never forced over).
    Apply {
        /// The entry.
        entry: Arc<Entry>,
        /// Shard label.
        shard: Option<String>,
        /// Already ours.
        owned: bool,
        /// The uid it was listed or written with (empty: unknown).
        uid: String,
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

    /// The entry version it writes (empty for a delete).
    pub fn version(&self) -> &str {
        match self {
            Action::Apply { entry, .. } => &entry.version,
            Action::Delete { .. } => "",
        }
    }

    /// `apply` or `delete` (the metric's verb).
    pub fn verb(&self) -> &'static str {
        match self {
            Action::Apply { .. } => "apply",
            Action::Delete { .. } => "delete",
        }
    }
}

/// Failures of one object's request the API server answered with a 5xx before it is rejected
/// (reported, not retried until its entry changes or the next resync).
pub const REJECT_AFTER: u32 = 3;
/// The first wait before an object whose request failed is tried again (doubling).
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// The work across plans: since when each object is pending (the oldest goes first, so a late
/// name or a delete is never starved by churn on others), and the objects waiting to be tried
/// again after a failure.
#[derive(Debug, Default)]
pub struct Backlog {
    next: u64,
    since: HashMap<String, u64>,
    failed: HashMap<String, Failed>,
}

#[derive(Debug)]
struct Failed {
    version: String,
    count: u32,
    retry_at: Instant,
}

impl Backlog {
    /// The plan's actions in the order they became pending (applies before deletes among
    /// those of one moment, then by name), without those waiting to be tried again; and when
    /// the first of those may be.
    pub fn order(&mut self, actions: Vec<Action>, now: Instant) -> (Vec<Action>, Option<Instant>) {
        let names: BTreeSet<&str> = actions.iter().map(Action::name).collect();
        self.since.retain(|n, _| names.contains(n.as_str()));
        self.failed.retain(|n, _| names.contains(n.as_str()));
        let mut keyed: Vec<(u64, bool, Action)> = actions
            .into_iter()
            .map(|a| {
                let seq = *self.since.entry(a.name().to_string()).or_insert_with(|| {
                    self.next += 1;
                    self.next
                });
                (seq, matches!(a, Action::Delete { .. }), a)
            })
            .collect();
        keyed.sort_by(|a, b| (a.0, a.1, a.2.name()).cmp(&(b.0, b.1, b.2.name())));
        let mut next_retry: Option<Instant> = None;
        let ready = keyed
            .into_iter()
            .map(|(_, _, a)| a)
            .filter(|a| match self.failed.get(a.name()) {
                Some(f) if f.version == a.version() && f.retry_at > now => {
                    next_retry = Some(next_retry.map_or(f.retry_at, |t| t.min(f.retry_at)));
                    false
                }
                _ => true,
            })
            .collect();
        (ready, next_retry)
    }

    /// The object's request went through.
    pub fn done(&mut self, name: &str) {
        self.failed.remove(name);
        self.since.remove(name);
    }

    /// The object's request failed with a 5xx; how many times in a row for this version.
    pub fn failed(&mut self, action: &Action, now: Instant) -> u32 {
        let f = self
            .failed
            .entry(action.name().to_string())
            .or_insert_with(|| Failed {
                version: action.version().to_string(),
                count: 0,
                retry_at: now,
            });
        if f.version != action.version() {
            f.version = action.version().to_string();
            f.count = 0;
        }
        f.count += 1;
        f.retry_at = now + RETRY_FIRST * 2u32.pow(f.count.min(8) - 1);
        f.count
    }

    /// Forgets the object's failures (it was rejected: a new version starts again).
    pub fn forget(&mut self, name: &str) {
        self.failed.remove(name);
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
                    uid: written.map(|w| w.uid.clone()).unwrap_or_default(),
                });
            }
        }
        for (name, w) in &self.written {
            // A refused delete waits for the next resync (which clears `rejected`); an object of
            // a gone layout waits for a second list (another process may serve it).
            let unclaimed = w.stranded.is_none_or(|lists| lists >= 2);
            if !desired.contains_key(name.as_str())
                && !self.rejected.contains_key(name)
                && unclaimed
            {
                plan.actions.push(Action::Delete {
                    name: name.clone(),
                    uid: w.uid.clone(),
                });
            }
        }
        plan
    }

    /// After a fresh list: `listed` replaces what was known, except that an object whose
    /// generation moved since our own write was edited by hand and is written again, and a
    /// stranded object counts one more list.
    pub fn relisted(&self, mut listed: Ledger) -> Ledger {
        for (name, w) in listed.written.iter_mut() {
            let before = self.written.get(name);
            let ours = before.and_then(|o| o.generation);
            if ours.is_some() && w.generation.is_some() && ours != w.generation {
                w.version.clear();
            }
            if let (Some(lists), Some(Some(earlier))) =
                (&mut w.stranded, before.map(|b| b.stranded))
            {
                *lists = earlier + 1;
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
            stranded: None,
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

    /// Constant churn on the first names, and only a few requests per round (a newer snapshot
    /// stops each round early): every pending object is still reached, oldest first.
    #[test]
    fn churn_never_starves_late_names_or_deletes() {
        const ROUND: usize = 3;
        let mut ledger = Ledger::default();
        ledger.written.insert("ns/zz-gone".into(), written("1"));
        let mut backlog = Backlog::default();
        let now = Instant::now();
        let names: Vec<String> = (0..40).map(|i| format!("ns/s{i:02}")).collect();
        let mut done_at = BTreeMap::new();
        for round in 1..=40 {
            // The first five services change every round.
            let want: Desired = names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let v = if i < 5 {
                        format!("r{round}")
                    } else {
                        "1".into()
                    };
                    let e = mk_entry(n, &v);
                    (e.name.clone(), (e, None))
                })
                .collect();
            let plan = ledger.plan(&want, |_| true);
            let (ready, _) = backlog.order(plan.actions, now);
            for action in ready.into_iter().take(ROUND) {
                let name = action.name().to_string();
                match &action {
                    Action::Apply { entry, .. } => {
                        ledger.written.insert(name.clone(), written(&entry.version));
                    }
                    Action::Delete { .. } => {
                        ledger.written.remove(&name);
                    }
                }
                backlog.done(&name);
                done_at.entry(name).or_insert(round);
            }
        }
        // 41 objects to create or delete, 3 per round, while 5 keep changing: all within
        // 41 / 3 + the churned names' turns, about 20 rounds.
        let last = done_at.get("ns/s39").copied();
        let gone = done_at.get("ns/zz-gone").copied();
        assert!(last.is_some_and(|r| r <= 20), "last name done at {last:?}");
        assert!(gone.is_some_and(|r| r <= 20), "delete done at {gone:?}");
        assert!(!ledger.written.contains_key("ns/zz-gone"));
    }

    #[test]
    fn a_failing_object_waits_and_others_go_first() {
        let mut backlog = Backlog::default();
        let now = Instant::now();
        let want = desired(&[("ns/a", "1"), ("ns/b", "1")]);
        let plan = Ledger::default().plan(&want, |_| true);
        let (ready, _) = backlog.order(plan.actions.clone(), now);
        assert_eq!(names_of(&ready), ["ns/a", "ns/b"]);
        assert_eq!(backlog.failed(&ready[0], now), 1);
        // a waits a second; b goes alone; a comes back after.
        let (ready, retry) = backlog.order(plan.actions.clone(), now);
        assert_eq!(names_of(&ready), ["ns/b"]);
        assert_eq!(retry, Some(now + Duration::from_secs(1)));
        let later = now + Duration::from_secs(1);
        let (ready, _) = backlog.order(plan.actions.clone(), later);
        assert_eq!(names_of(&ready), ["ns/a", "ns/b"]);
        // The waits double; a new version starts again.
        assert_eq!(backlog.failed(&ready[0], later), 2);
        let (ready, retry) = backlog.order(plan.actions.clone(), later);
        assert_eq!(names_of(&ready), ["ns/b"]);
        assert_eq!(retry, Some(later + Duration::from_secs(2)));
        let plan = Ledger::default().plan(&desired(&[("ns/a", "2")]), |_| true);
        let (ready, _) = backlog.order(plan.actions, later);
        assert_eq!(names_of(&ready), ["ns/a"]);
    }

    fn names_of(actions: &[Action]) -> Vec<&str> {
        actions.iter().map(Action::name).collect()
    }

    #[test]
    fn stranded_objects_are_deleted_only_when_still_unclaimed_at_a_second_list() {
        let stranded = |lists| Written {
            stranded: Some(lists),
            shard: Some("0-of-2".into()),
            ..written("1")
        };
        let mut listed = Ledger::default();
        listed.written.insert("ns/old".into(), stranded(1));
        listed.written.insert("ns/mine".into(), stranded(1));
        let first = Ledger::default().relisted(listed.clone());
        let mut want = desired(&[("ns/mine", "1")]);
        for (_, shard) in want.values_mut() {
            *shard = Some("0-of-3".into());
        }
        // Served here: taken over (relabelled) at once; not served: left for now.
        assert_eq!(
            names(&first.plan(&want, |_| true)),
            ["apply ns/mine owned=true"]
        );
        let second = first.relisted(listed);
        assert_eq!(
            names(&second.plan(&want, |_| true)),
            ["apply ns/mine owned=true", "delete ns/old uid-1"]
        );
    }
}
