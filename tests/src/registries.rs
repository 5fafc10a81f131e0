//! Every registry driven the same way, each with its adapter reading it (default flags, but
//! for the poll periods of the two registries that have no watch): an instance is registered,
//! made unhealthy and deregistered the way that registry's own clients do it, so that a test
//! or bench can run one scenario over all five.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::consul::{Consul, Registration};
use crate::eureka::{Eureka, Instance as EurekaInstance};
use crate::kube::{not_ready, ready, service as kube_service, slice, KubeApiServer};
use crate::nacos::{Instance as NacosInstance, Nacos, Version, DEFAULT_GROUP};
use crate::zookeeper::{provider_path, Writer, ZooKeeper};
use crate::Adapter;

/// One instance of a service.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Its id in the registry (unique per service; DNS-label characters).
    pub id: String,
    /// Where it listens (a `127.0.x.y` address, the service's port).
    pub addr: SocketAddr,
    /// Its `version` label (a DestinationRule subset selects on it), if any.
    pub version: Option<String>,
    /// Healthy (passing, UP, ready); an unhealthy instance stays registered.
    pub healthy: bool,
}

impl Instance {
    /// A healthy instance without a version.
    pub fn new(id: &str, addr: SocketAddr) -> Instance {
        Instance {
            id: id.to_string(),
            addr,
            version: None,
            healthy: true,
        }
    }

    /// The same with a `version` label.
    pub fn version(mut self, v: &str) -> Instance {
        self.version = Some(v.to_string());
        self
    }

    /// The same, unhealthy.
    pub fn unhealthy(mut self) -> Instance {
        self.healthy = false;
        self
    }

    fn ip(&self) -> String {
        self.addr.ip().to_string()
    }
}

/// The adapter serving a registry, and what it calls what it serves.
pub struct Served {
    adapter: Adapter,
    /// `file`, `consul`, `zookeeper`, `eureka`, `kubernetes`.
    kind: &'static str,
    /// The namespace of the ServiceEntries.
    namespace: &'static str,
    /// What follows `<service>.` in their hosts.
    host_suffix: &'static str,
    /// What follows `<service>` in their names (nacos: `.{group}.{namespace}`).
    name_suffix: &'static str,
}

impl Served {
    /// `adapter` serving `kind`'s ServiceEntries in `namespace`, with hosts
    /// `<service>.<host_suffix>`.
    pub fn new(
        adapter: Adapter,
        kind: &'static str,
        namespace: &'static str,
        host_suffix: &'static str,
    ) -> Served {
        Served {
            adapter,
            kind,
            namespace,
            host_suffix,
            name_suffix: "",
        }
    }

    /// The same, with ServiceEntries named `<service><suffix>`.
    pub fn named(mut self, suffix: &'static str) -> Served {
        self.name_suffix = suffix;
        self
    }
}

/// A registry and the adapter that serves it.
pub trait Registry: Send {
    /// The adapter, and what it calls what it serves.
    fn served(&self) -> &Served;
    /// The same, to restart the adapter.
    fn served_mut(&mut self) -> &mut Served;
    /// Registers `inst` under `service` (or changes it: its health, its version).
    fn register(&mut self, service: &str, inst: &Instance);
    /// Removes instance `id` of `service` from the registry.
    fn deregister(&mut self, service: &str, id: &str);

    /// `file`, `consul`, `zookeeper`, `eureka`, `kubernetes`, `nacos`.
    fn kind(&self) -> &'static str {
        self.served().kind
    }
    /// The adapter reading it.
    fn adapter(&self) -> &Adapter {
        &self.served().adapter
    }
    /// The same, to restart it.
    fn adapter_mut(&mut self) -> &mut Adapter {
        &mut self.served_mut().adapter
    }
    /// The namespace of the ServiceEntries the adapter makes of it.
    fn namespace(&self) -> String {
        self.served().namespace.to_string()
    }
    /// The host that the ServiceEntry of `service` has (what clients put in `Host:`).
    fn host(&self, service: &str) -> String {
        format!("{service}.{}", self.served().host_suffix)
    }
    /// The name of the ServiceEntry of `service`.
    fn name(&self, service: &str) -> String {
        format!("{service}{}", self.served().name_suffix)
    }
}

/// The instances of each service, by id (for registries rewritten whole at every change).
#[derive(Default)]
struct Services(BTreeMap<String, BTreeMap<String, Instance>>);

impl Services {
    /// Adds or replaces `inst` of `service`.
    fn put(&mut self, service: &str, inst: &Instance) {
        self.0
            .entry(service.to_string())
            .or_default()
            .insert(inst.id.clone(), inst.clone());
    }

    /// Removes instance `id` of `service`.
    fn remove(&mut self, service: &str, id: &str) {
        if let Some(s) = self.0.get_mut(service) {
            s.remove(id);
        }
    }
}

/// adapter-file on an inventory file rewritten (atomically) at every change, polled every
/// 100 ms. Files know no health: an unhealthy instance is left out of the file.
pub struct FileRegistry {
    dir: tempfile::TempDir,
    port: u16,
    services: Services,
    served: Served,
}

impl FileRegistry {
    /// Serves services on `port` from an inventory in a new directory (empty at first).
    pub fn start(port: u16) -> FileRegistry {
        Self::start_with_args(port, &[])
    }

    /// [`FileRegistry::start`] with more adapter flags.
    pub fn start_with_args(port: u16, extra: &[&str]) -> FileRegistry {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().display().to_string();
        let adapter = Adapter::start(
            "adapter-file",
            &with(
                &["--path", path.as_str(), "--poll-interval", "100ms"],
                extra,
            ),
        );
        let r = FileRegistry {
            dir,
            port,
            services: Services::default(),
            served: Served::new(adapter, "file", "inventory", "inventory.internal"),
        };
        r.write();
        r
    }

    /// The directory the adapter reads (the inventory and the files beside it).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Another file beside the inventory (e.g. an Istio ServiceEntry YAML).
    pub fn write_file(&self, name: &str, content: &str) {
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).expect("write file");
        std::fs::rename(&tmp, self.dir.path().join(name)).expect("rename file");
    }

    fn write(&self) {
        let services: Vec<Value> = self
            .services
            .0
            .iter()
            .map(|(name, insts)| {
                json!({
                    "name": name,
                    "hosts": [self.host(name)],
                    "ports": {"http": self.port},
                    "endpoints": insts.values().filter(|i| i.healthy).map(|i| {
                        let mut e = json!({"address": i.ip()});
                        if let Some(v) = &i.version {
                            e["labels"] = json!({"version": v});
                        }
                        e
                    }).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = json!({
            "apiVersion": "mcp-adapter/v1", "kind": "Inventory",
            "namespace": self.namespace(), "services": services,
        });
        // JSON is YAML; a rename makes the change atomic for the poller.
        self.write_file("inventory.yaml", &doc.to_string());
    }
}

impl Registry for FileRegistry {
    fn served(&self) -> &Served {
        &self.served
    }
    fn served_mut(&mut self) -> &mut Served {
        &mut self.served
    }
    fn register(&mut self, service: &str, inst: &Instance) {
        self.services.put(service, inst);
        self.write();
    }
    fn deregister(&mut self, service: &str, id: &str) {
        self.services.remove(service, id);
        self.write();
    }
}

/// adapter-consul (default flags but one, see [`ConsulRegistry::start`]) on a real Consul agent; instances live on node `n1` with one
/// check each, `protocol: http` and their version in the service meta.
pub struct ConsulRegistry {
    /// The agent.
    pub consul: Consul,
    served: Served,
}

impl ConsulRegistry {
    /// Starts an agent and the adapter. Consul's own `consul` service (the servers' RPC port)
    /// is left out, as a mesh would: a sidecar without capture binds every TCP service port on
    /// 127.0.0.1, and here Consul itself holds that port on the same loopback.
    pub fn start() -> ConsulRegistry {
        Self::start_with_args(&[])
    }

    /// [`ConsulRegistry::start`] with more adapter flags.
    pub fn start_with_args(extra: &[&str]) -> ConsulRegistry {
        let consul = Consul::start(None);
        let addr = consul.addr();
        let adapter = Adapter::start(
            "adapter-consul",
            &with(
                &[
                    "--consul-addr",
                    addr.as_str(),
                    "--exclude-service",
                    "consul",
                ],
                extra,
            ),
        );
        let served = Served::new(adapter, "consul", "consul", "service.consul");
        ConsulRegistry { consul, served }
    }
}

impl Registry for ConsulRegistry {
    fn served(&self) -> &Served {
        &self.served
    }
    fn served_mut(&mut self) -> &mut Served {
        &mut self.served
    }
    fn register(&mut self, service: &str, inst: &Instance) {
        let mut r = Registration::new("n1", service, &inst.id, &inst.ip(), inst.addr.port())
            .protocol("http")
            .status(if inst.healthy { "passing" } else { "critical" });
        if let Some(v) = &inst.version {
            r = r.meta("version", v);
        }
        self.consul.register(&r);
    }
    fn deregister(&mut self, _service: &str, id: &str) {
        self.consul.deregister("n1", id);
    }
}

/// adapter-zookeeper (default flags) on a real ZooKeeper: Spring Cloud Zookeeper (Curator)
/// instances as ephemeral znodes of one session, and Dubbo providers.
pub struct ZkRegistry {
    /// The server.
    pub zk: ZooKeeper,
    /// The session that owns the instances.
    pub writer: Writer,
    served: Served,
}

impl ZkRegistry {
    /// Starts a server, a writer session and the adapter.
    pub fn start() -> ZkRegistry {
        Self::start_with_args(&[])
    }

    /// [`ZkRegistry::start`] with more adapter flags.
    pub fn start_with_args(extra: &[&str]) -> ZkRegistry {
        let zk = ZooKeeper::start();
        let writer = Writer::start(&zk);
        let servers = zk.servers();
        let adapter = Adapter::start(
            "adapter-zookeeper",
            &with(&["--zk-servers", servers.as_str()], extra),
        );
        ZkRegistry {
            zk,
            writer,
            served: Served::new(adapter, "zookeeper", "zookeeper", "zookeeper"),
        }
    }

    /// Registers a Dubbo provider of `interface` listening on `addr` (a `dubbo://` URL under
    /// `/dubbo/{interface}/providers`), with Dubbo's `version` parameter.
    pub fn dubbo_provider(&mut self, interface: &str, addr: SocketAddr, version: &str) {
        self.writer.create_e(
            &provider_path(
                interface,
                &format!(
                    "dubbo://{addr}/{interface}?application=demo&interface={interface}&methods=hello&side=provider&dubbo=2.0.2&version={version}"
                ),
            ),
            "",
        );
    }

    /// The host Dubbo interface `interface` is served under.
    pub fn dubbo_host(interface: &str) -> String {
        format!("{}.zookeeper", interface.to_lowercase())
    }
}

/// A Spring Cloud Zookeeper registration (Curator's `ServiceInstance` JSON).
pub fn curator_instance(service: &str, inst: &Instance) -> String {
    let mut metadata = json!({
        "instance_status": if inst.healthy { "UP" } else { "OUT_OF_SERVICE" },
    });
    if let Some(v) = &inst.version {
        metadata["version"] = json!(v);
    }
    json!({
        "name": service, "id": inst.id, "address": inst.ip(), "port": inst.addr.port(),
        "sslPort": null,
        "payload": {
            "@class": "org.springframework.cloud.zookeeper.discovery.ZookeeperInstance",
            "id": service, "name": service, "metadata": metadata,
        },
        "registrationTimeUTC": 1_700_000_000_000u64, "serviceType": "DYNAMIC", "uriSpec": null,
    })
    .to_string()
}

impl Registry for ZkRegistry {
    fn served(&self) -> &Served {
        &self.served
    }
    fn served_mut(&mut self) -> &mut Served {
        &mut self.served
    }
    fn register(&mut self, service: &str, inst: &Instance) {
        self.writer.create_e(
            &format!("/services/{service}/{}", inst.id),
            &curator_instance(service, inst),
        );
    }
    fn deregister(&mut self, service: &str, id: &str) {
        self.writer.delete(&format!("/services/{service}/{id}"));
    }
}

/// adapter-eureka on a real Spring Cloud Eureka server, polling deltas every second (its
/// shortest `--refresh-interval`; Eureka has no watch). The version is instance metadata;
/// an unhealthy instance is DOWN.
pub struct EurekaRegistry {
    /// The server.
    pub eureka: Eureka,
    served: Served,
}

impl EurekaRegistry {
    /// Starts a server and the adapter.
    pub fn start() -> EurekaRegistry {
        Self::start_with_args(&[])
    }

    /// [`EurekaRegistry::start`] with more adapter flags.
    pub fn start_with_args(extra: &[&str]) -> EurekaRegistry {
        let eureka = Eureka::start();
        let url = eureka.url();
        let adapter = Adapter::start(
            "adapter-eureka",
            &with(
                &["--eureka-url", url.as_str(), "--refresh-interval", "1s"],
                extra,
            ),
        );
        let served = Served::new(adapter, "eureka", "eureka", "eureka");
        EurekaRegistry { eureka, served }
    }
}

impl Registry for EurekaRegistry {
    fn served(&self) -> &Served {
        &self.served
    }
    fn served_mut(&mut self) -> &mut Served {
        &mut self.served
    }
    fn register(&mut self, service: &str, inst: &Instance) {
        let mut i = EurekaInstance::new(service, &inst.id, &inst.ip(), inst.addr.port());
        if let Some(v) = &inst.version {
            i = i.with_metadata("version", v);
        }
        if !inst.healthy {
            i.status = "DOWN".into();
        }
        self.eureka.register(&i);
    }
    fn deregister(&mut self, service: &str, id: &str) {
        self.eureka.deregister(service, id);
    }
}

/// adapter-kube (`--read-pods`, so pod labels become endpoint labels) on another cluster's
/// API server: each service a selector-less Service in namespace `store` whose one
/// EndpointSlice is rewritten at every change, as the EndpointSlice controller does; each
/// instance a Pod (never scheduled: no kubelet) carrying its `version` label.
pub struct KubeRegistry {
    /// The watched cluster's API server.
    pub kube: KubeApiServer,
    port: u16,
    services: Services,
    served: Served,
}

impl KubeRegistry {
    /// Starts an API server (the remote cluster) and the adapter.
    pub fn start(port: u16) -> KubeRegistry {
        Self::start_with_args(port, &[])
    }

    /// [`KubeRegistry::start`] with more adapter flags.
    pub fn start_with_args(port: u16, extra: &[&str]) -> KubeRegistry {
        let kube = KubeApiServer::start();
        kube.namespace("store");
        let kubeconfig = kube.kubeconfig().display().to_string();
        let adapter = Adapter::start(
            "adapter-kube",
            &with(&["--kubeconfig", kubeconfig.as_str(), "--read-pods"], extra),
        );
        KubeRegistry {
            kube,
            port,
            services: Services::default(),
            served: Served::new(adapter, "kubernetes", "store", "store.svc.cluster.local"),
        }
    }

    fn write_slice(&self, service: &str) {
        let insts = self.services.0.get(service).cloned().unwrap_or_default();
        let endpoints = insts
            .values()
            .map(|i| {
                let mut e = if i.healthy {
                    ready(&i.ip())
                } else {
                    not_ready(&i.ip())
                };
                e["targetRef"] = json!({"kind": "Pod", "name": format!("{service}-{}", i.id), "namespace": "store"});
                e
            })
            .collect();
        self.kube.apply_slice(&slice(
            "store",
            &format!("{service}-1"),
            service,
            "IPv4",
            &[("http", self.port)],
            endpoints,
        ));
    }
}

impl Registry for KubeRegistry {
    fn served(&self) -> &Served {
        &self.served
    }
    fn served_mut(&mut self) -> &mut Served {
        &mut self.served
    }
    fn register(&mut self, service: &str, inst: &Instance) {
        if !self.services.0.contains_key(service) {
            self.kube.apply_service(&kube_service(
                "store",
                service,
                &[("http", self.port, self.port)],
            ));
        }
        let mut labels = json!({"app": service});
        if let Some(v) = &inst.version {
            labels["version"] = json!(v);
        }
        self.kube.apply(
            "/api/v1/namespaces/store/pods",
            &json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("{service}-{}", inst.id), "namespace": "store",
                                 "labels": labels},
                    "spec": {"automountServiceAccountToken": false,
                             "containers": [{"name": "app", "image": "example.invalid/app:1"}]}}),
        );
        self.services.put(service, inst);
        self.write_slice(service);
    }
    fn deregister(&mut self, service: &str, id: &str) {
        self.services.remove(service, id);
        self.write_slice(service);
        self.kube
            .delete(&format!("/api/v1/namespaces/store/pods/{service}-{id}"));
    }
}

/// adapter-nacos (default flags) on the real Nacos 2.4.3: each instance a persistent instance
/// registered through the HTTP API (group `DEFAULT_GROUP`, namespace public), its version as
/// metadata. An unhealthy instance is one the server's own health check finds down: the first
/// one turns the server's health checks on (the harness starts servers with them off, so that
/// tests without backends keep their instances), it is registered on a port of its address
/// where nothing listens, and `register` returns once the server has marked it unhealthy (its
/// TCP check, about 5-15 s). Every other instance must then have a backend listening.
pub struct NacosRegistry {
    /// The server.
    pub nacos: Nacos,
    /// Whether the server's health checks were turned on.
    checking: bool,
    served: Served,
    /// What was registered, by service and id (Nacos deregisters by address).
    registered: BTreeMap<(String, String), NacosInstance>,
}

/// Where an instance the server must find down is registered: a port nothing listens on.
const NACOS_DOWN_PORT: u16 = 1;

impl NacosRegistry {
    /// Starts a server and the adapter.
    pub fn start() -> NacosRegistry {
        Self::start_with_args(&[])
    }

    /// [`NacosRegistry::start`] with more adapter flags.
    pub fn start_with_args(extra: &[&str]) -> NacosRegistry {
        let nacos = Nacos::start(Version::V2);
        let addr = nacos.server_addr();
        let adapter = Adapter::start(
            "adapter-nacos",
            &with(&["--nacos-addr", addr.as_str()], extra),
        );
        let served = Served::new(adapter, "nacos", "nacos", "default-group.public.nacos")
            .named(".default-group.public");
        NacosRegistry {
            nacos,
            checking: false,
            served,
            registered: BTreeMap::new(),
        }
    }
}

impl Registry for NacosRegistry {
    fn served(&self) -> &Served {
        &self.served
    }
    fn served_mut(&mut self) -> &mut Served {
        &mut self.served
    }
    fn register(&mut self, service: &str, inst: &Instance) {
        if !inst.healthy && !self.checking {
            self.nacos.set_switch("check", "true");
            self.checking = true;
        }
        let port = if inst.healthy {
            inst.addr.port()
        } else {
            NACOS_DOWN_PORT
        };
        let mut i = NacosInstance::new(service, &inst.ip(), port);
        if let Some(v) = &inst.version {
            i = i.with_metadata("version", v);
        }
        self.nacos.register(&i);
        if !inst.healthy {
            let ip = inst.ip();
            crate::wait_for(
                std::time::Duration::from_secs(90),
                &format!("Nacos' health check to find {service}/{} down", inst.id),
                || {
                    self.nacos
                        .hosts(service, DEFAULT_GROUP, "public")
                        .iter()
                        .any(|h| h["ip"] == ip.as_str() && h["healthy"] == false)
                        .then_some(())
                },
            );
        }
        self.registered
            .insert((service.to_string(), inst.id.clone()), i);
    }
    fn deregister(&mut self, service: &str, id: &str) {
        let i = self
            .registered
            .remove(&(service.to_string(), id.to_string()))
            .unwrap_or_else(|| panic!("nacos: {service}/{id} was never registered"));
        self.nacos.deregister(&i);
    }
}

/// One of each registry, each with its adapter, HTTP services on `port`.
pub struct Registries {
    /// adapter-file.
    pub file: FileRegistry,
    /// adapter-consul.
    pub consul: ConsulRegistry,
    /// adapter-zookeeper.
    pub zk: ZkRegistry,
    /// adapter-eureka.
    pub eureka: EurekaRegistry,
    /// adapter-kube on another cluster.
    pub kube: KubeRegistry,
    /// adapter-nacos.
    pub nacos: NacosRegistry,
}

impl Registries {
    /// Starts all five side by side (Eureka's JVM takes the longest), and `also` beside them;
    /// its result comes back with them.
    pub fn start_with<T: Send>(port: u16, also: impl FnOnce() -> T + Send) -> (Registries, T) {
        Self::start_with_args(port, &[], also)
    }

    /// [`Registries::start_with`], every adapter with the flags `extra` too.
    pub fn start_with_args<T: Send>(
        port: u16,
        extra: &[&str],
        also: impl FnOnce() -> T + Send,
    ) -> (Registries, T) {
        std::thread::scope(|s| {
            let also = s.spawn(also);
            let file = s.spawn(|| FileRegistry::start_with_args(port, extra));
            let consul = s.spawn(|| ConsulRegistry::start_with_args(extra));
            let zk = s.spawn(|| ZkRegistry::start_with_args(extra));
            let eureka = s.spawn(|| EurekaRegistry::start_with_args(extra));
            let kube = s.spawn(|| KubeRegistry::start_with_args(port, extra));
            let nacos = s.spawn(|| NacosRegistry::start_with_args(extra));
            let regs = Registries {
                file: file.join().expect("file registry"),
                consul: consul.join().expect("consul registry"),
                zk: zk.join().expect("zookeeper registry"),
                eureka: eureka.join().expect("eureka registry"),
                kube: kube.join().expect("kubernetes registry"),
                nacos: nacos.join().expect("nacos registry"),
            };
            (regs, also.join().expect("started beside the registries"))
        })
    }

    /// Every registry, in a fixed order (file, Consul, ZooKeeper, Eureka, Kubernetes, Nacos).
    pub fn all(&self) -> [&dyn Registry; 6] {
        [
            &self.file,
            &self.consul,
            &self.zk,
            &self.eureka,
            &self.kube,
            &self.nacos,
        ]
    }

    /// [`Registries::all`], to change them.
    pub fn all_mut(&mut self) -> [&mut dyn Registry; 6] {
        [
            &mut self.file,
            &mut self.consul,
            &mut self.zk,
            &mut self.eureka,
            &mut self.kube,
            &mut self.nacos,
        ]
    }

    /// Every adapter's ServiceEntry namespace, in [`Registries::all`]'s order: what a sidecar
    /// scope must import, so a registry added here is never left out of one.
    pub fn namespaces(&self) -> Vec<String> {
        self.all().iter().map(|r| r.namespace()).collect()
    }

    /// Every adapter's gRPC address (what istiod's `configSources` list).
    pub fn sources(&self) -> Vec<SocketAddr> {
        self.all().iter().map(|r| r.adapter().grpc).collect()
    }
}

/// `args` then `extra`.
fn with<'a>(args: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    args.iter().chain(extra).copied().collect()
}
