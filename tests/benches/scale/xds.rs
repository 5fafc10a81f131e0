//! The xDS client side of the sinks and of the floor's recorder: response messages that decode
//! only what the bench looks at, a codec that also reports each message's size on the wire, and
//! streams opened as istiod opens them.

use std::marker::PhantomData;
use std::net::SocketAddr;

use bytes::Buf;
use prost::Message;
use proto::envoy::config::core::v3::Node;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::sync::mpsc::UnboundedSender;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Status, Streaming};

use crate::NAMESPACE;

/// What the sinks subscribe to (Istio 1.22's type URL; the adapter serves v1 and v1alpha3).
const SE_TYPE: &str = "networking.istio.io/v1alpha3/ServiceEntry";
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// `DiscoveryResponse` as the sinks read it: resources are counted, their bodies skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LightSotw {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<LightAny>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `google.protobuf.Any` without its value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LightAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
}

/// `DeltaDiscoveryResponse` with resource names and versions only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LightDelta {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<LightDeltaResource>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LightDeltaResource {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub resource: Option<LightAny>,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// A prost codec whose decoder also returns the message's size on the wire.
struct SizedCodec<Req, Resp>(PhantomData<fn() -> (Req, Resp)>);

impl<Req, Resp> Default for SizedCodec<Req, Resp> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

struct ProstEncoder<T>(PhantomData<fn(T)>);
struct SizedDecoder<T>(PhantomData<fn() -> T>);

impl<Req, Resp> Codec for SizedCodec<Req, Resp>
where
    Req: Message + Send + 'static,
    Resp: Message + Default + Send + 'static,
{
    type Encode = Req;
    type Decode = (usize, Resp);
    type Encoder = ProstEncoder<Req>;
    type Decoder = SizedDecoder<Resp>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        SizedDecoder(PhantomData)
    }
}

impl<T: Message> Encoder for ProstEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encode: {e}")))
    }
}

impl<T: Message + Default> Decoder for SizedDecoder<T> {
    type Item = (usize, T);
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<(usize, T)>, Status> {
        let size = src.remaining();
        T::decode(src)
            .map(|m| Some((size, m)))
            .map_err(|e| Status::internal(format!("decode: {e}")))
    }
}

/// A connection as istiod's client makes one (1 MiB HTTP/2 windows, no message size limit).
async fn grpc_client(
    addr: SocketAddr,
) -> Result<tonic::client::Grpc<tonic::transport::Channel>, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .initial_stream_window_size(Some(1 << 20))
        .initial_connection_window_size(Some(1 << 20))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    grpc.ready().await.map_err(|e| e.to_string())?;
    Ok(grpc)
}

fn node(idx: usize) -> Option<Node> {
    Some(Node {
        id: format!("sidecar~127.0.0.1~scale-sink-{idx}.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"),
        ..Default::default()
    })
}

/// A request stream and the (size on the wire, response) stream of one RPC.
pub type Stream<Req, Resp> = (UnboundedSender<Req>, Streaming<(usize, Resp)>);

/// The request of an RPC the sinks open.
pub trait Subscribe: Message + Send + Sized + 'static {
    /// The RPC's HTTP/2 path.
    const PATH: &'static str;
    /// Its name in errors.
    const WHAT: &'static str;
    /// The first request: ServiceEntries, as sink `idx`.
    fn subscribe(idx: usize) -> Self;
}

impl Subscribe for DiscoveryRequest {
    const PATH: &'static str = SOTW_PATH;
    const WHAT: &'static str = "SotW";
    fn subscribe(idx: usize) -> Self {
        DiscoveryRequest {
            node: node(idx),
            type_url: SE_TYPE.into(),
            ..Default::default()
        }
    }
}

impl Subscribe for DeltaDiscoveryRequest {
    const PATH: &'static str = DELTA_PATH;
    const WHAT: &'static str = "delta";
    fn subscribe(idx: usize) -> Self {
        DeltaDiscoveryRequest {
            node: node(idx),
            type_url: SE_TYPE.into(),
            ..Default::default()
        }
    }
}

/// Opens the RPC of `Req` as sink `idx`, subscribed to ServiceEntries; `Resp` is how much of
/// each response is decoded.
pub async fn subscribe<Req, Resp>(addr: SocketAddr, idx: usize) -> Result<Stream<Req, Resp>, String>
where
    Req: Subscribe,
    Resp: Message + Default + Send + 'static,
{
    let mut grpc = grpc_client(addr).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(Req::subscribe(idx)).map_err(|e| e.to_string())?;
    let stream = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)),
            PathAndQuery::from_static(Req::PATH),
            SizedCodec::<Req, Resp>::default(),
        )
        .await
        .map_err(|e| format!("open {} stream: {e}", Req::WHAT))?
        .into_inner();
    Ok((tx, stream))
}
