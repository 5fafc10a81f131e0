//! Target 4 (BENCHMARKS.md, "Results"): RSS <= 150 MB at 100k endpoints.
//!
//! One process runs the adapter runtime with the fake registry; VmRSS/VmHWM come from
//! /proc/self/status:
//! 1. at start, and with the runtime started and empty (the floor);
//! 2. after a Reset of 10k services x 10 endpoints is published;
//! 3. after 5 xDS sinks each received the full snapshot. The sinks run in a child process (this
//!    binary re-executed with `--sinks`) so their decoded copies are not counted.
//!
//! Run: `cargo bench -p mcp-runtime --bench memory`.

mod common;

// The same allocator as the adapter binaries.
#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use mcp_core::registry::RegistryEvent;
use mcp_core::testing::bench::{Mem, Proc};
use mcp_core::testing::metric_sum;
use prost::Message;

use common::{http_get, machine, services, sotw_subscribe, start_fake};

/// Services published (100 under `MCP_BENCH_SMOKE`).
fn service_count() -> usize {
    common::scaled(10_000, 100)
}
const ENDPOINTS: usize = 10;
/// Sinks connected at step 3 (override with `MCP_BENCH_SINKS`).
const SINKS: usize = 5;
const TARGET_MB: f64 = 150.0;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Some(i) = args.iter().position(|a| a == "--sinks") {
        let addr: SocketAddr = args
            .get(i + 1)
            .and_then(|a| a.parse().ok())
            .expect("--sinks ADDR COUNT");
        let count: usize = args
            .get(i + 2)
            .and_then(|a| a.parse().ok())
            .expect("--sinks ADDR COUNT");
        rt.block_on(sinks(addr, count));
        return;
    }
    rt.block_on(run());
}

/// Child mode: `count` SotW sinks; prints `READY <resources> <response bytes>` once each got the
/// full snapshot, then holds the streams open until stdin closes.
async fn sinks(addr: SocketAddr, count: usize) {
    let mut held = Vec::new();
    let mut resources = 0;
    let mut bytes = 0;
    for _ in 0..count {
        let (tx, mut stream) = sotw_subscribe(addr, None).await;
        let r = stream
            .message()
            .await
            .expect("stream ok")
            .expect("response");
        resources = r.resources.len();
        bytes = r.encoded_len();
        tx.send(DiscoveryRequest {
            type_url: r.type_url.clone(),
            version_info: r.version_info.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .expect("ack");
        drop(r);
        held.push((tx, stream));
    }
    println!("READY {resources} {bytes}");
    // Hold the streams until the parent closes our stdin.
    let _ = tokio::task::spawn_blocking(|| {
        let mut buf = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut buf);
    })
    .await;
    drop(held);
}

async fn run() {
    let sinks: usize = std::env::var("MCP_BENCH_SINKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(common::scaled(SINKS, 1));
    let services_n = service_count();
    let mut rows: Vec<(String, Mem)> = vec![("process start".into(), Proc::This.mem())];

    let (running, handle) = start_fake().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let floor = Proc::This.mem();
    rows.push(("runtime started, empty (floor)".into(), floor));

    // The registry's input: the adapter owns it until the writer has consumed the Reset.
    let input = services(services_n, ENDPOINTS);
    rows.push((
        format!("+ model input built ({services_n} x {ENDPOINTS})"),
        Proc::This.mem(),
    ));
    let t = Instant::now();
    handle.send(RegistryEvent::Reset(input));
    loop {
        let m = http_get(running.admin_addr, "/metrics").await;
        if metric_sum(&m, "mcp_adapter_resources") as usize == services_n {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "snapshot published");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let publish_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let published = Proc::This.mem();
    rows.push((format!("{services_n} x {ENDPOINTS} published"), published));

    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "--sinks",
            &running.grpc_addr.to_string(),
            &sinks.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sinks");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("child line");
    let mut parts = line.split_whitespace().skip(1);
    let resources: usize = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let response_bytes: usize = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    assert_eq!(
        resources, services_n,
        "child sinks got the full snapshot: {line}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let with_sinks = Proc::This.mem();
    rows.push((format!("+ {sinks} sinks got full snapshot"), with_sinks));
    let m = http_get(running.admin_addr, "/metrics").await;
    let connected = metric_sum(&m, "mcp_adapter_connected_sinks");
    let push_bytes = metric_sum(&m, "mcp_adapter_push_bytes_total");

    drop(child.stdin.take());
    let _ = child.wait();
    running.stop().await.expect("clean stop");

    println!();
    println!(
        "== memory, {services_n} services x {ENDPOINTS} endpoints = {} endpoints ==",
        services_n * ENDPOINTS
    );
    println!("machine: {}", machine());
    println!(
        "snapshot: {resources} resources, one SotW response {response_bytes} B ({:.2} MiB); push_bytes_total {push_bytes} over {connected} sinks; Reset->published {publish_s:.2} s",
        response_bytes as f64 / 1048576.0
    );
    println!(
        "{:<32} {:>10} {:>10} {:>14}",
        "point", "VmRSS MiB", "VmHWM MiB", "RSS-floor MiB"
    );
    for (name, mem) in &rows {
        println!(
            "{:<32} {:>10.1} {:>10.1} {:>14.1}",
            name,
            mem.rss_mib(),
            mem.hwm_mib(),
            mem.rss_mib() - floor.rss_mib()
        );
    }
    // The target is in MB (10^6 bytes): 150 MB = 143.05 MiB.
    let limit = TARGET_MB * 1e6 / 1048576.0;
    let peak = with_sinks.hwm_mib();
    println!(
        "target VmRSS <= {TARGET_MB} MB ({limit:.1} MiB): final VmRSS {:.1} MiB, peak VmHWM {peak:.1} MiB -> {}",
        with_sinks.rss_mib(),
        if with_sinks.rss_mib() <= limit && peak <= limit {
            "PASS"
        } else if with_sinks.rss_mib() <= limit {
            "PASS (RSS; peak above)"
        } else {
            "FAIL"
        }
    );
}
