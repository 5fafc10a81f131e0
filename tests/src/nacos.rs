//! A Nacos server on free loopback ports for the end-to-end tests, and the two ways services
//! register with one.
//!
//! The server is rnacos 0.8.8 (`$NACOS_BIN`, default `target/nacos/rnacos`, installed by
//! `tests/nacos/build.sh`): a Nacos server re-implemented in Rust that speaks Nacos' 1.x HTTP
//! Open API and 2.x gRPC protocol. The real Nacos server cannot be had here (Maven Central serves
//! only its client side). [`Nacos`] drives the 1.x HTTP Open API (persistent instances, as
//! operators and 1.x clients write them); [`Registrar`] drives the official Java client
//! (`com.alibaba.nacos:nacos-client` 2.4.3, `$NACOS_REGISTRAR_JAR`, default
//! `target/nacos/nacos-registrar.jar`), which registers ephemeral instances over gRPC the way a
//! Spring Cloud Alibaba or Dubbo service does: they live as long as its connection.
//!
//! Where rnacos differs from Nacos (seen in its source and in `tests/tests/nacos_server.rs`):
//! - `GET /nacos/v1/ns/instance/list` answers only healthy instances unless `healthyOnly=false`
//!   (Nacos: all); [`Nacos::list`] asks for all.
//! - `healthy=false` on register or update is ignored; `enabled=false` hides an instance from
//!   `instance/list` altogether.
//! - An update that sets the weight to 1.0 leaves the weight as it was (rnacos takes 1.0 for "no
//!   weight given"); an update with empty metadata keeps the old metadata.
//! - Persistent instances are TCP-probed every 60 s and marked unhealthy when nothing listens on
//!   their port. The harness turns the probe off
//!   (`RNACOS_NAMING_PERPETUAL_INSTANCE_PROBE_INTERVAL_SECOND=0`), so tests can register
//!   instances at addresses where nothing runs; [`Nacos::start_with`] can turn it back on.
//! - It stops on SIGINT; SIGTERM starts a graceful shutdown that takes many seconds.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::{free_addr, http, peer_file, tail, wait_for, Process};

/// The server binary.
pub fn rnacos_bin() -> PathBuf {
    peer_file(
        "NACOS_BIN",
        "nacos/rnacos",
        "tests/nacos/build.sh target/nacos",
    )
}

/// The Java registrar (the official client driven over stdin).
pub fn registrar_jar() -> PathBuf {
    peer_file(
        "NACOS_REGISTRAR_JAR",
        "nacos/nacos-registrar.jar",
        "tests/nacos/build.sh target/nacos",
    )
}

/// How long a start may take: a debug build on two busy cores, its Raft store opening first.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long rnacos may take to exit after SIGINT.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Nacos 2.x clients connect to gRPC at the HTTP port plus this (they are given only the HTTP
/// address), so the server must listen there.
const GRPC_OFFSET: u16 = 1000;

/// The default group of Nacos services.
pub const DEFAULT_GROUP: &str = "DEFAULT_GROUP";

/// A running rnacos, stopped on drop (SIGINT, then SIGKILL if it lingers).
pub struct Nacos {
    process: Process,
    http: SocketAddr,
    /// Holds the data directory (`data/`), the log and the empty env file, across restarts.
    dir: tempfile::TempDir,
    /// Extra `RNACOS_*` settings, kept for restarts.
    env: Vec<(String, String)>,
    /// User and password when the Open API requires a login.
    auth: Option<(String, String)>,
    /// The access token of the current run, sent with every request of the harness.
    token: Option<String>,
}

/// One instance to register over the HTTP Open API.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Service name (without the group).
    pub service: String,
    /// Group; [`DEFAULT_GROUP`] unless set.
    pub group: String,
    /// Namespace id; empty is the `public` namespace.
    pub namespace: String,
    /// IP (sent as given).
    pub ip: String,
    /// Port.
    pub port: u16,
    /// Weight; 1.0 unless set.
    pub weight: f64,
    /// Metadata, sent as a JSON object.
    pub metadata: Vec<(String, String)>,
    /// Ephemeral instances need heartbeats (rnacos drops one without them after ~35 s); false
    /// by default, so tests need none: a persistent instance stays until it is deregistered.
    pub ephemeral: bool,
    /// Enabled; rnacos hides a disabled instance from `instance/list`.
    pub enabled: bool,
    /// Cluster; `DEFAULT` unless set.
    pub cluster: String,
}

impl Instance {
    /// A persistent, enabled instance of `service` on `ip:port` in the public namespace, group
    /// [`DEFAULT_GROUP`], cluster `DEFAULT`, weight 1, no metadata.
    pub fn new(service: &str, ip: &str, port: u16) -> Self {
        Self {
            service: service.to_string(),
            group: DEFAULT_GROUP.to_string(),
            namespace: String::new(),
            ip: ip.to_string(),
            port,
            weight: 1.0,
            metadata: Vec::new(),
            ephemeral: false,
            enabled: true,
            cluster: "DEFAULT".to_string(),
        }
    }

    /// The same in group `group`.
    pub fn group(mut self, group: &str) -> Self {
        self.group = group.to_string();
        self
    }

    /// The same in namespace `namespace` (an id).
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.to_string();
        self
    }

    /// The same with weight `weight`.
    pub fn weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }

    /// The same with metadata `key: value` too.
    pub fn with_metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }

    /// The same, ephemeral or persistent.
    pub fn ephemeral(mut self, ephemeral: bool) -> Self {
        self.ephemeral = ephemeral;
        self
    }

    /// The same, enabled or not.
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// The same in cluster `cluster`.
    pub fn cluster(mut self, cluster: &str) -> Self {
        self.cluster = cluster.to_string();
        self
    }

    /// The metadata as the JSON object the Open API takes.
    pub fn metadata_json(&self) -> String {
        serde_json::Value::Object(
            self.metadata
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        )
        .to_string()
    }

    /// The Open API parameters that name the instance.
    fn key_params(&self) -> Vec<(&'static str, String)> {
        let mut p = vec![
            ("serviceName", self.service.clone()),
            ("groupName", self.group.clone()),
            ("ip", self.ip.clone()),
            ("port", self.port.to_string()),
            ("clusterName", self.cluster.clone()),
            ("ephemeral", self.ephemeral.to_string()),
        ];
        if !self.namespace.is_empty() {
            p.push(("namespaceId", self.namespace.clone()));
        }
        p
    }

    /// Every Open API parameter of the instance.
    fn params(&self) -> Vec<(&'static str, String)> {
        let mut p = self.key_params();
        p.extend([
            ("weight", self.weight.to_string()),
            ("enabled", self.enabled.to_string()),
            ("healthy", "true".to_string()),
            ("metadata", self.metadata_json()),
        ]);
        p
    }
}

/// `k=v&k=v`, each percent-encoded (unreserved characters left as they are).
pub fn query(params: &[(&str, String)]) -> String {
    fn enc(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }
    params
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

impl Nacos {
    /// rnacos on free loopback ports (HTTP `P`, gRPC `P + 1000`, no console), its data in a
    /// temporary directory, its Open API open to all; returns once it answers.
    pub fn start() -> Nacos {
        Self::launch(Vec::new(), None)
    }

    /// [`Nacos::start`] with extra `RNACOS_*` settings (`("RNACOS_NAMING_INSTANCE_TIMEOUT_SECOND",
    /// "20")`), kept for restarts; they override the harness's own.
    pub fn start_with(env: &[(&str, &str)]) -> Nacos {
        Self::launch(
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            None,
        )
    }

    /// A server whose Open API (everything under `/nacos/`) and gRPC API (rnacos checks the
    /// token of gRPC requests too) require a login as `user`/`password` (the initial admin
    /// user). The harness logs in (`POST /nacos/v1/auth/login`) after each start and sends the
    /// token with its requests; a [`Registrar`] logs in with the same credentials.
    pub fn start_with_auth(user: &str, password: &str) -> Nacos {
        Self::start_with_auth_env(user, password, &[])
    }

    /// [`Nacos::start_with_auth`] with extra `RNACOS_*` settings (`RNACOS_API_LOGIN_TIMEOUT`:
    /// the tokens' lifetime in seconds).
    pub fn start_with_auth_env(user: &str, password: &str, env: &[(&str, &str)]) -> Nacos {
        let mut all: Vec<(String, String)> = vec![
            ("RNACOS_ENABLE_OPEN_API_AUTH".into(), "true".into()),
            ("RNACOS_INIT_ADMIN_USERNAME".into(), user.into()),
            ("RNACOS_INIT_ADMIN_PASSWORD".into(), password.into()),
        ];
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Self::launch(all, Some((user.to_string(), password.to_string())))
    }

    fn launch(env: Vec<(String, String)>, auth: Option<(String, String)>) -> Nacos {
        let dir = tempfile::tempdir().expect("tempdir");
        // An empty env file: without `--env-file` rnacos reads `.env` from its working
        // directory or any directory above it.
        std::fs::write(dir.path().join("empty.env"), "").expect("write empty.env");
        let mut n = Nacos {
            process: Process::new("rnacos", dir.path(), Duration::from_millis(100)),
            http: free_http_addr(),
            dir,
            env,
            auth,
            token: None,
        };
        n.spawn(true);
        n
    }

    /// Starts rnacos and waits until it answers; `fresh`: its data directory holds nothing
    /// worth keeping (the first start).
    ///
    /// rnacos 0.8.8 has a start-up race: on a first start its Raft initialisation may apply an
    /// entry before the actor that applies entries is wired, which panics that actor (its log:
    /// `panicked at .../raftapply.rs`); the server then answers, but every write through Raft
    /// (persistent instances, namespaces) fails with "Mailbox has closed". Seen in 1 of 6
    /// starts. The panic comes before the HTTP port is bound, so a run whose log has one by the
    /// time the server answers is stopped and started again.
    fn spawn(&mut self, fresh: bool) {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            let logged = self.process.log().len();
            self.spawn_once();
            let run = self.process.log().get(logged..).unwrap_or("").to_string();
            if !run.contains("panicked at") {
                break;
            }
            assert!(
                attempt < ATTEMPTS,
                "rnacos panicked at start {ATTEMPTS} times; its log:\n{}",
                tail(&run, 60)
            );
            eprintln!("rnacos panicked while starting (attempt {attempt}); starting it again");
            self.process.kill();
            if fresh {
                let _ = std::fs::remove_dir_all(self.data_dir());
            }
        }
        self.token = None;
        if let Some((user, password)) = self.auth.clone() {
            // The initial admin user is written through Raft too; retry until it is there.
            let token = wait_for(Duration::from_secs(30), "a login to rnacos", || {
                self.login(&user, &password)
            });
            self.token = Some(token);
        }
    }

    /// One start: spawns rnacos and waits until it answers.
    fn spawn_once(&mut self) {
        let mut cmd = Command::new(rnacos_bin());
        cmd.arg("--env-file")
            .arg(self.dir.path().join("empty.env"))
            .current_dir(self.dir.path());
        // The caller's own RNACOS_* settings must not leak in.
        for (k, _) in std::env::vars() {
            if k.starts_with("RNACOS_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("RNACOS_SDK_HOST", "127.0.0.1")
            .env("RNACOS_HTTP_PORT", self.http.port().to_string())
            .env("RNACOS_GRPC_PORT", self.grpc_port().to_string())
            // 0: no console server (its default port is HTTP + 2000).
            .env("RNACOS_HTTP_CONSOLE_PORT", "0")
            .env("RNACOS_DATA_DIR", self.dir.path().join("data"))
            .env(
                "RNACOS_NAMING_PERPETUAL_INSTANCE_PROBE_INTERVAL_SECOND",
                "0",
            )
            .env("RUST_LOG", "info");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.process.spawn(&mut cmd);
        let grpc = SocketAddr::from(([127, 0, 0, 1], self.grpc_port()));
        // /health (outside /nacos/, so open even with auth on) is 200 once rnacos' own checks,
        // its Raft store's among them, pass.
        self.process.wait_until(
            START_TIMEOUT,
            "200 from GET /health and the gRPC port listening",
            || {
                http(self.http, "GET", "/health", &[], "").is_ok_and(|(s, _)| s == 200)
                    && TcpStream::connect_timeout(&grpc, Duration::from_secs(1)).is_ok()
            },
        );
    }

    /// `POST /nacos/v1/auth/login`: the access token, or None when refused. With auth off
    /// rnacos answers a placeholder token for any user.
    pub fn login(&self, user: &str, password: &str) -> Option<String> {
        let body = query(&[("username", user.into()), ("password", password.into())]);
        let (status, resp) = http(
            self.http,
            "POST",
            "/nacos/v1/auth/login",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            &body,
        )
        .ok()?;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&resp).ok()?;
        v["accessToken"].as_str().map(str::to_string)
    }

    /// The HTTP (Open API) address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// The gRPC port (HTTP + 1000, where Nacos 2.x clients expect it).
    pub fn grpc_port(&self) -> u16 {
        self.http.port() + GRPC_OFFSET
    }

    /// `127.0.0.1:P`, what Nacos clients are given (`serverAddr`).
    pub fn server_addr(&self) -> String {
        self.http.to_string()
    }

    /// User and password when the server requires a login.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.auth.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// The access token of the current run, when the server requires a login.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The data directory (rnacos' Raft log and snapshots, kept across restarts).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's log (every run).
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Stops the server with SIGINT and waits for it to exit; panics, with its log, if it has
    /// not within 20 s.
    pub fn stop(&mut self) {
        assert!(
            self.interrupt(STOP_TIMEOUT),
            "rnacos did not exit within {STOP_TIMEOUT:?} of SIGINT; its log:\n{}",
            self.process.log_tail(50)
        );
    }

    /// SIGINT, then waits up to `timeout` for the exit; whether it exited (it is reaped then).
    fn interrupt(&self, timeout: Duration) -> bool {
        let Some(pid) = self.process.pid() else {
            return true;
        };
        let _ = Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status();
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if exited(pid) {
                // Reaps it (a SIGKILL to a process that has exited does nothing).
                self.process.kill();
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Stops the server and starts it again on the same ports with the same data directory.
    ///
    /// What survives (rnacos 0.8.8, checked by `tests/tests/nacos_server.rs`): persistent
    /// instances, with their weight and metadata, and namespaces: rnacos writes both through
    /// its Raft log into the data directory. Ephemeral instances do not: they live in memory
    /// only, as in Nacos; a 2.x client puts its own back once it has reconnected. Access
    /// tokens of the last run are not relied on: the harness logs in again.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn(false);
    }

    /// One Open API request, with the access token when there is one: (status, body).
    pub fn call(&self, method: &str, path: &str, params: &[(&str, String)]) -> (u16, String) {
        let path = if params.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{}", query(params))
        };
        let mut headers = Vec::new();
        if let Some(t) = &self.token {
            headers.push(("accessToken", t.as_str()));
        }
        let answer = http(self.http, method, &path, &headers, "")
            .unwrap_or_else(|e| panic!("rnacos {method} {path}: {e}"));
        // The token of the start ran out (tests with short-lived tokens): log in again, once.
        match (&self.auth, answer.0) {
            (Some((user, password)), 403) => {
                let fresh = self.login(user, password).unwrap_or_default();
                http(
                    self.http,
                    method,
                    &path,
                    &[("accessToken", fresh.as_str())],
                    "",
                )
                .unwrap_or_else(|e| panic!("rnacos {method} {path}: {e}"))
            }
            _ => answer,
        }
    }

    /// An Open API request that must answer 200 `ok`.
    fn expect_ok(&self, method: &str, path: &str, params: &[(&str, String)]) {
        let (status, body) = self.call(method, path, params);
        assert!(
            status == 200 && body.trim() == "ok",
            "rnacos {method} {path} {params:?}: HTTP {status} {body}"
        );
    }

    /// `POST /nacos/v1/ns/instance`.
    pub fn register(&self, inst: &Instance) {
        self.expect_ok("POST", "/nacos/v1/ns/instance", &inst.params());
    }

    /// `PUT /nacos/v1/ns/instance`: the instance's weight, enabled and metadata as `inst` has
    /// them (rnacos: except a weight of 1.0 and empty metadata, which leave the old ones).
    pub fn update(&self, inst: &Instance) {
        self.expect_ok("PUT", "/nacos/v1/ns/instance", &inst.params());
    }

    /// `DELETE /nacos/v1/ns/instance`.
    pub fn deregister(&self, inst: &Instance) {
        self.expect_ok("DELETE", "/nacos/v1/ns/instance", &inst.key_params());
    }

    /// `GET /nacos/v1/ns/instance/list` of `service` in `group` and `namespace` (empty:
    /// public), healthy or not: `{"name": "GROUP@@service", "hosts": [...], ...}`.
    pub fn list(&self, service: &str, group: &str, namespace: &str) -> serde_json::Value {
        let mut params = vec![
            ("serviceName", service.to_string()),
            ("groupName", group.to_string()),
            ("healthyOnly", "false".to_string()),
        ];
        if !namespace.is_empty() {
            params.push(("namespaceId", namespace.to_string()));
        }
        let (status, body) = self.call("GET", "/nacos/v1/ns/instance/list", &params);
        assert_eq!(status, 200, "rnacos instance/list {params:?}: {body}");
        serde_json::from_str(&body).expect("instance/list JSON")
    }

    /// The `hosts` of [`Nacos::list`], sorted by `ip:port`.
    pub fn hosts(&self, service: &str, group: &str, namespace: &str) -> Vec<serde_json::Value> {
        let mut hosts = self.list(service, group, namespace)["hosts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        hosts.sort_by_key(|h| format!("{}:{}", h["ip"], h["port"]));
        hosts
    }

    /// `GET /nacos/v1/ns/service/list`: the service names of `group` in `namespace` (empty:
    /// public), sorted.
    pub fn services(&self, group: &str, namespace: &str) -> Vec<String> {
        let mut params = vec![
            ("pageNo", "1".to_string()),
            ("pageSize", "10000".to_string()),
            ("groupName", group.to_string()),
        ];
        if !namespace.is_empty() {
            params.push(("namespaceId", namespace.to_string()));
        }
        let (status, body) = self.call("GET", "/nacos/v1/ns/service/list", &params);
        assert_eq!(status, 200, "rnacos service/list {params:?}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("service/list JSON");
        let mut names: Vec<String> = v["doms"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// `POST /nacos/v1/console/namespaces` (`customNamespaceId`, `namespaceName`), as Nacos'
    /// console and its operators create one.
    pub fn create_namespace(&self, id: &str, name: &str) {
        let params = [
            ("customNamespaceId", id.to_string()),
            ("namespaceName", name.to_string()),
        ];
        let (status, body) = self.call("POST", "/nacos/v1/console/namespaces", &params);
        assert!(
            status == 200 && body.trim() == "true",
            "rnacos create namespace {id}: HTTP {status} {body}"
        );
    }

    /// `GET /nacos/v1/console/namespaces`: `(id, name)` of each namespace, in the server's
    /// order (`("", "public")` first).
    pub fn namespaces(&self) -> Vec<(String, String)> {
        let (status, body) = self.call("GET", "/nacos/v1/console/namespaces", &[]);
        assert_eq!(status, 200, "rnacos namespaces: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("namespaces JSON");
        v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| {
                        (
                            n["namespace"].as_str().unwrap_or("").to_string(),
                            n["namespaceShowName"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Nacos {
    fn drop(&mut self) {
        // SIGINT first (a clean exit); the Process's own drop kills it if it lingers.
        self.interrupt(Duration::from_secs(5));
    }
}

/// Whether process `pid` (our child) has exited: gone, or a zombie waiting to be reaped.
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S ...`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// A free loopback address `P` whose `P + 1000` is free too (rnacos' gRPC port), both below
/// the kernel's ephemeral range (see [`free_addr`]).
fn free_http_addr() -> SocketAddr {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    for _ in 0..1000 {
        let http = free_addr();
        let grpc = u32::from(http.port()) + u32::from(GRPC_OFFSET);
        if grpc < ephemeral_low
            && TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], grpc as u16))).is_ok()
        {
            return http;
        }
    }
    panic!("no free loopback ports P and P+{GRPC_OFFSET}");
}

/// How long the registrar's JVM may take to start and connect on two busy cores.
const REGISTRAR_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long one registrar command may take (a gRPC request and its answer).
const REGISTRAR_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The official Java client (`nacos-client` 2.4.3) in a process of its own, registering and
/// deregistering ephemeral instances over gRPC on command; killed on drop (its instances then
/// vanish as its connection closes, as when a service crashes).
///
/// Register one instance per service with each registrar, as a Spring Cloud Alibaba service
/// does: Nacos 2.x keeps one instance per service and connection (a second `register` of the
/// same service replaces the first there; rnacos lists both), and the client re-registers only
/// the last after a reconnect. Start a second registrar for a second instance.
pub struct Registrar {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    dir: tempfile::TempDir,
}

impl Registrar {
    /// Starts the client against `nacos` (its credentials when it requires a login) in
    /// `namespace` (None: public) and waits until it is connected.
    pub fn start(nacos: &Nacos, namespace: Option<&str>) -> Registrar {
        let dir = tempfile::tempdir().expect("tempdir");
        let stderr = std::fs::File::create(dir.path().join("registrar.log")).expect("log file");
        let mut cmd = Command::new("java");
        // C1 only, a small heap and the serial collector: starts in half the time on two busy
        // cores. The client's cache and log directories go to the temporary directory instead
        // of ~/nacos and ~/logs.
        cmd.args(["-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"])
            .arg(format!("-DJM.SNAPSHOT.PATH={}", dir.path().display()))
            .arg(format!(
                "-DJM.LOG.PATH={}",
                dir.path().join("logs").display()
            ))
            .arg("-jar")
            .arg(registrar_jar())
            .args(["--server", &nacos.server_addr()]);
        if let Some(ns) = namespace {
            cmd.args(["--namespace", ns]);
        }
        if let Some((user, password)) = nacos.credentials() {
            cmd.args(["--username", user, "--password", password]);
        }
        let mut child = crate::process::spawn_piped(&mut cmd, Stdio::from(stderr));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut r = Registrar {
            child,
            stdin,
            lines,
            dir,
        };
        let first = r.reply(REGISTRAR_READY_TIMEOUT, "ready");
        assert_eq!(
            first,
            "ready",
            "nacos registrar did not start; its log:\n{}",
            r.log_tail()
        );
        r
    }

    /// Registers an ephemeral instance of `service` in `group` on `ip:port` (cluster
    /// `DEFAULT`) with `weight` and `metadata`; returns once the server has accepted it.
    pub fn register(
        &mut self,
        service: &str,
        group: &str,
        ip: &str,
        port: u16,
        weight: f64,
        metadata: &[(&str, &str)],
    ) {
        let mut line = format!("register {service} {group} {ip} {port} {weight}");
        if !metadata.is_empty() {
            let pairs: Vec<String> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
            line.push(' ');
            line.push_str(&pairs.join(","));
        }
        self.cmd(&line);
    }

    /// Deregisters the instance of `service` in `group` on `ip:port`.
    pub fn deregister(&mut self, service: &str, group: &str, ip: &str, port: u16) {
        self.cmd(&format!("deregister {service} {group} {ip} {port}"));
    }

    /// `shutDown()` of the client (its connection closes, so its instances go), then waits for
    /// the process to exit.
    pub fn shutdown(mut self) {
        self.cmd("quit");
        // Closing stdin as well: the registrar exits on either.
        self.stdin = None;
        let end = Instant::now() + REGISTRAR_COMMAND_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    assert!(
                        status.success(),
                        "nacos registrar exited with {status}; its log:\n{}",
                        self.log_tail()
                    );
                    return;
                }
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                other => panic!(
                    "nacos registrar did not exit after quit ({other:?}); its log:\n{}",
                    self.log_tail()
                ),
            }
        }
    }

    /// The client's log (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("registrar.log")
    }

    fn log_tail(&self) -> String {
        tail(&self.log(), 60)
    }

    /// Sends one command and waits for its `ok`; panics with the log on `error` or timeout.
    fn cmd(&mut self, line: &str) {
        assert!(!line.contains('\n'), "one line per command: {line:?}");
        let stdin = self.stdin.as_mut().expect("registrar stdin open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("write {line:?} to the nacos registrar: {e}"));
        let reply = self.reply(REGISTRAR_COMMAND_TIMEOUT, line);
        assert_eq!(
            reply,
            format!("ok {line}"),
            "nacos registrar {line:?}; its log:\n{}",
            self.log_tail()
        );
    }

    /// The next protocol line (`ready`, `ok ...`, `error ...`); other output is skipped. Panics
    /// with the log if none comes within `timeout` or the process ends.
    fn reply(&mut self, timeout: Duration, what: &str) -> String {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == "ready" || l.starts_with("ok ") || l.starts_with("error ") => {
                    return l
                }
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "nacos registrar: no answer to {what:?} within {timeout:?}; its log:\n{}",
                    self.log_tail()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait();
                    panic!(
                        "nacos registrar exited ({status:?}) before answering {what:?}; its log:\n{}",
                        self.log_tail()
                    )
                }
            }
        }
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
