//! Scale harness (issue #12) on the shipped binary: `target/release/adapter-file` with its default
//! flags (only `--path`, `--listen` and `--admin-listen` are given) serving generated inventories
//! of S services x 10 endpoints, with real xDS sinks in a separate process (this binary
//! re-executed with `--sinks`), so neither their memory nor their CPU is the adapter's.
//!
//! ```sh
//! cargo build --release -p adapter-file
//! cargo bench -p e2e --bench scale                         # full run, up to 1M endpoints
//! MCP_SCALE_MAX=100000 cargo bench -p e2e --bench scale    # quick run, up to 100k endpoints
//! scripts/plot-scale.sh                                    # target/scale/*.csv -> benchmarks/scale.png
//! ```
//!
//! What it measures, each against a floor measured in the same run:
//! - **RSS vs sinks**: a fresh adapter at 100k endpoints per sink count (0, 1, 5, 10, 21, 50,
//!   100 SotW sinks that connect at once); VmRSS/VmHWM from `/proc/<pid>/status` once every sink
//!   holds the full set and the process has settled; the per-sink cost is the least-squares slope.
//!   Floors: the adapter on an empty directory; the encoded size of the set.
//! - **Per size** (10k, 100k, 300k, 1M endpoints): spawn -> `/readyz`; registry `Reset` ->
//!   snapshot published, from the adapter's own log timestamps (the file registry's `Sending full
//!   set.` debug line, the core's `Publishing a new served set.`); full SotW push to 10 and to 1
//!   sink(s) that connect at once, until the last one holds every resource; RSS with 0 and 10
//!   sinks. Floors: prost build+encode of the same services (no validation, no hashing); a bare
//!   tonic ADS server replaying the adapter's exact response bytes to the same sinks.
//! - **At the largest size**: idle CPU (`utime + stime` of the adapter over 60 s, 10 sinks
//!   connected, nothing changing), then one changed service -> delta sink. adapter-file polls its
//!   files (`--poll-interval 1s`), so the time from the write includes 0-1 s of waiting for the
//!   poll; the harness watches the inventory directory with inotify and times from the moment
//!   the adapter *opens* the changed file (`IN_OPEN`), which is when it noticed the change. Each
//!   change edits the first service of the next file (a file is not edited again within 3.5 s,
//!   so the scanner's re-read of recently modified files cannot be mistaken for a change), and
//!   the log splits the time into read+parse (open -> the file registry's `Sending changes.`,
//!   or `Sending full set.` for a Reset), the core (-> published) and the push (published -> sink).
//!
//! Layout: `main.rs` runs the phases in order; [`phases`] holds them and the knobs, [`inventory`]
//! the generator and the prost floor, [`adapter`] the process under test, [`sinks`] and [`xds`]
//! the out-of-process sinks, [`floor`] the push floor server, [`delta`] the one-change phase,
//! [`report`] the CSV files and the table, [`util`] the small helpers. What a process costs is
//! read from `/proc` with `mcp_core::testing::bench`, shared with the core benches (mcp-runtime/benches).
//!
//! Inventories are cached under `target/scale/inventory-<S>x10-f<per file>/` (1000 services per
//! file; adapter-file reads files up to 16 MiB by default). Results: a table on stdout and CSV
//! files in `target/scale/` (`rss_vs_sinks.csv`, `push_vs_endpoints.csv`, `sizes.csv`,
//! `delta.csv`, `targets.csv`, `run.txt`).
//!
//! Knobs (environment):
//! | variable | default | |
//! |---|---|---|
//! | `MCP_SCALE_MAX` | 1000000 | largest inventory in endpoints; sizes are 10k, 100k, 300k, 1M up to it |
//! | `MCP_SCALE_SIZES` | | explicit comma-separated endpoint counts (multiples of 10) |
//! | `MCP_SCALE_RSS_ENDPOINTS` | 100000 | size of the RSS-vs-sinks sweep (capped by the max) |
//! | `MCP_SCALE_RSS_SINKS` | 0,1,5,10,21,50,100 | sink counts of the sweep |
//! | `MCP_SCALE_PUSH_SINKS` | 10 | sinks that connect at once in the per-size push |
//! | `MCP_SCALE_IDLE_SECS` | 60 | idle CPU window |
//! | `MCP_SCALE_CHANGES` | 100 | one-service changes for the delta latency |
//! | `MCP_SCALE_FILE_SERVICES` | 1000 | services per inventory file |
//! | `MCP_SCALE_SETTLE_MS` | 2000 | wait before reading RSS |
//! | `MCP_SCALE_SKIP` | | comma-separated phases to skip: `rss`, `floor`, `idle`, `delta` |
//! | `MCP_SCALE_ADAPTER` | `target/release/adapter-file` | the binary under test |
//! | `MCP_SCALE_ADAPTER_ARGS` | | extra adapter flags, e.g. `--max-file-size 512MiB` for one big file |

mod adapter;
mod delta;
mod floor;
mod inventory;
mod phases;
mod report;
mod sinks;
#[path = "../smoke/mod.rs"]
mod smoke;
mod util;
mod xds;

use std::fs;
use std::time::{Duration, Instant, UNIX_EPOCH};

use e2e::target_dir;
use mcp_core::testing::bench::{clock_ticks, command_line};

use crate::inventory::Inventory;
use crate::phases::{rss_point, size_run, Ctx, Knobs, SizeRow};
use crate::report::{report, Run};
use crate::sinks::sinks_main;
use crate::util::{machine, now_ns};

/// Endpoints per service.
const EPS: usize = 10;
/// Namespace of every generated service.
const NAMESPACE: &str = "scale";
/// How long the sinks (and the floor's recorder) may wait for a full set.
const PUSH_TIMEOUT: Duration = Duration::from_secs(600);
const MB: f64 = 1e6;
const MIB: f64 = 1048576.0;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--sinks") {
        sinks_main(&args[i + 1..]);
        return;
    }
    let wall = Instant::now();
    let knobs = Knobs::from_env();
    assert!(
        knobs.adapter.exists(),
        "{} missing: run `cargo build --release -p adapter-file` first",
        knobs.adapter.display()
    );
    let root = target_dir()
        .parent()
        // A smoke run writes beside a real run's results, not over them
        // (scripts/plot-scale.sh reads target/scale).
        .map(|t| {
            t.join(if smoke::smoke() {
                "scale-smoke"
            } else {
                "scale"
            })
        })
        .expect("target directory");
    let logs = root.join("logs");
    fs::create_dir_all(&logs).expect("create target/scale/logs");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ticks = clock_ticks();
    let machine = machine();
    let commit = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !command_line("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let built = fs::metadata(&knobs.adapter)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    eprintln!(
        "[scale] adapter {} (built {} s ago); sizes {:?}; machine: {machine}",
        knobs.adapter.display(),
        (now_ns() / 1_000_000_000).saturating_sub(built),
        knobs.sizes
    );
    let mut ctx = Ctx {
        knobs,
        root,
        rt,
        logs,
        starts: 0,
    };

    // Floor: the adapter with nothing to serve.
    let empty = Inventory::ensure(&ctx.root, 0, ctx.knobs.per_file);
    let mut a = ctx.start_adapter(&empty.dir);
    a.wait_ready();
    std::thread::sleep(ctx.knobs.settle);
    let empty_mem = a.mem();
    drop(a);
    eprintln!("[scale] empty adapter: {empty_mem}");

    let sizes = ctx.knobs.sizes.clone();
    let rows: Vec<SizeRow> = sizes
        .iter()
        .map(|&endpoints| size_run(&mut ctx, endpoints, ticks))
        .collect();

    let mut rss_rows = Vec::new();
    if ctx.knobs.runs("rss") {
        let inv = Inventory::ensure(&ctx.root, ctx.knobs.rss_endpoints / EPS, ctx.knobs.per_file);
        for n in ctx.knobs.rss_sinks.clone() {
            rss_rows.push(rss_point(&mut ctx, &inv, n));
        }
    }
    let run = Run {
        machine,
        commit,
        dirty,
        wall_s: wall.elapsed().as_secs_f64(),
        ticks,
        empty_mem,
    };
    report(&ctx, &run, &rows, &rss_rows);
}
