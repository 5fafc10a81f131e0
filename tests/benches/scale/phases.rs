//! The measured phases: the knobs that choose them, one run per inventory size (startup, push
//! to many sinks and to one, the push floor, and at the largest size idle CPU and the delta
//! phase), and the RSS-vs-sinks sweep.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::target_dir;
use mcp_core::testing::bench::Mem;

use crate::adapter::{AdapterProc, Startup};
use crate::delta::{delta_phase, Change};
use crate::floor::{floor_server, record};
use crate::inventory::{floor_encode, Inventory};
use crate::sinks::{Mode, Push, SinkProc};
use crate::util::{env_list, env_usize};
use crate::{EPS, MIB};

const STANDARD_SIZES: [usize; 4] = [10_000, 100_000, 300_000, 1_000_000];

/// The environment knobs of the doc comment in `main.rs`.
pub struct Knobs {
    pub max: usize,
    pub sizes: Vec<usize>,
    pub rss_endpoints: usize,
    pub rss_sinks: Vec<usize>,
    pub push_sinks: usize,
    pub idle_secs: u64,
    pub changes: usize,
    pub per_file: usize,
    pub settle: Duration,
    pub skip: BTreeSet<String>,
    pub adapter: PathBuf,
    /// Extra flags for the adapter (`MCP_SCALE_ADAPTER_ARGS`, split on whitespace).
    pub adapter_args: Vec<String>,
}

impl Knobs {
    pub fn from_env() -> Knobs {
        // A smoke run (`MCP_BENCH_SMOKE`): 100 services, every phase, one short round each.
        let tiny = |full: usize, tiny: usize| crate::smoke::scaled(full, tiny);
        let max = env_usize("MCP_SCALE_MAX", tiny(1_000_000, 1_000));
        let mut sizes = env_list("MCP_SCALE_SIZES").unwrap_or_else(|| {
            let mut s: Vec<usize> = STANDARD_SIZES.into_iter().filter(|&n| n <= max).collect();
            if !s.contains(&max) {
                s.push(max);
            }
            s
        });
        sizes.sort_unstable();
        sizes.dedup();
        for &n in &sizes {
            assert!(
                n >= EPS && n % EPS == 0,
                "sizes are endpoints, multiples of {EPS}: {n}"
            );
        }
        let adapter = std::env::var_os("MCP_SCALE_ADAPTER")
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("adapter-file"));
        Knobs {
            max: sizes.last().copied().unwrap_or(max),
            rss_endpoints: env_usize("MCP_SCALE_RSS_ENDPOINTS", 100_000).min(max),
            rss_sinks: env_list("MCP_SCALE_RSS_SINKS").unwrap_or_else(|| {
                if crate::smoke::smoke() {
                    vec![0, 1, 2]
                } else {
                    vec![0, 1, 5, 10, 21, 50, 100]
                }
            }),
            push_sinks: env_usize("MCP_SCALE_PUSH_SINKS", tiny(10, 2)),
            idle_secs: env_usize("MCP_SCALE_IDLE_SECS", tiny(60, 1)) as u64,
            changes: env_usize("MCP_SCALE_CHANGES", tiny(100, 2)),
            per_file: env_usize("MCP_SCALE_FILE_SERVICES", tiny(1000, 50)).max(1),
            settle: Duration::from_millis(env_usize("MCP_SCALE_SETTLE_MS", tiny(2000, 200)) as u64),
            skip: std::env::var("MCP_SCALE_SKIP")
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            sizes,
            adapter,
            adapter_args: std::env::var("MCP_SCALE_ADAPTER_ARGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect(),
        }
    }

    pub fn runs(&self, phase: &str) -> bool {
        !self.skip.contains(phase)
    }
}

/// What every phase uses: the knobs, `target/scale/`, a runtime for the floor, the adapter logs.
pub struct Ctx {
    pub knobs: Knobs,
    pub root: PathBuf,
    pub rt: tokio::runtime::Runtime,
    pub logs: PathBuf,
    pub starts: usize,
}

impl Ctx {
    pub fn start_adapter(&mut self, inventory: &Path) -> AdapterProc {
        self.starts += 1;
        let log = self.logs.join(format!("adapter-{:02}.log", self.starts));
        AdapterProc::start(
            &self.knobs.adapter,
            &self.knobs.adapter_args,
            inventory,
            log,
        )
    }
}

/// One point of the RSS-vs-sinks sweep.
pub struct RssRow {
    pub endpoints: usize,
    pub sinks: usize,
    pub mem: Mem,
    pub push_s: f64,
    pub bytes: u64,
    pub connected: f64,
}

pub fn rss_point(ctx: &mut Ctx, inv: &Inventory, sinks: usize) -> RssRow {
    let mut a = ctx.start_adapter(&inv.dir);
    a.wait_ready();
    let (push, child) = if sinks > 0 {
        let c = SinkProc::spawn(a.grpc, sinks, Mode::Sotw);
        (Some(c.wait_full(sinks, inv.services)), Some(c))
    } else {
        (None, None)
    };
    std::thread::sleep(ctx.knobs.settle);
    let mem = a.mem();
    // (+ 0.0: a sum of no samples is -0.)
    let connected = a.metric("mcp_adapter_connected_sinks") + 0.0;
    if let Some(c) = child {
        c.close();
    }
    let row = RssRow {
        endpoints: inv.services * EPS,
        sinks,
        mem,
        push_s: push.map_or(f64::NAN, Push::secs),
        bytes: push.map_or(0, |p| p.bytes),
        connected,
    };
    eprintln!(
        "[scale] rss {} endpoints, {sinks:>3} sinks: {mem}, push {:.3} s",
        row.endpoints, row.push_s
    );
    row
}

/// Idle CPU at the largest size, sinks connected, nothing changing.
pub struct Idle {
    pub secs: f64,
    pub cpu_s: f64,
    pub snapshots: (f64, f64),
    pub pushes: (f64, f64),
    pub mem_after: Mem,
}

impl Idle {
    pub fn pct(&self) -> f64 {
        self.cpu_s / self.secs * 100.0
    }
}

fn idle(a: &AdapterProc, secs: u64, ticks: f64) -> Idle {
    let snapshots_before = a.metric("mcp_adapter_snapshots_total");
    let pushes_before = a.metric("mcp_adapter_pushes_total");
    let c0 = a.cpu_ticks();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let c1 = a.cpu_ticks();
    let elapsed = t0.elapsed().as_secs_f64();
    let mem_after = a.mem();
    Idle {
        secs: elapsed,
        cpu_s: (c1 - c0) as f64 / ticks,
        snapshots: (snapshots_before, a.metric("mcp_adapter_snapshots_total")),
        pushes: (pushes_before, a.metric("mcp_adapter_pushes_total")),
        mem_after,
    }
}

/// Everything measured at one inventory size.
pub struct SizeRow {
    pub endpoints: usize,
    pub services: usize,
    pub files: usize,
    pub inventory_bytes: u64,
    pub floor_encode_ms: (f64, f64),
    pub floor_bytes: u64,
    pub startup: Startup,
    pub mem0: Mem,
    pub push_many: Push,
    pub mem_many: Mem,
    pub push_one: Push,
    pub floor_many: Option<f64>,
    pub floor_one: Option<f64>,
    pub check: String,
    pub idle: Option<Idle>,
    pub delta: Option<Vec<Change>>,
}

pub fn size_run(ctx: &mut Ctx, endpoints: usize, ticks: f64) -> SizeRow {
    let services = endpoints / EPS;
    let knobs_max = ctx.knobs.max;
    let per_file = ctx.knobs.per_file;
    let inv = Inventory::ensure(&ctx.root, services, per_file);
    let runs = if endpoints >= 1_000_000 { 3 } else { 5 };
    let floor_encode = floor_encode(services, runs);
    let floor_encode_ms = (floor_encode.0, floor_encode.1);
    eprintln!(
        "[scale] {endpoints} endpoints: prost floor build+encode {:.1} ms (min {:.1}), {:.1} MiB",
        floor_encode.0,
        floor_encode.1,
        floor_encode.2 as f64 / MIB
    );

    let mut a = ctx.start_adapter(&inv.dir);
    let st = a.startup(ticks);
    assert_eq!(
        st.published_resources,
        services,
        "first snapshot holds every service; log:\n{}",
        a.log_tail()
    );
    eprintln!(
        "[scale] {endpoints} endpoints: ready {:.2} s (scan+parse {:.2} s, Reset -> published {:.3} s, CPU {:.2} s)",
        st.ready_s, st.scan_s, st.reset_to_published_s, st.cpu_s
    );
    std::thread::sleep(ctx.knobs.settle);
    let mem0 = a.mem();

    let n = ctx.knobs.push_sinks;
    let many = SinkProc::spawn(a.grpc, n, Mode::Sotw);
    let push_many = many.wait_full(n, services);
    std::thread::sleep(ctx.knobs.settle);
    let mem_many = a.mem();
    eprintln!(
        "[scale] {endpoints} endpoints: {n} sinks hold the full set after {:.3} s; {mem_many}",
        push_many.secs()
    );
    let idle_result = (endpoints == knobs_max && ctx.knobs.runs("idle")).then(|| {
        eprintln!(
            "[scale] idle CPU: {} s with {n} sinks connected...",
            ctx.knobs.idle_secs
        );
        idle(&a, ctx.knobs.idle_secs, ticks)
    });
    many.close();

    let push_one = SinkProc::push(a.grpc, 1, services);
    eprintln!(
        "[scale] {endpoints} endpoints: 1 sink holds the full set after {:.3} s",
        push_one.secs()
    );

    let (floor_many, floor_one, check) = if ctx.knobs.runs("floor") {
        let (response, size, check) = ctx.rt.block_on(record(a.grpc, services));
        // Only the nonce may differ between streams.
        assert!(
            (size as u64).abs_diff(push_one.bytes) < 64,
            "recorded {size} B, the sinks got {} B",
            push_one.bytes
        );
        let (addr, stop) = ctx.rt.block_on(floor_server(Arc::new(response)));
        let fm = SinkProc::push(addr, n, services).secs();
        let fo = SinkProc::push(addr, 1, services).secs();
        let _ = stop.send(());
        eprintln!("[scale] {endpoints} endpoints: floor push {n} sinks {fm:.3} s, 1 sink {fo:.3} s; {check}");
        (Some(fm), Some(fo), check)
    } else {
        (None, None, String::new())
    };

    let mut edited = BTreeSet::new();
    let delta = (endpoints == knobs_max && ctx.knobs.runs("delta")).then(|| {
        eprintln!(
            "[scale] delta: {} one-service changes...",
            ctx.knobs.changes
        );
        let (changes, files) = delta_phase(&a, &inv, ctx.knobs.changes);
        edited = files;
        changes
    });
    drop(a);
    // Put the cached inventory back as generated.
    for f in edited {
        inv.restore(f);
    }

    SizeRow {
        endpoints,
        services,
        files: inv.files(),
        inventory_bytes: inv.bytes(),
        floor_encode_ms,
        floor_bytes: floor_encode.2,
        startup: st,
        mem0,
        push_many,
        mem_many,
        push_one,
        floor_many,
        floor_one,
        check,
        idle: idle_result,
        delta,
    }
}
