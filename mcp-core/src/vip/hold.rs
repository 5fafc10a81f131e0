//! The addresses served, kept apart from the placement (`super::Vips`) by a quarantine.
//!
//! The placement is a function of the current set and the registry's dates, so replicas agree
//! on it; but a re-dated service (Consul and Eureka date a service by its oldest current
//! instance: a rolling deploy re-dates it) or a leaving one changes who is first in a run of
//! colliding services, and following the placement at once gives a slot one service held to
//! another in the same step. A client that cached the first service's address (DNS caches,
//! connection pools) then reaches the other service on the same port.
//!
//! So a slot a service stops holding is quarantined: for `quarantine` no other service gets
//! it, and the service that held it may take it back (a deploy that scaled it through zero).
//! A service whose placed slot is quarantined or still held waits where it is (or, new or
//! evicted, in a spare slot no one is placed in) and moves when the slot opens. Two waiting
//! services each holding the other's slot (a re-dating swaps them) would wait forever: the
//! first of such a cycle moves to a spare slot, which breaks it. With no change for long
//! enough every service is served at its placed slot: replicas agree again.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::Member;
use crate::model::ServiceKey;

/// The last holder of a quarantined slot and when the quarantine ends.
#[derive(Debug)]
struct Freed {
    key: ServiceKey,
    until: Instant,
}

/// Served slots and the quarantine of freed ones.
#[derive(Debug)]
pub(super) struct Hold {
    quarantine: Duration,
    served: HashMap<ServiceKey, u32>,
    /// Slot -> the member served there.
    held: HashMap<u32, ServiceKey>,
    freed: HashMap<u32, Freed>,
    /// A member's last freed slot, which it may take back while quarantined.
    reserved: HashMap<ServiceKey, u32>,
    /// Quarantine ends, for expiry in time order (entries whose slot was freed again since or
    /// taken back are skipped).
    expiry: BTreeSet<(Instant, u32)>,
    /// Members not served at their placed slot.
    unsettled: BTreeSet<ServiceKey>,
}

impl Hold {
    pub(super) fn new(quarantine: Duration) -> Self {
        Self {
            quarantine,
            served: HashMap::new(),
            held: HashMap::new(),
            freed: HashMap::new(),
            reserved: HashMap::new(),
            expiry: BTreeSet::new(),
            unsettled: BTreeSet::new(),
        }
    }

    pub(super) fn set_quarantine(&mut self, quarantine: Duration) {
        self.quarantine = quarantine;
    }

    pub(super) fn quarantine(&self) -> Duration {
        self.quarantine
    }

    pub(super) fn get(&self, key: &ServiceKey) -> Option<u32> {
        self.served.get(key).copied()
    }

    /// When a waiting member may be able to move: the first quarantine end, if any member
    /// waits.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        if self.unsettled.is_empty() {
            return None;
        }
        self.expiry.first().map(|(t, _)| *t)
    }

    /// Brings the served slots of `work` (members whose placement changed) and of every
    /// waiting member towards their placement as far as the quarantine allows; adds every key
    /// whose served slot changed to `changed`.
    pub(super) fn settle(
        &mut self,
        members: &HashMap<ServiceKey, Member>,
        placed: &HashMap<u32, ServiceKey>,
        count: u32,
        mut work: BTreeSet<ServiceKey>,
        now: Instant,
        changed: &mut BTreeSet<ServiceKey>,
    ) {
        self.expire(now);
        work.append(&mut self.unsettled);
        let place = |k: &ServiceKey| members.get(k).and_then(|m| m.slot);
        if self.quarantine.is_zero() {
            // No quarantine: the placement is served as it is (every move at once, so two
            // members may trade slots).
            for k in &work {
                if let Some(c) = self.served.get(k).copied().filter(|c| Some(*c) != place(k)) {
                    self.served.remove(k);
                    if self.held.get(&c) == Some(k) {
                        self.held.remove(&c);
                    }
                    changed.insert(k.clone());
                }
            }
            for k in &work {
                if let Some(s) = place(k).filter(|s| self.held.get(s) != Some(k)) {
                    self.held.insert(s, k.clone());
                    self.served.insert(k.clone(), s);
                    changed.insert(k.clone());
                }
            }
            return;
        }
        let mut waiting = Vec::new();
        let mut came_back = BTreeSet::new();
        for k in work {
            let now_at = self.served.get(&k).copied();
            let Some(s) = place(&k) else {
                if let Some(c) = now_at {
                    self.release(&k, c, now);
                    changed.insert(k);
                }
                continue;
            };
            if now_at == Some(s) {
                continue;
            }
            if self.open(s, &k, now) {
                if let Some(c) = now_at {
                    self.release(&k, c, now);
                }
                self.take(&k, s);
                changed.insert(k);
                continue;
            }
            if now_at.is_none() {
                // New, or back: the slot it last held if still kept for it, else a spare one.
                let back = self
                    .reserved
                    .get(&k)
                    .copied()
                    .filter(|r| self.open(*r, &k, now));
                if let Some(r) = back.or_else(|| self.spare(s, &k, placed, count, now)) {
                    self.take(&k, r);
                    changed.insert(k.clone());
                    came_back.insert(k.clone());
                }
            }
            waiting.push(k);
        }
        // A cycle is broken by a member that held its slot before this step if there is one
        // (one that just got its slot back keeps it).
        for spare_the_new in [true, false] {
            for k in &waiting {
                if (spare_the_new && came_back.contains(k)) || !self.in_cycle(k, &place) {
                    continue;
                }
                if let Some(c) = self.served.get(k).copied() {
                    self.release(k, c, now);
                    changed.insert(k.clone());
                }
                if let Some(r) = place(k).and_then(|s| self.spare(s, k, placed, count, now)) {
                    self.take(k, r);
                }
                tracing::debug!(service = %k, "Virtual IP: left a slot another service waits for, to a spare one (they swapped places).");
            }
        }
        self.unsettled.extend(waiting);
    }

    /// Whether `key` may be served at `slot` now: no one holds it and no other member held it
    /// within the quarantine.
    fn open(&self, slot: u32, key: &ServiceKey, now: Instant) -> bool {
        !self.held.contains_key(&slot)
            && self
                .freed
                .get(&slot)
                .is_none_or(|f| f.key == *key || f.until <= now)
    }

    /// The first slot after `from` that `key` may hold and no member is placed in (so it
    /// keeps no one from their place), if any.
    fn spare(
        &self,
        from: u32,
        key: &ServiceKey,
        placed: &HashMap<u32, ServiceKey>,
        count: u32,
        now: Instant,
    ) -> Option<u32> {
        (1..count)
            .map(|i| (from + i) % count)
            .find(|s| !placed.contains_key(s) && self.open(*s, key, now))
    }

    /// Whether the members holding each other's places lead from `key` back to it: none of
    /// them can move until one leaves its slot.
    fn in_cycle(&self, key: &ServiceKey, place: &impl Fn(&ServiceKey) -> Option<u32>) -> bool {
        let mut at = key;
        // Each step goes to the holder of a slot, so a chain back to `key` is at most as long
        // as there are held slots. (`unsettled`, the bound before, is empty here: `settle`
        // has moved it into its work, so only swaps of two were ever found, and three
        // services holding each other's places waited forever.)
        for _ in 0..=self.held.len() {
            let Some(holder) = place(at).and_then(|s| self.held.get(&s)) else {
                return false;
            };
            if holder == key {
                return true;
            }
            at = holder;
        }
        false
    }

    fn take(&mut self, key: &ServiceKey, slot: u32) {
        if let Some(f) = self.freed.remove(&slot) {
            if self.reserved.get(&f.key) == Some(&slot) {
                self.reserved.remove(&f.key);
            }
        }
        self.held.insert(slot, key.clone());
        self.served.insert(key.clone(), slot);
    }

    fn release(&mut self, key: &ServiceKey, slot: u32, now: Instant) {
        self.served.remove(key);
        self.held.remove(&slot);
        let until = now + self.quarantine;
        self.freed.insert(
            slot,
            Freed {
                key: key.clone(),
                until,
            },
        );
        self.reserved.insert(key.clone(), slot);
        self.expiry.insert((until, slot));
    }

    /// The quarantined slots at `now`: each with the member that let go of it and the end of
    /// its quarantine (a slot taken since is no longer in `freed`).
    pub(super) fn quarantined(
        &self,
        now: Instant,
    ) -> impl Iterator<Item = (u32, &ServiceKey, Instant)> {
        self.freed
            .iter()
            .filter(move |(_, f)| f.until > now)
            .map(|(slot, f)| (*slot, &f.key, f.until))
    }

    /// Quarantines `slot`, let go of by `key` in an earlier run, until `until` (`--state-file`):
    /// as if `key` had released it, so only `key` may take it back before then. Before any
    /// [`Hold::settle`] (nothing is held yet); of two quarantines of one slot the later end wins.
    pub(super) fn restore(&mut self, slot: u32, key: &ServiceKey, until: Instant) {
        if self.held.contains_key(&slot) || self.freed.get(&slot).is_some_and(|f| f.until >= until)
        {
            return;
        }
        let freed = Freed {
            key: key.clone(),
            until,
        };
        if let Some(old) = self.freed.insert(slot, freed) {
            if self.reserved.get(&old.key) == Some(&slot) {
                self.reserved.remove(&old.key);
            }
        }
        // A key's reservation is the slot it let go of last.
        let later = self
            .reserved
            .get(key)
            .and_then(|r| self.freed.get(r))
            .is_none_or(|f| f.until <= until);
        if later {
            self.reserved.insert(key.clone(), slot);
        }
        self.expiry.insert((until, slot));
    }

    /// Ends the quarantines due by `now`.
    fn expire(&mut self, now: Instant) {
        while let Some(&(until, slot)) = self.expiry.first() {
            if until > now {
                break;
            }
            self.expiry.pop_first();
            if self.freed.get(&slot).is_some_and(|f| f.until == until) {
                if let Some(f) = self.freed.remove(&slot) {
                    if self.reserved.get(&f.key) == Some(&slot) {
                        self.reserved.remove(&f.key);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{home_slot, VipCidr, Vips};
    use crate::model::{CreationOrder, ServiceKey};
    use crate::testing::Rng;
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::net::Ipv4Addr;
    use std::time::{Duration, Instant};

    const Q: Duration = Duration::from_secs(10);
    const CIDR: VipCidr = VipCidr::range(242, 3, 0, 0, 27); // 30 usable addresses

    fn key(i: u64) -> ServiceKey {
        ServiceKey::new(format!("s{i}"))
    }

    fn dated(order: u64) -> Option<Option<CreationOrder>> {
        Some(Some(CreationOrder::new(order)))
    }

    /// What every key is served, and for each address its last holder and when it let go.
    #[derive(Default)]
    struct Watch {
        served: BTreeMap<ServiceKey, Ipv4Addr>,
        let_go: HashMap<Ipv4Addr, (ServiceKey, Instant)>,
        violations: Vec<String>,
    }

    impl Watch {
        /// Records what `v` serves `keys` at `now`: notes every address a key receives that
        /// another key held less than `Q` ago (in the previous step included), and checks
        /// that `changed` names every key whose address changed.
        fn step(
            &mut self,
            v: &Vips,
            keys: &BTreeSet<ServiceKey>,
            now: Instant,
            changed: &BTreeSet<ServiceKey>,
            at: &str,
        ) {
            let served: BTreeMap<ServiceKey, Ipv4Addr> = keys
                .iter()
                .filter_map(|k| Some((k.clone(), v.get(k)?)))
                .collect();
            let mut seen = BTreeSet::new();
            for (k, ip) in &served {
                assert!(seen.insert(*ip), "{at}: {ip} served twice");
                if self.served.get(k) != Some(ip) {
                    assert!(changed.contains(k), "{at}: {k:?} moved unreported");
                }
            }
            for (k, ip) in &self.served {
                if served.get(k) != Some(ip) {
                    assert!(changed.contains(k), "{at}: {k:?} moved unreported");
                    self.let_go.insert(*ip, (k.clone(), now));
                }
            }
            for (k, ip) in &served {
                if self.served.get(k) == Some(ip) {
                    continue;
                }
                if let Some((other, when)) = self.let_go.get(ip) {
                    if other != k && now.duration_since(*when) < Q {
                        self.violations.push(format!(
                            "{at}: {k:?} received {ip}, which {other:?} held {:?} before",
                            now.duration_since(*when)
                        ));
                    }
                }
            }
            self.served = served;
        }
    }

    /// `n` keys with one home slot.
    fn sharing_a_home(n: usize) -> Vec<ServiceKey> {
        let mut homes: HashMap<u32, Vec<ServiceKey>> = HashMap::new();
        for i in 0.. {
            let k = key(i);
            let group = homes.entry(home_slot(&k, 30)).or_default();
            group.push(k);
            if group.len() == n {
                return group.clone();
            }
        }
        unreachable!()
    }

    /// #43 item 1: `n` services sharing a home slot, settled; then a rolling deploy re-dates
    /// the oldest, then the next oldest, ...: each re-dating rotates who should sit where, so
    /// the waiting services hold each other's places in a cycle as long as the group. Every
    /// cycle must resolve (the allocator names a deadline while anyone waits), no address goes
    /// to another service within the quarantine, and once quiet the addresses are a fresh
    /// replica's.
    fn rotation(n: usize) -> Vec<String> {
        let keys_in_order = sharing_a_home(n);
        let keys: BTreeSet<ServiceKey> = keys_in_order.iter().cloned().collect();
        let mut v = Vips::new(CIDR);
        v.set_quarantine(Q);
        let mut w = Watch::default();
        let mut now = Instant::now();
        let mut order: BTreeMap<ServiceKey, u64> = BTreeMap::new();
        for (i, k) in keys_in_order.iter().enumerate() {
            order.insert(k.clone(), i as u64);
            v.set(k, dated(i as u64));
        }
        let mut changed = BTreeSet::new();
        v.settle(now, &mut changed);
        w.step(&v, &keys, now, &changed, "start");
        for round in 0..n {
            let next = (n + round) as u64;
            // The oldest now is re-dated: the youngest of all.
            let oldest = order
                .iter()
                .min_by_key(|(_, o)| **o)
                .map(|(k, _)| k.clone())
                .expect("keys");
            order.insert(oldest.clone(), next);
            v.set(&oldest, dated(next));
            now += Duration::from_secs(1);
            let mut changed = BTreeSet::new();
            v.settle(now, &mut changed);
            w.step(&v, &keys, now, &changed, &format!("re-dated {round}"));
            // Quiet: settle at each deadline the allocator names, until none.
            let mut steps = 0;
            while let Some(deadline) = v.next_deadline() {
                steps += 1;
                assert!(steps <= 50, "{n} keys, round {round}: never settles");
                now = now.max(deadline);
                let mut changed = BTreeSet::new();
                v.settle(now, &mut changed);
                w.step(
                    &v,
                    &keys,
                    now,
                    &changed,
                    &format!("round {round} quiet {steps}"),
                );
            }
            let mut fresh = Vips::new(CIDR);
            for (k, o) in &order {
                fresh.set(k, dated(*o));
            }
            fresh.settle(now, &mut BTreeSet::new());
            for k in &keys {
                assert_eq!(
                    v.get(k),
                    fresh.get(k),
                    "{n} keys, round {round}: {k:?} is served where a fresh replica serves it"
                );
            }
        }
        w.violations
    }

    #[test]
    fn swaps_of_any_length_resolve_and_agree_with_a_fresh_replica() {
        for n in 2..=6 {
            let violations = rotation(n);
            assert!(violations.is_empty(), "{n} keys: {violations:#?}");
        }
    }

    /// Two keys with one home slot.
    fn rivals() -> (ServiceKey, ServiceKey) {
        let mut homes: HashMap<u32, ServiceKey> = HashMap::new();
        for i in 0.. {
            let k = key(i);
            if let Some(first) = homes.insert(home_slot(&k, 30), k.clone()) {
                return (first, k);
            }
        }
        unreachable!()
    }

    /// #33 item 5: two services with one home slot; the older one is re-dated (every instance
    /// of it replaced), then, in a second run, scaled through zero and back. No key ever
    /// receives an address the other held within the quarantine, and once it is over both are
    /// served where a replica started then serves them.
    fn rivals_redated(quarantine: Duration) -> Vec<String> {
        let (a, b) = rivals();
        let keys = BTreeSet::from([a.clone(), b.clone()]);
        let mut v = Vips::new(CIDR);
        v.set_quarantine(quarantine);
        let mut w = Watch::default();
        let t0 = Instant::now();
        let step = |v: &mut Vips, now: Instant, w: &mut Watch, at: &str| {
            let mut changed = BTreeSet::new();
            v.settle(now, &mut changed);
            w.step(v, &keys, now, &changed, at);
        };
        v.set(&a, dated(1));
        v.set(&b, dated(2));
        step(&mut v, t0, &mut w, "start");
        let home_a = v.get(&a);
        assert_eq!(
            home_a.map(|ip| u32::from(ip) - u32::from(Ipv4Addr::new(242, 3, 0, 1))),
            Some(home_slot(&a, 30))
        );
        // The deploy: a's oldest instance is now younger than b's.
        v.set(&a, dated(3));
        let mut now = t0 + Duration::from_secs(1);
        step(&mut v, now, &mut w, "re-dated");
        for i in 0..40 {
            now += Duration::from_secs(1);
            step(&mut v, now, &mut w, &format!("re-dated +{}s", i + 2));
        }
        assert_eq!(v.next_deadline(), None, "settled");
        assert_eq!(
            (v.get(&b), v.get(&a).is_some()),
            (home_a, true),
            "b, now older, has the home"
        );
        // Gone and back within the quarantine (a deploy that scales through zero): b waits,
        // and a gets its address back.
        let held_by_b = v.get(&b);
        v.set(&b, None);
        now += Duration::from_secs(1);
        step(&mut v, now, &mut w, "b gone");
        v.set(&b, dated(4));
        now += Duration::from_secs(1);
        step(&mut v, now, &mut w, "b back");
        if !quarantine.is_zero() {
            assert_eq!(v.get(&b), held_by_b, "b got its address back");
        }
        for i in 0..40 {
            now += Duration::from_secs(1);
            step(&mut v, now, &mut w, &format!("b back +{}s", i + 1));
        }
        let mut fresh = Vips::new(CIDR);
        fresh.set(&a, dated(3));
        fresh.set(&b, dated(4));
        fresh.settle(now, &mut BTreeSet::new());
        for k in &keys {
            assert_eq!(v.get(k), fresh.get(k), "{k:?}: replicas agree once settled");
        }
        w.violations
    }

    #[test]
    fn a_redated_service_never_takes_its_rivals_address() {
        let violations = rivals_redated(Q);
        assert!(violations.is_empty(), "{violations:#?}");
    }

    /// Without a quarantine (the allocation before #33) the re-dating swaps the two addresses
    /// in one step.
    #[test]
    fn without_a_quarantine_a_redating_swaps_addresses() {
        let violations = rivals_redated(Duration::ZERO);
        eprintln!("{violations:#?}");
        assert!(
            violations.iter().any(|v| v.starts_with("re-dated:")),
            "{violations:#?}"
        );
    }

    /// Joins, leaves and re-datings at random in a tiny range, with time passing: no key
    /// ever receives an address another key held within the quarantine, `changed` names
    /// every move, and once nothing changes for long enough the served addresses are a fresh
    /// replica's (reached at the deadlines the allocator names).
    #[test]
    fn no_address_goes_to_another_key_within_the_quarantine() {
        let violations = random_walk(Q, &(0..16).map(key).collect::<Vec<_>>());
        assert!(violations.is_empty(), "{violations:#?}");
    }

    /// The same walk over three groups of five keys, each group sharing a home slot: re-datings
    /// within a group make the waiting keys hold each other's places in cycles of any length.
    #[test]
    fn walks_of_colliding_groups_settle_where_a_fresh_replica_does() {
        let mut groups: BTreeMap<u32, Vec<ServiceKey>> = BTreeMap::new();
        for i in 0..5000 {
            groups
                .entry(home_slot(&key(i), 30))
                .or_default()
                .push(key(i));
        }
        let keys: Vec<ServiceKey> = groups
            .into_values()
            .filter(|g| g.len() >= 5)
            .take(3)
            .flat_map(|g| g.into_iter().take(5))
            .collect();
        assert_eq!(keys.len(), 15);
        let violations = random_walk(Q, &keys);
        assert!(violations.is_empty(), "{violations:#?}");
    }

    /// The same walk without a quarantine (the allocation before #33): keys take addresses
    /// others held in the previous step, hundreds of times.
    #[test]
    fn without_a_quarantine_the_walk_hands_addresses_over() {
        let violations = random_walk(Duration::ZERO, &(0..16).map(key).collect::<Vec<_>>());
        eprintln!(
            "{} violations, e.g. {:#?}",
            violations.len(),
            &violations[..violations.len().min(2)]
        );
        assert!(violations.len() > 100, "{violations:#?}");
    }

    fn random_walk(quarantine: Duration, keys: &[ServiceKey]) -> Vec<String> {
        let mut rng = Rng(0x51_7cc1_b727_220a);
        let t0 = Instant::now();
        let mut violations = Vec::new();
        for round in 0..20 {
            let mut v = Vips::new(CIDR);
            v.set_quarantine(quarantine);
            let mut w = Watch::default();
            let mut current: BTreeMap<ServiceKey, u64> = BTreeMap::new();
            let mut all = BTreeSet::new();
            let mut now = t0 + Duration::from_secs(1000 * round);
            let mut next_order = 0;
            for step in 0..300 {
                let k = keys[rng.below(keys.len() as u64) as usize].clone();
                all.insert(k.clone());
                next_order += 1;
                let want = match rng.below(6) {
                    0 | 1 => None,
                    // Re-dated: younger than everyone (a rolling deploy), or a date already
                    // seen (an older instance left).
                    2 => Some(next_order),
                    3 => Some(rng.below(next_order)),
                    _ => current.get(&k).copied().or(Some(next_order)),
                };
                match want {
                    Some(o) => current.insert(k.clone(), o),
                    None => current.remove(&k),
                };
                v.set(&k, want.map(|o| Some(CreationOrder::new(o))));
                now += Duration::from_millis(rng.below(4000));
                let mut changed = BTreeSet::new();
                v.settle(now, &mut changed);
                w.step(
                    &v,
                    &all,
                    now,
                    &changed,
                    &format!("round {round} step {step}"),
                );
                for k in current.keys() {
                    assert!(
                        v.get(k).is_some() || current.len() > 12,
                        "round {round} step {step}: {k:?} unserved"
                    );
                }
            }
            // Quiet: settle at each deadline the allocator names.
            let mut rounds = 0;
            while let Some(deadline) = v.next_deadline() {
                rounds += 1;
                assert!(rounds <= 100, "round {round}: never settles");
                now = now.max(deadline);
                let mut changed = BTreeSet::new();
                v.settle(now, &mut changed);
                w.step(
                    &v,
                    &all,
                    now,
                    &changed,
                    &format!("round {round} quiet {rounds}"),
                );
            }
            let mut fresh = Vips::new(CIDR);
            for (k, o) in &current {
                fresh.set(k, Some(Some(CreationOrder::new(*o))));
            }
            fresh.settle(now, &mut BTreeSet::new());
            for k in &all {
                assert_eq!(v.get(k), fresh.get(k), "round {round}: {k:?} once settled");
            }
            violations.append(&mut w.violations);
        }
        violations
    }
}
