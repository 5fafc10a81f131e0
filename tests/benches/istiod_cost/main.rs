//! What one registry change costs the real istiod, four ways side by side, for N services x 10
//! endpoints:
//!
//! - **file**: one `adapter-file` (the release binary) serving the N services from an inventory
//!   (chunk files of 1000 services) plus a small file holding the one service that changes, read
//!   by istiod as one `xds://` config source;
//! - **shards**: the same set as S shards (S `adapter-file --shard i/S` processes reading the
//!   same files, or one `--shards S` process: see [`ONE_PROCESS_SHARDS`]),
//!   S `xds://` config sources;
//! - **crd**: the same ServiceEntries as `networking.istio.io/v1` objects in the API server, read
//!   through `k8s://` only; a change is one merge PATCH of one object's endpoints;
//! - **kube**: one `adapter-file` reading the same files as in `file`, with `--output kube`: no
//!   MCP port, it writes the served set as ServiceEntry objects into the bench's API server
//!   (server-side apply, one object per service, `--output-namespaces bench`), which istiod
//!   reads through `k8s://` only, as in `crd`; a change is the same file rename as in `file`.
//!
//! istiod is the same binary with the same flags each way (`e2e::istiod::IstiodConfig::
//! production()`'s shape: `k8s://` first, then the `xds://` sources; Istio's CRDs applied), and
//! each way starts a fresh API server and a fresh istiod, one way after another.
//!
//! ```sh
//! cargo build --release -p adapter-file
//! cargo bench -p e2e --bench istiod_cost                          # N = 1000, 10000
//! cargo bench -p e2e --bench istiod_cost -- --sizes 1000,10000,100000 --shards 4
//! cargo bench -p e2e --bench istiod_cost -- --ways file,crd,kube --kube-qps 50/100,1000/1000
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
//! - **API server side** (every way): ServiceEntry writes per change from the API server's own
//!   `apiserver_request_total` (its `/metrics`, admin token) and, for kube, from the adapter's
//!   `mcp_adapter_kube_output_requests_total`, over the CPU and latency phases' changes; the API
//!   server's CPU-ms per change (its process, same method as istiod's) and RSS; the adapters'
//!   CPU-ms per change.
//! - **cold write** (crd and kube): the API server empty (CRDs applied) -> it holds the N
//!   objects: for crd the bulk create (curl, HTTP/2, 32 in flight); for kube adapter-file's start
//!   -> its `/readyz` says `API server in step (N objects)` (then checked on `/debug/resources`'
//!   `kubeOutput`), with the requests it took and the API server's CPU. The first `--kube-qps`
//!   setting is the adapter the kube way then measures istiod against; every further one is
//!   timed on a fresh API server of its own after the way's other phases.
//!
//! Results: markdown tables on stdout, `target/istiod_cost/results.csv` and (cold writes)
//! `target/istiod_cost/cold.csv`; istiod's log of each run in
//! `target/istiod_cost/logs/<way>-<N>/istiod.log`.
//!
//! Knobs (arguments, or the environment variable in brackets):
//! `--sizes` (`ISTIOD_COST_SIZES`, 1000,10000), `--shards` (`ISTIOD_COST_SHARDS`, 4), `--ways`
//! (`ISTIOD_COST_WAYS`, file,shards,crd,kube), `--changes` (`ISTIOD_COST_CHANGES`, 20: CPU phase),
//! `--latency-changes` (`ISTIOD_COST_LATENCY_CHANGES`, 20), `--window-ms`
//! (`ISTIOD_COST_WINDOW_MS`, 2000), `--idle-windows` (`ISTIOD_COST_IDLE_WINDOWS`, 10),
//! `--istiod-env` (`ISTIOD_COST_ISTIOD_ENV`, none: `K=V,...` added to istiod's environment in
//! every way, e.g. `PILOT_ENABLE_IP_AUTOALLOCATE=false`), `--kube-qps` (`ISTIOD_COST_KUBE_QPS`,
//! 50/100,1000/1000: the kube way's `--output-qps`/`--output-burst` settings, see cold write).

mod eds;
mod peers;
mod registry;
#[path = "../smoke/mod.rs"]
mod smoke;

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::istiod::apply_istio_crds;
use e2e::kube::KubeApiServer;
use e2e::{target_dir, Adapter};
use mcp_core::testing::bench::{clock_ticks, command_line, cores, cpu_model, Proc};

use crate::eds::EdsWatch;
use crate::peers::{api_server_pid, kubeconfig_via, received, verbs_delta, ApiRequests, Istiod};
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
    Kube,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::File => "file",
            Way::Shards => "shards",
            Way::Crd => "crd",
            Way::Kube => "kube",
        }
    }

    fn parse(s: &str) -> Way {
        match s.trim() {
            "file" | "a" => Way::File,
            "shards" | "b" => Way::Shards,
            "crd" | "c" => Way::Crd,
            "kube" | "d" => Way::Kube,
            other => panic!("unknown way {other:?}: file, shards, crd or kube"),
        }
    }
}

/// The kube way's client-side rate limit: `--output-qps` and `--output-burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Limit {
    qps: f64,
    burst: u32,
}

impl Limit {
    /// `qps/burst` (`50/100`), or `qps` alone with the adapter's default burst.
    fn parse(s: &str) -> Limit {
        let (qps, burst) = s.trim().split_once('/').unwrap_or((s.trim(), "100"));
        Limit {
            qps: qps
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("--kube-qps {s}: not QPS[/BURST]")),
            burst: burst
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("--kube-qps {s}: not QPS[/BURST]")),
        }
    }

    fn label(self) -> String {
        format!("qps {} / burst {}", self.qps, self.burst)
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
    /// The kube way's rate limits: the first runs the way, each further one a cold write.
    kube_limits: Vec<Limit>,
}

impl Knobs {
    fn get() -> Knobs {
        let knobs = Knobs::parse();
        assert!(
            !knobs.kube_limits.is_empty(),
            "--kube-qps: at least one QPS[/BURST]"
        );
        knobs
    }

    fn parse() -> Knobs {
        let args: Vec<String> = std::env::args().collect();
        // A smoke run (`MCP_BENCH_SMOKE`): 40 services, one change per phase, short windows, one
        // output limit; the ways but `file` (each way costs a fresh API server and istiod, and
        // `shards` serves the same files through the same code).
        let smoke = smoke::smoke();
        let knob = |flag: &str, env: &str, default: &str| -> String {
            let default = match (smoke, flag) {
                (true, "--sizes") => "40",
                (true, "--changes" | "--latency-changes" | "--idle-windows") => "1",
                (true, "--window-ms") => "500",
                (true, "--kube-qps") => "1000/1000",
                (true, "--ways") => "shards,crd,kube",
                _ => default,
            };
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
            ways: knob("--ways", "ISTIOD_COST_WAYS", "file,shards,crd,kube")
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
            kube_limits: knob("--kube-qps", "ISTIOD_COST_KUBE_QPS", "50/100,1000/1000")
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(Limit::parse)
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
    /// ServiceEntry writes per change, the API server's count (NaN: it did not answer).
    api_writes_per_change: f64,
    /// The adapter's applies per change (kube; NaN otherwise).
    applies_per_change: f64,
    /// The adapter's lists and deletes over the changes (kube; NaN otherwise).
    other_requests: f64,
    /// Changes the request counts are over (CPU and latency phases).
    counted_changes: usize,
    api_cpu_per_change: f64,
    api_idle_ms_per_s: f64,
    api_rss_after: f64,
    /// The adapters' CPU-ms per change, their idle rate subtracted (NaN: no adapter).
    adapter_cpu_per_change: f64,
}

/// The API server from empty to holding the N objects (crd, kube).
#[derive(Clone, Debug)]
struct Cold {
    way: &'static str,
    n: usize,
    /// How the objects were sent: the kube way's limit, or the bulk create.
    how: String,
    /// Adapter start -> registry synced (`/readyz` 200); NaN for crd.
    synced_s: f64,
    /// Start -> the API server holds the N objects.
    secs: f64,
    applies: f64,
    lists: f64,
    deletes: f64,
    /// ServiceEntry writes, the API server's count.
    api_writes: f64,
    api_cpu_s: f64,
    api_rss_mib: f64,
    /// The adapter's CPU from its start (NaN for crd).
    adapter_cpu_s: f64,
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
        // The kube way's adapter is started by `cold_write`.
        Way::Crd | Way::Kube => Vec::new(),
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

/// CPU ticks of a process so far; 0 when it is unknown.
fn ticks_of(pid: Option<u32>) -> u64 {
    pid.map_or(0, |p| Proc::Pid(p).cpu_ticks())
}

/// CPU ticks of every adapter process so far.
fn adapters_ticks(adapters: &[Adapter]) -> u64 {
    adapters.iter().map(|a| ticks_of(a.pid())).sum()
}

/// The Kubernetes output's requests of `verb` over every adapter.
fn output_requests(adapters: &[Adapter], verb: &str) -> f64 {
    adapters.iter().map(|a| a.kube_writes(verb)).sum()
}

/// ServiceEntry writes between two reads of the API server's counter (NaN if one is missing).
fn se_writes(before: &Option<ApiRequests>, after: &Option<ApiRequests>) -> f64 {
    match (before, after) {
        (Some(b), Some(a)) => a.writes("serviceentries") - b.writes("serviceentries"),
        _ => f64::NAN,
    }
}

/// The API server's requests per verb to `resource` between two reads, for the log.
fn verbs(before: &Option<ApiRequests>, after: &Option<ApiRequests>, resource: &str) -> String {
    match (before, after) {
        (Some(b), Some(a)) => verbs_delta(b, a, resource),
        _ => "unknown".to_string(),
    }
}

/// The kube way's adapter: the `file` way's files and flags plus the Kubernetes output into
/// `kube` (its admin kubeconfig; the Lease in `bench` too), no MCP port. Not waited for.
fn start_kube_output(inv: &Inventory, kube: &KubeApiServer, limit: Limit) -> Adapter {
    let big = inv.big().display().to_string();
    let changed = inv.changed().display().to_string();
    let kubeconfig = kube.kubeconfig().display().to_string();
    let (qps, burst) = (limit.qps.to_string(), limit.burst.to_string());
    Adapter::start(
        "adapter-file",
        &[
            "--path",
            &big,
            "--path",
            &changed,
            "--poll-interval",
            POLL,
            "--output",
            "kube",
            "--output-kubeconfig",
            &kubeconfig,
            "--output-namespaces",
            NAMESPACE,
            "--output-qps",
            &qps,
            "--output-burst",
            &burst,
        ],
    )
}

/// Starts the kube way's adapter against `kube` (CRDs applied, no objects yet) and times it
/// until the API server holds all `n` objects: its `/readyz` says `API server in step (n
/// objects)`, then `/debug/resources`' `kubeOutput` is checked.
fn cold_write(
    kube: &KubeApiServer,
    inv: &Inventory,
    n: usize,
    limit: Limit,
    ticks: f64,
) -> (Adapter, Cold) {
    let api = api_server_pid(kube);
    let req0 = ApiRequests::get(kube);
    let api0 = ticks_of(api);
    let t = Instant::now();
    let a = start_kube_output(inv, kube, limit);
    a.wait_admin(
        Duration::from_secs(1800),
        "adapter /readyz",
        "/readyz",
        |s, _| s == 200,
    );
    let synced_s = t.elapsed().as_secs_f64();
    let in_step = format!("API server in step ({n} objects)");
    a.wait_admin(
        Duration::from_secs(3600),
        &format!("kube output: {in_step}"),
        "/readyz",
        |_, body| body.contains(&in_step),
    );
    let secs = t.elapsed().as_secs_f64();
    let api_cpu_s = match api {
        Some(_) => (ticks_of(api) - api0) as f64 / ticks,
        None => f64::NAN,
    };
    let adapter_cpu_s = ticks_of(a.pid()) as f64 / ticks;
    let output = a.debug()["kubeOutput"].clone();
    assert!(
        output["inStep"] == true && output["objects"] == n && output["lastError"].is_null(),
        "kube output after the cold write: {output}; adapter log:\n{}",
        a.log_tail()
    );
    let req1 = ApiRequests::get(kube);
    let cold = Cold {
        way: Way::Kube.name(),
        n,
        how: limit.label(),
        synced_s,
        secs,
        applies: a.kube_writes("apply"),
        lists: a.kube_writes("list"),
        deletes: a.kube_writes("delete"),
        api_writes: se_writes(&req0, &req1),
        api_cpu_s,
        api_rss_mib: api.map_or(f64::NAN, |p| Proc::Pid(p).mem().rss_mib()),
        adapter_cpu_s,
    };
    log(&format!(
        "kube output ({}): registry synced {synced_s:.1} s, API server in step with {n} objects {secs:.1} s after the adapter's start; adapter requests: {} apply, {} list, {} delete; API server: serviceentries {}; CPU {api_cpu_s:.1} s, RSS {:.0} MiB; adapter CPU {adapter_cpu_s:.1} s",
        limit.label(),
        cold.applies,
        cold.lists,
        cold.deletes,
        verbs(&req0, &req1, "serviceentries"),
        cold.api_rss_mib,
    ));
    (a, cold)
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

fn run(knobs: &Knobs, root: &std::path::Path, way: Way, n: usize, ticks: f64) -> (Row, Vec<Cold>) {
    let s = if way == Way::Shards { knobs.shards } else { 1 };
    let dir = root.join("logs").join(format!("{}-{n}", way.name()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create log dir");
    log(&format!("{} N={n} S={s}: API server", way.name()));
    let kube = KubeApiServer::start();
    kube.namespace("istio-system");
    apply_istio_crds(&kube);
    let api_pid = api_server_pid(&kube);
    if api_pid.is_none() {
        log("kube-apiserver-test's process not found: no API server CPU or RSS");
    }
    let mut colds = Vec::new();

    let setup = Instant::now();
    let inv = (way != Way::Crd).then(|| Inventory::ensure(root, n));
    let (adapters, addrs) = match way {
        Way::Crd => {
            kube.namespace(NAMESPACE);
            log(&format!("creating {n} ServiceEntry objects"));
            let (req0, api0, t) = (ApiRequests::get(&kube), ticks_of(api_pid), Instant::now());
            registry::create_all(&kube, n, &dir);
            let secs = t.elapsed().as_secs_f64();
            let req1 = ApiRequests::get(&kube);
            colds.push(Cold {
                way: way.name(),
                n,
                how: "bulk create: curl, HTTP/2, 32 in flight".to_string(),
                synced_s: f64::NAN,
                secs,
                applies: f64::NAN,
                lists: f64::NAN,
                deletes: f64::NAN,
                api_writes: se_writes(&req0, &req1),
                api_cpu_s: match api_pid {
                    Some(_) => (ticks_of(api_pid) - api0) as f64 / ticks,
                    None => f64::NAN,
                },
                api_rss_mib: api_pid.map_or(f64::NAN, |p| Proc::Pid(p).mem().rss_mib()),
                adapter_cpu_s: f64::NAN,
            });
            (Vec::new(), Vec::new())
        }
        Way::Kube => {
            kube.namespace(NAMESPACE);
            let limit = knobs.kube_limits[0];
            log(&format!(
                "starting adapter-file --output kube ({})",
                limit.label()
            ));
            let (a, cold) = cold_write(&kube, inv.as_ref().expect("inventory"), n, limit, ticks);
            colds.push(cold);
            (vec![a], Vec::new())
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
    let (api_i0, adapters_i0) = (ticks_of(api_pid), adapters_ticks(&adapters));
    for _ in 0..knobs.idle_windows {
        let (c0, b0) = (istiod.cpu_ticks(), received(&meters));
        std::thread::sleep(w);
        idle_ticks += istiod.cpu_ticks() - c0;
        idle_bytes += received(&meters) - b0;
    }
    let idle_s = w.as_secs_f64() * knobs.idle_windows as f64;
    let idle_ms_per_s = idle_ticks as f64 / ticks * 1e3 / idle_s.max(1e-9);
    let idle_bytes_per_window = idle_bytes as f64 / knobs.idle_windows.max(1) as f64;
    let api_idle_ms_per_s = (ticks_of(api_pid) - api_i0) as f64 / ticks * 1e3 / idle_s.max(1e-9);
    let adapters_idle_ms_per_s =
        (adapters_ticks(&adapters) - adapters_i0) as f64 / ticks * 1e3 / idle_s.max(1e-9);
    log(&format!(
        "idle {idle_ms_per_s:.1} CPU-ms/s, {idle_bytes_per_window:.0} B per window; API server {api_idle_ms_per_s:.1} CPU-ms/s, adapters {adapters_idle_ms_per_s:.1} CPU-ms/s"
    ));

    let mut k = 0usize;
    let change = |k: usize| match &inv {
        None => registry::patch_changed(&kube, k),
        Some(inv) => inv.write_changed(Some(k)),
    };

    // What the API server and the output count over every change (CPU and latency phases).
    let req0 = ApiRequests::get(&kube);
    let output0 = [
        output_requests(&adapters, "apply"),
        output_requests(&adapters, "list") + output_requests(&adapters, "delete"),
    ];
    // The API server's and the adapters' CPU over the CPU phase (its windows and the drain).
    let (api_c0, adapters_c0, phase) =
        (ticks_of(api_pid), adapters_ticks(&adapters), Instant::now());

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
    let phase_s = phase.elapsed().as_secs_f64();
    let per_change = |ticks_used: u64, idle_rate: f64| {
        (ticks_used as f64 / ticks * 1e3 - idle_rate * phase_s) / knobs.changes.max(1) as f64
    };
    let api_cpu_per_change = match api_pid {
        Some(_) => per_change(ticks_of(api_pid) - api_c0, api_idle_ms_per_s),
        None => f64::NAN,
    };
    let adapter_cpu_per_change = if adapters.is_empty() {
        f64::NAN
    } else {
        per_change(
            adapters_ticks(&adapters) - adapters_c0,
            adapters_idle_ms_per_s,
        )
    };
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
    let counted_changes = knobs.changes + knobs.latency_changes;
    let req1 = ApiRequests::get(&kube);
    let api_writes_per_change = se_writes(&req0, &req1) / counted_changes.max(1) as f64;
    let (applies_per_change, other_requests) = if way == Way::Kube {
        (
            (output_requests(&adapters, "apply") - output0[0]) / counted_changes.max(1) as f64,
            output_requests(&adapters, "list") + output_requests(&adapters, "delete") - output0[1],
        )
    } else {
        (f64::NAN, f64::NAN)
    };
    let api_rss_after = api_pid.map_or(f64::NAN, |p| Proc::Pid(p).mem().rss_mib());
    log(&format!(
        "over {counted_changes} changes, the API server counted serviceentries: {}; leases: {}; the output: {applies_per_change:.2} applies per change, {other_requests} lists/deletes; API server CPU {api_cpu_per_change:.1} ms/change, RSS {api_rss_after:.0} MiB; adapters CPU {adapter_cpu_per_change:.1} ms/change",
        verbs(&req0, &req1, "serviceentries"),
        verbs(&req0, &req1, "leases"),
    ));
    drop(watch);
    drop(istiod);
    drop(adapters);
    drop(kube);

    // Further rate limits of the kube way: a cold write each, on a fresh API server.
    if way == Way::Kube {
        for &limit in &knobs.kube_limits[1..] {
            log(&format!(
                "kube N={n}: cold write at {} on a fresh API server",
                limit.label()
            ));
            let kube = KubeApiServer::start();
            kube.namespace("istio-system");
            apply_istio_crds(&kube);
            kube.namespace(NAMESPACE);
            let inv = Inventory::ensure(root, n);
            let (adapter, cold) = cold_write(&kube, &inv, n, limit, ticks);
            drop(adapter);
            colds.push(cold);
        }
    }
    let row = Row {
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
        api_writes_per_change,
        applies_per_change,
        other_requests,
        counted_changes,
        api_cpu_per_change,
        api_idle_ms_per_s,
        api_rss_after,
        adapter_cpu_per_change,
    };
    (row, colds)
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

/// `v` with `decimals` decimals, `-` for NaN (not measured, or not this way's).
fn num(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".to_string()
    } else {
        // `+ 0.0`: a sum of no samples is -0.
        format!("{:.decimals$}", v + 0.0)
    }
}

/// The API server's side of each row: what the changes cost it, and the adapters' own CPU.
fn api_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| way | N | SE writes/change (API server's count) | output applies/change | output lists+deletes (all changes) | API server CPU-ms/change | API server idle CPU-ms/s | API server RSS MiB (after) | adapters CPU-ms/change |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.way,
            r.n,
            num(r.api_writes_per_change, 2),
            num(r.applies_per_change, 2),
            num(r.other_requests, 0),
            num(r.api_cpu_per_change, 1),
            num(r.api_idle_ms_per_s, 1),
            num(r.api_rss_after, 0),
            num(r.adapter_cpu_per_change, 1),
        );
    }
    out
}

/// The API server from empty to holding the N objects.
fn cold_table(colds: &[Cold]) -> String {
    let mut out = String::from(
        "| way | N | sent with | registry synced s | API server holds N s | output requests apply / list / delete | SE writes (API server's count) | API server CPU-s | API server RSS MiB | adapter CPU-s |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in colds {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {} / {} / {} | {} | {} | {} | {} |",
            c.way,
            c.n,
            c.how,
            num(c.synced_s, 1),
            c.secs,
            num(c.applies, 0),
            num(c.lists, 0),
            num(c.deletes, 0),
            num(c.api_writes, 0),
            num(c.api_cpu_s, 1),
            num(c.api_rss_mib, 0),
            num(c.adapter_cpu_s, 1),
        );
    }
    out
}

fn cold_csv(colds: &[Cold]) -> String {
    let mut out = String::from(
        "way,N,sent_with,registry_synced_s,in_step_s,output_applies,output_lists,output_deletes,apiserver_se_writes,apiserver_cpu_s,apiserver_rss_mib,adapter_cpu_s\n",
    );
    for c in colds {
        let _ = writeln!(
            out,
            "{},{},\"{}\",{:.2},{:.2},{},{},{},{},{:.2},{:.1},{:.2}",
            c.way,
            c.n,
            c.how,
            c.synced_s,
            c.secs,
            c.applies + 0.0,
            c.lists + 0.0,
            c.deletes + 0.0,
            c.api_writes,
            c.api_cpu_s,
            c.api_rss_mib,
            c.adapter_cpu_s
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
        "way,N,S,istiod_cpu_ms_per_change_mean,istiod_cpu_ms_per_change_p99,idle_cpu_ms_per_s,change_to_shard_p50_ms,change_to_shard_p99_ms,istiod_rss_mib_sync,istiod_rss_mib_after,first_sync_s,bytes_per_change,latency_missed,istiod_ready_s,settled,settle_s,sources_setup_s,full_pushes,incremental_pushes,changes,istiod_cpu_ms_per_change_p50,apiserver_se_writes_per_change,output_applies_per_change,output_lists_deletes,counted_changes,apiserver_cpu_ms_per_change,apiserver_idle_cpu_ms_per_s,apiserver_rss_mib_after,adapters_cpu_ms_per_change\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{:.2},{:.2},{:.2},{:.1},{:.1},{:.1},{:.1},{:.2},{:.0},{},{:.2},{},{:.1},{:.1},{},{},{},{:.2},{:.3},{:.3},{},{},{:.2},{:.2},{:.1},{:.2}",
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
            r.cpu_p50,
            r.api_writes_per_change,
            r.applies_per_change,
            r.other_requests,
            r.counted_changes,
            r.api_cpu_per_change,
            r.api_idle_ms_per_s,
            r.api_rss_after,
            r.adapter_cpu_per_change
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
        "{} cores ({}), clock ticks {ticks}/s, commit {}{}",
        cores(),
        cpu_model().unwrap_or_default(),
        command_line("git", &["rev-parse", "--short", "HEAD"]),
        if command_line("git", &["--no-optional-locks", "status", "--porcelain"]).is_empty() {
            ""
        } else {
            " with uncommitted changes"
        }
    );
    log(&format!(
        "sizes {:?}, ways {:?}, S={}, {} CPU changes + {} latency changes, window {:?}, istiod env {:?}, kube output limits {:?}; {machine}",
        knobs.sizes, knobs.ways, knobs.shards, knobs.changes, knobs.latency_changes, knobs.window,
        knobs.istiod_env, knobs.kube_limits
    ));
    let mut rows = Vec::new();
    let mut colds = Vec::new();
    for &n in &knobs.sizes {
        for &way in &knobs.ways {
            let (row, cold) = run(&knobs, &root, way, n, ticks);
            rows.push(row);
            colds.extend(cold);
            // Written after each run: a later size that does not fit keeps what was measured.
            fs::write(root.join("results.csv"), csv(&rows)).expect("write results.csv");
            fs::write(root.join("cold.csv"), cold_csv(&colds)).expect("write cold.csv");
            eprintln!("{}", table(&rows));
            eprintln!("{}", api_table(&rows));
            eprintln!("{}", cold_table(&colds));
        }
    }
    println!(
        "\n{machine}; window {:?}, istiod env {:?}\n",
        knobs.window, knobs.istiod_env
    );
    println!("{}", table(&rows));
    println!("API server side:\n\n{}", api_table(&rows));
    println!(
        "Cold write (API server empty -> it holds the N objects):\n\n{}",
        cold_table(&colds)
    );
    println!("{}", ratios(&rows));
    println!(
        "CSV: {} and {}",
        root.join("results.csv").display(),
        root.join("cold.csv").display()
    );
}
