//! The adapter under test: `adapter-file` as a child process with its default flags (killed on
//! drop), what it costs (`/proc`, through `mcp_core::testing::bench`), its metrics, and its log,
//! whose timestamps split the time spent inside it.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e::{free_addr, http_get};
use mcp_core::testing::bench::{Mem, Proc};
use mcp_core::testing::metric_sum;

use crate::util::{ms_between, now_ns, parse_ts, strip_ansi};

/// The adapter's default log level, plus the file registry's one debug line per `Reset` (the
/// start of "Reset -> published"); no flag is changed.
const LOG_FILTER: &str = "info,adapter_file::registry=debug";
const READY_TIMEOUT: Duration = Duration::from_secs(600);

// The log lines the bench times (found anywhere in a line).
/// The process started.
pub const STARTED: &str = "Adapter started.";
/// The file registry sent a `Reset`.
pub const SENT_FULL_SET: &str = "Sending full set.";
/// The file registry sent changes.
pub const SENT_CHANGES: &str = "Sending changes.";
/// The core published a snapshot.
pub const PUBLISHED: &str = "Publishing a new served set.";

pub struct LogEvent {
    pub t: u64,
    pub text: String,
}

/// The first event whose text contains `what`.
fn first<'a>(events: &'a [LogEvent], what: &str) -> Option<&'a LogEvent> {
    events.iter().find(|e| e.text.contains(what))
}

/// The times of every event whose text contains one of `what`.
pub fn times(events: &[LogEvent], what: &[&str]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| what.iter().any(|w| e.text.contains(w)))
        .map(|e| e.t)
        .collect()
}

/// `adapter-file`, killed on drop.
pub struct AdapterProc {
    child: Child,
    pub grpc: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
    spawned: Instant,
    spawned_ns: u64,
}

impl AdapterProc {
    pub fn start(bin: &Path, args: &[String], inventory: &Path, log: PathBuf) -> AdapterProc {
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
            .args(args)
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

    fn proc(&self) -> Proc {
        Proc::Pid(self.child.id())
    }

    /// Waits for `/readyz` 200; the time since spawn.
    pub fn wait_ready(&mut self) -> Duration {
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

    pub fn mem(&self) -> Mem {
        self.proc().mem()
    }

    /// utime + stime in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.proc().cpu_ticks()
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, body) = http_get(self.admin, "/metrics").expect("GET /metrics");
        metric_sum(&body, name)
    }

    pub fn events(&self) -> Vec<LogEvent> {
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

    pub fn log_tail(&self) -> String {
        let text = strip_ansi(&fs::read_to_string(&self.log).unwrap_or_default());
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Waits until ready; the adapter's own account of its first sync (`ticks`: clock ticks per
    /// second).
    pub fn startup(&mut self, ticks: f64) -> Startup {
        let ready = self.wait_ready();
        let cpu_s = self.cpu_ticks() as f64 / ticks;
        let events = self.events();
        let started = first(&events, STARTED).map_or(self.spawned_ns, |e| e.t);
        let reset = first(&events, SENT_FULL_SET).map(|e| e.t);
        let published = first(&events, PUBLISHED);
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
}

impl Drop for AdapterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The adapter's own account of its first sync, from its log.
#[derive(Clone, Copy, Debug, Default)]
pub struct Startup {
    pub ready_s: f64,
    /// Process start ("Adapter started.") -> first `Reset` sent (scan, read, parse).
    pub scan_s: f64,
    /// First `Reset` sent -> first snapshot published.
    pub reset_to_published_s: f64,
    pub cpu_s: f64,
    pub published_resources: usize,
}
