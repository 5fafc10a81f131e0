//! Helpers of the I/O targets (files, Kubernetes objects, MCP/xDS requests, the state file):
//! the translation every target ends in, the snapshot the request targets serve, and the
//! splitting of one input into the several messages of a run.

use std::sync::{Arc, OnceLock};

use mcp_core::cache::{encode, Entry, Snapshot};
use mcp_core::model::Service;
use mcp_core::translate::template::Naming;
use mcp_core::translate::{translate, OnEmpty, TranslateConfig, Translated, DEFAULT_MAX_LABELS};
use mcp_core::vip::VipCidr;
use prost::Message;
use proto::istio::mcp::v1alpha1::Resource;

use crate::check_served;

/// The settings of an adapter with flags at their defaults (a virtual IP range on, as the
/// adapters' defaults have).
pub fn translate_config(registry: &str) -> TranslateConfig {
    TranslateConfig {
        namespace: "default".into(),
        host_suffix: String::new(),
        export_to: Vec::new(),
        registry: registry.into(),
        source: registry.into(),
        on_empty: OnEmpty::Keep,
        vip_cidr: VipCidr::range(240, 240, 0, 0, 16),
        max_labels: DEFAULT_MAX_LABELS,
        naming: Naming::default(),
    }
}

/// What the core makes of one service a registry gave: translated (checked by
/// [`check_served`]) and encoded as it would be served; `None` when the core rejects it.
pub fn serve(service: Service, cfg: &TranslateConfig) -> Option<(Translated, Entry)> {
    let t = translate(service, cfg).ok()?;
    check_served(&t);
    let entry = encode(&t);
    let resource = Resource::decode(entry.resource.clone()).expect("an encoded entry decodes");
    let md = resource.metadata.expect("an encoded entry has metadata");
    assert_eq!(md.name, &*entry.name, "the entry's name is its resource's");
    assert_eq!(
        md.version, &*entry.version,
        "the entry's version is its resource's"
    );
    Some((t, entry))
}

/// ServiceEntries the request targets serve: three sets, so that a run can publish changes
/// (one added, one changed, one removed between them).
const SETS: [&str; 3] = [
    "apiVersion: mcp-adapter/v1
kind: Inventory
namespace: shop
services:
  - name: cart
    ports: {http: 8080}
    endpoints: [10.0.0.1:8080, 10.0.0.2:8080]
  - name: db
    ports: {tcp-pg: 5432}
    endpoints: [10.0.1.1]
",
    "apiVersion: mcp-adapter/v1
kind: Inventory
namespace: shop
services:
  - name: cart
    ports: {http: 8080}
    endpoints: [10.0.0.1:8080, 10.0.0.3:8080]
  - name: db
    ports: {tcp-pg: 5432}
    endpoints: [10.0.1.1]
  - name: pay
    ports: {grpc: 9090}
    endpoints: [10.0.2.1]
",
    "apiVersion: mcp-adapter/v1
kind: Inventory
namespace: shop
services:
  - name: pay
    ports: {grpc: 9090}
    endpoints: [10.0.2.1, 10.0.2.2]
",
];

/// The snapshots the request targets publish (built once, through the file adapter's parser
/// and the core's translation, as an adapter would build them).
pub fn snapshots() -> &'static [Arc<Snapshot>] {
    static SNAPSHOTS: OnceLock<Vec<Arc<Snapshot>>> = OnceLock::new();
    SNAPSHOTS.get_or_init(|| {
        let cfg = translate_config("file");
        SETS.iter()
            .map(|text| {
                let services = adapter_file::parse("fuzz.yaml", text, adapter_file::Format::Yaml)
                    .expect("the fixed sets parse");
                let mut entries: Vec<Arc<Entry>> = services
                    .into_iter()
                    .filter_map(|s| serve(s, &cfg))
                    .map(|(_, e)| Arc::new(e))
                    .collect();
                entries.sort_by(|a, b| a.name.cmp(&b.name));
                Arc::new(Snapshot::new(entries))
            })
            .collect()
    })
}

/// Splits `data` at each occurrence of `sep` (the messages of one run).
pub fn split<'a>(data: &'a [u8], sep: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.windows(sep.len()).position(|w| w == sep) {
            Some(i) => {
                rest = Some(&r[i + sep.len()..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

// ---- The request targets (xds_requests, grpc_frames) ----

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3 as xds;
use mcp_server::engine::Engine;
use mcp_server::fuzzing::{Flavour, Sent};
use mcp_server::limits::{ServerLimits, StreamLimits};
use proto::google::rpc::Status as McpStatus;
use proto::istio::mcp::v1alpha1 as mcp;
use std::time::Duration;

/// Largest request the request targets' server takes (`--max-request-size`).
pub const MAX_REQUEST_SIZE: usize = 64 << 10;

/// Stream limits small enough that a run reaches every one of them.
pub const STREAM_LIMITS: StreamLimits = StreamLimits {
    max_types: 6,
    max_type_url_len: 128,
    max_names: 12,
    max_name_len: 64,
    max_node_id_len: 256,
    max_bytes: 1024,
};

/// A server's limits, fresh for one run (the names budget is the process's).
pub fn limits() -> Arc<ServerLimits> {
    Arc::new(ServerLimits::new(
        STREAM_LIMITS,
        16,
        16,
        16,
        MAX_REQUEST_SIZE,
        None,
        Duration::from_secs(10),
        Duration::from_secs(30),
    ))
}

/// The flavour a selector byte names.
pub fn flavour(selector: u8) -> Flavour {
    Flavour::ALL[usize::from(selector) % Flavour::ALL.len()]
}

/// Type keys a request a target makes up may name: every served one, and others.
pub const TYPE_KEYS: [&str; 6] = [
    "networking.istio.io/v1alpha3/ServiceEntry",
    "networking.istio.io/v1beta1/ServiceEntry",
    "networking.istio.io/v1/ServiceEntry",
    "istio/networking/v1alpha3/serviceentries",
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "",
];

/// A request the fuzzer would hardly spell itself: for `type_key`, answering `nonce`, maybe
/// rejecting it, naming `names` (SotW: the list; delta: subscribed), asking for incremental
/// responses where the RPC lets the sink choose.
pub struct Made<'a> {
    pub type_key: &'a str,
    pub nonce: &'a str,
    pub error: bool,
    pub names: Vec<String>,
    pub incremental: bool,
}

impl Made<'_> {
    /// The request's bytes in `flavour`'s message.
    pub fn encode(&self, flavour: Flavour) -> Vec<u8> {
        let (type_url, response_nonce) = (self.type_key.to_string(), self.nonce.to_string());
        let envoy_error = self.error.then(|| envoy_types::pb::google::rpc::Status {
            code: 3,
            message: "rejected by the fuzzer".into(),
            details: Vec::new(),
        });
        let mcp_error = self.error.then(|| McpStatus {
            code: 3,
            message: "rejected by the fuzzer".into(),
            details: Vec::new(),
        });
        let node = Some(Node {
            id: "sidecar~10.0.0.9~fuzz.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        });
        let sink = Some(mcp::SinkNode {
            id: "istiod-fuzz".into(),
            annotations: Default::default(),
        });
        // The legacy RPCs' three requests carry these three fields alike but share no trait:
        // one spelling, each message naming its own fields (the type's among them).
        macro_rules! legacy {
            ($msg:ident { $($field:ident $(: $value:expr)?),* $(,)? }) => {
                mcp::$msg {
                    sink_node: sink,
                    response_nonce,
                    error_detail: mcp_error,
                    $($field $(: $value)?,)*
                    ..Default::default()
                }
                .encode_to_vec()
            };
        }
        match flavour {
            Flavour::Xds => xds::DiscoveryRequest {
                node,
                type_url,
                response_nonce,
                resource_names: self.names.clone(),
                error_detail: envoy_error,
                ..Default::default()
            }
            .encode_to_vec(),
            Flavour::Delta => xds::DeltaDiscoveryRequest {
                node,
                type_url,
                response_nonce,
                resource_names_subscribe: self.names.clone(),
                error_detail: envoy_error,
                ..Default::default()
            }
            .encode_to_vec(),
            Flavour::Legacy => legacy!(RequestResources {
                collection: type_url,
                incremental: self.incremental,
            }),
            Flavour::MeshSotw => legacy!(MeshConfigRequest { type_url }),
            Flavour::MeshIncremental => legacy!(IncrementalMeshConfigRequest { type_url }),
        }
    }
}

/// What one response said, read back from its frame with the real schema.
struct Decoded {
    version: String,
    type_key: Option<String>,
    nonce: String,
    resources: Vec<mcp::Resource>,
    removed: Vec<String>,
}

fn resource(bytes: &[u8]) -> mcp::Resource {
    mcp::Resource::decode(bytes).expect("a served resource decodes")
}

fn bad<T>(e: prost::DecodeError) -> T {
    panic!("a response that does not decode: {e}")
}

fn decode_frame(flavour: Flavour, frame: &[u8]) -> Decoded {
    assert!(frame.len() >= 5, "a frame without its prefix");
    assert_eq!(frame[0], 0, "a response marked compressed");
    let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
    assert_eq!(len, frame.len() - 5, "the frame's length prefix is wrong");
    let body = &frame[5..];
    match flavour {
        Flavour::Xds => {
            let r = xds::DiscoveryResponse::decode(body).unwrap_or_else(bad);
            Decoded {
                version: r.version_info,
                type_key: Some(r.type_url),
                nonce: r.nonce,
                resources: r.resources.iter().map(|a| resource(&a.value)).collect(),
                removed: Vec::new(),
            }
        }
        Flavour::Delta => {
            let r = xds::DeltaDiscoveryResponse::decode(body).unwrap_or_else(bad);
            Decoded {
                version: r.system_version_info,
                type_key: Some(r.type_url),
                nonce: r.nonce,
                resources: r
                    .resources
                    .into_iter()
                    .map(|x| resource(&x.resource.map(|a| a.value).unwrap_or_default()))
                    .collect(),
                removed: r.removed_resources,
            }
        }
        Flavour::Legacy => {
            let r = mcp::Resources::decode(body).unwrap_or_else(bad);
            Decoded {
                version: r.system_version_info,
                type_key: Some(r.collection),
                nonce: r.nonce,
                resources: r.resources,
                removed: r.removed_resources,
            }
        }
        Flavour::MeshSotw => {
            let r = mcp::MeshConfigResponse::decode(body).unwrap_or_else(bad);
            Decoded {
                version: r.version_info,
                type_key: Some(r.type_url),
                nonce: r.nonce,
                resources: r.resources,
                removed: Vec::new(),
            }
        }
        Flavour::MeshIncremental => {
            let r = mcp::IncrementalMeshConfigResponse::decode(body).unwrap_or_else(bad);
            Decoded {
                version: r.system_version_info,
                type_key: None,
                nonce: r.nonce,
                resources: r.resources,
                removed: r.removed_resources,
            }
        }
    }
}

/// The invariants of one stream's responses and state, checked as a run goes.
pub struct StreamChecks {
    flavour: Flavour,
    last_nonce: u64,
    /// Every snapshot published in the run so far.
    pub published: Vec<Arc<Snapshot>>,
}

impl StreamChecks {
    /// Checks for a new stream.
    pub fn new(flavour: Flavour) -> Self {
        Self {
            flavour,
            last_nonce: 0,
            published: Vec::new(),
        }
    }

    /// A response the stream sent: only resources of a published snapshot, a fresh nonce,
    /// a version that is the snapshot's, and a frame that says the same.
    pub fn sent(&mut self, sent: &Sent) {
        let s = &sent.out;
        let nonce: u64 = s.nonce.parse().expect("nonces are counters");
        assert!(
            nonce > self.last_nonce,
            "nonce {nonce} reused or going back"
        );
        self.last_nonce = nonce;
        if !s.served {
            assert_eq!(s.version, "0", "an unserved type's answer has a version");
            assert!(
                s.resources.is_empty() && s.removed.is_empty(),
                "resources of an unserved type"
            );
        } else {
            let snapshot = self
                .published
                .iter()
                .find(|p| p.version == s.version)
                .expect("a served response carries a published snapshot's version");
            for e in &s.resources {
                let there = snapshot
                    .get(&e.name)
                    .expect("a resource not in the snapshot");
                assert!(
                    Arc::ptr_eq(there, e),
                    "a resource other than the snapshot's"
                );
            }
            for name in &s.removed {
                assert!(
                    snapshot.get(name).is_none(),
                    "{name} removed but still served"
                );
            }
            if !s.incremental {
                assert!(s.removed.is_empty(), "a full-state response removes names");
            }
            let mut names: Vec<&str> = s.resources.iter().map(|e| &*e.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), s.resources.len(), "a resource sent twice");
        }
        if sent.frame.is_empty() {
            return;
        }
        let d = decode_frame(self.flavour, &sent.frame);
        assert_eq!(d.version, s.version);
        assert_eq!(d.nonce, s.nonce);
        if let Some(t) = d.type_key {
            assert_eq!(t, s.type_key, "the type is not echoed as requested");
        }
        assert_eq!(d.removed, s.removed);
        let want: Vec<mcp::Resource> = s.resources.iter().map(|e| resource(&e.resource)).collect();
        assert!(
            d.resources == want,
            "the frame's resources are not the snapshot's"
        );
    }

    /// What the stream holds is within its limits.
    pub fn bounds(&self, engine: &Engine) {
        let l = STREAM_LIMITS;
        assert!(
            engine.bytes_held() <= l.max_bytes,
            "over max_bytes: {}",
            engine.bytes_held()
        );
        assert!(
            engine.names_held() <= l.max_names * l.max_types,
            "over the names bound: {}",
            engine.names_held()
        );
        assert!(engine.sync_status().len() <= l.max_types, "over max_types");
    }
}

/// A Tokio runtime for the targets that need one (time enabled, one thread), made once.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

/// Reads `n` bytes, fewer at the end.
pub fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = data.split_at(n.min(data.len()));
    *data = tail;
    head
}

/// Reads one byte, 0 at the end.
pub fn byte(data: &mut &[u8]) -> u8 {
    take(data, 1).first().copied().unwrap_or(0)
}
