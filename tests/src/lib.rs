//! Harness for the end-to-end tests: starts the adapters' real binaries on free loopback ports
//! and real peers (Istio's own MCP client `adsc-watch`, built by `tests/istio-adsc/build.sh`).
//!
//! Binaries are found next to the test executable (`target/<profile>/`), which `cargo test
//! --workspace` builds; the Istio peers in `$ADSC_WATCH_DIR` (default `target/adsc`).

pub mod consul;
pub mod eureka;
pub mod istiod;
pub mod kube;
pub mod pki;
pub mod zookeeper;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `target/<profile>` of this build.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test-binary>
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target/debug"))
}

/// A workspace binary (`adapter-file`, `mcpctl`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A free loopback port (bound and released; good enough for tests on one machine).
pub fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr")
}

/// Minimal HTTP GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http(addr, "GET", path, &[], "")
}

/// Minimal HTTP/1.0 request: (status, body).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.0\r\nHost: test\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Polls `f` every 50 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running adapter process, killed on drop.
pub struct Adapter {
    child: Child,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Adapter {
    /// Starts `binary` with `args` plus `--listen`/`--admin-listen` on free ports; waits until
    /// the admin port answers.
    pub fn start(binary: &str, args: &[&str]) -> Adapter {
        Self::start_with_env(binary, args, &[])
    }

    /// [`Adapter::start`] with extra environment variables.
    pub fn start_with_env(binary: &str, args: &[&str], env: &[(&str, &str)]) -> Adapter {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("adapter.log");
        let grpc = free_addr();
        let admin = free_addr();
        let child = Command::new(workspace_bin(binary))
            .args(args)
            .arg("--listen")
            .arg(grpc.to_string())
            .arg("--admin-listen")
            .arg(admin.to_string())
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn adapter");
        let a = Adapter {
            child,
            grpc,
            admin,
            log,
            _dir: dir,
        };
        let end = Instant::now() + Duration::from_secs(20);
        while http_get(admin, "/healthz")
            .ok()
            .filter(|(s, _)| *s == 200)
            .is_none()
        {
            assert!(
                Instant::now() < end,
                "{binary} did not open its admin port within 20s; its log:\n{}",
                a.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        a
    }

    /// Waits until /readyz is 200.
    pub fn wait_ready(&self) {
        wait_for(Duration::from_secs(20), "adapter /readyz", || {
            http_get(self.admin, "/readyz")
                .ok()
                .filter(|(s, _)| *s == 200)
        });
    }

    /// GET on the admin port.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path).expect("admin GET")
    }

    /// /debug/resources as JSON.
    pub fn debug(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/debug/resources").1).expect("debug JSON")
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit; its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// What the adapter logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last 30 lines of the log, for assertion messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log(), 30)
    }

    /// Sum of a metric's samples on /metrics (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        self.get("/metrics")
            .1
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    }

    /// Steady state with nothing changing in the registry, observed for `window`: no registry
    /// errors, ready, and not one new snapshot (nothing is re-listed or re-pushed).
    pub fn assert_steady(&self, window: Duration) {
        let snapshots = self.metric("mcp_adapter_snapshots_total");
        assert!(snapshots > 0.0, "no snapshot yet");
        let end = Instant::now() + window;
        while Instant::now() < end {
            assert_eq!(
                self.metric("mcp_adapter_registry_errors_total"),
                0.0,
                "registry errors in steady state; log:\n{}",
                self.log_tail()
            );
            let (status, body) = self.get("/readyz");
            assert_eq!(status, 200, "/readyz in steady state: {body}");
            assert_eq!(
                self.metric("mcp_adapter_snapshots_total"),
                snapshots,
                "a snapshot was built while nothing changed; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which build of Istio's client.
#[derive(Clone, Copy, Debug)]
pub enum IstioVersion {
    /// Istio 1.31-dev (requests `networking.istio.io/v1/ServiceEntry`).
    Current,
    /// Istio 1.22 (requests `networking.istio.io/v1alpha3/ServiceEntry`).
    V1_22,
}

/// Istio's own MCP-over-xDS client (`pkg/adsc` + istiod's in-memory config store) watching a
/// server, as JSON events.
pub struct Adsc {
    child: Child,
    events: mpsc::Receiver<serde_json::Value>,
    /// Every event seen so far.
    pub seen: Vec<serde_json::Value>,
}

/// A test peer's binary `name` in the directory `$env` names (default `target/<default_dir>`),
/// which the command `build` makes; panics with that hint when it is missing.
pub fn peer_binary(env: &str, default_dir: &str, name: &str, build: &str) -> PathBuf {
    let dir = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        target_dir()
            .parent()
            .map(|t| t.join(default_dir))
            .unwrap_or_default()
    });
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} missing: build it with {build} (the README's test command does)",
        bin.display()
    );
    bin
}
/// Directory of the adsc-watch binaries.
pub fn adsc_dir() -> PathBuf {
    std::env::var_os("ADSC_WATCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            target_dir()
                .parent()
                .map(|t| t.join("adsc"))
                .unwrap_or_default()
        })
}

impl Adsc {
    /// Starts `adsc-watch` against `addr`.
    pub fn start(version: IstioVersion, addr: SocketAddr) -> Adsc {
        let name = match version {
            IstioVersion::Current => "adsc-watch-current",
            IstioVersion::V1_22 => "adsc-watch-1.22",
        };
        let bin = adsc_dir().join(name);
        assert!(
            bin.exists(),
            "{} missing: build it with tests/istio-adsc/build.sh {} (the README's test command does)",
            bin.display(),
            adsc_dir().display()
        );
        let mut child = Command::new(bin)
            .args(["--addr", &addr.to_string(), "--timeout", "300s"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn adsc-watch");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        Adsc {
            child,
            events: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for an event satisfying `pred`; panics with everything seen on timeout.
    pub fn wait(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(ev) => {
                    self.seen.push(ev.clone());
                    if pred(&ev) {
                        return ev;
                    }
                }
                Err(_) => panic!(
                    "timed out after {timeout:?} waiting for {what}; adsc events:\n{}",
                    self.seen
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            }
        }
    }

    /// Waits for a `serviceentries` event satisfying `pred` on its items.
    pub fn wait_items(
        &mut self,
        what: &str,
        pred: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let ev = self.wait(Duration::from_secs(30), what, |ev| {
            ev["event"] == "serviceentries"
                && ev["items"].as_array().is_some_and(|items| pred(items))
        });
        ev["items"].as_array().cloned().unwrap_or_default()
    }

    /// `error` events seen so far.
    pub fn errors(&self) -> Vec<&serde_json::Value> {
        self.seen.iter().filter(|e| e["event"] == "error").collect()
    }
}

impl Drop for Adsc {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Finds an item by `namespace/name`.
pub fn item<'a>(items: &'a [serde_json::Value], ns_name: &str) -> Option<&'a serde_json::Value> {
    items.iter().find(|i| {
        format!(
            "{}/{}",
            i["namespace"].as_str().unwrap_or(""),
            i["name"].as_str().unwrap_or("")
        ) == ns_name
    })
}

/// The endpoint addresses of a ServiceEntry item (as adsc or mcpctl print it), sorted.
pub fn endpoint_addresses(item: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = item["spec"]["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["address"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `mcpctl get serviceentries -o json` against `server` (`xds://...`): the items.
pub fn mcpctl_get(server: &str) -> Vec<serde_json::Value> {
    let out = Command::new(workspace_bin("mcpctl"))
        .args([
            "get",
            "serviceentries",
            "--server",
            server,
            "-o",
            "json",
            "--timeout",
            "5s",
        ])
        .output()
        .expect("run mcpctl");
    assert!(
        out.status.success(),
        "mcpctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("mcpctl JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// What `xds` serves (through mcpctl, as a sink sees it) once `pred` holds, within `timeout`.
pub fn wait_served(
    timeout: Duration,
    what: &str,
    xds: &str,
    pred: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    wait_for(timeout, what, || {
        let items = mcpctl_get(xds);
        pred(&items).then_some(items)
    })
}

/// The sorted endpoint addresses of the mcpctl item named `name`, if it is served.
pub fn addresses_of(items: &[serde_json::Value], name: &str) -> Option<Vec<String>> {
    find(items, name).map(endpoint_addresses)
}

/// `namespace/name` of mcpctl items.
pub fn item_names(items: &[serde_json::Value]) -> Vec<String> {
    items
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap_or(""),
                i["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The mcpctl item named `name` (short name).
pub fn find<'a>(items: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    items.iter().find(|i| i["metadata"]["name"] == name)
}

/// The last `lines` lines of `s`.
pub fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
