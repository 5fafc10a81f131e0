//! The real Nacos server, 2.4.3 and 3.0.3, on free loopback ports for the end-to-end tests, and
//! its HTTP API as operators and 1.x clients use it. The Java clients that register over gRPC
//! are in [`crate::nacos_clients`].
//!
//! The servers are upstream's, built from the source tarballs by `tests/nacos/build-server.sh`
//! into `target/nacos/nacos-<version>`, laid out as an unpacked release; `NACOS2_HOME` /
//! `NACOS3_HOME` point the harness at a release of one's own instead (its `target/` jar and
//! `conf/application.properties` are used as they are). Each server runs standalone with its
//! embedded database in a temporary directory (`--spring.config.additional-location` over a
//! copy of the release's `application.properties`), 3.x with its console on HTTP port + 2000
//! (its `nacos.deployment.type=server`, the server alone, fails to build the console's beans in
//! standalone mode and tears down executors the naming module shares: persistent registrations
//! then fail with "rejected from ... Terminated").
//!
//! A JVM start takes 15-40 s on two busy cores, so a test file starts one server per version
//! ([`Nacos::shared`]) and each of its tests works in a namespace (or services) of its own;
//! only a test that stops, restarts or reconfigures a server starts its own.
//!
//! What the harness does to every server (and why):
//! - sets the initial admin password (`nacos`/[`ADMIN_PASSWORD`]): 3.x's admin API wants a login
//!   even with auth off, and tests use the same admin on both lines;
//! - turns the server's health checks of persistent instances off (the `check` switch), unless
//!   a test asks for them: persistent instances are then as healthy as registered, so tests can
//!   register documentation addresses (10.0.0.1) and `healthy=false` where nothing listens. A
//!   server with checks on ([`Options::health_checks`]) marks an instance whose port does not
//!   accept a TCP connection unhealthy within about 15 s, as in production.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::{free_addr_with, http, wait_for, Process};

/// The admin user's password on every harness server (user `nacos`).
pub const ADMIN_PASSWORD: &str = "nacos-Adm1n-pw";
/// The admin user (Nacos' initial admin is always `nacos`).
pub const ADMIN_USER: &str = "nacos";

/// The default group of Nacos services.
pub const DEFAULT_GROUP: &str = "DEFAULT_GROUP";

/// How long a start may take: a JVM on two busy cores.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// How long a stop may take (SIGTERM: Nacos' shutdown hooks).
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Nacos 2.x clients connect to gRPC at the HTTP port plus this.
pub const GRPC_OFFSET: u16 = 1000;

/// Where a 3.x server's console listens: the HTTP port plus this (2.x serves its console on the
/// HTTP port).
const CONSOLE_OFFSET: u16 = 2000;

/// A Nacos line the tests run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    /// 2.4.3, the most deployed 2.x line.
    V2,
    /// 3.0.3, the current line.
    V3,
}

impl Version {
    /// Both, in order.
    pub const ALL: [Version; 2] = [Version::V2, Version::V3];

    /// `2.4.3` / `3.0.3`.
    pub fn number(self) -> &'static str {
        match self {
            Version::V2 => "2.4.3",
            Version::V3 => "3.0.3",
        }
    }

    /// The release directory: `$NACOS2_HOME` / `$NACOS3_HOME`, else what
    /// `tests/nacos/build-server.sh` built into `target/nacos/nacos-<version>`.
    pub fn home(self) -> PathBuf {
        let env = match self {
            Version::V2 => "NACOS2_HOME",
            Version::V3 => "NACOS3_HOME",
        };
        let home = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
            crate::target_dir()
                .parent()
                .map(|t| t.join(format!("nacos/nacos-{}", self.number())))
                .unwrap_or_default()
        });
        assert!(
            home.join("target/nacos-server.jar").exists(),
            "no Nacos {} at {} (target/nacos-server.jar): build it with tests/nacos/build-server.sh target/nacos {} (the README's test command does), or point {env} at an unpacked release",
            self.number(),
            home.display(),
            self.number()
        );
        home
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nacos {}", self.number())
    }
}

/// How a server is configured.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `nacos.core.auth.enabled=true`: every request needs a token.
    pub auth: bool,
    /// Tokens' lifetime in seconds (`nacos.core.auth.plugin.nacos.token.expire.seconds`).
    pub token_ttl: Option<u64>,
    /// Keep the server's health checks of persistent instances on.
    pub health_checks: bool,
}

/// A running Nacos server, stopped on drop.
pub struct Nacos {
    version: Version,
    options: Options,
    process: Process,
    /// Kills the server when the test process ends, whoever holds it (see [`Nacos::shared`]).
    lifeline: Mutex<Option<Child>>,
    http: SocketAddr,
    dir: tempfile::TempDir,
    /// The admin's access token.
    token: Mutex<Option<String>>,
    /// The admin's password now ([`ADMIN_PASSWORD`] unless a test changed it).
    admin_password: Mutex<String>,
}

/// One instance to register over the HTTP API.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Service name (without the group).
    pub service: String,
    /// Group; [`DEFAULT_GROUP`] unless set.
    pub group: String,
    /// Namespace id; `public` unless set.
    pub namespace: String,
    /// IP (sent as given).
    pub ip: String,
    /// Port.
    pub port: u16,
    /// Weight; 1.0 unless set.
    pub weight: f64,
    /// Metadata, sent as a JSON object.
    pub metadata: Vec<(String, String)>,
    /// Healthy as registered (persistent instances keep it while health checks are off).
    pub healthy: bool,
    /// Enabled.
    pub enabled: bool,
    /// Cluster; `DEFAULT` unless set.
    pub cluster: String,
}

impl Instance {
    /// A persistent, healthy, enabled instance of `service` on `ip:port` in the public
    /// namespace, group [`DEFAULT_GROUP`], cluster `DEFAULT`, weight 1, no metadata.
    pub fn new(service: &str, ip: &str, port: u16) -> Self {
        Self {
            service: service.to_string(),
            group: DEFAULT_GROUP.to_string(),
            namespace: "public".to_string(),
            ip: ip.to_string(),
            port,
            weight: 1.0,
            metadata: Vec::new(),
            healthy: true,
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

    /// The same, healthy or not.
    pub fn healthy(mut self, healthy: bool) -> Self {
        self.healthy = healthy;
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

    /// The metadata as the JSON object the API takes.
    pub fn metadata_json(&self) -> String {
        serde_json::Value::Object(
            self.metadata
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        )
        .to_string()
    }

    /// The parameters that name the instance.
    fn key_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("serviceName", self.service.clone()),
            ("groupName", self.group.clone()),
            ("namespaceId", self.namespace.clone()),
            ("ip", self.ip.clone()),
            ("port", self.port.to_string()),
            ("clusterName", self.cluster.clone()),
            ("ephemeral", "false".to_string()),
        ]
    }

    /// Every parameter of the instance.
    pub(crate) fn params(&self) -> Vec<(&'static str, String)> {
        let mut p = self.key_params();
        p.extend([
            ("weight", self.weight.to_string()),
            ("enabled", self.enabled.to_string()),
            ("healthy", self.healthy.to_string()),
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

/// One server per version for the whole test process (see [`Nacos::shared`]).
static SHARED: [OnceLock<Nacos>; 2] = [OnceLock::new(), OnceLock::new()];

impl Nacos {
    /// A server of `version` with the default options, ready.
    pub fn start(version: Version) -> Nacos {
        Self::start_with(version, Options::default())
    }

    /// A server of `version` configured by `options`, ready: it answers, its admin can log in,
    /// its health checks are as asked.
    pub fn start_with(version: Version, options: Options) -> Nacos {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut n = Nacos {
            version,
            options,
            process: Process::new("nacos", dir.path(), Duration::from_millis(250)),
            lifeline: Mutex::new(None),
            http: free_http_addr(),
            dir,
            token: Mutex::new(None),
            admin_password: Mutex::new(ADMIN_PASSWORD.to_string()),
        };
        n.configure();
        n.spawn();
        n.prepare();
        n
    }

    /// The one server of `version` this test process shares (default options), started by
    /// the first test that asks. It is never dropped: a small watchdog process, reading a pipe
    /// from this process, kills it when the test process ends however it ends.
    pub fn shared(version: Version) -> &'static Nacos {
        let slot = match version {
            Version::V2 => &SHARED[0],
            Version::V3 => &SHARED[1],
        };
        slot.get_or_init(|| Nacos::start(version))
    }

    /// The version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// `conf/application.properties`: the release's, with the harness's settings appended
    /// (later lines win).
    fn configure(&self) {
        let home = self.version.home();
        let base = std::fs::read_to_string(home.join("conf/application.properties"))
            .expect("the release's conf/application.properties");
        let conf = self.dir.path().join("conf");
        std::fs::create_dir_all(&conf).expect("conf dir");
        let mut extra = vec![
            // The release leaves these empty; 3.x refuses to start without them even with auth
            // off, 2.x wants them once auth is on. A key of 48 random-looking bytes, base64.
            (
                "nacos.core.auth.plugin.nacos.token.secret.key",
                "bWNwLWFkYXB0ZXJzLXRlc3RzLW5hY29zLXNlY3JldC1rZXktb2YtNDgtYnl0ZXMhIQ==".to_string(),
            ),
            ("nacos.core.auth.server.identity.key", "mcp-tests".into()),
            (
                "nacos.core.auth.server.identity.value",
                "mcp-tests-identity".into(),
            ),
            ("nacos.core.auth.enabled", self.options.auth.to_string()),
            // Nacos gives its embedded Derby 3 s to hand out a connection (Hikari's
            // connectionTimeout, also Derby's login timeout); creating the database at the
            // first start took longer on a busy machine, and 3.0.3 exited ("load
            // derby-schema.sql error ... Login timeout exceeded"). The server's own setting.
            ("db.pool.config.connectionTimeout", "30000".into()),
        ];
        if let Some(ttl) = self.options.token_ttl {
            extra.push((
                "nacos.core.auth.plugin.nacos.token.expire.seconds",
                ttl.to_string(),
            ));
        }
        let mut text = base;
        text.push_str("\n# tests/src/nacos.rs\n");
        for (k, v) in extra {
            text.push_str(&format!("{k}={v}\n"));
        }
        std::fs::write(conf.join("application.properties"), text).expect("write conf");
    }

    /// Starts the JVM and waits until the server answers.
    fn spawn(&mut self) {
        let home = self.version.home();
        let dir = self.dir.path();
        let port_flag = match self.version {
            Version::V2 => "-Dserver.port",
            Version::V3 => "-Dnacos.server.main.port",
        };
        let console = self.http.port() + CONSOLE_OFFSET;
        let mut cmd = Command::new("java");
        // C1 only and the serial collector: a JVM that starts in half the time on two busy
        // cores; the heap as the release's standalone script sets it.
        cmd.args([
            "-Xms256m",
            "-Xmx512m",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-Dnacos.standalone=true",
        ])
        .arg(format!("-Dnacos.home={}", dir.display()))
        .arg(format!("-Dnacos.logs.path={}", dir.join("logs").display()))
        .arg(format!("{port_flag}={}", self.http.port()))
        .arg(format!("-Dnacos.console.port={console}"))
        .arg("-jar")
        .arg(home.join("target/nacos-server.jar"))
        .arg(format!(
            "--spring.config.additional-location=file:{}/",
            dir.join("conf").display()
        ))
        .current_dir(dir);
        self.process.spawn(&mut cmd);
        self.tie_to_this_process();
        let grpc = SocketAddr::from(([127, 0, 0, 1], self.grpc_port()));
        self.process.wait_until(
            START_TIMEOUT,
            "an answer to GET /nacos/v1/ns/operator/metrics and the gRPC port listening",
            || {
                http(self.http, "GET", "/nacos/v1/ns/operator/metrics", &[], "")
                    .is_ok_and(|(s, b)| s == 200 && b.contains("UP"))
                    && TcpStream::connect_timeout(&grpc, Duration::from_secs(1)).is_ok()
            },
        );
    }

    /// A watchdog that kills the server when this process ends: `sh` blocks reading a pipe
    /// whose other end only this process holds (Rust opens it close-on-exec); the pipe closes
    /// when the process exits, however it exits, and `sh` kills the server.
    fn tie_to_this_process(&self) {
        let Some(pid) = self.process.pid() else {
            return;
        };
        let watchdog = Command::new("sh")
            .args(["-c", &format!("read _ ; kill -9 {pid} 2>/dev/null")])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the watchdog");
        if let Some(mut old) = self.lifeline().replace(watchdog) {
            let _ = old.kill();
            let _ = old.wait();
        }
    }

    fn lifeline(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.lifeline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The admin password set and usable, health checks as asked.
    fn prepare(&self) {
        *self.token() = None;
        let path = match self.version {
            Version::V2 => "/nacos/v1/auth/users/admin",
            Version::V3 => "/nacos/v3/auth/user/admin",
        };
        // Once per data directory: a restarted server answers that an admin exists.
        let body = query(&[("password", ADMIN_PASSWORD.to_string())]);
        let _ = http(
            self.http,
            "POST",
            path,
            &[("Content-Type", "application/x-www-form-urlencoded")],
            &body,
        );
        // The user cache is refreshed every few seconds: the first logins may not find it.
        let password = self.admin_password();
        let token = wait_for(
            Duration::from_secs(60),
            "a login as the Nacos admin",
            || self.login(ADMIN_USER, &password),
        );
        *self.token() = Some(token);
        if !self.options.health_checks {
            self.set_switch("check", "false");
        }
    }

    fn token(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.token.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admin_password(&self) -> String {
        self.admin_password
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A naming switch (`check`: health checks of persistent instances), until the server
    /// shows it (switches are applied through its consistency layer).
    pub fn set_switch(&self, entry: &str, value: &str) {
        let path = match self.version {
            Version::V2 => "/nacos/v1/ns/operator/switches",
            Version::V3 => "/nacos/v3/admin/ns/ops/switches",
        };
        let params = [("entry", entry.to_string()), ("value", value.to_string())];
        wait_for(
            Duration::from_secs(60),
            &format!("the {entry} switch set"),
            || {
                let (status, body) = self.call("PUT", path, &params);
                (status == 200 && body.contains("ok")).then_some(())
            },
        );
    }

    /// `POST /nacos/v1/auth/login` (3.x: `/nacos/v3/auth/user/login` too): the access token,
    /// or None when refused.
    pub fn login(&self, user: &str, password: &str) -> Option<String> {
        let (status, resp) = self.login_answer(user, password)?;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&resp).ok()?;
        v["accessToken"].as_str().map(str::to_string)
    }

    /// The login's answer: `(status, body)`.
    fn login_answer(&self, user: &str, password: &str) -> Option<(u16, String)> {
        let body = query(&[("username", user.into()), ("password", password.into())]);
        let path = match self.version {
            Version::V2 => "/nacos/v1/auth/login",
            Version::V3 => "/nacos/v3/auth/user/login",
        };
        http(
            self.http,
            "POST",
            path,
            &[("Content-Type", "application/x-www-form-urlencoded")],
            &body,
        )
        .ok()
    }

    /// The HTTP address.
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

    /// Whether every request needs a token.
    pub fn auth(&self) -> bool {
        self.options.auth
    }

    /// The server's own log (its stdout; Nacos' own log files are in `logs/`).
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// One of the server's own log files (`naming-server.log`: pushes and clients;
    /// `core-auth.log`: what auth refused).
    pub fn server_log(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("logs").join(file)).unwrap_or_default()
    }

    /// Stops the server (SIGTERM, then SIGKILL if it lingers).
    pub fn stop(&mut self) {
        if self.process.terminate(STOP_TIMEOUT).is_none() {
            self.process.kill();
        }
    }

    /// Stops the server and starts it again on the same ports with the same data directory:
    /// persistent instances, users and namespaces survive; ephemeral instances do not (a 2.x
    /// client registers its own again once it has reconnected).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
        self.prepare();
    }

    /// The same server under another configuration, restarted.
    pub fn restart_with(&mut self, options: Options) {
        self.stop();
        self.options = options;
        self.configure();
        self.spawn();
        self.prepare();
    }

    /// Stops the process (SIGSTOP) or lets it go on (SIGCONT): a server that hangs.
    pub fn pause(&self, paused: bool) {
        if let Some(pid) = self.process.pid() {
            let sig = if paused { "-STOP" } else { "-CONT" };
            let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
        }
    }

    /// One request with the admin's token (after one new login if the server refused it):
    /// `(status, body)`.
    pub fn call(&self, method: &str, path: &str, params: &[(&str, String)]) -> (u16, String) {
        let send = |token: Option<&str>| {
            let mut params: Vec<(&str, String)> = params.to_vec();
            if let Some(t) = token {
                params.push(("accessToken", t.to_string()));
            }
            let target = format!("{path}?{}", query(&params));
            http(self.http, method, &target, &[], "")
                .unwrap_or_else(|e| panic!("{} {method} {path}: {e}", self.version))
        };
        let token = self.token().clone();
        let answer = send(token.as_deref());
        if matches!(answer.0, 401 | 403) && token.is_some() {
            let password = self.admin_password();
            let fresh = self.login(ADMIN_USER, &password);
            assert!(
                fresh.is_some(),
                "{}: the admin's login was refused ({:?}) after {method} {path} answered {answer:?}; the server's auth log:\n{}",
                self.version,
                self.login_answer(ADMIN_USER, &password),
                crate::tail(&self.server_log("core-auth.log"), 40)
            );
            *self.token() = fresh.clone();
            return send(fresh.as_deref());
        }
        answer
    }

    /// A write that must answer `ok`: retried while the server answers 500 (a server that has
    /// just started may not have its naming executor, or Raft for persistent instances, ready).
    fn expect_ok(&self, method: &str, path: &str, params: &[(&str, String)]) {
        let end = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, body) = self.call(method, path, params);
            // 1.x answers `ok`, 3.x's admin API `{"code":0,...,"data":"ok"}`.
            if status == 200 && (body.trim() == "ok" || body.contains("\"data\":\"ok\"")) {
                return;
            }
            assert!(
                status >= 500 && Instant::now() < end,
                "{} {method} {path} {params:?}: HTTP {status} {body}; the server's log:\n{}",
                self.version,
                crate::tail(&self.server_log("nacos.log"), 60)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `POST /nacos/v1/ns/instance`: a persistent instance.
    pub fn register(&self, inst: &Instance) {
        self.expect_ok("POST", "/nacos/v1/ns/instance", &inst.params());
    }

    /// Updates the instance's weight, enabled and metadata to what `inst` has (its health is
    /// the server's to judge): `PUT /nacos/v1/ns/instance` on 2.x, 3.x's admin API
    /// `PUT /nacos/v3/admin/ns/instance` (it answers the former 410).
    pub fn update(&self, inst: &Instance) {
        let path = match self.version {
            Version::V2 => "/nacos/v1/ns/instance",
            Version::V3 => "/nacos/v3/admin/ns/instance",
        };
        self.expect_ok("PUT", path, &inst.params());
    }

    /// `DELETE /nacos/v1/ns/instance`.
    pub fn deregister(&self, inst: &Instance) {
        self.expect_ok("DELETE", "/nacos/v1/ns/instance", &inst.key_params());
    }

    /// `GET /nacos/v1/ns/instance/list` of `service` in `group` and `namespace`, healthy or
    /// not: `{"name": "GROUP@@service", "hosts": [...], ...}`.
    pub fn list(&self, service: &str, group: &str, namespace: &str) -> serde_json::Value {
        let params = [
            ("serviceName", service.to_string()),
            ("groupName", group.to_string()),
            ("namespaceId", namespace.to_string()),
            ("healthyOnly", "false".to_string()),
        ];
        let (status, body) = self.call("GET", "/nacos/v1/ns/instance/list", &params);
        assert_eq!(
            status, 200,
            "{} instance/list {params:?}: {body}",
            self.version
        );
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

    /// `GET /nacos/v1/ns/service/list`: the service names of `group` in `namespace`, sorted.
    pub fn services(&self, group: &str, namespace: &str) -> Vec<String> {
        let params = [
            ("pageNo", "1".to_string()),
            ("pageSize", "10000".to_string()),
            ("groupName", group.to_string()),
            ("namespaceId", namespace.to_string()),
        ];
        let (status, body) = self.call("GET", "/nacos/v1/ns/service/list", &params);
        assert_eq!(
            status, 200,
            "{} service/list {params:?}: {body}",
            self.version
        );
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

    /// Deletes service `service` (of `group` in `namespace`), as an operator does once it has
    /// no instance.
    pub fn delete_service(&self, service: &str, group: &str, namespace: &str) {
        let (path, params) = match self.version {
            Version::V2 => (
                "/nacos/v1/ns/service",
                vec![
                    ("serviceName", service.to_string()),
                    ("groupName", group.to_string()),
                    ("namespaceId", namespace.to_string()),
                ],
            ),
            Version::V3 => (
                "/nacos/v3/admin/ns/service",
                vec![
                    ("serviceName", service.to_string()),
                    ("groupName", group.to_string()),
                    ("namespaceId", namespace.to_string()),
                ],
            ),
        };
        let (status, body) = self.call("DELETE", path, &params);
        assert!(
            status == 200 && body.contains("ok"),
            "{} delete service {service}: HTTP {status} {body}",
            self.version
        );
    }

    /// Creates namespace `id` (shown as `name`), as the console does.
    pub fn create_namespace(&self, id: &str, name: &str) {
        let path = match self.version {
            Version::V2 => "/nacos/v1/console/namespaces",
            Version::V3 => "/nacos/v3/admin/core/namespace",
        };
        let id_param = match self.version {
            Version::V2 => "customNamespaceId",
            Version::V3 => "namespaceId",
        };
        let params = [
            (id_param, id.to_string()),
            ("namespaceName", name.to_string()),
            ("namespaceDesc", name.to_string()),
        ];
        let (status, body) = self.call("POST", path, &params);
        assert!(
            status == 200 && body.contains("true"),
            "{} create namespace {id}: HTTP {status} {body}",
            self.version
        );
    }

    /// The namespaces the server lists: `(id, name)`, ids as the server writes them (2.x:
    /// `public` as the empty id).
    pub fn namespaces(&self) -> Vec<(String, String)> {
        let path = match self.version {
            Version::V2 => "/nacos/v1/console/namespaces",
            Version::V3 => "/nacos/v3/admin/core/namespace/list",
        };
        let (status, body) = self.call("GET", path, &[]);
        assert_eq!(status, 200, "{} namespaces: {body}", self.version);
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

    /// A user `user` with `password` that may `action` (`r`, `w`, `rw`) the naming resources
    /// of `namespace` (role `role-<user>`, resource `<namespace>:*:*`).
    pub fn create_user(&self, user: &str, password: &str, namespace: &str, action: &str) {
        let (users, roles, permissions) = match self.version {
            Version::V2 => (
                "/nacos/v1/auth/users",
                "/nacos/v1/auth/roles",
                "/nacos/v1/auth/permissions",
            ),
            Version::V3 => (
                "/nacos/v3/auth/user",
                "/nacos/v3/auth/role",
                "/nacos/v3/auth/permission",
            ),
        };
        let role = format!("role-{user}");
        for (path, params) in [
            (
                users,
                vec![
                    ("username", user.to_string()),
                    ("password", password.to_string()),
                ],
            ),
            (
                roles,
                vec![("role", role.clone()), ("username", user.to_string())],
            ),
            (
                permissions,
                vec![
                    ("role", role.clone()),
                    ("resource", format!("{namespace}:*:*")),
                    ("action", action.to_string()),
                ],
            ),
        ] {
            let (status, body) = self.call("POST", path, &params);
            assert_eq!(status, 200, "{} POST {path}: {body}", self.version);
        }
    }

    /// Sets `user`'s password (as an admin does when a credential leaked); the harness logs in
    /// with the new one when `user` is the admin.
    pub fn set_password(&self, user: &str, password: &str) {
        let path = match self.version {
            Version::V2 => "/nacos/v1/auth/users",
            Version::V3 => "/nacos/v3/auth/user",
        };
        let params = [
            ("username", user.to_string()),
            ("newPassword", password.to_string()),
        ];
        let (status, body) = self.call("PUT", path, &params);
        assert_eq!(
            status, 200,
            "{} set password of {user}: {body}",
            self.version
        );
        if user == ADMIN_USER {
            *self
                .admin_password
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = password.to_string();
        }
    }
}

impl Drop for Nacos {
    fn drop(&mut self) {
        self.process.kill();
        if let Some(mut w) = self.lifeline().take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// A free loopback address `P` whose `P + 1000`, `P + 1001` (client and cluster gRPC),
/// `P - 1000` (Raft) and `P + 2000` (3.x's console) are free too, none of them handed out to
/// anything else of this process (see [`free_addr_with`]).
fn free_http_addr() -> SocketAddr {
    free_addr_with(&[0, 1000, 1001, -1000, i32::from(CONSOLE_OFFSET)])
}
