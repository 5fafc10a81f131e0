//! adapter-kube's resident memory with a few thousand Services and EndpointSlices on a real
//! Kubernetes API server: how much of what the API server sends the adapter keeps.
//!
//!     cargo build --release -p adapter-kube
//!     MCP_KUBE_MEMORY_BINS=$PWD/target/release/adapter-kube \
//!       cargo bench -p e2e --bench kube_memory --profile dev
//!
//! `MCP_KUBE_MEMORY_BINS`: comma-separated adapter binaries to compare (absolute paths, or names
//! in this profile's target directory; default `adapter-kube`), each run against the same
//! cluster. `MCP_KUBE_MEMORY_SERVICES`: Services (default 2,000), each with one EndpointSlice of
//! ten ready endpoints, written the way the API server's own clients write them (so with
//! `managedFields`). Needs target/kube from tests/go-peers/build.sh.

use std::time::Duration;

use e2e::kube::{ready, service, services_path, slice, slices_path, KubeApiServer};
use e2e::{endpoint_addresses, mcpctl_get, wait_for, Adapter};
use mcp_core::testing::bench::{command_line, cores, cpu_model, load_average, Proc};

mod smoke;

fn main() {
    let services: usize = std::env::var("MCP_KUBE_MEMORY_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(smoke::scaled(2000, 20));
    let bins = std::env::var("MCP_KUBE_MEMORY_BINS").unwrap_or_else(|_| "adapter-kube".into());

    let kube = KubeApiServer::start();
    kube.namespace("bulk");
    let svcs: Vec<(String, serde_json::Value)> = (0..services)
        .map(|i| {
            let mut s = service("bulk", &format!("svc-{i}"), &[("http", 80, 8080)]);
            s["metadata"]["labels"] = serde_json::json!({"app": format!("svc-{i}"), "tier": "web"});
            (services_path("bulk"), s)
        })
        .collect();
    kube.create_all(&svcs, 8);
    let slices: Vec<(String, serde_json::Value)> = (0..services)
        .map(|i| {
            let eps = (0..10)
                .map(|e| ready(&format!("10.{}.{}.{}", 100 + i / 250, i % 250, e + 1)))
                .collect();
            let name = format!("svc-{i}-abcde");
            let svc = format!("svc-{i}");
            let s = slice("bulk", &name, &svc, "IPv4", &[("http", 8080)], eps);
            (slices_path("bulk"), s)
        })
        .collect();
    kube.create_all(&slices, 8);

    println!(
        "adapter-kube memory: {services} Services x 1 EndpointSlice x 10 endpoints; {} ({} cores), load {}, commit {}",
        cpu_model().unwrap_or_default(),
        cores(),
        load_average(),
        command_line("git", &["rev-parse", "--short", "HEAD"]),
    );
    for bin in bins.split(',').filter(|b| !b.is_empty()) {
        let kc = kube.kubeconfig().display().to_string();
        let mut adapter = Adapter::start(bin, &["--kubeconfig", kc.as_str()]);
        adapter.wait_ready();
        let xds = adapter.xds_url();
        wait_for(Duration::from_secs(120), "every Service served", || {
            let items = mcpctl_get(&xds);
            let bulk = items
                .iter()
                .filter(|s| s["metadata"]["namespace"] == "bulk")
                .filter(|s| endpoint_addresses(s).len() == 10)
                .count();
            (bulk == services).then_some(())
        });
        // Settled: the list's pages and the first push's buffers are freed.
        std::thread::sleep(Duration::from_secs(3));
        let pid = adapter.pid().expect("running");
        println!("{bin}: {}", Proc::Pid(pid).mem());
        adapter.terminate(Duration::from_secs(10));
    }
}
