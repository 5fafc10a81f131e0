//! Helpers for the conformance tests: a running adapter over a fake registry, raw protocol
//! clients with timeouts, a sink over any protocol ([`sink`]), and a tiny HTTP GET for the admin
//! port.

#![allow(dead_code)]

pub mod sink;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mcp_core::testing::{fake_registry, FakeHandle};
use mcp_runtime::runtime::{self, Running};
use mcp_runtime::testing::test_args;
use mcp_runtime::CommonArgs;
use prost::Message;
use proto::istio::mcp::v1alpha1::aggregated_mesh_config_service_client::AggregatedMeshConfigServiceClient;
use proto::istio::mcp::v1alpha1::resource_source_client::ResourceSourceClient;
use proto::istio::mcp::v1alpha1::{
    IncrementalMeshConfigRequest, IncrementalMeshConfigResponse, MeshConfigRequest,
    MeshConfigResponse, RequestResources, Resource, Resources,
};
use proto::istio::networking::v1alpha3::ServiceEntry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

/// How long any single expected event may take.
pub const STEP: Duration = Duration::from_secs(5);
/// How long we listen to assert that nothing arrives.
pub const QUIET: Duration = Duration::from_millis(500);

pub const SE_V1: &str = "networking.istio.io/v1/ServiceEntry";
pub const SE_V1BETA1: &str = "networking.istio.io/v1beta1/ServiceEntry";
pub const SE_V1ALPHA3: &str = "networking.istio.io/v1alpha3/ServiceEntry";
pub const SE_COLLECTION: &str = "istio/networking/v1alpha3/serviceentries";
pub const MCP_RESOURCE_ANY: &str = "type.googleapis.com/istio.mcp.v1alpha1.Resource";
pub const SE_ANY: &str = "type.googleapis.com/istio.networking.v1alpha3.ServiceEntry";

/// A running adapter over a fake registry.
pub struct Adapter {
    pub running: Running,
    pub handle: FakeHandle,
}

impl Adapter {
    pub async fn start() -> Self {
        Self::start_with(test_args()).await
    }

    pub async fn start_with(args: CommonArgs) -> Self {
        let (registry, handle) = fake_registry();
        let running = tokio::time::timeout(STEP, runtime::start(registry, args))
            .await
            .expect("start timed out")
            .expect("adapter starts");
        Adapter { running, handle }
    }

    pub fn grpc(&self) -> SocketAddr {
        self.running.grpc_addr
    }

    pub fn admin(&self) -> SocketAddr {
        self.running.admin_addr
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.running.grpc_addr)
    }

    pub fn xds_url(&self) -> String {
        format!("xds://{}", self.running.grpc_addr)
    }

    pub async fn channel(&self) -> Channel {
        channel_to(self.grpc()).await
    }

    /// A SotW xDS stream to the gRPC port at `addr` (one shard's, with `--shards`).
    pub async fn xds_at(&self, addr: SocketAddr) -> Raw<DiscoveryRequest, DiscoveryResponse> {
        let mut c = AggregatedDiscoveryServiceClient::new(channel_to(addr).await);
        open(|rx| async move { c.stream_aggregated_resources(rx).await }).await
    }

    /// Waits until /readyz answers `code`.
    pub async fn wait_readyz(&self, code: u16) -> String {
        self.wait_http("/readyz", code).await
    }

    /// Waits until exactly `names` are served (the coalescing window has passed and the change
    /// is published), so a stream opened next sees them.
    pub async fn wait_served(&self, names: &[&str]) {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let d = self.debug().await;
            let served: Vec<&str> = d["resources"]
                .as_array()
                .map(|rs| rs.iter().filter_map(|r| r["name"].as_str()).collect())
                .unwrap_or_default();
            if served == names {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "served {served:?}, wanted {names:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `path` on the admin port answers `code`; returns the body.
    pub async fn wait_http(&self, path: &str, code: u16) -> String {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let (c, body) = http_get(self.admin(), path).await;
            if c == code {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path} stayed {c} ({body:?}), wanted {code}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        let (code, body) = http_get(self.admin(), "/metrics").await;
        assert_eq!(code, 200, "/metrics: {body}");
        body
    }

    /// Asserts the value of one series on /metrics (see [`metric`]).
    pub async fn assert_metric(&self, series: &str, want: Option<f64>) {
        let m = self.metrics().await;
        assert_eq!(metric(&m, series), want, "{series}:\n{m}");
    }

    pub async fn debug(&self) -> serde_json::Value {
        let (code, body) = http_get(self.admin(), "/debug/resources").await;
        assert_eq!(code, 200, "/debug/resources: {body}");
        serde_json::from_str(&body).expect("/debug/resources is JSON")
    }

    pub async fn stop(self) {
        tokio::time::timeout(STEP, self.running.stop())
            .await
            .expect("stop timed out")
            .expect("stops cleanly");
    }

    // ---- raw streams ----

    pub async fn xds(&self) -> Raw<DiscoveryRequest, DiscoveryResponse> {
        self.xds_at(self.grpc()).await
    }

    pub async fn delta(&self) -> Raw<DeltaDiscoveryRequest, DeltaDiscoveryResponse> {
        let mut c = AggregatedDiscoveryServiceClient::new(self.channel().await);
        open(|rx| async move { c.delta_aggregated_resources(rx).await }).await
    }

    pub async fn legacy(&self) -> Raw<RequestResources, Resources> {
        let mut c = ResourceSourceClient::new(self.channel().await);
        open(|rx| async move { c.establish_resource_stream(rx).await }).await
    }

    pub async fn mesh_sotw(&self) -> Raw<MeshConfigRequest, MeshConfigResponse> {
        let mut c = AggregatedMeshConfigServiceClient::new(self.channel().await);
        open(|rx| async move { c.stream_aggregated_resources(rx).await }).await
    }

    pub async fn mesh_incremental(
        &self,
    ) -> Raw<IncrementalMeshConfigRequest, IncrementalMeshConfigResponse> {
        let mut c = AggregatedMeshConfigServiceClient::new(self.channel().await);
        open(|rx| async move { c.incremental_aggregated_resources(rx).await }).await
    }
}

/// A connected channel to the gRPC port at `addr`.
pub async fn channel_to(addr: SocketAddr) -> Channel {
    tokio::time::timeout(
        STEP,
        Channel::from_shared(format!("http://{addr}"))
            .expect("url")
            .connect(),
    )
    .await
    .expect("connect timed out")
    .expect("connect")
}

/// Opens one bidirectional stream whose requests the test sends through `Raw::tx`.
async fn open<Req, Resp, Fut>(
    rpc: impl FnOnce(UnboundedReceiverStream<Req>) -> Fut,
) -> Raw<Req, Resp>
where
    Fut: std::future::Future<Output = Result<tonic::Response<Streaming<Resp>>, tonic::Status>>,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let resp = tokio::time::timeout(STEP, rpc(UnboundedReceiverStream::new(rx)))
        .await
        .expect("open timed out")
        .expect("stream opens");
    Raw {
        tx,
        rx: resp.into_inner(),
    }
}

/// One bidirectional stream driven by hand.
pub struct Raw<Req, Resp> {
    pub tx: mpsc::UnboundedSender<Req>,
    pub rx: Streaming<Resp>,
}

impl<Req, Resp: std::fmt::Debug> Raw<Req, Resp> {
    pub fn send(&self, req: Req) {
        self.tx.send(req).expect("request stream open");
    }

    /// The next response; fails the test after [`STEP`].
    pub async fn recv(&mut self) -> Resp {
        match tokio::time::timeout(STEP, self.rx.message()).await {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => panic!("server closed the stream"),
            Ok(Err(s)) => panic!("stream failed: {s}"),
            Err(_) => panic!("no response within {STEP:?}"),
        }
    }

    /// Asserts nothing arrives for `d`.
    pub async fn silent_for(&mut self, d: Duration, why: &str) {
        match tokio::time::timeout(d, self.rx.message()).await {
            Err(_) => {}
            Ok(Ok(Some(r))) => panic!("expected no response ({why}), got {r:?}"),
            Ok(Ok(None)) => panic!("expected no response ({why}), stream closed"),
            Ok(Err(s)) => panic!("expected no response ({why}), stream failed: {s}"),
        }
    }

    pub async fn silent(&mut self, why: &str) {
        self.silent_for(QUIET, why).await;
    }
}

// ---- request builders ----

pub fn istiod_node() -> Node {
    Node {
        id: "istiod~10.0.0.1~istiod-7d9c5b.istio-system~istio-system.svc.cluster.local".into(),
        ..Default::default()
    }
}

pub fn xds_req(type_url: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

pub fn xds_ack(r: &DiscoveryResponse) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: r.type_url.clone(),
        response_nonce: r.nonce.clone(),
        version_info: r.version_info.clone(),
        ..Default::default()
    }
}

pub fn delta_ack(r: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: r.type_url.clone(),
        response_nonce: r.nonce.clone(),
        ..Default::default()
    }
}

pub fn legacy_req(collection: &str, nonce: &str, incremental: bool) -> RequestResources {
    RequestResources {
        sink_node: Some(proto::istio::mcp::v1alpha1::SinkNode {
            id: String::new(),
            annotations: Default::default(),
        }),
        collection: collection.into(),
        response_nonce: nonce.into(),
        incremental,
        ..Default::default()
    }
}

// ---- decoding ----

/// A decoded MCP resource.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub name: String,
    pub version: String,
    pub create_time: Option<prost_types::Timestamp>,
    pub spec: ServiceEntry,
}

pub fn decode_resource(r: &Resource) -> Decoded {
    let md = r.metadata.clone().expect("resource has metadata");
    let body = r.body.as_ref().expect("resource has a body");
    assert_eq!(body.type_url, SE_ANY, "body type_url of {}", md.name);
    let spec = ServiceEntry::decode(body.value.as_slice()).expect("body is a ServiceEntry");
    Decoded {
        name: md.name,
        version: md.version,
        create_time: md.create_time,
        spec,
    }
}

/// Decodes an `Any(istio.mcp.v1alpha1.Resource)` from an xDS response.
pub fn decode_any(any: &envoy_types::pb::google::protobuf::Any) -> Decoded {
    assert_eq!(any.type_url, MCP_RESOURCE_ANY, "envelope type_url");
    let r = Resource::decode(any.value.as_slice()).expect("an MCP Resource");
    decode_resource(&r)
}

pub fn decode_xds(r: &DiscoveryResponse) -> BTreeMap<String, Decoded> {
    r.resources
        .iter()
        .map(decode_any)
        .map(|d| (d.name.clone(), d))
        .collect()
}

pub fn names<'a>(m: impl IntoIterator<Item = (&'a String, &'a Decoded)>) -> Vec<String> {
    m.into_iter().map(|(k, _)| k.clone()).collect()
}

// ---- admin HTTP ----

/// A minimal HTTP/1.0 GET: (status code, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("admin");
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.expect("read");
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("a status code");
        (code, body.to_string())
    };
    tokio::time::timeout(STEP, fut)
        .await
        .expect("admin GET timed out")
}

/// The value of one series (`name{labels}` exactly as rendered, or a bare name).
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (s, v) = l.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok()).flatten()
    })
}

/// Sum of every series of a metric family.
#[allow(unused_imports)] // like the rest of this module, not every test binary uses it
pub use mcp_core::testing::metric_sum;
