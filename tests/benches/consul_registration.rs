//! Registration-to-sink latency and requests per change on a real Consul holding thousands of
//! services (#22 item 9): a new service is registered, how long until a delta xDS sink holds
//! it, and how many requests the adapter sent Consul for it. The floor, measured in the same
//! run, is Consul's own blocking query on that service waking up after the registration.
//!
//!     cargo build --release -p adapter-consul -p mcpctl && cargo bench -p e2e --bench consul_registration
//!
//! `BENCH_SERVICES` (default 5000) services of one instance each, `BENCH_ROUNDS` (default 100)
//! registrations. Needs target/consul/consul from tests/consul/build.sh, or CONSUL_BIN_DIR.

use std::time::{Duration, Instant};

use e2e::consul::{Consul, Registration};
use e2e::{http, Adapter};
use latency::{histogram, p50_p99_ratios, print_quantiles, record};
use mcpctl::sink::{Sink, SinkOptions};

mod latency;

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

/// A sum of the adapter's `mcp_adapter_registry_requests_total` samples matching `label`.
fn requests(a: &Adapter, label: &str) -> f64 {
    a.metric_with("mcp_adapter_registry_requests_total", label)
}

fn main() {
    let services = env_or("BENCH_SERVICES", 5000);
    let rounds = env_or("BENCH_ROUNDS", 100);
    let consul = Consul::start(None);
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
            let path = format!("/v1/health/service/{name}");
            let index = consul_index(&consul, &path);
            let addr = consul.http;
            let waiter = std::thread::spawn(move || {
                let path = format!("{path}?index={index}&wait=30s");
                http(addr, "GET", &path, &[], "").expect("blocking query");
                Instant::now()
            });
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
            let t0 = Instant::now();
            consul.register(
                &Registration::new("node-2", &name, &format!("{name}-0"), "10.250.0.2", 8080)
                    .protocol("http"),
            );
            loop {
                let u = sink.next().await.expect("update");
                if u.state.contains_key(&key) {
                    break;
                }
            }
            record(&mut ours, t0.elapsed());
            per_change.push(requests(&adapter, "mode=\"read\"") - before);
        }
    });
    // Steady afterwards: anything the changes still caused has been sent.
    std::thread::sleep(Duration::from_secs(2));
    let sweeps = requests(&adapter, "endpoint=\"/v1/health/service/:name?index-only\"");
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
        "watches: {} blocking queries answered or open in the whole run",
        requests(&adapter, "mode=\"watch\"")
    );
}
