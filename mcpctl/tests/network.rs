//! The sink against in-process fake servers built from the workspace's own server halves: the
//! exact requests it sends (subscription, ACKs, NACKs) and the state it builds from responses.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use mcpctl::sink::{ApiVersion, Sink, SinkError, SinkOptions};
use prost::bytes::Bytes;
use prost::Message;
use proto::istio::mcp::v1alpha1::{Metadata, RequestResources, Resource};
use proto::istio::networking::v1alpha3::ServiceEntry;
use proto::responses::{self as wire, SharedAny};
use proto::server::ads::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::server::resource_source::resource_source_server::{
    ResourceSource, ResourceSourceServer,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

type Out<T> = UnboundedReceiverStream<Result<T, Status>>;

/// One scripted stream: responses the test pushes, requests the server saw.
struct Script<Req, Resp> {
    responses: Mutex<Option<UnboundedReceiver<Result<Resp, Status>>>>,
    requests: UnboundedSender<Req>,
}

struct Handle<Req, Resp> {
    responses: UnboundedSender<Result<Resp, Status>>,
    requests: UnboundedReceiver<Req>,
}

impl<Req, Resp> Handle<Req, Resp> {
    async fn request(&mut self) -> Req {
        tokio::time::timeout(Duration::from_secs(5), self.requests.recv())
            .await
            .unwrap()
            .unwrap()
    }
    fn send(&self, r: Resp) {
        self.responses.send(Ok(r)).ok().unwrap();
    }
}

fn script<Req, Resp>() -> (Script<Req, Resp>, Handle<Req, Resp>) {
    let (resp_tx, resp_rx) = unbounded_channel();
    let (req_tx, req_rx) = unbounded_channel();
    (
        Script {
            responses: Mutex::new(Some(resp_rx)),
            requests: req_tx,
        },
        Handle {
            responses: resp_tx,
            requests: req_rx,
        },
    )
}

impl<Req: Send + 'static, Resp> Script<Req, Resp> {
    fn start(&self, mut inbound: Streaming<Req>) -> Result<Out<Resp>, Status> {
        let rx = self
            .responses
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| Status::unavailable("one stream only"))?;
        let tx = self.requests.clone();
        tokio::spawn(async move {
            while let Some(Ok(req)) = inbound.next().await {
                if tx.send(req).is_err() {
                    break;
                }
            }
        });
        Ok(UnboundedReceiverStream::new(rx))
    }
}

struct Ads {
    sotw: Script<DiscoveryRequest, wire::DiscoveryResponse>,
    delta: Script<DeltaDiscoveryRequest, wire::DeltaDiscoveryResponse>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Out<wire::DiscoveryResponse>;
    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.sotw.start(request.into_inner()).map(Response::new)
    }
    type DeltaAggregatedResourcesStream = Out<wire::DeltaDiscoveryResponse>;
    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.delta.start(request.into_inner()).map(Response::new)
    }
}

struct Legacy(Script<RequestResources, wire::Resources>);

#[tonic::async_trait]
impl ResourceSource for Legacy {
    type EstablishResourceStreamStream = Out<wire::Resources>;
    async fn establish_resource_stream(
        &self,
        request: Request<Streaming<RequestResources>>,
    ) -> Result<Response<Self::EstablishResourceStreamStream>, Status> {
        self.0.start(request.into_inner()).map(Response::new)
    }
}

async fn listener() -> (tokio::net::TcpListener, u16) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

type SotwHandle = Handle<DiscoveryRequest, wire::DiscoveryResponse>;
type DeltaHandle = Handle<DeltaDiscoveryRequest, wire::DeltaDiscoveryResponse>;
type AdsHandles = (u16, SotwHandle, DeltaHandle);

/// A scripted ADS server on a free port.
async fn serve_ads() -> AdsHandles {
    let (l, port) = listener().await;
    let (h1, h2) = serve_ads_on(l);
    (port, h1, h2)
}

/// A scripted ADS server on `l`: the handles of its SotW and delta streams.
fn serve_ads_on(l: tokio::net::TcpListener) -> (SotwHandle, DeltaHandle) {
    let (sotw, h1) = script();
    let (delta, h2) = script();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(Ads { sotw, delta }))
            .serve_with_incoming(TcpListenerStream::new(l)),
    );
    (h1, h2)
}

/// A scripted legacy MCP (ResourceSource) server on a free port.
async fn serve_legacy() -> (u16, Handle<RequestResources, wire::Resources>) {
    let (s, h) = script();
    let (l, port) = listener().await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ResourceSourceServer::new(Legacy(s)))
            .serve_with_incoming(TcpListenerStream::new(l)),
    );
    (port, h)
}

fn resource(name: &str, version: &str, host: &str) -> Bytes {
    let spec = ServiceEntry {
        hosts: vec![host.to_string()],
        ..Default::default()
    };
    Resource {
        metadata: Some(Metadata {
            name: name.to_string(),
            version: version.to_string(),
            ..Default::default()
        }),
        body: Some(prost_types::Any {
            type_url: proto::SERVICE_ENTRY_TYPE_URL.to_string(),
            value: spec.encode_to_vec(),
        }),
    }
    .encode_to_vec()
    .into()
}

fn any(value: Bytes) -> SharedAny {
    SharedAny {
        type_url: proto::MCP_RESOURCE_TYPE_URL,
        value,
    }
}

fn keys(u: &mcpctl::sink::Update) -> Vec<&str> {
    u.state.keys().map(String::as_str).collect()
}

#[tokio::test]
async fn xds_subscribes_acks_and_nacks() {
    let (port, mut h, _) = serve_ads().await;
    let mut opts = SinkOptions::new(format!("xds://127.0.0.1:{port}"));
    opts.api_version = ApiVersion::V1alpha3;
    let mut sink = Sink::connect(opts).await.unwrap();

    let first = h.request().await;
    assert_eq!(first.type_url, "networking.istio.io/v1alpha3/ServiceEntry");
    assert_eq!(
        first.node.as_ref().map(|n| n.id.as_str()),
        Some(mcpctl::sink::NODE_ID)
    );

    let t = first.type_url.as_str();
    h.send(sotw_of(
        t,
        "v1",
        "n1",
        vec![resource("ns/a", "1", "a"), resource("ns/b", "1", "b")],
    ));
    let u = sink.next().await.unwrap();
    assert_eq!(keys(&u), ["ns/a", "ns/b"]);
    assert_eq!(u.version_info, "v1");
    let ack = h.request().await;
    assert_eq!(
        (
            ack.version_info.as_str(),
            ack.response_nonce.as_str(),
            ack.node.is_none()
        ),
        ("v1", "n1", true)
    );
    assert!(ack.error_detail.is_none());

    // Nothing pending: next_within times out and the stream stays usable.
    assert!(sink
        .next_within(Duration::from_millis(100))
        .await
        .unwrap()
        .is_none());

    // A broken resource is NACKed with the last accepted version and reported by name.
    let broken = Bytes::from_static(b"\x0a\x05\x0a\x03ns/");
    h.send(sotw_of(t, "v2", "n2", vec![broken]));
    let err = sink.next().await.unwrap_err();
    assert!(matches!(err, SinkError::Decode { .. }), "{err}");
    let nack = h.request().await;
    assert_eq!(nack.version_info, "v1");
    assert_eq!(nack.response_nonce, "n2");
    assert!(nack.error_detail.unwrap().message.contains("ns/"));

    // Omission deletes.
    h.send(sotw_of(t, "v3", "n3", vec![resource("ns/b", "3", "b3")]));
    let u = sink
        .next_within(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(keys(&u), ["ns/b"]);
    assert_eq!(u.removed, ["ns/a"]);
    assert_eq!(u.state["ns/b"].spec.hosts, ["b3"]);

    // The server ending the stream is an error.
    drop(h);
    let err = sink.next().await.unwrap_err();
    assert!(matches!(err, SinkError::Closed { .. }), "{err}");
}

#[tokio::test]
async fn delta_applies_upserts_and_removals() {
    let (port, _, mut h) = serve_ads().await;
    let mut sink = Sink::connect(SinkOptions::new(format!("delta://127.0.0.1:{port}")))
        .await
        .unwrap();
    let first = h.request().await;
    assert_eq!(first.type_url, "networking.istio.io/v1/ServiceEntry");
    assert!(first.resource_names_subscribe.is_empty());
    assert!(first.node.is_some());

    let envelope = |name: &str, v: &str, host: &str| wire::DeltaResource {
        version: v.into(),
        resource: Some(any(resource(name, v, host))),
        name: name.into(),
    };
    h.send(wire::DeltaDiscoveryResponse {
        system_version_info: "s1".into(),
        resources: vec![envelope("ns/a", "1", "a"), envelope("ns/b", "1", "b")],
        type_url: first.type_url.clone(),
        nonce: "d1".into(),
        removed_resources: vec![],
    });
    let u = sink.next().await.unwrap();
    assert!(u.incremental);
    assert_eq!(keys(&u), ["ns/a", "ns/b"]);
    let ack = h.request().await;
    assert_eq!(ack.response_nonce, "d1");
    assert_eq!(ack.type_url, first.type_url);

    h.send(wire::DeltaDiscoveryResponse {
        system_version_info: "s2".into(),
        resources: vec![envelope("ns/c", "2", "c")],
        type_url: first.type_url.clone(),
        nonce: "d2".into(),
        removed_resources: vec!["ns/a".into()],
    });
    let u = sink.next().await.unwrap();
    assert_eq!(keys(&u), ["ns/b", "ns/c"]);
    assert_eq!(u.upserted, ["ns/c"]);
    assert_eq!(u.removed, ["ns/a"]);
    assert_eq!(u.version_info, "s2");
    assert_eq!(h.request().await.response_nonce, "d2");
}

#[tokio::test]
async fn legacy_mcp_incremental() {
    let (port, mut h) = serve_legacy().await;
    let mut opts = SinkOptions::new(format!("mcp://127.0.0.1:{port}"));
    opts.incremental = true;
    let mut sink = Sink::connect(opts).await.unwrap();
    let first = h.request().await;
    assert_eq!(first.collection, mcpctl::sink::MCP_COLLECTION);
    assert!(first.incremental);
    assert_eq!(first.sink_node.unwrap().id, "mcpctl");

    h.send(wire::Resources {
        system_version_info: "1".into(),
        collection: first.collection.clone(),
        resources: vec![resource("ns/a", "1", "a"), resource("ns/b", "1", "b")],
        removed_resources: vec![],
        nonce: "m1".into(),
        incremental: false,
    });
    let u = sink.next().await.unwrap();
    assert_eq!(keys(&u), ["ns/a", "ns/b"]);
    assert!(!u.incremental);
    let ack = h.request().await;
    assert_eq!(ack.response_nonce, "m1");
    assert_eq!(ack.collection, first.collection);
    assert!(ack.sink_node.is_some());

    h.send(wire::Resources {
        system_version_info: "2".into(),
        collection: first.collection.clone(),
        resources: vec![],
        removed_resources: vec!["ns/b".into()],
        nonce: "m2".into(),
        incremental: true,
    });
    let u = sink.next().await.unwrap();
    assert_eq!(keys(&u), ["ns/a"]);
    assert!(u.incremental);
}

/// The server is not up when the sink starts: first nothing listens (connection refused), then
/// a listener hangs up on every connection at once (what a sink meets behind a port forward or
/// Service whose backend is starting, or at an adapter over `--max-connections`). The sink keeps
/// retrying through both and subscribes once the server serves. The hang-ups are counted, so
/// the test shows attempts failed before the server was up instead of assuming it from a sleep.
#[tokio::test]
async fn connect_retries_until_server_is_up() {
    let (l, port) = listener().await;
    drop(l);
    let mut opts = SinkOptions::new(format!("xds://127.0.0.1:{port}"));
    opts.connect_timeout = Duration::from_secs(20);
    let connecting = tokio::spawn(Sink::connect(opts));
    // Refused attempts cannot be seen from here; what refusal does to a sink is shown by
    // `a_server_that_never_comes_up_is_reported_unreachable` below.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    const HANG_UPS: usize = 3;
    for i in 0..HANG_UPS {
        let Ok(accepted) = tokio::time::timeout(Duration::from_secs(10), l.accept()).await else {
            panic!(
                "the sink did not try again after {i} hang-ups: {:?}",
                connecting.await
            );
        };
        drop(accepted.unwrap());
    }
    assert!(
        !connecting.is_finished(),
        "the sink gave up or connected while the server only hung up: {:?}",
        connecting.await
    );
    let (mut h, _h2) = serve_ads_on(l);
    let _sink = connecting.await.unwrap().unwrap();
    assert_eq!(h.request().await.type_url, ApiVersion::V1.type_url());
}

/// Refused connections are retried until the connect timeout, which then names the refusal.
#[tokio::test]
async fn a_server_that_never_comes_up_is_reported_unreachable() {
    let (l, port) = listener().await;
    drop(l);
    let mut opts = SinkOptions::new(format!("xds://127.0.0.1:{port}"));
    opts.connect_timeout = Duration::from_millis(600);
    let started = std::time::Instant::now();
    let err = Sink::connect(opts).await.unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "gave up after {:?}, before the timeout",
        started.elapsed()
    );
    match &err {
        SinkError::Unreachable { last_error, .. } => assert!(
            last_error.to_lowercase().contains("refused"),
            "the last error names the refusal: {last_error}"
        ),
        other => panic!("not Unreachable: {other}"),
    }
}

#[tokio::test]
async fn unimplemented_service_fails_fast() {
    // A server with only the legacy service: xDS gets Unimplemented, which retrying won't fix.
    let (port, _h) = serve_legacy().await;
    let started = std::time::Instant::now();
    let err = Sink::connect(SinkOptions::new(format!("xds://127.0.0.1:{port}")))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(
            err,
            SinkError::Stream {
                code: tonic::Code::Unimplemented,
                ..
            }
        ),
        "{err}"
    );
}

/// A SotW response of `v1` ServiceEntries.
fn sotw(version: &str, nonce: &str, resources: Vec<Bytes>) -> wire::DiscoveryResponse {
    sotw_of(ApiVersion::V1.type_url(), version, nonce, resources)
}

/// A SotW response of `type_url`.
fn sotw_of(
    type_url: &str,
    version: &str,
    nonce: &str,
    resources: Vec<Bytes>,
) -> wire::DiscoveryResponse {
    wire::DiscoveryResponse {
        version_info: version.into(),
        resources: resources.into_iter().map(any).collect(),
        type_url: type_url.into(),
        nonce: nonce.into(),
    }
}

#[tokio::test]
async fn cli_prints_first_state_and_exits() {
    let (port, h, _) = serve_ads().await;
    h.send(sotw(
        "v1",
        "n1",
        vec![resource("ns/a", "1", "a.example.com")],
    ));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcpctl"))
        .args(["get", "se", "-o", "json", "--server"])
        .arg(format!("xds://127.0.0.1:{port}"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "List");
    assert_eq!(v["items"][0]["metadata"]["namespace"], "ns");
    assert_eq!(v["items"][0]["metadata"]["name"], "a");
    assert_eq!(v["items"][0]["spec"]["hosts"][0], "a.example.com");
}

#[tokio::test]
async fn cli_watch_prints_every_update() {
    use tokio::io::AsyncBufReadExt;
    let (port, h, _) = serve_ads().await;
    h.send(sotw("v1", "n1", vec![resource("ns/a", "1", "a")]));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcpctl"))
        .args(["get", "serviceentries", "--watch", "-o", "json", "--server"])
        .arg(format!("xds://127.0.0.1:{port}"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next_line = async || {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    let first = next_line().await;
    assert_eq!(first["version"], "v1");
    assert_eq!(first["items"].as_array().unwrap().len(), 1);
    let time = first["time"].as_str().unwrap();
    assert_eq!(time.len(), "2026-11-22T15:04:05.123Z".len(), "{time}");
    assert!(time.ends_with('Z'));

    h.send(sotw(
        "v2",
        "n2",
        vec![resource("ns/a", "1", "a"), resource("ns/b", "2", "b")],
    ));
    let second = next_line().await;
    assert_eq!(second["version"], "v2");
    assert_eq!(second["items"][1]["metadata"]["name"], "b");

    // The server going away ends the watch with a failure.
    drop(h);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success());
}
