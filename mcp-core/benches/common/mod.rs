//! Helpers shared by the `latency` and `memory` bench binaries.
#![allow(dead_code)]

use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use mcp_core::model::Service;
use mcp_core::testing::mk_service;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

/// The type URL istiod 1.24+ subscribes to.
pub const SE: &str = "networking.istio.io/v1/ServiceEntry";

/// `n` services `svc-00000`.. with `endpoints` endpoints each.
pub fn services(n: usize, endpoints: usize) -> Vec<Service> {
    (0..n)
        .map(|i| mk_service(&format!("svc-{i:05}"), endpoints))
        .collect()
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

/// Sum of every series of metric `name` in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// (VmRSS, VmHWM) of this process in KiB.
pub fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Machine line for the summaries.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores ({cpu}), shared with other work")
}
