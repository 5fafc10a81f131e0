//! Registration-to-sink latency and requests per change on a real Consul holding thousands of
//! services (#22 item 9): a new service is registered, how long until a delta xDS sink holds
//! it, and how many requests the adapter sent Consul for it. The floor, measured in the same
//! run, is Consul's own blocking query on that service waking up after the registration.
//!
//!     cargo build --release -p adapter-consul -p mcpctl && cargo bench -p e2e --bench consul_registration
//!
//! A second phase adds an instance to an existing service, a different one each round: the
//! floor is a blocking query on that service woken by the same write, and the adapter's path is
//! that service's own blocking query (`--consul-service-watches`), or a sweep for services
//! beyond it. A third churns five services (an instance added, then removed, in turn): with
//! fewer own queries than services, those that change take them.
//!
//! `BENCH_SERVICES` (default 5000) services of one instance each, `BENCH_ROUNDS` (default 100)
//! registrations per phase, `BENCH_SERVICE_WATCHES` (default: every service, with the agent's
//! `limits.http_max_conns_per_client` raised to fit, as the adapter's README advises for large
//! catalogs; 128 is the shipped default). Needs target/consul/consul from
//! tests/consul/build.sh, or CONSUL_BIN_DIR.

use std::time::{Duration, Instant, SystemTime};

use e2e::consul::{Consul, Registration};
use e2e::{http, Adapter};
use latency::{histogram, histogram_of, p50_p99_ratios, print_quantiles, record};
use mcpctl::sink::{Sink, SinkOptions};

mod latency;
mod smoke;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `X-Consul-Index` of a non-blocking read of `path`.
fn consul_index(consul: &Consul, path: &str) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(consul.http).expect("connect");
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("x-consul-index")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(1)
}

/// Services of phase 3, none of phase 2's (`round * 37 % 5000` for 100 rounds).
const HOT: [usize; 5] = [7, 1007, 2007, 3007, 4007];

/// The instance changes of one phase: the floor, the adapter, and the reads each cost.
#[derive(Default)]
struct InstancePhase {
    floor: Vec<Duration>,
    ours: Vec<Duration>,
    reads: Vec<f64>,
}

impl InstancePhase {
    /// Adds (or removes) the instance `svc-<s>-extra` of `svc-<s>`, timed against Consul's
    /// own blocking query on that service woken by the same write.
    async fn change(
        &mut self,
        consul: &Consul,
        adapter: &Adapter,
        sink: &mut Sink,
        s: usize,
        add: bool,
    ) {
        let name = format!("svc-{s}");
        let key = format!("consul/{name}");
        let extra = format!("{name}-extra");
        let waiter = blocking_query(consul, &name);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = requests(adapter, "mode=\"read\"");
        let t0 = Instant::now();
        let sent = SystemTime::now();
        if add {
            let ip = format!("10.251.{}.{}", s / 250, s % 250);
            consul
                .register(&Registration::new("node-3", &name, &extra, &ip, 8080).protocol("http"));
        } else {
            consul.deregister("node-3", &extra);
        }
        let want = if add { 2 } else { 1 };
        loop {
            let u = sink.next().await.expect("update");
            if u.state
                .get(&key)
                .is_some_and(|r| r.spec.endpoints.len() == want)
            {
                self.ours.push(since(sent, u.at));
                break;
            }
        }
        let woke = waiter.join().expect("waiter");
        self.floor.push(woke.duration_since(t0));
        self.reads.push(requests(adapter, "mode=\"read\"") - before);
    }

    fn print(&mut self, title: &str) {
        let (floor, ours) = (histogram_of(&self.floor), histogram_of(&self.ours));
        println!("{title}");
        print_quantiles(48, "floor: consul blocking query on the service", &floor);
        print_quantiles(48, "adapter-consul -> delta xDS sink", &ours);
        println!("ratio {}", p50_p99_ratios(&ours, &floor));
        self.reads.sort_by(f64::total_cmp);
        println!(
            "reads per change (at the sink): min {} median {} max {}",
            self.reads[0],
            self.reads[self.reads.len() / 2],
            self.reads[self.reads.len() - 1]
        );
    }
}

/// Consul's own blocking query on `service` from its current index, on a thread: when it woke.
fn blocking_query(consul: &Consul, service: &str) -> std::thread::JoinHandle<Instant> {
    let path = format!("/v1/health/service/{service}");
    let index = consul_index(consul, &path);
    let addr = consul.http;
    std::thread::spawn(move || {
        let path = format!("{path}?index={index}&wait=30s");
        http(addr, "GET", &path, &[], "").expect("blocking query");
        Instant::now()
    })
}

/// From the write to the moment the sink received the response that held it (before the sink
/// decodes it and copies its whole state: the bench's own cost, not the adapter's).
fn since(sent: SystemTime, received: SystemTime) -> Duration {
    received.duration_since(sent).unwrap_or_default()
}

/// A sum of the adapter's `mcp_adapter_registry_requests_total` samples matching `label`.
fn requests(a: &Adapter, label: &str) -> f64 {
    a.metric_with("mcp_adapter_registry_requests_total", label)
}

fn main() {
    let services = env_or("BENCH_SERVICES", smoke::scaled(5000, 20));
    let rounds = env_or("BENCH_ROUNDS", smoke::scaled(100, 2));
    let own_watches = env_or("BENCH_SERVICE_WATCHES", services + 200);
    let limits = format!(
        "limits {{ http_max_conns_per_client = {} }}",
        (own_watches + 300).max(200)
    );
    let consul = Consul::start(Some(&limits));
    let t = Instant::now();
    let existing: Vec<Registration> = (0..services)
        .map(|s| {
            Registration::new(
                &format!("node-{}", s % 100),
                &format!("svc-{s}"),
                &format!("svc-{s}-0"),
                &format!("10.{}.{}.1", s / 250, s % 250),
                8080,
            )
            .protocol("http")
        })
        .collect();
    consul.register_bulk(&existing);
    eprintln!("registered {services} services in {:?}", t.elapsed());
    let adapter = Adapter::start_with_env(
        "adapter-consul",
        &[
            "--consul-addr",
            &consul.addr(),
            "--coalesce",
            "0",
            // The floor's services: registered, never fetched.
            "--exclude-service",
            "consul,floor-*",
            "--consul-service-watches",
            &own_watches.to_string(),
        ],
        &[("RUST_LOG", "info")],
    );
    e2e::wait_for(Duration::from_secs(120), "every service served", || {
        (adapter.metric("mcp_adapter_resources") >= services as f64).then_some(())
    });
    adapter.wait_ready();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut floor = histogram();
    let mut ours = histogram();
    // What the catalog watch's every answer costs: the whole name -> tags map, read and sent.
    let mut catalog = histogram();
    let mut per_change = Vec::new();
    let mut cold = InstancePhase::default();
    let mut hot = InstancePhase::default();
    rt.block_on(async {
        let mut sink = Sink::connect(SinkOptions::new(format!("delta://{}", adapter.grpc)))
            .await
            .expect("sink");
        let mut u = sink.next().await.expect("first state");
        while u.state.len() < services {
            u = sink.next().await.expect("state");
        }
        for round in 0..rounds {
            // Floor: a blocking query on a service not registered yet, woken by its
            // registration.
            let name = format!("floor-{round}");
            let waiter = blocking_query(&consul, &name);
            tokio::time::sleep(Duration::from_millis(100)).await;
            let t0 = Instant::now();
            consul.register(
                &Registration::new("node-1", &name, &format!("{name}-0"), "10.250.0.1", 8080)
                    .protocol("http"),
            );
            let woke = waiter.join().expect("waiter");
            record(&mut floor, woke.duration_since(t0));

            let t0 = Instant::now();
            consul.must("GET", "/v1/catalog/services", "");
            record(&mut catalog, t0.elapsed());

            // Ours: the same registration of a wanted service, until the sink holds it.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let before = requests(&adapter, "mode=\"read\"");
            let name = format!("new-{round}");
            let key = format!("consul/{name}");
            let t0 = SystemTime::now();
            consul.register(
                &Registration::new("node-2", &name, &format!("{name}-0"), "10.250.0.2", 8080)
                    .protocol("http"),
            );
            loop {
                let u = sink.next().await.expect("update");
                if u.state.contains_key(&key) {
                    record(&mut ours, since(t0, u.at));
                    break;
                }
            }
            per_change.push(requests(&adapter, "mode=\"read\"") - before);
        }
        // Phase 2: an instance added to an existing service, a different one each round; the
        // floor's blocking query on that service and the adapter see the same write.
        for round in 0..rounds {
            let s = (round * 37) % services;
            cold.change(&consul, &adapter, &mut sink, s, true).await;
        }
        // Phase 3: churn on five services (an instance added, then removed, in turn): with
        // fewer own queries than services, the ones that change take them.
        for round in 0..rounds {
            // (A smoke run's 20 services: the last ones, which phase 2's two rounds miss.)
            let i = round % HOT.len();
            let s = if HOT[i] < services {
                HOT[i]
            } else {
                services - 1 - i
            };
            let add = (round / HOT.len()).is_multiple_of(2);
            hot.change(&consul, &adapter, &mut sink, s, add).await;
        }
    });
    // Steady afterwards: anything the changes still caused has been sent.
    std::thread::sleep(Duration::from_secs(2));
    // (+ 0.0: no such series yet reads as -0.)
    let sweeps = requests(&adapter, "endpoint=\"/v1/health/service/:name?index-only\"") + 0.0;
    per_change.sort_by(f64::total_cmp);
    println!(
        "registration-to-sink on real Consul ({services} services, {rounds} registrations, each after a filtered-out one, coalescing off, delta xDS sink)"
    );
    print_quantiles(48, "floor: consul blocking query on the service", &floor);
    print_quantiles(48, "adapter-consul -> delta xDS sink", &ours);
    println!("ratio {}", p50_p99_ratios(&ours, &floor));
    print_quantiles(
        48,
        "GET /v1/catalog/services (what each answer reads)",
        &catalog,
    );
    println!(
        "reads per registration (at the sink): min {} median {} max {}; sweep requests in the whole run: {sweeps}",
        per_change[0],
        per_change[per_change.len() / 2],
        per_change[per_change.len() - 1]
    );
    println!(
        "{} services with their own query at the end",
        adapter.metric("mcp_adapter_registry_service_watches")
    );
    cold.print("an instance added to an existing service, a different one each round");
    hot.print("churn on five services: an instance added, then removed, in turn");
    println!(
        "watches: {} blocking queries answered or open in the whole run",
        requests(&adapter, "mode=\"watch\"")
    );
    let status = adapter
        .pid()
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .unwrap_or_default();
    for field in ["VmRSS", "VmHWM", "Threads"] {
        if let Some(l) = status.lines().find(|l| l.starts_with(field)) {
            println!("adapter {l}");
        }
    }
}
