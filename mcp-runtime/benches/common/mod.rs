//! Helpers shared by this crate's bench binaries: model input, a raw xDS client, the admin
//! port, and the machine line of the summaries. What a process costs (`/proc`) is read with
//! `mcp_core::testing::bench`, which the end-to-end scale bench shares.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mcp_core::model::Service;
use mcp_core::testing::{bench, fake_registry, mk_service, FakeHandle};
use mcp_core::translate::TranslateConfig;
use mcp_runtime::runtime::{self, Running};
use mcp_runtime::testing::test_args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

pub use mcp_core::testing::bench::{scaled, smoke};

/// The type URL istiod 1.24+ subscribes to.
pub const SE: &str = "networking.istio.io/v1/ServiceEntry";

/// `n` services `svc-00000`.. with `endpoints` endpoints each.
pub fn services(n: usize, endpoints: usize) -> Vec<Service> {
    (0..n)
        .map(|i| mk_service(&format!("svc-{i:05}"), endpoints))
        .collect()
}

/// The adapter runtime over a fake registry, measured without the coalescing window (the benches
/// measure the path, not the wait).
pub async fn start_fake() -> (Running, FakeHandle) {
    let (registry, handle) = fake_registry();
    let mut args = test_args();
    args.coalesce = std::time::Duration::ZERO;
    let running = runtime::start(registry, args)
        .await
        .expect("runtime starts");
    (running, handle)
}

/// The translation settings of the fake registry's runtime.
pub fn translate_config() -> TranslateConfig {
    TranslateConfig {
        namespace: "fake".into(),
        host_suffix: "fake.local".into(),
        export_to: vec![],
        registry: "fake".into(),
        source: "fake".into(),
        on_empty: mcp_core::OnEmpty::Keep,
        vip_cidr: mcp_core::vip::VipCidr::Off,
        max_labels: mcp_core::translate::DEFAULT_MAX_LABELS,
        naming: Default::default(),
    }
}

/// A raw envoy ADS client without a message size limit.
pub async fn ads_client(addr: SocketAddr) -> AggregatedDiscoveryServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

/// Opens an xDS SotW stream subscribed to ServiceEntries (with `node` on the first request, as
/// istiod sends it); returns the request sender and the response stream.
pub async fn sotw_subscribe(
    addr: SocketAddr,
    node: Option<Node>,
) -> (
    mpsc::UnboundedSender<DiscoveryRequest>,
    Streaming<DiscoveryResponse>,
) {
    let mut client = ads_client(addr).await;
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(DiscoveryRequest {
        type_url: SE.into(),
        node,
        ..Default::default()
    })
    .expect("send");
    let stream = client
        .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    (tx, stream)
}

/// Opens a delta xDS stream subscribed to ServiceEntries (with `node`, as istiod sends it);
/// returns the request sender and the response stream.
pub async fn delta_subscribe(
    addr: SocketAddr,
    node: Option<Node>,
) -> (
    mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    Streaming<DeltaDiscoveryResponse>,
) {
    let mut client = ads_client(addr).await;
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(DeltaDiscoveryRequest {
        type_url: SE.into(),
        node,
        ..Default::default()
    })
    .expect("send");
    let stream = client
        .delta_aggregated_resources(UnboundedReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    (tx, stream)
}

/// Plain HTTP/1.1 GET; returns the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("admin connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    match text.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_string(),
        None => text,
    }
}

/// Machine line for the summaries.
pub fn machine() -> String {
    format!(
        "{} cores ({}), shared with other work",
        bench::cores(),
        bench::cpu_model().unwrap_or_else(|| "unknown".into())
    )
}
