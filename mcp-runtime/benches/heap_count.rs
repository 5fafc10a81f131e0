//! What counting the live heap (`mcp_runtime::heap::Counted`, the adapters' allocator) costs
//! an allocation: the same allocate-then-free work through `Counted(MiMalloc)` and through
//! `MiMalloc` itself (the floor), in one process, on one thread and on two at once.
//!
//! Each round allocates 10,000 blocks of 16-256 bytes (the sizes of the model's strings and
//! vectors), touches them, frees them; the two allocators take turns, 40 rounds each, and each
//! reports its fastest round and its median (a busy machine slows some rounds, not the fastest).
//!
//! Run: `cargo bench -p mcp-runtime --bench heap_count` (~10 s).
//!
//! It calls both allocators directly, which takes `unsafe` (the one other file allowed it).

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::time::Instant;

use mcp_runtime::heap::Counted;
use mimalloc::MiMalloc;

const BLOCKS: usize = 10_000;
const ROUNDS: usize = 40;

static COUNTED: Counted<MiMalloc> = Counted(MiMalloc);
static PLAIN: MiMalloc = MiMalloc;

/// One round on `a`: the time per allocate + free pair.
fn round(a: &dyn GlobalAlloc, held: &mut Vec<(*mut u8, Layout)>) -> f64 {
    let start = Instant::now();
    for i in 0..BLOCKS {
        let size = 16 + (i * 37) % 241;
        let Ok(layout) = Layout::from_size_align(size, 8) else {
            continue;
        };
        // SAFETY: a non-zero size; freed below with the same layout.
        let p = unsafe { a.alloc(layout) };
        if !p.is_null() {
            // SAFETY: `p` holds at least 16 bytes.
            unsafe { p.write_volatile(i as u8) };
            held.push((p, layout));
        }
    }
    for (p, layout) in held.drain(..) {
        // SAFETY: allocated above by `a` with `layout`.
        unsafe { a.dealloc(black_box(p), layout) };
    }
    start.elapsed().as_secs_f64() * 1e9 / BLOCKS as f64
}

/// Fastest and median of `ROUNDS` rounds of each, taking turns; on `threads` threads at once.
fn measure(threads: usize) -> [(f64, f64); 2] {
    let per_thread = || {
        let mut held = Vec::with_capacity(BLOCKS);
        let (mut counted, mut plain) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            counted.push(round(&COUNTED, &mut held));
            plain.push(round(&PLAIN, &mut held));
        }
        (counted, plain)
    };
    let (mut counted, mut plain) = (Vec::new(), Vec::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(per_thread)).collect();
        for h in handles {
            if let Ok((c, p)) = h.join() {
                counted.extend(c);
                plain.extend(p);
            }
        }
    });
    [&mut counted, &mut plain].map(|v| {
        v.sort_unstable_by(f64::total_cmp);
        (v[0], v[v.len() / 2])
    })
}

fn main() {
    println!("allocate + free of 16-256 B blocks, {BLOCKS} per round, {ROUNDS} rounds each");
    println!("threads  allocator         fastest ns   median ns   ratio (median)");
    for threads in [1, 2] {
        let [counted, plain] = measure(threads);
        println!(
            "{threads:>7}  mimalloc (floor)  {:>10.1}  {:>10.1}        1.00",
            plain.0, plain.1
        );
        println!(
            "{threads:>7}  Counted(mimalloc) {:>10.1}  {:>10.1}  {:>10.2}",
            counted.0,
            counted.1,
            counted.1 / plain.1
        );
    }
}
