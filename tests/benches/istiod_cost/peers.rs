//! The processes around istiod: istiod itself (`e2e::istiod`, spawned without its two-minute
//! wait: a large first sync takes longer, and the bench times it), and the
//! byte count of the forwarders (`e2e::forwarder`) between istiod and each of its sources.

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
