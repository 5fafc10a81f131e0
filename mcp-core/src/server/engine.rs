//! Per-stream subscription state shared by every protocol.
//!
//! Each RPC (xDS SotW, delta xDS, legacy MCP, the legacy aggregated services) decodes its requests
//! into a [`Request`] and encodes [`Outgoing`] responses; the rules live here once:
//! - the first request for a type on a stream is a subscription, whatever its nonce (istiod's adsc
//!   sends a made-up timestamp nonce on its initial requests);
//! - a request whose nonce matches the response in flight is its ACK, or its NACK if it carries an
//!   error; any other nonce is stale and ignored;
//! - one response per type is in flight; a newer snapshot waits for the ACK, and only the newest
//!   one is sent then (slow sinks coalesce by themselves);
//! - a NACKed snapshot is not sent again;
//! - types we do not serve get one empty response (istiod is not ready until every type it asked
//!   for was answered);
//! - full-state responses carry everything; incremental ones carry changes and removals relative
//!   to what the sink acknowledged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::cache::{diff, Entry, Known, Snapshot};

/// When responses are incremental.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incremental {
    /// Always the full state (xDS SotW, legacy SotW).
    Never,
    /// Incremental when the sink asks (legacy `ResourceSource`).
    IfRequested,
    /// Always incremental after the first response (delta xDS, legacy incremental rpc).
    Always,
}

/// How a request changes the set of resource names a sink wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Names {
    /// Leave it as it is.
    Unchanged,
    /// Replace it (SotW `resource_names`; empty = everything).
    Replace(Vec<String>),
    /// Add and remove names (delta); `*` stands for everything.
    Delta {
        /// Names to add.
        subscribe: Vec<String>,
        /// Names to drop.
        unsubscribe: Vec<String>,
    },
}

/// A request, whatever protocol it came in.
#[derive(Clone, Debug)]
pub struct Request {
    /// Type URL or legacy collection.
    pub type_key: String,
    /// Nonce of the response this answers (may be made up on a first request).
    pub nonce: String,
    /// NACK detail, if this rejects the response.
    pub error: Option<String>,
    /// The sink asks for incremental responses.
    pub incremental: bool,
    /// Names and versions the sink already holds (first request only).
    pub initial_versions: BTreeMap<String, String>,
    /// Subscription change.
    pub names: Names,
}

/// A response to send.
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// Type URL or collection, echoed exactly as requested.
    pub type_key: String,
    /// Snapshot version (`"0"` for types we do not serve).
    pub version: String,
    /// Per-stream nonce.
    pub nonce: String,
    /// Resources (all, or the changed ones when incremental).
    pub resources: Vec<Arc<Entry>>,
    /// Names removed (incremental only).
    pub removed: Vec<String>,
    /// Whether this is incremental.
    pub incremental: bool,
    /// Whether the type is served (metrics).
    pub served: bool,
}

/// What a request turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ack {
    /// A new subscription.
    Subscribe,
    /// Acknowledged the response in flight.
    Ack,
    /// Rejected the response in flight, with the sink's reason.
    Nack(String),
    /// Stale or unknown nonce: ignored.
    Stale,
}

#[derive(Debug)]
struct TypeState {
    served: bool,
    incremental: bool,
    /// `None` = every resource.
    names: Option<BTreeSet<String>>,
    in_flight: Option<String>,
    /// What the sink holds once the response in flight is ACKed.
    next_known: Known,
    /// What the sink acknowledged.
    known: Known,
    sent_version: Option<String>,
    nacked_version: Option<String>,
    /// Something other than the snapshot (names) changed: send even if the version is the same.
    dirty: bool,
    /// At least one response went out.
    answered: bool,
}

/// The subscription state of one stream.
#[derive(Debug)]
pub struct Engine {
    policy: Incremental,
    served: fn(&str) -> bool,
    types: HashMap<String, TypeState>,
    nonce: u64,
}

impl Engine {
    /// A new stream; `served` says which type keys carry ServiceEntries.
    pub fn new(policy: Incremental, served: fn(&str) -> bool) -> Self {
        Self {
            policy,
            served,
            types: HashMap::new(),
            nonce: 0,
        }
    }

    /// Handles a request; returns what it was and the response to send, if any.
    pub fn on_request(
        &mut self,
        req: Request,
        snapshot: Option<&Arc<Snapshot>>,
    ) -> (Ack, Option<Outgoing>) {
        let policy = self.policy;
        let kind = match self.types.get_mut(&req.type_key) {
            Some(state)
                if req.nonce.is_empty()
                    && (state.in_flight.is_some() || matches!(req.names, Names::Delta { .. })) =>
            {
                // A subscription change (delta clients send these without a nonce) amends the
                // subscription; while a response is in flight, the ACK of that response sends
                // the result.
                apply_names(state, &req.names);
                if state.in_flight.is_some() {
                    return (Ack::Stale, None);
                }
                Ack::Subscribe
            }
            Some(state) if !req.nonce.is_empty() => {
                if state.in_flight.as_deref() != Some(req.nonce.as_str()) {
                    return (Ack::Stale, None);
                }
                state.in_flight = None;
                let kind = match req.error {
                    Some(e) => {
                        state.nacked_version = state.sent_version.clone();
                        state.next_known = state.known.clone();
                        Ack::Nack(e)
                    }
                    None => {
                        state.known = std::mem::replace(&mut state.next_known, Known::Nothing);
                        state.next_known = state.known.clone();
                        Ack::Ack
                    }
                };
                apply_names(state, &req.names);
                kind
            }
            _ => {
                // First request for this type (or a fresh one with an empty nonce and nothing
                // in flight): a subscription, whatever nonce it carries.
                let incremental = match policy {
                    Incremental::Never => false,
                    Incremental::IfRequested => req.incremental,
                    Incremental::Always => true,
                };
                let known = if incremental && !req.initial_versions.is_empty() {
                    Known::Versions(req.initial_versions)
                } else {
                    Known::Nothing
                };
                let mut state = TypeState {
                    served: (self.served)(&req.type_key),
                    incremental,
                    names: None,
                    in_flight: None,
                    next_known: known.clone(),
                    known,
                    sent_version: None,
                    nacked_version: None,
                    dirty: true,
                    answered: false,
                };
                apply_names(&mut state, &req.names);
                self.types.insert(req.type_key.clone(), state);
                Ack::Subscribe
            }
        };
        let out = self.try_send(&req.type_key, snapshot);
        (kind, out)
    }

    /// A new snapshot was published: responses for every served type that can take one.
    pub fn on_snapshot(&mut self, snapshot: &Arc<Snapshot>) -> Vec<Outgoing> {
        let keys: Vec<String> = self
            .types
            .iter()
            .filter(|(_, s)| s.served)
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .filter_map(|k| self.try_send(k, Some(snapshot)))
            .collect()
    }

    fn try_send(&mut self, type_key: &str, snapshot: Option<&Arc<Snapshot>>) -> Option<Outgoing> {
        let state = self.types.get_mut(type_key)?;
        if state.in_flight.is_some() {
            return None;
        }
        if !state.served {
            if state.answered {
                return None;
            }
            state.answered = true;
            self.nonce += 1;
            let nonce = self.nonce.to_string();
            state.in_flight = Some(nonce.clone());
            return Some(Outgoing {
                type_key: type_key.to_string(),
                version: "0".into(),
                nonce,
                resources: Vec::new(),
                removed: Vec::new(),
                incremental: false,
                served: false,
            });
        }
        // Until the first registry sync there is nothing true to say: an empty answer would make
        // a reconnecting istiod delete everything this source gave it before.
        let snapshot = snapshot?;
        let same = state.sent_version.as_deref() == Some(snapshot.version.as_str());
        let nacked = state.nacked_version.as_deref() == Some(snapshot.version.as_str());
        if !state.dirty && (same || nacked) {
            return None;
        }
        let view = filtered(snapshot, state.names.as_ref());
        let incremental_now =
            state.incremental && (state.answered || matches!(state.known, Known::Versions(_)));
        let (resources, removed) = if incremental_now {
            let (up, rm) = diff(&state.known, &view, |_| true);
            if up.is_empty() && rm.is_empty() && state.answered {
                state.sent_version = Some(snapshot.version.clone());
                state.dirty = false;
                return None;
            }
            (up, rm)
        } else {
            (view.entries.clone(), Vec::new())
        };
        self.nonce += 1;
        let nonce = self.nonce.to_string();
        state.in_flight = Some(nonce.clone());
        state.next_known = Known::Snapshot(view);
        state.sent_version = Some(snapshot.version.clone());
        state.dirty = false;
        state.answered = true;
        Some(Outgoing {
            type_key: type_key.to_string(),
            version: snapshot.version.clone(),
            nonce,
            resources,
            removed,
            incremental: incremental_now,
            served: true,
        })
    }
}

fn apply_names(state: &mut TypeState, names: &Names) {
    match names {
        Names::Unchanged => {}
        Names::Replace(list) => {
            let new = if list.is_empty() || list.iter().any(|n| n == "*") {
                None
            } else {
                Some(list.iter().cloned().collect())
            };
            if new != state.names {
                state.names = new;
                state.dirty = true;
            }
        }
        Names::Delta {
            subscribe,
            unsubscribe,
        } => {
            let before = state.names.clone();
            if !state.answered && subscribe.is_empty() {
                state.names = None;
            }
            for n in subscribe {
                if n == "*" {
                    state.names = None;
                } else if let Some(set) = state.names.as_mut() {
                    set.insert(n.clone());
                } else if !state.answered && !subscribe.iter().any(|n| n == "*") {
                    state.names = Some([n.clone()].into());
                }
            }
            for n in unsubscribe {
                if n == "*" {
                    state.names = Some(BTreeSet::new());
                } else if let Some(set) = state.names.as_mut() {
                    set.remove(n);
                }
            }
            if before != state.names {
                state.dirty = true;
            }
        }
    }
}

fn filtered(snapshot: &Arc<Snapshot>, names: Option<&BTreeSet<String>>) -> Arc<Snapshot> {
    match names {
        None => Arc::clone(snapshot),
        Some(set) => Arc::new(Snapshot::new(
            snapshot
                .entries
                .iter()
                .filter(|e| set.contains(&*e.name))
                .cloned()
                .collect(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Summary;
    use bytes::Bytes;

    const SE: &str = "networking.istio.io/v1/ServiceEntry";

    fn served(t: &str) -> bool {
        t == SE
    }

    fn mk_snapshot(items: &[(&str, &str)]) -> Arc<Snapshot> {
        Arc::new(Snapshot::new(
            items
                .iter()
                .map(|(n, v)| {
                    Arc::new(Entry {
                        name: (*n).into(),
                        version: (*v).into(),
                        resource: Bytes::new(),
                        summary: Summary {
                            hosts: vec![],
                            ports: 0,
                            endpoints: 0,
                            create_time: 0,
                        },
                    })
                })
                .collect(),
        ))
    }

    fn mk_request(t: &str, nonce: &str) -> Request {
        Request {
            type_key: t.into(),
            nonce: nonce.into(),
            error: None,
            incremental: false,
            initial_versions: BTreeMap::new(),
            names: Names::Unchanged,
        }
    }

    fn names_of(o: &Outgoing) -> Vec<String> {
        o.resources.iter().map(|e| e.name.to_string()).collect()
    }

    #[test]
    fn first_request_subscribes_whatever_its_nonce() {
        let snap = mk_snapshot(&[("ns/a", "1")]);
        let mut e = Engine::new(Incremental::Never, served);
        let (kind, out) = e.on_request(
            mk_request(SE, "2024-05-30 08:08:05.123 +0000 UTC m=+0.1"),
            Some(&snap),
        );
        assert_eq!(kind, Ack::Subscribe);
        let out = out.expect("full state");
        assert_eq!(out.type_key, SE);
        assert_eq!(names_of(&out), vec!["ns/a"]);
        assert_eq!(out.version, snap.version);
    }

    #[test]
    fn unknown_types_get_one_empty_answer() {
        let mut e = Engine::new(Incremental::Never, served);
        let (_, out) = e.on_request(
            mk_request("networking.istio.io/v1/VirtualService", "x"),
            None,
        );
        let out = out.expect("empty answer even before sync");
        assert!(out.resources.is_empty() && !out.served);
        let (kind, again) = e.on_request(
            mk_request("networking.istio.io/v1/VirtualService", &out.nonce),
            None,
        );
        assert_eq!(kind, Ack::Ack);
        assert!(again.is_none());
        assert!(e.on_snapshot(&mk_snapshot(&[("ns/a", "1")])).is_empty());
    }

    #[test]
    fn served_type_waits_for_the_first_sync() {
        let mut e = Engine::new(Incremental::Never, served);
        let (_, out) = e.on_request(mk_request(SE, ""), None);
        assert!(out.is_none());
        let out = e.on_snapshot(&mk_snapshot(&[]));
        assert_eq!(
            out.len(),
            1,
            "an empty registry is still answered once synced"
        );
    }

    #[test]
    fn one_in_flight_then_newest_after_ack() {
        let s1 = mk_snapshot(&[("ns/a", "1")]);
        let s2 = mk_snapshot(&[("ns/a", "2")]);
        let s3 = mk_snapshot(&[("ns/a", "3")]);
        let mut e = Engine::new(Incremental::Never, served);
        let (_, out) = e.on_request(mk_request(SE, ""), Some(&s1));
        let n1 = out.expect("first").nonce;
        assert!(e.on_snapshot(&s2).is_empty(), "waits for the ACK");
        // A stale nonce changes nothing.
        let (kind, out) = e.on_request(mk_request(SE, "999"), Some(&s3));
        assert_eq!(kind, Ack::Stale);
        assert!(out.is_none());
        let (kind, out) = e.on_request(mk_request(SE, &n1), Some(&s3));
        assert_eq!(kind, Ack::Ack);
        assert_eq!(out.expect("newest").version, s3.version);
    }

    #[test]
    fn nacked_snapshot_is_not_resent() {
        let s1 = mk_snapshot(&[("ns/a", "1")]);
        let s2 = mk_snapshot(&[("ns/a", "2")]);
        let mut e = Engine::new(Incremental::Never, served);
        let (_, out) = e.on_request(mk_request(SE, ""), Some(&s1));
        let mut nack = mk_request(SE, &out.expect("first").nonce);
        nack.error = Some("could not apply".into());
        let (kind, out) = e.on_request(nack, Some(&s1));
        assert_eq!(kind, Ack::Nack("could not apply".into()));
        assert!(out.is_none(), "the NACKed set is not resent");
        assert_eq!(e.on_snapshot(&s2).len(), 1, "a newer one is");
    }

    #[test]
    fn incremental_sends_changes_and_removals() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let s2 = mk_snapshot(&[("ns/b", "2"), ("ns/c", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(mk_request(SE, ""), Some(&s1));
        let first = out.expect("first");
        assert!(!first.incremental, "first response is the full state");
        assert_eq!(first.resources.len(), 2);
        let (_, none) = e.on_request(mk_request(SE, &first.nonce), Some(&s1));
        assert!(none.is_none());
        let out = e.on_snapshot(&s2).pop().expect("delta");
        assert!(out.incremental);
        assert_eq!(names_of(&out), vec!["ns/b", "ns/c"]);
        assert_eq!(out.removed, vec!["ns/a"]);
    }

    #[test]
    fn nack_of_incremental_keeps_the_acked_base() {
        let s1 = mk_snapshot(&[("ns/a", "1")]);
        let s2 = mk_snapshot(&[("ns/a", "2")]);
        let s3 = mk_snapshot(&[("ns/a", "2"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(mk_request(SE, ""), Some(&s1));
        e.on_request(mk_request(SE, &out.expect("1").nonce), Some(&s1));
        let out = e.on_snapshot(&s2).pop().expect("2");
        let mut nack = mk_request(SE, &out.nonce);
        nack.error = Some("no".into());
        e.on_request(nack, Some(&s2));
        let out = e.on_snapshot(&s3).pop().expect("3");
        // The sink never applied s2, so a/2 is sent again alongside b.
        assert_eq!(names_of(&out), vec!["ns/a", "ns/b"]);
    }

    #[test]
    fn legacy_incremental_only_when_asked_and_initial_versions() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::IfRequested, served);
        let mut req = mk_request(SE, "");
        req.incremental = true;
        req.initial_versions = [
            ("ns/a".to_string(), "1".to_string()),
            ("ns/z".into(), "1".into()),
        ]
        .into();
        let (_, out) = e.on_request(req, Some(&s1));
        let out = out.expect("delta against what the sink holds");
        assert!(out.incremental);
        assert_eq!(names_of(&out), vec!["ns/b"]);
        assert_eq!(out.removed, vec!["ns/z"]);

        let mut e = Engine::new(Incremental::IfRequested, served);
        let (_, out) = e.on_request(mk_request(SE, ""), Some(&s1));
        let out = out.expect("full");
        assert!(!out.incremental);
        let s2 = mk_snapshot(&[("ns/a", "1")]);
        e.on_request(mk_request(SE, &out.nonce), Some(&s1));
        let out = e.on_snapshot(&s2).pop().expect("full again");
        assert!(!out.incremental);
        assert_eq!(names_of(&out), vec!["ns/a"]);
    }

    #[test]
    fn subscription_change_while_in_flight_is_kept_for_after_the_ack() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let mut req = mk_request(SE, "");
        req.names = Names::Delta {
            subscribe: vec!["ns/a".into()],
            unsubscribe: vec![],
        };
        let (_, out) = e.on_request(req, Some(&s1));
        let first = out.expect("ns/a");
        // Before the ACK, the client subscribes to ns/b without a nonce.
        let mut change = mk_request(SE, "");
        change.names = Names::Delta {
            subscribe: vec!["ns/b".into()],
            unsubscribe: vec![],
        };
        let (_, out) = e.on_request(change, Some(&s1));
        assert!(out.is_none(), "one response in flight");
        let (kind, out) = e.on_request(mk_request(SE, &first.nonce), Some(&s1));
        assert_eq!(kind, Ack::Ack);
        assert_eq!(names_of(&out.expect("ns/b after the ACK")), vec!["ns/b"]);
    }

    #[test]
    fn delta_subscription_change_amends_the_subscription() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let s2 = mk_snapshot(&[("ns/a", "2"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let mut req = mk_request(SE, "");
        req.names = Names::Delta {
            subscribe: vec!["ns/a".into()],
            unsubscribe: vec![],
        };
        let (_, out) = e.on_request(req, Some(&s1));
        e.on_request(mk_request(SE, &out.expect("a").nonce), Some(&s1));
        let mut more = mk_request(SE, "");
        more.names = Names::Delta {
            subscribe: vec!["ns/b".into()],
            unsubscribe: vec![],
        };
        let (_, out) = e.on_request(more, Some(&s1));
        let out = out.expect("b");
        assert_eq!(names_of(&out), vec!["ns/b"], "only the new name");
        assert!(out.removed.is_empty());
        e.on_request(mk_request(SE, &out.nonce), Some(&s1));
        // ns/a is still subscribed.
        let out = e.on_snapshot(&s2).pop().expect("a changed");
        assert_eq!(names_of(&out), vec!["ns/a"]);
    }

    #[test]
    fn resource_names_filter_and_resubscribe() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Never, served);
        let mut req = mk_request(SE, "");
        req.names = Names::Replace(vec!["ns/b".into()]);
        let (_, out) = e.on_request(req, Some(&s1));
        let out = out.expect("filtered");
        assert_eq!(names_of(&out), vec!["ns/b"]);
        let mut ack = mk_request(SE, &out.nonce);
        ack.names = Names::Replace(vec![]);
        let (_, out) = e.on_request(ack, Some(&s1));
        assert_eq!(names_of(&out.expect("widened")), vec!["ns/a", "ns/b"]);

        let mut e = Engine::new(Incremental::Always, served);
        let mut req = mk_request(SE, "");
        req.names = Names::Delta {
            subscribe: vec!["ns/a".into()],
            unsubscribe: vec![],
        };
        let (_, out) = e.on_request(req, Some(&s1));
        let out = out.expect("one");
        assert_eq!(names_of(&out), vec!["ns/a"]);
        let mut ack = mk_request(SE, &out.nonce);
        ack.names = Names::Delta {
            subscribe: vec!["ns/b".into()],
            unsubscribe: vec![],
        };
        let (_, out) = e.on_request(ack, Some(&s1));
        assert_eq!(names_of(&out.expect("added")), vec!["ns/b"]);
    }
}
