//! The push floor: a bare tonic ADS server (no index, no engine) replaying the adapter's exact
//! response bytes to the same sinks, configured as the adapter's server is.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use proto::istio::mcp::v1alpha1::Resource;
use proto::istio::networking::v1alpha3::ServiceEntry;
use proto::responses as wire;
use proto::server::ads::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use tonic::{Status, Streaming};

use crate::xds::subscribe;
use crate::{EPS, PUSH_TIMEOUT};

/// `DiscoveryResponse` keeping each resource's bytes (the floor replays them).
#[derive(Clone, PartialEq, prost::Message)]
struct RecordedSotw {
    #[prost(string, tag = "1")]
    version_info: String,
    #[prost(message, repeated, tag = "2")]
    resources: Vec<RecordedAny>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RecordedAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    value: Bytes,
}

/// Takes one full SotW response from `addr`, keeping the resources' bytes; checks the first
/// resource decodes to a ServiceEntry with [`EPS`] labelled endpoints. Returns the response as
/// the floor server sends it, its size on the wire, and a line describing what was checked.
pub async fn record(addr: SocketAddr, expect: usize) -> (wire::DiscoveryResponse, usize, String) {
    let (tx, mut stream) = subscribe::<DiscoveryRequest, RecordedSotw>(addr, 9999)
        .await
        .expect("recorder stream");
    let (size, r) = loop {
        let (size, r) = tokio::time::timeout(PUSH_TIMEOUT, stream.message())
            .await
            .expect("recorder: response in time")
            .expect("recorder: stream ok")
            .expect("recorder: stream open");
        if r.resources.len() == expect {
            break (size, r);
        }
    };
    drop(tx);
    assert!(
        r.resources
            .iter()
            .all(|a| a.type_url == proto::MCP_RESOURCE_TYPE_URL),
        "every resource is an MCP Resource"
    );
    let first = r.resources.first().expect("a resource");
    let res = Resource::decode(first.value.clone()).expect("MCP Resource");
    let body = res.body.expect("resource body");
    let se = ServiceEntry::decode(body.value.as_slice()).expect("ServiceEntry");
    let name = res.metadata.map(|m| m.name).unwrap_or_default();
    assert_eq!(se.endpoints.len(), EPS, "{name}: endpoints");
    let labels = se.endpoints[0].labels.len();
    assert_eq!(labels, 3, "{name}: endpoint labels");
    let check = format!(
        "checked {name}: hosts {:?}, {} port(s), {} endpoints with {labels} labels, locality {:?}",
        se.hosts,
        se.ports.len(),
        se.endpoints.len(),
        se.endpoints[0].locality
    );
    let response = wire::DiscoveryResponse {
        version_info: r.version_info,
        resources: r
            .resources
            .into_iter()
            .map(|a| wire::SharedAny {
                type_url: proto::MCP_RESOURCE_TYPE_URL,
                value: a.value,
            })
            .collect(),
        type_url: r.type_url,
        nonce: r.nonce,
    };
    assert_eq!(response.encoded_len(), size, "the floor replays our bytes");
    (response, size, check)
}

#[derive(Clone)]
struct FloorAds {
    sotw: Arc<wire::DiscoveryResponse>,
}

type SotwStream = tokio_stream::wrappers::ReceiverStream<Result<wire::DiscoveryResponse, Status>>;
type DeltaStream =
    tokio_stream::wrappers::ReceiverStream<Result<wire::DeltaDiscoveryResponse, Status>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for FloorAds {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        req: tonic::Request<Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<SotwStream>, Status> {
        let mut requests = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let response = self.sotw.clone();
        tokio::spawn(async move {
            // The full set answers the subscription; ACKs are read and dropped.
            while let Ok(Some(r)) = requests.message().await {
                if r.response_nonce.is_empty() && tx.send(Ok((*response).clone())).await.is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(SotwStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _req: tonic::Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaStream>, Status> {
        Err(Status::unimplemented("the floor serves SotW only"))
    }
}

/// Serves `response` as the adapter's server is configured (TCP_NODELAY, no encode limit).
pub async fn floor_server(
    response: Arc<wire::DiscoveryResponse>,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind floor server");
    let addr = listener.local_addr().expect("floor address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                AggregatedDiscoveryServiceServer::new(FloorAds { sotw: response })
                    .max_decoding_message_size(16 << 20)
                    .max_encoding_message_size(usize::MAX),
            )
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    );
    (addr, stop)
}
