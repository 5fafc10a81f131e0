//! Live heap bytes: what the process holds allocated right now, apart from what its allocator
//! keeps mapped for later.
//!
//! Resident memory says little about a leak over minutes: mimalloc keeps freed pages until a
//! thread that owns them allocates or frees again, so the same work leaves a few megabytes more
//! or less resident depending on which thread did it (a ZooKeeper adapter's resident memory
//! moves by 10 MiB between reconnects that leave nothing behind). The bytes handed out and not
//! yet freed do not move unless something is kept. An adapter's binary wraps its allocator in
//! [`Counted`]; `/metrics` then has `mcp_adapter_heap_bytes` ([`LiveHeap`]).
//!
//! Each thread adds its allocations and frees to a counter of its own and moves the sum to the
//! shared one once it is 16 KiB either way: one shared atomic per allocation would make every
//! allocation of every thread contend for one cache line. So the shared sum is off by up to
//! 16 KiB per running thread. A thread that ends moves its last sum first
//! ([`flush_this_thread`], which the adapters' runtime calls as each of its threads stops): the
//! count stays exact to that bound however many threads come and go (the blocking pool's do,
//! all the time). It is a call, not a thread-local destructor: registering one can allocate,
//! which an allocator must not do. A thread the runtime does not own (none in the adapters)
//! would still take its last sum, at most 16 KiB, with it.
//!
//! The one library module of the workspace that may use `unsafe` (`GlobalAlloc` is an unsafe
//! trait); its bench, which calls it directly, is the one other file.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::IntGauge;

/// What a thread moves to the shared sum at once.
const MOVE_BYTES: i64 = 16 * 1024;

/// Bytes allocated and not freed, over every thread's moved sums.
static LIVE: AtomicI64 = AtomicI64::new(0);
/// Set by the first allocation through [`Counted`]: the sum means something.
static COUNTING: AtomicBool = AtomicBool::new(false);

thread_local! {
    // Const-initialised and without a destructor: reading it never allocates, which an
    // allocator must not do.
    static PENDING: Cell<i64> = const { Cell::new(0) };
}

/// Adds `delta` bytes to this thread's sum, moving it to the shared one once large.
#[inline(always)]
fn note(delta: i64) {
    let moved = PENDING.try_with(|p| {
        let sum = p.get() + delta;
        if sum.unsigned_abs() < MOVE_BYTES as u64 {
            p.set(sum);
        } else {
            p.set(0);
            move_to_shared(sum);
        }
    });
    if moved.is_err() {
        // The thread is being torn down: straight to the shared sum.
        move_to_shared(delta);
    }
}

/// Adds a thread's sum to the shared one (once per 16 KiB: kept out of the inlined path).
#[inline(never)]
fn move_to_shared(sum: i64) {
    LIVE.fetch_add(sum, Ordering::Relaxed);
}

/// Moves this thread's unmoved count to the shared sum: for a thread about to end (the
/// adapters' runtime calls it as each of its threads stops).
pub fn flush_this_thread() {
    let _ = PENDING.try_with(|p| {
        let sum = p.replace(0);
        if sum != 0 {
            move_to_shared(sum);
        }
    });
}

/// A global allocator that counts the bytes it hands out and takes back, around `A`.
#[derive(Debug, Default)]
pub struct Counted<A>(pub A);

impl<A> Counted<A> {
    #[inline(always)]
    fn noted(&self, ptr: *mut u8, bytes: usize) -> *mut u8 {
        if !ptr.is_null() {
            // A load of a line no thread writes after the first allocation: next to free.
            if !COUNTING.load(Ordering::Relaxed) {
                COUNTING.store(true, Ordering::Relaxed);
            }
            note(bytes as i64);
        }
        ptr
    }
}

// SAFETY: every call goes to `A` unchanged; the counting reads and writes only atomics and a
// const-initialised thread-local, and allocates nothing.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counted<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees, passed on.
        self.noted(unsafe { self.0.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees, passed on.
        self.noted(unsafe { self.0.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's guarantees, passed on.
        unsafe { self.0.dealloc(ptr, layout) };
        note(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's guarantees, passed on.
        let moved = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            note(new_size as i64 - layout.size() as i64);
        }
        moved
    }
}

/// Bytes allocated through [`Counted`] and not freed (off by up to 16 KiB per thread), or
/// `None` when this binary's allocator does not count.
pub fn live_bytes() -> Option<u64> {
    COUNTING
        .load(Ordering::Relaxed)
        .then(|| LIVE.load(Ordering::Relaxed).max(0) as u64)
}

/// `mcp_adapter_heap_bytes`, read from [`live_bytes`] at each scrape.
#[derive(Debug)]
pub struct LiveHeap(IntGauge);

impl LiveHeap {
    /// The collector, when this binary counts (`None` otherwise: no series rather than a 0).
    pub fn when_counting() -> Result<Option<Self>, prometheus::Error> {
        if live_bytes().is_none() {
            return Ok(None);
        }
        let gauge = IntGauge::new(
            "mcp_adapter_heap_bytes",
            "Bytes allocated and not freed (the live heap, without what the allocator keeps \
             mapped; within 16 KiB per thread). Unlike resident memory it grows only when \
             something is kept.",
        )?;
        Ok(Some(Self(gauge)))
    }
}

impl Collector for LiveHeap {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if let Some(bytes) = live_bytes() {
            self.0.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        self.0.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::alloc::System;
    use std::sync::Mutex;

    /// The sum is the process's: the tests that read it take turns.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// #43 item 7: threads that each hold a little (below one move) and end, as the blocking
    /// pool's do, in the adapters' runtime ([`crate::entry::runtime`]). Flushed as they stop,
    /// the sum is exact; before, each took its count with it and the sum drifted down by what
    /// they held, without bound.
    #[test]
    fn threads_that_end_leave_no_drift() {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        static COUNTED: Counted<System> = Counted(System);
        let layout = Layout::from_size_align(8 * 1024, 8).expect("layout");
        let before = LIVE.load(Ordering::Relaxed);
        let runtime = crate::entry::runtime().expect("runtime");
        let ptrs: Vec<usize> = runtime.block_on(async {
            let mut ptrs = Vec::new();
            for _ in 0..64 {
                // Each on a blocking-pool thread; a new one each time, as the previous is busy
                // for a moment.
                let p = tokio::task::spawn_blocking(move || {
                    // SAFETY: a non-zero size; freed below with its layout.
                    let p = unsafe { COUNTED.alloc(layout) } as usize;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    p
                });
                ptrs.push(p);
            }
            let mut out = Vec::new();
            for p in ptrs {
                out.push(p.await.expect("task"));
            }
            out
        });
        // Every thread of the runtime stops.
        runtime.shutdown_timeout(std::time::Duration::from_secs(10));
        let held = LIVE.load(Ordering::Relaxed) - before;
        assert_eq!(held, 64 * 8 * 1024, "what the ended threads hold");
        for p in ptrs {
            // SAFETY: allocated above with `layout`.
            unsafe { COUNTED.dealloc(p as *mut u8, layout) };
        }
        flush_this_thread();
        assert_eq!(
            LIVE.load(Ordering::Relaxed) - before,
            0,
            "all freed: no drift"
        );
    }

    /// The counting allocator, called directly (the test binary's own allocator is the
    /// system's): the shared sum follows what is held, within one move per thread, and the
    /// metric reads it at each scrape.
    #[test]
    fn the_sum_follows_what_is_held_and_the_metric_reads_it() {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let counted = Counted(System);
        let before = LIVE.load(Ordering::Relaxed);
        let layout = Layout::from_size_align(1024, 8).expect("layout");
        let mut held = Vec::new();
        for _ in 0..1024 {
            // SAFETY: a non-zero size; each pointer is freed below with its layout.
            held.push(unsafe { counted.alloc(layout) });
        }
        let grown = LIVE.load(Ordering::Relaxed) - before;
        assert!(
            (1024 * 1024 - MOVE_BYTES..=1024 * 1024).contains(&grown),
            "1 MiB held, the sum grew by {grown}"
        );
        assert_eq!(live_bytes().map(|_| ()), Some(()), "counting once used");
        let wider = Layout::from_size_align(4096, 8).expect("layout");
        for p in &mut held {
            // SAFETY: allocated above with `layout`.
            *p = unsafe { counted.realloc(*p, layout, wider.size()) };
        }
        let grown = LIVE.load(Ordering::Relaxed) - before;
        assert!(
            (4 * 1024 * 1024 - MOVE_BYTES..=4 * 1024 * 1024 + MOVE_BYTES).contains(&grown),
            "4 MiB held after realloc, the sum grew by {grown}"
        );
        for p in held {
            // SAFETY: reallocated above to `wider`.
            unsafe { counted.dealloc(p, wider) };
        }
        let left = LIVE.load(Ordering::Relaxed) - before;
        assert!(left.abs() <= MOVE_BYTES, "all freed, {left} left");

        // The metric reads the sum at each scrape (one test: the sum is the process's).
        let heap = LiveHeap::when_counting()
            .expect("metric")
            .expect("counting");
        let big = Layout::from_size_align(5 << 20, 8).expect("layout");
        // SAFETY: a non-zero size, freed below.
        let p = unsafe { counted.alloc(big) };
        let held = heap.collect()[0].get_metric()[0].get_gauge().get_value();
        // SAFETY: allocated above with `big`.
        unsafe { counted.dealloc(p, big) };
        let freed = heap.collect();
        assert_eq!(freed[0].name(), "mcp_adapter_heap_bytes");
        let freed = freed[0].get_metric()[0].get_gauge().get_value();
        assert!(
            held - freed >= f64::from((5 << 20) - 2 * MOVE_BYTES as i32),
            "5 MiB held then freed: {held} -> {freed}"
        );
    }
}
