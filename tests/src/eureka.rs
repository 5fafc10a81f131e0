//! A real Spring Cloud Netflix Eureka server on a free loopback port, built by
//! `tests/eureka/build.sh` into `$EUREKA_JAR` (default `target/eureka/eureka-test.jar`), and
//! Eureka's REST API for registering, changing and removing instances the way Eureka clients do.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::{free_addr, http, peer_file, Process};

/// The server jar.
pub fn eureka_jar() -> PathBuf {
    peer_file(
        "EUREKA_JAR",
        "eureka/eureka-test.jar",
        "tests/eureka/build.sh target/eureka",
    )
}

/// How long a JVM start may take on a loaded two-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A running Eureka server, killed on drop.
pub struct Eureka {
    process: Process,
    /// HTTP address.
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
    args: Vec<String>,
    /// `Authorization` header value when the server requires basic auth.
    auth: Option<String>,
    /// Directory of [`crate::pki::make_pki`]'s files when the server speaks HTTPS and demands a
    /// client certificate.
    tls: Option<PathBuf>,
}

/// One instance to register.
#[derive(Clone, Debug)]
pub struct Instance {
    /// App name (Eureka upper-cases it).
    pub app: String,
    /// Instance id.
    pub id: String,
    /// `ipAddr` (sent as given, even when not an IP).
    pub ip: String,
    /// Plain port (enabled).
    pub port: u16,
    /// TLS port, enabled when set.
    pub secure_port: Option<u16>,
    /// `vipAddress`; none = not sent.
    pub vip: Option<String>,
    /// Initial status.
    pub status: String,
    /// Metadata.
    pub metadata: Vec<(String, String)>,
    /// Lease duration: long by default so tests need no heartbeats.
    pub lease_secs: u32,
}

impl Instance {
    /// An UP instance on `ip:port` with a one-hour lease and no VIP.
    pub fn new(app: &str, id: &str, ip: &str, port: u16) -> Self {
        Self {
            app: app.to_uppercase(),
            id: id.to_string(),
            ip: ip.to_string(),
            port,
            secure_port: None,
            vip: None,
            status: "UP".into(),
            metadata: Vec::new(),
            lease_secs: 3600,
        }
    }

    /// The same with metadata `key: value` too.
    pub fn with_metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }

    /// The registration body (`{"instance": {...}}`), as Eureka's Jackson codec expects it.
    pub fn json(&self) -> String {
        let mut inst = serde_json::json!({
            "instanceId": self.id,
            "hostName": self.ip,
            "app": self.app,
            "ipAddr": self.ip,
            "status": self.status,
            "port": {"$": self.port, "@enabled": "true"},
            "securePort": {"$": self.secure_port.unwrap_or(443),
                           "@enabled": if self.secure_port.is_some() { "true" } else { "false" }},
            "dataCenterInfo": {
                "@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo",
                "name": "MyOwn"
            },
            "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": self.lease_secs},
            "metadata": self
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect::<serde_json::Map<String, serde_json::Value>>(),
        });
        if let Some(vip) = &self.vip {
            inst["vipAddress"] = serde_json::Value::String(vip.clone());
        }
        serde_json::json!({ "instance": inst }).to_string()
    }
}

impl Eureka {
    /// Starts a server on a free port and waits until it answers `GET /eureka/apps`.
    pub fn start() -> Eureka {
        Self::start_with(&[])
    }

    /// [`Eureka::start`] with extra Spring arguments (`--eureka.server.x=y`), kept for restarts.
    pub fn start_with(args: &[&str]) -> Eureka {
        Self::launch(args.iter().map(|a| a.to_string()).collect(), None, None)
    }

    /// A server that requires HTTP basic auth as `user`/`password` on every request (the
    /// harness's own requests send it).
    pub fn start_with_auth(user: &str, password: &str) -> Eureka {
        Self::launch(
            vec![
                "--eureka-test.auth=true".into(),
                format!("--spring.security.user.name={user}"),
                format!("--spring.security.user.password={password}"),
            ],
            Some(format!(
                "Basic {}",
                crate::base64(format!("{user}:{password}").as_bytes())
            )),
            None,
        )
    }

    /// A server on HTTPS only, with the server certificate of `pki` (a [`crate::pki::make_pki`]
    /// directory), demanding a client certificate signed by its CA (the harness's own requests
    /// present `client.crt`).
    pub fn start_with_tls(pki: &std::path::Path) -> Eureka {
        let file = |f: &str| format!("file:{}", pki.join(f).display());
        Self::launch(
            vec![
                "--server.ssl.enabled=true".into(),
                format!("--server.ssl.certificate={}", file("server.crt")),
                format!(
                    "--server.ssl.certificate-private-key={}",
                    file("server.key")
                ),
                format!("--server.ssl.trust-certificate={}", file("ca.crt")),
                "--server.ssl.client-auth=need".into(),
            ],
            None,
            Some(pki.to_path_buf()),
        )
    }

    /// Starts a server on a free port with Spring arguments `args`, basic auth `auth` and the
    /// TLS files of `tls`.
    fn launch(args: Vec<String>, auth: Option<String>, tls: Option<PathBuf>) -> Eureka {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = Eureka {
            process: Process::new("eureka", dir.path(), Duration::from_millis(200)),
            addr: free_addr(),
            _dir: dir,
            args,
            auth,
            tls,
        };
        e.spawn();
        e
    }

    /// One request: plain HTTP, or curl with the client certificate when the server is HTTPS.
    fn send(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        let headers = self.headers(!body.is_empty());
        let Some(pki) = &self.tls else {
            return http(self.addr, method, path, &headers, body);
        };
        let mut cmd = Command::new("curl");
        cmd.args([
            "--silent",
            "--show-error",
            "--max-time",
            "30",
            "--request",
            method,
        ])
        .arg("--cacert")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("client.crt"))
        .arg("--key")
        .arg(pki.join("client.key"))
        .args(["--write-out", "\n%{http_code}"]);
        for (k, v) in &headers {
            cmd.arg("--header").arg(format!("{k}: {v}"));
        }
        if !body.is_empty() {
            cmd.args(["--data-binary", body]);
        }
        let out = cmd.arg(format!("https://{}{path}", self.addr)).output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(
                String::from_utf8_lossy(&out.stderr).to_string(),
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (resp, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let status = code.trim().parse().map_err(std::io::Error::other)?;
        Ok((status, resp.to_string()))
    }

    fn headers(&self, body: bool) -> Vec<(&str, &str)> {
        let mut h = vec![("Accept", "application/json")];
        if body {
            h.push(("Content-Type", "application/json"));
        }
        if let Some(a) = &self.auth {
            h.push(("Authorization", a.as_str()));
        }
        h
    }

    fn spawn(&self) {
        // C1 only and a small heap: starts in half the time on two busy cores.
        self.process.spawn(
            Command::new("java")
                .args([
                    "-Xmx256m",
                    "-XX:TieredStopAtLevel=1",
                    "-XX:+UseSerialGC",
                    "-jar",
                ])
                .arg(eureka_jar())
                .arg(format!("--server.port={}", self.addr.port()))
                .args(&self.args),
        );
        self.process
            .wait_until(START_TIMEOUT, "an answer to GET /eureka/apps", || {
                self.apps_status() == Some(200)
            });
    }

    fn apps_status(&self) -> Option<u16> {
        self.send("GET", "/eureka/apps", "").ok().map(|(s, _)| s)
    }

    /// Kills the server (its registry is gone: Eureka keeps nothing on disk).
    pub fn stop(&mut self) {
        self.process.kill();
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// The base URL for `--eureka-url`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}/eureka", self.addr)
    }

    /// The server's log (every run).
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// One request under `/eureka` (JSON asked for): `(status, body)` as the server sent it.
    pub fn call(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.send(method, &format!("/eureka{path}"), body)
            .unwrap_or_else(|e| panic!("eureka {method} {path}: {e}"))
    }

    fn expect(&self, method: &str, path: &str, body: &str, ok: &[u16]) {
        let (status, resp) = self.call(method, path, body);
        assert!(
            ok.contains(&status),
            "eureka {method} {path}: HTTP {status} {resp}"
        );
    }

    /// `POST /apps/{APP}` (204).
    pub fn register(&self, inst: &Instance) {
        self.expect("POST", &format!("/apps/{}", inst.app), &inst.json(), &[204]);
    }

    /// `PUT /apps/{APP}/{ID}`: the heartbeat's status (200, or 404 when unknown).
    pub fn heartbeat(&self, app: &str, id: &str) -> u16 {
        self.call("PUT", &format!("/apps/{}/{id}", app.to_uppercase()), "")
            .0
    }

    /// `PUT .../status?value=STATUS`: an operator's status override.
    pub fn set_status(&self, app: &str, id: &str, status: &str) {
        let path = format!("/apps/{}/{id}/status?value={status}", app.to_uppercase());
        self.expect("PUT", &path, "", &[200]);
    }

    /// `DELETE .../status?value=UP`: removes the override, the instance is UP again.
    pub fn clear_status(&self, app: &str, id: &str) {
        let path = format!("/apps/{}/{id}/status?value=UP", app.to_uppercase());
        self.expect("DELETE", &path, "", &[200]);
    }

    /// `PUT .../metadata?key=value`.
    pub fn set_metadata(&self, app: &str, id: &str, key: &str, value: &str) {
        let path = format!("/apps/{}/{id}/metadata?{key}={value}", app.to_uppercase());
        self.expect("PUT", &path, "", &[200]);
    }

    /// `DELETE /apps/{APP}/{ID}` (cancel).
    pub fn deregister(&self, app: &str, id: &str) {
        self.expect(
            "DELETE",
            &format!("/apps/{}/{id}", app.to_uppercase()),
            "",
            &[200],
        );
    }

    /// `GET /apps` as JSON.
    pub fn apps(&self) -> serde_json::Value {
        let (status, body) = self.call("GET", "/apps", "");
        assert_eq!(status, 200, "GET /apps: {body}");
        serde_json::from_str(&body).expect("apps JSON")
    }

    /// `GET /apps/delta` as JSON.
    pub fn delta(&self) -> serde_json::Value {
        let (status, body) = self.call("GET", "/apps/delta", "");
        assert_eq!(status, 200, "GET /apps/delta: {body}");
        serde_json::from_str(&body).expect("delta JSON")
    }

    /// `(instance id, registrationTimestamp, serviceUpTimestamp)` of `app`'s instances, as the
    /// server's leases stamp them (milliseconds; 0 = not yet), by id.
    pub fn leases(&self, app: &str) -> Vec<(String, u64, u64)> {
        let apps = self.apps();
        let list = apps["applications"]["application"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut out: Vec<(String, u64, u64)> = list
            .iter()
            .filter(|a| a["name"] == app.to_uppercase())
            .flat_map(|a| a["instance"].as_array().cloned().unwrap_or_default())
            .map(|i| {
                let ms = |k: &str| i["leaseInfo"][k].as_u64().unwrap_or(0);
                (
                    i["instanceId"].as_str().unwrap_or("").to_string(),
                    ms("registrationTimestamp"),
                    ms("serviceUpTimestamp"),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// Effective statuses of `app`'s instances by id, as `GET /apps` shows them.
    pub fn statuses(&self, app: &str) -> Vec<(String, String)> {
        let apps = self.apps();
        let list = apps["applications"]["application"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        list.iter()
            .filter(|a| a["name"] == app.to_uppercase())
            .flat_map(|a| a["instance"].as_array().cloned().unwrap_or_default())
            .map(|i| {
                (
                    i["instanceId"].as_str().unwrap_or("").to_string(),
                    i["status"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }
}
