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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes};
use e2e::{free_addr, http_get, target_dir};
use prost::Message;
use proto::envoy::config::core::v3::Node;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use proto::istio::mcp::v1alpha1::{Metadata, Resource};
use proto::istio::networking::v1alpha3::{service_entry, ServiceEntry, ServicePort, WorkloadEntry};
use proto::server::ads::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::wire;
use rustix::fs::inotify;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Status, Streaming};

/// Endpoints per service.
const EPS: usize = 10;
/// Namespace of every generated service.
const NAMESPACE: &str = "scale";
/// What the sinks subscribe to (Istio 1.22's type URL; the adapter serves v1 and v1alpha3).
const SE_TYPE: &str = "networking.istio.io/v1alpha3/ServiceEntry";
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
/// Bumped when the generated inventory changes, so cached copies are regenerated.
const GENERATOR: &str = "scale-inventory v2";
/// The adapter's default log level, plus the file registry's one debug line per `Reset` (the
/// start of "Reset -> published"); no flag is changed.
const LOG_FILTER: &str = "info,adapter_file::registry=debug";
const READY_TIMEOUT: Duration = Duration::from_secs(600);
const PUSH_TIMEOUT: Duration = Duration::from_secs(600);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// adapter-file re-reads a file modified less than 2 s before its last read; a file is edited
/// again only after this long, so every open after an edit is the one that sees it.
const REREAD_GUARD: Duration = Duration::from_millis(3500);
/// The adapter's default `--poll-interval` (pauses between changes are spread over it).
const POLL: Duration = Duration::from_secs(1);
const STANDARD_SIZES: [usize; 4] = [10_000, 100_000, 300_000, 1_000_000];
const MB: f64 = 1e6;
const MIB: f64 = 1048576.0;

// ---------------------------------------------------------------------------------------------
// Small helpers

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn ms_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e6
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

fn env_list(name: &str) -> Option<Vec<usize>> {
    std::env::var(name).ok().map(|v| {
        v.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                p.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v}: not a list of numbers"))
            })
            .collect()
    })
}

/// `q`-quantile (nearest rank) of unsorted samples; NaN when empty.
fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn pcts(samples: &[f64]) -> String {
    format!(
        "p50 {:>8.2}  p90 {:>8.2}  p99 {:>8.2}  max {:>8.2} ms (n={})",
        quantile(samples, 0.5),
        quantile(samples, 0.9),
        quantile(samples, 0.99),
        quantile(samples, 1.0),
        samples.len()
    )
}

/// Least-squares slope and intercept of y over x.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.len() < 2 {
        return (f64::NAN, points.first().map_or(f64::NAN, |p| p.1));
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let slope = sxy / sxx;
    (slope, my - slope * mx)
}

/// Nanoseconds since the epoch of a UTC timestamp as tracing-subscriber prints it
/// (`2026-11-23T15:36:46.107499Z`).
fn parse_ts(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<u64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let digits = frac.len().min(9);
    let frac_ns = frac[..digits].parse::<u64>().ok()? * 10u64.pow((9 - digits) as u32);
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000_000 + frac_ns)
}

/// Drops ANSI colour sequences (the adapter colours its log even into a file).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn machine() -> String {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let mem = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(String::new(), |kib| {
            format!(", {:.1} GiB RAM", kib / 1024.0 / 1024.0)
        });
    format!("{cores} cores ({cpu}){mem}, load average {load} at start")
}

fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// xorshift64: spreads the pauses between changes over the poll interval.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

// ---------------------------------------------------------------------------------------------
// The generated inventory

/// Endpoint label sets: (version, zone, track) and the matching locality.
const LABEL_SETS: [[&str; 4]; 5] = [
    ["v1", "us-east-1a", "stable", "us-east/us-east-1a"],
    ["v1", "us-east-1b", "stable", "us-east/us-east-1b"],
    ["v1", "us-east-1c", "stable", "us-east/us-east-1c"],
    ["v2", "us-east-1a", "canary", "us-east/us-east-1a"],
    ["v2", "us-east-1b", "canary", "us-east/us-east-1b"],
];
const ONE_PORT: &[(&str, u32)] = &[("http", 8080)];
const TWO_PORTS: &[(&str, u32)] = &[("grpc-api", 9090), ("http", 8080)];

/// One generated service; the same data feeds the YAML and the prost floor.
struct GenService {
    name: String,
    team: String,
    ports: &'static [(&'static str, u32)],
    /// (address, index into [`LABEL_SETS`]).
    endpoints: Vec<(String, usize)>,
}

fn service_name(i: usize) -> String {
    format!("svc-{i:06}")
}

fn gen_service(i: usize) -> GenService {
    GenService {
        name: service_name(i),
        team: format!("team-{:02}", i % 40),
        ports: if i.is_multiple_of(2) {
            ONE_PORT
        } else {
            TWO_PORTS
        },
        endpoints: (0..EPS)
            .map(|j| {
                let e = i * EPS + j;
                (
                    format!("10.{}.{}.{}", (e >> 16) & 255, (e >> 8) & 255, e & 255),
                    (i + j) % LABEL_SETS.len(),
                )
            })
            .collect(),
    }
}

fn push_service_yaml(out: &mut String, s: &GenService, rev: Option<&str>) {
    let ports: Vec<String> = s.ports.iter().map(|(n, p)| format!("{n}: {p}")).collect();
    let rev = rev.map_or(String::new(), |r| format!(", bench-rev: {r}"));
    let _ = write!(
        out,
        "  - name: {}\n    ports: {{{}}}\n    labels: {{team: {}{rev}}}\n    endpoints:\n",
        s.name,
        ports.join(", "),
        s.team
    );
    for (address, set) in &s.endpoints {
        let [version, zone, track, locality] = LABEL_SETS[*set];
        let _ = writeln!(
            out,
            "      - {{address: {address}, locality: {locality}, labels: {{version: {version}, zone: {zone}, track: {track}}}}}"
        );
    }
}

/// A cached inventory directory of `services` x [`EPS`], `per_file` services per file.
struct Inventory {
    dir: PathBuf,
    services: usize,
    per_file: usize,
}

impl Inventory {
    fn ensure(root: &Path, services: usize, per_file: usize) -> Inventory {
        let dir = root.join(format!("inventory-{services}x{EPS}-f{per_file}"));
        let inv = Inventory {
            dir,
            services,
            per_file,
        };
        let marker = inv.dir.join(".complete");
        let want = format!("{GENERATOR} services={services} per_file={per_file}\n");
        if fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
            return inv;
        }
        let t = Instant::now();
        let _ = fs::remove_dir_all(&inv.dir);
        fs::create_dir_all(&inv.dir).expect("create inventory directory");
        for f in 0..inv.files() {
            inv.restore(f);
        }
        fs::write(&marker, want).expect("write marker");
        eprintln!(
            "[scale] generated {} ({:.1} MiB in {} files) in {:.1} s",
            inv.dir.display(),
            inv.bytes() as f64 / MIB,
            inv.files(),
            t.elapsed().as_secs_f64()
        );
        inv
    }

    fn files(&self) -> usize {
        self.services.div_ceil(self.per_file)
    }

    fn file_name(&self, f: usize) -> String {
        format!("chunk-{f:05}.yaml")
    }

    /// File `f`; `rev` labels its first service (the delta phase's change).
    fn chunk(&self, f: usize, rev: Option<&str>) -> String {
        let first = f * self.per_file;
        let end = (first + self.per_file).min(self.services);
        let mut out = format!(
            "# Generated by tests/benches/scale.rs ({GENERATOR}).\nkind: Inventory\nnamespace: {NAMESPACE}\nservices:\n"
        );
        for i in first..end {
            push_service_yaml(&mut out, &gen_service(i), rev.filter(|_| i == first));
        }
        out
    }

    /// Replaces file `f` atomically (a dot file, which the scanner skips, then a rename).
    fn replace(&self, f: usize, text: &str) {
        let tmp = self.dir.join(".scale-edit.tmp");
        fs::write(&tmp, text).expect("write edit");
        fs::rename(&tmp, self.dir.join(self.file_name(f))).expect("rename edit");
    }

    /// Writes file `f` as generated, dated an hour back: adapter-file re-reads files modified
    /// less than 2 s before it read them, which is right for a file being edited but would add
    /// re-reads (CPU, transient memory) to a measurement of a steady inventory.
    fn restore(&self, f: usize) {
        let path = self.dir.join(self.file_name(f));
        fs::write(&path, self.chunk(f, None)).expect("write inventory");
        let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
        fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|file| file.set_modified(an_hour_ago))
            .expect("date inventory file");
    }

    fn bytes(&self) -> u64 {
        (0..self.files())
            .filter_map(|f| fs::metadata(self.dir.join(self.file_name(f))).ok())
            .map(|m| m.len())
            .sum()
    }
}

// ---------------------------------------------------------------------------------------------
// The prost floor of translate + encode

/// Mean and min ms of building the prost `Resource{ServiceEntry}` of every service from the
/// generated model and encoding it (`runs` runs), and the encoded bytes.
fn floor_encode(services: usize, runs: usize) -> (f64, f64, u64) {
    let model: Vec<GenService> = (0..services).map(gen_service).collect();
    let mut times = Vec::new();
    let mut bytes = 0u64;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        bytes = 0;
        for s in &model {
            let buf = encode_floor(s);
            bytes += buf.len() as u64;
            black_box(buf);
        }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let min = times.iter().copied().fold(f64::INFINITY, f64::min);
    (mean, min, bytes)
}

fn protocol(port_name: &str) -> &'static str {
    match port_name.split('-').next() {
        Some("grpc") => "GRPC",
        Some("http") => "HTTP",
        _ => "",
    }
}

fn encode_floor(s: &GenService) -> Vec<u8> {
    let spec = ServiceEntry {
        hosts: vec![s.name.clone()],
        ports: s
            .ports
            .iter()
            .map(|(name, number)| ServicePort {
                number: *number,
                protocol: protocol(name).into(),
                name: (*name).into(),
                target_port: 0,
            })
            .collect(),
        location: service_entry::Location::MeshInternal as i32,
        resolution: service_entry::Resolution::Static as i32,
        endpoints: s
            .endpoints
            .iter()
            .map(|(address, set)| {
                let [version, zone, track, locality] = LABEL_SETS[*set];
                WorkloadEntry {
                    address: address.clone(),
                    labels: BTreeMap::from([
                        ("track".to_string(), track.to_string()),
                        ("version".to_string(), version.to_string()),
                        ("zone".to_string(), zone.to_string()),
                    ]),
                    locality: locality.into(),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    };
    Resource {
        metadata: Some(Metadata {
            name: format!("{NAMESPACE}/{}", s.name),
            create_time: Some(prost_types::Timestamp {
                seconds: 0,
                nanos: 0,
            }),
            // As long as the adapter's content hash.
            version: "0123456789abcdef".into(),
            labels: BTreeMap::from([
                ("mcp-adapter/registry".to_string(), "file".to_string()),
                ("mcp-adapter/source".to_string(), "file".to_string()),
                ("team".to_string(), s.team.clone()),
            ]),
            annotations: BTreeMap::new(),
        }),
        body: Some(prost_types::Any {
            type_url: proto::SERVICE_ENTRY_TYPE_URL.into(),
            value: spec.encode_to_vec(),
        }),
    }
    .encode_to_vec()
}

// ---------------------------------------------------------------------------------------------
// The adapter process

#[derive(Clone, Copy, Debug, Default)]
struct Mem {
    rss_kib: u64,
    hwm_kib: u64,
}

impl Mem {
    fn rss_mib(self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }
    fn hwm_mib(self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }
}

struct LogEvent {
    t: u64,
    text: String,
}

/// `adapter-file`, killed on drop.
struct AdapterProc {
    child: Child,
    grpc: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
    spawned: Instant,
    spawned_ns: u64,
}

impl AdapterProc {
    fn start(bin: &Path, inventory: &Path, log: PathBuf) -> AdapterProc {
        let grpc = free_addr();
        let admin = free_addr();
        let spawned_ns = now_ns();
        let spawned = Instant::now();
        let child = Command::new(bin)
            .arg("--path")
            .arg(inventory)
            .arg("--listen")
            .arg(grpc.to_string())
            .arg("--admin-listen")
            .arg(admin.to_string())
            .env("RUST_LOG", LOG_FILTER)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("adapter log file"))
            .spawn()
            .expect("spawn adapter-file");
        AdapterProc {
            child,
            grpc,
            admin,
            log,
            spawned,
            spawned_ns,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for `/readyz` 200; the time since spawn.
    fn wait_ready(&mut self) -> Duration {
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("adapter-file exited ({status}); log:\n{}", self.log_tail());
            }
            if http_get(self.admin, "/readyz").is_ok_and(|(s, _)| s == 200) {
                return self.spawned.elapsed();
            }
            assert!(
                self.spawned.elapsed() < READY_TIMEOUT,
                "adapter-file not ready within {READY_TIMEOUT:?}; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn mem(&self) -> Mem {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Mem {
            rss_kib: field("VmRSS:"),
            hwm_kib: field("VmHWM:"),
        }
    }

    /// utime + stime in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
    fn cpu_ticks(&self) -> u64 {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // The command name may contain spaces; fields are counted after its closing paren.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state): utime is field 14, stime field 15.
        let get = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<u64>().ok());
        get(14).unwrap_or(0) + get(15).unwrap_or(0)
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, body) = http_get(self.admin, "/metrics").expect("GET /metrics");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn events(&self) -> Vec<LogEvent> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let l = strip_ansi(l);
                let (ts, text) = l.trim_start().split_once(' ')?;
                Some(LogEvent {
                    t: parse_ts(ts)?,
                    text: text.to_string(),
                })
            })
            .collect()
    }

    fn log_tail(&self) -> String {
        let text = strip_ansi(&fs::read_to_string(&self.log).unwrap_or_default());
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for AdapterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clock_ticks() -> f64 {
    command_line("getconf", &["CLK_TCK"])
        .parse()
        .unwrap_or(100.0)
}

// ---------------------------------------------------------------------------------------------
// Sinks: the child process and what the parent reads from it

/// `DiscoveryResponse` as the sinks read it: resources are counted, their bodies skipped.
#[derive(Clone, PartialEq, prost::Message)]
struct LightSotw {
    #[prost(string, tag = "1")]
    version_info: String,
    #[prost(message, repeated, tag = "2")]
    resources: Vec<LightAny>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
}

/// `google.protobuf.Any` without its value.
#[derive(Clone, PartialEq, prost::Message)]
struct LightAny {
    #[prost(string, tag = "1")]
    type_url: String,
}

/// `DeltaDiscoveryResponse` with resource names and versions only.
#[derive(Clone, PartialEq, prost::Message)]
struct LightDelta {
    #[prost(string, tag = "1")]
    system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    resources: Vec<LightDeltaResource>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
    #[prost(string, repeated, tag = "6")]
    removed_resources: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LightDeltaResource {
    #[prost(string, tag = "1")]
    version: String,
    #[prost(message, optional, tag = "2")]
    resource: Option<LightAny>,
    #[prost(string, tag = "3")]
    name: String,
}

/// `DiscoveryResponse` keeping each resource's bytes (the floor replays them).
#[derive(Clone, PartialEq, prost::Message)]
struct RecordedSotw {
    #[prost(string, tag = "1")]
    version_info: String,
    #[prost(message, repeated, tag = "2")]
    resources: Vec<RecordedAny>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RecordedAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    value: Bytes,
}

/// A prost codec whose decoder also returns the message's size on the wire.
struct SizedCodec<Req, Resp>(PhantomData<fn() -> (Req, Resp)>);

impl<Req, Resp> Default for SizedCodec<Req, Resp> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

struct ProstEncoder<T>(PhantomData<fn(T)>);
struct SizedDecoder<T>(PhantomData<fn() -> T>);

impl<Req, Resp> Codec for SizedCodec<Req, Resp>
where
    Req: Message + Send + 'static,
    Resp: Message + Default + Send + 'static,
{
    type Encode = Req;
    type Decode = (usize, Resp);
    type Encoder = ProstEncoder<Req>;
    type Decoder = SizedDecoder<Resp>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        SizedDecoder(PhantomData)
    }
}

impl<T: Message> Encoder for ProstEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encode: {e}")))
    }
}

impl<T: Message + Default> Decoder for SizedDecoder<T> {
    type Item = (usize, T);
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<(usize, T)>, Status> {
        let size = src.remaining();
        T::decode(src)
            .map(|m| Some((size, m)))
            .map_err(|e| Status::internal(format!("decode: {e}")))
    }
}

/// A connection as istiod's client makes one (1 MiB HTTP/2 windows, no message size limit).
async fn grpc_client(
    addr: SocketAddr,
) -> Result<tonic::client::Grpc<tonic::transport::Channel>, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .initial_stream_window_size(Some(1 << 20))
        .initial_connection_window_size(Some(1 << 20))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    grpc.ready().await.map_err(|e| e.to_string())?;
    Ok(grpc)
}

fn node(idx: usize) -> Option<Node> {
    Some(Node {
        id: format!("sidecar~127.0.0.1~scale-sink-{idx}.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"),
        ..Default::default()
    })
}

async fn sotw_stream<Resp: Message + Default + Send + 'static>(
    addr: SocketAddr,
    idx: usize,
) -> Result<
    (
        tokio::sync::mpsc::UnboundedSender<DiscoveryRequest>,
        Streaming<(usize, Resp)>,
    ),
    String,
> {
    let mut grpc = grpc_client(addr).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(DiscoveryRequest {
        node: node(idx),
        type_url: SE_TYPE.into(),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let stream = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)),
            PathAndQuery::from_static(SOTW_PATH),
            SizedCodec::<DiscoveryRequest, Resp>::default(),
        )
        .await
        .map_err(|e| format!("open SotW stream: {e}"))?
        .into_inner();
    Ok((tx, stream))
}

/// Child mode: one SotW sink; prints `RESP <idx> <ns> <resources> <bytes> <version>` per response
/// (after ACKing it).
async fn sotw_sink(addr: SocketAddr, idx: usize) -> Result<(), String> {
    let (tx, mut stream) = sotw_stream::<LightSotw>(addr, idx).await?;
    while let Some((bytes, r)) = stream.message().await.map_err(|e| e.to_string())? {
        let t = now_ns();
        let resources = r
            .resources
            .iter()
            .filter(|a| a.type_url == proto::MCP_RESOURCE_TYPE_URL)
            .count();
        tx.send(DiscoveryRequest {
            version_info: r.version_info.clone(),
            response_nonce: r.nonce.clone(),
            type_url: r.type_url.clone(),
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        println!("RESP {idx} {t} {resources} {bytes} {}", r.version_info);
    }
    Err("the server ended the stream".into())
}

/// Child mode: one delta sink; prints `DELTA <idx> <ns> <resources> <bytes> <names|->` per
/// response (after ACKing it).
async fn delta_sink(addr: SocketAddr, idx: usize) -> Result<(), String> {
    let mut grpc = grpc_client(addr).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(DeltaDiscoveryRequest {
        node: node(idx),
        type_url: SE_TYPE.into(),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let mut stream = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)),
            PathAndQuery::from_static(DELTA_PATH),
            SizedCodec::<DeltaDiscoveryRequest, LightDelta>::default(),
        )
        .await
        .map_err(|e| format!("open delta stream: {e}"))?
        .into_inner();
    while let Some((bytes, r)) = stream.message().await.map_err(|e| e.to_string())? {
        let t = now_ns();
        tx.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        let names = if r.resources.len() <= 16 && !r.resources.is_empty() {
            r.resources
                .iter()
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>()
                .join(",")
        } else {
            "-".into()
        };
        println!("DELTA {idx} {t} {} {bytes} {names}", r.resources.len());
    }
    Err("the server ended the stream".into())
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Sotw,
    Delta,
}

/// Child process entry: `--sinks ADDR COUNT sotw|delta`. Prints `START <ns>`, opens all streams
/// at once, and holds them until stdin closes.
fn sinks_main(args: &[String]) {
    let addr: SocketAddr = args
        .first()
        .and_then(|a| a.parse().ok())
        .expect("--sinks ADDR COUNT MODE");
    let count: usize = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .expect("--sinks ADDR COUNT MODE");
    let mode = match args.get(2).map(String::as_str) {
        Some("delta") => Mode::Delta,
        _ => Mode::Sotw,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        println!("START {}", now_ns());
        for idx in 0..count {
            tokio::spawn(async move {
                let result = match mode {
                    Mode::Sotw => sotw_sink(addr, idx).await,
                    Mode::Delta => delta_sink(addr, idx).await,
                };
                if let Err(e) = result {
                    println!("ERR {idx} {e}");
                }
            });
        }
        let _ = tokio::task::spawn_blocking(|| {
            let mut buf = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut buf);
        })
        .await;
    });
    rt.shutdown_timeout(Duration::from_secs(1));
}

enum Line {
    Start(u64),
    Resp {
        idx: usize,
        t: u64,
        resources: usize,
        bytes: u64,
    },
    Delta {
        t: u64,
        resources: usize,
        names: Vec<String>,
    },
}

/// The sinks' child process, seen from the parent.
struct SinkProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

/// When the sinks connected (START) and when the last of them held the full set.
#[derive(Clone, Copy, Debug)]
struct Push {
    start_ns: u64,
    last_ns: u64,
    bytes: u64,
}

impl Push {
    fn secs(self) -> f64 {
        (self.last_ns.saturating_sub(self.start_ns)) as f64 / 1e9
    }
}

impl SinkProc {
    fn spawn(addr: SocketAddr, count: usize, mode: Mode) -> SinkProc {
        let mut child = Command::new(std::env::current_exe().expect("current exe"))
            .args([
                "--sinks",
                &addr.to_string(),
                &count.to_string(),
                if mode == Mode::Delta { "delta" } else { "sotw" },
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sinks");
        let stdout = child.stdout.take().expect("child stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        SinkProc {
            child,
            stdin,
            lines,
        }
    }

    /// The next line before `deadline`; panics on `ERR`, on timeout and on an exited child.
    fn next(&self, deadline: Instant, what: &str) -> Line {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("timed out waiting for {what}"),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the sinks' process ended while waiting for {what}")
                }
            };
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            match f.first().copied() {
                Some("START") => return Line::Start(num(1)),
                Some("RESP") => {
                    return Line::Resp {
                        idx: num(1) as usize,
                        t: num(2),
                        resources: num(3) as usize,
                        bytes: num(4),
                    }
                }
                Some("DELTA") => {
                    return Line::Delta {
                        t: num(2),
                        resources: num(3) as usize,
                        names: f
                            .get(5)
                            .filter(|n| **n != "-")
                            .map(|n| n.split(',').map(str::to_string).collect())
                            .unwrap_or_default(),
                    }
                }
                Some("ERR") => panic!("sink failed while waiting for {what}: {line}"),
                _ => eprintln!("[scale] sinks: {line}"),
            }
        }
    }

    /// Waits until `count` sinks each hold `expect` resources.
    fn wait_full(&self, count: usize, expect: usize) -> Push {
        let deadline = Instant::now() + PUSH_TIMEOUT;
        let what = format!("{count} sink(s) to hold {expect} resources");
        let mut start_ns = 0;
        let mut held = BTreeSet::new();
        let mut push = Push {
            start_ns: 0,
            last_ns: 0,
            bytes: 0,
        };
        while held.len() < count {
            match self.next(deadline, &what) {
                Line::Start(t) => start_ns = t,
                Line::Resp {
                    idx,
                    t,
                    resources,
                    bytes,
                } if resources == expect && held.insert(idx) => {
                    push.last_ns = push.last_ns.max(t);
                    push.bytes = bytes;
                }
                Line::Delta { t, resources, .. } if resources == expect => {
                    held.insert(0);
                    push.last_ns = t;
                }
                _ => {}
            }
        }
        push.start_ns = start_ns;
        push
    }

    fn close(mut self) {
        drop(self.stdin.take());
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SinkProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The push floor: a bare tonic ADS server replaying the adapter's exact bytes

/// Takes one full SotW response from `addr`, keeping the resources' bytes; checks the first
/// resource decodes to a ServiceEntry with [`EPS`] labelled endpoints. Returns the response as
/// the floor server sends it, its size on the wire, and a line describing what was checked.
async fn record(addr: SocketAddr, expect: usize) -> (wire::DiscoveryResponse, usize, String) {
    let (tx, mut stream) = sotw_stream::<RecordedSotw>(addr, 9999)
        .await
        .expect("recorder stream");
    let (size, r) = loop {
        let (size, r) = tokio::time::timeout(PUSH_TIMEOUT, stream.message())
            .await
            .expect("recorder: response in time")
            .expect("recorder: stream ok")
            .expect("recorder: stream open");
        if r.resources.len() == expect {
            break (size, r);
        }
    };
    drop(tx);
    assert!(
        r.resources
            .iter()
            .all(|a| a.type_url == proto::MCP_RESOURCE_TYPE_URL),
        "every resource is an MCP Resource"
    );
    let first = r.resources.first().expect("a resource");
    let res = Resource::decode(first.value.clone()).expect("MCP Resource");
    let body = res.body.expect("resource body");
    let se = ServiceEntry::decode(body.value.as_slice()).expect("ServiceEntry");
    let name = res.metadata.map(|m| m.name).unwrap_or_default();
    assert_eq!(se.endpoints.len(), EPS, "{name}: endpoints");
    let labels = se.endpoints[0].labels.len();
    assert_eq!(labels, 3, "{name}: endpoint labels");
    let check = format!(
        "checked {name}: hosts {:?}, {} port(s), {} endpoints with {labels} labels, locality {:?}",
        se.hosts,
        se.ports.len(),
        se.endpoints.len(),
        se.endpoints[0].locality
    );
    let response = wire::DiscoveryResponse {
        version_info: r.version_info,
        resources: r
            .resources
            .into_iter()
            .map(|a| wire::SharedAny {
                type_url: proto::MCP_RESOURCE_TYPE_URL,
                value: a.value,
            })
            .collect(),
        type_url: r.type_url,
        nonce: r.nonce,
    };
    assert_eq!(response.encoded_len(), size, "the floor replays our bytes");
    (response, size, check)
}

#[derive(Clone)]
struct FloorAds {
    sotw: Arc<wire::DiscoveryResponse>,
}

type SotwStream = tokio_stream::wrappers::ReceiverStream<Result<wire::DiscoveryResponse, Status>>;
type DeltaStream =
    tokio_stream::wrappers::ReceiverStream<Result<wire::DeltaDiscoveryResponse, Status>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for FloorAds {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        req: tonic::Request<Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<SotwStream>, Status> {
        let mut requests = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let response = self.sotw.clone();
        tokio::spawn(async move {
            // The full set answers the subscription; ACKs are read and dropped.
            while let Ok(Some(r)) = requests.message().await {
                if r.response_nonce.is_empty() && tx.send(Ok((*response).clone())).await.is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(SotwStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _req: tonic::Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaStream>, Status> {
        Err(Status::unimplemented("the floor serves SotW only"))
    }
}

/// Serves `response` as the adapter's server is configured (TCP_NODELAY, no encode limit).
async fn floor_server(
    response: Arc<wire::DiscoveryResponse>,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind floor server");
    let addr = listener.local_addr().expect("floor address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                AggregatedDiscoveryServiceServer::new(FloorAds { sotw: response })
                    .max_decoding_message_size(16 << 20)
                    .max_encoding_message_size(usize::MAX),
            )
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    );
    (addr, stop)
}

// ---------------------------------------------------------------------------------------------
// The phases

struct Knobs {
    max: usize,
    sizes: Vec<usize>,
    rss_endpoints: usize,
    rss_sinks: Vec<usize>,
    push_sinks: usize,
    idle_secs: u64,
    changes: usize,
    per_file: usize,
    settle: Duration,
    skip: BTreeSet<String>,
    adapter: PathBuf,
}

impl Knobs {
    fn from_env() -> Knobs {
        let max = env_usize("MCP_SCALE_MAX", 1_000_000);
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
            rss_sinks: env_list("MCP_SCALE_RSS_SINKS")
                .unwrap_or_else(|| vec![0, 1, 5, 10, 21, 50, 100]),
            push_sinks: env_usize("MCP_SCALE_PUSH_SINKS", 10),
            idle_secs: env_usize("MCP_SCALE_IDLE_SECS", 60) as u64,
            changes: env_usize("MCP_SCALE_CHANGES", 100),
            per_file: env_usize("MCP_SCALE_FILE_SERVICES", 1000).max(1),
            settle: Duration::from_millis(env_usize("MCP_SCALE_SETTLE_MS", 2000) as u64),
            skip: std::env::var("MCP_SCALE_SKIP")
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            sizes,
            adapter,
        }
    }

    fn runs(&self, phase: &str) -> bool {
        !self.skip.contains(phase)
    }
}

struct Ctx {
    knobs: Knobs,
    root: PathBuf,
    rt: tokio::runtime::Runtime,
    logs: PathBuf,
    starts: usize,
}

impl Ctx {
    fn start_adapter(&mut self, inventory: &Path) -> AdapterProc {
        self.starts += 1;
        let log = self.logs.join(format!("adapter-{:02}.log", self.starts));
        AdapterProc::start(&self.knobs.adapter, inventory, log)
    }
}

/// The adapter's own account of its first sync, from its log.
#[derive(Clone, Copy, Debug, Default)]
struct Startup {
    ready_s: f64,
    /// Process start ("Adapter started.") -> first `Reset` sent (scan, read, parse).
    scan_s: f64,
    /// First `Reset` sent -> first snapshot published.
    reset_to_published_s: f64,
    cpu_s: f64,
    published_resources: usize,
}

fn startup(a: &mut AdapterProc, ticks: f64) -> Startup {
    let ready = a.wait_ready();
    let cpu_s = a.cpu_ticks() as f64 / ticks;
    let events = a.events();
    let started = events
        .iter()
        .find(|e| e.text.contains("Adapter started."))
        .map_or(a.spawned_ns, |e| e.t);
    let reset = events
        .iter()
        .find(|e| e.text.contains("Sending full set."))
        .map(|e| e.t);
    let published = events
        .iter()
        .find(|e| e.text.contains("Publishing a new served set."));
    let published_resources = published
        .and_then(|e| {
            e.text
                .split_whitespace()
                .find_map(|w| w.strip_prefix("resources="))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    let (scan_s, reset_to_published_s) = match (reset, published) {
        (Some(r), Some(p)) => (ms_between(started, r) / 1e3, ms_between(r, p.t) / 1e3),
        _ => (f64::NAN, f64::NAN),
    };
    Startup {
        ready_s: ready.as_secs_f64(),
        scan_s,
        reset_to_published_s,
        cpu_s,
        published_resources,
    }
}

struct RssRow {
    endpoints: usize,
    sinks: usize,
    mem: Mem,
    push_s: f64,
    bytes: u64,
    connected: f64,
}

fn rss_point(ctx: &mut Ctx, inv: &Inventory, sinks: usize) -> RssRow {
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
        "[scale] rss {} endpoints, {sinks:>3} sinks: VmRSS {:.1} MiB, VmHWM {:.1} MiB, push {:.3} s",
        row.endpoints,
        mem.rss_mib(),
        mem.hwm_mib(),
        row.push_s
    );
    row
}

struct Idle {
    secs: f64,
    cpu_s: f64,
    snapshots: (f64, f64),
    pushes: (f64, f64),
    mem_after: Mem,
}

impl Idle {
    fn pct(&self) -> f64 {
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

/// One change, timed (ns since the epoch).
struct Change {
    k: usize,
    file: usize,
    written: u64,
    opened: Option<u64>,
    received: u64,
    reset: Option<u64>,
    published: Option<u64>,
}

impl Change {
    fn open_to_sink_ms(&self) -> Option<f64> {
        self.opened.map(|o| ms_between(o, self.received))
    }
}

/// Watches `dir` for opens; (file name, ns since the epoch) as the event is read.
fn watch_opens(dir: &Path) -> mpsc::Receiver<(String, u64)> {
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).expect("inotify_init");
    inotify::add_watch(&fd, dir, inotify::WatchFlags::OPEN).expect("inotify_add_watch");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = inotify::Reader::new(&fd, &mut buf);
        loop {
            match reader.next() {
                Ok(event) => {
                    let t = now_ns();
                    if let Some(name) = event.file_name() {
                        if tx.send((name.to_string_lossy().into_owned(), t)).is_err() {
                            return;
                        }
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
        }
    });
    rx
}

/// One changed service at a time -> the delta sink. Returns the changes and the files edited.
fn delta_phase(a: &AdapterProc, inv: &Inventory, changes: usize) -> (Vec<Change>, BTreeSet<usize>) {
    let opens = watch_opens(&inv.dir);
    let sink = SinkProc::spawn(a.grpc, 1, Mode::Delta);
    sink.wait_full(1, inv.services);
    let files = inv.files();
    let mut last_edit: BTreeMap<usize, Instant> = BTreeMap::new();
    let mut rng = Rng(now_ns() | 1);
    let mut out = Vec::new();
    let run = now_ns() % 100_000;
    for k in 0..changes {
        let file = k % files;
        if let Some(t) = last_edit.get(&file) {
            std::thread::sleep(REREAD_GUARD.saturating_sub(t.elapsed()));
        }
        let want = format!("/{}", service_name(file * inv.per_file));
        let text = inv.chunk(file, Some(&format!("r{run}-{k}")));
        while opens.try_recv().is_ok() {}
        let written = now_ns();
        inv.replace(file, &text);
        last_edit.insert(file, Instant::now());
        let deadline = Instant::now() + CHANGE_TIMEOUT;
        let received = loop {
            if let Line::Delta { t, names, .. } = sink.next(deadline, "the changed service") {
                if names.iter().any(|n| n.ends_with(&want)) {
                    break t;
                }
            }
        };
        // The adapter's first open of the file after the write (it precedes the push; give
        // the watcher thread a moment in case it was descheduled).
        let name = inv.file_name(file);
        let open_deadline = Instant::now() + Duration::from_secs(1);
        let mut opened = None;
        while opened.is_none() {
            match opens.recv_timeout(open_deadline.saturating_duration_since(Instant::now())) {
                Ok((n, t)) if n == name && t >= written => opened = Some(t),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        out.push(Change {
            k,
            file,
            written,
            opened,
            received,
            reset: None,
            published: None,
        });
        // Land the next write at a random phase of the poll interval.
        std::thread::sleep(Duration::from_millis(rng.below(POLL.as_millis() as u64)));
    }
    sink.close();
    // The adapter's log splits each change: changes (or a Reset) sent, snapshot published.
    let events = a.events();
    let resets: Vec<u64> = events
        .iter()
        .filter(|e| e.text.contains("Sending full set.") || e.text.contains("Sending changes."))
        .map(|e| e.t)
        .collect();
    let publishes: Vec<u64> = events
        .iter()
        .filter(|e| e.text.contains("Publishing a new served set."))
        .map(|e| e.t)
        .collect();
    for c in &mut out {
        let from = c.opened.unwrap_or(c.written);
        c.reset = resets
            .iter()
            .copied()
            .find(|&t| t >= from && t <= c.received);
        c.published = publishes
            .iter()
            .copied()
            .find(|&t| t >= c.reset.unwrap_or(from) && t <= c.received);
    }
    (out, last_edit.into_keys().collect())
}

struct SizeRow {
    endpoints: usize,
    services: usize,
    files: usize,
    inventory_bytes: u64,
    floor_encode_ms: (f64, f64),
    floor_bytes: u64,
    startup: Startup,
    mem0: Mem,
    push_many: Push,
    mem_many: Mem,
    push_one: Push,
    floor_many: Option<f64>,
    floor_one: Option<f64>,
    check: String,
    idle: Option<Idle>,
    delta: Option<Vec<Change>>,
}

fn size_run(ctx: &mut Ctx, endpoints: usize, ticks: f64) -> SizeRow {
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
    let st = startup(&mut a, ticks);
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
        "[scale] {endpoints} endpoints: {n} sinks hold the full set after {:.3} s; VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        push_many.secs(),
        mem_many.rss_mib(),
        mem_many.hwm_mib()
    );
    let idle_result = (endpoints == knobs_max && ctx.knobs.runs("idle")).then(|| {
        eprintln!(
            "[scale] idle CPU: {} s with {n} sinks connected...",
            ctx.knobs.idle_secs
        );
        idle(&a, ctx.knobs.idle_secs, ticks)
    });
    many.close();

    let one = SinkProc::spawn(a.grpc, 1, Mode::Sotw);
    let push_one = one.wait_full(1, services);
    one.close();
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
        let c = SinkProc::spawn(addr, n, Mode::Sotw);
        let fm = c.wait_full(n, services).secs();
        c.close();
        let c = SinkProc::spawn(addr, 1, Mode::Sotw);
        let fo = c.wait_full(1, services).secs();
        c.close();
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

// ---------------------------------------------------------------------------------------------
// Report

struct Target {
    what: String,
    endpoints: usize,
    limit: String,
    measured: f64,
    unit: &'static str,
    floor: String,
    pass: bool,
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "FAIL"
    }
}

fn write_csv(path: &Path, header: &str, rows: &[String]) {
    let mut text = format!("{header}\n");
    for r in rows {
        text.push_str(r);
        text.push('\n');
    }
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

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
        .map(|t| t.join("scale"))
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
    eprintln!(
        "[scale] empty adapter: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        empty_mem.rss_mib(),
        empty_mem.hwm_mib()
    );

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
    let wall_s = wall.elapsed().as_secs_f64();

    // ---- CSV
    let root = ctx.root.clone();
    let n = ctx.knobs.push_sinks;
    write_csv(
        &root.join("rss_vs_sinks.csv"),
        "endpoints,sinks,vmrss_mib,vmhwm_mib,push_s,response_bytes,connected_sinks",
        &rss_rows
            .iter()
            .map(|r| {
                format!(
                    "{},{},{:.2},{:.2},{:.4},{},{}",
                    r.endpoints,
                    r.sinks,
                    r.mem.rss_mib(),
                    r.mem.hwm_mib(),
                    r.push_s,
                    r.bytes,
                    r.connected
                )
            })
            .collect::<Vec<_>>(),
    );
    let mut push_rows = Vec::new();
    for r in &rows {
        push_rows.push(format!(
            "{},{},1,{:.4},{},{},,",
            r.endpoints,
            r.services,
            r.push_one.secs(),
            r.floor_one.map_or(String::new(), |f| format!("{f:.4}")),
            r.push_one.bytes
        ));
        push_rows.push(format!(
            "{},{},{n},{:.4},{},{},{:.2},{:.2}",
            r.endpoints,
            r.services,
            r.push_many.secs(),
            r.floor_many.map_or(String::new(), |f| format!("{f:.4}")),
            r.push_many.bytes,
            r.mem_many.rss_mib(),
            r.mem_many.hwm_mib()
        ));
    }
    write_csv(
        &root.join("push_vs_endpoints.csv"),
        "endpoints,services,sinks,push_s,floor_push_s,response_bytes,vmrss_mib,vmhwm_mib",
        &push_rows,
    );
    write_csv(
        &root.join("sizes.csv"),
        "endpoints,services,files,inventory_mib,ready_s,startup_cpu_s,scan_s,reset_to_published_s,floor_encode_mean_ms,floor_encode_min_ms,floor_encoded_mib,vmrss0_mib,vmhwm0_mib",
        &rows
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{:.2},{:.3},{:.3},{:.3},{:.4},{:.2},{:.2},{:.2},{:.2},{:.2}",
                    r.endpoints,
                    r.services,
                    r.files,
                    r.inventory_bytes as f64 / MIB,
                    r.startup.ready_s,
                    r.startup.cpu_s,
                    r.startup.scan_s,
                    r.startup.reset_to_published_s,
                    r.floor_encode_ms.0,
                    r.floor_encode_ms.1,
                    r.floor_bytes as f64 / MIB,
                    r.mem0.rss_mib(),
                    r.mem0.hwm_mib()
                )
            })
            .collect::<Vec<_>>(),
    );
    let opt_ms = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
    let delta_rows: Vec<String> = rows
        .iter()
        .filter_map(|r| r.delta.as_ref().map(|d| (r.endpoints, d)))
        .flat_map(|(endpoints, d)| {
            d.iter().map(move |c| {
                format!(
                    "{endpoints},{},{},{:.3},{},{},{},{}",
                    c.k,
                    c.file,
                    ms_between(c.written, c.received),
                    opt_ms(c.open_to_sink_ms()),
                    opt_ms(c.opened.zip(c.reset).map(|(o, r)| ms_between(o, r))),
                    opt_ms(c.reset.zip(c.published).map(|(r, p)| ms_between(r, p))),
                    opt_ms(c.published.map(|p| ms_between(p, c.received)))
                )
            })
        })
        .collect();
    write_csv(
        &root.join("delta.csv"),
        "endpoints,k,file,write_to_sink_ms,open_to_sink_ms,open_to_reset_ms,reset_to_published_ms,published_to_sink_ms",
        &delta_rows,
    );

    // ---- Targets
    let mut targets = Vec::new();
    let rss_limit_mib = 150.0 * MB / MIB;
    let rss_at = |sinks: usize| rss_rows.iter().find(|r| r.sinks == sinks);
    let rss_floor = rss_at(0).map_or(String::new(), |r| {
        format!(
            "0 sinks {:.1} MiB; empty {:.1} MiB",
            r.mem.rss_mib(),
            empty_mem.rss_mib()
        )
    });
    for sinks in [21, 100] {
        if let Some(r) = rss_at(sinks) {
            targets.push(Target {
                what: format!("RSS, {sinks} SotW sinks"),
                endpoints: r.endpoints,
                limit: "150 MB".into(),
                measured: r.mem.rss_mib(),
                unit: "MiB",
                floor: rss_floor.clone(),
                pass: r.mem.rss_mib() <= rss_limit_mib,
            });
        }
    }
    let points: Vec<(f64, f64)> = rss_rows
        .iter()
        .map(|r| (r.sinks as f64, r.mem.rss_mib()))
        .collect();
    let (slope, intercept) = fit(&points);
    if points.len() >= 2 {
        targets.push(Target {
            what: "extra RSS per SotW sink (slope)".into(),
            endpoints: ctx.knobs.rss_endpoints,
            limit: "1 MiB".into(),
            measured: slope,
            unit: "MiB",
            floor: format!("intercept {intercept:.1} MiB"),
            pass: slope <= 1.0,
        });
    }
    if let Some(r) = rows.last() {
        let s = r.startup.reset_to_published_s;
        targets.push(Target {
            what: "registry Reset -> snapshot published (cold)".into(),
            endpoints: r.endpoints,
            limit: "2 s".into(),
            measured: s,
            unit: "s",
            floor: format!("prost build+encode {:.3} s", r.floor_encode_ms.0 / 1e3),
            pass: s <= 2.0,
        });
        targets.push(Target {
            what: format!("peak RSS (VmHWM), {n} SotW sinks"),
            endpoints: r.endpoints,
            limit: "1 GB".into(),
            measured: r.mem_many.hwm_mib(),
            unit: "MiB",
            floor: format!(
                "0 sinks {:.1} MiB; encoded set {:.1} MiB",
                r.mem0.rss_mib(),
                r.floor_bytes as f64 / MIB
            ),
            pass: r.mem_many.hwm_kib as f64 * 1024.0 <= 1e9,
        });
        targets.push(Target {
            what: format!("full SotW push, {n} sinks at once, until the last holds it"),
            endpoints: r.endpoints,
            limit: "3 s".into(),
            measured: r.push_many.secs(),
            unit: "s",
            floor: r
                .floor_many
                .map_or(String::new(), |f| format!("bare tonic replay {f:.3} s")),
            pass: r.push_many.secs() <= 3.0,
        });
        if let Some(d) = &r.delta {
            let open: Vec<f64> = d.iter().filter_map(Change::open_to_sink_ms).collect();
            let p99 = quantile(&open, 0.99);
            let published: Vec<f64> = d
                .iter()
                .filter_map(|c| c.published.map(|p| ms_between(p, c.received)))
                .collect();
            targets.push(Target {
                what: "one changed service -> delta sink, p99 (file opened -> sink)".into(),
                endpoints: r.endpoints,
                limit: "10 ms".into(),
                measured: p99,
                unit: "ms",
                floor: format!(
                    "published -> sink p99 {:.2} ms; default --coalesce 20ms",
                    quantile(&published, 0.99)
                ),
                pass: p99 <= 10.0,
            });
        }
        if let Some(i) = &r.idle {
            targets.push(Target {
                what: format!("idle CPU, {n} sinks, nothing changing"),
                endpoints: r.endpoints,
                limit: "< 0.1 %".into(),
                measured: i.pct(),
                unit: "%",
                floor: format!("resolution {:.3} %", 100.0 / ticks / i.secs),
                pass: i.pct() < 0.1,
            });
        }
    }
    write_csv(
        &root.join("targets.csv"),
        "target,endpoints,limit,measured,unit,floor,verdict",
        &targets
            .iter()
            .map(|t| {
                format!(
                    "\"{}\",{},{},{:.4},{},\"{}\",{}",
                    t.what,
                    t.endpoints,
                    t.limit,
                    t.measured,
                    t.unit,
                    t.floor,
                    verdict(t.pass)
                )
            })
            .collect::<Vec<_>>(),
    );

    // ---- Table
    let mut out = String::new();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "== scale: adapter-file (release, default flags), S services x {EPS} endpoints, sinks in a separate process =="
    );
    let _ = writeln!(out, "machine: {machine}");
    let _ = writeln!(
        out,
        "commit {commit}{}; adapter {}; {} services per file; wall time {:.0} s",
        if dirty {
            " (+ uncommitted changes)"
        } else {
            ""
        },
        ctx.knobs.adapter.display(),
        ctx.knobs.per_file,
        wall_s
    );
    let _ = writeln!(
        out,
        "empty adapter (floor): VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        empty_mem.rss_mib(),
        empty_mem.hwm_mib()
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "endpoints",
        "inv MiB",
        "ready s",
        "scan s",
        "Reset->pub",
        "floor enc",
        "wire MiB",
        "RSS0 MiB",
        format!("push {n}"),
        format!("floor {n}"),
        "push 1",
        "floor 1",
        format!("HWM{n} MiB")
    );
    for r in &rows {
        let _ = writeln!(
            out,
            "{:>9} {:>8.1} {:>8.2} {:>8.2} {:>9.3}s {:>8.3}s {:>9.1} {:>9.1} {:>8.3}s {:>9} {:>8.3}s {:>9} {:>9.1}",
            r.endpoints,
            r.inventory_bytes as f64 / MIB,
            r.startup.ready_s,
            r.startup.scan_s,
            r.startup.reset_to_published_s,
            r.floor_encode_ms.0 / 1e3,
            r.push_one.bytes as f64 / MIB,
            r.mem0.rss_mib(),
            r.push_many.secs(),
            r.floor_many.map_or("-".into(), |f| format!("{f:.3}s")),
            r.push_one.secs(),
            r.floor_one.map_or("-".into(), |f| format!("{f:.3}s")),
            r.mem_many.hwm_mib()
        );
    }
    for r in &rows {
        if !r.check.is_empty() {
            let _ = writeln!(out, "{} endpoints: {}", r.endpoints, r.check);
        }
    }
    if !rss_rows.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "RSS vs SotW sinks at {} endpoints (fresh adapter per row; read {} ms after the last sink holds the set):",
            ctx.knobs.rss_endpoints,
            ctx.knobs.settle.as_millis()
        );
        let _ = writeln!(
            out,
            "{:>6} {:>10} {:>10} {:>10} {:>9} {:>10}",
            "sinks", "VmRSS MiB", "VmHWM MiB", "push s", "MiB/sink", "connected"
        );
        let base = rss_at(0).map(|r| r.mem.rss_mib());
        for r in &rss_rows {
            let per = base.filter(|_| r.sinks > 0).map_or("-".into(), |b| {
                format!("{:.2}", (r.mem.rss_mib() - b) / r.sinks as f64)
            });
            let _ = writeln!(
                out,
                "{:>6} {:>10.1} {:>10.1} {:>10.3} {:>9} {:>10}",
                r.sinks,
                r.mem.rss_mib(),
                r.mem.hwm_mib(),
                r.push_s,
                per,
                r.connected
            );
        }
        let _ = writeln!(
            out,
            "least-squares: {slope:.2} MiB per sink + {intercept:.1} MiB"
        );
    }
    for r in &rows {
        if let Some(i) = &r.idle {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "idle at {} endpoints, {n} sinks, {:.0} s: CPU {:.2} s = {:.3} % of one core; snapshots_total {} -> {}, pushes_total {} -> {}; VmRSS after {:.1} MiB",
                r.endpoints,
                i.secs,
                i.cpu_s,
                i.pct(),
                i.snapshots.0,
                i.snapshots.1,
                i.pushes.0,
                i.pushes.1,
                i.mem_after.rss_mib()
            );
        }
        if let Some(d) = &r.delta {
            let pick =
                |f: &dyn Fn(&Change) -> Option<f64>| d.iter().filter_map(f).collect::<Vec<f64>>();
            let missing = d.iter().filter(|c| c.opened.is_none()).count();
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "one changed service -> delta sink at {} endpoints ({} changes; {missing} without an observed open):",
                r.endpoints,
                d.len()
            );
            let _ = writeln!(
                out,
                "  file written -> sink (incl. poll wait)  {}",
                pcts(&pick(&|c| Some(ms_between(c.written, c.received))))
            );
            let _ = writeln!(
                out,
                "  file opened -> sink                     {}",
                pcts(&pick(&|c| c.open_to_sink_ms()))
            );
            let _ = writeln!(
                out,
                "    opened -> Reset sent (read, parse)    {}",
                pcts(&pick(&|c| c
                    .opened
                    .zip(c.reset)
                    .map(|(o, r)| ms_between(o, r))))
            );
            let _ = writeln!(
                out,
                "    Reset -> published (core, +coalesce)  {}",
                pcts(&pick(&|c| c
                    .reset
                    .zip(c.published)
                    .map(|(r, p)| ms_between(r, p))))
            );
            let _ = writeln!(
                out,
                "    published -> sink (push)              {}",
                pcts(&pick(&|c| c.published.map(|p| ms_between(p, c.received))))
            );
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<62} {:>9} {:>8} {:>10} {:<5} {:>4}  floor / context",
        "target", "endpoints", "limit", "measured", "", ""
    );
    for t in &targets {
        let _ = writeln!(
            out,
            "{:<62} {:>9} {:>8} {:>10.3} {:<5} {:>4}  {}",
            t.what,
            t.endpoints,
            t.limit,
            t.measured,
            t.unit,
            verdict(t.pass),
            t.floor
        );
    }
    let _ = writeln!(
        out,
        "\nCSV: {}/{{rss_vs_sinks,push_vs_endpoints,sizes,delta,targets}}.csv; adapter logs in {}",
        root.display(),
        ctx.logs.display()
    );
    print!("{out}");
    let _ = std::io::stdout().flush();
    fs::write(root.join("run.txt"), out).expect("write run.txt");
}
