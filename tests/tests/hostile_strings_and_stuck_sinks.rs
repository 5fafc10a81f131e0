//! Issue #33 items 1 and 3 against the shipped adapter-file binary.
//!
//! - Sinks that send 1 MiB and 4 MiB resource names and node ids are refused with
//!   RESOURCE_EXHAUSTED naming the flag (counted in `mcp_adapter_refused_streams_total`), and a
//!   sink that NACKs in a loop with 1 MiB details is counted on every NACK: the adapter's RSS
//!   stays within a bound of its idle RSS and its log stays small (before, measured with this
//!   test: +153 MiB and +849 MiB held while the streams stayed open, nothing refused, the log
//!   grew by 220 MB with lines of 4 MiB).
//! - A sink that ACKs without reading (its flow-control window closed) counts in
//!   `mcp_adapter_unacked_responses`, and with `--max-connection-age 1s` its stream ends and
//!   gives its `--max-streams 1` slot to another sink (before: held forever).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::{wait_for, Adapter};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use mcp_core::testing::bench::Proc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

const SE: &str = "networking.istio.io/v1/ServiceEntry";
const MIB: usize = 1 << 20;

/// How far over its idle RSS the adapter may go, at its peak: 64 requests of 8 MiB arriving at
/// once hold what the large-request budget lets them while they are received (4 ×
/// `--max-request-size`, 64 MiB) and a decoded copy each (measured: +104 to +110 MiB; before
/// the bounds, +849 MiB held by the 4 MiB wave's open streams). Once they are refused the
/// allocator keeps some of it for reuse (measured: +9 to +90 MiB; mimalloc purges freed pages
/// only when the threads that freed them allocate again), so what stays is not asserted on its
/// own: it is under the peak.
const PEAK_BOUND_MIB: f64 = 200.0;

/// The log may grow by this much over the whole test (before: 151 MB).
const LOG_BOUND: usize = 256 << 10;

/// How far over its idle value the live heap (`mcp_adapter_heap_bytes`) may stay once every
/// hostile stream is gone. The count is exact to 16 KiB per thread (what each thread sums before
/// moving it to the shared count: `mcp_runtime::heap`), a few hundred KiB over the adapter's
/// threads at most, and what the adapter keeps by design (a label set per refusal kind, the
/// tables grown to hold ~100 connections at once) is a few KiB; the smallest hostile text in
/// these tests is 1 MiB, so one kept (a node id, a name, a NACK detail) goes over it.
const HEAP_AFTER_BOUND_KIB: f64 = 512.0;

/// The adapter's live heap, KiB (`mcp_adapter_heap_bytes`); panics if it is not counted.
fn heap_kib(a: &Adapter) -> f64 {
    let bytes = a.metric("mcp_adapter_heap_bytes");
    assert!(bytes > 0.0, "no mcp_adapter_heap_bytes on /metrics");
    bytes / 1024.0
}

/// Waits (up to 30 s) until no sink stream and no connection is open and the live heap is back
/// within [`HEAP_AFTER_BOUND_KIB`] of `idle_kib`; the heap it saw last.
fn heap_after(a: &Adapter, idle_kib: f64) -> f64 {
    wait_for(
        Duration::from_secs(30),
        "every stream and connection closed",
        || {
            let open =
                a.metric("mcp_adapter_connected_sinks") + a.metric("mcp_adapter_connections");
            (open == 0.0).then_some(())
        },
    );
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let kib = heap_kib(a);
        if kib <= idle_kib + HEAP_AFTER_BOUND_KIB || Instant::now() >= end {
            return kib;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn write_services(dir: &Path, n: usize) {
    let docs: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: svc-{i:03}\n  namespace: ns\nspec:\n  hosts: [svc-{i:03}.example.com]\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{{address: 10.0.0.{}}}]\n",
                i + 1
            )
        })
        .collect();
    std::fs::write(dir.join("services.yaml"), docs.join("---\n")).expect("write");
}

fn start(dir: &Path, extra: &[&str]) -> Adapter {
    write_services(dir, 20);
    let path = dir.to_string_lossy().to_string();
    let mut args = vec!["--path", &path, "--poll-interval", "50ms"];
    args.extend_from_slice(extra);
    let a = Adapter::start("adapter-file", &args);
    a.wait_ready();
    a
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn connect(addr: SocketAddr, window: Option<u32>) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect_timeout(Duration::from_secs(10))
        .initial_stream_window_size(window)
        .connect()
        .await
        .expect("connect")
}

/// A SotW stream with `first` sent; its request sender and responses, or the status it was
/// refused with.
async fn open(
    ch: Channel,
    first: DiscoveryRequest,
) -> Result<
    (
        mpsc::UnboundedSender<DiscoveryRequest>,
        Streaming<DiscoveryResponse>,
    ),
    tonic::Status,
> {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(first).expect("send");
    let mut c = AggregatedDiscoveryServiceClient::new(ch)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    let resp = c
        .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
        .await?;
    Ok((tx, resp.into_inner()))
}

/// How a stream that sent `first` ended: `"<code>: <message>"`.
async fn outcome(ch: Channel, first: DiscoveryRequest) -> String {
    let text = |s: tonic::Status| format!("{:?}: {}", s.code(), s.message());
    let (_tx, mut s) = match open(ch, first).await {
        Ok(open) => open,
        Err(status) => return text(status),
    };
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match s.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return "closed".to_string(),
                Err(status) => return text(status),
            }
        }
    })
    .await;
    ended.unwrap_or_else(|_| "still open after 60 s".into())
}

/// A request for the ServiceEntry type naming one resource of `name_len` bytes, from a node id
/// of `node_len` bytes.
fn long_request(i: usize, name_len: usize, node_len: usize) -> DiscoveryRequest {
    let pad = |prefix: String, len: usize| {
        let mut s = prefix;
        if s.len() < len {
            s.extend(std::iter::repeat_n('x', len - s.len()));
        }
        s
    };
    DiscoveryRequest {
        type_url: SE.into(),
        resource_names: vec![pad(format!("ns/svc-{i}-"), name_len)],
        node: Some(Node {
            id: pad(
                format!("sidecar~10.0.0.{i}~pod-{i}.ns~ns.svc.cluster.local"),
                node_len,
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Opens one stream per request, each on its own connection, all at once; how each ended.
///
/// One connection each: streams of one connection whose large requests wait for the
/// large-request budget (`--max-request-size`) fill the connection's receive window and starve
/// the ones holding the budget (issue #33 item 4, not this test's subject).
/// Also the adapter's RSS once every stream ended, or 10 s after the last opened (what streams
/// still open hold).
async fn wave(addr: SocketAddr, requests: Vec<DiscoveryRequest>, pid: u32) -> (Vec<String>, f64) {
    let mut tasks = Vec::new();
    for req in requests {
        let ch = connect(addr, None).await;
        tasks.push(tokio::spawn(outcome(ch, req)));
    }
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while tasks.iter().any(|t| !t.is_finished()) && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss = Proc::Pid(pid).mem().rss_mib();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("stream task"));
    }
    (out, rss)
}

/// Samples an adapter's RSS every 20 ms on its own thread; keeps the peak.
struct Peak {
    peak: Arc<Mutex<f64>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Peak {
    fn start(pid: u32) -> Peak {
        let peak = Arc::new(Mutex::new(0.0f64));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, st) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let rss = Proc::Pid(pid).mem().rss_mib();
                let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                *p = p.max(rss);
                drop(p);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Peak {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> f64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        *self.peak.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn refused(a: &Adapter, limit: &str) -> f64 {
    a.metric_with(
        "mcp_adapter_refused_streams_total",
        &format!("limit=\"{limit}\""),
    )
}

#[test]
fn long_names_node_ids_and_nack_details_are_refused_or_clipped_and_cost_nothing_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = start(dir.path(), &[]);
    let rt = runtime();
    let pid = a.pid().expect("running");
    std::thread::sleep(Duration::from_secs(1));
    let idle = Proc::Pid(pid).mem().rss_mib();
    let idle_heap = heap_kib(&a);
    let log_before = a.log().len();
    let peak = Peak::start(pid);

    // 32 streams with a 1 MiB resource name and a 1 MiB node id (the first run).
    let first: Vec<_> = (0..32).map(|i| long_request(i, MIB, MIB)).collect();
    let (ones, rss_ones) = rt.block_on(wave(a.grpc, first, pid));
    // 64 streams with 4 MiB: half of them with a node id as istiod's, so that the name's own
    // limit refuses them.
    let second: Vec<_> = (0..64)
        .map(|i| long_request(i, 4 * MIB, if i % 2 == 0 { 4 * MIB } else { 60 }))
        .collect();
    let (fours, rss_fours) = rt.block_on(wave(a.grpc, second, pid));
    let all: Vec<&String> = ones.iter().chain(&fours).collect();
    let by = |flag: &str| all.iter().filter(|o| o.contains(flag)).count();
    eprintln!(
        "outcomes: {} by node id, {} by name",
        by("--max-node-id-length"),
        by("--max-resource-name-length")
    );

    // A sink that NACKs every response with a 1 MiB detail, 50 times: each NACK is
    // counted, a warning is logged once per 10 s.
    let nacks = 50;
    rt.block_on(async {
        let ch = connect(a.grpc, None).await;
        let mut req = long_request(0, 10, 60);
        req.resource_names.clear();
        let (tx, mut s) = open(ch, req.clone()).await.expect("opens");
        for _ in 0..nacks {
            let r = s.message().await.expect("ok").expect("a response");
            tx.send(DiscoveryRequest {
                type_url: SE.into(),
                response_nonce: r.nonce,
                version_info: r.version_info,
                error_detail: Some(RpcStatus {
                    code: 3,
                    message: "e".repeat(MIB),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .expect("nack");
            // Asking again, fresh, gets the set again to NACK.
            tx.send(req.clone()).expect("again");
        }
    });
    wait_for(Duration::from_secs(30), "every NACK counted", || {
        (a.metric("mcp_adapter_nacks_total") == nacks as f64).then_some(())
    });
    let peak = peak.finish();
    let settled = Proc::Pid(pid).mem().rss_mib();
    // What they cost after: every stream and connection is gone, the live heap is back.
    let heap = heap_after(&a, idle_heap);
    let log = a.log();
    let grown = log.len() - log_before;
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    let warnings = log.matches("Sink rejected a response").count();
    eprintln!(
        "adapter RSS idle {idle:.1} MiB, after the 1 MiB wave {rss_ones:.1} MiB, after the 4 MiB wave {rss_fours:.1} MiB, peak {peak:.1} MiB, settled {settled:.1} MiB; live heap idle {idle_heap:.0} KiB, after {heap:.0} KiB ({:+.0} KiB); log grew {grown} bytes, longest line {longest} bytes; NACK warnings {warnings}",
        heap - idle_heap
    );
    assert_eq!(by("--max-node-id-length"), 64, "{all:#?}");
    assert_eq!(by("--max-resource-name-length"), 32, "{all:#?}");
    assert!(
        all.iter().all(|o| o.starts_with("ResourceExhausted")),
        "{all:#?}"
    );
    assert_eq!(refused(&a, "node_id_length"), 64.0);
    assert_eq!(refused(&a, "resource_name_length"), 32.0);
    assert!(
        peak <= idle + PEAK_BOUND_MIB,
        "RSS peaked at {peak:.1} MiB, idle {idle:.1}"
    );
    assert!(grown <= LOG_BOUND, "the log grew by {grown} bytes");
    assert!(longest < 2048, "a log line of {longest} bytes");
    assert!(
        heap <= idle_heap + HEAP_AFTER_BOUND_KIB,
        "the live heap stayed at {heap:.0} KiB once every stream was gone, idle {idle_heap:.0} KiB \
         (bound +{HEAP_AFTER_BOUND_KIB} KiB)"
    );
    // 50 NACKs within a few seconds: the first is logged, then at most one more once
    // `LOG_EVERY` (10 s) has passed.
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} NACK warnings: logged, and throttled"
    );
}

/// A sink that asks for four types and ACKs the first two nonces (the server numbers them 1,
/// 2, ...) on a channel whose receive window is 16 bytes, and reads nothing: the stream's task
/// waits to hand the body a response it cannot take.
async fn stuck_sink(
    addr: SocketAddr,
) -> (
    mpsc::UnboundedSender<DiscoveryRequest>,
    Streaming<DiscoveryResponse>,
) {
    let ch = connect(addr, Some(16)).await;
    let first = DiscoveryRequest {
        type_url: SE.into(),
        ..Default::default()
    };
    let (tx, s) = open(ch, first).await.expect("opens");
    for t in ["example.com/A", "example.com/B", "example.com/C"] {
        tx.send(DiscoveryRequest {
            type_url: t.into(),
            ..Default::default()
        })
        .expect("send");
    }
    for (t, nonce) in [(SE, "1"), ("example.com/A", "2")] {
        tx.send(DiscoveryRequest {
            type_url: t.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        })
        .expect("ack");
    }
    (tx, s)
}

#[test]
fn a_sink_that_stops_reading_counts_as_unacked_and_gives_its_slot_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let a = start(dir.path(), &["--unacked-threshold", "1s"]);
    let stuck = rt.block_on(stuck_sink(a.grpc));
    wait_for(
        Duration::from_secs(30),
        "the stuck stream counted as unacked",
        || (a.metric("mcp_adapter_unacked_responses") == 1.0).then_some(()),
    );
    drop(stuck);
    drop(a);

    let dir = tempfile::tempdir().expect("tempdir");
    let a = start(
        dir.path(),
        &[
            "--max-streams",
            "1",
            "--max-connection-age",
            "1s",
            "--max-connection-age-grace",
            "1s",
        ],
    );
    std::thread::sleep(Duration::from_secs(1));
    let idle_heap = heap_kib(&a);
    let opened = Instant::now();
    let stuck = rt.block_on(stuck_sink(a.grpc));
    // Counted first (it is, for the 2 s of age and grace): else the wait for it to end below
    // returns at once, and the time measured says nothing.
    wait_for(Duration::from_secs(5), "the stuck stream counted", || {
        (a.metric("mcp_adapter_connected_sinks") == 1.0).then_some(())
    });
    wait_for(Duration::from_secs(30), "the stuck stream ended", || {
        (a.metric("mcp_adapter_connected_sinks") == 0.0).then_some(())
    });
    let freed = opened.elapsed();
    eprintln!("the stuck stream's slot was free {freed:?} after it opened");
    // Age and grace (2 s), not the 5 s a farewell to a full channel would add; and not before
    // them (a stream that ended before was not stuck, and the time says nothing).
    assert!(freed < Duration::from_secs(5), "{freed:?}");
    assert!(
        freed >= Duration::from_secs(2),
        "ended before its age: {freed:?}"
    );
    let served = rt.block_on(async {
        let ch = connect(a.grpc, None).await;
        let first = DiscoveryRequest {
            type_url: SE.into(),
            ..Default::default()
        };
        let (_tx, mut s) = open(ch, first).await.expect("opens");
        s.message().await.expect("served").expect("the set")
    });
    assert_eq!(served.resources.len(), 20);
    drop(stuck);
    // The stuck sink and what was queued for it cost nothing once it is gone.
    let heap = heap_after(&a, idle_heap);
    eprintln!(
        "live heap idle {idle_heap:.0} KiB, after the stuck sink {heap:.0} KiB ({:+.0} KiB)",
        heap - idle_heap
    );
    assert!(
        heap <= idle_heap + HEAP_AFTER_BOUND_KIB,
        "the live heap stayed at {heap:.0} KiB once the stuck sink was gone, idle \
         {idle_heap:.0} KiB (bound +{HEAP_AFTER_BOUND_KIB} KiB)"
    );
}
