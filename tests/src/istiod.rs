//! Istio's real, unmodified istiod (`pilot-discovery`, built from the Go module proxy by
//! `tests/go-peers/build.sh target` into `target/istio`, or `$PILOT_DISCOVERY`) as a plain
//! process on loopback, reading the adapters through `configSources: xds://...` and a test
//! Kubernetes API server (istiod needs a Kubernetes client even with only `xds://` sources).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::kube::KubeApiServer;
use crate::{free_addr, http_get, peer_file, tail, Process};

/// The pilot-discovery binary: `$PILOT_DISCOVERY` (a full path), else `target/istio/pilot-discovery`.
pub fn pilot_discovery_bin() -> PathBuf {
    peer_file(
        "PILOT_DISCOVERY",
        "istio/pilot-discovery",
        "tests/go-peers/build.sh target",
    )
}

/// A running istiod, killed on drop.
pub struct Istiod {
    process: Process,
    /// HTTP address (`/ready`, `/debug/*`).
    pub http: SocketAddr,
    /// Plaintext xDS address.
    pub grpc: SocketAddr,
    /// How it was started, to start it again ([`Istiod::restart`]).
    launch: Launch,
    /// The directory of its mesh config and log, when it is a temporary one of its own.
    _dir: Option<tempfile::TempDir>,
}

/// What istiod is started with besides its HTTP and xDS ports.
struct Launch {
    secure: SocketAddr,
    https: SocketAddr,
    mesh_path: PathBuf,
    kubeconfig: PathBuf,
    config: IstiodConfig,
}

/// How istiod is configured.
#[derive(Clone, Debug, Default)]
pub struct IstiodConfig {
    /// `k8s://` first in `configSources`, as production runs it: istiod then also reads Istio's
    /// CRDs (DestinationRule, VirtualService, PeerAuthentication, ServiceEntry, ...) from the
    /// API server, which must have them ([`apply_istio_crds`]).
    pub k8s_first: bool,
    /// The settings under which a stock Envoy (not Istio's proxy build) accepts what istiod
    /// sends: no Istio-only ALPN and metadata-exchange filters, no telemetry filters, and no
    /// auto mTLS (whose SDS secrets only istio-agent serves). Access logs on (Envoy's log).
    pub stock_envoy: bool,
    /// Istio ambient on (`PILOT_ENABLE_AMBIENT=true`): istiod then serves ztunnel clients its
    /// ambient index ([`crate::ztunnel`]). That index is built from the API server only, so it
    /// needs `k8s://` among the sources ([`IstiodConfig::k8s_first`], Istio's CRDs applied);
    /// see [`IstiodConfig::ambient()`].
    pub ambient: bool,
    /// More environment variables (`PILOT_DEBOUNCE_AFTER=...`).
    pub env: Vec<(String, String)>,
}

impl IstiodConfig {
    /// Production's shape for a stock Envoy: `k8s://` first, then the adapters.
    pub fn production() -> IstiodConfig {
        IstiodConfig {
            k8s_first: true,
            stock_envoy: true,
            ambient: false,
            env: Vec::new(),
        }
    }

    /// Istio ambient's control plane: `k8s://` first, then the adapters, with
    /// `PILOT_ENABLE_AMBIENT=true` (ztunnel clients are refused without it).
    pub fn ambient() -> IstiodConfig {
        IstiodConfig {
            k8s_first: true,
            ambient: true,
            ..IstiodConfig::default()
        }
    }

    /// The mesh config file for `sources`.
    fn mesh_yaml(&self, sources: &[SocketAddr]) -> String {
        // Quoted: an unparsable mesh file is only a warning, and istiod then runs with no
        // sources while looking healthy.
        let mut mesh = String::new();
        if self.stock_envoy {
            mesh.push_str(
                "enableAutoMtls: false\ndefaultProviders:\n  metrics: []\naccessLogFile: \"/dev/stdout\"\n",
            );
        }
        mesh.push_str("configSources:\n");
        if self.k8s_first {
            mesh.push_str("- address: \"k8s://\"\n");
        }
        for s in sources {
            mesh.push_str(&format!("- address: \"xds://{s}\"\n"));
        }
        mesh
    }
}

impl Istiod {
    /// Writes `mesh.yaml` with one `xds://` config source per address in `sources` (and no
    /// `k8s://`: the API server needs no Istio CRDs), starts `pilot-discovery discovery` against
    /// the API server of `kubeconfig` (whose namespace `istio-system` must exist) and waits up
    /// to 120 s for `/ready` 200.
    pub fn start(sources: &[SocketAddr], kubeconfig: &Path) -> Istiod {
        Self::start_with(sources, kubeconfig, &IstiodConfig::default())
    }

    /// [`Istiod::start`] configured by `config`.
    pub fn start_with(sources: &[SocketAddr], kubeconfig: &Path, config: &IstiodConfig) -> Istiod {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut istiod = Self::spawn_in(sources, kubeconfig, config, dir.path());
        istiod._dir = Some(dir);
        istiod.wait_until(Duration::from_secs(120), "/ready 200", || {
            istiod.try_get("/ready").is_some_and(|(s, _)| s == 200)
        });
        istiod
    }

    /// Starts istiod as [`Istiod::start_with`] does, in a temporary directory of its own, without
    /// waiting for it: for a test that expects it never to become ready, or to exit.
    pub fn spawn(sources: &[SocketAddr], kubeconfig: &Path, config: &IstiodConfig) -> Istiod {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut istiod = Self::spawn_in(sources, kubeconfig, config, dir.path());
        istiod._dir = Some(dir);
        istiod
    }

    /// Writes `mesh.yaml` into `dir` and starts istiod with its log in `dir/istiod.log`,
    /// without waiting for it (benches that wait longer, or time the start themselves).
    pub fn spawn_in(
        sources: &[SocketAddr],
        kubeconfig: &Path,
        config: &IstiodConfig,
        dir: &Path,
    ) -> Istiod {
        let mesh_path = dir.join("mesh.yaml");
        std::fs::write(&mesh_path, config.mesh_yaml(sources)).expect("write mesh.yaml");
        let istiod = Istiod {
            process: Process::new("istiod", dir, Duration::from_millis(200)),
            http: free_addr(),
            grpc: free_addr(),
            launch: Launch {
                secure: free_addr(),
                https: free_addr(),
                mesh_path,
                kubeconfig: kubeconfig.to_path_buf(),
                config: config.clone(),
            },
            _dir: None,
        };
        istiod.launch();
        istiod
    }

    /// Starts the process with what [`Istiod::spawn_in`] chose (its ports among it).
    fn launch(&self) {
        let l = &self.launch;
        let mut cmd = Command::new(pilot_discovery_bin());
        cmd.arg("discovery")
            .arg("--meshConfig")
            .arg(&l.mesh_path)
            .arg("--registries=Kubernetes")
            .arg("--kubeconfig")
            .arg(&l.kubeconfig)
            .arg(format!("--httpAddr={}", self.http))
            .arg(format!("--grpcAddr={}", self.grpc))
            .arg(format!("--secureGRPCAddr={}", l.secure))
            .arg(format!("--httpsAddr={}", l.https))
            // Metrics and debug on the HTTP port; no ControlZ.
            .arg("--monitoringAddr=")
            .arg("--ctrlz_port=0")
            .arg("--shutdownDuration=1s")
            .env("POD_NAMESPACE", "istio-system")
            .env("POD_NAME", "istiod-test")
            .env("REVISION", "default");
        if l.config.stock_envoy {
            cmd.env("PILOT_ENABLE_ALPN_FILTER", "false")
                .env("PILOT_ENABLE_METADATA_EXCHANGE", "false");
        }
        if l.config.ambient {
            cmd.env("PILOT_ENABLE_AMBIENT", "true");
        }
        self.process
            .spawn(cmd.envs(l.config.env.iter().map(|(k, v)| (k, v))));
    }

    /// Kills istiod (SIGKILL, as when its node dies); [`Istiod::restart`] starts it again.
    pub fn kill(&self) {
        self.process.kill();
    }

    /// Kills istiod (SIGKILL, as when its node dies) and starts it again on the same ports and
    /// configuration, so that its clients (Envoy's bootstrap names one address) reconnect to
    /// the new one; waits up to 120 s for `/ready` 200.
    pub fn restart(&mut self) {
        self.process.kill();
        self.launch();
        self.wait_until(
            Duration::from_secs(120),
            "/ready 200 after a restart",
            || self.try_get("/ready").is_some_and(|(s, _)| s == 200),
        );
    }

    /// Waits (panicking with the log if istiod exits or `timeout` passes) until `ready` holds.
    pub fn wait_until(&self, timeout: Duration, what: &str, ready: impl FnMut() -> bool) {
        self.process.wait_until(timeout, what, ready);
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Whether the process has ended. It is our child and is reaped only on drop, so until then
    /// an ended istiod is a zombie (`Z` in `/proc/PID/stat`), which this reads.
    pub fn has_exited(&self) -> bool {
        let Some(pid) = self.pid() else {
            return true;
        };
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // `PID (COMM) STATE ...`: the state follows the last `)` (COMM may hold one).
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
            Err(_) => true,
        }
    }

    /// Where its log is written.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
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

    /// Sum of a metric's samples on istiod's /metrics (0 when absent), e.g. `pilot_xds_pushes`.
    pub fn metric(&self, name: &str) -> f64 {
        crate::metric_sum(&self.get("/metrics"), name)
    }

    /// What istiod logged so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// The ServiceEntries in istiod's `/debug/configz`. Asserts first that Istio's own validation
/// (`crate::istio_validate`) accepts each one an adapter made (labelled
/// `mcp-adapter/registry`): entries a test applied itself may be odd on purpose.
pub fn configz_entries(configz: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    let entries = || {
        configz
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["kind"] == "ServiceEntry")
    };
    for c in entries().filter(|c| {
        c["metadata"]["labels"]
            .get(mcp_core::translate::LABEL_REGISTRY)
            .is_some()
    }) {
        crate::istio_validate::assert_valid_json(
            "istiod /debug/configz",
            c["metadata"]["name"].as_str().unwrap_or(""),
            c["metadata"]["namespace"].as_str().unwrap_or(""),
            &c["spec"],
        );
    }
    entries()
}

/// `namespace/name` of every ServiceEntry in istiod's `/debug/configz`, sorted (a name that two
/// `xds://` sources both serve is listed once: seen in `tests/tests/istiod_traps.rs`).
pub fn configz_service_entries(configz: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = configz_entries(configz).map(crate::ns_name).collect();
    v.sort();
    v
}

/// The registries (`Kubernetes`, `External`, ...) istiod's `/debug/registryz` names for `host`
/// in `namespace`.
pub fn registries_of(registryz: &serde_json::Value, host: &str, namespace: &str) -> Vec<String> {
    registryz
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["hostname"] == host && s["Attributes"]["Namespace"] == namespace)
        .filter_map(|s| s["Attributes"]["ServiceRegistry"].as_str())
        .map(str::to_string)
        .collect()
}

/// Istio's CRDs (`manifests/charts/base/files/crd-all.gen.yaml` of the Istio module that
/// pilot-discovery is built from; `tests/go-peers/build.sh` copies it beside the binary).
pub fn istio_crds() -> PathBuf {
    let file = pilot_discovery_bin()
        .parent()
        .map(|d| d.join("crd-all.gen.yaml"))
        .unwrap_or_default();
    assert!(
        file.exists(),
        "{} missing: tests/go-peers/build.sh target copies it from the pinned Istio module",
        file.display()
    );
    file
}

/// Applies Istio's CRDs to `kube` and waits until the API server serves every Istio group
/// version that istiod reads through `k8s://`.
pub fn apply_istio_crds(kube: &KubeApiServer) {
    kube.apply_manifest(&istio_crds(), |_| ());
    for (group_version, resource) in [
        ("networking.istio.io/v1", "serviceentries"),
        ("networking.istio.io/v1", "destinationrules"),
        ("networking.istio.io/v1", "virtualservices"),
        ("networking.istio.io/v1alpha3", "envoyfilters"),
        ("security.istio.io/v1", "peerauthentications"),
        ("telemetry.istio.io/v1", "telemetries"),
    ] {
        crate::wait_for(
            Duration::from_secs(60),
            &format!("the API server serves {group_version} {resource}"),
            || {
                kube.get(&format!("/apis/{group_version}"))
                    .filter(|v| {
                        v["resources"]
                            .as_array()
                            .is_some_and(|r| r.iter().any(|x| x["name"] == resource))
                    })
                    .map(|_| ())
            },
        );
    }
}
