//! Issue #12: how many bytes one endpoint of the model costs while a registry's services exist.
//!
//! Builds 100k services x 10 endpoints (1M endpoints) shaped like a Kubernetes or Consul
//! registry (`mcp_core::testing::shaped`: three labels per endpoint, a locality, a service
//! account, ...).
//! The heap is read as VmRSS from /proc/self/status (the workspace forbids the `unsafe` a
//! counting allocator needs); mimalloc is the global allocator as in the adapters.
//!
//! Printed:
//! - the model: RSS growth while building it, per endpoint (the number issue #12 targets);
//! - a re-list: a second, equal model built while the first is alive (what an adapter holds
//!   while a Reset replaces the previous one), per endpoint;
//! - the build time of one model (conversion cost an adapter pays per full re-list).
//!
//! Run: `cargo bench -p mcp-runtime --bench model_size` (`MODEL_SIZE_SERVICES=10000` for a quick run).

mod common;

// The same allocator as the adapter binaries.
#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

use std::hint::black_box;
use std::time::Instant;

use mcp_core::testing::bench::Proc;

use common::machine;
use mcp_core::testing::shaped::{model, ENDPOINTS};

const SERVICES: usize = 100_000;

fn main() {
    let services: usize = std::env::var("MODEL_SIZE_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(common::scaled(SERVICES, 100));
    let endpoints = services * ENDPOINTS;
    // Warm up the allocator and the code paths on a small model first.
    black_box(model(100));

    let start = Proc::This.mem().rss_kib;
    let t = Instant::now();
    let first = model(services);
    let build = t.elapsed();
    let built = Proc::This.mem().rss_kib;
    let second = model(services);
    let relisted = Proc::This.mem();
    assert!(first == second, "equal input, equal model");

    let per = |kib: u64| kib as f64 * 1024.0 / endpoints as f64;
    println!();
    println!(
        "== model size, {services} services x {ENDPOINTS} endpoints ({endpoints} endpoints) =="
    );
    println!("machine: {}", machine());
    println!(
        "model:          {:>8.1} MiB  {:>7.1} B/endpoint  ({:.0} MiB per 100k endpoints)",
        (built - start) as f64 / 1024.0,
        per(built - start),
        per(built - start) * 100_000.0 / (1024.0 * 1024.0),
    );
    println!(
        "second model:   {:>8.1} MiB  {:>7.1} B/endpoint  (an equal re-list while the first lives)",
        (relisted.rss_kib - built) as f64 / 1024.0,
        per(relisted.rss_kib - built),
    );
    println!(
        "build:          {:>8.1} ms   {:>7.1} ns/endpoint",
        build.as_secs_f64() * 1e3,
        build.as_nanos() as f64 / endpoints as f64
    );
    println!("peak RSS:       {:>8.1} MiB", relisted.hwm_mib());
    drop(second);
    drop(first);
}
