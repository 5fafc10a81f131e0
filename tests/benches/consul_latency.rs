//! Change-to-sink latency on a real Consul: a check flips, how long until an xDS sink holds the
//! new endpoint set. The floor, measured in the same run, is Consul's own blocking query on the
//! same service waking up after the same kind of write.
//!
//!     cargo build --release -p adapter-consul && cargo bench -p e2e --bench consul_latency
//!
//! (needs target/consul/consul from tests/consul/build.sh, or CONSUL_BIN_DIR).

use std::time::{Duration, Instant};

use e2e::consul::{Consul, Registration};
use e2e::{http, Adapter};
use hdrhistogram::Histogram;
use latency::{histogram, p50_p99_ratios, print_quantiles, record};
use mcpctl::sink::{Sink, SinkOptions};

mod latency;
mod smoke;

/// Check flips per phase (2 in a smoke run).
fn rounds() -> usize {
    smoke::scaled(200, 2)
}
/// Services registered (svc-7 is the one that changes; 8 in a smoke run).
fn service_count() -> usize {
    smoke::scaled(50, 8)
}

fn endpoints(u: &mcpctl::sink::Update, name: &str) -> usize {
    u.state
        .get(&format!("consul/{name}"))
        .map_or(0, |r| r.spec.endpoints.len())
}

fn report(what: &str, h: &Histogram<u64>) {
    print_quantiles(44, what, h);
}

fn consul_index(consul: &Consul, path: &str) -> u64 {
    let (_, body) = consul.request("GET", path, "").expect("consul");
    let _ = body;
    // Read the index from a HEAD-less GET: the harness returns only the body, so ask for it
    // with a non-blocking query through raw HTTP.
    let raw = http_raw(consul, path);
    raw.lines()
        .find_map(|l| {
            l.strip_prefix("X-Consul-Index: ")
                .or_else(|| l.strip_prefix("x-consul-index: "))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1)
}

fn http_raw(consul: &Consul, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(consul.http).expect("connect");
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

/// Flips svc-7-3's check `rounds()` times and records how long until the sink holds each change;
/// `pause` between flips makes them isolated, `None` is sustained churn.
async fn flips(sink: &mut Sink, consul: &Consul, pause: Option<Duration>) -> Histogram<u64> {
    let mut h = histogram();
    for round in 0..rounds() {
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
        let (status, want) = if round % 2 == 0 {
            ("critical", 9)
        } else {
            ("passing", 10)
        };
        let t0 = Instant::now();
        consul.set_check("node-3", "svc-7-3", status);
        loop {
            let u = sink.next().await.expect("update");
            if endpoints(&u, "svc-7") == want {
                break;
            }
        }
        record(&mut h, t0.elapsed());
    }
    h
}

fn main() {
    let consul = Consul::start(None);
    for s in 0..service_count() {
        for i in 0..10 {
            let (node, service, id) = (
                format!("node-{i}"),
                format!("svc-{s}"),
                format!("svc-{s}-{i}"),
            );
            let address = format!("10.1.{s}.{}", i + 1);
            consul.register(
                &Registration::new(&node, &service, &id, &address, 8080).protocol("http"),
            );
        }
    }
    let log_level = std::env::var("BENCH_ADAPTER_LOG").unwrap_or_else(|_| "info".into());
    let adapter = Adapter::start_with_env(
        "adapter-consul",
        &[
            "--consul-addr",
            &consul.addr(),
            "--coalesce",
            "0",
            "--exclude-service",
            "consul",
        ],
        &[("RUST_LOG", log_level.as_str())],
    );
    adapter.wait_ready();

    // Floor: Consul's blocking query on the same service, woken by the same write.
    let mut floor = histogram();
    for round in 0..rounds() {
        let index = consul_index(&consul, "/v1/health/service/svc-7");
        let addr = consul.http;
        let waiter = std::thread::spawn(move || {
            let path = format!("/v1/health/service/svc-7?index={index}&wait=10s");
            http(addr, "GET", &path, &[], "").expect("blocking query");
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(100));
        let status = if round % 2 == 0 {
            "critical"
        } else {
            "passing"
        };
        let t0 = Instant::now();
        consul.set_check("node-3", "svc-7-3", status);
        let woke = waiter.join().expect("waiter");
        record(&mut floor, woke.duration_since(t0));
    }
    consul.set_check("node-3", "svc-7-3", "passing");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (ours, churn) = rt.block_on(async {
        let mut sink = Sink::connect(SinkOptions::new(format!("xds://{}", adapter.grpc)))
            .await
            .expect("sink");
        let mut u = sink.next().await.expect("first state");
        while endpoints(&u, "svc-7") != 10 {
            u = sink.next().await.expect("state");
        }
        let isolated = flips(&mut sink, &consul, Some(Duration::from_millis(100))).await;
        let churn = flips(&mut sink, &consul, None).await;
        (isolated, churn)
    });
    println!(
        "change-to-sink latency on real Consul ({} services x 10 instances, {} check flips, coalescing off)",
        service_count(),
        rounds()
    );
    report("floor: consul blocking query wakes up", &floor);
    report("adapter-consul -> xDS sink, isolated changes", &ours);
    report("same, sustained churn (rate limit 1 query/50ms)", &churn);
    println!("ratio {}", p50_p99_ratios(&ours, &floor));
}
