//! Moving a service from one registry to another (issue #45), end to end: the real Consul, the
//! real Nacos 2.4.3, the mesh cluster's API server, Istio's real, unmodified istiod reading
//! `k8s://` first and then the adapters over `xds://`, and a stock Envoy sidecar that every
//! request goes through. Backends live on the test's pod network (`10.77.1.x`, see
//! `e2e::netns`) and answer with their own name (`consul-orders-1`, `nacos-orders-2`,
//! `kubernetes-orders-1`), so each answer says which registry's instance served it.
//!
//! The adapters use the four flags every adapter shares for a move:
//! `--host-template '{service}.shop.svc.cluster.local'` (one host for Consul's `orders` and
//! Nacos' `orders` of any group), `--namespace shop` (one namespace), `--name-template
//! '{name}-{registry}'` (distinct resource names: the same namespace/name from two sources is
//! the first source's, wholly), `--port-name 18080=http` (one port name: istiod merges two
//! entries' endpoints only under one) and `--endpoint-source-labels` (endpoint labels
//! `mcp-adapter/registry`, `mcp-adapter/source`, which DestinationRule subsets select on).
//!
//! One world, steps in order (each `World` method states what it shows and asserts):
//! 1. the move: one Envoy cluster with both registries' endpoints (weighted as each registry
//!    weighs its instances: without a routing rule Nacos takes ~99 %); then weights by subset,
//!    100/0 -> 90/10 -> 0/100 under constant load, 0 failed requests, every step's share
//!    within [`TOLERANCE`] points of its weight;
//! 5. what goes wrong when a rule is not met (other port names, other namespaces), on hosts of
//!    their own served by four more adapters;
//! 3. adapter-consul SIGKILLed: istiod keeps the last state it had from it (no request fails,
//!    Nacos' share is undisturbed), and nothing Consul does reaches the mesh until it is back;
//! 2. every instance taken out of Consul, first while the routing still sends 50 % there
//!    (those requests fail until the routing changes: counted and asserted), then the safe
//!    order (routing to Nacos first: 0 failures);
//! 4. a Kubernetes Service of the host (`orders` in `shop`, an EndpointSlice whose endpoints
//!    point at labelled Pods) appears under load; Nacos' endpoints join its cluster; weights
//!    shift from Nacos to Kubernetes by subsets (pod label / `mcp-adapter/registry`).
//!
//! The load is 150 requests/s, each on a new connection ([`Steady`], read to the response's
//! length: a response Envoy makes itself is closed only after 1 s). The numbers (requests,
//! share per registry, failures per step) are printed at the end for the README's migration
//! guide.
//!
//! `cargo test -p e2e --test migration -- --include-ignored` (after `cargo build --workspace
//! --bins`): about 80 s, 20 of them Nacos' start, in a network namespace of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use e2e::backend::Backend;
use e2e::consul::{Consul, Registration};
use e2e::envoy::Envoy;
use e2e::istiod::{configz_entries, Istiod};
use e2e::kube::{ready, service, slice, KubeApiServer, ADMIN_TOKEN};
use e2e::load::{request, Outcome, Report};
use e2e::mesh::{apply, mesh_api_server, sidecar_scope, Mesh, CONFIG_TIMEOUT};
use e2e::nacos::{Instance as NacosInstance, Nacos, Version};
use e2e::netns::{isolate, pod_ip};
use e2e::{endpoint_addresses, wait_for, wait_served, Adapter};

/// The service port of every instance (and Envoy's one HTTP listener, routed by host).
const PORT: u16 = 18080;
/// The service being moved, in every registry.
const SERVICE: &str = "orders";
/// Its host: the Kubernetes FQDN it will have once it lives in the cluster.
const HOST: &str = "orders.shop.svc.cluster.local";
/// The namespace of its ServiceEntries (and of the Kubernetes Service).
const NS: &str = "shop";
/// Step 5, port names differ: the host and namespace.
const PORTS_HOST: &str = "orders.ports.mig.internal";
const PORTS_NS: &str = "mig-ports";
/// Step 5, namespaces differ: the host, and each adapter's namespace.
const NS_HOST: &str = "orders.ns.mig.internal";
const NS_CONSUL: &str = "mig-consul";
const NS_NACOS: &str = "mig-nacos";
/// Requests measured per weight step, at least ([`needed`] asks more of an even split).
const STEP_REQUESTS: usize = 300;
/// How far a step's measured share may be from its weight, in percentage points. Envoy picks a
/// weighted cluster at random per request, so a share is binomial: [`needed`] measures each
/// step long enough for 7 points to be 4 standard deviations (a spurious failure 1 in 16,000
/// per step).
const TOLERANCE: f64 = 7.0;
/// Requests per second of the load (each on a new connection, routed afresh).
const RATE: u32 = 150;
/// The resource names `--name-template {name}-{registry}` gives Consul's and Nacos' `orders`
/// (Nacos' `{name}` is `<service>.<group>.<namespace>`).
const CONSUL_NAME: &str = "orders-consul";
const NACOS_NAME: &str = "orders.default-group.public-nacos";

/// The registry a backend belongs to: the first part of its name (`consul-orders-1`).
fn registry_of(backend: &str) -> &str {
    backend.split('-').next().unwrap_or(backend)
}

/// `ip:port` of instance `n` of `registry` (1 or 2).
fn addr(registry: &str, n: u8) -> SocketAddr {
    let base = match registry {
        "consul" => 0,
        "nacos" => 10,
        "kubernetes" => 20,
        other => panic!("no backends for {other}"),
    };
    SocketAddr::from((pod_ip(1, base + n), PORT))
}

/// Both instances of `registry` as Envoy lists them (`10.77.1.1:18080`).
fn eps(registry: &str) -> Vec<String> {
    (1..=2).map(|n| addr(registry, n).to_string()).collect()
}

/// The Consul registration of instance `n` of `orders`.
fn consul_instance(n: u8) -> Registration {
    let a = addr("consul", n);
    Registration::new(
        "n1",
        SERVICE,
        &format!("orders-{n}"),
        &a.ip().to_string(),
        PORT,
    )
    .protocol("http")
}

/// Envoy's cluster name for `subset` ("" for none) of `host`.
fn cluster(subset: &str, host: &str) -> String {
    format!("outbound|{PORT}|{subset}|{host}")
}

/// `want` (cluster, endpoints) as [`Envoy::clusters_of`] reads it.
fn view(want: &[(String, Vec<String>)]) -> BTreeMap<String, Vec<String>> {
    want.iter()
        .map(|(k, v)| {
            let mut v = v.clone();
            v.sort();
            (k.clone(), v)
        })
        .collect()
}

/// The weights of the route Envoy uses for `host` on the HTTP port, by subset (from the
/// cluster names of its weighted clusters; a single cluster is weight 100). Empty when Envoy
/// has no route for the host.
fn route_weights(envoy: &Envoy, host: &str) -> BTreeMap<String, u64> {
    let dump = envoy.config_dump();
    let mut out = BTreeMap::new();
    let routes = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with("RoutesConfigDump"))
        })
        .flat_map(|c| {
            c["dynamic_route_configs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        });
    let subset = |name: &str| name.split('|').nth(2).unwrap_or("").to_string();
    for rc in routes {
        for vh in rc["route_config"]["virtual_hosts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let ours = vh["domains"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|d| d == host);
            if !ours {
                continue;
            }
            let Some(route) = vh["routes"].as_array().and_then(|r| r.last()) else {
                continue;
            };
            let action = &route["route"];
            if let Some(c) = action["cluster"].as_str() {
                out.insert(subset(c), 100);
            }
            for c in action["weighted_clusters"]["clusters"]
                .as_array()
                .into_iter()
                .flatten()
            {
                out.insert(
                    subset(c["name"].as_str().unwrap_or("")),
                    c["weight"].as_u64().unwrap_or(0),
                );
            }
        }
    }
    out
}

/// Per endpoint (`ip:port`) of Envoy's EDS cluster `cluster`: its load balancing weight (1 when
/// unset).
fn eds_weights(envoy: &Envoy, cluster: &str) -> BTreeMap<String, u64> {
    envoy
        .eds_endpoints(cluster)
        .into_iter()
        .map(|(a, lb)| (a, lb["load_balancing_weight"].as_u64().unwrap_or(1)))
        .collect()
}

/// A DestinationRule for [`HOST`] with one subset per `(name, label, value)`.
fn destination_rule(subsets: &[(&str, &str, &str)]) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": SERVICE, "namespace": NS},
        "spec": {"host": HOST, "subsets": subsets.iter().map(|(name, k, v)| {
            json!({"name": name, "labels": {*k: v}})
        }).collect::<Vec<_>>()},
    })
}

/// A VirtualService for [`HOST`] splitting every request by `weights` (subset, percent).
fn virtual_service(weights: &[(&str, u32)]) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": SERVICE, "namespace": NS},
        "spec": {"hosts": [HOST], "http": [{"route": weights.iter().map(|(s, w)| {
            json!({"destination": {"host": HOST, "subset": s}, "weight": w})
        }).collect::<Vec<_>>()}]},
    })
}

/// `weights` as Envoy's route has them: istiod leaves out 0-weight destinations.
fn nonzero(weights: &[(&str, u32)]) -> BTreeMap<String, u64> {
    weights
        .iter()
        .filter(|(_, w)| *w > 0)
        .map(|(s, w)| (s.to_string(), u64::from(*w)))
        .collect()
}

/// Requests a step with `weights` (percent) measures: at least [`STEP_REQUESTS`], and enough
/// for [`TOLERANCE`] to be 4 standard deviations of every share (817 for 50/50; 294, so 300,
/// for 90/10; 0/100 is exact).
fn needed(weights: &[(&str, u32)]) -> usize {
    weights
        .iter()
        .map(|(_, w)| {
            let p = f64::from(*w) / 100.0;
            (16.0 * p * (1.0 - p) * 10_000.0 / (TOLERANCE * TOLERANCE)).ceil() as usize
        })
        .fold(STEP_REQUESTS, usize::max)
}

/// 4 standard deviations, in percentage points, of the share of `n` requests that a
/// destination of weight `p` (0..1) takes.
fn four_sd(p: f64, n: usize) -> f64 {
    4.0 * 100.0 * (p * (1.0 - p) / n.max(1) as f64).sqrt()
}

/// The longest time between two requests of a load being sent (its threads stalled, or the
/// machine did): a load that stalls measures less than it seems.
fn longest_gap(report: &Report) -> Duration {
    report
        .outcomes
        .windows(2)
        .map(|w| w[1].at.duration_since(w[0].at))
        .max()
        .unwrap_or_default()
}

/// `a/b` of weights, for labels (`90/10`).
fn label(weights: &[(&str, u32)]) -> String {
    let names: Vec<&str> = weights.iter().map(|(s, _)| *s).collect();
    let values: Vec<String> = weights.iter().map(|(_, w)| w.to_string()).collect();
    format!("{} {}", names.join("/"), values.join("/"))
}

/// [`e2e::settle`] within [`CONFIG_TIMEOUT`].
fn settle<T>(what: &str, probe: impl FnMut() -> Result<T, String>) -> T {
    e2e::settle(CONFIG_TIMEOUT, what, probe)
}

/// `namespace [port/name ...] created` of every service istiod's registry holds for `host`,
/// sorted.
fn registry_services(istiod: &Istiod, host: &str) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = istiod
        .debug("registryz")
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["hostname"] == host)
        .map(|s| {
            let ports: Vec<String> = s["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| format!("{}/{}", p["port"], p["name"].as_str().unwrap_or("")))
                .collect();
            (
                s["Attributes"]["Namespace"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string(),
                ports.join(" "),
                s["creationTime"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// istiod's endpoints for `host` in every namespace and shard: per address, its service port
/// name and labels.
fn shard_endpoints(istiod: &Istiod, host: &str) -> BTreeMap<String, (String, Value)> {
    let s = istiod.debug("endpointShardz");
    let mut out = BTreeMap::new();
    for (_, entry) in s[host].as_object().into_iter().flatten() {
        for (_, eps) in entry["Shards"].as_object().into_iter().flatten() {
            for e in eps.as_array().into_iter().flatten() {
                out.insert(
                    e["Addresses"][0].as_str().unwrap_or("?").to_string(),
                    (
                        e["ServicePortName"].as_str().unwrap_or("?").to_string(),
                        e["Labels"].clone(),
                    ),
                );
            }
        }
    }
    out
}

/// One request for `host` through `proxy` on a connection of its own, as
/// `e2e::load::request` sends it, but over once the response's body (its `content-length`) is
/// read: it does not wait for Envoy to close the connection, which after a response Envoy
/// makes itself (`503 no healthy upstream`) comes only at its delayed-close timeout, 1 s
/// later. A load that waited would slow down to a few requests a second exactly while
/// requests fail, and undercount the failures. `Ok(backend name)` for a 200, else `Err` with
/// the status line and body.
fn fetch(proxy: SocketAddr, host: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&proxy, Duration::from_secs(2))
        .map_err(|e| format!("connect {proxy}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    s.write_all(format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").as_bytes())
        .map_err(|e| format!("send to {proxy}: {e}"))?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|n| raw.len() >= end + 4 + n) {
                break;
            }
        }
        let n = s
            .read(&mut chunk)
            .map_err(|e| format!("read from {proxy}: {e}"))?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if head.split_whitespace().nth(1) == Some("200") {
        Ok(body.trim().to_string())
    } else {
        Err(format!(
            "{host}: {}: {}",
            head.lines().next().unwrap_or("no answer"),
            body.trim()
        ))
    }
}

/// A steady load of [`fetch`]es for one host from a few threads, each paced to its share of
/// the rate (a thread that fell behind catches up), until [`Steady::stop`].
struct Steady {
    stop: Arc<AtomicBool>,
    /// Requests done (answered or failed) so far.
    done: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<Vec<Outcome>>>,
    started: Instant,
}

impl Steady {
    /// [`RATE`] requests a second for `host` through `proxy`, from 3 threads.
    fn start(proxy: SocketAddr, host: &str) -> Steady {
        const THREADS: u32 = 3;
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let period = Duration::from_secs_f64(f64::from(THREADS) / f64::from(RATE));
        let started = Instant::now();
        let threads = (0..THREADS)
            .map(|i| {
                let (stop, done, host) = (stop.clone(), done.clone(), host.to_string());
                std::thread::spawn(move || {
                    let mut next = started + period.mul_f64(f64::from(i) / f64::from(THREADS));
                    let mut out = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                        next += period;
                        let at = Instant::now();
                        out.push(Outcome {
                            at,
                            result: fetch(proxy, &host),
                        });
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    out
                })
            })
            .collect();
        Steady {
            stop,
            done,
            threads,
            started,
        }
    }

    /// Requests done so far.
    fn done(&self) -> usize {
        self.done.load(Ordering::SeqCst)
    }

    /// Stops it; every outcome, in the order sent.
    fn stop(self) -> Report {
        self.stop.store(true, Ordering::SeqCst);
        let mut outcomes: Vec<Outcome> = self
            .threads
            .into_iter()
            .flat_map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        outcomes.sort_by_key(|o| o.at);
        Report {
            elapsed: self.started.elapsed(),
            outcomes,
        }
    }
}

/// What the requests sent in one window got.
#[derive(Debug, Default)]
struct Counted {
    requests: usize,
    by_registry: BTreeMap<String, usize>,
    failures: Vec<String>,
}

impl Counted {
    /// The outcomes of `report` sent in `[from, to)`.
    fn of(report: &Report, from: Instant, to: Instant) -> Counted {
        let mut c = Counted::default();
        for o in report.outcomes.iter().filter(|o| o.at >= from && o.at < to) {
            c.requests += 1;
            match &o.result {
                Ok(b) => *c.by_registry.entry(registry_of(b).to_string()).or_default() += 1,
                Err(e) => c.failures.push(e.clone()),
            }
        }
        c
    }

    /// The share of requests `registry` answered, in percent.
    fn share(&self, registry: &str) -> f64 {
        let n = self.by_registry.get(registry).copied().unwrap_or(0);
        100.0 * n as f64 / self.requests.max(1) as f64
    }

    /// The share of requests that failed, in percent.
    fn failed_share(&self) -> f64 {
        100.0 * self.failures.len() as f64 / self.requests.max(1) as f64
    }

    /// One line of the summary table.
    fn row(&self, what: &str) -> String {
        let shares: Vec<String> = ["consul", "nacos", "kubernetes"]
            .iter()
            .filter(|r| self.by_registry.contains_key(**r))
            .map(|r| {
                format!(
                    "{r} {:.1}% ({})",
                    self.share(r),
                    self.by_registry.get(*r).copied().unwrap_or(0)
                )
            })
            .collect();
        format!(
            "  {what:<46} {:>5} requests  {:<44} {} failed",
            self.requests,
            shares.join(", "),
            self.failures.len()
        )
    }
}

/// A window of a load: from when Envoy had a routing state to when enough requests were sent
/// under it.
struct Window {
    what: String,
    from: Instant,
    to: Instant,
    /// The weights by subset, when the window is a weight step.
    weights: Vec<(String, u32)>,
    /// The requests it must hold.
    min: usize,
}

/// The world every step runs in.
struct World {
    kube: KubeApiServer,
    consul: Consul,
    _nacos: Nacos,
    /// Every backend, by name.
    backends: BTreeMap<String, Backend>,
    /// adapter-consul and adapter-nacos for [`HOST`], every rule met.
    consul_adapter: Adapter,
    _nacos_adapter: Adapter,
    /// Step 5's adapters: port names left as each registry names them, and one namespace each.
    _others: Vec<Adapter>,
    mesh: Mesh,
    /// The summary table, printed at the end.
    table: Vec<String>,
}

impl World {
    fn start() -> World {
        let t = Instant::now();
        let (kube, consul, nacos) = std::thread::scope(|s| {
            let kube = s.spawn(mesh_api_server);
            let consul = s.spawn(|| Consul::start(None));
            let nacos = s.spawn(|| Nacos::start(Version::V2));
            (
                kube.join().expect("api server"),
                consul.join().expect("consul"),
                nacos.join().expect("nacos"),
            )
        });
        eprintln!("API server, Consul and Nacos up in {:?}", t.elapsed());
        let backends: BTreeMap<String, Backend> = ["consul", "nacos", "kubernetes"]
            .iter()
            .flat_map(|r| (1..=2).map(move |n| (*r, n)))
            .map(|(r, n)| {
                let name = format!("{r}-orders-{n}");
                let b = Backend::http(&name, &addr(r, n).to_string());
                (name, b)
            })
            .collect();
        for n in 1..=2 {
            consul.register(&consul_instance(n));
            let a = addr("nacos", n);
            nacos.register(&NacosInstance::new(SERVICE, &a.ip().to_string(), PORT));
        }

        let consul_addr = consul.addr();
        let nacos_addr = nacos.server_addr();
        let start = |registry: &str, flags: &[&str]| {
            let mut args: Vec<&str> = match registry {
                "consul" => vec![
                    "--consul-addr",
                    consul_addr.as_str(),
                    "--exclude-service",
                    "consul",
                ],
                _ => vec!["--nacos-addr", nacos_addr.as_str()],
            };
            args.extend(flags);
            args.extend(["--name-template", "{name}-{registry}"]);
            args.extend(["--endpoint-source-labels"]);
            Adapter::start(&format!("adapter-{registry}"), &args)
        };
        let main = [
            "--host-template",
            "{service}.shop.svc.cluster.local",
            "--namespace",
            NS,
            "--port-name",
            "18080=http",
        ];
        let ports = [
            "--host-template",
            "{service}.ports.mig.internal",
            "--namespace",
            PORTS_NS,
        ];
        let ns = |namespace: &'static str| {
            [
                "--host-template",
                "{service}.ns.mig.internal",
                "--namespace",
                namespace,
                "--port-name",
                "18080=http",
            ]
        };
        let consul_adapter = start("consul", &main);
        let nacos_adapter = start("nacos", &main);
        let others = vec![
            start("consul", &ports),
            start("nacos", &ports),
            start("consul", &ns(NS_CONSUL)),
            start("nacos", &ns(NS_NACOS)),
        ];

        // Every adapter serves both instances before istiod starts (a source that is not
        // ready keeps istiod unready).
        let hosts = [HOST, HOST, PORTS_HOST, PORTS_HOST, NS_HOST, NS_HOST];
        let all: Vec<&Adapter> = [&consul_adapter, &nacos_adapter]
            .into_iter()
            .chain(&others)
            .collect();
        for (i, (a, host)) in all.iter().zip(hosts).enumerate() {
            a.wait_ready();
            let registry = if i % 2 == 0 { "consul" } else { "nacos" };
            let items = wait_served(
                Duration::from_secs(60),
                &format!("adapter-{registry}: {host} with both instances"),
                &a.xds_url(),
                |items| {
                    items.len() == 1
                        && items[0]["spec"]["hosts"][0] == host
                        && endpoint_addresses(&items[0]).len() == 2
                },
            );
            eprintln!(
                "adapter-{registry} serves {} for {host}: ports {}, endpoints {}",
                e2e::ns_name(&items[0]),
                items[0]["spec"]["ports"],
                items[0]["spec"]["endpoints"]
            );
        }
        let served = |a: &Adapter| e2e::ns_name(&e2e::mcpctl_get(&a.xds_url())[0]);
        assert_eq!(
            (served(&consul_adapter), served(&nacos_adapter)),
            (format!("{NS}/{CONSUL_NAME}"), format!("{NS}/{NACOS_NAME}")),
            "--namespace and --name-template {{name}}-{{registry}}"
        );

        apply(&kube, &sidecar_scope(&[NS, PORTS_NS, NS_CONSUL, NS_NACOS]));
        let sources: Vec<SocketAddr> = all.iter().map(|a| a.grpc).collect();
        let mesh = Mesh::start(&kube, &sources);
        eprintln!(
            "istiod (k8s://, 6 adapters) and the sidecar live in {:?}",
            t.elapsed()
        );
        World {
            kube,
            consul,
            _nacos: nacos,
            backends,
            consul_adapter,
            _nacos_adapter: nacos_adapter,
            _others: others,
            mesh,
            table: Vec::new(),
        }
    }

    fn proxy(&self) -> SocketAddr {
        self.mesh.outbound(PORT)
    }

    /// Adds a line to the summary table, and prints it now too.
    fn push_row(&mut self, row: String) {
        eprintln!("{row}");
        self.table.push(row);
    }

    /// Requests any backend took since `t`.
    fn hits_since(&self, t: Instant) -> usize {
        self.backends.values().map(|b| b.count_since(t)).sum()
    }

    /// Waits until the backends took `n` requests since `t` (the load goes on meanwhile).
    fn wait_requests(&self, t: Instant, n: usize) {
        wait_for(
            Duration::from_secs(120),
            &format!("{n} requests answered under the load"),
            || (self.hits_since(t) >= n).then_some(()),
        );
    }

    /// Waits until Envoy's clusters for `host` and their endpoints are exactly `want`.
    fn expect_envoy(&self, host: &str, want: &[(String, Vec<String>)]) {
        let want = view(want);
        settle(&format!("{host}: Envoy {want:?}"), || {
            let got = self.mesh.envoy.clusters_of(host);
            (got == want).then_some(()).ok_or_else(|| {
                format!(
                    "Envoy {got:?}\nistiod's registry {:?}",
                    registry_services(&self.mesh.istiod, host)
                )
            })
        });
        eprintln!("{host}: Envoy {want:?}");
    }

    /// Waits until Envoy routes [`HOST`] by `weights` (0-weight destinations left out).
    fn expect_route(&self, weights: &[(&str, u32)]) {
        let want = nonzero(weights);
        settle(&format!("Envoy's route for {HOST}: {want:?}"), || {
            let got = route_weights(&self.mesh.envoy, HOST);
            (got == want)
                .then_some(())
                .ok_or_else(|| format!("{got:?}"))
        });
    }

    /// Applies the VirtualService with `weights`, waits until Envoy routes by them, then until
    /// [`STEP_REQUESTS`] (and a margin) were answered under them: the window measured.
    fn shift(&self, weights: &[(&str, u32)]) -> Window {
        apply(&self.kube, &virtual_service(weights));
        self.expect_route(weights);
        self.window(label(weights), weights)
    }

    /// From now until [`needed`]`(weights)` requests (and a margin) were answered: a window
    /// whose shares must follow `weights`.
    fn window(&self, what: String, weights: &[(&str, u32)]) -> Window {
        let from = Instant::now();
        let min = needed(weights);
        self.wait_requests(from, min + 30);
        Window {
            what,
            from,
            to: Instant::now(),
            weights: weights.iter().map(|(s, w)| (s.to_string(), *w)).collect(),
            min,
        }
    }

    /// Checks the windows of a load's `report`: 0 failed requests in the whole load, each
    /// window at least [`STEP_REQUESTS`] requests, and each weight step's share within
    /// [`TOLERANCE`] of its weight. Adds each window to the table.
    fn check(&mut self, scenario: &str, report: &Report, windows: &[Window]) {
        let failures = report.failures();
        assert!(
            failures.is_empty(),
            "{scenario}: {} of {} requests failed: {:?}",
            failures.len(),
            report.outcomes.len(),
            &failures[..failures.len().min(10)]
        );
        for w in windows {
            let c = Counted::of(report, w.from, w.to);
            assert!(
                c.requests >= w.min,
                "{scenario}, {}: {} requests measured, not {}",
                w.what,
                c.requests,
                w.min
            );
            for (subset, weight) in &w.weights {
                let share = c.share(subset);
                assert!(
                    (share - f64::from(*weight)).abs() <= TOLERANCE,
                    "{scenario}, {}: {subset} answered {share:.1}% of {} requests (weight \
                     {weight}, tolerance {TOLERANCE} points): {:?}",
                    w.what,
                    c.requests,
                    c.by_registry
                );
            }
            // Every answer came from a subset the step routes to.
            let routed: BTreeSet<&str> = w.weights.iter().map(|(s, _)| s.as_str()).collect();
            assert!(
                c.by_registry.keys().all(|r| routed.contains(r.as_str())),
                "{scenario}, {}: answers from {:?}",
                w.what,
                c.by_registry
            );
            self.push_row(c.row(&format!("{scenario}: {}", w.what)));
        }
        self.push_row(format!(
            "  {scenario}: the whole load {} requests at {:.0}/s (longest gap {:?}), {} failed",
            report.outcomes.len(),
            report.rate(),
            longest_gap(report),
            failures.len()
        ));
    }

    /// Sends requests for `host`, one at a time, until every backend of `expected` answered at
    /// least once (at most `max` requests, each answered, each by one of `expected`); the
    /// answers, counted.
    fn until_each_answered(
        &self,
        host: &str,
        expected: &[&str],
        max: usize,
    ) -> BTreeMap<String, usize> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..max {
            let b = request(self.proxy(), host, &[])
                .unwrap_or_else(|e| panic!("request {i} to {host} failed: {e}"));
            assert!(expected.contains(&b.as_str()), "{host}: answered by {b}");
            *seen.entry(b).or_insert(0) += 1;
            if seen.len() == expected.len() {
                return seen;
            }
        }
        panic!("{host}: {max} requests and not every one of {expected:?} answered: {seen:?}");
    }

    /// Step 1: the move. Both adapters serve `orders` as [`HOST`] in [`NS`] under distinct
    /// names with port `http`: istiod merges the two entries, Envoy's one cluster lists all four
    /// endpoints, and requests reach both registries' backends, in proportion to the endpoints'
    /// weights (Consul's 1, Nacos' 100: ~1 % to Consul). The endpoints carry
    /// `mcp-adapter/registry`: a DestinationRule makes a subset per registry, and a
    /// VirtualService moves the traffic 100/0 -> 90/10 -> 0/100 under constant load, with not
    /// one failed request and each step's share within [`TOLERANCE`] of its weight.
    fn the_move(&mut self) {
        let main = cluster("", HOST);
        let both: Vec<String> = [eps("consul"), eps("nacos")].concat();
        self.expect_envoy(HOST, &[(main.clone(), both.clone())]);
        // One cluster, the endpoints weighted as each registry weighs its instances: Consul's
        // default (Weights.Passing) is 1, Nacos' 1.0, which adapter-nacos makes 100 (Istio's
        // weights are integers). Without a routing rule Nacos takes ~99 % of the requests.
        let weights = eds_weights(&self.mesh.envoy, &main);
        let want: BTreeMap<String, u64> = eps("consul")
            .into_iter()
            .map(|e| (e, 1))
            .chain(eps("nacos").into_iter().map(|e| (e, 100)))
            .collect();
        assert_eq!(weights, want, "Envoy's endpoint weights in {main}");
        let first = self.until_each_answered(
            HOST,
            &[
                "consul-orders-1",
                "consul-orders-2",
                "nacos-orders-1",
                "nacos-orders-2",
            ],
            5000,
        );
        let n: usize = first.values().sum();
        eprintln!(
            "{HOST} with no routing rule: every backend answered within {n} requests: {first:?}"
        );
        let plain = e2e::load::spread(self.proxy(), HOST, &[], 1000);
        let consul: usize = plain
            .iter()
            .filter(|(b, _)| registry_of(b) == "consul")
            .map(|(_, n)| n)
            .sum();
        let expected = 100.0 * 2.0 / 202.0;
        let share = consul as f64 / 10.0;
        assert!(
            (share - expected).abs() <= four_sd(expected / 100.0, 1000),
            "{HOST} with no routing rule: Consul answered {share:.1}% of 1000 requests, its \
             endpoints' weight is {expected:.1}%: {plain:?}"
        );
        self.push_row(format!(
            "  1 no routing rule (endpoint weights consul 1, nacos 100): 1000 requests, \
             consul {share:.1}% ({consul}), {plain:?}"
        ));

        // istiod holds both entries (distinct names), and the endpoints' source labels.
        let configz = self.mesh.istiod.debug("configz");
        let mut entries: Vec<String> = configz_entries(&configz)
            .filter(|e| e["spec"]["hosts"][0] == HOST)
            .map(e2e::ns_name)
            .collect();
        entries.sort();
        assert_eq!(
            entries,
            [format!("{NS}/{CONSUL_NAME}"), format!("{NS}/{NACOS_NAME}")],
            "istiod's ServiceEntries for {HOST}"
        );
        let shards = shard_endpoints(&self.mesh.istiod, HOST);
        let labels: BTreeMap<String, (String, String, String)> = shards
            .iter()
            .map(|(a, (port, l))| {
                let get = |k: &str| l[k].as_str().unwrap_or("").to_string();
                (
                    a.clone(),
                    (
                        port.clone(),
                        get("mcp-adapter/registry"),
                        get("mcp-adapter/source"),
                    ),
                )
            })
            .collect();
        let want: BTreeMap<String, (String, String, String)> = ["consul", "nacos"]
            .iter()
            .flat_map(|r| {
                (1..=2).map(move |n| {
                    (
                        addr(r, n).ip().to_string(),
                        ("http".to_string(), r.to_string(), r.to_string()),
                    )
                })
            })
            .collect();
        assert_eq!(
            labels, want,
            "istiod's endpoints for {HOST}: (port name, mcp-adapter/registry, mcp-adapter/source)"
        );

        // Subsets per registry, then the weights move under load.
        apply(
            &self.kube,
            &destination_rule(&[
                ("consul", "mcp-adapter/registry", "consul"),
                ("nacos", "mcp-adapter/registry", "nacos"),
            ]),
        );
        self.expect_envoy(
            HOST,
            &[
                (main, both),
                (cluster("consul", HOST), eps("consul")),
                (cluster("nacos", HOST), eps("nacos")),
            ],
        );
        apply(
            &self.kube,
            &virtual_service(&[("consul", 100), ("nacos", 0)]),
        );
        self.expect_route(&[("consul", 100)]);
        let load = Steady::start(self.proxy(), HOST);
        let windows: Vec<Window> = [
            [("consul", 100), ("nacos", 0)],
            [("consul", 90), ("nacos", 10)],
            [("consul", 0), ("nacos", 100)],
        ]
        .iter()
        .map(|w| self.shift(w))
        .collect();
        let report = load.stop();
        self.check("1 the move", &report, &windows);
    }

    /// Step 5: When a rule is not met. Port names differ (`--port-name` left out: Consul's port is
    /// `http-18080`, Nacos' `http`): istiod holds all four endpoints, but the proxy gets one
    /// entry's service and only the endpoints of its port name, so one registry only is
    /// served: the older entry's, and on equal creation times (the two adapters give Consul's
    /// and Nacos' services none, so both are the fixed 1970 one) whichever istiod lists first.
    /// Namespaces differ: the proxy (in a third namespace) gets one namespace's entry only,
    /// the older one, on equal creation times the namespace first in alphabetical order.
    fn rules_not_met(&mut self) {
        // Other port names.
        let shards = settle(&format!("istiod's endpoints for {PORTS_HOST}"), || {
            let s = shard_endpoints(&self.mesh.istiod, PORTS_HOST);
            (s.len() == 4)
                .then_some(s.clone())
                .ok_or_else(|| format!("{s:?}"))
        });
        let port_names: BTreeMap<String, String> = shards
            .iter()
            .map(|(a, (p, _))| (a.clone(), p.clone()))
            .collect();
        let want: BTreeMap<String, String> = ["consul", "nacos"]
            .iter()
            .flat_map(|r| {
                let port = if *r == "consul" { "http-18080" } else { "http" };
                (1..=2).map(move |n| (addr(r, n).ip().to_string(), port.to_string()))
            })
            .collect();
        assert_eq!(
            port_names, want,
            "{PORTS_HOST}: istiod's endpoints by port name"
        );
        let services = settle(&format!("{PORTS_HOST}: two services in istiod"), || {
            let s = registry_services(&self.mesh.istiod, PORTS_HOST);
            (s.len() == 2)
                .then_some(s.clone())
                .ok_or_else(|| format!("{s:?}"))
        });
        let main = cluster("", PORTS_HOST);
        let served = settle(
            &format!("{PORTS_HOST}: one registry's endpoints in Envoy"),
            || {
                let v = self.mesh.envoy.clusters_of(PORTS_HOST);
                let got = v.get(&main).cloned().unwrap_or_default();
                ["consul", "nacos"]
                    .into_iter()
                    .find(|r| v.len() == 1 && got == eps(r))
                    .ok_or_else(|| format!("{v:?}"))
            },
        );
        // Which one: the older entry's; equal times, either.
        let created = |port: &str| {
            services
                .iter()
                .find(|(_, p, _)| p == &format!("{PORT}/{port}"))
                .map(|(_, _, c)| c.clone())
                .unwrap_or_else(|| panic!("{PORTS_HOST}: no {port} service in {services:?}"))
        };
        let (consul_t, nacos_t) = (created("http-18080"), created("http"));
        if consul_t != nacos_t {
            let older = if consul_t < nacos_t {
                "consul"
            } else {
                "nacos"
            };
            assert_eq!(served, older, "{PORTS_HOST}: services {services:?}");
        }
        let answers = self.spread(PORTS_HOST, 200);
        assert!(
            answers.keys().all(|b| registry_of(b) == served),
            "{PORTS_HOST}: Envoy holds {served}'s endpoints, answers came from {answers:?}"
        );
        eprintln!(
            "{PORTS_HOST} (port names http-18080 / http): istiod's registry {services:?}; only \
             {served}'s endpoints serve: {answers:?}"
        );
        self.push_row(format!(
            "  5 port names differ: istiod holds 4 endpoints; Envoy and 200 requests: {served} \
             only {answers:?} (creation times consul {consul_t}, nacos {nacos_t})"
        ));

        // Other namespaces.
        let services = settle(&format!("{NS_HOST} in two namespaces"), || {
            let s = registry_services(&self.mesh.istiod, NS_HOST);
            (s.len() == 2)
                .then_some(s.clone())
                .ok_or_else(|| format!("{s:?}"))
        });
        let (consul_t, nacos_t) = (&services[0].2, &services[1].2);
        assert_eq!(
            (services[0].0.as_str(), services[1].0.as_str()),
            (NS_CONSUL, NS_NACOS),
            "{services:?}"
        );
        // Alphabetical on a tie: mig-consul before mig-nacos.
        let winner = if nacos_t < consul_t {
            "nacos"
        } else {
            "consul"
        };
        self.expect_envoy(NS_HOST, &[(cluster("", NS_HOST), eps(winner))]);
        let answers = self.spread(NS_HOST, 200);
        assert!(
            answers.keys().all(|b| registry_of(b) == winner),
            "{NS_HOST}: answers {answers:?}"
        );
        eprintln!(
            "{NS_HOST} ({NS_CONSUL} / {NS_NACOS}): istiod's registry {services:?}; only \
             {winner}'s endpoints serve: {answers:?}"
        );
        self.push_row(format!(
            "  5 namespaces differ: Envoy and 200 requests: {winner} only {answers:?} \
             (creation times {NS_CONSUL} {consul_t}, {NS_NACOS} {nacos_t})"
        ));
    }

    /// `n` requests for `host`, every one answered; the backends that answered, counted.
    fn spread(&self, host: &str, n: usize) -> BTreeMap<String, usize> {
        e2e::load::spread(self.proxy(), host, &[], n)
    }

    /// How often istiod logged that a config source's stream closed.
    fn sources_closed(&self) -> usize {
        self.mesh
            .istiod
            .log()
            .matches("connection closed with err")
            .count()
    }

    /// Step 3: adapter-consul is SIGKILLed under load with the weights at 50/50. istiod notices
    /// (its MCP client logs the closed stream and retries) and keeps the last state it had
    /// from that source: Consul's entry stays in its config, Envoy keeps Consul's endpoints,
    /// and no request fails; Nacos' share is undisturbed. The flip side: nothing from Consul
    /// reaches the mesh while the adapter is down (an instance deregistered meanwhile keeps
    /// taking requests). The adapter comes back on the same port, istiod reconnects and gets
    /// Consul's state as it is then.
    fn adapter_killed(&mut self) {
        let half = [("consul", 50), ("nacos", 50)];
        let load = Steady::start(self.proxy(), HOST);
        let before = self.shift(&half);
        let closed = self.sources_closed();
        let t_kill = Instant::now();
        self.consul_adapter.kill();
        wait_for(
            Duration::from_secs(30),
            "istiod logs the closed stream of adapter-consul",
            || (self.sources_closed() > closed).then_some(()),
        );
        let noticed = t_kill.elapsed();
        let down = self.window("50/50, adapter-consul killed".into(), &half);
        let configz = self.mesh.istiod.debug("configz");
        let entries: Vec<String> = configz_entries(&configz)
            .filter(|e| e["spec"]["hosts"][0] == HOST)
            .map(e2e::ns_name)
            .collect();
        assert!(
            entries.contains(&format!("{NS}/{CONSUL_NAME}")),
            "istiod dropped adapter-consul's entry when it went away: {entries:?}"
        );
        let both: Vec<String> = [eps("consul"), eps("nacos")].concat();
        let kept = view(&[
            (cluster("", HOST), both),
            (cluster("consul", HOST), eps("consul")),
            (cluster("nacos", HOST), eps("nacos")),
        ]);
        assert_eq!(
            self.mesh.envoy.clusters_of(HOST),
            kept,
            "Envoy's clusters with adapter-consul down"
        );

        // Meanwhile Consul changes: one instance leaves (it keeps running and answering).
        // Nothing reads Consul for the mesh now: Envoy keeps sending it requests, still 2 s
        // later (twice the bound tests/traffic.rs holds Consul's changes to).
        let t_stale = Instant::now();
        self.consul.deregister("n1", "orders-2");
        let stale = &self.backends["consul-orders-2"];
        wait_for(
            Duration::from_secs(30),
            "consul-orders-2, deregistered while adapter-consul is down, takes requests 2 s later",
            || {
                stale
                    .first_hit_since(t_stale + Duration::from_secs(2))
                    .map(|_| ())
            },
        );
        // istiod did hear of the change, from step 5's adapter-consul (alive, reading the same
        // Consul), not from the one that is down.
        let addresses = |name: &str| -> Vec<String> {
            let configz = self.mesh.istiod.debug("configz");
            let found: Vec<String> = configz_entries(&configz)
                .find(|e| e2e::ns_name(e) == name)
                .map(|e| {
                    e["spec"]["endpoints"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x["address"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            found
        };
        let one_ip = addr("consul", 1).ip().to_string();
        settle(
            "step 5's adapter-consul serves orders without orders-2",
            || {
                let a = addresses(&format!("{PORTS_NS}/{CONSUL_NAME}"));
                (a == [one_ip.as_str()])
                    .then_some(())
                    .ok_or_else(|| format!("{a:?}"))
            },
        );
        let mut held = addresses(&format!("{NS}/{CONSUL_NAME}"));
        held.sort();
        assert_eq!(
            held,
            [one_ip.clone(), addr("consul", 2).ip().to_string()],
            "istiod's {NS}/{CONSUL_NAME} with its adapter down"
        );
        assert_eq!(
            self.mesh.envoy.clusters_of(HOST),
            kept,
            "Envoy's clusters with adapter-consul down, orders-2 gone from Consul"
        );

        // Back on the same port: istiod reconnects and gets Consul's state as it is now.
        self.consul_adapter.restart();
        self.consul_adapter.wait_ready();
        // istiod retries with exponential backoff (500 ms growing to 60 s, jittered).
        let back = wait_for(
            Duration::from_secs(120),
            "istiod reconnects to adapter-consul",
            || (self.consul_adapter.metric("mcp_adapter_connected_sinks") > 0.0).then(Instant::now),
        );
        let down_for = back.duration_since(t_kill);
        let one = addr("consul", 1).to_string();
        let nacos_eps = eps("nacos");
        let mut three = nacos_eps.clone();
        three.push(one.clone());
        self.expect_envoy(
            HOST,
            &[
                (cluster("", HOST), three),
                (cluster("consul", HOST), vec![one]),
                (cluster("nacos", HOST), nacos_eps),
            ],
        );
        let caught_up = back.elapsed();
        self.consul.register(&consul_instance(2));
        settle("Envoy with orders-2 back", || {
            let v = self.mesh.envoy.clusters_of(HOST);
            (v == kept).then_some(()).ok_or_else(|| format!("{v:?}"))
        });
        let after = self.window("50/50, adapter-consul back".into(), &half);
        let report = load.stop();
        eprintln!(
            "adapter-consul killed: istiod noticed in {noticed:?} and kept its entry; an \
             instance deregistered meanwhile still took requests 2 s later; istiod \
             reconnected {down_for:?} after the kill, Envoy dropped the instance {caught_up:?} \
             after that"
        );
        self.push_row(format!(
            "  3 adapter-consul killed: istiod kept its entry and endpoints, reconnected \
             {down_for:?} after the kill; an instance deregistered while it was down kept taking \
             requests until then (+{caught_up:?})"
        ));
        self.check("3 adapter killed", &report, &[before, down, after]);
    }

    /// Step 2: Every instance taken out of Consul. First the wrong order: the routing still sends
    /// 50 % to the `consul` subset. Until Envoy drops Consul's endpoints the (still running)
    /// instances answer; from then on the `consul` subset is empty and every request the
    /// routing sends there fails (503, no healthy upstream): not a transient while Envoy catches
    /// up but the weight's share, for as long as the weight stays. That is what is asserted (the
    /// failures' share within [`TOLERANCE`] of the weight, every one a 503) and counted. Once
    /// the routing says Nacos only, not one request fails. Then the right order: Consul's
    /// instances back, the routing at Nacos only first, then the deregistration: 0 failures.
    fn consul_emptied(&mut self) {
        let half = [("consul", 50), ("nacos", 50)];
        let load = Steady::start(self.proxy(), HOST);
        let before = self.shift(&half);
        let t_dereg = Instant::now();
        for n in 1..=2 {
            self.consul.deregister("n1", &format!("orders-{n}"));
        }
        let both_nacos = eps("nacos");
        let emptied = view(&[
            (cluster("", HOST), both_nacos.clone()),
            (cluster("consul", HOST), vec![]),
            (cluster("nacos", HOST), both_nacos.clone()),
        ]);
        settle("Envoy drops Consul's endpoints", || {
            let v = self.mesh.envoy.clusters_of(HOST);
            (v == emptied).then_some(()).ok_or_else(|| format!("{v:?}"))
        });
        let t_caught = Instant::now();
        // How long a failed request takes through Envoy, read to the connection's close (as
        // `e2e::load::request` does) and to its content-length ([`fetch`]).
        let timed = |f: &dyn Fn() -> Result<String, String>| {
            (0..40).find_map(|_| {
                let t = Instant::now();
                f().err().map(|_| t.elapsed())
            })
        };
        let to_close = timed(&|| request(self.proxy(), HOST, &[]));
        let to_length = timed(&|| fetch(self.proxy(), HOST));
        eprintln!(
            "a request failed by Envoy (503 no healthy upstream) takes {to_close:?} read to the \
             connection's close, {to_length:?} read to its content-length"
        );
        // Requests done after t_caught were sent after it, but for the few in flight.
        let done = load.done();
        wait_for(
            Duration::from_secs(120),
            "requests after Envoy dropped Consul's endpoints",
            || (load.done() >= done + needed(&half) + 30).then_some(()),
        );
        let t_after = Instant::now();
        let fixed = [("consul", 0), ("nacos", 100)];
        apply(&self.kube, &virtual_service(&fixed));
        self.expect_route(&fixed);
        let t_fixed = Instant::now();
        self.wait_requests(t_fixed, STEP_REQUESTS + 30);
        let t_end = Instant::now();
        let report = load.stop();

        let b = Counted::of(&report, before.from, before.to);
        // From the deregistration to when this test saw Envoy without Consul's endpoints:
        // Consul's (running) instances answer until Envoy has the update, every request routed
        // to the `consul` subset fails after it (including those sent before the poll saw it).
        let catching_up = Counted::of(&report, t_dereg, t_caught);
        let emptied_c = Counted::of(&report, t_caught, t_after);
        let switching = Counted::of(&report, t_after, t_fixed);
        let nacos_only = Counted::of(&report, t_fixed, t_end);
        let since = |t: Instant| t.duration_since(t_dereg);
        let after_dereg = report.outcomes.iter().filter(|o| o.at >= t_dereg);
        let last_consul = after_dereg
            .clone()
            .filter(|o| o.result.as_ref().is_ok_and(|b| registry_of(b) == "consul"))
            .map(|o| since(o.at))
            .max();
        let first_failure = after_dereg
            .filter(|o| o.result.is_err())
            .map(|o| since(o.at))
            .min();
        let all_failures: Vec<&str> = report.failures();
        eprintln!(
            "consul emptied, phases: Envoy seen without Consul {:?}, measured {:?}, \
             VirtualService 0/100 in Envoy {:?}, measured {:?}",
            since(t_caught),
            t_after.duration_since(t_caught),
            t_fixed.duration_since(t_after),
            t_end.duration_since(t_fixed)
        );
        eprintln!(
            "consul emptied at 50/50: last answer from Consul's instances (sent) {last_consul:?} \
             after the deregistration, first failure {first_failure:?}, Envoy seen without \
             them {:?}; {} of {} requests failed while the weight stayed",
            since(t_caught),
            emptied_c.failures.len(),
            emptied_c.requests,
        );
        assert!(b.failures.is_empty(), "before the deregistration: {b:?}");
        assert!(
            (b.share("consul") - 50.0).abs() <= TOLERANCE,
            "50/50 before the deregistration: {:?}",
            b.by_registry
        );
        assert!(
            all_failures
                .iter()
                .all(|f| f.contains(" 503 ") && f.contains("no healthy upstream")),
            "failures other than Envoy's 503 no healthy upstream: {:?}",
            &all_failures[..all_failures.len().min(10)]
        );
        assert!(
            emptied_c.requests >= needed(&half),
            "{} requests measured with the consul subset empty, not {}",
            emptied_c.requests,
            needed(&half)
        );
        assert!(
            (emptied_c.failed_share() - 50.0).abs() <= TOLERANCE,
            "with the consul subset empty and its weight 50, {:.1}% of {} requests failed: {:?}",
            emptied_c.failed_share(),
            emptied_c.requests,
            emptied_c.by_registry
        );
        assert_eq!(
            emptied_c.by_registry.keys().collect::<Vec<_>>(),
            ["nacos"],
            "the answers with Consul emptied"
        );
        assert!(
            nacos_only.failures.is_empty() && nacos_only.requests >= STEP_REQUESTS,
            "once the routing says nacos only: {nacos_only:?}"
        );
        assert_eq!(nacos_only.by_registry.keys().collect::<Vec<_>>(), ["nacos"]);
        self.push_row(b.row("2 consul emptied at 50/50: before"));
        self.push_row(catching_up.row(&format!(
            "2   deregistered -> Envoy seen without (+{:?})",
            since(t_caught)
        )));
        self.push_row(emptied_c.row("2   consul subset empty, weight still 50"));
        self.push_row(switching.row("2   VirtualService -> 0/100 until in Envoy"));
        self.push_row(nacos_only.row("2   routing says nacos only"));
        self.push_row(format!(
            "  2 the whole load {} requests at {:.0}/s (longest gap {:?}), {} failed (all 503 \
             no healthy upstream)",
            report.outcomes.len(),
            report.rate(),
            longest_gap(&report),
            all_failures.len()
        ));

        // The right order: the routing first, then the registry.
        for n in 1..=2 {
            self.consul.register(&consul_instance(n));
        }
        let both: Vec<String> = [eps("consul"), eps("nacos")].concat();
        self.expect_envoy(
            HOST,
            &[
                (cluster("", HOST), both),
                (cluster("consul", HOST), eps("consul")),
                (cluster("nacos", HOST), both_nacos),
            ],
        );
        let load = Steady::start(self.proxy(), HOST);
        let from = Instant::now();
        for n in 1..=2 {
            self.consul.deregister("n1", &format!("orders-{n}"));
        }
        settle("Envoy drops Consul's endpoints again", || {
            let v = self.mesh.envoy.clusters_of(HOST);
            (v == emptied).then_some(()).ok_or_else(|| format!("{v:?}"))
        });
        self.wait_requests(from, STEP_REQUESTS + 30);
        let safe = Window {
            what: "0/100 first, then consul deregistered".into(),
            from,
            to: Instant::now(),
            weights: vec![("nacos".into(), 100)],
            min: STEP_REQUESTS,
        };
        let report = load.stop();
        self.check("2 the right order", &report, &[safe]);
    }

    /// Step 4: The service reaches the cluster: a selector-less Service `orders` in `shop` (port
    /// `http`), two Pods labelled `app: orders` and an EndpointSlice whose endpoints point at
    /// them (istiod labels a Kubernetes endpoint with its Pod's labels; the slice itself carries
    /// no registry label). It appears under load: the Service wins the host, Nacos' entry's
    /// endpoints join its cluster (same port name), and no request fails. Subsets `nacos`
    /// (`mcp-adapter/registry`) and `kubernetes` (`app: orders`) then move the traffic
    /// 100/0 -> 50/50 -> 0/100.
    fn kubernetes_takes_over(&mut self) {
        let load = Steady::start(self.proxy(), HOST);
        let t = Instant::now();
        for n in 1..=2 {
            self.pod(
                &format!("orders-{n}"),
                &addr("kubernetes", n).ip().to_string(),
            );
        }
        self.kube
            .apply_service(&service(NS, SERVICE, &[("http", PORT, PORT)]));
        let endpoints: Vec<Value> = (1..=2)
            .map(|n| {
                let mut e = ready(&addr("kubernetes", n).ip().to_string());
                e["targetRef"] =
                    json!({"kind": "Pod", "name": format!("orders-{n}"), "namespace": NS});
                e
            })
            .collect();
        self.kube.apply_slice(&slice(
            NS,
            "orders-1",
            SERVICE,
            "IPv4",
            &[("http", PORT)],
            endpoints,
        ));
        let k8s_and_nacos: Vec<String> = [eps("kubernetes"), eps("nacos")].concat();
        self.expect_envoy(
            HOST,
            &[
                (cluster("", HOST), k8s_and_nacos.clone()),
                (cluster("consul", HOST), vec![]),
                (cluster("nacos", HOST), eps("nacos")),
            ],
        );
        let appeared = t.elapsed();
        let registries = e2e::istiod::registries_of(&self.mesh.istiod.debug("registryz"), HOST, NS);
        assert!(
            registries.iter().any(|r| r == "Kubernetes"),
            "istiod's registry for {HOST}: {registries:?}"
        );
        let service_in = self.window(
            "Service appeared, routing nacos only".into(),
            &[("nacos", 100)],
        );
        apply(
            &self.kube,
            &destination_rule(&[
                ("consul", "mcp-adapter/registry", "consul"),
                ("nacos", "mcp-adapter/registry", "nacos"),
                ("kubernetes", "app", SERVICE),
            ]),
        );
        self.expect_envoy(
            HOST,
            &[
                (cluster("", HOST), k8s_and_nacos),
                (cluster("consul", HOST), vec![]),
                (cluster("nacos", HOST), eps("nacos")),
                (cluster("kubernetes", HOST), eps("kubernetes")),
            ],
        );
        let mut windows = vec![service_in];
        for w in [
            [("nacos", 100), ("kubernetes", 0)],
            [("nacos", 50), ("kubernetes", 50)],
            [("nacos", 0), ("kubernetes", 100)],
        ] {
            windows.push(self.shift(&w));
        }
        let report = load.stop();
        eprintln!("the Kubernetes Service in Envoy {appeared:?} after it was written");
        self.check("4 kubernetes", &report, &windows);
    }

    /// Pod `name` in [`NS`] labelled `app: orders`, running and ready at `ip` (its status
    /// written as a kubelet would: there is none).
    fn pod(&self, name: &str, ip: &str) {
        let pods = format!("/api/v1/namespaces/{NS}/pods");
        self.kube.apply(
            &pods,
            &json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": NS, "labels": {"app": SERVICE}},
                    "spec": {"automountServiceAccountToken": false,
                             "containers": [{"name": "app", "image": "example.invalid/app:1"}]}}),
        );
        let path = format!("{pods}/{name}");
        let mut pod = self.kube.get(&path).expect("the pod just written");
        pod["status"] = json!({
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        });
        let r = self
            .kube
            .request(ADMIN_TOKEN, "PUT", &format!("{path}/status"), Some(&pod));
        assert_eq!(r.status, 200, "pod status: {}", r.body);
    }
}

#[test]
#[ignore = "needs envoy, pilot-discovery, kube-apiserver, consul and Nacos 2.4.3: scripts/test.sh installs and builds them"]
fn a_service_moves_from_consul_to_nacos_to_kubernetes_under_load() {
    if !isolate("a_service_moves_from_consul_to_nacos_to_kubernetes_under_load") {
        return;
    }
    let started = Instant::now();
    let mut w = World::start();
    let mut t = Instant::now();
    let mut lap = |what: &str| {
        eprintln!("{what} in {:?}", t.elapsed());
        t = Instant::now();
    };
    lap("world");
    w.the_move();
    lap("1 the move");
    w.rules_not_met();
    lap("5 rules not met");
    w.adapter_killed();
    lap("3 adapter killed");
    w.consul_emptied();
    lap("2 consul emptied");
    w.kubernetes_takes_over();
    lap("4 kubernetes");
    eprintln!(
        "migration numbers ({RATE} requests/s through Envoy, each on a new connection):\n{}",
        w.table.join("\n")
    );
    eprintln!("whole test in {:?}", started.elapsed());
}
