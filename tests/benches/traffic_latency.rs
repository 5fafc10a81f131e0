//! Registry change -> Envoy: how long after a change in each real registry a stock Envoy, fed by
//! Istio's unmodified istiod (production's shape: `k8s://` first, then every adapter), stops
//! sending requests to an instance taken out and sends the first request to an instance added,
//! under a steady load. Beside it, in the same run:
//! * registry -> sink: when an xDS sink on the adapter holds the change (the adapter's part);
//! * the floor: the same change made to a ServiceEntry object in the mesh cluster (what tools
//!   that write CRDs do), read by the same istiod through `k8s://` and pushed to the same Envoy.
//!
//! What lies between "sink" and "Envoy" is not ours: istiod's debounce (`PILOT_DEBOUNCE_AFTER`,
//! 100 ms by default; set `TRAFFIC_BENCH_DEBOUNCE=10ms` to see its share), its push, and Envoy.
//!
//!     cargo build --release --workspace --bins --examples
//!     cargo bench -p e2e --bench traffic_latency
//!
//! Needs the peers that `scripts/test.sh` builds (envoy, pilot-discovery, kube-apiserver, consul,
//! the Eureka jar, ZooKeeper) and a network namespace of its own (root, or unprivileged user
//! namespaces): see `e2e::netns`. `TRAFFIC_BENCH_ROUNDS` (default 20) changes per registry.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latency::{histogram_of as histogram, ms};
use mcpctl::sink::{Sink, SinkOptions};
use serde_json::{json, Value};

use e2e::backend::Backend;
use e2e::envoy::XdsRejects;
use e2e::istiod::IstiodConfig;
use e2e::kube::KubeApiServer;
use e2e::load::Load;
use e2e::mesh::{apply, mesh_api_server, sidecar_scope, Mesh};
use e2e::netns::{isolate_args, pod_ip};
use e2e::registries::{Instance, Registries, Registry};
use e2e::wait_for;

mod latency;
mod smoke;

const PORT: u16 = 18080;
const SERVICE: &str = "cart";

/// When an xDS sink on one adapter saw `cart`'s endpoint count change, from a thread of its own.
struct SinkWatch {
    seen: Arc<Mutex<Vec<(Instant, usize)>>>,
}

impl SinkWatch {
    fn start(grpc: SocketAddr, key: String) -> SinkWatch {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = seen.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let mut sink = Sink::connect(SinkOptions::new(format!("xds://{grpc}")))
                    .await
                    .expect("sink");
                let mut last = usize::MAX;
                while let Ok(u) = sink.next().await {
                    let n = u.state.get(&key).map_or(0, |r| r.spec.endpoints.len());
                    if n != last {
                        out.lock().expect("seen").push((Instant::now(), n));
                        last = n;
                    }
                }
            });
        });
        SinkWatch { seen }
    }

    /// When the sink first held `n` endpoints at or after `t`.
    fn reached(&self, t: Instant, n: usize) -> Option<Instant> {
        self.seen
            .lock()
            .expect("seen")
            .iter()
            .find(|(at, c)| *at >= t && *c == n)
            .map(|(at, _)| *at)
    }
}

/// One way of changing the endpoints of a service, and where to see it.
trait Source {
    fn name(&self) -> String;
    fn host(&self) -> String;
    fn take_out(&mut self, inst: &Instance);
    fn put_back(&mut self, inst: &Instance);
    /// How long an instance taken out may still see requests before the bench calls it done.
    fn quiet(&self) -> Duration;
    fn sink(&self) -> Option<&SinkWatch>;
}

struct ViaAdapter<'a> {
    registry: &'a mut dyn Registry,
    sink: SinkWatch,
}

impl Source for ViaAdapter<'_> {
    fn name(&self) -> String {
        format!("{} -> adapter", self.registry.kind())
    }
    fn host(&self) -> String {
        self.registry.host(SERVICE)
    }
    fn take_out(&mut self, inst: &Instance) {
        self.registry.deregister(SERVICE, &inst.id);
    }
    fn put_back(&mut self, inst: &Instance) {
        self.registry.register(SERVICE, inst);
    }
    fn quiet(&self) -> Duration {
        // Eureka is polled every second.
        if self.registry.kind() == "eureka" {
            Duration::from_secs(3)
        } else {
            Duration::from_millis(1500)
        }
    }
    fn sink(&self) -> Option<&SinkWatch> {
        Some(&self.sink)
    }
}

/// The floor: a ServiceEntry object in the mesh cluster, replaced with or without an endpoint.
struct ViaCrd<'a> {
    kube: &'a KubeApiServer,
    endpoints: BTreeMap<String, Instance>,
}

impl ViaCrd<'_> {
    fn write(&self) {
        apply(
            self.kube,
            &json!({
                "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
                "metadata": {"name": SERVICE, "namespace": "crd"},
                "spec": {
                    "hosts": [self.host()], "location": "MESH_INTERNAL", "resolution": "STATIC",
                    "ports": [{"number": PORT, "name": "http", "protocol": "HTTP"}],
                    "endpoints": self.endpoints.values()
                        .map(|i| json!({"address": i.addr.ip().to_string()}))
                        .collect::<Vec<Value>>(),
                },
            }),
        );
    }
}

impl Source for ViaCrd<'_> {
    fn name(&self) -> String {
        "ServiceEntry object (k8s://)".into()
    }
    fn host(&self) -> String {
        "cart.crd.internal".into()
    }
    fn take_out(&mut self, inst: &Instance) {
        self.endpoints.remove(&inst.id);
        self.write();
    }
    fn put_back(&mut self, inst: &Instance) {
        self.endpoints.insert(inst.id.clone(), inst.clone());
        self.write();
    }
    fn quiet(&self) -> Duration {
        Duration::from_millis(1500)
    }
    fn sink(&self) -> Option<&SinkWatch> {
        None
    }
}

#[derive(Default)]
struct Row {
    sink_out: Vec<Duration>,
    sink_in: Vec<Duration>,
    envoy_out: Vec<Duration>,
    envoy_in: Vec<Duration>,
    requests: usize,
    failed: usize,
}

/// `rounds` times: take instance x3 out, wait until Envoy stops sending to it (no request for
/// `quiet`), put it back, wait for its first request.
fn measure(src: &mut dyn Source, backends: &[Backend], insts: &[Instance], rounds: usize) -> Row {
    let proxy = SocketAddr::from(([127, 0, 0, 1], PORT));
    let host = src.host();
    let (x3, probe) = (&insts[2], &backends[2]);
    let load = Load::start(proxy, &host, 200, 4);
    wait_for(
        Duration::from_secs(60),
        "all three instances take traffic",
        || {
            backends
                .iter()
                .all(|b| b.count_since(load.started) > 0)
                .then_some(())
        },
    );
    let mut row = Row::default();
    for round in 0..rounds {
        let t = Instant::now();
        src.take_out(x3);
        let quiet = src.quiet();
        let last = wait_for(
            Duration::from_secs(60),
            "the instance taken out gets no more requests",
            || {
                let last = probe.last_hit().unwrap_or(t).max(t);
                (last.elapsed() >= quiet).then_some(last)
            },
        );
        row.envoy_out.push(last.saturating_duration_since(t));
        if let Some(s) = src.sink() {
            let at = wait_for(Duration::from_secs(30), "the sink sees the removal", || {
                s.reached(t, 2)
            });
            row.sink_out.push(at.saturating_duration_since(t));
        }
        let t = Instant::now();
        src.put_back(x3);
        let first = wait_for(
            Duration::from_secs(60),
            "the instance put back gets a request",
            || probe.first_hit_since(t),
        );
        row.envoy_in.push(first.saturating_duration_since(t));
        if let Some(s) = src.sink() {
            let at = wait_for(
                Duration::from_secs(30),
                "the sink sees the addition",
                || s.reached(t, 3),
            );
            row.sink_in.push(at.saturating_duration_since(t));
        }
        // Let the instance settle in before the next removal.
        std::thread::sleep(Duration::from_millis(300));
        eprint!("\r{}: round {}/{rounds}   ", src.name(), round + 1);
    }
    eprintln!();
    let report = load.stop();
    row.requests = report.outcomes.len();
    row.failed = report.failures().len();
    row
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !isolate_args("traffic_latency", &args) {
        return;
    }
    let rounds: usize = std::env::var("TRAFFIC_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(smoke::scaled(20, 1));
    let (mut regs, kube) = Registries::start_with(PORT, mesh_api_server);

    // Three instances per source, on 10.77.<k>.1-3.
    let fleet = |k: u8, kind: &str| -> (Vec<Backend>, Vec<Instance>) {
        let insts: Vec<Instance> = (1..=3)
            .map(|n| Instance::new(&format!("x{n}"), SocketAddr::from((pod_ip(k, n), PORT))))
            .collect();
        let backends = insts
            .iter()
            .map(|i| Backend::http(&format!("{kind}-{}", i.id), &i.addr.to_string()))
            .collect();
        (backends, insts)
    };
    let mut fleets = Vec::new();
    for (k, r) in regs.all_mut().into_iter().enumerate() {
        let (b, insts) = fleet(10 + k as u8, r.kind());
        for i in &insts {
            r.register(SERVICE, i);
        }
        r.adapter().wait_ready();
        fleets.push((b, insts));
    }
    let (crd_backends, crd_insts) = fleet(20, "crd");
    let mut crd = ViaCrd {
        kube: &kube,
        endpoints: crd_insts
            .iter()
            .map(|i| (i.id.clone(), i.clone()))
            .collect(),
    };
    crd.write();
    let mut scope = regs.namespaces();
    scope.push("crd".into());
    apply(&kube, &sidecar_scope(&scope));

    let mut config = IstiodConfig::production();
    if let Ok(d) = std::env::var("TRAFFIC_BENCH_DEBOUNCE") {
        config.env.push(("PILOT_DEBOUNCE_AFTER".into(), d));
    }
    let mesh = Mesh::start_with(&kube, &regs.sources(), config.clone());
    let debounce = config
        .env
        .iter()
        .find(|(k, _)| k == "PILOT_DEBOUNCE_AFTER")
        .map_or("100ms (default)".to_string(), |(_, v)| v.clone());

    let mut rows: Vec<(String, Row)> = Vec::new();
    rows.push((
        crd.name(),
        measure(&mut crd, &crd_backends, &crd_insts, rounds),
    ));
    for (r, (backends, insts)) in regs.all_mut().into_iter().zip(&fleets) {
        let key = format!("{}/{}", r.namespace(), r.name(SERVICE));
        let sink = SinkWatch::start(r.adapter().grpc, key);
        let mut src = ViaAdapter { registry: r, sink };
        let row = measure(&mut src, backends, insts, rounds);
        rows.push((src.name(), row));
    }
    // Envoy's own reject counters (each must be there) are 0; istiod's is "absent or 0" (it
    // creates the series at its first reject: see `World::no_rejects` in tests/traffic.rs,
    // whose test also shows that a reject makes it appear).
    assert_eq!(
        mesh.envoy.xds_rejects(),
        XdsRejects::default(),
        "Envoy rejected config; it logged:\n{}",
        mesh.envoy.rejections_logged()
    );
    assert_eq!(
        mesh.istiod.metric("pilot_total_xds_rejects"),
        0.0,
        "istiod heard of a reject Envoy does not count"
    );

    println!(
        "registry -> Envoy: {rounds} removals and {rounds} additions per source, 200 requests/s, \
         istiod PILOT_DEBOUNCE_AFTER {debounce}; ms"
    );
    println!(
        "{:<30} {:>17} {:>17} {:>17} {:>17} {:>9}",
        "source",
        "sink out p50/p99",
        "Envoy out p50/p99",
        "sink in p50/p99",
        "Envoy in p50/p99",
        "failed"
    );
    let floor = &rows[0].1;
    let (floor_out, floor_in) = (histogram(&floor.envoy_out), histogram(&floor.envoy_in));
    for (name, row) in &rows {
        let pair = |v: &[Duration]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                let h = histogram(v);
                format!("{:.0} / {:.0}", ms(&h, 0.5), ms(&h, 0.99))
            }
        };
        println!(
            "{:<30} {:>17} {:>17} {:>17} {:>17} {:>4}/{:<5}",
            name,
            pair(&row.sink_out),
            pair(&row.envoy_out),
            pair(&row.sink_in),
            pair(&row.envoy_in),
            row.failed,
            row.requests
        );
    }
    println!("ratio to the floor (Envoy p50, out / in):");
    for (name, row) in rows.iter().skip(1) {
        let (o, i) = (histogram(&row.envoy_out), histogram(&row.envoy_in));
        println!(
            "  {:<30} {:.2}x / {:.2}x",
            name,
            ms(&o, 0.5) / ms(&floor_out, 0.5).max(0.001),
            ms(&i, 0.5) / ms(&floor_in, 0.5).max(0.001)
        );
    }
}
