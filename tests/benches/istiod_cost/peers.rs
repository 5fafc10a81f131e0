//! The processes around istiod: istiod itself (started here rather than with `e2e::istiod`, to
//! know its pid for `/proc` and to wait longer than two minutes for a large first sync), and a
//! byte-counting TCP forwarder between istiod and each of its sources.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::istiod::pilot_discovery_bin;
use e2e::kube::{KubeApiServer, ADMIN_TOKEN};
use e2e::{free_addr, http_get, metric_sum, Process};
use mcp_core::testing::bench::{Mem, Proc};

/// One TCP forwarder to one upstream, counting the bytes copied each way.
pub struct Meter {
    /// Where istiod connects.
    pub addr: SocketAddr,
    /// Bytes upstream -> client (what istiod received).
    down: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Meter {
    pub fn start(upstream: SocketAddr) -> Meter {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind meter");
        let addr = listener.local_addr().expect("meter addr");
        let down = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (d, s) = (down.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2))
                else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                let counter = d.clone();
                std::thread::spawn(move || copy(server, client, Some(counter)));
                std::thread::spawn(move || copy(c2, s2, None));
            }
        });
        Meter { addr, down, stop }
    }

    /// Bytes the upstream sent to istiod so far.
    pub fn received(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream, count: Option<Arc<AtomicU64>>) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(c) = &count {
                    c.fetch_add(n as u64, Ordering::Relaxed);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Sum of what every meter counted.
pub fn received(meters: &[Meter]) -> u64 {
    meters.iter().map(Meter::received).sum()
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
    process: Process,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub started: Instant,
}

impl Istiod {
    /// Spawns istiod with its log in `dir/istiod.log`; does not wait.
    pub fn spawn(
        sources: &[SocketAddr],
        kubeconfig: &Path,
        dir: &Path,
        env: &[(String, String)],
    ) -> Istiod {
        let mut mesh = String::from(
            "enableAutoMtls: false\ndefaultProviders:\n  metrics: []\naccessLogFile: \"/dev/stdout\"\nconfigSources:\n- address: \"k8s://\"\n",
        );
        for s in sources {
            mesh.push_str(&format!("- address: \"xds://{s}\"\n"));
        }
        let mesh_path = dir.join("mesh.yaml");
        std::fs::write(&mesh_path, mesh).expect("write mesh.yaml");
        let _ = std::fs::remove_file(dir.join("istiod.log"));
        let (http, grpc, secure, https) = (free_addr(), free_addr(), free_addr(), free_addr());
        let process = Process::new("istiod", dir, Duration::from_millis(200));
        let started = Instant::now();
        process.spawn(
            Command::new(pilot_discovery_bin())
                .arg("discovery")
                .arg("--meshConfig")
                .arg(&mesh_path)
                .arg("--registries=Kubernetes")
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg(format!("--httpAddr={http}"))
                .arg(format!("--grpcAddr={grpc}"))
                .arg(format!("--secureGRPCAddr={secure}"))
                .arg(format!("--httpsAddr={https}"))
                .arg("--monitoringAddr=")
                .arg("--ctrlz_port=0")
                .arg("--shutdownDuration=1s")
                .env("POD_NAMESPACE", "istio-system")
                .env("POD_NAME", "istiod-test")
                .env("REVISION", "default")
                .env("PILOT_ENABLE_ALPN_FILTER", "false")
                .env("PILOT_ENABLE_METADATA_EXCHANGE", "false")
                .envs(env.iter().map(|(k, v)| (k, v))),
        );
        Istiod {
            process,
            http,
            grpc,
            started,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid().expect("istiod runs")
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
        self.process.wait_until(timeout, what, ready);
    }

    /// A metric's sum on /metrics (`None` when istiod does not answer yet).
    pub fn metric(&self, name: &str) -> Option<f64> {
        http_get(self.http, "/metrics")
            .ok()
            .filter(|(s, _)| *s == 200)
            .map(|(_, body)| metric_sum(&body, name))
    }

    pub fn ready(&self) -> bool {
        http_get(self.http, "/ready").is_ok_and(|(s, _)| s == 200)
    }

    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// How many log lines so far contain `what`.
    pub fn log_count(&self, what: &str) -> usize {
        self.process
            .log()
            .lines()
            .filter(|l| l.contains(what))
            .count()
    }
}
