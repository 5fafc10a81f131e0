//! Harness for the end-to-end tests: starts the adapters' real binaries on free loopback ports
//! and real peers (Istio's own MCP client `adsc-watch`, built by `tests/istio-adsc/build.sh`).
//!
//! Binaries are found next to the test executable (`target/<profile>/`), which `cargo test
//! --workspace` builds; the Istio peers in `$ADSC_WATCH_DIR` (default `target/adsc`).

pub mod backend;
pub mod consul;
pub mod envoy;
pub mod eureka;
pub mod forwarder;
pub mod istiod;
pub mod kube;
pub mod load;
pub mod mesh;
pub mod netns;
pub mod pki;
pub mod process;
pub mod registries;
pub mod zookeeper;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use process::Process;

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

/// A free loopback port for a peer to listen on, from below the kernel's ephemeral range.
///
/// Not `bind(0)`: that hands out a port from the ephemeral range, which every outgoing
/// connection draws from too, so a peer that takes seconds to bind (a JVM) could find its port
/// taken by some client's connection meanwhile (seen: Eureka "Port ... was already in use" while
/// other peers started beside it). Ports here come from a range no connection uses, each handed
/// out once per process (a counter), and only if nothing listens on it now.
pub fn free_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // The ephemeral range (`32768 60999` by default); ours is the 11,000 ports below it, above
    // the service ports that tests give their sidecars (18080, 20880, 15001, ...).
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (base, size) = if low > 32000 {
        (low - 11000, 11000)
    } else {
        (61000, 4500)
    };
    // Each process starts elsewhere in the range, so test binaries run one after another do not
    // retry the ports their predecessors' leftovers may hold.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % size,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..size {
        let port = base + NEXT.fetch_add(1, Ordering::SeqCst) % size;
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free port in 127.0.0.1:{base}-{}", base + size - 1);
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

/// HTTP/1.1 GET with `Connection: close` (for servers that refuse HTTP/1.0, like Envoy's admin
/// port): (status, body), a chunked body decoded.
pub fn http11_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut body = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, String::from_utf8_lossy(body).into_owned()));
    }
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| std::io::Error::other("bad chunk"))?;
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&body[..line_end])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .map_err(std::io::Error::other)?;
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        let chunk = body
            .get(start..start + size)
            .ok_or_else(|| std::io::Error::other("short chunk"))?;
        out.extend_from_slice(chunk);
        body = body.get(start + size + 2..).unwrap_or_default();
    }
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

pub use mcp_core::testing::metric_sum;

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
    process: Process,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    binary: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
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
        let a = Adapter {
            process: Process::new(binary, dir.path(), Duration::from_millis(50)),
            grpc: free_addr(),
            admin: free_addr(),
            binary: binary.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            _dir: dir,
        };
        a.spawn();
        a
    }

    fn spawn(&self) {
        let mut cmd = Command::new(workspace_bin(&self.binary));
        cmd.args(&self.args)
            .arg("--listen")
            .arg(self.grpc.to_string())
            .arg("--admin-listen")
            .arg(self.admin.to_string())
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        self.process.spawn_with_stdout(&mut cmd, Stdio::null());
        self.process.wait_until(
            Duration::from_secs(20),
            "its admin port open (/healthz 200)",
            || self.admin_status("/healthz") == Some(200),
        );
    }

    /// Kills the process (SIGKILL: no goodbye to its sinks, as when a node dies).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again with the same arguments and ports (killing it first if it runs), and
    /// waits until the admin port answers.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// `xds://` and the gRPC address: what sinks (mcpctl, istiod) connect to.
    pub fn xds_url(&self) -> String {
        format!("xds://{}", self.grpc)
    }

    /// Waits until /readyz is 200.
    pub fn wait_ready(&self) {
        self.wait_admin(
            Duration::from_secs(20),
            "adapter /readyz",
            "/readyz",
            |s, _| s == 200,
        );
    }

    /// The status of a GET on the admin port, `None` when it cannot be reached.
    fn admin_status(&self, path: &str) -> Option<u16> {
        http_get(self.admin, path).ok().map(|(s, _)| s)
    }

    /// Polls `path` on the admin port until `pred(status, body)` holds, within `timeout`; the
    /// body.
    pub fn wait_admin(
        &self,
        timeout: Duration,
        what: &str,
        path: &str,
        pred: impl Fn(u16, &str) -> bool,
    ) -> String {
        wait_for(timeout, what, || {
            http_get(self.admin, path)
                .ok()
                .filter(|(s, b)| pred(*s, b))
                .map(|(_, b)| b)
        })
    }

    /// Polls /registryz until it answers `status`, within `timeout`; the body.
    pub fn wait_registryz(&self, timeout: Duration, what: &str, status: u16) -> String {
        self.wait_admin(timeout, what, "/registryz", |s, _| s == status)
    }

    /// Polls /debug/resources until its `problems` (as JSON text) satisfy `pred`, within
    /// `timeout`; that text.
    pub fn wait_problems(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        wait_for(timeout, what, || {
            let problems = self.debug()["problems"].to_string();
            pred(&problems).then_some(problems)
        })
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
        self.process.terminate(timeout)
    }

    /// What the adapter logged so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The last 30 lines of the log, for assertion messages.
    pub fn log_tail(&self) -> String {
        self.process.log_tail(30)
    }

    /// Sum of a metric's samples on /metrics (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        metric_sum(&self.get("/metrics").1, name)
    }

    /// Asserts that the adapter counted no registry error; `context` says when.
    pub fn assert_no_registry_errors(&self, context: &str) {
        assert_eq!(
            self.metric("mcp_adapter_registry_errors_total"),
            0.0,
            "registry errors {context}; log:\n{}",
            self.log_tail()
        );
    }

    /// Steady state with nothing changing in the registry, observed for `window`: no registry
    /// errors, ready, and not one new snapshot (nothing is re-listed or re-pushed).
    pub fn assert_steady(&self, window: Duration) {
        self.assert_steady_polling(window, Duration::from_millis(250), &[]);
    }

    /// [`Adapter::assert_steady`], looking every `every`, with `also` (admin paths) answering
    /// 200 too.
    pub fn assert_steady_polling(&self, window: Duration, every: Duration, also: &[&str]) {
        let snapshots = self.metric("mcp_adapter_snapshots_total");
        assert!(snapshots > 0.0, "no snapshot yet");
        let end = Instant::now() + window;
        while Instant::now() < end {
            self.assert_no_registry_errors("in steady state");
            for path in ["/readyz"].iter().chain(also) {
                let (status, body) = self.get(path);
                assert_eq!(
                    status,
                    200,
                    "{path} in steady state: {body}; log:\n{}",
                    self.log_tail()
                );
            }
            assert_eq!(
                self.metric("mcp_adapter_snapshots_total"),
                snapshots,
                "a snapshot was built while nothing changed; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(every);
        }
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
    let dir = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| beside_target_dir(default_dir));
    require_peer(dir.join(name), build)
}

/// A test peer's file: the path `$env` names, else `target/<default_path>`, which the command
/// `build` makes; panics with that hint when it is missing.
pub fn peer_file(env: &str, default_path: &str, build: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| beside_target_dir(default_path));
    require_peer(path, build)
}

/// `target/<path>` (beside `target/<profile>`).
fn beside_target_dir(path: &str) -> PathBuf {
    target_dir()
        .parent()
        .map(|t| t.join(path))
        .unwrap_or_default()
}

fn require_peer(path: PathBuf, build: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{} missing: build it with {build} (the README's test command does)",
        path.display()
    );
    path
}

impl Adsc {
    /// Starts `adsc-watch` against `addr`.
    pub fn start(version: IstioVersion, addr: SocketAddr) -> Adsc {
        let name = match version {
            IstioVersion::Current => "adsc-watch-current",
            IstioVersion::V1_22 => "adsc-watch-1.22",
        };
        let bin = peer_binary(
            "ADSC_WATCH_DIR",
            "adsc",
            name,
            "tests/istio-adsc/build.sh target/adsc",
        );
        let mut child = process::spawn_piped(
            Command::new(bin).args(["--addr", &addr.to_string(), "--timeout", "300s"]),
            Stdio::null(),
        );
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

    /// Waits until `adapter` is ready, starts `adsc-watch` against it and waits until it has
    /// synced (the `synced` event is the last of [`Adsc::seen`]).
    pub fn start_synced(version: IstioVersion, adapter: &Adapter) -> Adsc {
        adapter.wait_ready();
        let mut adsc = Adsc::start(version, adapter.grpc);
        adsc.wait(Duration::from_secs(60), "adsc synced", |e| {
            e["event"] == "synced"
        });
        adsc
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

    /// Waits until `main` (`namespace/name`) has `endpoints` endpoints and each of `others` is
    /// stored too; asserts that nothing else is. The items.
    pub fn wait_exactly(
        &mut self,
        main: &str,
        endpoints: usize,
        others: &[&str],
    ) -> Vec<serde_json::Value> {
        let what = format!("{main} with {endpoints} endpoints, and {others:?}");
        let items = self.wait_items(&what, |items| {
            item(items, main).is_some_and(|m| endpoint_addresses(m).len() == endpoints)
                && others.iter().all(|o| item(items, o).is_some())
        });
        assert_eq!(items.len(), 1 + others.len(), "{items:?}");
        items
    }

    /// `error` events seen so far.
    pub fn errors(&self) -> Vec<&serde_json::Value> {
        self.seen.iter().filter(|e| e["event"] == "error").collect()
    }

    /// Asserts that Istio's client reported no error so far.
    pub fn assert_no_errors(&self) {
        assert!(
            self.errors().is_empty(),
            "adsc reported errors: {:?}",
            self.errors()
        );
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

/// The resourceVersion of item `ns_name` (as adsc prints it); panics when it is missing.
pub fn version_of(items: &[serde_json::Value], ns_name: &str) -> serde_json::Value {
    item(items, ns_name).unwrap_or_else(|| panic!("{ns_name} missing: {items:?}"))
        ["resourceVersion"]
        .clone()
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

/// Runs `cmd` to its end; panics, with `what` and its stderr, unless it succeeds. Its output.
pub fn run_ok(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `mcpctl get serviceentries -o json` against `server` (`xds://...`): the items.
pub fn mcpctl_get(server: &str) -> Vec<serde_json::Value> {
    let out = run_ok(
        Command::new(workspace_bin("mcpctl")).args([
            "get",
            "serviceentries",
            "--server",
            server,
            "-o",
            "json",
            "--timeout",
            "5s",
        ]),
        "mcpctl",
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

/// `namespace/name` of an object with Kubernetes metadata (an mcpctl item, an istiod config).
pub fn ns_name(object: &serde_json::Value) -> String {
    format!(
        "{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// `namespace/name` of mcpctl items.
pub fn item_names(items: &[serde_json::Value]) -> Vec<String> {
    items.iter().map(ns_name).collect()
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

/// `(number, name, protocol)` of each port of a ServiceEntry item (as adsc or mcpctl print it).
pub fn ports(item: &serde_json::Value) -> Vec<(u64, String, String)> {
    item["spec"]["ports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["number"].as_u64().unwrap_or(0),
                        p["name"].as_str().unwrap_or("").to_string(),
                        p["protocol"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `(number, protocol)` of each port of a ServiceEntry item.
pub fn port_protocols(item: &serde_json::Value) -> Vec<(u64, String)> {
    ports(item).into_iter().map(|(n, _, p)| (n, p)).collect()
}

/// Two tests, `$current` and `$v1_22`, each running `$scenario` with that build of Istio's
/// client ([`IstioVersion`]), both ignored for `$why` (the peers they need):
///
/// ```text
/// test_each_istio_version! {
///     "needs ...",
///     istio_current_reads_x, istio_1_22_reads_x => scenario
/// }
/// ```
#[macro_export]
macro_rules! test_each_istio_version {
    ($why:literal, $current:ident, $v1_22:ident => $scenario:ident) => {
        #[test]
        #[ignore = $why]
        fn $current() {
            $scenario($crate::IstioVersion::Current);
        }

        #[test]
        #[ignore = $why]
        fn $v1_22() {
            $scenario($crate::IstioVersion::V1_22);
        }
    };
}
