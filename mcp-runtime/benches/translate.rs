//! Target 1 (BENCHMARKS.md, "Results"): translate + encode of 10k services x 10 endpoints <= 60 ms.
//!
//! Benchmarks (all over the same 10k `mk_service(_, 10)` services, one snapshot per iteration;
//! `MCP_BENCH_SERVICES=100000` runs them at 100k services = 1M endpoints, whose target (issue
//! #12) is registry Reset -> snapshot published <= 2 s, i.e. `ours/index_reset_flush`):
//! - `ours/translate+encode`: `translate` + `cache::encode` per service (the per-service work);
//! - `ours/index_reset_flush`: `Index::apply(Reset)` + `flush()` on a fresh index (what the
//!   runtime's writer really runs: content hash, translate, encode, snapshot build);
//! - `ours/translate_only` and `ours/encode_only`: the two halves, to see where time goes;
//! - `floor/prost`: the equivalent `ServiceEntry` prost structs built directly from the model
//!   (no validation, no hashing), wrapped in `Resource{metadata, body: Any}` and `encode_to_vec`.
//!
//! Run: `cargo bench -p mcp-runtime --bench translate` (or with `MCP_BENCH_SERVICES=N`). A summary
//! table (per-snapshot mean in ms and ratio to the floor) is printed at the end.

mod common;

// The same allocator as the adapter binaries.
#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion};
use mcp_core::cache::encode;
use mcp_core::index::Index;
use mcp_core::metrics::Metrics;
use mcp_core::model::{Host, Service};
use mcp_core::registry::RegistryEvent;
use mcp_core::testing::mk_service;
use mcp_core::translate::{translate, TranslateConfig, LABEL_REGISTRY, LABEL_SOURCE};
use prost::Message;
use proto::istio::mcp::v1alpha1::{Metadata, Resource};
use proto::istio::networking::v1alpha3::{service_entry, ServiceEntry, ServicePort, WorkloadEntry};

/// Default service count (override with `MCP_BENCH_SERVICES`).
const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;
/// Target at [`SERVICES`] for translate+encode and the index flush.
const TARGET_MS: f64 = 60.0;
/// Issue #12: 1M endpoints (100k services), registry Reset -> snapshot published.
const TARGET_1M_RESET_MS: f64 = 2000.0;

/// `MCP_BENCH_SERVICES`, or [`SERVICES`].
fn service_count() -> usize {
    std::env::var("MCP_BENCH_SERVICES")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("MCP_BENCH_SERVICES={v}: not a number"))
        })
        .unwrap_or(common::scaled(SERVICES, 20))
}

/// The target of `bench` at `n` services, if there is one.
fn target_ms(bench: &str, n: usize) -> Option<f64> {
    match (bench, n) {
        ("ours/translate+encode" | "ours/index_reset_flush", SERVICES) => Some(TARGET_MS),
        ("ours/index_reset_flush", 100_000) => Some(TARGET_1M_RESET_MS),
        _ => None,
    }
}

fn cfg() -> TranslateConfig {
    common::translate_config()
}

fn services(n: usize) -> Vec<Service> {
    (0..n)
        .map(|i| mk_service(&format!("svc-{i:05}"), ENDPOINTS))
        .collect()
}

/// Ours: translate + encode every service; returns total encoded bytes. Takes the services by
/// value, as the writer does (it owns what the registry sent); callers clone outside the timing.
fn ours(services: Vec<Service>, cfg: &TranslateConfig) -> usize {
    let mut bytes = 0;
    for s in services {
        let t = translate(s, cfg).expect("valid service");
        let e = encode(&t);
        bytes += e.resource.len();
        black_box(e);
    }
    bytes
}

/// Floor: the same resources built straight into prost structs (no validation, no version hash),
/// each encoded with `encode_to_vec`; returns total encoded bytes.
fn floor(services: &[Service], cfg: &TranslateConfig) -> usize {
    let mut bytes = 0;
    for s in services {
        let host = match &s.hosts[0] {
            Host::Relative(n) | Host::Absolute(n) => format!("{n}.{}", cfg.host_suffix),
        };
        let spec = ServiceEntry {
            hosts: vec![host],
            addresses: s.addresses.clone(),
            ports: s
                .ports
                .iter()
                .map(|p| ServicePort {
                    number: p.number,
                    protocol: p.protocol.clone().unwrap_or_default(),
                    name: p.name.clone(),
                    target_port: p.target_port.unwrap_or(0),
                })
                .collect(),
            location: service_entry::Location::MeshInternal as i32,
            resolution: service_entry::Resolution::Static as i32,
            endpoints: s
                .endpoints
                .iter()
                .map(|e| WorkloadEntry {
                    address: e.address.clone(),
                    ports: e.ports.clone(),
                    labels: e.labels.to_labels(),
                    network: e.network.as_deref().unwrap_or_default().to_string(),
                    locality: e.locality.as_deref().unwrap_or_default().to_string(),
                    weight: e.weight.unwrap_or(0),
                    service_account: e.service_account.as_deref().unwrap_or_default().to_string(),
                })
                .collect(),
            export_to: s.export_to.clone(),
            subject_alt_names: s.subject_alt_names.clone(),
            workload_selector: None,
        };
        let mut labels: BTreeMap<String, String> = s.labels.clone();
        labels.insert(LABEL_REGISTRY.into(), cfg.registry.clone());
        labels.insert(LABEL_SOURCE.into(), cfg.source.clone());
        let resource = Resource {
            metadata: Some(Metadata {
                name: format!("{}/{}", cfg.namespace, s.key.name),
                create_time: Some(prost_types::Timestamp {
                    seconds: 0,
                    nanos: 0,
                }),
                // Same length as our 16-hex-digit content hash, without computing it.
                version: "0123456789abcdef".into(),
                labels,
                annotations: s.annotations.clone(),
            }),
            body: Some(prost_types::Any {
                type_url: proto::SERVICE_ENTRY_TYPE_URL.to_string(),
                value: spec.encode_to_vec(),
            }),
        };
        let buf = resource.encode_to_vec();
        bytes += buf.len();
        black_box(buf);
    }
    bytes
}

fn index_reset_flush(idx: &mut Index, services: Vec<Service>) -> usize {
    idx.apply(RegistryEvent::Reset(services));
    let snap = idx.flush().expect("first flush publishes");
    snap.iter().map(|e| e.resource.len()).sum()
}

fn new_index() -> Index {
    Index::new(cfg(), Metrics::new("bench").expect("metrics"))
}

/// Mean wall time of `f` over `n` runs (after one warm-up run), in ms.
fn mean_ms(n: usize, mut f: impl FnMut() -> Duration) -> f64 {
    f();
    let total: Duration = (0..n).map(|_| f()).sum();
    total.as_secs_f64() * 1e3 / n as f64
}

fn main() {
    // Under MCP_BENCH_SMOKE (or `cargo test --benches`, criterion's test mode) each bench runs
    // once or for a moment.
    let (warm_up, measure) = if common::smoke() {
        (Duration::from_millis(1), Duration::from_millis(10))
    } else {
        (Duration::from_secs(1), Duration::from_secs(4))
    };
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(warm_up)
        .measurement_time(measure)
        .configure_from_args();

    let n = service_count();
    let services = services(n);
    let cfg = cfg();
    let translated: Vec<_> = services
        .iter()
        .map(|s| translate(s.clone(), &cfg).expect("valid"))
        .collect();

    let ours_bytes = ours(services.clone(), &cfg);
    let floor_bytes = floor(&services, &cfg);
    let index_bytes = index_reset_flush(&mut new_index(), services.clone());
    assert_eq!(ours_bytes, index_bytes);

    let mut g = c.benchmark_group(if n == SERVICES {
        "snapshot_10k_services_x10_endpoints".to_string()
    } else {
        format!("snapshot_{n}_services_x10_endpoints")
    });
    g.bench_function("ours/translate+encode", |b| {
        b.iter_batched(
            || services.clone(),
            |s| ours(black_box(s), &cfg),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("ours/index_reset_flush", |b| {
        b.iter_batched(
            || (new_index(), services.clone()),
            |(mut idx, s)| {
                let n = index_reset_flush(&mut idx, s);
                // Dropping the index (10k entries) is not part of the flush.
                (idx, n)
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("ours/translate_only", |b| {
        b.iter_batched(
            || services.clone(),
            |svcs| {
                for s in svcs {
                    black_box(translate(s, &cfg).expect("valid"));
                }
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("ours/encode_only", |b| {
        b.iter(|| {
            for t in &translated {
                black_box(encode(t));
            }
        })
    });
    g.bench_function("floor/prost", |b| {
        b.iter(|| floor(black_box(&services), &cfg))
    });
    g.finish();

    // Where one-change latency goes at 10k services: Index upsert + flush of a single change.
    let mut g = c.benchmark_group(if n == SERVICES {
        "one_change_at_10k_services".to_string()
    } else {
        format!("one_change_at_{n}_services")
    });
    let mut idx = new_index();
    idx.apply(RegistryEvent::Reset(services.clone()));
    idx.flush().expect("first");
    let mut current = services.clone();
    let mut k = 0usize;
    g.bench_function("ours/index_upsert_flush", |b| {
        b.iter_batched(
            || {
                k += 1;
                let s = &mut current[k % n];
                s.labels.insert("bench-rev".into(), format!("r{k}"));
                s.clone()
            },
            |s| {
                idx.apply(RegistryEvent::Upsert(s));
                idx.flush().expect("changed")
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();

    // Summary: our own timing loop (same process, interleaved) so the table does not depend on
    // parsing criterion's output.
    let runs = common::scaled(10, 1);
    let mut rows: Vec<(&str, f64)> = Vec::new();
    let floor_ms = mean_ms(runs, || {
        let t = Instant::now();
        black_box(floor(&services, &cfg));
        t.elapsed()
    });
    rows.push((
        "ours/translate+encode",
        mean_ms(runs, || {
            let s = services.clone();
            let t = Instant::now();
            black_box(ours(s, &cfg));
            t.elapsed()
        }),
    ));
    rows.push((
        "ours/index_reset_flush",
        mean_ms(runs, || {
            let mut idx = new_index();
            let s = services.clone();
            let t = Instant::now();
            black_box(index_reset_flush(&mut idx, s));
            let d = t.elapsed();
            drop(idx);
            d
        }),
    ));
    rows.push((
        "ours/translate_only",
        mean_ms(runs, || {
            let s = services.clone();
            let t = Instant::now();
            for s in s {
                black_box(translate(s, &cfg).expect("valid"));
            }
            t.elapsed()
        }),
    ));
    rows.push((
        "ours/encode_only",
        mean_ms(runs, || {
            let t = Instant::now();
            for tr in &translated {
                black_box(encode(tr));
            }
            t.elapsed()
        }),
    ));

    println!();
    println!("== translate+encode, {n} services x {ENDPOINTS} endpoints (mean of {runs} runs, ms per snapshot) ==");
    println!("encoded bytes: ours {ours_bytes}, floor {floor_bytes}");
    println!(
        "{:<26} {:>10} {:>10} {:>8} {:>8} {:>6}",
        "bench", "ms", "floor ms", "ratio", "target", "pass"
    );
    println!(
        "{:<26} {:>10.2} {:>10} {:>8} {:>8} {:>6}",
        "floor/prost", floor_ms, "-", "1.00", "-", "-"
    );
    for (name, ms) in rows {
        let target = target_ms(name, n);
        println!(
            "{:<26} {:>10.2} {:>10.2} {:>8.2} {:>8} {:>6}",
            name,
            ms,
            floor_ms,
            ms / floor_ms,
            target.map_or("-".into(), |t| format!("{t}")),
            match target {
                Some(t) if ms <= t => "PASS",
                Some(_) => "FAIL",
                None => "-",
            }
        );
    }
    c.final_summary();
}
