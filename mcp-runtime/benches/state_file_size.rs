//! Issue #22: how large `--state-file` grows, to size the volume that holds it (the state
//! emptyDir's `sizeLimit` in deploy/kubernetes and in the Helm chart).
//!
//! For 1k, 10k and 100k services x 10 endpoints shaped like a real registry's
//! (`mcp_core::testing::shaped`), the set is translated and encoded as an adapter serves it,
//! written by the adapter's own `state_file::save` and read back by `state_file::load`. Printed
//! per size: the file, bytes per endpoint, and how long writing (with its two fsyncs) and
//! reading took.
//!
//! While a new set is written the old file stays until the rename, so the volume holds up to
//! twice the file (with `--shards`, every shard's file and its temporary one at once: twice the
//! whole set).
//!
//! Run: `cargo bench -p mcp-runtime --bench state_file_size` (`STATE_FILE_SERVICES=1000,10000` for a
//! quick run).

mod common;

#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

use std::time::Instant;

use mcp_core::cache::state_file;
use mcp_core::index::Index;
use mcp_core::metrics::Metrics;
use mcp_core::RegistryEvent;

use common::machine;
use mcp_core::testing::shaped::{model, ENDPOINTS};

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];

fn main() {
    let sizes: Vec<usize> = std::env::var("STATE_FILE_SERVICES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| {
            if common::smoke() {
                vec![10]
            } else {
                SIZES.to_vec()
            }
        });
    let dir = std::env::temp_dir().join(format!("mcp-state-file-size-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the files");
    println!();
    println!("== state file size, services x {ENDPOINTS} endpoints ==");
    println!("machine: {}", machine());
    println!(
        "{:>9} {:>10} {:>12} {:>12} {:>10} {:>10}",
        "services", "endpoints", "file", "B/endpoint", "write", "read"
    );
    for services in sizes {
        let mut index = Index::new(
            common::translate_config(),
            Metrics::new("bench").expect("metrics"),
        );
        index.apply(RegistryEvent::Reset(model(services)));
        let snapshot = index.flush().expect("a snapshot");
        assert_eq!(snapshot.len(), services, "every service served");

        let path = dir.join(format!("state-{services}.pb"));
        let t = Instant::now();
        state_file::save(&path, &snapshot, &[]).expect("saved");
        let write = t.elapsed();
        let bytes = std::fs::metadata(&path).expect("written").len();
        let t = Instant::now();
        let back = state_file::load(&path)
            .expect("read")
            .expect("present")
            .snapshot;
        let read = t.elapsed();
        assert_eq!(back.version, snapshot.version, "the same set back");

        let endpoints = services * ENDPOINTS;
        println!(
            "{services:>9} {endpoints:>10} {:>8.2} MiB {:>12.1} {:>7.0} ms {:>7.0} ms",
            bytes as f64 / (1024.0 * 1024.0),
            bytes as f64 / endpoints as f64,
            write.as_secs_f64() * 1e3,
            read.as_secs_f64() * 1e3,
        );
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
