//! Per registry a driver that writes each change of the model ([`super::model`]) the way that
//! registry's clients do and reads back what the registry itself holds (the truth the views are
//! compared with).
//! Drivers of the registries run as JVMs (Eureka, Nacos) and ZooKeeper's are in
//! [`super::jvm_drivers`].

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::model::{Edit, Model, Svc, Truth, PORT};
use crate::consul::Registration;
use crate::kube::{not_ready, ready, service as kube_service, slice, slices_path};
use crate::registries::{ConsulRegistry, FileRegistry, KubeRegistry, Registry};

/// The two [`Driver`] methods that hand out the harness' registry, for a driver that keeps it
/// in its `reg` field (every driver does; a trait method cannot name a field).
macro_rules! registry_in_reg {
    () => {
        fn registry(&self) -> &dyn $crate::registries::Registry {
            &self.reg
        }
        fn registry_mut(&mut self) -> &mut dyn $crate::registries::Registry {
            &mut self.reg
        }
    };
}
pub(crate) use registry_in_reg;

/// A registry the soak drives: the harness' registry (its adapter, its naming) plus how to
/// write changes and read the truth back.
pub trait Driver: Send {
    /// The harness' registry (the adapter, the hosts).
    fn registry(&self) -> &dyn Registry;
    /// The same, to restart the adapter.
    fn registry_mut(&mut self) -> &mut dyn Registry;
    /// Writes `edit`; `model` is the state after it.
    fn apply(&mut self, model: &Model, edit: &Edit<'_>);
    /// What the registry itself holds, translated by the adapter's rules: host -> healthy
    /// `ip:port`, every service the adapter serves listed (with no endpoints when none is
    /// healthy).
    fn truth(&mut self) -> Result<Truth, String>;
    /// The registry's address the adapter connects to, when a cut proxy can sit in between
    /// (by default none can).
    fn upstream(&self) -> Option<SocketAddr> {
        None
    }
    /// The adapter's arguments with the registry reached through `via` instead (asked only of
    /// a driver with an [`upstream`](Driver::upstream)).
    fn args_via(&mut self, _via: SocketAddr) -> Vec<String> {
        Vec::new()
    }
    /// Restarts the registry (same ports) and writes `model` again where the restart lost it,
    /// as that registry's clients do; false (the default) when the driver does not restart its
    /// registry.
    fn restart_registry(&mut self, _model: &Model) -> bool {
        false
    }
    /// Called between operations: keep-alives a registry needs from its clients.
    fn tick(&mut self, _model: &Model) {}
}

/// adapter-file: the inventory rewritten whole (atomically) at every change; files know no
/// health, so an unhealthy instance is left out of the file (the harness' rule).
pub struct FileDriver {
    /// The harness' registry.
    pub reg: FileRegistry,
}

impl FileDriver {
    fn inventory(&self) -> PathBuf {
        self.reg.dir().join("inventory.yaml")
    }
}

impl Driver for FileDriver {
    registry_in_reg!();
    fn apply(&mut self, model: &Model, _edit: &Edit<'_>) {
        let services: Vec<Value> = model
            .services
            .iter()
            .map(|(name, s)| {
                json!({
                    "name": name,
                    "hosts": [self.reg.host(name)],
                    "ports": {"http": PORT},
                    "endpoints": s.insts.values().filter(|i| i.healthy).map(|i| {
                        json!({"address": i.ip.to_string(), "labels": {"version": s.version_label()}})
                    }).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = json!({
            "apiVersion": "mcp-adapter/v1", "kind": "Inventory",
            "namespace": self.reg.namespace(), "services": services,
        });
        self.reg.write_file("inventory.yaml", &doc.to_string());
    }
    fn truth(&mut self) -> Result<Truth, String> {
        let text = std::fs::read_to_string(self.inventory()).map_err(|e| e.to_string())?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let mut out = Truth::new();
        for s in doc["services"].as_array().into_iter().flatten() {
            let port = s["ports"]["http"].as_u64().unwrap_or(0);
            let eps: BTreeSet<String> = s["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["address"].as_str())
                .map(|a| format!("{a}:{port}"))
                .collect();
            for h in s["hosts"].as_array().into_iter().flatten() {
                out.insert(h.as_str().unwrap_or("?").to_string(), eps.clone());
            }
        }
        Ok(out)
    }
}

/// adapter-consul: instances registered through the catalog on node `n1`, each with one check
/// (passing or critical), `version` in the service meta.
pub struct ConsulDriver {
    /// The harness' registry.
    pub reg: ConsulRegistry,
}

impl ConsulDriver {
    /// Registers instance `id` of `svc` as `s` holds it; deregisters it where `s` (`None`: the
    /// service removed) has no such instance.
    fn register(&self, svc: &str, s: Option<&Svc>, id: &str) {
        let Some((s, i)) = s.and_then(|s| Some((s, s.insts.get(id)?))) else {
            self.reg.consul.deregister("n1", id);
            return;
        };
        let r = Registration::new("n1", svc, id, &i.ip.to_string(), PORT)
            .protocol("http")
            .meta("version", &s.version_label())
            .status(if i.healthy { "passing" } else { "critical" });
        self.reg.consul.register(&r);
    }
}

impl Driver for ConsulDriver {
    registry_in_reg!();
    fn apply(&mut self, _model: &Model, e: &Edit<'_>) {
        for id in e.ids() {
            self.register(e.svc, e.after, &id);
        }
    }
    fn truth(&mut self) -> Result<Truth, String> {
        let get = |path: &str| -> Result<Value, String> {
            let (status, body) = self
                .reg
                .consul
                .request("GET", path, "")
                .map_err(|e| e.to_string())?;
            if status != 200 {
                return Err(format!("GET {path}: {status} {body}"));
            }
            serde_json::from_str(&body).map_err(|e| e.to_string())
        };
        let mut out = Truth::new();
        let services = get("/v1/catalog/services")?;
        for name in services.as_object().into_iter().flatten().map(|(k, _)| k) {
            // The adapter runs with `--exclude-service consul`.
            if name == "consul" {
                continue;
            }
            let entries = get(&format!("/v1/health/service/{name}"))?;
            let mut eps = BTreeSet::new();
            for e in entries.as_array().into_iter().flatten() {
                // The adapter's rule: the worst check decides; critical is no endpoint.
                let passing = e["Checks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|c| c["Status"] != "critical");
                if passing {
                    let s = &e["Service"];
                    eps.insert(format!(
                        "{}:{}",
                        s["Address"].as_str().unwrap_or("?"),
                        s["Port"]
                    ));
                }
            }
            out.insert(self.reg.host(name), eps);
        }
        Ok(out)
    }
    fn upstream(&self) -> Option<SocketAddr> {
        self.reg
            .consul
            .addr()
            .trim_start_matches("http://")
            .parse()
            .ok()
    }
    fn args_via(&mut self, via: SocketAddr) -> Vec<String> {
        [
            "--consul-addr",
            &format!("http://{via}"),
            "--exclude-service",
            "consul",
        ]
        .map(str::to_string)
        .to_vec()
    }
    fn restart_registry(&mut self, model: &Model) -> bool {
        // Dev mode keeps nothing: the agent comes back empty, and the services are registered
        // again, as an agent's anti-entropy would from its service definitions.
        self.reg.consul.restart();
        for (name, s, id) in model.instances() {
            self.register(name, Some(s), id);
        }
        true
    }
}

/// adapter-kube: each service a selector-less Service in `store` (its `version` label bumped at
/// every change) with one EndpointSlice rewritten at every change, as the EndpointSlice
/// controller does; an unhealthy instance is a not-ready endpoint.
pub struct KubeDriver {
    /// The harness' registry.
    pub reg: KubeRegistry,
    /// Where the kubeconfig through the cut proxy is written.
    dir: tempfile::TempDir,
}

impl KubeDriver {
    /// Drives `reg`.
    pub fn new(reg: KubeRegistry) -> KubeDriver {
        KubeDriver {
            reg,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn write_slice(&self, svc: &str, s: &Svc) {
        let endpoints = s
            .insts
            .values()
            .map(|i| {
                if i.healthy {
                    ready(&i.ip.to_string())
                } else {
                    not_ready(&i.ip.to_string())
                }
            })
            .collect();
        self.reg.kube.apply_slice(&slice(
            "store",
            &format!("{svc}-1"),
            svc,
            "IPv4",
            &[("http", PORT)],
            endpoints,
        ));
    }
}

impl Driver for KubeDriver {
    registry_in_reg!();
    fn apply(&mut self, _model: &Model, e: &Edit<'_>) {
        let Some(s) = e.after else {
            self.reg
                .kube
                .delete(&format!("{}/{}-1", slices_path("store"), e.svc));
            self.reg
                .kube
                .delete(&format!("/api/v1/namespaces/store/services/{}", e.svc));
            return;
        };
        if e.inst.is_none() {
            let mut svc = kube_service("store", e.svc, &[("http", PORT, PORT)]);
            svc["metadata"]["labels"] = json!({"version": s.version_label()});
            self.reg.kube.apply_service(&svc);
        }
        self.write_slice(e.svc, s);
    }
    fn truth(&mut self) -> Result<Truth, String> {
        let kube = &self.reg.kube;
        let services = kube
            .get("/api/v1/namespaces/store/services")
            .ok_or("no services list")?;
        let slices = kube.get(&slices_path("store")).ok_or("no slices list")?;
        let mut out = Truth::new();
        for s in services["items"].as_array().into_iter().flatten() {
            let name = s["metadata"]["name"].as_str().unwrap_or("?");
            out.insert(self.reg.host(name), BTreeSet::new());
        }
        for sl in slices["items"].as_array().into_iter().flatten() {
            let svc = sl["metadata"]["labels"]["kubernetes.io/service-name"]
                .as_str()
                .unwrap_or("?");
            let Some(eps) = out.get_mut(&self.reg.host(svc)) else {
                continue;
            };
            let port = sl["ports"][0]["port"].as_u64().unwrap_or(0);
            for e in sl["endpoints"].as_array().into_iter().flatten() {
                // The adapter's rule (Istio's): ready endpoints only; an absent condition is
                // ready.
                if e["conditions"]["ready"] == false {
                    continue;
                }
                for a in e["addresses"].as_array().into_iter().flatten() {
                    eps.insert(format!("{}:{port}", a.as_str().unwrap_or("?")));
                }
            }
        }
        Ok(out)
    }
    fn upstream(&self) -> Option<SocketAddr> {
        self.reg
            .kube
            .url()
            .trim_start_matches("https://")
            .parse()
            .ok()
    }
    fn args_via(&mut self, via: SocketAddr) -> Vec<String> {
        // The same kubeconfig with the server's address replaced: the serving certificate
        // names 127.0.0.1, whatever the port.
        let original = std::fs::read_to_string(self.reg.kube.kubeconfig()).expect("kubeconfig");
        let path = self.dir.path().join("kubeconfig-via-proxy");
        std::fs::write(
            &path,
            original.replace(&self.reg.kube.url(), &format!("https://{via}")),
        )
        .expect("write kubeconfig");
        vec![
            "--kubeconfig".into(),
            path.display().to_string(),
            "--read-pods".into(),
        ]
    }
    fn restart_registry(&mut self, _model: &Model) -> bool {
        // The API server keeps its data (etcd's directory): nothing to write again.
        self.reg.kube.restart();
        true
    }
}
