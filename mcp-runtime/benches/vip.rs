//! The virtual-IP allocator (`mcp_core::vip::Vips`, `--vip-cidr`): what one service joining or
//! leaving costs in a crowded range (BENCHMARKS.md, "Virtual IPs that do not move").
//!
//! 50,000 services join a /16 (65,534 slots, 76% full at the end) one at a time, in creation
//! order (each is the youngest when it joins, the usual case), then leave one at a time in a
//! shuffled order. Each operation is what the index does for one changed service: `Vips::set`
//! then `Vips::settle` (quarantine off, so the placement is served at once); `set` alone (the
//! placement) is timed too. The mean per
//! operation is taken over all of them, and over the last 5,000 joins (the range 69-76% full,
//! where the runs of taken slots are longest).
//!
//! Floor, in the same run: linear probing with no creation order and no re-placement: a map
//! from slot to key and one from key to slot, a join taking the first free slot from the key's
//! home (std's `DefaultHasher`), a leave freeing it. That is the bookkeeping any slot allocator
//! needs; what `Vips` adds is keeping each run of taken slots in creation order (a join or leave
//! places that run again) and the served set.
//!
//! Run: `cargo bench -p mcp-runtime --bench vip` (`VIP_BENCH_SERVICES=N`, `VIP_BENCH_PREFIX=P`
//! change the size; the defaults are 50,000 and 16).

mod common;

#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::hint::black_box;
use std::time::{Duration, Instant};

use mcp_core::model::{CreationOrder, ServiceKey};
use mcp_core::testing::bench::env_usize;
use mcp_core::vip::{VipCidr, Vips};

use common::machine;

/// The keys `svc-00000`.. in creation order, and a shuffled order for their leaves (a fixed
/// xorshift, so every run leaves in the same order).
fn keys(n: usize) -> (Vec<ServiceKey>, Vec<usize>) {
    let keys = (0..n)
        .map(|i| ServiceKey::new(format!("svc-{i:05}")))
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    (keys, order)
}

/// Per-operation times of one pass: the whole operation, and (ours) its `Vips::set` alone (the
/// placement, without serving it).
struct Pass {
    joins: Vec<Duration>,
    leaves: Vec<Duration>,
    join_sets: Vec<Duration>,
    leave_sets: Vec<Duration>,
}

fn ours(cidr: VipCidr, keys: &[ServiceKey], leave_order: &[usize]) -> Pass {
    let mut vips = Vips::new(cidr);
    let mut changed = BTreeSet::new();
    let mut joins = Vec::with_capacity(keys.len());
    let mut join_sets = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let t = Instant::now();
        vips.set(key, Some(Some(CreationOrder::new(i as u64 + 1))));
        let placed = Instant::now();
        vips.settle(placed, &mut changed);
        joins.push(t.elapsed());
        join_sets.push(placed - t);
        changed.clear();
    }
    let assigned = keys.iter().filter(|k| vips.get(k).is_some()).count();
    assert_eq!(assigned, keys.len(), "every service got an address");
    let mut leaves = Vec::with_capacity(keys.len());
    let mut leave_sets = Vec::with_capacity(keys.len());
    for &i in leave_order {
        let t = Instant::now();
        vips.set(&keys[i], None);
        let placed = Instant::now();
        vips.settle(placed, &mut changed);
        leaves.push(t.elapsed());
        leave_sets.push(placed - t);
        changed.clear();
    }
    assert!(
        keys.iter().all(|k| vips.get(k).is_none()),
        "every address freed"
    );
    Pass {
        joins,
        leaves,
        join_sets,
        leave_sets,
    }
}

fn home(key: &ServiceKey, count: u32) -> u32 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % u64::from(count)) as u32
}

fn floor(count: u32, keys: &[ServiceKey], leave_order: &[usize]) -> Pass {
    let mut holders: HashMap<u32, ServiceKey> = HashMap::new();
    let mut slots: HashMap<ServiceKey, u32> = HashMap::new();
    let mut joins = Vec::with_capacity(keys.len());
    for key in keys {
        let t = Instant::now();
        let mut slot = home(key, count);
        while holders.contains_key(&slot) {
            slot = (slot + 1) % count;
        }
        holders.insert(slot, key.clone());
        slots.insert(key.clone(), slot);
        joins.push(t.elapsed());
    }
    let mut leaves = Vec::with_capacity(keys.len());
    for &i in leave_order {
        let t = Instant::now();
        if let Some(slot) = slots.remove(&keys[i]) {
            black_box(holders.remove(&slot));
        }
        leaves.push(t.elapsed());
    }
    assert!(holders.is_empty());
    Pass {
        joins,
        leaves,
        join_sets: Vec::new(),
        leave_sets: Vec::new(),
    }
}

fn mean_us(d: &[Duration]) -> f64 {
    if d.is_empty() {
        return 0.0;
    }
    d.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e6 / d.len() as f64
}

fn p99_us(d: &[Duration]) -> f64 {
    let mut v: Vec<Duration> = d.to_vec();
    v.sort_unstable();
    v.get((v.len() * 99 / 100).min(v.len().saturating_sub(1)))
        .map_or(0.0, |x| x.as_secs_f64() * 1e6)
}

fn main() {
    let smoke = common::smoke();
    let n = env_usize("VIP_BENCH_SERVICES", if smoke { 150 } else { 50_000 });
    let prefix = env_usize("VIP_BENCH_PREFIX", if smoke { 24 } else { 16 });
    let cidr: VipCidr = format!("10.96.0.0/{prefix}")
        .parse()
        .unwrap_or_else(|e| panic!("10.96.0.0/{prefix}: {e}"));
    let count = (1u32 << (32 - prefix)) - 2;
    assert!(n <= count as usize, "{n} services do not fit a /{prefix}");
    let (keys, leave_order) = keys(n);
    let runs = if smoke { 1 } else { 3 };
    let tail = (n / 10).max(1);

    println!();
    println!(
        "== VIP allocator: {n} joins into a /{prefix} ({count} slots, {:.0}% full at the end), then {n} leaves; set + settle per operation ==",
        n as f64 * 100.0 / f64::from(count)
    );
    println!(
        "machine: {}; load average {}",
        machine(),
        mcp_core::testing::bench::load_average()
    );
    println!("(us per operation; \"set\": Vips::set alone, the placement; the rest: set + settle)");
    println!(
        "{:<4} {:>9} {:>10} {:>9} {:>13} {:>10} {:>10} {:>10} | {:>10} {:>11}",
        "run",
        "join set",
        "join mean",
        "join p99",
        "last 10% join",
        "leave set",
        "leave mean",
        "leave p99",
        "floor join",
        "floor leave"
    );
    for run in 1..=runs {
        let f = floor(count, &keys, &leave_order);
        let o = ours(cidr, &keys, &leave_order);
        println!(
            "{run:<4} {:>9.2} {:>10.2} {:>9.2} {:>13.2} {:>10.2} {:>10.2} {:>10.2} | {:>10.3} {:>11.3}",
            mean_us(&o.join_sets),
            mean_us(&o.joins),
            p99_us(&o.joins),
            mean_us(&o.joins[n - tail..]),
            mean_us(&o.leave_sets),
            mean_us(&o.leaves),
            p99_us(&o.leaves),
            mean_us(&f.joins),
            mean_us(&f.leaves),
        );
        println!(
            "     ratio to the floor (set + settle / set alone): join {:.1}x / {:.1}x, leave {:.1}x / {:.1}x",
            mean_us(&o.joins) / mean_us(&f.joins).max(1e-6),
            mean_us(&o.join_sets) / mean_us(&f.joins).max(1e-6),
            mean_us(&o.leaves) / mean_us(&f.leaves).max(1e-6),
            mean_us(&o.leave_sets) / mean_us(&f.leaves).max(1e-6)
        );
    }
}
