//! Virtual IPs for TCP services that the registry gives no address.
//!
//! Istio builds a listener on `0.0.0.0:<port>` for a ServiceEntry port that is not HTTP (or
//! TLS/SNI) when the entry has no `addresses`: every Dubbo interface on 20880, or every Consul
//! database on 5432, lands on the same listener, and the sidecar sends traffic to the wrong one.
//! Giving each such entry its own address makes the listeners distinct (clients reach it through
//! Istio's DNS proxy, which answers the host with this address).
//!
//! The allocation is a function of the set of services that need one and of the registry's own
//! creation facts ([`CreationOrder`]: Consul `CreateIndex`, ZooKeeper `czxid`, ...): the same on
//! every replica and after every restart, whatever each saw before. Each service has a home slot
//! (a stable hash of its key); of those wanting one slot the older keeps it and the younger takes
//! the next free one. So a service registered after those served never moves one of them; only
//! the leave (or re-dating) of an older service in the same run of taken slots can move a younger
//! one, towards its home. That placement is what replicas agree on; what is served follows it
//! only as fast as a quarantine allows ([`hold`]): an address a service let go of goes to no
//! other service for `--vip-quarantine`, so a re-dating never hands a live service's address to
//! another (ARCHITECTURE.md, "Virtual IPs").

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime};

use crate::model::{CreationOrder, Resolution, Service, ServiceKey};

mod hold;
mod saved;

pub use saved::{QuarantinedVip, SavedVip};

/// `--vip-quarantine` default: how long a slot a service stopped holding is kept from every
/// other service. Long enough for what clients cache an address for (DNS caches of 30-60 s,
/// the sidecars' own config update), short enough that replicas agree again soon after.
pub const DEFAULT_QUARANTINE: Duration = Duration::from_secs(300);

/// Protocols whose ports share a `0.0.0.0:<port>` listener safely (routed by Host header or SNI).
const SHARED_LISTENER_PROTOCOLS: [&str; 7] = [
    "HTTP",
    "HTTP2",
    "HTTP_PROXY",
    "GRPC",
    "GRPC-WEB",
    "HTTPS",
    "TLS",
];

/// A range that cannot serve as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VipError {
    /// `--shard INDEX/COUNT` with the default range: the part would hold no address.
    #[error("--shard {index}/{count}: the default --vip-cidr {range} cannot be split {count} ways (each part at most a /30); give each shard process its own --vip-cidr")]
    TooManyParts {
        /// The range to split.
        range: VipCidr,
        /// The shard.
        index: u64,
        /// Of how many.
        count: u64,
    },
}

/// `--vip-cidr`: the range virtual IPs come from, or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VipCidr {
    /// No virtual IPs.
    Off,
    /// An IPv4 range.
    Range {
        /// First address.
        base: Ipv4Addr,
        /// Prefix length, 8-30.
        prefix: u8,
    },
}

impl VipCidr {
    /// A range (for adapters' defaults).
    pub const fn range(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self::Range {
            base: Ipv4Addr::new(a, b, c, d),
            prefix,
        }
    }

    /// Part `index` of `count` of this range (`--shard INDEX/COUNT` with the default range):
    /// the range split into the next power of two of `count` equal CIDR blocks, block `index`.
    /// CIDR blocks so the part displays and configures as a range of its own; a count that is
    /// not a power of two leaves the last blocks unused.
    pub fn part(self, index: u64, count: u64) -> Result<Self, VipError> {
        let Self::Range { base, prefix } = self else {
            return Ok(self);
        };
        let bits = count.max(1).next_power_of_two().trailing_zeros();
        let sub = u32::from(prefix) + bits;
        if sub > 30 || index >= count {
            return Err(VipError::TooManyParts {
                range: self,
                index,
                count,
            });
        }
        let start = u32::from(base) + (u32::try_from(index).unwrap_or(0) << (32 - sub));
        Ok(Self::Range {
            base: Ipv4Addr::from(start),
            prefix: sub as u8,
        })
    }

    /// The address `key` gets from this range when no other service contests its slot (its
    /// home); `None` when off. For tests and tools that need to know which keys collide.
    pub fn home_address(self, key: &ServiceKey) -> Option<Ipv4Addr> {
        let (first, count) = self.slots()?;
        Some(Ipv4Addr::from(first + home_slot(key, count)))
    }

    /// Usable addresses (network and broadcast addresses left out) as (first, count).
    fn slots(self) -> Option<(u32, u32)> {
        match self {
            Self::Off => None,
            Self::Range { base, prefix } => {
                let size = 1u32 << (32 - u32::from(prefix));
                Some((u32::from(base) + 1, size - 2))
            }
        }
    }
}

impl fmt::Display for VipCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Range { base, prefix } => write!(f, "{base}/{prefix}"),
        }
    }
}

impl FromStr for VipCidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("off") || s.is_empty() {
            return Ok(Self::Off);
        }
        let (ip, prefix) = s.split_once('/').ok_or_else(|| {
            format!("invalid --vip-cidr {s:?}: expected e.g. 242.3.0.0/16 or off")
        })?;
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|e| format!("invalid --vip-cidr {s:?}: {e} (IPv4 only)"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| (8..=30).contains(p))
            .ok_or_else(|| format!("invalid --vip-cidr {s:?}: prefix length must be 8 to 30"))?;
        let mask = u32::MAX << (32 - u32::from(prefix));
        if u32::from(ip) & !mask != 0 {
            return Err(format!(
                "invalid --vip-cidr {s:?}: host bits set (did you mean {}/{prefix}?)",
                Ipv4Addr::from(u32::from(ip) & mask)
            ));
        }
        Ok(Self::Range { base: ip, prefix })
    }
}

/// Whether `s` needs a virtual IP: no address of its own, endpoints the proxy resolves itself,
/// and a port that would otherwise share a wildcard listener.
pub fn needs_vip(s: &Service) -> bool {
    s.addresses.is_empty()
        && s.resolution != Resolution::None
        && s.ports.iter().any(|p| {
            !p.protocol.as_deref().is_some_and(|proto| {
                SHARED_LISTENER_PROTOCOLS
                    .iter()
                    .any(|x| x.eq_ignore_ascii_case(proto))
            })
        })
}

/// A member's place in line for a slot: services the registry dates come first, oldest first,
/// then the others; the key breaks what ties remain.
type Rank = (bool, Option<CreationOrder>, ServiceKey);

#[derive(Debug)]
struct Member {
    order: Option<CreationOrder>,
    slot: Option<u32>,
}

/// The services that need a VIP and what they got.
///
/// The allocation is what placing every member in creation order gives, each taking the first
/// free slot from its home on: a function of the set and the registry's creation facts, so
/// replicas agree however they came to it. It is kept incrementally: with linear probing the
/// occupied slots do not depend on the order of placement, and a member's slot depends only on
/// the members of its run (the maximal stretch of occupied slots holding it), so a join or leave
/// places again only the members of the one run it touches, in creation order. A member that
/// joins after every member of its run (the usual case: it was created last) therefore moves no
/// one.
#[derive(Debug)]
pub struct Vips {
    cidr: VipCidr,
    members: HashMap<ServiceKey, Member>,
    /// Slot -> the member placed in it.
    holders: HashMap<u32, ServiceKey>,
    /// Members whose placed slot changed since the last [`Vips::settle`].
    moved: BTreeSet<ServiceKey>,
    /// What is served: the placement, held back by the quarantine of freed slots.
    hold: hold::Hold,
}

impl Vips {
    /// Allocates from `cidr`, serving the placement at once (no quarantine: see
    /// [`Vips::set_quarantine`]).
    pub fn new(cidr: VipCidr) -> Self {
        Self {
            cidr,
            members: HashMap::new(),
            holders: HashMap::new(),
            moved: BTreeSet::new(),
            hold: hold::Hold::new(Duration::ZERO),
        }
    }

    /// How long a freed slot is kept from every other service (`--vip-quarantine`; zero
    /// serves the placement at once, trading two services' addresses when they swap places).
    pub fn set_quarantine(&mut self, quarantine: Duration) {
        self.hold.set_quarantine(quarantine);
    }

    /// Serves the placement as far as the quarantine allows at `now`; adds to `changed` every
    /// key whose served address changed. Call after [`Vips::set`]s, and at
    /// [`Vips::next_deadline`].
    pub fn settle(&mut self, now: Instant, changed: &mut BTreeSet<ServiceKey>) {
        let Some((_, count)) = self.cidr.slots() else {
            return;
        };
        let work = std::mem::take(&mut self.moved);
        self.hold
            .settle(&self.members, &self.holders, count, work, now, changed);
    }

    /// When a service waiting for a quarantined slot may move (call [`Vips::settle`] then).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.hold.next_deadline()
    }

    /// The addresses in quarantine at `now`, in address order (for `--state-file` and
    /// `/debug/resources`).
    pub fn quarantined(&self, now: Instant) -> Vec<QuarantinedVip> {
        let Some((first, _)) = self.cidr.slots() else {
            return Vec::new();
        };
        let mut out: Vec<QuarantinedVip> = self
            .hold
            .quarantined(now)
            .map(|(slot, key, until)| QuarantinedVip {
                address: Ipv4Addr::from(first + slot),
                released_by: key.clone(),
                until,
            })
            .collect();
        out.sort_unstable_by_key(|q| q.address);
        out
    }

    /// Quarantines again the addresses `saved` by an earlier run (`--state-file`) for what is
    /// left of their time at the wall-clock time `wall` (read at `now`), at most
    /// `--vip-quarantine` ([`SavedVip::remaining`]); ended ones and addresses outside the range
    /// are dropped. Call before the first [`Vips::settle`]. Returns how many addresses are in
    /// quarantine then.
    pub fn restore_quarantine(
        &mut self,
        saved: &[SavedVip],
        wall: SystemTime,
        now: Instant,
    ) -> usize {
        let Some((first, count)) = self.cidr.slots() else {
            return 0;
        };
        let quarantine = self.hold.quarantine();
        for s in saved {
            let slot = u32::from(s.address).wrapping_sub(first);
            if let Some(left) = s.remaining(wall, quarantine).filter(|_| slot < count) {
                self.hold.restore(slot, &s.released_by(), now + left);
            }
        }
        self.hold.quarantined(now).count()
    }

    /// Whether allocation is on.
    pub fn enabled(&self) -> bool {
        self.cidr != VipCidr::Off
    }

    /// Records whether `key` needs an address (`Some`, with the registry's creation order of
    /// the service, if any) or not (`None`); what is served changes at [`Vips::settle`]. True
    /// if membership or order changed.
    pub fn set(&mut self, key: &ServiceKey, want: Option<Option<CreationOrder>>) -> bool {
        let Some((_, count)) = self.cidr.slots() else {
            return false;
        };
        match (self.members.get(key), want) {
            (None, None) => return false,
            (Some(m), Some(order)) if m.order == order => return false,
            _ => {}
        }
        let mut moved = std::mem::take(&mut self.moved);
        self.place_key(key, want, count, &mut moved);
        self.moved = moved;
        true
    }

    /// [`Vips::set`]'s placement: adds to `changed` every key whose placed slot changed.
    fn place_key(
        &mut self,
        key: &ServiceKey,
        want: Option<Option<CreationOrder>>,
        count: u32,
        changed: &mut BTreeSet<ServiceKey>,
    ) {
        let before = self.members.len();
        let old = self.members.remove(key);
        let after = self.members.len() + usize::from(want.is_some());
        // A range with no free slot before or after has one run around the whole ring (and,
        // if crowded, members without a slot that a leave may let in): placed all again. Only
        // a full range costs that, and a full range is reported.
        if before.max(after) >= count as usize {
            if let Some(order) = want {
                self.members
                    .insert(key.clone(), Member { order, slot: None });
            }
            if let Some(slot) = old.and_then(|m| m.slot) {
                self.holders.remove(&slot);
                changed.insert(key.clone());
            }
            self.place_all(count, changed);
            return;
        }
        if let Some(slot) = old.and_then(|m| m.slot) {
            self.holders.remove(&slot);
            changed.insert(key.clone());
            let run = self.take_run(slot, count);
            self.place(run, count, changed);
        }
        if let Some(order) = want {
            self.members
                .insert(key.clone(), Member { order, slot: None });
            // With linear probing a join occupies the first free slot from its home, whatever
            // the order of placement: the run it lands in is that slot's, merged with the
            // runs on both sides.
            let mut free = home_slot(key, count);
            while self.holders.contains_key(&free) {
                free = (free + 1) % count;
            }
            let mut run = self.take_run(free, count);
            run.push(key.clone());
            self.place(run, count, changed);
        }
    }

    /// Frees the runs on both sides of the free slot `slot` (the run a slot filled there
    /// joins, or the one a member leaving it split) and returns their members.
    fn take_run(&mut self, slot: u32, count: u32) -> Vec<ServiceKey> {
        let mut keys = Vec::new();
        let mut s = (slot + count - 1) % count;
        while let Some(k) = self.holders.remove(&s) {
            keys.push(k);
            s = (s + count - 1) % count;
        }
        s = (slot + 1) % count;
        while let Some(k) = self.holders.remove(&s) {
            keys.push(k);
            s = (s + 1) % count;
        }
        keys
    }

    /// Places `keys` (whose slots are free) in creation order, each in the first free slot from
    /// its home.
    fn place(&mut self, keys: Vec<ServiceKey>, count: u32, changed: &mut BTreeSet<ServiceKey>) {
        let mut ranked: Vec<Rank> = keys
            .into_iter()
            .filter_map(|k| {
                let order = self.members.get(&k)?.order;
                Some((order.is_none(), order, k))
            })
            .collect();
        ranked.sort_unstable();
        for (_, _, key) in ranked {
            let mut slot = home_slot(&key, count);
            while self.holders.contains_key(&slot) {
                slot = (slot + 1) % count;
            }
            if let Some(m) = self.members.get_mut(&key) {
                if m.slot != Some(slot) {
                    m.slot = Some(slot);
                    changed.insert(key.clone());
                }
            }
            self.holders.insert(slot, key);
        }
    }

    /// Places every member again: the first `count` in creation order get a slot, the others
    /// none.
    fn place_all(&mut self, count: u32, changed: &mut BTreeSet<ServiceKey>) {
        let mut ranked: Vec<Rank> = self
            .members
            .iter()
            .map(|(k, m)| (m.order.is_none(), m.order, k.clone()))
            .collect();
        ranked.sort_unstable();
        self.holders.clear();
        let fits = (count as usize).min(ranked.len());
        for (_, _, key) in ranked.drain(fits..) {
            if let Some(m) = self.members.get_mut(&key) {
                if m.slot.take().is_some() {
                    changed.insert(key);
                }
            }
        }
        let keys: Vec<ServiceKey> = ranked.into_iter().map(|(_, _, k)| k).collect();
        let old: HashMap<ServiceKey, Option<u32>> = keys
            .iter()
            .filter_map(|k| Some((k.clone(), self.members.get_mut(k)?.slot.take())))
            .collect();
        let mut moved = BTreeSet::new();
        self.place(keys, count, &mut moved);
        for key in moved {
            let now = self.members.get(&key).and_then(|m| m.slot);
            if old.get(&key).copied().flatten() != now {
                changed.insert(key);
            }
        }
    }

    /// The address served for `key`, if it has one.
    pub fn get(&self, key: &ServiceKey) -> Option<Ipv4Addr> {
        let (first, _) = self.cidr.slots()?;
        let slot = self.hold.get(key)?;
        Some(Ipv4Addr::from(first + slot))
    }

    /// Members the range had no room for (the youngest), in key order.
    pub fn unassigned(&self) -> Vec<ServiceKey> {
        let Some((_, count)) = self.cidr.slots() else {
            return Vec::new();
        };
        if self.members.len() <= count as usize {
            return Vec::new();
        }
        let mut out: Vec<ServiceKey> = self
            .members
            .iter()
            .filter(|(_, m)| m.slot.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        out.sort_unstable();
        out
    }
}

/// Stable across processes, versions and platforms (xxh3 is a fixed algorithm).
fn home_slot(key: &ServiceKey, count: u32) -> u32 {
    let mut id = String::with_capacity(key.name.len() + 16);
    id.push_str(key.namespace.as_deref().unwrap_or(""));
    id.push('/');
    id.push_str(&key.name);
    (xxhash_rust::xxh3::xxh3_64(id.as_bytes()) % u64::from(count)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Port;
    use std::collections::BTreeMap;

    fn tcp(name: &str) -> Service {
        let mut s = Service::new(ServiceKey::new(name), name.to_string());
        s.ports.push(Port {
            number: 20880,
            name: "tcp".into(),
            protocol: Some("TCP".into()),
            target_port: None,
        });
        s
    }

    #[test]
    fn parses_ranges() {
        assert_eq!(
            "242.3.0.0/16".parse::<VipCidr>(),
            Ok(VipCidr::range(242, 3, 0, 0, 16))
        );
        assert_eq!("off".parse::<VipCidr>(), Ok(VipCidr::Off));
        assert!("242.3.0.1/16".parse::<VipCidr>().is_err());
        assert!("242.3.0.0/31".parse::<VipCidr>().is_err());
        assert!("fd00::/64".parse::<VipCidr>().is_err());
    }

    /// #33 item 6: `--shard i/n` processes each allocate from their own part of the range.
    #[test]
    fn parts_of_a_range_are_disjoint_cidr_blocks() {
        let r = VipCidr::range(242, 1, 0, 0, 16);
        assert_eq!(r.part(0, 1), Ok(r));
        assert_eq!(r.part(0, 2), Ok(VipCidr::range(242, 1, 0, 0, 17)));
        assert_eq!(r.part(1, 2), Ok(VipCidr::range(242, 1, 128, 0, 17)));
        assert_eq!(r.part(2, 3), Ok(VipCidr::range(242, 1, 128, 0, 18)));
        assert_eq!(r.part(63, 64), Ok(VipCidr::range(242, 1, 252, 0, 22)));
        assert_eq!(
            r.part(0, 1 << 14).map(|p| p.to_string()),
            Ok("242.1.0.0/30".into())
        );
        assert!(r.part(0, (1 << 14) + 1).is_err());
        assert!(r.part(2, 2).is_err());
        assert_eq!(VipCidr::Off.part(1, 2), Ok(VipCidr::Off));
        for n in 1..=9u64 {
            let mut seen = BTreeSet::new();
            for i in 0..n {
                let Ok(VipCidr::Range { base, prefix }) = r.part(i, n) else {
                    panic!("{i}/{n}")
                };
                let size = 1u32 << (32 - u32::from(prefix));
                for a in [u32::from(base), u32::from(base) + size - 1] {
                    assert!(seen.insert(a), "{i}/{n} overlaps");
                    assert_eq!(Ipv4Addr::from(a).octets()[..2], [242, 1]);
                }
            }
        }
    }

    #[test]
    fn who_needs_one() {
        assert!(needs_vip(&tcp("a")));
        let mut sniffed = tcp("a");
        sniffed.ports[0].protocol = None;
        assert!(
            needs_vip(&sniffed),
            "unknown protocol is sniffed on a wildcard listener"
        );
        let mut http = tcp("a");
        http.ports[0].protocol = Some("http".into());
        assert!(!needs_vip(&http));
        let mut own = tcp("a");
        own.addresses.push("10.1.2.3".into());
        assert!(!needs_vip(&own));
        let mut passthrough = tcp("a");
        passthrough.resolution = Resolution::None;
        assert!(!needs_vip(&passthrough));
    }

    use crate::testing::Rng;

    fn key(i: u64) -> ServiceKey {
        ServiceKey::new(format!("s{i}"))
    }

    /// Service `i` was created `i`-th (as the registry dates it).
    fn created(i: u64) -> Option<Option<CreationOrder>> {
        Some(Some(CreationOrder::new(1000 + i)))
    }

    /// A replica started now: every member added at once, in an order of its own.
    fn fresh(cidr: VipCidr, members: &[(ServiceKey, Option<CreationOrder>)], seed: u64) -> Vips {
        let mut v = Vips::new(cidr);
        let mut order: Vec<usize> = (0..members.len()).collect();
        let mut rng = Rng(seed | 1);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for i in order {
            v.set(&members[i].0, Some(members[i].1));
        }
        v.settle(Instant::now(), &mut BTreeSet::new());
        v
    }

    fn assert_same(a: &Vips, b: &Vips, members: &[(ServiceKey, Option<CreationOrder>)], at: &str) {
        for (k, _) in members {
            assert_eq!(a.get(k), b.get(k), "{k:?} {at}: replicas disagree");
        }
        assert_eq!(a.unassigned(), b.unassigned(), "{at}");
    }

    /// #22 item 6: hundreds of services joining one by one in a range so small that most of
    /// them collide; no address once given ever changes, only the newcomer gets one, and a
    /// replica started at any moment of that history (seeing the set at once, in another order)
    /// serves the same addresses. Before this allocator, the smaller key kept a contested slot
    /// and newcomers pushed served services away.
    #[test]
    fn newcomers_never_move_a_served_address_and_replicas_agree() {
        let cidr = VipCidr::range(242, 3, 0, 0, 23); // 510 usable addresses
        let mut v = Vips::new(cidr);
        let mut members = Vec::new();
        let mut given: HashMap<ServiceKey, Ipv4Addr> = HashMap::new();
        let mut probed = 0;
        // Keys in an order unrelated to creation: a newcomer often sorts before those served.
        for n in 0..450u64 {
            let i = (n * 7919) % 1000;
            let k = key(i);
            assert!(v.set(&k, created(n)));
            let mut changed = BTreeSet::new();
            v.settle(Instant::now(), &mut changed);
            assert_eq!(
                changed,
                BTreeSet::from([k.clone()]),
                "join {n} moved others"
            );
            let ip = v.get(&k).expect("room left");
            probed += usize::from(
                u32::from(ip) - u32::from(Ipv4Addr::new(242, 3, 0, 1)) != home_slot(&k, 510),
            );
            members.push((k.clone(), created(n).flatten()));
            given.insert(k, ip);
            for (m, ip) in &given {
                assert_eq!(v.get(m), Some(*ip), "{m:?} moved at join {n}");
            }
            if n % 50 == 49 {
                assert_same(
                    &v,
                    &fresh(cidr, &members, n),
                    &members,
                    &format!("after {n}"),
                );
            }
        }
        assert!(
            probed > 100,
            "only {probed} collisions: the test shows nothing"
        );
        let mut seen = BTreeSet::new();
        for ip in given.values() {
            assert!(seen.insert(*ip), "{ip} given twice");
            let o = ip.octets();
            assert_eq!(&o[..2], &[242, 3]);
            assert!(o[2] < 2 && !(o[2] == 0 && o[3] == 0) && !(o[2] == 1 && o[3] == 255));
        }
    }

    /// Joins, leaves and re-dated services at random in a tiny range (full at times): after
    /// every step the incremental allocation equals a replica's that saw only the current set,
    /// `changed` names every key whose address differs, and a join of the youngest moves no one.
    #[test]
    fn incremental_allocation_matches_a_fresh_replica() {
        let cidr = VipCidr::range(242, 3, 0, 0, 27); // 30 usable addresses
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut v = Vips::new(cidr);
        let mut current: BTreeMap<ServiceKey, Option<CreationOrder>> = BTreeMap::new();
        let mut next_order = 0u64;
        for step in 0..3000u64 {
            let k = key(rng.below(40));
            let want = match rng.below(10) {
                0..=3 => None,
                4 => Some(None),
                5 => Some(Some(CreationOrder::new(rng.below(50)))),
                _ => {
                    next_order += 1;
                    Some(Some(CreationOrder::new(100 + next_order)))
                }
            };
            let youngest = matches!(want, Some(Some(o)) if o.primary > 100)
                && !current.contains_key(&k)
                && current.values().all(Option::is_some)
                && current.len() < 29;
            let before: BTreeMap<ServiceKey, Option<Ipv4Addr>> =
                current.keys().map(|k| (k.clone(), v.get(k))).collect();
            v.set(&k, want);
            let mut changed = BTreeSet::new();
            v.settle(Instant::now(), &mut changed);
            match want {
                Some(order) => current.insert(k.clone(), order),
                None => current.remove(&k),
            };
            let members: Vec<_> = current.iter().map(|(k, o)| (k.clone(), *o)).collect();
            assert_same(
                &v,
                &fresh(cidr, &members, step),
                &members,
                &format!("step {step}"),
            );
            for (m, ip) in &before {
                if *m != k && v.get(m) != *ip {
                    assert!(changed.contains(m), "step {step}: {m:?} moved unreported");
                    assert!(!youngest, "step {step}: the youngest joining moved {m:?}");
                }
            }
            let assigned = current.keys().filter(|k| v.get(k).is_some()).count();
            assert_eq!(assigned, current.len().min(30), "step {step}");
        }
    }

    #[test]
    fn a_full_range_leaves_the_youngest_out_and_lets_it_in_when_one_leaves() {
        let cidr = VipCidr::range(242, 3, 0, 0, 30); // two usable addresses
        let mut v = Vips::new(cidr);
        let mut changed = BTreeSet::new();
        // "a" is the youngest though it sorts first.
        for (n, i) in [("b", 1), ("c", 2), ("a", 3)] {
            v.set(&ServiceKey::new(n), created(i));
        }
        v.settle(Instant::now(), &mut changed);
        assert_eq!(v.unassigned(), vec![ServiceKey::new("a")]);
        let b = v.get(&ServiceKey::new("b"));
        changed.clear();
        v.set(&ServiceKey::new("c"), None);
        v.settle(Instant::now(), &mut changed);
        assert!(changed.contains(&ServiceKey::new("c")));
        assert!(changed.contains(&ServiceKey::new("a")));
        assert_eq!(v.get(&ServiceKey::new("b")), b, "b stays");
        assert!(v.get(&ServiceKey::new("a")).is_some());
        assert!(v.unassigned().is_empty());
    }
}
