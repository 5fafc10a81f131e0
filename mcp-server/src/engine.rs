//! Per-stream subscription state shared by every protocol.
//!
//! Each RPC (xDS SotW, delta xDS, legacy MCP, the legacy aggregated services) decodes its requests
//! into a [`Request`] and encodes [`Outgoing`] responses; the rules live here once:
//! - the first request for a type on a stream is a subscription, whatever its nonce (istiod's adsc
//!   sends a made-up timestamp nonce on its initial requests);
//! - a request whose nonce matches the response in flight is its ACK, or its NACK if it carries an
//!   error; any other nonce is stale: SotW ignores the whole request, delta still applies its
//!   subscription change (see [`Engine::on_request`]);
//! - one response per type is in flight; a newer snapshot waits for the ACK, and only the newest
//!   one is sent then (slow sinks coalesce by themselves);
//! - a NACKed snapshot is not sent again;
//! - types we do not serve get one empty response (istiod is not ready until every type it asked
//!   for was answered);
//! - full-state responses carry everything; incremental ones carry changes and removals relative
//!   to what the sink acknowledged.
//!
//! What a stream holds is bounded ([`StreamLimits`], checked by [`Engine::check`] before a
//! request is applied): at most so many types, type URLs, resource names, versions and node ids
//! of at most so many bytes each, per served type at most so many resource names (subscribed or
//! declared held), and at most so many bytes of all the sink's strings it keeps together (delta
//! subscriptions add up across requests: counting names alone lets long ones through). A
//! full-state type keeps no set at all between responses (only its version); an incremental one
//! keeps what the sink holds and what it was sent, and once a newer set is published while it
//! waits for an ACK, only their names and versions (see [`Known::forget_resources`]): a slow
//! sink never keeps an old set's resources alive.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use super::limits::StreamLimits;
use super::sync_status::{TypeRecord, TypeSync};
use mcp_core::cache::{diff, Entry, Known, Snapshot};

mod bounds;
use bounds::declared_bytes;

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
    /// Bytes of the node id the request carries (0 without one): only its length is checked
    /// here, the id itself is logged clipped and never kept.
    pub node_id_len: usize,
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

/// The resource names a sink is subscribed to for one type.
///
/// The wildcard (`*`) and explicit names are kept apart because the delta protocol lets a sink
/// hold both and drop either: unsubscribing `*` must leave the explicitly subscribed names, and
/// unsubscribing a name while `*` is held must not end the wildcard.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Subscription {
    /// Every resource (`*`, or the legacy empty first request).
    wildcard: bool,
    /// Names subscribed explicitly (delta keeps them even while `wildcard` is set; SotW does not
    /// need to, as each request restates the whole list).
    names: BTreeSet<String>,
    /// Bytes of `names`, kept as they change: `--max-stream-bytes` is checked on every request.
    bytes: usize,
}

impl Subscription {
    fn covers(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

/// Version recorded for a name whose state must be sent again: no entry has an empty version, so
/// the next diff sends the entry if it exists and reports the name removed if it does not.
const RESEND: &str = "";

/// A served type, on one stream.
#[derive(Debug)]
struct TypeState {
    incremental: bool,
    /// What the sink asked for.
    sub: Subscription,
    in_flight: Option<String>,
    /// When the response in flight was sent.
    sent_at: Option<Instant>,
    /// What the sink holds once the response in flight is ACKed (incremental types only).
    next_known: Known,
    /// What the sink acknowledged (incremental types only).
    known: Known,
    sent_version: Option<String>,
    nacked_version: Option<String>,
    /// Something other than the snapshot (names) changed: send even if the version is the same.
    dirty: bool,
    /// At least one response went out.
    answered: bool,
    /// Bytes of the names and versions declared held on the first request; they count until
    /// the first response replaces them with a shared set.
    declared_bytes: usize,
    /// What was sent and acknowledged, for people (`/debug/syncz`); never decides anything.
    record: TypeRecord,
}

/// The subscription state of one stream.
#[derive(Debug)]
pub struct Engine {
    policy: Incremental,
    served: fn(&str) -> bool,
    limits: StreamLimits,
    /// Served types, by type URL (or collection).
    types: HashMap<String, TypeState>,
    /// Types we do not serve, by a hash of their type URL: each is answered once, empty, so all
    /// a stream keeps of one is its response in flight, never the (attacker-sized) URL.
    unserved: HashMap<u64, Unserved>,
    nonce: u64,
    /// How long the last ACK of a served type took (taken by [`Engine::take_ack_latency`]).
    ack_latency: Option<std::time::Duration>,
}

/// A type we do not serve, on one stream.
#[derive(Debug)]
struct Unserved {
    /// Nonce of the empty answer, until it is acknowledged.
    in_flight: Option<u64>,
    /// When it was sent.
    sent_at: Option<Instant>,
}

fn type_hash(type_key: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(type_key.as_bytes())
}

impl Engine {
    /// A new stream with the default limits; `served` says which type keys carry
    /// ServiceEntries.
    pub fn new(policy: Incremental, served: fn(&str) -> bool) -> Self {
        Self::with_limits(policy, served, StreamLimits::default())
    }

    /// A new stream with `limits`.
    pub fn with_limits(
        policy: Incremental,
        served: fn(&str) -> bool,
        limits: StreamLimits,
    ) -> Self {
        Self {
            policy,
            served,
            limits,
            types: HashMap::new(),
            unserved: HashMap::new(),
            nonce: 0,
            ack_latency: None,
        }
    }

    /// When the oldest response still waiting for its ACK was sent.
    pub fn oldest_unacked(&self) -> Option<Instant> {
        let served = self.types.values().filter_map(|s| s.sent_at);
        let unserved = self.unserved.values().filter_map(|u| u.sent_at);
        served.chain(unserved).min()
    }

    /// How long the response the last request acknowledged had waited for it (served types),
    /// once.
    pub fn take_ack_latency(&mut self) -> Option<std::time::Duration> {
        self.ack_latency.take()
    }

    /// Where each served type stands (what was sent, acknowledged, rejected), by type URL.
    pub fn sync_status(&self) -> Vec<TypeSync> {
        let mut all: Vec<TypeSync> = self
            .types
            .iter()
            .map(|(k, s)| TypeSync {
                type_url: k.clone(),
                state: s.record.state(),
                record: s.record.clone(),
            })
            .collect();
        all.sort_by(|a, b| a.type_url.cmp(&b.type_url));
        all
    }

    /// [`Engine::on_request`] for a type we do not serve: the first request (whatever its nonce),
    /// or a fresh SotW one with nothing in flight, gets one empty answer; the rest are its ACK or
    /// NACK, or stale.
    fn on_unserved(&mut self, req: Request) -> (Ack, Option<Outgoing>) {
        let delta = matches!(req.names, Names::Delta { .. });
        match self.unserved.get_mut(&type_hash(&req.type_key)) {
            Some(u) if req.nonce.is_empty() && (u.in_flight.is_some() || delta) => {
                let kind = if u.in_flight.is_some() {
                    Ack::Stale
                } else {
                    Ack::Subscribe
                };
                (kind, None)
            }
            Some(u) if !req.nonce.is_empty() => {
                if u.in_flight.map(|n| n.to_string()).as_deref() != Some(req.nonce.as_str()) {
                    return (Ack::Stale, None);
                }
                u.in_flight = None;
                u.sent_at = None;
                match req.error {
                    Some(e) => (Ack::Nack(e), None),
                    None => (Ack::Ack, None),
                }
            }
            _ => {
                self.nonce += 1;
                let unserved = Unserved {
                    in_flight: Some(self.nonce),
                    sent_at: Some(Instant::now()),
                };
                self.unserved.insert(type_hash(&req.type_key), unserved);
                let out = Outgoing {
                    type_key: req.type_key,
                    version: "0".into(),
                    nonce: self.nonce.to_string(),
                    resources: Vec::new(),
                    removed: Vec::new(),
                    incremental: false,
                    served: false,
                };
                (Ack::Subscribe, Some(out))
            }
        }
    }

    /// Handles a request; returns what it was and the response to send, if any.
    ///
    /// A request with a stale nonce is treated differently by the two protocol families:
    /// - SotW (`Names::Replace`, `Names::Unchanged`): ignored entirely. Each SotW request restates
    ///   the sink's whole subscription, and the sink answers the response in flight with a request
    ///   carrying its current `resource_names`; so a stale request's names are superseded and
    ///   nothing is lost by dropping them (the spec's "should not send a response for a stale
    ///   nonce").
    /// - delta (`Names::Delta`): its subscription change is applied and only its ACK/NACK part is
    ///   ignored. Delta requests carry changes, not the whole set, so a dropped change is never
    ///   repeated by the sink; the spec says the server "must honor changes to the subscription
    ///   state even if the nonce is stale" (go-control-plane does the same).
    pub fn on_request(
        &mut self,
        req: Request,
        snapshot: Option<&Arc<Snapshot>>,
    ) -> (Ack, Option<Outgoing>) {
        if !(self.served)(&req.type_key) {
            return self.on_unserved(req);
        }
        let policy = self.policy;
        let kind = match self.types.get_mut(&req.type_key) {
            Some(state)
                if req.nonce.is_empty()
                    && (state.in_flight.is_some() || matches!(req.names, Names::Delta { .. })) =>
            {
                // A subscription change (delta clients send these without a nonce) amends the
                // subscription; while a response is in flight, the ACK of that response sends
                // the result.
                apply_names(state, &req.names, false);
                if state.in_flight.is_some() {
                    return (Ack::Stale, None);
                }
                Ack::Subscribe
            }
            Some(state) if !req.nonce.is_empty() => {
                if state.in_flight.as_deref() != Some(req.nonce.as_str()) {
                    if !matches!(req.names, Names::Delta { .. }) {
                        return (Ack::Stale, None);
                    }
                    apply_names(state, &req.names, false);
                    if state.in_flight.is_some() {
                        // The ACK of the response in flight sends the result.
                        return (Ack::Stale, None);
                    }
                    let out = self.try_send(&req.type_key, snapshot);
                    return (Ack::Stale, out);
                }
                state.in_flight = None;
                let sent_at = state.sent_at.take();
                let kind = match req.error {
                    Some(e) => {
                        state.nacked_version = state.sent_version.clone();
                        state.next_known = state.known.clone();
                        state.record.nacked(&e);
                        Ack::Nack(e)
                    }
                    None => {
                        state.known = std::mem::replace(&mut state.next_known, Known::Nothing);
                        state.next_known = state.known.clone();
                        state.record.acked();
                        self.ack_latency = sent_at.map(|t| t.elapsed());
                        Ack::Ack
                    }
                };
                apply_names(state, &req.names, false);
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
                let declared_bytes = declared_bytes(&req.initial_versions);
                let known = if incremental && !req.initial_versions.is_empty() {
                    Known::Versions(req.initial_versions)
                } else {
                    Known::Nothing
                };
                let mut state = TypeState {
                    incremental,
                    // Protocols that name no resources (`Names::Unchanged`) get everything.
                    sub: Subscription {
                        wildcard: true,
                        names: BTreeSet::new(),
                        bytes: 0,
                    },
                    in_flight: None,
                    sent_at: None,
                    next_known: known.clone(),
                    known,
                    sent_version: None,
                    nacked_version: None,
                    dirty: true,
                    answered: false,
                    declared_bytes,
                    record: TypeRecord::default(),
                };
                apply_names(&mut state, &req.names, true);
                self.types.insert(req.type_key.clone(), state);
                Ack::Subscribe
            }
        };
        let out = self.try_send(&req.type_key, snapshot);
        (kind, out)
    }

    /// A new snapshot was published: responses for every served type that can take one.
    ///
    /// A type still waiting for the ACK of an earlier response keeps only the names and versions
    /// of the sets it holds from now on: they are older than the newest, and a sink slow to ACK
    /// must not keep their resources alive.
    pub fn on_snapshot(&mut self, snapshot: &Arc<Snapshot>) -> Vec<Outgoing> {
        for state in self.types.values_mut() {
            if state.in_flight.is_some() {
                state.known.forget_resources();
                state.next_known.forget_resources();
            }
        }
        let keys: Vec<String> = self.types.keys().cloned().collect();
        keys.iter()
            .filter_map(|k| self.try_send(k, Some(snapshot)))
            .collect()
    }

    fn try_send(&mut self, type_key: &str, snapshot: Option<&Arc<Snapshot>>) -> Option<Outgoing> {
        let state = self.types.get_mut(type_key)?;
        if state.in_flight.is_some() {
            return None;
        }
        // Until the first registry sync there is nothing true to say: an empty answer would make
        // a reconnecting istiod delete everything this source gave it before.
        let snapshot = snapshot?;
        let same = state.sent_version.as_deref() == Some(snapshot.version.as_str());
        let nacked = state.nacked_version.as_deref() == Some(snapshot.version.as_str());
        if !state.dirty && (same || nacked) {
            return None;
        }
        let view = filtered(snapshot, &state.sub);
        let incremental_now =
            state.incremental && (state.answered || matches!(state.known, Known::Versions(_)));
        let (resources, removed) = if incremental_now {
            let (up, rm) = diff(&state.known, &view);
            if up.is_empty() && rm.is_empty() && state.answered {
                state.sent_version = Some(snapshot.version.clone());
                state.record.unchanged(&snapshot.version);
                state.dirty = false;
                return None;
            }
            (up, rm)
        } else {
            (view.iter().cloned().collect(), Vec::new())
        };
        self.nonce += 1;
        let nonce = self.nonce.to_string();
        state.in_flight = Some(nonce.clone());
        state.sent_at = Some(Instant::now());
        // A full-state response needs nothing of what was sent before: only incremental types
        // remember the set.
        state.next_known = if state.incremental {
            Known::Snapshot(view)
        } else {
            Known::Nothing
        };
        state.sent_version = Some(snapshot.version.clone());
        state.record.sent(&snapshot.version);
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

/// Applies a request's subscription change; `first` is the first request for the type on the
/// stream (the only one that may subscribe to everything by naming nothing).
fn apply_names(state: &mut TypeState, names: &Names, first: bool) {
    match names {
        Names::Unchanged => {}
        Names::Replace(list) => {
            // SotW restates the whole list each time, and an empty list has always meant
            // everything to the sinks this serves, so explicit names are only kept when they
            // filter.
            let wildcard = list.is_empty() || list.iter().any(|n| n == "*");
            let names: BTreeSet<String> = if wildcard {
                BTreeSet::new()
            } else {
                list.iter().cloned().collect()
            };
            let new = Subscription {
                wildcard,
                bytes: names.iter().map(String::len).sum(),
                names,
            };
            if new != state.sub {
                state.sub = new;
                state.dirty = true;
            }
        }
        Names::Delta {
            subscribe,
            unsubscribe,
        } => apply_delta(state, subscribe, unsubscribe, first),
    }
}

/// Applies a delta subscription change and adjusts what the sink is taken to hold, following the
/// incremental section of the xDS protocol:
/// - only the first request may subscribe to everything by leaving `resource_names_subscribe`
///   empty (the legacy wildcard); later requests change the wildcard only through `*`;
/// - every name in `resource_names_subscribe` is sent again (or reported removed if it does not
///   exist), even if the sink seems to hold it: the sink may have forgotten it, and a missing
///   name is how the sink learns a resource does not exist. On the first request, names the sink
///   declared in `initial_resource_versions` are not resent: avoiding that is their purpose;
/// - an unsubscribed name is forgotten without a removal (the sink dropped it itself), unless
///   `*` is still held: the sink cannot tell whether the wildcard covers the name, so its state
///   is sent again (the resource, or its removal);
/// - unsubscribing `*` forgets everything but the explicit names, again without removals, so
///   the sink is not told to delete names it still holds.
fn apply_delta(state: &mut TypeState, subscribe: &[String], unsubscribe: &[String], first: bool) {
    let before = state.sub.clone();
    let mut resend: BTreeSet<&str> = BTreeSet::new();
    if first {
        state.sub.wildcard = subscribe.is_empty();
    }
    for n in subscribe {
        if n == "*" {
            state.sub.wildcard = true;
            continue;
        }
        if state.sub.names.insert(n.clone()) {
            state.sub.bytes += n.len();
        }
        if !(first && known_has(&state.known, n)) {
            resend.insert(n);
        }
    }
    let mut dropped: Vec<&str> = Vec::new();
    for n in unsubscribe {
        if n == "*" {
            state.sub.wildcard = false;
        } else if state.sub.names.remove(n) {
            state.sub.bytes -= n.len();
            dropped.push(n);
        }
        // Anything else is a phantom unsubscription: nothing to do.
    }
    if state.sub.wildcard {
        resend.extend(dropped);
    }
    // Without the wildcard, the sink holds (and is told about) only what it names.
    let keep = (!state.sub.wildcard).then_some(&state.sub.names);
    let amended_known = amend(&mut state.known, &resend, keep);
    let amended_next = amend(&mut state.next_known, &resend, keep);
    if before != state.sub || amended_known || amended_next {
        state.dirty = true;
    }
}

/// Whether the sink is taken to hold `name` (on a first request: declared it in
/// `initial_resource_versions`).
fn known_has(known: &Known, name: &str) -> bool {
    known.version(name).is_some()
}

/// Marks `resend` as to be sent again and, if `keep` is given, forgets every other name not in
/// it; returns whether anything changed. What the sink holds is only rewritten into a map when
/// something changes: on a wildcard stream it is usually a whole shared snapshot.
fn amend(known: &mut Known, resend: &BTreeSet<&str>, keep: Option<&BTreeSet<String>>) -> bool {
    let outside = |name: &str| keep.is_some_and(|k| !k.contains(name));
    // Without `keep` nothing is outside: no need to look at every name held.
    let needs_pruning = keep.is_some() && known.pairs().any(|(n, _)| outside(n));
    let resend: Vec<&str> = resend.iter().copied().filter(|n| !outside(n)).collect();
    if resend.is_empty() && !needs_pruning {
        return false;
    }
    let mut map: BTreeMap<String, String> = match std::mem::replace(known, Known::Nothing) {
        Known::Versions(mut m) => {
            m.retain(|n, _| !outside(n));
            m
        }
        other => other
            .pairs()
            .filter(|(n, _)| !outside(n))
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
    };
    for n in resend {
        map.insert(n.to_string(), RESEND.to_string());
    }
    *known = Known::Versions(map);
    true
}

/// What of `snapshot` the subscription covers: the snapshot itself for a wildcard, else the named
/// entries, looked up one by one when they are few (a sink naming ten resources out of 100k does
/// not pay for a walk over all of them at every change).
fn filtered(snapshot: &Arc<Snapshot>, sub: &Subscription) -> Arc<Snapshot> {
    if sub.wildcard {
        return Arc::clone(snapshot);
    }
    let entries = if sub.names.len() < snapshot.len() / 8 {
        sub.names
            .iter()
            .filter_map(|n| snapshot.get(n))
            .cloned()
            .collect()
    } else {
        snapshot
            .iter()
            .filter(|e| sub.covers(&e.name))
            .cloned()
            .collect()
    };
    Arc::new(Snapshot::new(entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Refused;
    use mcp_core::testing::mk_entry;

    const SE: &str = "networking.istio.io/v1/ServiceEntry";

    fn served(t: &str) -> bool {
        t == SE
    }

    fn mk_snapshot(items: &[(&str, &str)]) -> Arc<Snapshot> {
        Arc::new(Snapshot::new(
            items.iter().map(|(n, v)| mk_entry(n, v)).collect(),
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
            node_id_len: 0,
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
        let req = delta_request("", &["ns/a"], &[]);
        let (_, out) = e.on_request(req, Some(&s1));
        let first = out.expect("ns/a");
        // Before the ACK, the client subscribes to ns/b without a nonce.
        let change = delta_request("", &["ns/b"], &[]);
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
        let req = delta_request("", &["ns/a"], &[]);
        let (_, out) = e.on_request(req, Some(&s1));
        e.on_request(mk_request(SE, &out.expect("a").nonce), Some(&s1));
        let more = delta_request("", &["ns/b"], &[]);
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
        let req = delta_request("", &["ns/a"], &[]);
        let (_, out) = e.on_request(req, Some(&s1));
        let out = out.expect("one");
        assert_eq!(names_of(&out), vec!["ns/a"]);
        let ack = delta_request(&out.nonce, &["ns/b"], &[]);
        let (_, out) = e.on_request(ack, Some(&s1));
        assert_eq!(names_of(&out.expect("added")), vec!["ns/b"]);
    }

    fn delta(subscribe: &[&str], unsubscribe: &[&str]) -> Names {
        Names::Delta {
            subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
            unsubscribe: unsubscribe.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn delta_request(nonce: &str, subscribe: &[&str], unsubscribe: &[&str]) -> Request {
        let mut req = mk_request(SE, nonce);
        req.names = delta(subscribe, unsubscribe);
        req
    }

    /// A delta ACK of `out`, as clients send it (no subscription change).
    fn delta_ack(e: &mut Engine, out: &Outgoing, snap: &Arc<Snapshot>) -> Option<Outgoing> {
        let (kind, next) = e.on_request(delta_request(&out.nonce, &[], &[]), Some(snap));
        assert_eq!(kind, Ack::Ack);
        next
    }

    #[test]
    fn unsubscribing_the_wildcard_keeps_the_explicit_names() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let s2 = mk_snapshot(&[("ns/a", "2"), ("ns/b", "2")]);
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(delta_request("", &[], &[]), Some(&s1));
        let out = out.expect("legacy wildcard: everything");
        assert_eq!(names_of(&out), vec!["ns/a", "ns/b"]);
        assert!(delta_ack(&mut e, &out, &s1).is_none());
        // Subscribing to ns/a while holding `*` resends it (the spec requires it) ...
        let (_, out) = e.on_request(delta_request("", &["ns/a"], &[]), Some(&s1));
        let out = out.expect("ns/a again");
        assert_eq!(names_of(&out), vec!["ns/a"]);
        assert!(out.removed.is_empty());
        assert!(delta_ack(&mut e, &out, &s1).is_none());
        // ... and dropping `*` leaves it: nothing to say, in particular no removal of ns/a (the
        // sink still holds it) nor of ns/b (the sink dropped it with the wildcard).
        let (_, out) = e.on_request(delta_request("", &[], &["*"]), Some(&s1));
        assert!(out.is_none(), "{out:?}");
        let out = e.on_snapshot(&s2).pop().expect("ns/a changed");
        assert_eq!(
            names_of(&out),
            vec!["ns/a"],
            "only the name still subscribed"
        );
        assert!(out.removed.is_empty());
    }

    #[test]
    fn explicit_names_survive_a_wildcard_subscribed_alongside() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1"), ("ns/c", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(delta_request("", &["ns/a"], &[]), Some(&s1));
        let out = out.expect("ns/a");
        assert_eq!(names_of(&out), vec!["ns/a"]);
        assert!(delta_ack(&mut e, &out, &s1).is_none());
        let (_, out) = e.on_request(delta_request("", &["*"], &[]), Some(&s1));
        let out = out.expect("the rest");
        assert_eq!(names_of(&out), vec!["ns/b", "ns/c"], "ns/a is held already");
        assert!(delta_ack(&mut e, &out, &s1).is_none());
        let (_, out) = e.on_request(delta_request("", &[], &["*"]), Some(&s1));
        assert!(out.is_none(), "no removals: {out:?}");
        let s2 = mk_snapshot(&[("ns/b", "2"), ("ns/c", "2")]);
        let out = e.on_snapshot(&s2).pop().expect("ns/a deleted");
        assert!(out.resources.is_empty(), "{out:?}");
        assert_eq!(out.removed, vec!["ns/a"]);
    }

    #[test]
    fn only_the_first_request_can_be_a_legacy_wildcard() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        // Before the first sync nothing is answered, so the sink's second request (unsubscribing
        // only) comes before any response.
        let (_, out) = e.on_request(delta_request("", &["ns/a"], &[]), None);
        assert!(out.is_none());
        let (_, out) = e.on_request(delta_request("", &[], &["ns/zzz"]), None);
        assert!(out.is_none());
        let out = e.on_snapshot(&s1).pop().expect("first answer");
        assert_eq!(names_of(&out), vec!["ns/a"], "still only ns/a");

        // Unsubscribing the last name leaves nothing subscribed, not everything.
        let mut e = Engine::new(Incremental::Always, served);
        e.on_request(delta_request("", &["ns/a"], &[]), None);
        e.on_request(delta_request("", &[], &["ns/a"]), None);
        let out = e.on_snapshot(&s1).pop().expect("first answer");
        assert!(out.resources.is_empty(), "{out:?}");
    }

    #[test]
    fn delta_subscription_change_with_a_stale_nonce_is_applied() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let s2 = mk_snapshot(&[("ns/a", "2"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(delta_request("", &["ns/a"], &[]), Some(&s1));
        let first = out.expect("ns/a");
        assert!(delta_ack(&mut e, &first, &s1).is_none());
        let second = e.on_snapshot(&s2).pop().expect("ns/a changed");
        // The sink subscribes to ns/b quoting the nonce of the response it last handled.
        let (kind, out) = e.on_request(delta_request(&first.nonce, &["ns/b"], &[]), Some(&s2));
        assert_eq!(kind, Ack::Stale, "not an ACK of the response in flight");
        assert!(out.is_none(), "one response in flight");
        let out = delta_ack(&mut e, &second, &s2).expect("ns/b after the ACK");
        assert_eq!(names_of(&out), vec!["ns/b"]);

        // With nothing in flight the change is answered at once.
        assert!(delta_ack(&mut e, &out, &s2).is_none());
        let mut stale = delta_request(&first.nonce, &[], &["ns/a", "ns/b"]);
        stale.error = Some("an old rejection".into());
        let (kind, out) = e.on_request(stale, Some(&s2));
        assert_eq!(kind, Ack::Stale, "the NACK part is ignored");
        assert!(out.is_none(), "unsubscribing needs no answer");
        assert!(e.on_snapshot(&mk_snapshot(&[("ns/a", "3")])).is_empty());
    }

    #[test]
    fn sotw_request_with_a_stale_nonce_is_ignored() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let s2 = mk_snapshot(&[("ns/a", "2"), ("ns/b", "2")]);
        let mut e = Engine::new(Incremental::Never, served);
        let mut req = mk_request(SE, "");
        req.names = Names::Replace(vec!["ns/a".into()]);
        let (_, out) = e.on_request(req, Some(&s1));
        let first = out.expect("ns/a");
        let mut ack = mk_request(SE, &first.nonce);
        ack.names = Names::Replace(vec!["ns/a".into()]);
        e.on_request(ack, Some(&s1));
        let second = e.on_snapshot(&s2).pop().expect("ns/a changed");
        // Superseded by the ACK of `second`, which restates the list.
        let mut stale = mk_request(SE, &first.nonce);
        stale.names = Names::Replace(vec!["ns/b".into()]);
        let (kind, out) = e.on_request(stale, Some(&s2));
        assert_eq!(kind, Ack::Stale);
        assert!(out.is_none());
        let mut ack = mk_request(SE, &second.nonce);
        ack.names = Names::Replace(vec!["ns/a".into()]);
        let (kind, out) = e.on_request(ack, Some(&s2));
        assert_eq!(kind, Ack::Ack);
        assert!(out.is_none(), "still ns/a only: {out:?}");
    }

    #[test]
    fn unsubscribed_names_are_not_reported_removed() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(delta_request("", &["ns/a", "ns/b"], &[]), Some(&s1));
        let out = out.expect("both");
        assert_eq!(names_of(&out), vec!["ns/a", "ns/b"]);
        assert!(delta_ack(&mut e, &out, &s1).is_none());
        let (_, out) = e.on_request(delta_request("", &[], &["ns/b"]), Some(&s1));
        assert!(out.is_none(), "the sink dropped ns/b itself: {out:?}");
        // Subscribing again sends it again, though its version did not change.
        let (_, out) = e.on_request(delta_request("", &["ns/b"], &[]), Some(&s1));
        let out = out.expect("ns/b again");
        assert_eq!(names_of(&out), vec!["ns/b"]);
        assert!(out.removed.is_empty());
    }

    #[test]
    fn unsubscribing_a_name_also_under_the_wildcard_resends_its_state() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(delta_request("", &["*", "ns/a", "ns/x"], &[]), Some(&s1));
        let out = out.expect("everything");
        assert_eq!(names_of(&out), vec!["ns/a", "ns/b"]);
        assert_eq!(out.removed, vec!["ns/x"], "ns/x does not exist");
        assert!(delta_ack(&mut e, &out, &s1).is_none());
        // The sink cannot tell whether `*` covers ns/a and ns/x: the server says.
        let (_, out) = e.on_request(delta_request("", &[], &["ns/a", "ns/x"]), Some(&s1));
        let out = out.expect("their state");
        assert_eq!(names_of(&out), vec!["ns/a"], "still there under `*`");
        assert_eq!(out.removed, vec!["ns/x"]);
    }

    #[test]
    fn subscribing_to_a_missing_name_reports_it_removed() {
        let s1 = mk_snapshot(&[("ns/a", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(delta_request("", &["ns/a"], &[]), Some(&s1));
        assert!(delta_ack(&mut e, &out.expect("ns/a"), &s1).is_none());
        let (_, out) = e.on_request(delta_request("", &["ns/zzz"], &[]), Some(&s1));
        let out = out.expect("the sink learns ns/zzz does not exist");
        assert!(out.resources.is_empty());
        assert_eq!(out.removed, vec!["ns/zzz"]);
        assert!(delta_ack(&mut e, &out, &s1).is_none());
        // When it appears, it is sent.
        let s2 = mk_snapshot(&[("ns/a", "1"), ("ns/zzz", "1")]);
        let out = e.on_snapshot(&s2).pop().expect("ns/zzz created");
        assert_eq!(names_of(&out), vec!["ns/zzz"]);
    }

    #[test]
    fn initial_versions_of_subscribed_names_are_not_resent() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let mut e = Engine::new(Incremental::Always, served);
        let mut req = delta_request("", &["ns/a", "ns/b"], &[]);
        req.initial_versions = [("ns/a".to_string(), "1".to_string())].into();
        let (_, out) = e.on_request(req, Some(&s1));
        let out = out.expect("ns/b");
        assert_eq!(names_of(&out), vec!["ns/b"], "ns/a is up to date");
        assert!(out.removed.is_empty());
    }

    #[test]
    fn full_state_types_keep_no_set_between_responses() {
        let s1 = mk_snapshot(&[("ns/a", "1")]);
        let s2 = mk_snapshot(&[("ns/a", "2")]);
        let held = s1.get("ns/a").map(Arc::clone).expect("a");
        let mut e = Engine::new(Incremental::Never, served);
        let (_, out) = e.on_request(mk_request(SE, ""), Some(&s1));
        let out = out.expect("full");
        e.on_request(mk_request(SE, &out.nonce), Some(&s1));
        let state = &e.types[SE];
        assert!(matches!(state.known, Known::Nothing), "{:?}", state.known);
        assert!(matches!(state.next_known, Known::Nothing));
        drop((out, s1));
        assert_eq!(Arc::strong_count(&held), 1, "nothing of s1 is held");
        assert_eq!(e.on_snapshot(&s2).len(), 1, "the next set is still sent");
    }

    /// A delta stream waiting for an ACK while newer sets are published keeps only the names
    /// and versions of the sets it holds; the diffs it sends are the same as before.
    #[test]
    fn a_slow_incremental_stream_keeps_no_old_resources() {
        let s1 = mk_snapshot(&[("ns/a", "1"), ("ns/b", "1")]);
        let s2 = Arc::new(
            s1.with_changes(vec![("ns/a".into(), Some(mk_entry("ns/a", "2")))])
                .expect("changed"),
        );
        let s3 = Arc::new(
            s2.with_changes(vec![("ns/b".into(), None)])
                .expect("changed"),
        );
        let held = [s1.get("ns/a"), s2.get("ns/a")].map(|e| Arc::clone(e.expect("a")));
        let mut e = Engine::new(Incremental::Always, served);
        let (_, out) = e.on_request(mk_request(SE, ""), Some(&s1));
        let first = out.expect("full");
        assert!(delta_ack(&mut e, &first, &s1).is_none());
        let second = e.on_snapshot(&s2).pop().expect("a changed");
        assert_eq!(names_of(&second), vec!["ns/a"]);
        // s3 is published while `second` waits for its ACK.
        assert!(e.on_snapshot(&s3).is_empty(), "one response in flight");
        let state = &e.types[SE];
        assert!(matches!(state.known, Known::Names(_)), "{:?}", state.known);
        assert!(matches!(state.next_known, Known::Names(_)));
        drop((first, second, s1, s2));
        for (i, h) in held.iter().enumerate() {
            // s2's ns/a is still in s3 (unchanged there); s1's is gone.
            let owners = if i == 0 { 1 } else { 2 };
            assert_eq!(Arc::strong_count(h), owners, "entry {i}");
        }
        let out = e
            .on_request(mk_request(SE, "2"), Some(&s3))
            .1
            .expect("b removed");
        assert!(out.resources.is_empty());
        assert_eq!(out.removed, vec!["ns/b"]);
    }

    #[test]
    fn unacked_age_is_the_oldest_response_in_flight() {
        let s1 = mk_snapshot(&[("ns/a", "1")]);
        let mut e = Engine::new(Incremental::Never, served);
        assert!(e.oldest_unacked().is_none());
        let before = Instant::now();
        let (_, out) = e.on_request(mk_request(SE, ""), Some(&s1));
        let first = e.oldest_unacked().expect("in flight");
        assert!(first >= before);
        e.on_request(mk_request("other/Type", ""), Some(&s1));
        assert_eq!(e.oldest_unacked(), Some(first), "the oldest of two");
        e.on_request(mk_request(SE, &out.expect("a").nonce), Some(&s1));
        assert!(e.oldest_unacked().expect("the other") >= first);
        e.on_request(mk_request("other/Type", "2"), Some(&s1));
        assert!(e.oldest_unacked().is_none());
    }

    #[test]
    fn limits_are_checked_before_anything_is_applied() {
        let limits = StreamLimits {
            max_types: 2,
            max_type_url_len: 40,
            max_names: 3,
            ..StreamLimits::default()
        };
        let mut e = Engine::with_limits(Incremental::Always, served, limits);
        let long = "x".repeat(41);
        assert_eq!(
            e.check(&mk_request(&long, "")),
            Err(Refused::TypeUrlLength { len: 41, limit: 40 })
        );
        for t in [SE, "other/A"] {
            assert_eq!(e.check(&mk_request(t, "")), Ok(()));
            e.on_request(mk_request(t, ""), None);
        }
        assert_eq!(
            e.check(&mk_request("other/B", "")),
            Err(Refused::TypesPerStream { limit: 2 })
        );
        assert_eq!(e.check(&mk_request(SE, "")), Ok(()), "a type it has");
        // Names of a served type: subscribed ones add up across delta requests.
        e.on_request(delta_request("", &["ns/a", "ns/b"], &[]), None);
        // The two names, and the same two marked to be sent (nothing was answered yet).
        assert_eq!(e.names_held(), 4);
        assert_eq!(
            e.check(&delta_request("", &["ns/a", "ns/c", "*"], &[])),
            Ok(())
        );
        assert_eq!(
            e.check(&delta_request("", &["ns/c", "ns/d"], &[])),
            Err(Refused::ResourceNames {
                type_url: SE.into(),
                count: 4,
                limit: 3
            })
        );
        let mut req = mk_request(SE, "");
        req.names = Names::Replace((0..4).map(|i| i.to_string()).collect());
        assert!(e.check(&req).is_err(), "SotW lists too");
        let mut fresh = Engine::with_limits(Incremental::Always, served, limits);
        let mut req = mk_request(SE, "");
        req.initial_versions = (0..4).map(|i| (i.to_string(), "1".to_string())).collect();
        assert!(fresh.check(&req).is_err(), "declared versions too");
        // A type we do not serve keeps none of its names, so they are not counted.
        let mut req = delta_request("", &["1", "2", "3", "4"], &[]);
        req.type_key = "other/A".into();
        assert_eq!(fresh.check(&req), Ok(()));
        let (_, out) = fresh.on_request(req, None);
        assert!(out.is_some_and(|o| !o.served), "answered empty");
        assert_eq!(fresh.names_held(), 0);
        assert!(fresh.types.is_empty(), "nor its type URL");
        assert_eq!(fresh.unserved.len(), 1);
    }

    /// #33: names, versions and node ids over their length, and a stream's bytes, are refused
    /// before anything is applied; delta subscriptions add up in bytes across requests, and
    /// names unsubscribed give their bytes back.
    #[test]
    fn long_strings_and_a_streams_bytes_are_checked() {
        let limits = StreamLimits {
            max_name_len: 16,
            max_node_id_len: 8,
            max_bytes: SE.len() + 40,
            ..StreamLimits::default()
        };
        let mut e = Engine::with_limits(Incremental::Always, served, limits);
        let mut req = delta_request("", &[&"n".repeat(17)], &[]);
        assert_eq!(
            e.check(&req),
            Err(Refused::ResourceNameLength { len: 17, limit: 16 })
        );
        req.names = Names::Unchanged;
        req.initial_versions = [("ns/a".to_string(), "v".repeat(20))].into();
        assert_eq!(
            e.check(&req),
            Err(Refused::ResourceNameLength { len: 20, limit: 16 }),
            "a declared version too"
        );
        let mut req = mk_request("other/A", "");
        req.names = delta(&[], &[&"n".repeat(17)]);
        assert!(
            e.check(&req).is_err(),
            "names of any type, unsubscribed too"
        );
        let mut req = mk_request(SE, "");
        req.node_id_len = 9;
        assert_eq!(
            e.check(&req),
            Err(Refused::NodeIdLength { len: 9, limit: 8 })
        );

        let ten = |p: &str| format!("ns/{p}-------")[..10].to_string();
        let (a, b, c, d, x) = (ten("a"), ten("b"), ten("c"), ten("d"), ten("x"));
        let req = delta_request("", &[&a, &b], &[]);
        assert_eq!(e.check(&req), Ok(()));
        e.on_request(req, None);
        assert_eq!(e.bytes_held(), SE.len() + 20);
        assert_eq!(
            e.check(&delta_request("", &[&a, &c, &d], &[])),
            Ok(()),
            "a is held"
        );
        assert_eq!(
            e.check(&delta_request("", &[&c, &d, &x], &[])),
            Err(Refused::StreamBytes {
                bytes: SE.len() + 50,
                limit: SE.len() + 40
            })
        );
        e.on_request(delta_request("", &[], &[&a]), None);
        assert_eq!(e.bytes_held(), SE.len() + 10, "given back");
        assert_eq!(e.check(&delta_request("", &[&c, &d, &x], &[])), Ok(()));

        // Declared versions count until the first answer; SotW lists replace.
        let mut fresh = Engine::with_limits(Incremental::Always, served, limits);
        let mut req = mk_request(SE, "");
        req.initial_versions = [
            (a.clone(), "1234567890123456".to_string()),
            (b.clone(), "vvvvv".into()),
        ]
        .into();
        assert_eq!(e.check(&req), Ok(()), "an existing type keeps none");
        assert_eq!(
            fresh.check(&req),
            Err(Refused::StreamBytes {
                bytes: SE.len() + 41,
                limit: SE.len() + 40
            })
        );
        let mut sotw = Engine::with_limits(Incremental::Never, served, limits);
        let mut req = mk_request(SE, "");
        req.names = Names::Replace(vec![a.clone(), b.clone(), c.clone(), d.clone()]);
        assert_eq!(sotw.check(&req), Ok(()));
        sotw.on_request(req, None);
        let mut req = mk_request(SE, "");
        req.names = Names::Replace(
            vec![x.clone(); 5]
                .into_iter()
                .enumerate()
                .map(|(i, n)| format!("{i}{}", &n[1..]))
                .collect(),
        );
        assert!(sotw.check(&req).is_err(), "50 bytes in place of 40");
        fresh.on_request(mk_request("other/A", ""), None);
        assert_eq!(fresh.bytes_held(), 0, "an unserved type keeps no URL");
    }
}
