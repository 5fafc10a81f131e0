//! One sink over any of the adapter's protocols, so that a behaviour every protocol shares is
//! written once and run per protocol: [`Protocol`] names the RPC (and the type URL or collection
//! it asks for), [`Sink`] sends its requests, and [`Update`] is any protocol's response, decoded.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use prost::Message;
use proto::istio::mcp::v1alpha1::{
    IncrementalMeshConfigRequest, IncrementalMeshConfigResponse, MeshConfigRequest,
    MeshConfigResponse, RequestResources, Resources, SinkNode,
};

use super::{
    decode_any, decode_resource, istiod_node, legacy_req, Adapter, Decoded, Raw, SE_COLLECTION,
};

/// The message of every NACK the sinks send.
pub const REJECTED: &str = "rejected by test";

/// A way to subscribe to ServiceEntries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// xDS SotW (`AggregatedDiscoveryService/StreamAggregatedResources`) for a type URL.
    Sotw(&'static str),
    /// Delta xDS (`AggregatedDiscoveryService/DeltaAggregatedResources`) for a type URL.
    Delta(&'static str),
    /// Legacy MCP `ResourceSource` (Pilot 1.1-1.7), incremental if the sink asks.
    Legacy { incremental: bool },
    /// `AggregatedMeshConfigService/StreamAggregatedResources`.
    MeshSotw,
    /// `AggregatedMeshConfigService/IncrementalAggregatedResources`.
    MeshIncremental,
}

impl Protocol {
    /// The type URL or collection ServiceEntries are asked for under.
    pub fn topic(self) -> &'static str {
        match self {
            Protocol::Sotw(t) | Protocol::Delta(t) => t,
            _ => SE_COLLECTION,
        }
    }

    /// Whether responses after the first carry only what changed (and what was removed).
    pub fn incremental(self) -> bool {
        match self {
            Protocol::Delta(_) | Protocol::MeshIncremental => true,
            Protocol::Legacy { incremental } => incremental,
            Protocol::Sotw(_) | Protocol::MeshSotw => false,
        }
    }

    /// A type the adapter does not serve, for protocols whose responses say which type they
    /// answer (the incremental mesh rpc's do not).
    pub fn unserved(self) -> Option<&'static str> {
        match self {
            Protocol::Sotw(_) | Protocol::Delta(_) => Some("networking.istio.io/v1/VirtualService"),
            Protocol::Legacy { .. } | Protocol::MeshSotw => {
                Some("istio/networking/v1alpha3/virtualservices")
            }
            Protocol::MeshIncremental => None,
        }
    }

    /// The `protocol` label of the adapter's metrics.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Sotw(_) => "xds",
            Protocol::Delta(_) => "delta",
            Protocol::Legacy { .. } => "mcp",
            Protocol::MeshSotw => "mcp-aggregated",
            Protocol::MeshIncremental => "mcp-aggregated-incremental",
        }
    }
}

/// A response of any protocol, decoded.
#[derive(Clone, Debug)]
pub struct Update {
    /// The type URL or collection it answers (the incremental mesh rpc does not say).
    pub topic: Option<String>,
    /// `version_info` or `system_version_info`.
    pub version: String,
    pub nonce: String,
    /// The response's own `incremental` flag, where the protocol has one (legacy MCP).
    pub incremental: Option<bool>,
    /// The resources sent, by name.
    pub resources: BTreeMap<String, Decoded>,
    /// The resources' bytes in the order sent (xDS: each `Any`'s value as received).
    pub raw: Vec<Vec<u8>>,
    /// Names removed (incremental responses).
    pub removed: Vec<String>,
}

impl Update {
    /// The names of the resources sent, sorted.
    pub fn names(&self) -> Vec<String> {
        self.resources.keys().cloned().collect()
    }

    fn new(
        topic: Option<String>,
        version: String,
        nonce: String,
        decoded: Vec<(Decoded, Vec<u8>)>,
        removed: Vec<String>,
    ) -> Update {
        let raw = decoded.iter().map(|(_, b)| b.clone()).collect();
        Update {
            topic,
            version,
            nonce,
            incremental: None,
            resources: decoded
                .into_iter()
                .map(|(d, _)| (d.name.clone(), d))
                .collect(),
            raw,
            removed,
        }
    }

    /// What a sink holds after this response, given what it held before.
    pub fn apply(&self, held: &mut BTreeMap<String, Decoded>, p: Protocol) {
        if !p.incremental() {
            held.clear();
        }
        for n in &self.removed {
            held.remove(n);
        }
        held.extend(self.resources.clone());
    }
}

/// One request, in any protocol's terms.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ask<'a> {
    /// Type URL or collection.
    pub topic: &'a str,
    /// The nonce of the response this answers ("" on a first request).
    pub nonce: &'a str,
    /// The version the sink holds, where the protocol carries one.
    pub version: &'a str,
    /// Rejects the response (a NACK).
    pub nack: bool,
    /// Names the sink (istiod's node).
    pub node: bool,
}

enum Stream {
    Sotw(Raw<DiscoveryRequest, DiscoveryResponse>),
    Delta(Raw<DeltaDiscoveryRequest, DeltaDiscoveryResponse>),
    Legacy(Raw<RequestResources, Resources>),
    MeshSotw(Raw<MeshConfigRequest, MeshConfigResponse>),
    MeshIncremental(Raw<IncrementalMeshConfigRequest, IncrementalMeshConfigResponse>),
}

/// A sink on one stream of `protocol`, driven by hand.
pub struct Sink {
    pub protocol: Protocol,
    stream: Stream,
}

impl Adapter {
    /// Opens a stream of `protocol`; nothing is requested yet.
    pub async fn sink(&self, protocol: Protocol) -> Sink {
        let stream = match protocol {
            Protocol::Sotw(_) => Stream::Sotw(self.xds().await),
            Protocol::Delta(_) => Stream::Delta(self.delta().await),
            Protocol::Legacy { .. } => Stream::Legacy(self.legacy().await),
            Protocol::MeshSotw => Stream::MeshSotw(self.mesh_sotw().await),
            Protocol::MeshIncremental => Stream::MeshIncremental(self.mesh_incremental().await),
        };
        Sink { protocol, stream }
    }
}

fn envoy_status() -> envoy_types::pb::google::rpc::Status {
    envoy_types::pb::google::rpc::Status {
        code: 3,
        message: REJECTED.into(),
        details: vec![],
    }
}

fn mcp_status() -> proto::google::rpc::Status {
    proto::google::rpc::Status {
        code: 3,
        message: REJECTED.into(),
        details: vec![],
    }
}

fn sink_node() -> Option<SinkNode> {
    Some(SinkNode {
        id: istiod_node().id,
        annotations: Default::default(),
    })
}

impl Sink {
    /// Sends `ask` as this protocol's request.
    pub fn send(&self, ask: Ask<'_>) {
        let Ask {
            topic,
            nonce,
            version,
            nack,
            node,
        } = ask;
        match &self.stream {
            Stream::Sotw(s) => s.send(DiscoveryRequest {
                node: node.then(istiod_node),
                type_url: topic.into(),
                response_nonce: nonce.into(),
                version_info: version.into(),
                error_detail: nack.then(envoy_status),
                ..Default::default()
            }),
            Stream::Delta(s) => s.send(DeltaDiscoveryRequest {
                node: node.then(istiod_node),
                type_url: topic.into(),
                response_nonce: nonce.into(),
                error_detail: nack.then(envoy_status),
                ..Default::default()
            }),
            Stream::Legacy(s) => {
                let mut req = legacy_req(topic, nonce, self.protocol.incremental());
                if node {
                    req.sink_node = sink_node();
                }
                req.error_detail = nack.then(mcp_status);
                s.send(req);
            }
            Stream::MeshSotw(s) => s.send(MeshConfigRequest {
                sink_node: if node { sink_node() } else { None },
                type_url: topic.into(),
                response_nonce: nonce.into(),
                version_info: version.into(),
                error_detail: nack.then(mcp_status),
            }),
            Stream::MeshIncremental(s) => s.send(IncrementalMeshConfigRequest {
                sink_node: if node { sink_node() } else { None },
                type_url: topic.into(),
                response_nonce: nonce.into(),
                error_detail: nack.then(mcp_status),
                ..Default::default()
            }),
        }
    }

    /// The first request: ServiceEntries (delta xDS names istiod's node, as istiod does).
    pub fn subscribe(&self) {
        self.send(Ask {
            topic: self.protocol.topic(),
            node: matches!(self.protocol, Protocol::Delta(_)),
            ..Ask::default()
        });
    }

    /// The first request on a new stream as istiod reconnects: its node, the version it holds
    /// from `before`, and a made-up nonce.
    pub fn resubscribe(&self, before: &Update, nonce: &str) {
        self.send(Ask {
            topic: self.protocol.topic(),
            nonce,
            version: &before.version,
            node: true,
            ..Ask::default()
        });
    }

    fn topic_of<'a>(&self, u: &'a Update) -> &'a str {
        u.topic.as_deref().unwrap_or(self.protocol.topic())
    }

    /// ACKs `u` (for an older response: a stale request with its nonce and version).
    pub fn ack(&self, u: &Update) {
        self.send(Ask {
            topic: self.topic_of(u),
            nonce: &u.nonce,
            version: &u.version,
            ..Ask::default()
        });
    }

    /// NACKs `u`, saying the sink still holds `holds` (the version it ACKed last).
    pub fn nack(&self, u: &Update, holds: &str) {
        self.send(Ask {
            topic: self.topic_of(u),
            nonce: &u.nonce,
            version: holds,
            nack: true,
            ..Ask::default()
        });
    }

    /// The next response; fails the test after [`super::STEP`].
    pub async fn recv(&mut self) -> Update {
        match &mut self.stream {
            Stream::Sotw(s) => {
                let r = s.recv().await;
                let decoded = r
                    .resources
                    .iter()
                    .map(|any| (decode_any(any), any.value.clone()))
                    .collect();
                Update::new(Some(r.type_url), r.version_info, r.nonce, decoded, vec![])
            }
            Stream::Delta(s) => {
                let r = s.recv().await;
                let decoded = r
                    .resources
                    .iter()
                    .map(|dr| {
                        let any = dr.resource.as_ref().expect("resource set");
                        let d = decode_any(any);
                        assert_eq!(d.name, dr.name, "envelope name = metadata name");
                        assert_eq!(d.version, dr.version, "envelope version = metadata version");
                        (d, any.value.clone())
                    })
                    .collect();
                Update::new(
                    Some(r.type_url),
                    r.system_version_info,
                    r.nonce,
                    decoded,
                    r.removed_resources,
                )
            }
            Stream::Legacy(s) => {
                let r = s.recv().await;
                let mut u = Update::new(
                    Some(r.collection),
                    r.system_version_info,
                    r.nonce,
                    decode_all(&r.resources),
                    r.removed_resources,
                );
                u.incremental = Some(r.incremental);
                u
            }
            Stream::MeshSotw(s) => {
                let r = s.recv().await;
                let decoded = decode_all(&r.resources);
                Update::new(Some(r.type_url), r.version_info, r.nonce, decoded, vec![])
            }
            Stream::MeshIncremental(s) => {
                let r = s.recv().await;
                let decoded = decode_all(&r.resources);
                Update::new(
                    None,
                    r.system_version_info,
                    r.nonce,
                    decoded,
                    r.removed_resources,
                )
            }
        }
    }

    /// Asserts nothing arrives for `d`.
    pub async fn silent_for(&mut self, d: Duration, why: &str) {
        match &mut self.stream {
            Stream::Sotw(s) => s.silent_for(d, why).await,
            Stream::Delta(s) => s.silent_for(d, why).await,
            Stream::Legacy(s) => s.silent_for(d, why).await,
            Stream::MeshSotw(s) => s.silent_for(d, why).await,
            Stream::MeshIncremental(s) => s.silent_for(d, why).await,
        }
    }

    /// Asserts nothing arrives for [`super::QUIET`].
    pub async fn silent(&mut self, why: &str) {
        self.silent_for(super::QUIET, why).await;
    }
}

/// MCP resources decoded, with their encoding.
fn decode_all(rs: &[proto::istio::mcp::v1alpha1::Resource]) -> Vec<(Decoded, Vec<u8>)> {
    rs.iter()
        .map(|r| (decode_resource(r), r.encode_to_vec()))
        .collect()
}
