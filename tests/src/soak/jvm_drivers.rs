//! The soak's drivers of ZooKeeper, Eureka and Nacos (see [`super::drivers`] for the model and
//! the other three).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::drivers::{registry_in_reg, Driver};
use super::model::{Edit, Model, Svc, Truth, PORT};
use crate::nacos::{Instance as NacosInstance, DEFAULT_GROUP};
use crate::registries::{
    curator_instance, EurekaRegistry, Instance, NacosRegistry, Registry, ZkRegistry,
};

/// The harness' instance (what [`curator_instance`] and the other writers take) of `id` as `s`
/// holds it (`None`: `s` has no such instance, or the service is removed).
fn instance(s: Option<&Svc>, id: &str) -> Option<Instance> {
    let s = s?;
    let i = s.insts.get(id)?;
    Some(Instance {
        id: id.to_string(),
        addr: SocketAddr::new(IpAddr::V4(i.ip), PORT),
        version: Some(s.version_label()),
        healthy: i.healthy,
    })
}

/// adapter-zookeeper: Spring Cloud Zookeeper (Curator) instances, ephemeral znodes of the
/// writer's session under `/services/{service}`; an unhealthy instance is `OUT_OF_SERVICE`.
/// A removed service's directory is deleted with it.
pub struct ZkDriver {
    /// The harness' registry.
    pub reg: ZkRegistry,
}

impl ZkDriver {
    /// Writes instance `id` of `svc` as `s` holds it; deletes it where `s` (`None`: the service
    /// removed) has no such instance.
    fn put(&mut self, svc: &str, s: Option<&Svc>, id: &str) {
        let path = format!("/services/{svc}/{id}");
        match instance(s, id) {
            Some(i) => {
                let data = curator_instance(svc, &i);
                self.reg.writer.create_e(&path, &data);
            }
            None => self.reg.writer.delete(&path),
        }
    }
}

impl Driver for ZkDriver {
    registry_in_reg!();
    fn apply(&mut self, _model: &Model, e: &Edit<'_>) {
        for id in e.ids() {
            self.put(e.svc, e.after, &id);
        }
        if e.after.is_none() {
            self.reg.writer.delete(&format!("/services/{}", e.svc));
        }
    }
    fn truth(&mut self) -> Result<Truth, String> {
        let tree = self.reg.writer.tree("/services")?;
        let mut out = Truth::new();
        for (svc, insts) in tree.as_object().into_iter().flatten() {
            let insts = insts.as_object().cloned().unwrap_or_default();
            // A directory without instances is no service.
            if insts.is_empty() {
                continue;
            }
            let mut eps = BTreeSet::new();
            for data in insts.values() {
                let v: Value = serde_json::from_str(data.as_str().unwrap_or(""))
                    .map_err(|e| format!("{svc}: {e}"))?;
                // The adapter's rule: an instance_status other than UP is no endpoint.
                let status = v["payload"]["metadata"]["instance_status"]
                    .as_str()
                    .unwrap_or("UP");
                if status.eq_ignore_ascii_case("UP") {
                    eps.insert(format!(
                        "{}:{}",
                        v["address"].as_str().unwrap_or("?"),
                        v["port"]
                    ));
                }
            }
            out.insert(self.reg.host(svc), eps);
        }
        Ok(out)
    }
    fn upstream(&self) -> Option<SocketAddr> {
        self.reg.zk.servers().parse().ok()
    }
    fn args_via(&mut self, via: SocketAddr) -> Vec<String> {
        vec!["--zk-servers".into(), via.to_string()]
    }
    fn restart_registry(&mut self, _model: &Model) -> bool {
        // Data and sessions outlive the restart (the writer's session times out after 30 s):
        // nothing to write again once the writer's client has reconnected.
        self.reg.zk.restart();
        crate::wait_for(
            Duration::from_secs(30),
            "the zk-writer's session back after the restart",
            || self.reg.writer.tree("/services").ok(),
        );
        true
    }
}

/// adapter-eureka: instances registered as Eureka clients do (`POST /apps/{APP}`), `version`
/// in the metadata, an unhealthy one registered `DOWN`; heartbeats every 20 s (a client's are
/// every 30 s; the server evicts after 90 s without), and a 404 to one (a restarted server)
/// answered by registering again, as clients do.
pub struct EurekaDriver {
    /// The harness' registry.
    pub reg: EurekaRegistry,
    last_beat: Instant,
}

impl EurekaDriver {
    /// Drives `reg`.
    pub fn new(reg: EurekaRegistry) -> EurekaDriver {
        EurekaDriver {
            reg,
            last_beat: Instant::now(),
        }
    }

    /// Registers instance `id` of `svc` as `s` holds it; deregisters it where `s` (`None`: the
    /// service removed) has no such instance.
    fn put(&mut self, svc: &str, s: Option<&Svc>, id: &str) {
        match instance(s, id) {
            Some(i) => self.reg.register(svc, &i),
            None => self.reg.eureka.deregister(svc, id),
        }
    }
}

impl Driver for EurekaDriver {
    registry_in_reg!();
    fn apply(&mut self, _model: &Model, e: &Edit<'_>) {
        for id in e.ids() {
            self.put(e.svc, e.after, &id);
        }
    }
    fn truth(&mut self) -> Result<Truth, String> {
        let apps = self.reg.eureka.apps();
        let mut out = Truth::new();
        for app in as_list(&apps["applications"]["application"]) {
            let name = app["name"].as_str().unwrap_or("?").to_lowercase();
            let insts = as_list(&app["instance"]);
            if insts.is_empty() {
                continue;
            }
            let eps = insts
                .iter()
                // The adapter's rule: only UP instances are endpoints.
                .filter(|i| i["status"] == "UP")
                .map(|i| format!("{}:{}", i["ipAddr"].as_str().unwrap_or("?"), i["port"]["$"]))
                .collect();
            out.insert(self.reg.host(&name), eps);
        }
        Ok(out)
    }
    fn upstream(&self) -> Option<SocketAddr> {
        self.reg
            .eureka
            .url()
            .trim_start_matches("http://")
            .trim_end_matches("/eureka")
            .parse()
            .ok()
    }
    fn args_via(&mut self, via: SocketAddr) -> Vec<String> {
        [
            "--eureka-url",
            &format!("http://{via}/eureka"),
            "--refresh-interval",
            "1s",
        ]
        .map(str::to_string)
        .to_vec()
    }
    fn restart_registry(&mut self, model: &Model) -> bool {
        // Eureka keeps nothing on disk: every client registers again (its heartbeat's 404).
        self.reg.eureka.restart();
        self.last_beat = Instant::now() - Duration::from_secs(60);
        self.tick(model);
        true
    }
    fn tick(&mut self, model: &Model) {
        if self.last_beat.elapsed() < Duration::from_secs(20) {
            return;
        }
        self.last_beat = Instant::now();
        for (name, s, id) in model.instances() {
            if self.reg.eureka.heartbeat(name, id) == 404 {
                self.put(name, Some(s), id);
            }
        }
    }
}

/// A JSON list, or a lone object as a list of one (XML-born JSON codecs drop the list).
fn as_list(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

/// adapter-nacos: persistent instances through the HTTP API (group `DEFAULT_GROUP`, namespace
/// `public`), `version` in the metadata; an unhealthy instance is a disabled one (Nacos' clients
/// skip it, and so does the adapter: endpoints are healthy, enabled, weighted instances), as
/// the server's own health checks take 5-15 s to judge. A removed service is deleted.
pub struct NacosDriver {
    /// The harness' registry.
    pub reg: NacosRegistry,
    /// Deletions the server refused (it still counted an instance): tried again later.
    leftover: BTreeSet<String>,
}

impl NacosDriver {
    /// Drives `reg`.
    pub fn new(reg: NacosRegistry) -> NacosDriver {
        NacosDriver {
            reg,
            leftover: BTreeSet::new(),
        }
    }

    /// Instance `id` of `svc` as `s` holds it (`None`: `s` has no such instance, or the service
    /// is removed).
    fn nacos_instance(svc: &str, s: Option<&Svc>, id: &str) -> Option<NacosInstance> {
        let s = s?;
        let i = s.insts.get(id)?;
        Some(
            NacosInstance::new(svc, &i.ip.to_string(), PORT)
                .with_metadata("version", &s.version_label())
                .enabled(i.healthy),
        )
    }

    /// Updates `i` (its enabled flag, its metadata); registers it again where the server no
    /// longer knows it (seen right after a restart: `400 service not found` for a persistent
    /// instance registered before it), as a client whose instance vanished does.
    fn update(&self, i: &NacosInstance) {
        let mut params = vec![
            ("serviceName", i.service.clone()),
            ("groupName", i.group.clone()),
            ("namespaceId", i.namespace.clone()),
            ("ip", i.ip.clone()),
            ("port", i.port.to_string()),
            ("clusterName", i.cluster.clone()),
            ("ephemeral", "false".to_string()),
        ];
        params.extend([
            ("weight", i.weight.to_string()),
            ("enabled", i.enabled.to_string()),
            ("healthy", i.healthy.to_string()),
            ("metadata", i.metadata_json()),
        ]);
        let (status, body) = self.reg.nacos.call("PUT", "/nacos/v1/ns/instance", &params);
        if status != 200 {
            eprintln!("soak: nacos update refused ({status} {body}): registering it again");
            self.reg.nacos.register(i);
        }
    }

    fn delete_service(&mut self, svc: &str) -> bool {
        let params = [
            ("serviceName", svc.to_string()),
            ("groupName", DEFAULT_GROUP.to_string()),
            ("namespaceId", "public".to_string()),
        ];
        let (status, body) = self
            .reg
            .nacos
            .call("DELETE", "/nacos/v1/ns/service", &params);
        status == 200 && body.contains("ok")
    }
}

impl Driver for NacosDriver {
    registry_in_reg!();
    fn apply(&mut self, model: &Model, e: &Edit<'_>) {
        let before = |id: &str| e.before.is_some_and(|b| b.insts.contains_key(id));
        for id in &e.ids() {
            match (Self::nacos_instance(e.svc, e.after, id), before(id)) {
                (Some(i), false) => self.reg.nacos.register(&i),
                (Some(i), true) => self.update(&i),
                (None, _) => {
                    if let Some(old) = Self::nacos_instance(e.svc, e.before, id) {
                        self.reg.nacos.deregister(&old);
                    }
                }
            }
        }
        if e.after.is_none() && !self.delete_service(e.svc) {
            self.leftover.insert(e.svc.to_string());
        }
        // A name added again is the server's service again.
        self.leftover.retain(|s| !model.services.contains_key(s));
    }
    fn truth(&mut self) -> Result<Truth, String> {
        let mut out = Truth::new();
        for name in self.reg.nacos.services(DEFAULT_GROUP, "public") {
            let eps = self
                .reg
                .nacos
                .hosts(&name, DEFAULT_GROUP, "public")
                .iter()
                .filter(|h| {
                    h["healthy"] == true
                        && h["enabled"] == true
                        && h["weight"].as_f64().is_some_and(|w| w > 0.0)
                })
                .map(|h| format!("{}:{}", h["ip"].as_str().unwrap_or("?"), h["port"]))
                .collect();
            out.insert(self.reg.host(&name), eps);
        }
        Ok(out)
    }
    // No `upstream` (the default, none): Nacos' gRPC port is the HTTP port + 1000, which one
    // proxy cannot stand for.
    fn restart_registry(&mut self, model: &Model) -> bool {
        // Persistent instances should survive a restart (Nacos' data directory); what the
        // server lost is said, then registered again, as clients would.
        self.reg.nacos.restart();
        let held = self.truth().unwrap_or_default();
        let expected = model.expected(&self.reg);
        let lost = super::compare::diff(&expected, &held, true);
        if !lost.is_empty() {
            eprintln!(
                "soak: nacos lost after its restart (registered again):\n  {}",
                lost.join("\n  ")
            );
        }
        for (name, s, id) in model.instances() {
            if let Some(i) = Self::nacos_instance(name, Some(s), id) {
                // Nacos 2.4.3 can come back holding a persistent service as an ephemeral one (an
                // hour-long run met it at its second restart): it then refuses persistent
                // instances ("is ephemeral service") until the service is deleted and made anew.
                let (status, body) =
                    self.reg
                        .nacos
                        .call("POST", "/nacos/v1/ns/instance", &i.params());
                if status == 400 && body.contains("is ephemeral service") {
                    eprintln!("soak: nacos holds {name} as ephemeral after its restart: made anew");
                    self.delete_service(name);
                }
                self.reg.nacos.register(&i);
            }
        }
        true
    }
    fn tick(&mut self, _model: &Model) {
        let left: Vec<String> = self.leftover.iter().cloned().collect();
        for svc in left {
            if self.delete_service(&svc) {
                self.leftover.remove(&svc);
            }
        }
    }
}
