//! A real Consul agent (`consul agent -dev`) on free loopback ports, built by
//! `tests/consul/build.sh` into `$CONSUL_BIN_DIR` (default `target/consul`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_addr, http, peer_binary, wait_for};

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
    child: Option<Child>,
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

/// One instance for [`Consul::register_bulk`].
#[derive(Clone, Debug)]
pub struct BulkInstance {
    /// Node (registered with address 10.255.0.1 if new).
    pub node: String,
    /// Service name.
    pub service: String,
    /// Instance id.
    pub id: String,
    /// Instance address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// `protocol` meta, if any.
    pub protocol: Option<&'static str>,
    /// Check status.
    pub status: &'static str,
}

impl Consul {
    /// Starts an agent; `hcl` adds configuration (e.g. ACLs).
    pub fn start(hcl: Option<&str>) -> Consul {
        let mut c = Consul {
            child: None,
            http: free_addr(),
            ports: [
                free_addr().port(),
                free_addr().port(),
                free_addr().port(),
                free_addr().port(),
            ],
            hcl: hcl.map(str::to_string),
            dir: tempfile::tempdir().expect("tempdir"),
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
            let out = Command::new(consul_bin())
                .args(args)
                .current_dir(&certs)
                .output()
                .expect("run consul tls");
            assert!(
                out.status.success(),
                "consul {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
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
    /// instances in seconds instead of one request each.
    pub fn register_bulk(&self, instances: &[BulkInstance]) {
        let mut ops: Vec<serde_json::Value> = Vec::new();
        let mut nodes: Vec<&str> = instances.iter().map(|i| i.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for n in nodes {
            ops.push(serde_json::json!({"Node": {"Verb": "set", "Node": {"Node": n, "Address": "10.255.0.1"}}}));
        }
        for i in instances {
            let meta: serde_json::Map<String, serde_json::Value> = i
                .protocol
                .map(|p| ("protocol".to_string(), serde_json::Value::from(p)))
                .into_iter()
                .collect();
            ops.push(serde_json::json!({"Service": {"Verb": "set", "Node": i.node, "Service": {
                "ID": i.id, "Service": i.service, "Address": i.address, "Port": i.port, "Meta": meta,
            }}}));
            ops.push(serde_json::json!({"Check": {"Verb": "set", "Check": {
                "Node": i.node, "CheckID": format!("{}-check", i.id), "Name": i.id,
                "Status": i.status, "ServiceID": i.id,
            }}}));
        }
        // Nodes first, then instances from four threads (the agent applies transactions one
        // at a time, but overlapping requests hide the round trips).
        let node_ops = ops.iter().take_while(|o| o.get("Node").is_some()).count();
        let (nodes, rest) = ops.split_at(node_ops);
        for chunk in nodes.chunks(128) {
            self.must(
                "PUT",
                "/v1/txn",
                &serde_json::Value::from(chunk.to_vec()).to_string(),
            );
        }
        // Pairs (service, check) stay in one transaction: 128 operations = 64 instances.
        let chunks: Vec<&[serde_json::Value]> = rest.chunks(128).collect();
        std::thread::scope(|scope| {
            for part in chunks.chunks(chunks.len().div_ceil(4).max(1)) {
                scope.spawn(move || {
                    for chunk in part {
                        self.must(
                            "PUT",
                            "/v1/txn",
                            &serde_json::Value::from(chunk.to_vec()).to_string(),
                        );
                    }
                });
            }
        });
    }

    fn spawn(&mut self) {
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
        let log = std::fs::File::create(self.dir.path().join("consul.log")).expect("log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn consul");
        self.child = Some(child);
        let addr = self.http;
        wait_for(Duration::from_secs(60), "consul leader", || {
            http(addr, "GET", "/v1/status/leader", &[], "")
                .ok()
                .filter(|(s, b)| *s == 200 && b.trim().len() > 2)
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
        crate::kill_child(&mut self.child);
    }

    /// Starts it again on the same ports.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
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

    /// Registers an instance on an external node through the catalog, with one check.
    #[allow(clippy::too_many_arguments)]
    pub fn register(
        &self,
        node: &str,
        service: &str,
        id: &str,
        address: &str,
        port: u16,
        tags: &[&str],
        meta: &[(&str, &str)],
        status: &str,
    ) {
        let body = serde_json::json!({
            "Node": node,
            "Address": "10.255.0.1",
            "Service": {
                "ID": id, "Service": service, "Tags": tags, "Address": address, "Port": port,
                "Meta": meta.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>(),
            },
            "Check": {"CheckID": format!("{id}-check"), "Name": id, "Status": status, "ServiceID": id},
        });
        self.must("PUT", "/v1/catalog/register", &body.to_string());
    }

    /// Removes an instance.
    pub fn deregister(&self, node: &str, id: &str) {
        let body = serde_json::json!({"Node": node, "ServiceID": id});
        self.must("PUT", "/v1/catalog/deregister", &body.to_string());
    }

    /// Sets an instance's check status.
    pub fn set_check(&self, node: &str, id: &str, status: &str) {
        let body = serde_json::json!({
            "Node": node, "Address": "10.255.0.1", "SkipNodeUpdate": true,
            "Check": {"CheckID": format!("{id}-check"), "Name": id, "Status": status, "ServiceID": id},
        });
        self.must("PUT", "/v1/catalog/register", &body.to_string());
    }

    /// `--consul-addr` for adapters.
    pub fn addr(&self) -> String {
        format!("http://{}", self.http)
    }
}

impl Drop for Consul {
    fn drop(&mut self) {
        self.kill();
    }
}
