//! The three MCP gRPC services, served without tonic's generated servers.
//!
//! Generated servers encode each response into one buffer per stream; these hand the transport
//! a [`ResponseBody`] instead (see [`super::frames`]). Requests are still decoded by tonic's
//! [`Streaming`], so limits and error statuses are tonic's.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::marker::PhantomData;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tokio::sync::mpsc;
use tonic::body::Body;
use tonic::codec::Streaming;
use tonic::server::NamedService;
use tonic::Status;
use tonic_prost::ProstCodec;

use super::conn::{ConnInfo, Peers};
use super::limits::{Refused, ServerLimits, StreamSlot};
use super::protocol::{Delta, Legacy, MeshIncremental, MeshSotw, Protocol, Xds};
use super::request_body::{MeteredBody, OnRefused, Receiving};
use super::response_body::ResponseBody;
use super::{drive, StreamContext};

/// A gRPC service name and the methods it routes.
pub trait Methods: Send + Sync + 'static {
    /// Fully qualified service name.
    const NAME: &'static str;
    /// Starts the stream for `path`, or `None` if the service has no such method.
    fn route(path: &str, ctx: &StreamContext, req: Request<Body>) -> Option<Response<Body>>;
}

/// `envoy.service.discovery.v3.AggregatedDiscoveryService` (istiod 1.8+).
#[derive(Debug)]
pub struct Ads;

impl Methods for Ads {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
    fn route(path: &str, ctx: &StreamContext, req: Request<Body>) -> Option<Response<Body>> {
        match path {
            Xds::PATH => Some(start::<Xds>(ctx, req)),
            Delta::PATH => Some(start::<Delta>(ctx, req)),
            _ => None,
        }
    }
}

/// `istio.mcp.v1alpha1.ResourceSource` (Pilot 1.1-1.7).
#[derive(Debug)]
pub struct ResourceSource;

impl Methods for ResourceSource {
    const NAME: &'static str = "istio.mcp.v1alpha1.ResourceSource";
    fn route(path: &str, ctx: &StreamContext, req: Request<Body>) -> Option<Response<Body>> {
        (path == Legacy::PATH).then(|| start::<Legacy>(ctx, req))
    }
}

/// `istio.mcp.v1alpha1.AggregatedMeshConfigService` (Pilot 1.1 legacy mode).
#[derive(Debug)]
pub struct MeshConfig;

impl Methods for MeshConfig {
    const NAME: &'static str = "istio.mcp.v1alpha1.AggregatedMeshConfigService";
    fn route(path: &str, ctx: &StreamContext, req: Request<Body>) -> Option<Response<Body>> {
        match path {
            MeshSotw::PATH => Some(start::<MeshSotw>(ctx, req)),
            MeshIncremental::PATH => Some(start::<MeshIncremental>(ctx, req)),
            _ => None,
        }
    }
}

/// One service, as the gRPC router wants it.
#[derive(Debug)]
pub struct Service<M> {
    ctx: StreamContext,
    _methods: PhantomData<fn() -> M>,
}

impl<M> Service<M> {
    /// The service over the shared stream context.
    pub fn new(ctx: StreamContext) -> Self {
        Self {
            ctx,
            _methods: PhantomData,
        }
    }
}

impl<M> Clone for Service<M> {
    fn clone(&self) -> Self {
        Self::new(self.ctx.clone())
    }
}

impl<M: Methods> NamedService for Service<M> {
    const NAME: &'static str = M::NAME;
}

impl<M: Methods> tower_service::Service<Request<Body>> for Service<M> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let path = req.uri().path().to_owned();
        let resp = M::route(&path, &self.ctx, req).unwrap_or_else(|| {
            Status::unimplemented(format!("no method {path}")).into_http::<Body>()
        });
        ready(Ok(resp))
    }
}

/// A stream's requests as its task reads them: the body metered (`request_body`), then split
/// into gRPC messages and decoded by tonic. The fuzz targets read their frames through this too.
pub(crate) fn request_stream<P: Protocol, B>(
    body: B,
    limits: &ServerLimits,
    on_refused: OnRefused,
    large_waiting: Arc<AtomicUsize>,
) -> (Streaming<P::Req>, Receiving)
where
    B: http_body::Body<Data = bytes::Bytes, Error = Status> + Unpin + Send + 'static,
{
    let (body, receiving) = MeteredBody::new(
        body,
        limits.max_request_size,
        limits.large_requests.clone(),
        limits.bounds.request_receive_timeout,
        on_refused,
        large_waiting,
    );
    let requests = Streaming::<P::Req>::new_request(
        tonic::codec::Codec::decoder(&mut ProstCodec::<P::Req, P::Req>::default()),
        body,
        None,
        Some(limits.max_request_size),
    );
    (requests, receiving)
}

/// Starts one stream: its task decodes requests and feeds the response body. A stream over
/// `--max-streams`, or on a connection over `--max-connections` (or per peer), is refused at once.
fn start<P: Protocol>(ctx: &StreamContext, req: Request<Body>) -> Response<Body> {
    let conn = ConnInfo::of(&req);
    let peer = ConnInfo::peer(conn);
    let accepted = conn.map(|c| c.accepted);
    let limits = &ctx.limits;
    // One of `--max-streams`, and of its address's share (`--max-streams-per-peer`): one
    // address holding idle streams on many connections never locks the others out.
    let slot = match conn.and_then(|c| c.over_limit.clone()) {
        Some(refused) => Err(refused),
        None => {
            let ip = conn.and_then(|c| c.remote).map(|a| a.ip());
            let peer_share = match ip {
                Some(ip) => {
                    Peers::take_stream(&limits.peers, ip, limits.bounds.max_streams_per_peer)
                        .map(Some)
                        .ok_or(Refused::StreamsPerPeer {
                            limit: limits.bounds.max_streams_per_peer,
                        })
                }
                None => Ok(None),
            };
            peer_share.and_then(|peer| {
                Arc::clone(&limits.streams)
                    .try_acquire_owned()
                    .map(|global| StreamSlot {
                        _global: global,
                        _peer: peer,
                    })
                    .map_err(|_| Refused::Streams {
                        limit: limits.max_streams,
                    })
            })
        }
    };
    let slot = match slot {
        Ok(slot) => slot,
        Err(refused) => {
            limits.refused(&ctx.metrics, &refused, P::PROTOCOL, &peer);
            return refused.status().into_http::<Body>();
        }
    };
    let large_waiting = conn
        .map(|c| Arc::clone(&c.large_waiting))
        .unwrap_or_default();
    let on_refused = {
        let (limits, metrics, peer) = (limits.clone(), ctx.metrics.clone(), peer.clone());
        Box::new(move |r: &Refused| limits.refused(&metrics, r, P::PROTOCOL, &peer))
    };
    let (requests, receiving) =
        request_stream::<P, _>(req.into_body(), limits, on_refused, large_waiting);
    // One slot: the engine keeps one response per type in flight, so a sink that stopped
    // reading holds the response being written and at most this one more.
    let (tx, rx) = mpsc::channel(1);
    let body = ResponseBody::new(rx);
    let emptier = body.emptier();
    tokio::spawn(drive::<P>(
        requests,
        (tx, emptier),
        ctx.clone(),
        peer,
        accepted,
        slot,
        receiving,
    ));
    let mut resp = Response::new(Body::new(body));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    resp
}
