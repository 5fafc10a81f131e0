//! The processes around istiod: istiod itself (`e2e::istiod`, spawned without its two-minute
//! wait: a large first sync takes longer, and the bench times it), the byte count of the
//! forwarders (`e2e::forwarder`) between istiod and each of its sources, and the API server
//! seen from outside: its process (CPU, RSS) and its own request counter.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::forwarder::Forwarder;
use e2e::istiod::IstiodConfig;
use e2e::kube::{KubeApiServer, ADMIN_TOKEN};
use e2e::metric_sum;
use mcp_core::testing::bench::{Mem, Proc};

/// Sum of what istiod received through every forwarder.
pub fn received(meters: &[Forwarder]) -> u64 {
    meters.iter().map(Forwarder::received).sum()
}

/// A kubeconfig for `kube` whose server is `via` (a [`Meter`] in front of the API server; the
/// serving certificate names 127.0.0.1, which the forwarder's address is too).
pub fn kubeconfig_via(kube: &KubeApiServer, via: SocketAddr, path: &Path) {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": format!("https://{via}"),
            "certificate-authority": kube.ca().display().to_string(),
        }}],
        "users": [{"name": "test", "user": {"token": ADMIN_TOKEN}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    });
    std::fs::write(path, config.to_string()).expect("write kubeconfig");
}

/// The unmodified istiod, as `e2e::istiod::IstiodConfig::production()` runs it: `k8s://` first,
/// then one `xds://` source per address, settings for a stock Envoy. Killed on drop.
pub struct Istiod {
    inner: e2e::istiod::Istiod,
    pub grpc: SocketAddr,
    pub started: Instant,
}

impl Istiod {
    /// Spawns istiod with its log in `dir/istiod.log` (a fresh one); does not wait.
    pub fn spawn(
        sources: &[SocketAddr],
        kubeconfig: &Path,
        dir: &Path,
        env: &[(String, String)],
    ) -> Istiod {
        let mut config = IstiodConfig::production();
        config.env = env.to_vec();
        let _ = std::fs::remove_file(dir.join("istiod.log"));
        let started = Instant::now();
        let inner = e2e::istiod::Istiod::spawn_in(sources, kubeconfig, &config, dir);
        Istiod {
            grpc: inner.grpc,
            inner,
            started,
        }
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid().expect("istiod runs")
    }

    /// utime + stime, clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        Proc::Pid(self.pid()).cpu_ticks()
    }

    pub fn mem(&self) -> Mem {
        Proc::Pid(self.pid()).mem()
    }

    /// Waits (panicking with the log if istiod exits or `timeout` passes) until `ready` holds.
    pub fn wait_until(&self, timeout: Duration, what: &str, ready: impl FnMut() -> bool) {
        self.inner.wait_until(timeout, what, ready);
    }

    /// A metric's sum on /metrics (`None` when istiod does not answer yet).
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.inner
            .try_get("/metrics")
            .filter(|(s, _)| *s == 200)
            .map(|(_, body)| metric_sum(&body, name))
    }

    pub fn ready(&self) -> bool {
        self.inner.try_get("/ready").is_some_and(|(s, _)| s == 200)
    }

    pub fn log_path(&self) -> PathBuf {
        self.inner.log_path().to_path_buf()
    }

    /// How many log lines so far contain `what`.
    pub fn log_count(&self, what: &str) -> usize {
        self.inner
            .log()
            .lines()
            .filter(|l| l.contains(what))
            .count()
    }
}

/// kube-apiserver-test's process id: the child of this process whose command line holds
/// `-port <port>` (`e2e::kube` spawns the binary itself, one process with its etcd embedded).
pub fn api_server_pid(kube: &KubeApiServer) -> Option<u32> {
    let me = std::process::id();
    let want = format!("\0-port\0{}\0", kube.addr.port());
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            if !cmdline.contains("kube-apiserver-test") || !cmdline.contains(&want) {
                return None;
            }
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // Field 4, the parent, counted after the command name's closing paren.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == me).then_some(pid)
        })
}

/// The API server's own request counter (`apiserver_request_total` on its `/metrics`, read with
/// the admin token): one count per series.
#[derive(Clone, Debug, Default)]
pub struct ApiRequests {
    series: Vec<(BTreeMap<String, String>, f64)>,
}

/// Verbs (as the API server labels them: a server-side apply is `APPLY`) that write.
const WRITES: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

impl ApiRequests {
    /// Reads the counter now; `None` when the API server does not answer with it.
    pub fn get(kube: &KubeApiServer) -> Option<ApiRequests> {
        let r = kube
            .try_request(ADMIN_TOKEN, "GET", "/metrics", None)
            .ok()?;
        let text = match (r.status, r.body) {
            (200, serde_json::Value::String(text)) => text,
            _ => return None,
        };
        let series: Vec<_> = text
            .lines()
            .filter_map(|l| l.strip_prefix("apiserver_request_total{"))
            .filter_map(|l| {
                let (labels, value) = l.rsplit_once("} ")?;
                let labels = labels
                    .split("\",")
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once("=\"")?;
                        Some((k.to_string(), v.trim_end_matches('"').to_string()))
                    })
                    .collect();
                Some((labels, value.trim().parse().ok()?))
            })
            .collect();
        (!series.is_empty()).then_some(ApiRequests { series })
    }

    /// Requests per verb to `resource` (any subresource), as `VERB` or `VERB/subresource`.
    pub fn by_verb(&self, resource: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (labels, v) in &self.series {
            if labels.get("resource").map(String::as_str) != Some(resource) {
                continue;
            }
            let verb = labels.get("verb").cloned().unwrap_or_default();
            let key = match labels.get("subresource").map(String::as_str) {
                None | Some("") => verb,
                Some(sub) => format!("{verb}/{sub}"),
            };
            *out.entry(key).or_insert(0.0) += v;
        }
        out
    }

    /// Write requests to `resource` (any subresource).
    pub fn writes(&self, resource: &str) -> f64 {
        self.by_verb(resource)
            .into_iter()
            .filter(|(k, _)| WRITES.contains(&k.split('/').next().unwrap_or_default()))
            .map(|(_, v)| v)
            .sum()
    }
}

/// `after - before` per verb, the verbs that moved, for logs (`PATCH 20, APPLY 1`).
pub fn verbs_delta(before: &ApiRequests, after: &ApiRequests, resource: &str) -> String {
    let b = before.by_verb(resource);
    after
        .by_verb(resource)
        .into_iter()
        .map(|(k, v)| (v - b.get(&k).copied().unwrap_or(0.0), k))
        .filter(|(d, _)| *d > 0.0)
        .map(|(d, k)| format!("{k} {d}"))
        .collect::<Vec<_>>()
        .join(", ")
}
