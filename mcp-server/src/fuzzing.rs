//! Entry points for the fuzz targets (`fuzz/`, a crate outside the workspace): one stream's
//! request path as the server runs it, reachable from outside this crate. Hidden from the docs
//! and not an API; it exists so that what is fuzzed is exactly what a sink reaches: the body
//! metering and tonic's framing (`grpc::request_stream`), each protocol's decoding and response
//! layout (`protocol`), and the engine within its limits (`apply_request`). Only the transport
//! (HTTP/2, the response body's back-pressure) and metrics are left out.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use mcp_core::cache::Snapshot;
use prost::Message;
use tonic::Status;

use crate::engine::{Ack, Engine, Incremental, Outgoing};
use crate::grpc::request_stream;
use crate::limits::{NamesCharge, Refused, ServerLimits};
use crate::protocol::{Delta, Legacy, MeshIncremental, MeshSotw, Protocol, Xds};
use crate::{apply_request, Applied};

/// The RPCs the server serves, one per request message type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// SotW xDS (`DiscoveryRequest`).
    Xds,
    /// Delta xDS (`DeltaDiscoveryRequest`).
    Delta,
    /// Legacy MCP (`RequestResources`, Pilot 1.1-1.7).
    Legacy,
    /// Legacy aggregated SotW (`MeshConfigRequest`).
    MeshSotw,
    /// Legacy aggregated incremental (`IncrementalMeshConfigRequest`).
    MeshIncremental,
}

impl Flavour {
    /// Every flavour.
    pub const ALL: [Flavour; 5] = [
        Flavour::Xds,
        Flavour::Delta,
        Flavour::Legacy,
        Flavour::MeshSotw,
        Flavour::MeshIncremental,
    ];

    /// Whether `type_key` carries ServiceEntries on this RPC.
    pub fn served(self, type_key: &str) -> bool {
        self.incremental_and_served().1(type_key)
    }

    /// The gRPC method's path.
    pub fn path(self) -> &'static str {
        match self {
            Flavour::Xds => Xds::PATH,
            Flavour::Delta => Delta::PATH,
            Flavour::Legacy => Legacy::PATH,
            Flavour::MeshSotw => MeshSotw::PATH,
            Flavour::MeshIncremental => MeshIncremental::PATH,
        }
    }

    fn incremental_and_served(self) -> (Incremental, fn(&str) -> bool) {
        match self {
            Flavour::Xds => (Xds::INCREMENTAL, Xds::served),
            Flavour::Delta => (Delta::INCREMENTAL, Delta::served),
            Flavour::Legacy => (Legacy::INCREMENTAL, Legacy::served),
            Flavour::MeshSotw => (MeshSotw::INCREMENTAL, MeshSotw::served),
            Flavour::MeshIncremental => (MeshIncremental::INCREMENTAL, MeshIncremental::served),
        }
    }
}

/// A response the stream sends: what the engine decided, and the gRPC frame written for it.
#[derive(Debug)]
pub struct Sent {
    /// The engine's response, as `drive` hands it to the protocol's encoder.
    pub out: Outgoing,
    /// The whole frame, 5-byte prefix included; empty if gRPC cannot frame it.
    pub frame: Vec<u8>,
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub enum Ended {
    /// A message that is not the RPC's request.
    #[error("request does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A request over a limit.
    #[error("refused: {0}")]
    Refused(#[from] Refused),
    /// tonic or the metered body ended the stream (framing, sizes).
    #[error("stream ended: {0}")]
    Status(Box<Status>),
}

/// One stream's state: its engine and its share of the names budget.
#[derive(Debug)]
pub struct Stream {
    flavour: Flavour,
    engine: Engine,
    names: NamesCharge,
    limits: Arc<ServerLimits>,
}

impl Stream {
    /// A new stream of `flavour` under `limits`, as `drive` starts one.
    pub fn new(flavour: Flavour, limits: Arc<ServerLimits>) -> Self {
        let (incremental, served) = flavour.incremental_and_served();
        Self {
            flavour,
            engine: Engine::with_limits(incremental, served, limits.stream),
            names: NamesCharge::new(limits.names.clone()),
            limits,
        }
    }

    /// The engine, for its bounds.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// One request message's bytes (without the gRPC prefix), decoded as tonic's prost codec
    /// does, then applied.
    pub fn request(
        &mut self,
        msg: &[u8],
        snapshot: Option<&Arc<Snapshot>>,
    ) -> Result<(Ack, Option<Sent>), Ended> {
        match self.flavour {
            Flavour::Xds => self.decoded::<Xds>(msg, snapshot),
            Flavour::Delta => self.decoded::<Delta>(msg, snapshot),
            Flavour::Legacy => self.decoded::<Legacy>(msg, snapshot),
            Flavour::MeshSotw => self.decoded::<MeshSotw>(msg, snapshot),
            Flavour::MeshIncremental => self.decoded::<MeshIncremental>(msg, snapshot),
        }
    }

    /// A new snapshot published: what the stream sends.
    pub fn snapshot(&mut self, snapshot: &Arc<Snapshot>) -> Vec<Sent> {
        let out = self.engine.on_snapshot(snapshot);
        // As `drive`: sending only gives names back.
        let _ = self.names.set(self.engine.names_held());
        let lay_out = match self.flavour {
            Flavour::Xds => sent::<Xds>,
            Flavour::Delta => sent::<Delta>,
            Flavour::Legacy => sent::<Legacy>,
            Flavour::MeshSotw => sent::<MeshSotw>,
            Flavour::MeshIncremental => sent::<MeshIncremental>,
        };
        out.into_iter().map(lay_out).collect()
    }

    /// A request body arriving as `frames` (HTTP/2 DATA frames): metered, split into messages
    /// and decoded as the server does, each message applied; `each` sees every result. Needs a
    /// Tokio runtime with time enabled (the metered body's receive deadline).
    pub async fn frames(
        &mut self,
        frames: Vec<Bytes>,
        snapshot: Option<&Arc<Snapshot>>,
        each: &mut dyn FnMut(&Engine, Ack, Option<Sent>),
    ) -> Result<(), Ended> {
        match self.flavour {
            Flavour::Xds => self.framed::<Xds>(frames, snapshot, each).await,
            Flavour::Delta => self.framed::<Delta>(frames, snapshot, each).await,
            Flavour::Legacy => self.framed::<Legacy>(frames, snapshot, each).await,
            Flavour::MeshSotw => self.framed::<MeshSotw>(frames, snapshot, each).await,
            Flavour::MeshIncremental => {
                self.framed::<MeshIncremental>(frames, snapshot, each).await
            }
        }
    }

    fn decoded<P: Protocol>(
        &mut self,
        msg: &[u8],
        snapshot: Option<&Arc<Snapshot>>,
    ) -> Result<(Ack, Option<Sent>), Ended> {
        let req = P::Req::decode(msg)?;
        self.apply::<P>(req, snapshot)
    }

    fn apply<P: Protocol>(
        &mut self,
        req: P::Req,
        snapshot: Option<&Arc<Snapshot>>,
    ) -> Result<(Ack, Option<Sent>), Ended> {
        // `drive` reads the node id of every request until one names it.
        let _ = P::node(&req);
        let Applied { ack, out, .. } =
            apply_request::<P>(&mut self.engine, &mut self.names, req, snapshot)?;
        Ok((ack, out.map(sent::<P>)))
    }

    async fn framed<P: Protocol>(
        &mut self,
        frames: Vec<Bytes>,
        snapshot: Option<&Arc<Snapshot>>,
        each: &mut dyn FnMut(&Engine, Ack, Option<Sent>),
    ) -> Result<(), Ended> {
        let body = InMemory(frames.into());
        let (mut requests, _receiving) =
            request_stream::<P, _>(body, &self.limits, Box::new(|_| {}), Arc::default());
        loop {
            match requests.message().await {
                Ok(Some(msg)) => {
                    let (ack, sent) = self.apply::<P>(msg, snapshot)?;
                    each(&self.engine, ack, sent);
                }
                Ok(None) => return Ok(()),
                Err(status) => return Err(Ended::Status(Box::new(status))),
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // As a stream that ends: its names go back to the shared budget.
        let _ = self.names.set(0);
    }
}

fn sent<P: Protocol>(out: Outgoing) -> Sent {
    // The encoder takes the response by value; the copy shares the resources (`Arc`s).
    let mut frame = BytesMut::new();
    if let Ok(chunks) = P::response(out.clone()).chunks() {
        for c in chunks {
            frame.extend_from_slice(&c);
        }
    }
    Sent {
        out,
        frame: frame.to_vec(),
    }
}

/// A request body already received: its DATA frames in order.
struct InMemory(VecDeque<Bytes>);

impl Body for InMemory {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}
