//! What an idle xDS stream costs the shipped adapter (BENCHMARKS.md, "Hostile and slow sinks":
//! the stream flood's holders): resident memory of `adapter-file` with N streams open that each
//! asked for one type and then hold, against the same process's RSS before they opened (the
//! floor, same run).
//!
//! For each N (100, 500, 1,000 by default; the default `--max-streams` admits 1,024) a fresh
//! `adapter-file` serves 20 ServiceEntries; once `/readyz` is 200 and it has been quiet for a
//! second its VmRSS is read, then N streams are opened over N/100 HTTP/2 connections
//! (`e2e::flood`, 100 streams per connection, as the test of the flood does): each sends one
//! `DiscoveryRequest` for a 64-byte type URL of its own, reads what comes back and holds the
//! stream open. Once the adapter counts N connected sinks and a second has passed, VmRSS again.
//! The cost per stream is the difference over N; the least-squares slope over the sizes is
//! printed too (the stable figure: fresh processes move by a MiB or two).
//!
//! Run: `cargo build -p adapter-file && cargo bench -p e2e --bench idle_streams --profile dev`
//! (the debug binary, as the hostile-sink tests run it), or `cargo build --release -p
//! adapter-file && cargo bench -p e2e --bench idle_streams` (the release binary).
//! `IDLE_STREAMS=100,500,1000` chooses the sizes.

use std::path::Path;
use std::time::Duration;

use e2e::flood::{Flood, FloodRun};
use e2e::{target_dir, wait_for, Adapter};
use mcp_core::testing::bench::{command_line, cores, cpu_model, load_average, Proc};

mod smoke;

/// Services the adapter serves (the streams ask for another type: what they cost is the stream,
/// not a response).
const SERVICES: usize = 20;
/// Streams per HTTP/2 connection.
const PER_CONNECTION: usize = 100;

fn write_inventory(dir: &Path) {
    let docs: Vec<String> = (0..SERVICES)
        .map(|i| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: svc-{i:04}\n  namespace: ns\nspec:\n  hosts: [svc-{i:04}.example.com]\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{{address: 10.0.{}.{}}}]\n",
                i / 250,
                i % 250 + 1
            )
        })
        .collect();
    std::fs::write(dir.join("services.yaml"), docs.join("---\n")).expect("write the inventory");
}

/// VmRSS of the adapter in KiB: with no streams, and with `n` idle streams.
fn measure(path: &str, n: usize) -> (u64, u64) {
    let a = Adapter::start_with_env(
        "adapter-file",
        &["--path", path],
        // As in the flood test: on a loaded machine a connection's first stream can come more
        // than the default 5 s after it connected; that case has tests of its own.
        &[("MCP_IDLE_CONNECTION_TIMEOUT", "5m")],
    );
    a.wait_ready();
    let pid = a.pid().expect("adapter running");
    std::thread::sleep(Duration::from_secs(1));
    let before = Proc::Pid(pid).mem().rss_kib;
    let per_connection = PER_CONNECTION.min(n);
    let run = FloodRun::start(
        a.grpc,
        Flood {
            connections: n.div_ceil(per_connection),
            streams_per_connection: per_connection,
            types_per_stream: 1,
            type_url_len: 64,
            hold: true,
        },
    );
    wait_for(Duration::from_secs(120), "every stream holding", || {
        run.settled().then_some(())
    });
    assert_eq!(run.holding(), n, "every stream admitted and holding");
    wait_for(Duration::from_secs(60), "the adapter counts them", || {
        (a.metric("mcp_adapter_connected_sinks") >= n as f64).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    let with = Proc::Pid(pid).mem().rss_kib;
    let report = run.finish();
    assert_eq!(
        report.count("held"),
        n,
        "every stream held until stopped: {report:?}"
    );
    (before, with)
}

/// Least-squares slope of `ys` over `xs`.
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let num: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::var("IDLE_STREAMS")
        .ok()
        .map(|v| {
            v.split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("IDLE_STREAMS={v}: not numbers"))
                })
                .collect()
        })
        .unwrap_or_else(|| {
            if smoke::smoke() {
                vec![10]
            } else {
                vec![100, 500, 1000]
            }
        });
    let dir = tempfile::tempdir().expect("tempdir");
    write_inventory(dir.path());
    let path = dir.path().to_string_lossy().to_string();
    println!(
        "idle xDS streams on adapter-file ({}, {SERVICES} services): {} ({} cores), load {}, commit {}",
        target_dir().join("adapter-file").display(),
        cpu_model().unwrap_or_default(),
        cores(),
        load_average(),
        command_line("git", &["rev-parse", "--short", "HEAD"]),
    );
    println!(
        "{:>8} {:>16} {:>16} {:>12} {:>12}",
        "streams", "RSS before MiB", "RSS with MiB", "+MiB", "KiB/stream"
    );
    let (mut xs, mut ys) = (vec![0.0], vec![0.0]);
    for &n in &sizes {
        let (before, with) = measure(&path, n);
        let extra = with as f64 - before as f64;
        println!(
            "{n:>8} {:>16.1} {:>16.1} {:>12.1} {:>12.1}",
            before as f64 / 1024.0,
            with as f64 / 1024.0,
            extra / 1024.0,
            extra / n as f64
        );
        xs.push(n as f64);
        ys.push(extra);
    }
    println!(
        "least-squares slope over 0 and {sizes:?} streams: {:.1} KiB per idle stream",
        slope(&xs, &ys)
    );
}
