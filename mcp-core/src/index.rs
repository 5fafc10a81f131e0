//! The single writer: registry events in, published snapshots out.
//!
//! Events are applied to a pending set; [`Index::flush`] translates only what changed (a re-listed
//! service whose content hash is unchanged costs a hash, not a translation), keeps the last good
//! version of a service that turned invalid, resolves resource-name collisions deterministically,
//! and builds a new [`Snapshot`] only when the served set actually differs. The served set is kept
//! per resource name as services change, and the names whose served entry may have changed are
//! remembered until the flush, which applies just those to the previous snapshot: one change costs
//! O(log n) here, not a walk over every name (at 100k services that walk was most of a change's
//! latency). The quarantine list is rebuilt only when an invalid service or a name collision
//! changed, from those alone.
//!
//! `--shards S` splits the served set into S snapshots (one per shard's gRPC port) from this one
//! index: translation, name collisions and virtual IPs are decided once for the whole set, and
//! each name goes to the shard of the key that wins it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use crate::cache::{encode, Change, Entry, Snapshot};
use crate::metrics::Metrics;
use crate::model::{Resolution, Service, ServiceKey};
use crate::registry::RegistryEvent;
use crate::shard::shard_of;
use crate::translate::OnEmpty;
use crate::translate::{translate, TranslateConfig};
use crate::vip::{needs_vip, QuarantinedVip, SavedVip, Vips};

/// The problems scope for services the `--vip-cidr` range had no room for.
const VIP_SCOPE: &str = "--vip-cidr";

/// A service that is not (or not currently) served as the registry describes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Quarantined {
    /// The service key.
    pub key: String,
    /// Where it came from.
    pub origin: String,
    /// Every reason, each naming the field.
    pub reasons: Vec<String>,
    /// Whether an earlier valid version is still served.
    pub serving_last_good: bool,
}

/// Registry objects the adapter skipped, by scope.
pub type Problems = BTreeMap<String, Vec<String>>;

#[derive(Debug)]
struct KeyState {
    /// Content hash of the service as the registry gave it (before its virtual IP).
    hash: u64,
    /// The virtual IP it was last given; with `hash`, what tells a re-listed service unchanged.
    vip: Option<Ipv4Addr>,
    /// The virtual IP in `entry`'s addresses, if it has one: what a move rewrites.
    entry_vip: Option<Ipv4Addr>,
    origin: String,
    /// The last valid version (served unless another key owns the name).
    entry: Option<Arc<Entry>>,
    /// Validation errors of the current registry content.
    invalid: Option<Vec<String>>,
}

/// Current services of one source, owned by the runtime's writer task.
#[derive(Debug)]
pub struct Index {
    cfg: TranslateConfig,
    metrics: Metrics,
    states: HashMap<ServiceKey, KeyState>,
    /// Resource name -> every key whose served entry has that name; the smallest key wins.
    claims: BTreeMap<Arc<str>, BTreeMap<ServiceKey, Arc<Entry>>>,
    /// Names claimed by more than one key (all but the winner are quarantined).
    collided: BTreeSet<Arc<str>>,
    /// Names whose claims changed since the last flush; `None` before the first snapshot and once
    /// so many changed that the next one is built from every claim anyway (tracking them would
    /// only slow a full `Reset` down).
    dirty: Option<BTreeSet<Arc<str>>>,
    /// Whether the quarantine list may be out of date.
    quarantine_dirty: bool,
    /// Keys whose current registry content is invalid.
    invalid: BTreeSet<ServiceKey>,
    pending: BTreeMap<ServiceKey, Option<Service>>,
    problems: Problems,
    /// The published snapshot of each shard (one unless `--shards`).
    snapshots: Vec<Option<Arc<Snapshot>>>,
    quarantine: Vec<Quarantined>,
    /// Nothing is published before the registry's first full set: an empty answer would make a
    /// reconnecting sink delete what it had.
    reset_seen: bool,
    /// Virtual IPs of services that need one. A service whose address moves without a registry
    /// change (rare: see `vip`) has its served entry rewritten, so no copy of it is kept here.
    vips: Vips,
}

impl Index {
    /// An empty index serving one set.
    pub fn new(cfg: TranslateConfig, metrics: Metrics) -> Self {
        Self::with_shards(cfg, metrics, 1)
    }

    /// An empty index serving its set as `shards` sets (at least one), split by key hash as
    /// `--shard i/shards` splits it.
    pub fn with_shards(cfg: TranslateConfig, metrics: Metrics, shards: usize) -> Self {
        let cfg_vips = cfg.vip_cidr;
        Self {
            cfg,
            metrics,
            states: HashMap::new(),
            claims: BTreeMap::new(),
            collided: BTreeSet::new(),
            dirty: None,
            quarantine_dirty: false,
            invalid: BTreeSet::new(),
            pending: BTreeMap::new(),
            problems: Problems::new(),
            snapshots: vec![None; shards.max(1)],
            quarantine: Vec::new(),
            reset_seen: false,
            vips: Vips::new(cfg_vips),
        }
    }

    /// Records an event; nothing is translated until [`Index::flush`].
    pub fn apply(&mut self, event: RegistryEvent) {
        match event {
            RegistryEvent::Reset(services) => {
                self.reset_seen = true;
                let mut seen: BTreeMap<ServiceKey, Option<Service>> = BTreeMap::new();
                for s in services {
                    seen.insert(s.key.clone(), Some(s));
                }
                let gone: Vec<ServiceKey> = self
                    .states
                    .keys()
                    .chain(self.pending.keys())
                    .filter(|k| !seen.contains_key(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    seen.insert(k, None);
                }
                self.pending.extend(seen);
            }
            RegistryEvent::Upsert(s) => {
                self.pending.insert(s.key.clone(), Some(s));
            }
            RegistryEvent::Remove(k) => {
                self.pending.insert(k, None);
            }
            RegistryEvent::Changes { upserts, removes } => {
                for s in upserts {
                    self.pending.insert(s.key.clone(), Some(s));
                }
                for k in removes {
                    self.pending.insert(k, None);
                }
            }
            RegistryEvent::Problems { scope, problems } => {
                if problems.is_empty() {
                    self.problems.remove(&scope);
                } else {
                    self.problems.insert(scope, problems);
                }
                let n: usize = self.problems.values().map(Vec::len).sum();
                self.metrics.registry_problems.set(n as i64);
            }
            // Health, not content: the writer reports it.
            RegistryEvent::Retrying(_) | RegistryEvent::Recovered => {}
        }
    }

    /// Whether events wait for a flush, or a virtual IP's quarantine ended (a service waiting
    /// for the address may move).
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
            || self
                .next_vip_deadline()
                .is_some_and(|d| d <= Instant::now())
    }

    /// Translates pending changes; returns the new snapshot if the served set changed (always
    /// on the first call after the first `Reset`, so an empty registry is served too; never
    /// before it). For an index of one shard.
    pub fn flush(&mut self) -> Option<Arc<Snapshot>> {
        debug_assert_eq!(
            self.snapshots.len(),
            1,
            "flush_shards serves several shards"
        );
        self.flush_shards().into_iter().next().flatten()
    }

    /// [`Index::flush`] for every shard: per shard (in order), its new snapshot if its served
    /// set changed. Every shard gets one on the first call after the first `Reset`.
    pub fn flush_shards(&mut self) -> Vec<Option<Arc<Snapshot>>> {
        let unchanged = vec![None; self.snapshots.len()];
        if !self.reset_seen {
            return unchanged;
        }
        let mut pending = std::mem::take(&mut self.pending);
        if self.cfg.on_empty == OnEmpty::Remove {
            for change in pending.values_mut() {
                if change.as_ref().is_some_and(|s| self.removed_when_empty(s)) {
                    *change = None;
                }
            }
        }
        let moved = self.allocate_vips(&pending);
        let mut touched = false;
        for (key, change) in pending {
            touched |= self.update(key, change);
        }
        for key in moved {
            touched |= self.readdress(&key);
        }
        if !touched && self.snapshots.iter().all(Option::is_some) {
            return unchanged;
        }
        if std::mem::take(&mut self.quarantine_dirty) {
            self.quarantine = self.build_quarantine();
        }
        self.metrics.quarantined.set(self.quarantine.len() as i64);
        let published = self.build();
        for (slot, new) in self.snapshots.iter_mut().zip(&published) {
            if let Some(s) = new {
                *slot = Some(Arc::clone(s));
            }
        }
        let served: usize = self.snapshots.iter().flatten().map(|s| s.len()).sum();
        self.metrics.resources.set(served as i64);
        published
    }

    /// Per shard, the new served set, or `None` if it equals the published one. Few changed
    /// names are applied to the published snapshots (sharing the rest of them, and letting delta
    /// streams diff through their history); many, or a first snapshot, are built from every
    /// claim.
    fn build(&mut self) -> Vec<Option<Arc<Snapshot>>> {
        let dirty = self.dirty.replace(BTreeSet::new());
        let count = self.snapshots.len();
        let winner = |claims: &BTreeMap<ServiceKey, Arc<Entry>>| {
            claims
                .iter()
                .next()
                .map(|(key, e)| (shard_of(key, count), Arc::clone(e)))
        };
        if let (true, Some(dirty)) = (self.snapshots.iter().all(Option::is_some), dirty) {
            // A name that moved shard (its winning key changed) is removed from the old one:
            // every shard gets every dirty name, and a removal of a name it does not hold is
            // no change.
            let mut changes: Vec<Vec<Change>> = vec![Vec::new(); count];
            for name in dirty {
                let won = self.claims.get(&name).and_then(winner);
                for (shard, list) in changes.iter_mut().enumerate() {
                    let entry = won
                        .as_ref()
                        .filter(|(s, _)| *s == shard)
                        .map(|(_, e)| Arc::clone(e));
                    list.push((Arc::clone(&name), entry));
                }
            }
            return changes
                .into_iter()
                .zip(&self.snapshots)
                .map(|(list, old)| old.as_ref()?.with_changes(list).map(Arc::new))
                .collect();
        }
        let mut parts: Vec<Vec<Arc<Entry>>> = vec![Vec::new(); count];
        for (shard, entry) in self.claims.values().filter_map(winner) {
            parts[shard].push(entry);
        }
        parts
            .into_iter()
            .zip(&self.snapshots)
            .map(|(entries, old)| {
                let snapshot = Snapshot::new(entries);
                let same = old.as_ref().is_some_and(|o| o.version == snapshot.version);
                (!same).then(|| Arc::new(snapshot))
            })
            .collect()
    }

    /// Applies one change to the key's state; true if it may change what is served.
    /// `--on-empty remove`: a service with no instance is not served until one is back.
    /// Adapters always report it (with no endpoints); the policy lives here, once.
    fn removed_when_empty(&self, s: &Service) -> bool {
        self.cfg.on_empty == OnEmpty::Remove
            && s.resolution == Resolution::Static
            && s.workload_selector.is_none()
            && s.endpoints.is_empty()
    }

    /// How long an address a service stopped holding is kept from every other service
    /// (`--vip-quarantine`; zero, the default here, serves the placement at once).
    pub fn set_vip_quarantine(&mut self, quarantine: std::time::Duration) {
        self.vips.set_quarantine(quarantine);
    }

    /// The virtual IPs in quarantine at `now` (for `--state-file` and `/debug/resources`).
    pub fn vip_quarantine(&self, now: Instant) -> Vec<QuarantinedVip> {
        self.vips.quarantined(now)
    }

    /// Quarantines again the virtual IPs an earlier run saved in `--state-file` (see
    /// [`Vips::restore_quarantine`]); before the first flush. Returns how many addresses are in
    /// quarantine then.
    pub fn restore_vip_quarantine(
        &mut self,
        saved: &[SavedVip],
        wall: std::time::SystemTime,
        now: Instant,
    ) -> usize {
        self.vips.restore_quarantine(saved, wall, now)
    }

    /// When a service waiting for a quarantined address may get it: flush then.
    pub fn next_vip_deadline(&self) -> Option<Instant> {
        self.vips.next_deadline()
    }

    /// Tracks which pending services need a virtual IP (and their registry creation order);
    /// returns the other services whose address moved, to rewrite.
    fn allocate_vips(
        &mut self,
        pending: &BTreeMap<ServiceKey, Option<Service>>,
    ) -> BTreeSet<ServiceKey> {
        let mut changed = BTreeSet::new();
        if !self.vips.enabled() {
            return changed;
        }
        let mut membership_changed = false;
        for (key, change) in pending {
            let want = change
                .as_ref()
                .filter(|s| needs_vip(s))
                .map(|s| s.creation_order);
            membership_changed |= self.vips.set(key, want);
        }
        // Also when nothing is pending: a quarantine may have ended (the runtime flushes at
        // `next_vip_deadline`).
        self.vips.settle(Instant::now(), &mut changed);
        changed.retain(|k| !pending.contains_key(k));
        if !membership_changed {
            return changed;
        }
        let full: Vec<String> = self
            .vips
            .unassigned()
            .iter()
            .map(|k| format!("{k}: no free address left in {}", self.cfg.vip_cidr))
            .collect();
        if !full.is_empty() {
            tracing::warn!(services = full.len(), first = %full[0], range = %self.cfg.vip_cidr, "The --vip-cidr range is full; the youngest TCP services are served without a virtual IP.");
        }
        self.apply(RegistryEvent::Problems {
            scope: VIP_SCOPE.into(),
            problems: full,
        });
        changed
    }

    /// Rewrites the served entry of `key`, not changed in the registry, for its moved virtual
    /// IP; true if what is served changed.
    fn readdress(&mut self, key: &ServiceKey) -> bool {
        let vip = self.vips.get(key);
        let Some(state) = self.states.get_mut(key) else {
            return false;
        };
        state.vip = vip;
        // The entry of a quarantined service is its last good version: it gets the new
        // address only if it had one (it needed one too).
        let Some(old) = state.entry.clone().filter(|_| {
            state.entry_vip != vip && (state.invalid.is_none() || state.entry_vip.is_some())
        }) else {
            return false;
        };
        let (from, to) = (state.entry_vip.map(|ip| ip.to_string()), vip);
        let entry = old.with_spec(|spec| {
            spec.addresses.retain(|a| Some(a) != from.as_ref());
            spec.addresses.extend(to.map(|ip| ip.to_string()));
        });
        match entry {
            Ok(entry) => {
                state.entry_vip = vip;
                let entry = Arc::new(entry);
                state.entry = Some(Arc::clone(&entry));
                self.unclaim(key, &old.name);
                self.claim(key.clone(), entry);
                true
            }
            Err(e) => {
                tracing::error!(service = %key, error = %e, "Could not give a service its moved virtual IP; it keeps the old one until it changes.");
                false
            }
        }
    }

    fn update(&mut self, key: ServiceKey, change: Option<Service>) -> bool {
        let Some(mut service) = change else {
            let Some(old) = self.states.remove(&key) else {
                return false;
            };
            self.quarantine_dirty |= self.invalid.remove(&key);
            if let Some(e) = old.entry {
                self.unclaim(&key, &e.name);
            }
            return true;
        };
        let hash = service.content_hash();
        let vip = self.vips.get(&key);
        if self
            .states
            .get(&key)
            .is_some_and(|s| s.hash == hash && s.vip == vip)
        {
            return false;
        }
        if let Some(ip) = vip {
            service.addresses.push(ip.to_string());
        }
        let state = self.states.entry(key.clone()).or_insert(KeyState {
            hash,
            vip,
            entry_vip: None,
            origin: String::new(),
            entry: None,
            invalid: None,
        });
        state.hash = hash;
        state.vip = vip;
        // The quarantine list shows origins and reasons of invalid keys and collision losers.
        self.quarantine_dirty |= state.invalid.is_some()
            || state
                .entry
                .as_ref()
                .is_some_and(|e| self.collided.contains(&e.name));
        state.origin.clone_from(&service.origin);
        let origin = service.origin.clone();
        match translate(service, &self.cfg) {
            Ok(t) => {
                for (kind, w) in &t.warnings {
                    tracing::warn!(origin = %origin, warning = %w, "Dropped part of a service to keep it valid.");
                    self.metrics
                        .translation_warnings
                        .with_label_values(&[kind.as_str()])
                        .inc();
                }
                let entry = encode(&t);
                let same = state
                    .entry
                    .as_ref()
                    .is_some_and(|e| e.version == entry.version && e.name == entry.name);
                if state.invalid.take().is_some() {
                    tracing::info!(origin = %origin, "Service is valid again.");
                    self.invalid.remove(&key);
                }
                state.entry_vip = vip;
                if !same {
                    let entry = Arc::new(entry);
                    let old = state.entry.replace(Arc::clone(&entry));
                    if let Some(old) = old {
                        self.unclaim(&key, &old.name);
                    }
                    self.claim(key, entry);
                }
                // An unchanged version still needs a rebuild if it left quarantine.
                true
            }
            Err(invalid) => {
                tracing::warn!(
                    origin = %invalid.origin,
                    errors = %invalid.errors.join("; "),
                    serving_last_good = state.entry.is_some(),
                    "Quarantined an invalid service."
                );
                state.invalid = Some(invalid.errors);
                self.invalid.insert(key);
                self.quarantine_dirty = true;
                true
            }
        }
    }

    fn claim(&mut self, key: ServiceKey, entry: Arc<Entry>) {
        let name = Arc::clone(&entry.name);
        let keys = self.claims.entry(Arc::clone(&name)).or_default();
        keys.insert(key, entry);
        if keys.len() > 1 {
            self.collided.insert(Arc::clone(&name));
            self.quarantine_dirty = true;
        }
        self.mark_dirty(name);
    }

    fn unclaim(&mut self, key: &ServiceKey, name: &Arc<str>) {
        if let Some(keys) = self.claims.get_mut(name) {
            if keys.remove(key).is_none() {
                return;
            }
            if keys.is_empty() {
                self.claims.remove(name);
            } else {
                // The name was collided: a loser left quarantine, or the winner left and a
                // loser takes its place.
                self.quarantine_dirty = true;
                if keys.len() == 1 {
                    self.collided.remove(name);
                }
            }
            self.mark_dirty(Arc::clone(name));
        }
    }

    /// Records that the served entry of `name` may have changed.
    fn mark_dirty(&mut self, name: Arc<str>) {
        if let Some(dirty) = &mut self.dirty {
            dirty.insert(name);
            if dirty.len() > self.claims.len() / 4 + 16 {
                self.dirty = None;
            }
        }
    }

    /// Invalid keys, then, for each name claimed by several keys, every key but the smallest
    /// (which is served).
    fn build_quarantine(&self) -> Vec<Quarantined> {
        let mut quarantine = Vec::new();
        for key in &self.invalid {
            if let Some(state) = self.states.get(key) {
                quarantine.push(Quarantined {
                    key: key.to_string(),
                    origin: state.origin.clone(),
                    reasons: state.invalid.clone().unwrap_or_default(),
                    serving_last_good: state.entry.is_some(),
                });
            }
        }
        for name in &self.collided {
            let Some(keys) = self.claims.get(name) else {
                continue;
            };
            let mut it = keys.keys();
            let Some(winner) = it.next() else {
                continue;
            };
            for loser in it {
                quarantine.push(Quarantined {
                    key: loser.to_string(),
                    origin: self
                        .states
                        .get(loser)
                        .map(|s| s.origin.clone())
                        .unwrap_or_default(),
                    reasons: vec![format!(
                        "metadata.name: {name} is already produced by {winner}"
                    )],
                    serving_last_good: false,
                });
            }
        }
        quarantine
    }

    /// Services that are not served as described, with reasons.
    pub fn quarantine(&self) -> &[Quarantined] {
        &self.quarantine
    }

    /// Registry objects the adapter skipped.
    pub fn problems(&self) -> &Problems {
        &self.problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Host;
    use crate::testing::mk_http_service as mk_service;

    fn mk_index() -> Index {
        mk_index_with(OnEmpty::Keep)
    }

    fn mk_index_with(on_empty: OnEmpty) -> Index {
        Index::new(
            crate::translate::test_config(on_empty, crate::vip::VipCidr::Off),
            Metrics::new("test").expect("metrics"),
        )
    }

    /// #33 item 5 through the index: two TCP services with one home address, the older one
    /// re-dated (a rolling deploy replaced its instances). Neither is ever served at the
    /// address the other held; at the deadlines the index names, they settle where a replica
    /// started then serves them.
    #[test]
    fn a_redated_service_never_gets_its_rivals_address() {
        let cidr = crate::vip::VipCidr::range(242, 9, 0, 0, 27); // 30 usable addresses
        let mk = |quarantine| {
            let mut idx = Index::new(
                crate::translate::test_config(OnEmpty::Keep, cidr),
                Metrics::new("test").expect("metrics"),
            );
            idx.set_vip_quarantine(quarantine);
            idx
        };
        let tcp = |name: &str, order: u64| {
            let mut s = mk_service(name, "10.0.0.1");
            s.ports[0].protocol = Some("TCP".into());
            s.ports[0].name = "tcp".into();
            s.creation_order = Some(crate::model::CreationOrder::new(order));
            s
        };
        let mut homes = HashMap::new();
        let (a, b) = (0..)
            .find_map(|i| {
                let name = format!("s{i}");
                let home = cidr.home_address(&ServiceKey::new(name.clone()));
                homes.insert(home, name.clone()).map(|other| (other, name))
            })
            .expect("a collision");
        let (ka, kb) = (ServiceKey::new(a.clone()), ServiceKey::new(b.clone()));
        let mut idx = mk(std::time::Duration::from_millis(200));
        idx.apply(RegistryEvent::Reset(vec![tcp(&a, 1), tcp(&b, 2)]));
        idx.flush().expect("first");
        let mut prev = (idx.vips.get(&ka), idx.vips.get(&kb));
        assert!(prev.0.is_some() && prev.1.is_some());
        idx.apply(RegistryEvent::Upsert(tcp(&a, 3)));
        idx.flush();
        let mut steps = 0;
        loop {
            let now = (idx.vips.get(&ka), idx.vips.get(&kb));
            assert!(now.0 != prev.1 && now.1 != prev.0, "{prev:?} -> {now:?}");
            prev = now;
            let Some(deadline) = idx.next_vip_deadline() else {
                break;
            };
            steps += 1;
            assert!(steps < 10, "never settles");
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            assert!(
                idx.has_pending(),
                "a quarantine's end is work for the writer"
            );
            idx.flush();
        }
        assert!(steps >= 2, "a swap takes two quarantines");
        let mut fresh = mk(std::time::Duration::ZERO);
        fresh.apply(RegistryEvent::Reset(vec![tcp(&a, 3), tcp(&b, 2)]));
        let fresh = fresh.flush().expect("first");
        let served = idx.snapshots[0].clone().expect("published");
        assert!(served.iter().eq(fresh.iter()), "settled as a fresh replica");
        assert_eq!(served.version, fresh.version);
    }

    #[test]
    fn tcp_services_without_address_get_a_stable_virtual_ip() {
        let mk = |cidr: crate::vip::VipCidr| {
            Index::new(
                crate::translate::test_config(OnEmpty::Keep, cidr),
                Metrics::new("test").expect("metrics"),
            )
        };
        let tcp = |name: &str| {
            let mut s = mk_service(name, "10.0.0.1");
            s.ports[0].protocol = Some("TCP".into());
            s.ports[0].name = "tcp".into();
            s
        };
        let cidr = crate::vip::VipCidr::range(242, 9, 0, 0, 16);
        let mut idx = mk(cidr);
        idx.apply(RegistryEvent::Reset(vec![
            tcp("a"),
            tcp("b"),
            mk_service("web", "10.0.0.2"),
        ]));
        let first = idx.flush().expect("first");
        let summary = |s: &Snapshot, n: &str| {
            s.iter()
                .find(|e| &*e.name == n)
                .map(|e| e.version.clone())
                .expect("served")
        };
        // A second replica that saw the services in another order serves identical versions.
        let mut other = mk(cidr);
        other.apply(RegistryEvent::Upsert(tcp("b")));
        other.apply(RegistryEvent::Reset(vec![
            mk_service("web", "10.0.0.2"),
            tcp("b"),
            tcp("a"),
        ]));
        let second = other.flush().expect("first");
        assert_eq!(first.version, second.version, "replicas agree");
        // Only the TCP ones changed compared with no allocation.
        let mut off = mk(crate::vip::VipCidr::Off);
        off.apply(RegistryEvent::Reset(vec![
            tcp("a"),
            tcp("b"),
            mk_service("web", "10.0.0.2"),
        ]));
        let plain = off.flush().expect("first");
        assert_ne!(summary(&first, "ns/a"), summary(&plain, "ns/a"));
        assert_ne!(summary(&first, "ns/b"), summary(&plain, "ns/b"));
        assert_eq!(summary(&first, "ns/web"), summary(&plain, "ns/web"));
        // An endpoint change keeps the address (no reallocation, one entry changes).
        let mut moved = tcp("a");
        moved.endpoints[0].address = "10.0.0.9".into();
        idx.apply(RegistryEvent::Upsert(moved));
        let next = idx.flush().expect("changed");
        assert_eq!(summary(&next, "ns/b"), summary(&first, "ns/b"));
        assert!(idx.problems().is_empty(), "{:?}", idx.problems());
    }

    /// Virtual IPs in a tiny range under joins, leaves and changes: after every flush the
    /// served set equals what a replica started now serves (entries rewritten for a moved
    /// address are byte for byte fresh translations), and a service created after all the
    /// others never changes another's entry.
    #[test]
    fn virtual_ips_match_a_fresh_replica_and_newcomers_move_no_one() {
        let cidr = crate::vip::VipCidr::range(242, 9, 0, 0, 28); // 14 usable addresses
        let mk = || {
            Index::new(
                crate::translate::test_config(OnEmpty::Keep, cidr),
                Metrics::new("test").expect("metrics"),
            )
        };
        let tcp = |i: u64, order: u64, ep: u64| {
            let mut s = mk_service(&format!("s{i}"), &format!("10.0.0.{ep}"));
            s.ports[0].protocol = Some("TCP".into());
            s.ports[0].name = "tcp".into();
            s.creation_order = Some(crate::model::CreationOrder::new(order));
            s
        };
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut below = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut idx = mk();
        idx.apply(RegistryEvent::Reset(vec![]));
        idx.flush();
        let mut current: BTreeMap<u64, Service> = BTreeMap::new();
        let mut next = 0;
        for round in 0..300 {
            let i = below(20);
            let before = idx.snapshots[0].clone().expect("published");
            let youngest = !current.contains_key(&i);
            match below(4) {
                0 => {
                    current.remove(&i);
                    idx.apply(RegistryEvent::Remove(ServiceKey::new(format!("s{i}"))));
                }
                1 if current.contains_key(&i) => {
                    let mut s = current[&i].clone();
                    s.endpoints[0].address = format!("10.0.1.{}", below(9));
                    current.insert(i, s.clone());
                    idx.apply(RegistryEvent::Upsert(s));
                }
                _ => {
                    next += 1;
                    let s = current
                        .get(&i)
                        .cloned()
                        .unwrap_or_else(|| tcp(i, next, below(9)));
                    current.insert(i, s.clone());
                    idx.apply(RegistryEvent::Upsert(s));
                    if youngest {
                        let after = idx.flush().unwrap_or(Arc::clone(&before));
                        for e in before.iter() {
                            let now = after.get(&e.name).expect("still served");
                            assert_eq!(now.version, e.version, "round {round}: {} changed", e.name);
                        }
                    }
                }
            }
            let served = idx.flush().or(idx.snapshots[0].clone()).expect("published");
            let mut replica = mk();
            replica.apply(RegistryEvent::Reset(current.values().cloned().collect()));
            let fresh = replica.flush().expect("first");
            assert!(served.iter().eq(fresh.iter()), "round {round}");
            assert_eq!(served.version, fresh.version, "round {round}");
            assert_eq!(idx.problems(), replica.problems(), "round {round}");
        }
    }

    #[test]
    fn on_empty_keep_serves_a_service_with_no_instances() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![mk_service("a", "10.0.0.1")]));
        idx.flush();
        let mut empty = mk_service("a", "10.0.0.1");
        empty.endpoints.clear();
        idx.apply(RegistryEvent::Upsert(empty));
        let snap = idx.flush().expect("the endpoint went away");
        assert_eq!(names(&snap), vec!["ns/a"]);
        assert_eq!(snap.iter().next().expect("a").summary.endpoints, 0);
    }

    #[test]
    fn on_empty_remove_drops_it_until_an_instance_is_back() {
        let mut idx = mk_index_with(OnEmpty::Remove);
        let mut empty = mk_service("b", "10.0.0.2");
        empty.endpoints.clear();
        let mut dns = empty.clone();
        dns.key = ServiceKey::new("dns");
        dns.hosts = vec![Host::Relative("dns".into())];
        dns.resolution = Resolution::Dns;
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("a", "10.0.0.1"),
            empty,
            dns,
        ]));
        let snap = idx.flush().expect("first");
        assert_eq!(
            names(&snap),
            vec!["ns/a", "ns/dns"],
            "DNS entries are not registry instances"
        );
        let mut gone = mk_service("a", "10.0.0.1");
        gone.endpoints.clear();
        idx.apply(RegistryEvent::Upsert(gone));
        assert_eq!(names(&idx.flush().expect("removed")), vec!["ns/dns"]);
        idx.apply(RegistryEvent::Upsert(mk_service("a", "10.0.0.3")));
        assert_eq!(names(&idx.flush().expect("back")), vec!["ns/a", "ns/dns"]);
    }

    fn names(s: &Snapshot) -> Vec<String> {
        s.iter().map(|e| e.name.to_string()).collect()
    }

    #[test]
    fn first_flush_publishes_even_when_empty() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![]));
        let s = idx.flush().expect("first snapshot");
        assert!(s.is_empty());
        assert!(idx.flush().is_none());
    }

    #[test]
    fn nothing_is_published_before_the_first_reset() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Problems {
            scope: "f".into(),
            problems: vec!["bad".into()],
        });
        assert!(idx.flush().is_none());
        idx.apply(RegistryEvent::Upsert(mk_service("a", "10.0.0.1")));
        assert!(idx.flush().is_none(), "an upsert is not the full set");
        idx.apply(RegistryEvent::Reset(vec![mk_service("b", "10.0.0.2")]));
        let s = idx.flush().expect("first snapshot after the reset");
        assert_eq!(names(&s), vec!["ns/b"], "the reset is authoritative");
    }

    #[test]
    fn relist_without_change_publishes_nothing() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("a", "10.0.0.1"),
            mk_service("b", "10.0.0.2"),
        ]));
        let first = idx.flush().expect("first");
        assert_eq!(names(&first), vec!["ns/a", "ns/b"]);
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("b", "10.0.0.2"),
            mk_service("a", "10.0.0.1"),
        ]));
        assert!(idx.flush().is_none(), "no-op relist must not publish");
        idx.apply(RegistryEvent::Upsert(mk_service("a", "10.0.0.1")));
        assert!(idx.flush().is_none());
    }

    #[test]
    fn reset_removes_missing_and_events_apply() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("a", "10.0.0.1"),
            mk_service("b", "10.0.0.2"),
        ]));
        idx.flush();
        idx.apply(RegistryEvent::Reset(vec![mk_service("b", "10.0.0.3")]));
        let s = idx.flush().expect("changed");
        assert_eq!(names(&s), vec!["ns/b"]);
        idx.apply(RegistryEvent::Upsert(mk_service("c", "10.0.0.4")));
        idx.apply(RegistryEvent::Remove(ServiceKey::new("b")));
        let s = idx.flush().expect("changed");
        assert_eq!(names(&s), vec!["ns/c"]);
    }

    #[test]
    fn invalid_service_keeps_last_good_and_others_flow() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("a", "10.0.0.1"),
            mk_service("b", "10.0.0.2"),
        ]));
        let first = idx.flush().expect("first");
        let a_version = first.get("ns/a").expect("a").version.clone();
        let mut bad = mk_service("a", "10.0.0.9");
        bad.ports[0].name = "Not Valid".into();
        idx.apply(RegistryEvent::Upsert(bad));
        idx.apply(RegistryEvent::Upsert(mk_service("b", "10.0.0.5")));
        let s = idx.flush().expect("b changed");
        assert_eq!(s.get("ns/a").expect("last good a").version, a_version);
        assert_ne!(
            s.get("ns/b").expect("b").version,
            first.get("ns/b").expect("b").version
        );
        let q = idx.quarantine();
        assert_eq!(q.len(), 1);
        assert!(q[0].serving_last_good);
        assert!(q[0].reasons[0].contains("spec.ports[0].name"), "{:?}", q[0]);

        // A new service that is invalid from the start is not served at all.
        let mut bad_new = mk_service("c", "10.0.0.1");
        bad_new.hosts = vec![Host::Absolute("bad_host".into())];
        idx.apply(RegistryEvent::Upsert(bad_new));
        // Nothing served changes: no new set, or one without it.
        let unchanged = idx.flush();
        assert!(
            unchanged.as_ref().is_none_or(|s| s.get("ns/c").is_none()),
            "c, invalid from the start, is served"
        );
        assert_eq!(idx.quarantine().len(), 2);

        // Fixed: quarantine clears and the new version is served.
        idx.apply(RegistryEvent::Upsert(mk_service("a", "10.0.0.9")));
        let s = idx.flush().expect("a fixed");
        assert_ne!(s.get("ns/a").expect("a").version, a_version);
        assert!(s.get("ns/c").is_none(), "c is still invalid: never served");
        assert_eq!(names(&s), vec!["ns/a", "ns/b"]);
        assert_eq!(idx.quarantine().len(), 1);
    }

    #[test]
    fn name_collisions_are_resolved_deterministically() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Reset(vec![
            mk_service("web_a", "10.0.0.1"),
            mk_service("web-a", "10.0.0.2"),
        ]));
        let s = idx.flush().expect("first");
        assert_eq!(names(&s), vec!["ns/web-a"]);
        // "web-a" < "web_a": the smaller key wins on every replica.
        let winner = s.get("ns/web-a").expect("served");
        let q = idx.quarantine();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].key, "web_a");
        // When the winner goes away the other one is served.
        idx.apply(RegistryEvent::Remove(ServiceKey::new("web-a")));
        let s = idx.flush().expect("changed");
        assert_ne!(s.get("ns/web-a").expect("served").version, winner.version);
        assert!(idx.quarantine().is_empty());
    }

    /// The quarantine list as computed before it was kept incrementally: every claim scanned.
    fn quarantine_from_scratch(idx: &Index) -> Vec<Quarantined> {
        let mut q = Vec::new();
        for key in &idx.invalid {
            let state = &idx.states[key];
            q.push(Quarantined {
                key: key.to_string(),
                origin: state.origin.clone(),
                reasons: state.invalid.clone().unwrap_or_default(),
                serving_last_good: state.entry.is_some(),
            });
        }
        for (name, keys) in &idx.claims {
            let mut it = keys.keys();
            let winner = it.next().expect("no empty claim");
            for loser in it {
                q.push(Quarantined {
                    key: loser.to_string(),
                    origin: idx.states[loser].origin.clone(),
                    reasons: vec![format!(
                        "metadata.name: {name} is already produced by {winner}"
                    )],
                    serving_last_good: false,
                });
            }
        }
        q
    }

    /// Random upserts, removals and resets, with name collisions ("s-1" and "s_1" both make
    /// "ns/s-1") and invalid services: after every flush the published snapshot equals the one a
    /// fresh index builds from the services served (entries and version), and the quarantine
    /// list equals one computed from every claim. An index of three shards fed the same events
    /// serves the same entries split by the winning key's shard (a collision whose winner
    /// changes moves its name between shards), each shard's version that of a fresh build.
    #[test]
    fn incremental_flushes_match_a_rebuild() {
        struct Rng(crate::testing::Rng);
        impl Rng {
            fn below(&mut self, n: u64) -> u64 {
                self.0.below(n)
            }
            fn key(&mut self) -> String {
                let i = self.below(80);
                format!("s{}{}", if i.is_multiple_of(2) { "-" } else { "_" }, i / 2)
            }
            fn service(&mut self) -> Service {
                let key = self.key();
                let mut s = mk_service(&key, &format!("10.0.0.{}", self.below(3)));
                if self.below(8) == 0 {
                    s.ports[0].name = "Not Valid".into();
                }
                s
            }
        }
        let mut rng = Rng(crate::testing::Rng(0x853c_49e6_748f_ea9b));
        let valid = |s: &Service| s.ports[0].name != "Not Valid";
        let mut idx = mk_index();
        let mut sharded = Index::with_shards(
            crate::translate::test_config(OnEmpty::Keep, crate::vip::VipCidr::Off),
            Metrics::new("test").expect("metrics"),
            3,
        );
        // Key -> (what the registry says now, the last valid version the index saw; like the
        // index, only the last event per key before a flush counts).
        let mut model: BTreeMap<String, (Service, Option<Service>)> = BTreeMap::new();
        let mut published = 0;
        for round in 0..400 {
            let mut pending: BTreeMap<String, Option<Service>> = BTreeMap::new();
            for _ in 0..rng.below(4) + 1 {
                let op = rng.below(30);
                if op == 0 || round == 0 {
                    let services: Vec<Service> =
                        (0..rng.below(60)).map(|_| rng.service()).collect();
                    for k in model.keys().chain(pending.clone().keys()) {
                        pending.insert(k.clone(), None);
                    }
                    for s in &services {
                        pending.insert(s.key.name.clone(), Some(s.clone()));
                    }
                    idx.apply(RegistryEvent::Reset(services.clone()));
                    sharded.apply(RegistryEvent::Reset(services));
                } else if op < 8 {
                    let key = rng.key();
                    pending.insert(key.clone(), None);
                    idx.apply(RegistryEvent::Remove(ServiceKey::new(key.clone())));
                    sharded.apply(RegistryEvent::Remove(ServiceKey::new(key)));
                } else {
                    let s = rng.service();
                    pending.insert(s.key.name.clone(), Some(s.clone()));
                    idx.apply(RegistryEvent::Upsert(s.clone()));
                    sharded.apply(RegistryEvent::Upsert(s));
                }
            }
            for (key, change) in pending {
                match change {
                    None => {
                        model.remove(&key);
                    }
                    Some(s) => {
                        let last_good = if valid(&s) {
                            Some(s.clone())
                        } else {
                            model.get(&key).and_then(|(_, g)| g.clone())
                        };
                        model.insert(key, (s, last_good));
                    }
                }
            }
            published += usize::from(idx.flush().is_some());
            let current = idx.snapshots[0].clone().expect("published since round 0");
            sharded.flush_shards();
            for shard in 0..3 {
                let part = sharded.snapshots[shard]
                    .clone()
                    .expect("every shard published");
                let want: Vec<Arc<Entry>> = current
                    .iter()
                    .filter(|e| {
                        let winner = idx.claims[&e.name].keys().next().expect("claimed");
                        shard_of(winner, 3) == shard
                    })
                    .cloned()
                    .collect();
                assert!(part.iter().eq(want.iter()), "round {round} shard {shard}");
                assert_eq!(
                    part.version,
                    Snapshot::new(want).version,
                    "round {round} shard {shard}"
                );
            }
            let mut fresh = mk_index();
            fresh.apply(RegistryEvent::Reset(
                model
                    .values()
                    .filter_map(|(now, good)| if valid(now) { Some(now) } else { good.as_ref() })
                    .cloned()
                    .collect(),
            ));
            let rebuilt = fresh.flush().expect("first");
            assert_eq!(current.version, rebuilt.version, "round {round}");
            assert!(current.iter().eq(rebuilt.iter()), "round {round}");
            assert_eq!(
                idx.quarantine(),
                quarantine_from_scratch(&idx),
                "round {round}"
            );
            let collided: BTreeSet<_> = idx
                .claims
                .iter()
                .filter(|(_, k)| k.len() > 1)
                .map(|(n, _)| Arc::clone(n))
                .collect();
            assert_eq!(idx.collided, collided, "round {round}");
        }
        assert!(published > 200, "{published} snapshots published");
    }

    /// `--shards`: the first flush publishes every shard (an empty one too); a change publishes
    /// only the shard that holds it; a service lands in the shard `--shard i/N` gives it.
    #[test]
    fn shards_publish_only_what_changed_in_them() {
        let mut idx = Index::with_shards(
            crate::translate::test_config(OnEmpty::Keep, crate::vip::VipCidr::Off),
            Metrics::new("test").expect("metrics"),
            4,
        );
        idx.apply(RegistryEvent::Reset(vec![mk_service("only", "10.0.0.1")]));
        let first = idx.flush_shards();
        assert!(
            first.iter().all(Option::is_some),
            "every shard is published"
        );
        let home = shard_of(&ServiceKey::new("only"), 4);
        for (i, s) in first.iter().enumerate() {
            let s = s.as_ref().expect("published");
            assert_eq!(s.len(), usize::from(i == home), "shard {i}");
        }
        let keeps = |i: u64| crate::shard::Shard {
            index: Some(crate::shard::ShardIndex { index: i, count: 4 }),
            names: crate::filter::NameFilter::default(),
        };
        assert!(keeps(home as u64).keeps(&ServiceKey::new("only")));
        idx.apply(RegistryEvent::Upsert(mk_service("only", "10.0.0.2")));
        let next = idx.flush_shards();
        for (i, s) in next.iter().enumerate() {
            assert_eq!(s.is_some(), i == home, "shard {i}");
        }
        assert!(idx.flush_shards().iter().all(Option::is_none));
    }

    #[test]
    fn problems_replace_per_scope() {
        let mut idx = mk_index();
        idx.apply(RegistryEvent::Problems {
            scope: "f1".into(),
            problems: vec!["bad".into()],
        });
        idx.apply(RegistryEvent::Problems {
            scope: "f2".into(),
            problems: vec!["worse".into()],
        });
        assert_eq!(idx.problems().len(), 2);
        idx.apply(RegistryEvent::Problems {
            scope: "f1".into(),
            problems: vec![],
        });
        assert_eq!(idx.problems().keys().collect::<Vec<_>>(), vec!["f2"]);
    }
}
