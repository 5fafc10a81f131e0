//! A real Consul agent (`consul agent -dev`) on free loopback ports, built by
//! `tests/consul/build.sh` into `$CONSUL_BIN_DIR` (default `target/consul`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::{free_addr, http, peer_binary, run_ok, wait_for, Process};

/// Directory of the consul binary.
pub fn consul_bin() -> PathBuf {
    peer_binary(
        "CONSUL_BIN_DIR",
        "consul",
        "consul",
        "tests/consul/build.sh target/consul",
    )
}

/// A running dev-mode Consul agent, killed on drop.
pub struct Consul {
    process: Process,
    /// HTTP API address.
    pub http: SocketAddr,
    ports: [u16; 4],
    hcl: Option<String>,
    dir: tempfile::TempDir,
    /// Token sent with every request (`root` when ACLs are on).
    pub token: Option<String>,
    /// HTTPS API address and CA file, when started with [`Consul::start_tls`].
    pub https: Option<(SocketAddr, PathBuf)>,
    certs: Option<tempfile::TempDir>,
}

/// One instance to register through the catalog ([`Consul::register`],
/// [`Consul::register_bulk`]): on an external node (registered with address 10.255.0.1 if new),
/// with one check.
#[derive(Clone, Debug)]
pub struct Registration {
    node: String,
    service: String,
    id: String,
    address: String,
    port: u16,
    tags: Vec<String>,
    /// Service meta.
    meta: Vec<(String, String)>,
    /// Check status.
    status: String,
}

impl Registration {
    /// A passing instance `id` of `service` on `node`, at `address:port`, without tags or meta.
    pub fn new(node: &str, service: &str, id: &str, address: &str, port: u16) -> Registration {
        Registration {
            node: node.to_string(),
            service: service.to_string(),
            id: id.to_string(),
            address: address.to_string(),
            port,
            tags: Vec::new(),
            meta: Vec::new(),
            status: "passing".to_string(),
        }
    }

    /// The same with `tags`.
    pub fn tags(mut self, tags: &[&str]) -> Registration {
        self.tags = tags.iter().map(|t| t.to_string()).collect();
        self
    }

    /// The same with service meta `key: value` too.
    pub fn meta(mut self, key: &str, value: &str) -> Registration {
        self.meta.push((key.to_string(), value.to_string()));
        self
    }

    /// The same with `protocol` service meta.
    pub fn protocol(self, protocol: &str) -> Registration {
        self.meta("protocol", protocol)
    }

    /// The same with check status `status` (`passing`, `critical`, ...).
    pub fn status(mut self, status: &str) -> Registration {
        self.status = status.to_string();
        self
    }

    /// The catalog's `Service` object, but for the tags.
    fn service_json(&self) -> serde_json::Value {
        let meta: serde_json::Map<String, serde_json::Value> = self
            .meta
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
            .collect();
        serde_json::json!({
            "ID": self.id, "Service": self.service, "Address": self.address, "Port": self.port,
            "Meta": meta,
        })
    }

    /// The catalog's `Check` object (its id `<instance id>-check`).
    fn check_json(&self) -> serde_json::Value {
        check(&self.id, &self.status)
    }
}

/// The one check of instance `id`.
fn check(id: &str, status: &str) -> serde_json::Value {
    serde_json::json!({"CheckID": format!("{id}-check"), "Name": id, "Status": status, "ServiceID": id})
}

impl Consul {
    /// Starts an agent; `hcl` adds configuration (e.g. ACLs).
    pub fn start(hcl: Option<&str>) -> Consul {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Consul {
            process: Process::new("consul", dir.path(), Duration::from_millis(50)),
            http: free_addr(),
            ports: [
                free_addr().port(),
                free_addr().port(),
                free_addr().port(),
                free_addr().port(),
            ],
            hcl: hcl.map(str::to_string),
            dir,
            token: hcl
                .filter(|h| h.contains("initial_management"))
                .map(|_| "root".to_string()),
            https: None,
            certs: None,
        };
        c.spawn();
        c
    }

    /// Starts an agent that also serves HTTPS, with a CA and a server certificate made by the
    /// consul binary itself (`consul tls ca create`, `consul tls cert create -server`), valid
    /// for `localhost` and 127.0.0.1; `hcl` adds configuration.
    pub fn start_tls(hcl: Option<&str>) -> Consul {
        let certs_dir = tempfile::tempdir().expect("tempdir");
        let certs = certs_dir.path().to_path_buf();
        for args in [
            &["tls", "ca", "create"][..],
            &["tls", "cert", "create", "-server", "-dc", "dc1"][..],
        ] {
            run_ok(
                Command::new(consul_bin()).args(args).current_dir(&certs),
                &format!("consul {args:?}"),
            );
        }
        let https = free_addr();
        let f = |n: &str| certs.join(n).display().to_string();
        let tls = format!(
            r#"ports {{ https = {} }} tls {{ defaults {{ ca_file = "{}" cert_file = "{}" key_file = "{}" verify_incoming = false }} }} {}"#,
            https.port(),
            f("consul-agent-ca.pem"),
            f("dc1-server-consul-0.pem"),
            f("dc1-server-consul-0-key.pem"),
            hcl.unwrap_or("")
        );
        let mut c = Consul::start(Some(&tls));
        c.https = Some((https, certs.join("consul-agent-ca.pem")));
        c.certs = Some(certs_dir);
        c
    }

    /// Registers many instances in few requests (`/v1/txn`, 128 operations each): thousands of
    /// instances in seconds instead of one request each. Their tags are not sent.
    pub fn register_bulk(&self, instances: &[Registration]) {
        let mut ops: Vec<serde_json::Value> = Vec::new();
        let mut nodes: Vec<&str> = instances.iter().map(|i| i.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for n in nodes {
            ops.push(serde_json::json!({"Node": {"Verb": "set", "Node": {"Node": n, "Address": "10.255.0.1"}}}));
        }
        for i in instances {
            ops.push(serde_json::json!({"Service": {"Verb": "set", "Node": i.node, "Service": i.service_json()}}));
            let mut check = i.check_json();
            check["Node"] = serde_json::json!(i.node);
            ops.push(serde_json::json!({"Check": {"Verb": "set", "Check": check}}));
        }
        // Nodes first, then instances from four threads (the agent applies transactions one
        // at a time, but overlapping requests hide the round trips).
        let node_ops = ops.iter().take_while(|o| o.get("Node").is_some()).count();
        let (nodes, rest) = ops.split_at(node_ops);
        let txn = |chunk: &[serde_json::Value]| {
            self.must(
                "PUT",
                "/v1/txn",
                &serde_json::Value::from(chunk.to_vec()).to_string(),
            );
        };
        nodes.chunks(128).for_each(txn);
        // Pairs (service, check) stay in one transaction: 128 operations = 64 instances.
        let chunks: Vec<&[serde_json::Value]> = rest.chunks(128).collect();
        std::thread::scope(|scope| {
            for part in chunks.chunks(chunks.len().div_ceil(4).max(1)) {
                scope.spawn(move || part.iter().for_each(|chunk| txn(chunk)));
            }
        });
    }

    fn spawn(&self) {
        let [lan, wan, server, _] = self.ports;
        let mut cmd = Command::new(consul_bin());
        cmd.args([
            "agent",
            "-dev",
            "-node=test",
            "-bind=127.0.0.1",
            "-client=127.0.0.1",
            "-log-level=warn",
        ])
        .arg(format!("-http-port={}", self.http.port()))
        .args(["-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1"])
        .arg(format!("-serf-lan-port={lan}"))
        .arg(format!("-serf-wan-port={wan}"))
        .arg(format!("-server-port={server}"))
        .arg(format!("-data-dir={}", self.dir.path().display()));
        if let Some(h) = &self.hcl {
            cmd.arg("-hcl").arg(h);
        }
        self.process.spawn(&mut cmd);
        self.process
            .wait_until(Duration::from_secs(60), "a leader", || {
                http(self.http, "GET", "/v1/status/leader", &[], "")
                    .is_ok_and(|(s, b)| s == 200 && b.trim().len() > 2)
            });
        // The catalog answers once the leader has set itself up.
        wait_for(Duration::from_secs(30), "consul catalog", || {
            self.request("GET", "/v1/catalog/services", "")
                .ok()
                .filter(|(s, _)| *s == 200)
        });
    }

    /// Kills the agent (dev mode keeps nothing: a restart starts empty, with fresh indexes).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again on the same ports.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Open connections to the agent's HTTP port from clients on this machine (IPv4, from
    /// `/proc/net/tcp`): what counts against its `limits.http_max_conns_per_client`.
    pub fn client_connections(&self) -> usize {
        let port = format!("{:04X}", self.http.port());
        std::fs::read_to_string("/proc/net/tcp")
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // remote address `IP:PORT` in hex, state 01 = established.
                f.len() > 3 && f[2].ends_with(&format!(":{port}")) && f[3] == "01"
            })
            .count()
    }

    /// An API request with the agent's token.
    pub fn request(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        match &self.token {
            Some(t) => http(self.http, method, path, &[("X-Consul-Token", t)], body),
            None => http(self.http, method, path, &[], body),
        }
    }

    /// An API request that must succeed; returns the body.
    pub fn must(&self, method: &str, path: &str, body: &str) -> String {
        let (status, resp) = self.request(method, path, body).expect("consul request");
        assert_eq!(status, 200, "{method} {path} {body}: {resp}");
        resp
    }

    /// Registers (or re-registers) an instance through the catalog.
    pub fn register(&self, r: &Registration) {
        self.must("PUT", "/v1/catalog/register", &Self::registration(r));
    }

    /// The same as a client that shares the agent's per-address connection limit with others
    /// does it: a refused connection (reset, or HTTP 429) is tried again, up to 20 times 100 ms
    /// apart. The number of refusals met.
    pub fn register_patiently(&self, r: &Registration) -> usize {
        let body = Self::registration(r);
        for refused in 0..20 {
            match self.request("PUT", "/v1/catalog/register", &body) {
                Ok((200, _)) => return refused,
                Ok((429, _)) | Err(_) => std::thread::sleep(Duration::from_millis(100)),
                Ok((status, resp)) => panic!("register {body}: HTTP {status}: {resp}"),
            }
        }
        panic!("register {body}: refused 20 times");
    }

    fn registration(r: &Registration) -> String {
        let mut service = r.service_json();
        service["Tags"] = serde_json::json!(r.tags);
        serde_json::json!({
            "Node": r.node, "Address": "10.255.0.1", "Service": service, "Check": r.check_json(),
        })
        .to_string()
    }

    /// Removes an instance.
    pub fn deregister(&self, node: &str, id: &str) {
        let body = serde_json::json!({"Node": node, "ServiceID": id});
        self.must("PUT", "/v1/catalog/deregister", &body.to_string());
    }

    /// Sets an instance's check status.
    pub fn set_check(&self, node: &str, id: &str, status: &str) {
        let body = serde_json::json!({
            "Node": node, "Address": "10.255.0.1", "SkipNodeUpdate": true, "Check": check(id, status),
        });
        self.must("PUT", "/v1/catalog/register", &body.to_string());
    }

    /// `--consul-addr` for adapters.
    pub fn addr(&self) -> String {
        format!("http://{}", self.http)
    }
}
