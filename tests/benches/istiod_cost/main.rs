//! What one registry change costs the real istiod, three ways side by side, for N services x 10
//! endpoints:
//!
//! - **file**: one `adapter-file` (the release binary) serving the N services from an inventory
//!   (chunk files of 1000 services) plus a small file holding the one service that changes, read
//!   by istiod as one `xds://` config source;
//! - **shards**: the same set as S shards (S `adapter-file --shard i/S` processes reading the
//!   same files, or one `--shards S` process: see [`ONE_PROCESS_SHARDS`]),
//!   S `xds://` config sources;
//! - **crd**: the same ServiceEntries as `networking.istio.io/v1` objects in the API server, read
//!   through `k8s://` only; a change is one merge PATCH of one object's endpoints.
//!
//! istiod is the same binary with the same flags each way (`e2e::istiod::IstiodConfig::
//! production()`'s shape: `k8s://` first, then the `xds://` sources; Istio's CRDs applied), and
//! each way starts a fresh API server and a fresh istiod, one way after another.
//!
//! ```sh
//! cargo build --release -p adapter-file
//! cargo bench -p e2e --bench istiod_cost                          # N = 1000, 10000
//! cargo bench -p e2e --bench istiod_cost -- --sizes 1000,10000,100000 --shards 4
//! ISTIOD_COST_SIZES=100000 ISTIOD_COST_WAYS=crd cargo bench -p e2e --bench istiod_cost
//! ```
//!
//! Measured per way and N (signals):
//! - **istiod CPU-ms per change**: utime + stime of istiod from `/proc/<pid>/stat` (clock ticks,
//!   `getconf CLK_TCK`, 100/s here) read before a change and a window (`--window-ms`, 2 s) after
//!   it, minus the idle rate over the same length, measured over `--idle-windows` windows before
//!   the changes. No proxy is connected and nothing polls istiod in this phase.
//! - **change -> shard latency**: a separate phase with an Envoy-like sidecar node watching the
//!   EDS of the changed service's cluster on istiod's xDS port ([`eds`]): from the write (file
//!   rename or PATCH sent) to the first EDS response holding the new address. For file and
//!   shards this includes adapter-file's poll (`--poll-interval 100ms`: 0-100 ms).
//! - **RSS**: istiod's VmRSS after the first full sync (once its CPU has settled) and after the
//!   changes.
//! - **first sync**: istiod spawn -> its `pilot_services` gauge (recorded at each full push) >= N,
//!   polled on `/metrics` every 200 ms. The sources are ready before istiod starts.
//! - **bytes per change**: a byte-counting TCP forwarder in front of every source istiod reads
//!   (each adapter's gRPC port and the API server's HTTPS port: TLS and HTTP/2 framing included),
//!   the bytes sent to istiod over a change window minus the idle bytes of a window.
//!
//! Results: a markdown table on stdout and `target/istiod_cost/results.csv`; istiod's log of each
//! run in `target/istiod_cost/logs/<way>-<N>/istiod.log`.
//!
//! Knobs (arguments, or the environment variable in brackets):
//! `--sizes` (`ISTIOD_COST_SIZES`, 1000,10000), `--shards` (`ISTIOD_COST_SHARDS`, 4), `--ways`
//! (`ISTIOD_COST_WAYS`, file,shards,crd), `--changes` (`ISTIOD_COST_CHANGES`, 20: CPU phase),
//! `--latency-changes` (`ISTIOD_COST_LATENCY_CHANGES`, 20), `--window-ms`
//! (`ISTIOD_COST_WINDOW_MS`, 2000), `--idle-windows` (`ISTIOD_COST_IDLE_WINDOWS`, 10),
//! `--istiod-env` (`ISTIOD_COST_ISTIOD_ENV`, none: `K=V,...` added to istiod's environment in
//! every way, e.g. `PILOT_ENABLE_IP_AUTOALLOCATE=false`).

mod eds;
mod peers;
mod registry;

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::istiod::apply_istio_crds;
use e2e::kube::KubeApiServer;
use e2e::{target_dir, Adapter};
use mcp_core::testing::bench::{clock_ticks, command_line, cores, cpu_model};

use crate::eds::EdsWatch;
use crate::peers::{kubeconfig_via, received, Istiod};
use crate::registry::{changed_address, cluster, Inventory, CHANGED, NAMESPACE};
use e2e::forwarder::Forwarder;

/// The shards way runs one process with `--shards S` (one registry watch, shard i on the
/// `--listen` port + i); `false` runs S `--shard i/S` processes instead, each watching the whole
/// registry.
const ONE_PROCESS_SHARDS: bool = true;

/// adapter-file's poll interval in the file and shards ways.
const POLL: &str = "100ms";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    File,
    Shards,
    Crd,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::File => "file",
            Way::Shards => "shards",
            Way::Crd => "crd",
        }
    }

    fn parse(s: &str) -> Way {
        match s.trim() {
            "file" | "a" => Way::File,
            "shards" | "b" => Way::Shards,
            "crd" | "c" => Way::Crd,
            other => panic!("unknown way {other:?}: file, shards or crd"),
        }
    }
}

struct Knobs {
    sizes: Vec<usize>,
    shards: usize,
    ways: Vec<Way>,
    changes: usize,
    latency_changes: usize,
    window: Duration,
    idle_windows: usize,
    /// More environment for istiod (every way): `K=V,K=V`.
    istiod_env: Vec<(String, String)>,
}

impl Knobs {
    fn get() -> Knobs {
        let args: Vec<String> = std::env::args().collect();
        let knob = |flag: &str, env: &str, default: &str| -> String {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1).cloned())
                .or_else(|| {
                    let prefix = format!("{flag}=");
                    args.iter()
                        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
                })
                .or_else(|| std::env::var(env).ok())
                .unwrap_or_else(|| default.to_string())
        };
        let num = |flag: &str, env: &str, default: &str| -> usize {
            let v = knob(flag, env, default);
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{flag}={v}: not a number"))
        };
        Knobs {
            sizes: knob("--sizes", "ISTIOD_COST_SIZES", "1000,10000")
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().parse().expect("--sizes: numbers"))
                .collect(),
            shards: num("--shards", "ISTIOD_COST_SHARDS", "4"),
            ways: knob("--ways", "ISTIOD_COST_WAYS", "file,shards,crd")
                .split(',')
                .map(Way::parse)
                .collect(),
            changes: num("--changes", "ISTIOD_COST_CHANGES", "20"),
            latency_changes: num("--latency-changes", "ISTIOD_COST_LATENCY_CHANGES", "20"),
            window: Duration::from_millis(
                num("--window-ms", "ISTIOD_COST_WINDOW_MS", "2000") as u64
            ),
            idle_windows: num("--idle-windows", "ISTIOD_COST_IDLE_WINDOWS", "10"),
            istiod_env: knob("--istiod-env", "ISTIOD_COST_ISTIOD_ENV", "")
                .split(',')
                .filter(|kv| !kv.trim().is_empty())
                .map(|kv| {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("--istiod-env {kv}: not K=V"));
                    (k.trim().to_string(), v.trim().to_string())
                })
                .collect(),
        }
    }
}

/// One way at one size.
#[derive(Clone, Debug, Default)]
struct Row {
    way: &'static str,
    n: usize,
    s: usize,
    cpu_mean: f64,
    cpu_p50: f64,
    cpu_p99: f64,
    idle_ms_per_s: f64,
    lat_p50: f64,
    lat_p99: f64,
    lat_missed: usize,
    rss_sync: f64,
    rss_after: f64,
    first_sync_s: f64,
    ready_s: f64,
    settled_s: f64,
    settled: bool,
    setup_s: f64,
    bytes_per_change: f64,
    full_pushes: usize,
    incremental_pushes: usize,
    changes: usize,
}

/// `q`-quantile (nearest rank); NaN when empty.
fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

fn mean(samples: &[f64]) -> f64 {
    samples.iter().sum::<f64>() / samples.len().max(1) as f64
}

fn log(msg: &str) {
    eprintln!(
        "[istiod_cost {}] {msg}",
        command_line("date", &["+%H:%M:%S"])
    );
}

/// The adapters of a way, and the gRPC addresses istiod reads.
fn start_adapters(way: Way, inv: &Inventory, shards: usize) -> (Vec<Adapter>, Vec<SocketAddr>) {
    let big = inv.big().display().to_string();
    let changed = inv.changed().display().to_string();
    let base = [
        "--path",
        big.as_str(),
        "--path",
        changed.as_str(),
        "--poll-interval",
        POLL,
    ];
    let start = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        Adapter::start("adapter-file", &args)
    };
    let adapters: Vec<Adapter> = match way {
        Way::File => vec![start(&[])],
        Way::Shards if ONE_PROCESS_SHARDS => {
            let args: Vec<String> = base
                .iter()
                .map(|s| s.to_string())
                .chain(["--shards".to_string(), shards.to_string()])
                .collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let first = e2e::free_addrs(shards as u16);
            vec![Adapter::start_on("adapter-file", first, &args, &[])]
        }
        Way::Shards => (0..shards)
            .map(|i| start(&["--shard", &format!("{i}/{shards}")]))
            .collect(),
        Way::Crd => Vec::new(),
    };
    for a in &adapters {
        a.wait_admin(
            Duration::from_secs(1800),
            "adapter /readyz",
            "/readyz",
            |s, _| s == 200,
        );
    }
    let addrs = if way == Way::Shards && ONE_PROCESS_SHARDS {
        let g = adapters[0].grpc;
        (0..shards)
            .map(|i| SocketAddr::new(g.ip(), g.port() + i as u16))
            .collect()
    } else {
        adapters.iter().map(|a| a.grpc).collect()
    };
    (adapters, addrs)
}

/// Waits until istiod's CPU rate over 2 s is below `ms_per_s` (at least 5 s, at most
/// `max`); whether it settled, and how long that took.
fn settle(istiod: &Istiod, ticks: f64, ms_per_s: f64, max: Duration) -> (bool, f64) {
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    loop {
        let c0 = istiod.cpu_ticks();
        std::thread::sleep(Duration::from_secs(2));
        let rate = (istiod.cpu_ticks() - c0) as f64 / ticks * 1e3 / 2.0;
        if rate < ms_per_s {
            return (true, t.elapsed().as_secs_f64());
        }
        if t.elapsed() > max {
            log(&format!(
                "istiod still busy ({rate:.0} CPU-ms/s) after {max:?}"
            ));
            return (false, t.elapsed().as_secs_f64());
        }
    }
}

fn run(knobs: &Knobs, root: &std::path::Path, way: Way, n: usize, ticks: f64) -> Row {
    let s = if way == Way::Shards { knobs.shards } else { 1 };
    let dir = root.join("logs").join(format!("{}-{n}", way.name()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create log dir");
    log(&format!("{} N={n} S={s}: API server", way.name()));
    let kube = KubeApiServer::start();
    kube.namespace("istio-system");
    apply_istio_crds(&kube);

    let setup = Instant::now();
    let inv = (way != Way::Crd).then(|| Inventory::ensure(root, n));
    let (adapters, addrs) = match way {
        Way::Crd => {
            kube.namespace(NAMESPACE);
            log(&format!("creating {n} ServiceEntry objects"));
            registry::create_all(&kube, n, &dir);
            (Vec::new(), Vec::new())
        }
        _ => {
            log(&format!("starting adapter-file: {s} source(s)"));
            start_adapters(way, inv.as_ref().expect("inventory"), knobs.shards)
        }
    };
    let setup_s = setup.elapsed().as_secs_f64();
    log(&format!("sources ready in {setup_s:.1} s"));

    let kube_meter = Forwarder::start(vec![kube.addr]);
    let kubeconfig = dir.join("kubeconfig");
    kubeconfig_via(&kube, kube_meter.addr, &kubeconfig);
    let mut meters: Vec<Forwarder> = addrs.iter().map(|a| Forwarder::start(vec![*a])).collect();
    let sources: Vec<SocketAddr> = meters.iter().map(|m| m.addr).collect();
    meters.push(kube_meter);

    let istiod = Istiod::spawn(&sources, &kubeconfig, &dir, &knobs.istiod_env);
    istiod.wait_until(Duration::from_secs(3600), "/ready 200", || istiod.ready());
    let ready_s = istiod.started.elapsed().as_secs_f64();
    istiod.wait_until(
        Duration::from_secs(3600),
        &format!("pilot_services >= {n}"),
        || {
            istiod
                .metric("pilot_services")
                .is_some_and(|v| v >= n as f64)
        },
    );
    let first_sync_s = istiod.started.elapsed().as_secs_f64();
    log(&format!(
        "istiod ready {ready_s:.1} s, holds {n} services {first_sync_s:.1} s after spawn"
    ));
    let (settled, settled_s) = settle(&istiod, ticks, 30.0, Duration::from_secs(120));
    let rss_sync = istiod.mem().rss_mib();
    log(&format!(
        "settled={settled} after {settled_s:.1} s; RSS {rss_sync:.0} MiB"
    ));

    // Idle: the same windows, nothing changing, nothing polling.
    let w = knobs.window;
    let mut idle_ticks = 0u64;
    let mut idle_bytes = 0u64;
    for _ in 0..knobs.idle_windows {
        let (c0, b0) = (istiod.cpu_ticks(), received(&meters));
        std::thread::sleep(w);
        idle_ticks += istiod.cpu_ticks() - c0;
        idle_bytes += received(&meters) - b0;
    }
    let idle_s = w.as_secs_f64() * knobs.idle_windows as f64;
    let idle_ms_per_s = idle_ticks as f64 / ticks * 1e3 / idle_s.max(1e-9);
    let idle_bytes_per_window = idle_bytes as f64 / knobs.idle_windows.max(1) as f64;
    log(&format!(
        "idle {idle_ms_per_s:.1} CPU-ms/s, {idle_bytes_per_window:.0} B per window"
    ));

    let mut k = 0usize;
    let change = |k: usize| match &inv {
        None => registry::patch_changed(&kube, k),
        Some(inv) => inv.write_changed(Some(k)),
    };

    // CPU per change.
    let full0 = istiod.log_count("XDS: Pushing Services");
    let incr0 = istiod.log_count("XDS: Incremental Pushing");
    let mut cpu = Vec::new();
    let mut bytes = Vec::new();
    for _ in 0..knobs.changes {
        k += 1;
        let (c0, b0) = (istiod.cpu_ticks(), received(&meters));
        let t = Instant::now();
        change(k);
        std::thread::sleep(w.saturating_sub(t.elapsed()));
        let dt = (istiod.cpu_ticks() - c0) as f64 / ticks * 1e3;
        let db = (received(&meters) - b0) as f64;
        cpu.push(dt - idle_ms_per_s * w.as_secs_f64());
        bytes.push(db - idle_bytes_per_window);
    }
    // Work that a change left beyond its window (istiod still busy when the last window
    // closed) is counted too, in the mean: istiod's CPU and bytes until it is quiet again, less
    // the idle rates over that time.
    let (c0, b0, t) = (istiod.cpu_ticks(), received(&meters), Instant::now());
    settle(&istiod, ticks, 30.0, Duration::from_secs(60));
    let drain_s = t.elapsed().as_secs_f64();
    let drain_cpu = (istiod.cpu_ticks() - c0) as f64 / ticks * 1e3 - idle_ms_per_s * drain_s;
    let drain_bytes =
        (received(&meters) - b0) as f64 - idle_bytes_per_window * drain_s / w.as_secs_f64();
    let cpu_mean = mean(&cpu) + drain_cpu / cpu.len().max(1) as f64;
    let bytes_mean = mean(&bytes) + drain_bytes / bytes.len().max(1) as f64;
    let full_pushes = istiod.log_count("XDS: Pushing Services") - full0;
    let incremental_pushes = istiod.log_count("XDS: Incremental Pushing") - incr0;
    log(&format!(
        "CPU/change mean {cpu_mean:.1} (drain after the last window {drain_cpu:.0} ms in {drain_s:.1} s) p99 {:.1} ms; {bytes_mean:.0} B/change; pushes: {full_pushes} full, {incremental_pushes} incremental",
        quantile(&cpu, 0.99),
    ));

    // Latency: a sidecar node watching the changed service's EDS.
    let watch = EdsWatch::start(istiod.grpc, cluster(CHANGED));
    let first = changed_address(k);
    let t0 = Instant::now();
    if watch
        .wait_for(
            &first,
            t0 - Duration::from_secs(1),
            Duration::from_secs(120),
        )
        .is_none()
    {
        panic!(
            "the EDS watcher never saw {first} ({} responses, last {:?}); istiod log {}",
            watch.responses(),
            watch.last(),
            istiod.log_path().display()
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let mut lat = Vec::new();
    let mut missed = 0;
    for _ in 0..knobs.latency_changes {
        k += 1;
        let t = Instant::now();
        change(k);
        match watch.wait_for(&changed_address(k), t, Duration::from_secs(60)) {
            Some(seen) => lat.push((seen - t).as_secs_f64() * 1e3),
            None => missed += 1,
        }
        // Changes spaced as in the CPU phase.
        std::thread::sleep(w.saturating_sub(t.elapsed()));
    }
    log(&format!(
        "change -> EDS p50 {:.0} p99 {:.0} ms ({missed} missed)",
        quantile(&lat, 0.5),
        quantile(&lat, 0.99)
    ));
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = istiod.mem().rss_mib();
    drop(watch);
    drop(istiod);
    drop(adapters);
    drop(kube);
    Row {
        way: way.name(),
        n,
        s,
        cpu_mean,
        cpu_p50: quantile(&cpu, 0.5),
        cpu_p99: quantile(&cpu, 0.99),
        idle_ms_per_s,
        lat_p50: quantile(&lat, 0.5),
        lat_p99: quantile(&lat, 0.99),
        lat_missed: missed,
        rss_sync,
        rss_after,
        first_sync_s,
        ready_s,
        settled_s,
        settled,
        setup_s,
        bytes_per_change: bytes_mean,
        full_pushes,
        incremental_pushes,
        changes: knobs.changes,
    }
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| way | N | S | istiod CPU-ms/change mean | p50 | p99 | idle CPU-ms/s | change->shard p50 ms | p99 ms | istiod RSS MiB (sync / after) | first sync s | quiet after s | bytes/change | pushes full/incr per change |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0}{} | {:.0} / {:.0} | {:.1} | {:.0}{} | {:.0} | {:.2} / {:.2} |",
            r.way,
            r.n,
            r.s,
            r.cpu_mean,
            r.cpu_p50,
            r.cpu_p99,
            r.idle_ms_per_s,
            r.lat_p50,
            r.lat_p99,
            if r.lat_missed > 0 {
                format!(" ({} missed)", r.lat_missed)
            } else {
                String::new()
            },
            r.rss_sync,
            r.rss_after,
            r.first_sync_s,
            r.first_sync_s + r.settled_s,
            if r.settled { "" } else { " (never)" },
            r.bytes_per_change,
            r.full_pushes as f64 / r.changes.max(1) as f64,
            r.incremental_pushes as f64 / r.changes.max(1) as f64,
        );
    }
    out
}

fn ratios(rows: &[Row]) -> String {
    let mut out = String::new();
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.n).collect();
    sizes.dedup();
    for n in sizes {
        let Some(crd) = rows.iter().find(|r| r.n == n && r.way == "crd") else {
            continue;
        };
        // The CRD way's cost can be below what 10 ms ticks resolve over the changes (even
        // negative after the idle rate is subtracted): the ratio is then a lower bound, against
        // 1 ms.
        let ratio = |a: f64, b: f64| {
            if b < 1.0 {
                format!("> {:.0} (crd < 1 ms)", a / 1.0)
            } else {
                format!("{:.1}", a / b)
            }
        };
        for r in rows.iter().filter(|r| r.n == n && r.way != "crd") {
            let _ = writeln!(
                out,
                "- N={n}: istiod CPU per change, {} (S={}) / crd: {} (mean), {} (p99)",
                r.way,
                r.s,
                ratio(r.cpu_mean, crd.cpu_mean),
                ratio(r.cpu_p99, crd.cpu_p99)
            );
        }
    }
    out
}

fn csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "way,N,S,istiod_cpu_ms_per_change_mean,istiod_cpu_ms_per_change_p99,idle_cpu_ms_per_s,change_to_shard_p50_ms,change_to_shard_p99_ms,istiod_rss_mib_sync,istiod_rss_mib_after,first_sync_s,bytes_per_change,latency_missed,istiod_ready_s,settled,settle_s,sources_setup_s,full_pushes,incremental_pushes,changes,istiod_cpu_ms_per_change_p50\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{:.2},{:.2},{:.2},{:.1},{:.1},{:.1},{:.1},{:.2},{:.0},{},{:.2},{},{:.1},{:.1},{},{},{},{:.2}",
            r.way,
            r.n,
            r.s,
            r.cpu_mean,
            r.cpu_p99,
            r.idle_ms_per_s,
            r.lat_p50,
            r.lat_p99,
            r.rss_sync,
            r.rss_after,
            r.first_sync_s,
            r.bytes_per_change,
            r.lat_missed,
            r.ready_s,
            r.settled,
            r.settled_s,
            r.setup_s,
            r.full_pushes,
            r.incremental_pushes,
            r.changes,
            r.cpu_p50
        );
    }
    out
}

fn main() {
    let knobs = Knobs::get();
    let root: PathBuf = target_dir()
        .parent()
        .map(|t| t.join("istiod_cost"))
        .expect("target directory");
    fs::create_dir_all(root.join("logs")).expect("create target/istiod_cost");
    let adapter = target_dir().join("adapter-file");
    assert!(
        adapter.exists() || !knobs.ways.iter().any(|w| *w != Way::Crd),
        "{} missing: run `cargo build --release -p adapter-file` first",
        adapter.display()
    );
    let ticks = clock_ticks();
    let machine = format!(
        "{} cores ({}), clock ticks {ticks}/s, commit {}",
        cores(),
        cpu_model().unwrap_or_default(),
        command_line("git", &["rev-parse", "--short", "HEAD"])
    );
    log(&format!(
        "sizes {:?}, ways {:?}, S={}, {} CPU changes + {} latency changes, window {:?}, istiod env {:?}; {machine}",
        knobs.sizes, knobs.ways, knobs.shards, knobs.changes, knobs.latency_changes, knobs.window,
        knobs.istiod_env
    ));
    let mut rows = Vec::new();
    for &n in &knobs.sizes {
        for &way in &knobs.ways {
            let row = run(&knobs, &root, way, n, ticks);
            rows.push(row);
            // Written after each run: a later size that does not fit keeps what was measured.
            fs::write(root.join("results.csv"), csv(&rows)).expect("write results.csv");
            eprintln!("{}", table(&rows));
        }
    }
    println!(
        "\n{machine}; window {:?}, istiod env {:?}\n",
        knobs.window, knobs.istiod_env
    );
    println!("{}", table(&rows));
    println!("{}", ratios(&rows));
    println!("CSV: {}", root.join("results.csv").display());
}
