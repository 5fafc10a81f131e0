//! Many sinks and slow sinks at 100k endpoints (10k services × 10), with the default flags.
//!
//! The sinks here are real gRPC clients over loopback that decode responses without decoding the
//! resources inside (a response's resources are counted, not parsed), so a hundred of them fit
//! in the test process.

mod common;

use std::time::Duration;

use common::{http_get, metric_sum, Adapter, SE_V1};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use http::uri::PathAndQuery;
use mcp_core::registry::RegistryEvent;
use mcp_core::testing::mk_service;
use proto::responses::DiscoveryResponse;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;
use tonic_prost::ProstCodec;

const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;
/// Generous: these tests assert behaviour, not speed (a debug build moves ~600 MB here).
const PATIENCE: Duration = Duration::from_secs(60);

fn services(generation: usize) -> Vec<mcp_core::model::Service> {
    (0..SERVICES)
        .map(|i| {
            let mut s = mk_service(&format!("svc-{i:05}"), ENDPOINTS);
            if i == 0 {
                s.endpoints.truncate(1 + generation % ENDPOINTS);
            }
            s
        })
        .collect()
}

/// A SotW sink that counts resources instead of decoding them.
struct Sink {
    tx: mpsc::UnboundedSender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

impl Sink {
    async fn connect(channel: Channel) -> Self {
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(usize::MAX);
        grpc.ready().await.expect("channel ready");
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(DiscoveryRequest {
            type_url: SE_V1.into(),
            ..Default::default()
        })
        .expect("subscribe");
        let resp = grpc
            .streaming(
                tonic::Request::new(UnboundedReceiverStream::new(rx)),
                PathAndQuery::from_static(
                    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
                ),
                ProstCodec::<DiscoveryRequest, DiscoveryResponse>::default(),
            )
            .await
            .expect("stream opens");
        Self {
            tx,
            rx: resp.into_inner(),
        }
    }

    /// The next response, ACKed: (version, resource count).
    async fn recv_ack(&mut self) -> (String, usize) {
        let r = tokio::time::timeout(PATIENCE, self.rx.message())
            .await
            .expect("a response in time")
            .expect("stream healthy")
            .expect("stream open");
        self.tx
            .send(DiscoveryRequest {
                type_url: r.type_url.clone(),
                version_info: r.version_info.clone(),
                response_nonce: r.nonce.clone(),
                ..Default::default()
            })
            .expect("ack");
        (r.version_info, r.resources.len())
    }

    /// Nothing arrives for `d`.
    async fn silent_for(&mut self, d: Duration) {
        if let Ok(r) = tokio::time::timeout(d, self.rx.message()).await {
            panic!(
                "expected nothing, got {:?}",
                r.map(|m| m.map(|m| m.version_info))
            );
        }
    }
}

async fn channel(a: &Adapter, window: Option<u32>) -> Channel {
    Endpoint::from_shared(a.grpc_url())
        .expect("url")
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .connect()
        .await
        .expect("connect")
}

async fn metrics(a: &Adapter) -> String {
    http_get(a.admin(), "/metrics").await.1
}

async fn served_version(a: &Adapter) -> String {
    let d = a.debug().await;
    d["version"].as_str().expect("a served version").to_string()
}

async fn start_100k() -> Adapter {
    let a = Adapter::start().await;
    a.handle.send(RegistryEvent::Reset(services(0)));
    a.wait_readyz(200).await;
    a
}

/// A sink that stops reading (its HTTP/2 window is 64 KiB, the response 6 MB) holds back no one:
/// other sinks get every change while it is stuck, the writer publishes each change once, and
/// when it reads again it gets the response that was in flight and then only the newest set, not
/// one response per change it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_sink_holds_back_no_one() {
    let a = start_100k().await;
    let mut stuck = Sink::connect(channel(&a, Some(65_535)).await).await;
    let mut healthy = Sink::connect(channel(&a, None).await).await;
    let (v0, n) = healthy.recv_ack().await;
    assert_eq!(n, SERVICES);
    let snapshots = |m: &str| metric_sum(m, "mcp_adapter_snapshots_total");
    let before = snapshots(&metrics(&a).await);

    for generation in 1..=5 {
        a.handle.send(RegistryEvent::Reset(services(generation)));
        let (v, n) = healthy.recv_ack().await;
        assert_eq!(n, SERVICES);
        assert_eq!(
            v,
            served_version(&a).await,
            "the healthy sink holds the newest set"
        );
    }
    let m = metrics(&a).await;
    assert_eq!(snapshots(&m) - before, 5.0, "one snapshot per change");
    assert_eq!(
        metric_sum(&m, "mcp_adapter_connected_sinks"),
        2.0,
        "the stuck sink is still connected"
    );

    // The stuck sink reads again: the response in flight (the first set), then the newest.
    let (first, n) = stuck.recv_ack().await;
    assert_eq!((first.as_str(), n), (v0.as_str(), SERVICES));
    let (newest, _) = stuck.recv_ack().await;
    assert_eq!(newest, served_version(&a).await);
    stuck.silent_for(Duration::from_millis(500)).await;
    healthy.silent_for(Duration::from_millis(200)).await;
    assert_eq!(
        metric_sum(&metrics(&a).await, "mcp_adapter_registry_errors_total"),
        0.0
    );
    // A later change is each sink's next response: one of the missed changes sent after the
    // quiet windows would come first.
    a.handle.send(RegistryEvent::Reset(services(6)));
    for s in [&mut stuck, &mut healthy] {
        let (v, n) = s.recv_ack().await;
        assert_eq!(n, SERVICES);
        assert_eq!(v, served_version(&a).await, "the newest set");
        assert_ne!(v, newest);
    }
    a.stop().await;
}

/// A hundred sinks connect at once, twice (as after an istiod rollout): each gets the full set
/// once, nothing is published or pushed beyond one response per sink, and the adapter stays
/// ready throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sinks_reconnect_at_once() {
    const SINKS: usize = 100;
    let a = start_100k().await;
    let version = served_version(&a).await;
    let m = metrics(&a).await;
    let snapshots = metric_sum(&m, "mcp_adapter_snapshots_total");
    let mut pushes = metric_sum(&m, "mcp_adapter_pushes_total");
    let mut bytes = metric_sum(&m, "mcp_adapter_push_bytes_total");
    let mut response_len = None;
    for round in 0..2 {
        // Ten connections carry ten streams each, as the sinks of ten istiods would not; it
        // keeps the test's own memory small while the server still runs 100 streams.
        let mut channels = Vec::new();
        for _ in 0..SINKS / 10 {
            channels.push(channel(&a, None).await);
        }
        let tasks: Vec<_> = (0..SINKS)
            .map(|i| {
                let ch = channels[i % channels.len()].clone();
                tokio::spawn(async move {
                    let mut s = Sink::connect(ch).await;
                    let got = s.recv_ack().await;
                    (s, got)
                })
            })
            .collect();
        let mut held = Vec::new();
        for t in tasks {
            let (s, (v, n)) = t.await.expect("sink task");
            assert_eq!(
                (v.as_str(), n),
                (version.as_str(), SERVICES),
                "round {round}"
            );
            held.push(s);
        }
        let m = metrics(&a).await;
        assert_eq!(metric_sum(&m, "mcp_adapter_connected_sinks"), SINKS as f64);
        let p = metric_sum(&m, "mcp_adapter_pushes_total");
        let b = metric_sum(&m, "mcp_adapter_push_bytes_total");
        assert_eq!(
            p - pushes,
            SINKS as f64,
            "one response per sink, round {round}"
        );
        let per_sink = (b - bytes) / SINKS as f64;
        assert!(per_sink > 6.0e6, "a full set is ~6.5 MB: {per_sink}");
        if let Some(len) = response_len {
            assert_eq!(per_sink, len, "the same bytes every round");
        }
        response_len = Some(per_sink);
        (pushes, bytes) = (p, b);
        for s in &mut held {
            s.silent_for(Duration::from_millis(5)).await;
        }
        if round == 1 {
            // The last round's quiet windows have no round after them: a later change must be
            // each sink's next response, so a second response sent late would come first. (The
            // first round's are followed by the second's exact push count.)
            assert_eq!(
                metric_sum(&metrics(&a).await, "mcp_adapter_snapshots_total"),
                snapshots,
                "sinks connecting publish nothing"
            );
            a.handle
                .send(RegistryEvent::Upsert(mk_service("svc-00000", 2)));
            // Read at once, as the sinks were connected: ten streams share a connection's
            // window, so one sink read to the end first would wait for the others' data. Each
            // sink goes once it has its response, so that a response after it (when this one
            // is not the newest) cannot hold up the others on its connection.
            let tasks: Vec<_> = std::mem::take(&mut held)
                .into_iter()
                .map(|mut s| tokio::spawn(async move { s.recv_ack().await }))
                .collect();
            let mut got = Vec::new();
            for t in tasks {
                let (v, n) = t.await.expect("sink task");
                assert_eq!(n, SERVICES);
                got.push(v);
            }
            let newest = served_version(&a).await;
            assert_ne!(newest, version);
            assert!(
                got.iter().all(|v| *v == newest),
                "each sink's next response is the change ({newest}): {got:?}"
            );
            assert_eq!(
                metric_sum(&metrics(&a).await, "mcp_adapter_pushes_total") - pushes,
                SINKS as f64,
                "one response per sink for the change"
            );
        }
        drop(held);
        drop(channels);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while metric_sum(&metrics(&a).await, "mcp_adapter_connected_sinks") > 0.0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "streams of gone sinks end"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        a.wait_readyz(200).await;
    }
    let m = metrics(&a).await;
    assert_eq!(
        metric_sum(&m, "mcp_adapter_snapshots_total"),
        snapshots + 1.0,
        "sinks connecting publish nothing; the change one snapshot"
    );
    assert_eq!(metric_sum(&m, "mcp_adapter_registry_errors_total"), 0.0);
    a.stop().await;
}

/// `--max-message-size`: a response over the limit is not sent; the stream ends with
/// RESOURCE_EXHAUSTED naming both sizes, it is counted, and a response under the limit on
/// another stream is unaffected.
#[tokio::test]
async fn a_response_over_max_message_size_ends_the_stream_with_a_clear_status() {
    let mut args = mcp_runtime::testing::test_args();
    args.max_message_size = Some(64 << 10);
    let a = Adapter::start_with(args).await;
    a.handle.send(RegistryEvent::Reset(
        (0..1000)
            .map(|i| mk_service(&format!("s{i}"), 10))
            .collect(),
    ));
    a.wait_readyz(200).await;
    let mut sink = Sink::connect(channel(&a, None).await).await;
    let status = match tokio::time::timeout(PATIENCE, sink.rx.message()).await {
        Ok(Err(status)) => status,
        other => panic!(
            "expected a status, got {:?}",
            other.map(|r| r.map(|m| m.map(|m| m.version_info)))
        ),
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("--max-message-size of 65536 bytes"),
        "{status:?}"
    );
    let m = metrics(&a).await;
    assert_eq!(metric_sum(&m, "mcp_adapter_oversized_responses_total"), 1.0);
    assert_eq!(metric_sum(&m, "mcp_adapter_pushes_total"), 0.0);

    // Under the limit, the same adapter serves normally.
    a.handle
        .send(RegistryEvent::Reset(vec![mk_service("small", 2)]));
    a.wait_served(&["fake/small"]).await;
    let mut sink = Sink::connect(channel(&a, None).await).await;
    assert_eq!(sink.recv_ack().await.1, 1);
    a.stop().await;
}
