//! What the soak does to a registry: a model of what it was told to hold (bounded: 5-20
//! services of 1-5 instances each, so a long run oscillates around one size), random operations
//! on it, and per registry a driver that writes each change the way that registry's clients do
//! and reads back what the registry itself holds (the truth the views are compared with).
//! Drivers of the registries run as JVMs (Eureka, Nacos) and ZooKeeper's are in
//! [`super::jvm_drivers`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use serde_json::{json, Value};

use super::Rng;
use crate::consul::Registration;
use crate::kube::{not_ready, ready, service as kube_service, slice, slices_path};
use crate::registries::{ConsulRegistry, FileRegistry, KubeRegistry, Registry};

/// Every service of the soak listens on this port (one outbound listener in the sidecar: no
/// capture, so it binds 127.0.0.1:PORT), chosen away from other tests' ports.
pub const PORT: u16 = 18473;

/// Services per registry: never fewer (a removal waits), never more (an addition waits).
pub const SERVICES: (usize, usize) = (5, 20);
/// Instances per service.
pub const INSTANCES: (usize, usize) = (1, 5);

/// Host -> its healthy endpoints (`ip:port`), as a registry holds them or as a view shows them.
pub type Truth = BTreeMap<String, BTreeSet<String>>;

/// One instance as the model holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    /// Its address (unique in the run: never reused, so a stale endpoint is never mistaken for
    /// a new one).
    pub ip: Ipv4Addr,
    /// Passing, UP, ready, enabled.
    pub healthy: bool,
}

/// One service as the model holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Svc {
    /// Instances by id.
    pub insts: BTreeMap<String, Inst>,
    /// Its metadata generation: a "change" bumps it, written as the `version` label or
    /// metadata of every instance (and the Kubernetes Service's labels).
    pub version: u32,
}

impl Svc {
    /// The `version` label value.
    pub fn version_label(&self) -> String {
        format!("v{}", self.version)
    }
}

/// What a registry was told to hold.
#[derive(Debug, Default)]
pub struct Model {
    /// Services by name.
    pub services: BTreeMap<String, Svc>,
    /// Second octet of this registry's addresses (10.N.x.y).
    net: u8,
    /// Addresses handed out so far.
    next_ip: u32,
}

/// The operations the driver performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    /// A service with 1-3 instances.
    AddService,
    /// A service's metadata (every instance's `version`) changed.
    ChangeService,
    /// A service and all its instances removed.
    RemoveService,
    /// An instance added to a service.
    AddInstance,
    /// An instance removed from a service.
    RemoveInstance,
    /// An instance's health flipped.
    FlipHealth,
}

impl OpKind {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::AddService => "add_service",
            OpKind::ChangeService => "change_service",
            OpKind::RemoveService => "remove_service",
            OpKind::AddInstance => "add_instance",
            OpKind::RemoveInstance => "remove_instance",
            OpKind::FlipHealth => "flip_health",
        }
    }
}

/// One change, for the driver to write: service `svc`, before and after, and the one
/// instance that changed (`None`: the service as a whole).
pub struct Edit<'a> {
    /// The service's name.
    pub svc: &'a str,
    /// The service before (`None`: it is new).
    pub before: Option<&'a Svc>,
    /// The service after (`None`: it is removed).
    pub after: Option<&'a Svc>,
    /// The instance that changed, when only one did (only while the service stays: a removed
    /// service is a change of the whole).
    pub inst: Option<&'a str>,
}

impl Edit<'_> {
    /// The instances the edit touches: the one that changed, or every instance of the service
    /// (after the edit, or before it when the service is removed).
    pub fn ids(&self) -> Vec<String> {
        match self.inst {
            Some(id) => vec![id.to_string()],
            None => self
                .after
                .or(self.before)
                .map(|s| s.insts.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

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

impl Model {
    /// An empty model whose addresses are 10.`net`.x.y.
    pub fn new(net: u8) -> Model {
        Model {
            net,
            ..Model::default()
        }
    }

    fn new_inst(&mut self, rng: &mut Rng) -> (String, Inst) {
        let n = self.next_ip;
        self.next_ip += 1;
        let ip = Ipv4Addr::new(10, self.net, (n / 250 % 250) as u8, (n % 250 + 1) as u8);
        let id = format!("i{n}");
        let healthy = rng.chance(0.8);
        (id, Inst { ip, healthy })
    }

    /// Picks an operation the bounds allow, applies it to the model and has `driver` write
    /// it. Its kind.
    pub fn step(&mut self, rng: &mut Rng, driver: &mut dyn Driver) -> OpKind {
        let n = self.services.len();
        let growable: Vec<String> = self.names(|s| s.insts.len() < INSTANCES.1);
        let shrinkable: Vec<String> = self.names(|s| s.insts.len() > INSTANCES.0);
        let mut choices: Vec<(OpKind, u32)> = vec![(OpKind::ChangeService, 2)];
        if n < SERVICES.1 {
            choices.push((OpKind::AddService, if n < SERVICES.0 { 100 } else { 2 }));
        }
        if n > SERVICES.0 {
            choices.push((OpKind::RemoveService, 2));
        }
        if !growable.is_empty() {
            choices.push((OpKind::AddInstance, 3));
        }
        if !shrinkable.is_empty() {
            choices.push((OpKind::RemoveInstance, 3));
        }
        if n > 0 {
            choices.push((OpKind::FlipHealth, 4));
        }
        let total: u32 = choices.iter().map(|c| c.1).sum();
        let mut roll = rng.below(total as usize) as u32;
        let kind = choices
            .iter()
            .find(|(_, w)| {
                if roll < *w {
                    true
                } else {
                    roll -= w;
                    false
                }
            })
            .map_or(OpKind::ChangeService, |c| c.0);
        let kind = if n == 0 { OpKind::AddService } else { kind };
        match kind {
            OpKind::AddService => {
                let free: Vec<String> = (0..SERVICES.1 * 2)
                    .map(|i| format!("svc-{i:02}"))
                    .filter(|s| !self.services.contains_key(s))
                    .collect();
                let name = rng.pick(&free).clone();
                let mut svc = Svc::default();
                for _ in 0..1 + rng.below(3) {
                    let (id, inst) = self.new_inst(rng);
                    svc.insts.insert(id, inst);
                }
                self.services.insert(name.clone(), svc);
                self.write(driver, &name, None, None);
            }
            OpKind::ChangeService => {
                let name = self.pick_service(rng, |_| true);
                let before = self.services[&name].clone();
                if let Some(s) = self.services.get_mut(&name) {
                    s.version += 1;
                }
                self.write(driver, &name, Some(before), None);
            }
            OpKind::RemoveService => {
                let name = self.pick_service(rng, |_| true);
                let before = self.services.remove(&name);
                self.write(driver, &name, before, None);
            }
            OpKind::AddInstance => {
                let name = rng.pick(&growable).clone();
                let before = self.services[&name].clone();
                let (id, inst) = self.new_inst(rng);
                if let Some(s) = self.services.get_mut(&name) {
                    s.insts.insert(id.clone(), inst);
                }
                self.write(driver, &name, Some(before), Some(&id));
            }
            OpKind::RemoveInstance => {
                let name = rng.pick(&shrinkable).clone();
                let before = self.services[&name].clone();
                let ids: Vec<String> = before.insts.keys().cloned().collect();
                let id = rng.pick(&ids).clone();
                if let Some(s) = self.services.get_mut(&name) {
                    s.insts.remove(&id);
                }
                self.write(driver, &name, Some(before), Some(&id));
            }
            OpKind::FlipHealth => {
                let name = self.pick_service(rng, |_| true);
                let before = self.services[&name].clone();
                let ids: Vec<String> = before.insts.keys().cloned().collect();
                let id = rng.pick(&ids).clone();
                if let Some(i) = self
                    .services
                    .get_mut(&name)
                    .and_then(|s| s.insts.get_mut(&id))
                {
                    i.healthy = !i.healthy;
                }
                self.write(driver, &name, Some(before), Some(&id));
            }
        }
        kind
    }

    /// Every instance: its service's name, the service, its id.
    pub fn instances(&self) -> impl Iterator<Item = (&str, &Svc, &str)> {
        self.services.iter().flat_map(|(name, s)| {
            s.insts
                .keys()
                .map(move |id| (name.as_str(), s, id.as_str()))
        })
    }

    fn names(&self, keep: impl Fn(&Svc) -> bool) -> Vec<String> {
        self.services
            .iter()
            .filter(|(_, s)| keep(s))
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn pick_service(&self, rng: &mut Rng, keep: impl Fn(&Svc) -> bool) -> String {
        rng.pick(&self.names(keep)).clone()
    }

    fn write(&self, driver: &mut dyn Driver, svc: &str, before: Option<Svc>, inst: Option<&str>) {
        driver.apply(
            self,
            &Edit {
                svc,
                before: before.as_ref(),
                after: self.services.get(svc),
                inst,
            },
        );
    }

    /// What the registry should hold by the driver's own account, as a [`Truth`] (hosts named
    /// by `registry`): compared with the registry's truth, it tells a registry that lost writes
    /// (or a driver bug) from an adapter that lost them.
    pub fn expected(&self, registry: &dyn Registry) -> Truth {
        self.services
            .iter()
            .map(|(name, s)| {
                let eps = s
                    .insts
                    .values()
                    .filter(|i| i.healthy)
                    .map(|i| format!("{}:{PORT}", i.ip))
                    .collect();
                (registry.host(name), eps)
            })
            .collect()
    }
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
