//! Targets 2 and 3 (BENCHMARKS.md, "Results"):
//! - one-service change -> sink p99 <= 10 ms with coalescing off (SotW xDS at N=100 and N=1000,
//!   delta xDS at N=10000, 10 endpoints per service);
//! - a no-op relist causes 0 pushes.
//!
//! Floor, measured in the same run: a bare tonic ADS server (no index, no engine) that answers
//! every request at once with a pre-built response of exactly the bytes our server sent for the
//! same case; the client measures request -> response round trips.
//!
//! Run: `cargo bench -p mcp-runtime --bench latency`. `MCP_BENCH_DELTA_SERVICES=100000` runs the
//! delta case at 100k services (1M endpoints, issue #12's scale; the default is 10000), and adds
//! that size to the in-process breakdown.

mod common;

#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse as EnvoyDeltaResponse, DiscoveryRequest,
    DiscoveryResponse as EnvoyResponse,
};
use hdrhistogram::Histogram;
use mcp_core::index::Index;
use mcp_core::metrics::Metrics;
use mcp_core::model::Service;
use mcp_core::registry::RegistryEvent;
use mcp_core::testing::{metric_sum, FakeHandle};
use mcp_runtime::runtime::Running;
use mcp_server::engine::{Engine, Incremental, Names, Request as EngineRequest};
use prost::Message;
use proto::responses::{DeltaDiscoveryResponse, DeltaResource, DiscoveryResponse, SharedAny};
use proto::server::ads::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use common::{
    delta_subscribe, http_get, machine, services, sotw_subscribe, start_fake, translate_config, SE,
};

/// Changes per case (5 under `MCP_BENCH_SMOKE`).
fn iterations() -> usize {
    common::scaled(500, 5)
}
const ENDPOINTS: usize = 10;
const TARGET_P99_MS: f64 = 10.0;
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram")
}

fn node() -> Option<Node> {
    Some(Node {
        id: "sidecar~127.0.0.1~bench.default~default.svc.cluster.local".into(),
        ..Default::default()
    })
}

/// The `k`-th change: service `k % n` with a new label value, so every change is a new version.
fn changed(current: &mut [Service], k: usize) -> Service {
    let i = k % current.len();
    current[i]
        .labels
        .insert("bench-rev".into(), format!("r{k}"));
    current[i].clone()
}

struct Measured {
    hist: Histogram<u64>,
    /// Encoded size of one change response (what the floor replays).
    response_bytes: usize,
}

async fn start(n: usize) -> (Running, FakeHandle, Vec<Service>) {
    let (running, handle) = start_fake().await;
    let current = services(n, ENDPOINTS);
    handle.send(RegistryEvent::Reset(current.clone()));
    (running, handle, current)
}

async fn next_sotw(stream: &mut Streaming<EnvoyResponse>) -> EnvoyResponse {
    tokio::time::timeout(RESPONSE_TIMEOUT, stream.message())
        .await
        .expect("response in time")
        .expect("stream ok")
        .expect("stream open")
}

async fn next_delta(stream: &mut Streaming<EnvoyDeltaResponse>) -> EnvoyDeltaResponse {
    tokio::time::timeout(RESPONSE_TIMEOUT, stream.message())
        .await
        .expect("response in time")
        .expect("stream ok")
        .expect("stream open")
}

fn sotw_ack(r: &EnvoyResponse) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: r.type_url.clone(),
        version_info: r.version_info.clone(),
        response_nonce: r.nonce.clone(),
        ..Default::default()
    }
}

fn to_wire(r: &EnvoyResponse) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: r.version_info.clone(),
        resources: r
            .resources
            .iter()
            .map(|a| SharedAny {
                type_url: proto::MCP_RESOURCE_TYPE_URL,
                value: Bytes::from(a.value.clone()),
            })
            .collect(),
        type_url: r.type_url.clone(),
        nonce: r.nonce.clone(),
    }
}

fn to_wire_delta(r: &EnvoyDeltaResponse) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: r.system_version_info.clone(),
        resources: r
            .resources
            .iter()
            .map(|e| DeltaResource {
                version: e.version.clone(),
                resource: e.resource.as_ref().map(|a| SharedAny {
                    type_url: proto::MCP_RESOURCE_TYPE_URL,
                    value: Bytes::from(a.value.clone()),
                }),
                name: e.name.clone(),
            })
            .collect(),
        type_url: r.type_url.clone(),
        nonce: r.nonce.clone(),
        removed_resources: r.removed_resources.clone(),
    }
}

struct NoopResult {
    responses: usize,
    pushes_before: f64,
    pushes_after: f64,
    snapshots_before: f64,
    snapshots_after: f64,
}

/// SotW xDS: one-service change latency at `n` services; with `noop`, the relist check after.
async fn sotw(n: usize, noop: bool) -> (Measured, DiscoveryResponse, Option<NoopResult>) {
    let (running, handle, mut current) = start(n).await;
    let (tx, mut stream) = sotw_subscribe(running.grpc_addr, node()).await;
    let first = next_sotw(&mut stream).await;
    assert_eq!(first.resources.len(), n, "full state first");
    tx.send(sotw_ack(&first)).expect("ack");
    let mut version = first.version_info.clone();

    let mut hist = histogram();
    let mut last = first;
    for k in 0..iterations() {
        let s = changed(&mut current, k);
        let t0 = Instant::now();
        handle.send(RegistryEvent::Upsert(s));
        let r = loop {
            let r = next_sotw(&mut stream).await;
            if r.version_info != version {
                break r;
            }
            tx.send(sotw_ack(&r)).expect("ack");
        };
        let us = t0.elapsed().as_micros() as u64;
        hist.record(us.max(1)).expect("record");
        assert_eq!(r.resources.len(), n);
        tx.send(sotw_ack(&r)).expect("ack");
        version = r.version_info.clone();
        last = r;
    }
    let response_bytes = last.encoded_len();
    let wire = to_wire(&last);
    assert_eq!(
        wire.encoded_len(),
        response_bytes,
        "floor replays our bytes"
    );

    let noop_result = if noop {
        Some(relist(&running, &handle, &current, &mut stream).await)
    } else {
        None
    };
    drop(tx);
    running.stop().await.expect("clean stop");
    (
        Measured {
            hist,
            response_bytes,
        },
        wire,
        noop_result,
    )
}

/// Sends the unchanged full set 100 times; no response may follow.
async fn relist(
    running: &Running,
    handle: &FakeHandle,
    current: &[Service],
    stream: &mut Streaming<EnvoyResponse>,
) -> NoopResult {
    // Let the last ACK land before reading the counters.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = http_get(running.admin_addr, "/metrics").await;
    for _ in 0..100 {
        handle.send(RegistryEvent::Reset(current.to_vec()));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut responses = 0;
    while let Ok(msg) = tokio::time::timeout_at(deadline, stream.message()).await {
        match msg {
            Ok(Some(_)) => responses += 1,
            _ => break,
        }
    }
    let after = http_get(running.admin_addr, "/metrics").await;
    NoopResult {
        responses,
        pushes_before: metric_sum(&before, "mcp_adapter_pushes_total"),
        pushes_after: metric_sum(&after, "mcp_adapter_pushes_total"),
        snapshots_before: metric_sum(&before, "mcp_adapter_snapshots_total"),
        snapshots_after: metric_sum(&after, "mcp_adapter_snapshots_total"),
    }
}

/// Delta xDS: one-service change latency at `n` services.
async fn delta(n: usize) -> (Measured, DeltaDiscoveryResponse) {
    let (running, handle, mut current) = start(n).await;
    let (tx, mut stream) = delta_subscribe(running.grpc_addr, node()).await;
    let ack = |r: &EnvoyDeltaResponse| DeltaDiscoveryRequest {
        type_url: r.type_url.clone(),
        response_nonce: r.nonce.clone(),
        ..Default::default()
    };
    let first = next_delta(&mut stream).await;
    assert_eq!(first.resources.len(), n, "full state first");
    tx.send(ack(&first)).expect("ack");

    let mut hist = histogram();
    let mut last = None;
    for k in 0..iterations() {
        let s = changed(&mut current, k);
        let want = format!("fake/{}", s.key.name);
        let t0 = Instant::now();
        handle.send(RegistryEvent::Upsert(s));
        let r = loop {
            let r = next_delta(&mut stream).await;
            if r.resources.iter().any(|e| e.name == want) {
                break r;
            }
            tx.send(ack(&r)).expect("ack");
        };
        let us = t0.elapsed().as_micros() as u64;
        hist.record(us.max(1)).expect("record");
        assert_eq!(r.resources.len(), 1, "only the change");
        tx.send(ack(&r)).expect("ack");
        last = Some(r);
    }
    let last = last.expect("at least one change");
    let response_bytes = last.encoded_len();
    let wire = to_wire_delta(&last);
    assert_eq!(
        wire.encoded_len(),
        response_bytes,
        "floor replays our bytes"
    );
    drop(tx);
    running.stop().await.expect("clean stop");
    (
        Measured {
            hist,
            response_bytes,
        },
        wire,
    )
}

/// The floor server: answers every request at once with the pre-built response.
#[derive(Clone)]
struct Floor {
    sotw: DiscoveryResponse,
    delta: DeltaDiscoveryResponse,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Floor {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        req: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Ok(Response::new(replay(req.into_inner(), self.sotw.clone())))
    }

    async fn delta_aggregated_resources(
        &self,
        req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Ok(Response::new(replay(req.into_inner(), self.delta.clone())))
    }
}

/// Answers every request on `requests` with `resp`.
fn replay<Req, Resp>(
    mut requests: Streaming<Req>,
    resp: Resp,
) -> ReceiverStream<Result<Resp, Status>>
where
    Req: Message + Default + Send + 'static,
    Resp: Clone + Send + 'static,
{
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok(Some(_)) = requests.message().await {
            if tx.send(Ok(resp.clone())).await.is_err() {
                break;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// How the floor server accepts connections.
#[derive(Clone, Copy, PartialEq)]
enum Accept {
    /// tonic's own `TcpIncoming` with TCP_NODELAY (what `Server::serve` does): the real floor.
    NoDelay,
    /// `TcpListenerStream`, as `mcp_server::serve` does: Nagle stays on.
    ListenerStream,
}

async fn floor_server(f: Floor, accept: Accept) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let router = tonic::transport::Server::builder().add_service(
            AggregatedDiscoveryServiceServer::new(f)
                .max_decoding_message_size(16 << 20)
                .max_encoding_message_size(usize::MAX),
        );
        let stop = async {
            let _ = stop_rx.await;
        };
        let _ = match accept {
            Accept::NoDelay => {
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                router.serve_with_incoming_shutdown(incoming, stop).await
            }
            Accept::ListenerStream => {
                router
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop)
                    .await
            }
        };
    });
    (addr, stop_tx)
}

/// Round trips request -> pre-built response over a bare tonic stream.
async fn floor_sotw(resp: DiscoveryResponse, accept: Accept) -> Histogram<u64> {
    let (addr, stop) = floor_server(
        Floor {
            sotw: resp,
            delta: DeltaDiscoveryResponse::default(),
        },
        accept,
    )
    .await;
    let (tx, mut stream) = sotw_subscribe(addr, node()).await;
    let mut r = next_sotw(&mut stream).await;
    let mut hist = histogram();
    for _ in 0..iterations() {
        let t0 = Instant::now();
        tx.send(sotw_ack(&r)).expect("send");
        r = next_sotw(&mut stream).await;
        hist.record((t0.elapsed().as_micros() as u64).max(1))
            .expect("record");
    }
    drop(tx);
    let _ = stop.send(());
    hist
}

async fn floor_delta(resp: DeltaDiscoveryResponse, accept: Accept) -> Histogram<u64> {
    let (addr, stop) = floor_server(
        Floor {
            sotw: DiscoveryResponse::default(),
            delta: resp,
        },
        accept,
    )
    .await;
    let (tx, mut stream) = delta_subscribe(addr, node()).await;
    let mut r = next_delta(&mut stream).await;
    let mut hist = histogram();
    for _ in 0..iterations() {
        let t0 = Instant::now();
        tx.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .expect("send");
        r = next_delta(&mut stream).await;
        hist.record((t0.elapsed().as_micros() as u64).max(1))
            .expect("record");
    }
    drop(tx);
    let _ = stop.send(());
    hist
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run());
}

/// In-process cost of one change at `n` services, without any network: `Index` upsert + flush
/// (translate, encode, snapshot build) and the delta stream engine's diff.
fn breakdown(n: usize) -> (Histogram<u64>, Histogram<u64>, Histogram<u64>) {
    let mut idx = Index::new(translate_config(), Metrics::new("bench").expect("metrics"));
    let mut current = services(n, ENDPOINTS);
    idx.apply(RegistryEvent::Reset(current.clone()));
    let mut snap = idx.flush().expect("first");
    let mut sotw = Engine::new(Incremental::Never, |t| t == SE);
    let mut delta = Engine::new(Incremental::Always, |t| t == SE);
    let req = |nonce: &str, incremental: bool| EngineRequest {
        type_key: SE.into(),
        nonce: nonce.into(),
        error: None,
        incremental,
        initial_versions: Default::default(),
        node_id_len: 0,
        names: if incremental {
            Names::Delta {
                subscribe: vec![],
                unsubscribe: vec![],
            }
        } else {
            Names::Replace(vec![])
        },
    };
    let mut sotw_nonce = sotw
        .on_request(req("", false), Some(&snap))
        .1
        .expect("full")
        .nonce;
    let mut delta_nonce = delta
        .on_request(req("", true), Some(&snap))
        .1
        .expect("full")
        .nonce;
    let (mut h_flush, mut h_sotw, mut h_delta) = (histogram(), histogram(), histogram());
    for k in 0..iterations() {
        sotw.on_request(req(&sotw_nonce, false), Some(&snap));
        delta.on_request(req(&delta_nonce, true), Some(&snap));
        idx.apply(RegistryEvent::Upsert(changed(&mut current, k)));
        let t = Instant::now();
        snap = idx.flush().expect("changed");
        h_flush
            .record((t.elapsed().as_micros() as u64).max(1))
            .expect("record");
        let t = Instant::now();
        let out = sotw.on_snapshot(&snap).pop().expect("sotw push");
        h_sotw
            .record((t.elapsed().as_micros() as u64).max(1))
            .expect("record");
        sotw_nonce = out.nonce;
        let t = Instant::now();
        let out = delta.on_snapshot(&snap).pop().expect("delta push");
        h_delta
            .record((t.elapsed().as_micros() as u64).max(1))
            .expect("record");
        assert_eq!(out.resources.len(), 1);
        delta_nonce = out.nonce;
    }
    (h_flush, h_sotw, h_delta)
}

fn pct(h: &Histogram<u64>) -> String {
    format!(
        "p50 {:.3} p90 {:.3} p99 {:.3} max {:.3} ms",
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.90)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max())
    )
}

async fn run() {
    struct Row {
        case: String,
        ours: Measured,
        floor: Histogram<u64>,
        floor_nagle: Histogram<u64>,
    }
    let mut rows = Vec::new();
    let mut noop = None;

    let (small, large) = (common::scaled(100, 10), common::scaled(1000, 20));
    for n in [small, large] {
        let (ours, wire, relist) = sotw(n, n == large).await;
        if relist.is_some() {
            noop = relist;
        }
        let floor = floor_sotw(wire.clone(), Accept::NoDelay).await;
        let floor_nagle = floor_sotw(wire, Accept::ListenerStream).await;
        rows.push(Row {
            case: format!("sotw xDS, N={n}"),
            ours,
            floor,
            floor_nagle,
        });
    }
    let delta_services = std::env::var("MCP_BENCH_DELTA_SERVICES")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("MCP_BENCH_DELTA_SERVICES={v}: not a number"))
        })
        .unwrap_or(common::scaled(10_000, 30));
    {
        let n = delta_services;
        let (ours, wire) = delta(n).await;
        let floor = floor_delta(wire.clone(), Accept::NoDelay).await;
        let floor_nagle = floor_delta(wire, Accept::ListenerStream).await;
        rows.push(Row {
            case: format!("delta xDS, N={n}"),
            ours,
            floor,
            floor_nagle,
        });
    }
    // The breakdown also runs at the delta case's size when that is larger, so the in-process
    // cost at issue #12's scale is printed next to its network latency.
    let mut sizes = vec![common::scaled(1000, 10), common::scaled(10_000, 30)];
    if delta_services > sizes[1] {
        sizes.push(delta_services);
    }
    let breakdowns: Vec<_> = sizes.into_iter().map(|n| (n, breakdown(n))).collect();

    println!();
    println!(
        "== one-service change -> sink latency ({} changes each, {ENDPOINTS} endpoints/service, coalescing off) ==",
        iterations()
    );
    println!("machine: {}", machine());
    println!("floor = bare tonic ADS server (TCP_NODELAY, as tonic's Server::serve) replaying our exact response bytes per request");
    println!(
        "{:<18} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>9} {:>9} | {:>9} {:>6}",
        "case",
        "resp B",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "floor p50",
        "floor p99",
        "p99/floor",
        "<=10ms"
    );
    for r in &rows {
        let h = &r.ours.hist;
        let p99 = ms(h.value_at_quantile(0.99));
        let fp99 = ms(r.floor.value_at_quantile(0.99));
        println!(
            "{:<18} {:>8} {:>8.3} {:>8.3} {:>8.3} {:>8.3} | {:>9.3} {:>9.3} | {:>9.2} {:>6}",
            r.case,
            r.ours.response_bytes,
            ms(h.value_at_quantile(0.50)),
            ms(h.value_at_quantile(0.90)),
            p99,
            ms(h.max()),
            ms(r.floor.value_at_quantile(0.50)),
            fp99,
            p99 / fp99,
            if p99 <= TARGET_P99_MS { "PASS" } else { "FAIL" }
        );
    }
    for r in &rows {
        println!("floor (TCP_NODELAY)      {:<18} {}", r.case, pct(&r.floor));
        println!(
            "floor (TcpListenerStream) {:<17} {}",
            r.case,
            pct(&r.floor_nagle)
        );
    }
    println!();
    println!("== in-process breakdown of one change (no network) ==");
    for (n, (flush, sotw, delta)) in &breakdowns {
        println!("N={n:<6} Index upsert+flush        {}", pct(flush));
        println!("N={n:<6} Engine::on_snapshot sotw  {}", pct(sotw));
        println!("N={n:<6} Engine::on_snapshot delta {}", pct(delta));
    }
    if let Some(n) = noop {
        println!();
        println!("== no-op relist (same Reset x100 at N={large}, then 1 s wait) ==");
        println!(
            "responses received: {}   mcp_adapter_pushes_total: {} -> {}   mcp_adapter_snapshots_total: {} -> {}   {}",
            n.responses,
            n.pushes_before,
            n.pushes_after,
            n.snapshots_before,
            n.snapshots_after,
            if n.responses == 0 && n.pushes_before == n.pushes_after {
                "PASS"
            } else {
                "FAIL"
            }
        );
    }
}
