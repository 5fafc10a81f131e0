//! Issue #12: how many bytes one endpoint of the model costs while a registry's services exist.
//!
//! Builds 100k services x 10 endpoints (1M endpoints) shaped like a Kubernetes or Consul
//! registry: three labels per endpoint (`app=<service>`, `version=v1|v2`, `zone=a|b|c`, so five
//! distinct label sets per service), a locality per endpoint that follows its zone, a service
//! account per service, a network for one service in four, and an endpoint port mapping on one
//! endpoint in ten. The heap is read as VmRSS from /proc/self/status (the workspace forbids the
//! `unsafe` a counting allocator needs); mimalloc is the global allocator as in the adapters.
//!
//! Printed:
//! - the model: RSS growth while building it, per endpoint (the number issue #12 targets);
//! - a re-list: a second, equal model built while the first is alive (what an adapter holds
//!   while a Reset replaces the previous one), per endpoint;
//! - the build time of one model (conversion cost an adapter pays per full re-list).
//!
//! Run: `cargo bench -p mcp-core --bench model_size` (`MODEL_SIZE_SERVICES=10000` for a quick run).

mod common;

// The same allocator as the adapter binaries.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;
use std::time::Instant;

use mcp_core::model::{Endpoint, Labels, Port, Service, ServiceKey};
use mcp_core::testing::bench::Proc;

use common::machine;

const SERVICES: usize = 100_000;
const ENDPOINTS: usize = 10;
const ZONES: [&str; 3] = ["a", "b", "c"];

/// Endpoint `j` of service `i`, built as an adapter's convert code builds it: fresh strings and
/// a fresh label map per endpoint, straight from the registry's data.
fn endpoint(i: usize, j: usize, name: &str) -> Endpoint {
    let zone = ZONES[j % ZONES.len()];
    let n = i * ENDPOINTS + j;
    let mut labels = Labels::new();
    labels.insert("app".into(), name.to_string());
    labels.insert(
        "version".into(),
        if j.is_multiple_of(5) { "v2" } else { "v1" }.to_string(),
    );
    labels.insert("zone".into(), format!("us-east-1{zone}"));
    let mut e = Endpoint {
        address: format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255),
        labels: labels.into(),
        locality: Some(format!("us-east-1/us-east-1{zone}").into()),
        service_account: Some(name.to_string().into()),
        network: i.is_multiple_of(4).then(|| "network-1".to_string().into()),
        ..Default::default()
    };
    if j == 9 {
        e.ports = [("http".to_string(), 8081)].into_iter().collect();
    }
    e
}

fn service(i: usize) -> Service {
    let name = format!("svc-{i:06}");
    let mut s = Service::new(ServiceKey::new(&name), format!("bench service {name}"));
    s.ports.push(Port {
        number: 8080,
        name: "http".into(),
        protocol: Some("HTTP".into()),
        target_port: None,
    });
    s.endpoints = (0..ENDPOINTS).map(|j| endpoint(i, j, &name)).collect();
    s
}

fn model(services: usize) -> Vec<Service> {
    (0..services).map(service).collect()
}

fn main() {
    let services: usize = std::env::var("MODEL_SIZE_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SERVICES);
    let endpoints = services * ENDPOINTS;
    // Warm up the allocator and the code paths on a small model first.
    black_box(model(100));

    let start = Proc::This.mem().rss_kib;
    let t = Instant::now();
    let first = model(services);
    let build = t.elapsed();
    let built = Proc::This.mem().rss_kib;
    let second = model(services);
    let relisted = Proc::This.mem();
    assert!(first == second, "equal input, equal model");

    let per = |kib: u64| kib as f64 * 1024.0 / endpoints as f64;
    println!();
    println!(
        "== model size, {services} services x {ENDPOINTS} endpoints ({endpoints} endpoints) =="
    );
    println!("machine: {}", machine());
    println!(
        "model:          {:>8.1} MiB  {:>7.1} B/endpoint  ({:.0} MiB per 100k endpoints)",
        (built - start) as f64 / 1024.0,
        per(built - start),
        per(built - start) * 100_000.0 / (1024.0 * 1024.0),
    );
    println!(
        "second model:   {:>8.1} MiB  {:>7.1} B/endpoint  (an equal re-list while the first lives)",
        (relisted.rss_kib - built) as f64 / 1024.0,
        per(relisted.rss_kib - built),
    );
    println!(
        "build:          {:>8.1} ms   {:>7.1} ns/endpoint",
        build.as_secs_f64() * 1e3,
        build.as_nanos() as f64 / endpoints as f64
    );
    println!("peak RSS:       {:>8.1} MiB", relisted.hwm_mib());
    drop(second);
    drop(first);
}
