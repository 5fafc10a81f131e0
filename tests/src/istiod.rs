//! Istio's real, unmodified istiod (`pilot-discovery`, built from the Go module proxy by
//! `tests/go-peers/build.sh target` into `target/istio`, or `$PILOT_DISCOVERY`) as a plain
//! process on loopback, reading the adapters through `configSources: xds://...` and a test
//! Kubernetes API server (istiod needs a Kubernetes client even with only `xds://` sources).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_addr, http_get, tail, target_dir};

/// The pilot-discovery binary: `$PILOT_DISCOVERY` (a full path), else `target/istio/pilot-discovery`.
pub fn pilot_discovery_bin() -> PathBuf {
    let bin = std::env::var_os("PILOT_DISCOVERY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            target_dir()
                .parent()
                .map(|t| t.join("istio").join("pilot-discovery"))
                .unwrap_or_default()
        });
    assert!(
        bin.exists(),
        "{} missing: build it with tests/go-peers/build.sh target (the README's test command does)",
        bin.display()
    );
    bin
}

/// A running istiod, killed on drop.
pub struct Istiod {
    child: Child,
    /// HTTP address (`/ready`, `/debug/*`).
    pub http: SocketAddr,
    /// Plaintext xDS address.
    pub grpc: SocketAddr,
    dir: tempfile::TempDir,
}

impl Istiod {
    /// Writes `mesh.yaml` with one `xds://` config source per address in `sources`, starts
    /// `pilot-discovery discovery` against the API server of `kubeconfig` (whose namespace
    /// `istio-system` must exist) and waits up to 120 s for `/ready` 200.
    pub fn start(sources: &[SocketAddr], kubeconfig: &Path) -> Istiod {
        let dir = tempfile::tempdir().expect("tempdir");
        // Quoted: an unparsable mesh file is only a warning, and istiod then runs with no
        // sources while looking healthy. No `k8s://` source: the test API server has no Istio
        // CRDs (production keeps `k8s://` first, then the adapters).
        let mut mesh = String::from("configSources:\n");
        for s in sources {
            mesh.push_str(&format!("- address: \"xds://{s}\"\n"));
        }
        let mesh_path = dir.path().join("mesh.yaml");
        std::fs::write(&mesh_path, mesh).expect("write mesh.yaml");
        let http = free_addr();
        let grpc = free_addr();
        let secure = free_addr();
        let https = free_addr();
        let log = std::fs::File::create(dir.path().join("istiod.log")).expect("istiod log");
        let child = Command::new(pilot_discovery_bin())
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
            // Metrics and debug on the HTTP port; no ControlZ.
            .arg("--monitoringAddr=")
            .arg("--ctrlz_port=0")
            .arg("--shutdownDuration=1s")
            .env("POD_NAMESPACE", "istio-system")
            .env("POD_NAME", "istiod-test")
            .env("REVISION", "default")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn pilot-discovery");
        let mut istiod = Istiod {
            child,
            http,
            grpc,
            dir,
        };
        istiod.wait_ready(Duration::from_secs(120));
        istiod
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "istiod exited ({status}) before /ready; its log:\n{}",
                    self.log_tail(60)
                );
            }
            if self.try_get("/ready").is_some_and(|(s, _)| s == 200) {
                return;
            }
            assert!(
                Instant::now() < end,
                "istiod not ready after {timeout:?}; its log:\n{}",
                self.log_tail(60)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// GET on the HTTP port; `None` when it cannot be reached.
    pub fn try_get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http, path).ok()
    }

    /// GET on the HTTP port that must answer 200; the body.
    pub fn get(&self, path: &str) -> String {
        let (status, body) = self.try_get(path).unwrap_or_else(|| {
            panic!(
                "istiod GET {path}: unreachable; log:\n{}",
                self.log_tail(30)
            )
        });
        assert_eq!(status, 200, "istiod GET {path}: {body}");
        body
    }

    /// A debug endpoint (`/debug/configz`, `/debug/registryz`, `/debug/endpointShardz`) as JSON.
    pub fn debug(&self, what: &str) -> serde_json::Value {
        let body = self.get(&format!("/debug/{what}"));
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("/debug/{what} is not JSON ({e}): {}", tail(&body, 20)))
    }

    /// What istiod logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("istiod.log")).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log(), lines)
    }
}

impl Drop for Istiod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
