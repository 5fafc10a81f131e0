//! What Istio ambient's node proxy (ztunnel) gets from istiod: its ambient index, the services
//! and workloads of `istio.workload.Address`, asked for on istiod's plaintext gRPC port exactly
//! as ztunnel asks (no ztunnel runs).
//!
//! The request, as ztunnel sends it (Istio module `istio.io/istio@v0.0.0-20260423205519-b01690e6db7d`,
//! the one `tests/go-peers/build.sh` builds pilot-discovery from):
//! - RPC `envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`
//!   (ztunnel speaks delta xDS only);
//! - `type_url` `type.googleapis.com/istio.workload.Address` (`pkg/model/xds.go:38`,
//!   `AddressType`);
//! - a wildcard subscription: empty `resource_names_subscribe` and `_unsubscribe`, ztunnel's
//!   default (`pilot/pkg/xds/workload_test.go:145-151`, `TestWorkloadReconnect/wildcard`: the
//!   whole index comes back in the first response; on-demand mode subscribes to `*` and
//!   unsubscribes it in the same request, `workload_test.go:109-112`);
//! - node id `ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local` (the `ztunnel` node type:
//!   `pilot/pkg/xds/delta_test.go:464`; istiod refuses it unless `PILOT_ENABLE_AMBIENT=true`,
//!   `pilot/pkg/xds/ads.go:257-258`), and node metadata `NAME`, `NAMESPACE`, `INSTANCE_IPS`,
//!   `NODE_NAME` (ztunnel's `src/xds/client.rs`, `Config::node`) plus `CLUSTER_ID` (ztunnel's
//!   chart sets `ISTIO_META_CLUSTER_ID=Kubernetes`,
//!   `manifests/charts/ztunnel/templates/daemonset.yaml:134`); the keys are istiod's
//!   `NodeMetadata` JSON names (`pkg/model/proxy.go:162-247`).
//!
//! Each response is ACKed (its nonce sent back, `pilot/pkg/xds/deltaadstest.go:216-228`), as
//! ztunnel does; one that does not decode is NACKed.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{value, Struct, Value};
use envoy_types::pb::google::rpc::Status;
use prost::Message;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::background::Background;

/// The type ztunnel watches for its services and workloads.
pub const ADDRESS_TYPE: &str = "type.googleapis.com/istio.workload.Address";

/// The node's namespace (ztunnel runs in `istio-system`).
const NAMESPACE: &str = "istio-system";
/// The node's pod name and IP.
const POD: &str = "ztunnel-test";
const IP: &str = "127.0.0.1";
/// The Kubernetes node it would run on.
const NODE_NAME: &str = "node-1";
/// The cluster, as ztunnel's chart names it by default (istiod's own cluster id).
const CLUSTER_ID: &str = "Kubernetes";

/// The hand-written subset of `istio.workload` that the view decodes (`pkg/workloadapi/workload.proto`
/// of the pinned Istio module; field numbers from there, other fields skipped).
mod wire {
    use std::collections::BTreeMap;

    /// `Address` (workload.proto:45-53): `oneof type { Workload workload = 1; Service service = 2; }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Address {
        #[prost(oneof = "AddressType", tags = "1, 2")]
        pub r#type: Option<AddressType>,
    }

    /// `Address.type`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum AddressType {
        #[prost(message, tag = "1")]
        Workload(Workload),
        #[prost(message, tag = "2")]
        Service(Service),
    }

    /// `Service` (workload.proto:58-101).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Service {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(string, tag = "3")]
        pub hostname: String,
        #[prost(message, repeated, tag = "4")]
        pub addresses: Vec<NetworkAddress>,
        #[prost(message, repeated, tag = "5")]
        pub ports: Vec<Port>,
    }

    /// `Workload` (workload.proto:178-290).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Workload {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        /// IPv4 or IPv6, 4 or 16 bytes.
        #[prost(bytes = "vec", repeated, tag = "3")]
        pub addresses: Vec<Vec<u8>>,
        /// `WorkloadStatus`: `HEALTHY = 0`, `UNHEALTHY = 1` (workload.proto:298-303).
        #[prost(int32, tag = "17")]
        pub status: i32,
        #[prost(string, tag = "20")]
        pub uid: String,
        /// The services it is an endpoint of: `namespace/hostname` to its ports.
        #[prost(btree_map = "string, message", tag = "22")]
        pub services: BTreeMap<String, PortList>,
    }

    /// `NetworkAddress` (workload.proto:385-393).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NetworkAddress {
        #[prost(string, tag = "1")]
        pub network: String,
        #[prost(bytes = "vec", tag = "2")]
        pub address: Vec<u8>,
    }

    /// `PortList` (workload.proto:313-315).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PortList {
        #[prost(message, repeated, tag = "1")]
        pub ports: Vec<Port>,
    }

    /// `Port` (workload.proto:317-324).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Port {
        #[prost(uint32, tag = "1")]
        pub service_port: u32,
        #[prost(uint32, tag = "2")]
        pub target_port: u32,
    }
}

/// A port of a service (or of a workload for one of its services).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortView {
    /// The port clients use.
    pub service_port: u32,
    /// The port the workload listens on (0: the same).
    pub target_port: u32,
}

/// A service of the ambient index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceView {
    /// Its name (the Service's or ServiceEntry's).
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its host name.
    pub hostname: String,
    /// Its virtual IPs, as text (empty when it has none).
    pub addresses: Vec<String>,
    /// Its ports.
    pub ports: Vec<PortView>,
}

/// A workload of the ambient index (a pod, a WorkloadEntry, a ServiceEntry endpoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadView {
    /// Its globally unique id (e.g. `Kubernetes/networking.istio.io/ServiceEntry/ns/name/10.0.0.1`).
    pub uid: String,
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its IPs, as text.
    pub addresses: Vec<String>,
    /// Whether istiod marks it healthy.
    pub healthy: bool,
    /// The services it is an endpoint of, by [`ZtunnelView::services`] key (`namespace/hostname`),
    /// with its ports for each.
    pub services: BTreeMap<String, Vec<PortView>>,
}

/// What ztunnel holds: services and workloads by resource name (services `namespace/hostname`,
/// workloads their uid).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZtunnelView {
    /// Services by `namespace/hostname`.
    pub services: BTreeMap<String, ServiceView>,
    /// Workloads by uid.
    pub workloads: BTreeMap<String, WorkloadView>,
}

impl ZtunnelView {
    /// The workloads that are endpoints of service `key` (`namespace/hostname`).
    pub fn workloads_of<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a WorkloadView> {
        self.workloads
            .values()
            .filter(move |w| w.services.contains_key(key))
    }

    /// The addresses of the workloads of service `key` (`namespace/hostname`), sorted.
    pub fn endpoints_of(&self, key: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .workloads_of(key)
            .flat_map(|w| w.addresses.iter().cloned())
            .collect();
        v.sort();
        v
    }

    /// Whether any service or workload refers to host name `host` (as a service, or as a
    /// service a workload belongs to).
    pub fn mentions_host(&self, host: &str) -> bool {
        let suffix = format!("/{host}");
        self.services.values().any(|s| s.hostname == host)
            || self.services.keys().any(|k| k.ends_with(&suffix))
            || self
                .workloads
                .values()
                .any(|w| w.services.keys().any(|k| k.ends_with(&suffix)))
    }

    /// Applies one delta response: `resources` upserted, `removed` dropped. Names of resources
    /// that do not decode are returned.
    fn apply(&mut self, resp: &DeltaDiscoveryResponse) -> Vec<String> {
        let mut bad = Vec::new();
        for name in &resp.removed_resources {
            self.services.remove(name);
            self.workloads.remove(name);
        }
        for r in &resp.resources {
            let decoded = r
                .resource
                .as_ref()
                .ok_or_else(|| "no body".to_string())
                .and_then(|any| {
                    wire::Address::decode(any.value.as_slice()).map_err(|e| e.to_string())
                });
            // A name moves between kinds only through a removal; drop it from both first.
            self.services.remove(&r.name);
            self.workloads.remove(&r.name);
            match decoded {
                Ok(wire::Address {
                    r#type: Some(wire::AddressType::Service(s)),
                }) => {
                    self.services.insert(r.name.clone(), service_view(s));
                }
                Ok(wire::Address {
                    r#type: Some(wire::AddressType::Workload(w)),
                }) => {
                    self.workloads.insert(r.name.clone(), workload_view(w));
                }
                Ok(wire::Address { r#type: None }) => {
                    bad.push(format!("{}: empty Address", r.name))
                }
                Err(e) => bad.push(format!("{}: {e}", r.name)),
            }
        }
        bad
    }
}

fn ip_text(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .map(|b| IpAddr::from(Ipv4Addr::from(b)).to_string())
            .unwrap_or_default(),
        16 => <[u8; 16]>::try_from(bytes)
            .map(|b| IpAddr::from(Ipv6Addr::from(b)).to_string())
            .unwrap_or_default(),
        _ => format!("<{} bytes: {bytes:?}>", bytes.len()),
    }
}

fn ports(ports: Vec<wire::Port>) -> Vec<PortView> {
    ports
        .into_iter()
        .map(|p| PortView {
            service_port: p.service_port,
            target_port: p.target_port,
        })
        .collect()
}

fn service_view(s: wire::Service) -> ServiceView {
    ServiceView {
        name: s.name,
        namespace: s.namespace,
        hostname: s.hostname,
        addresses: s.addresses.iter().map(|a| ip_text(&a.address)).collect(),
        ports: ports(s.ports),
    }
}

fn workload_view(w: wire::Workload) -> WorkloadView {
    WorkloadView {
        uid: w.uid,
        name: w.name,
        namespace: w.namespace,
        addresses: w.addresses.iter().map(|a| ip_text(a)).collect(),
        healthy: w.status == 0,
        services: w
            .services
            .into_iter()
            .map(|(k, v)| (k, ports(v.ports)))
            .collect(),
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(value::Kind::StringValue(s.into())),
    }
}

/// The node ztunnel `istio-system/ztunnel-test` on `node-1` announces.
fn node() -> Node {
    let fields = [
        ("NAME", POD),
        ("NAMESPACE", NAMESPACE),
        ("INSTANCE_IPS", IP),
        ("NODE_NAME", NODE_NAME),
        ("CLUSTER_ID", CLUSTER_ID),
    ];
    Node {
        id: format!("ztunnel~{IP}~{POD}.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"),
        metadata: Some(Struct {
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), string(v)))
                .collect(),
        }),
        ..Default::default()
    }
}

/// What the stream thread shares with the test.
#[derive(Default)]
struct State {
    view: ZtunnelView,
    /// Responses applied so far.
    responses: u64,
    /// Resources that did not decode (NACKed).
    undecodable: Vec<String>,
    /// Why the stream ended, once it has.
    ended: Option<String>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.0.lock().unwrap_or_else(|e| e.into_inner())
}

/// A ztunnel's stream to istiod kept open: every response applied to a [`ZtunnelView`] and
/// ACKed, on a thread of its own; closed on drop.
pub struct ZtunnelWatch {
    shared: Shared,
    _thread: Background,
}

impl ZtunnelWatch {
    /// Opens the stream to istiod's plaintext gRPC address `istiod_grpc` and subscribes to
    /// `istio.workload.Address` as ztunnel does (wildcard). Returns at once; see
    /// [`ZtunnelWatch::wait_until`].
    pub fn connect(istiod_grpc: SocketAddr) -> ZtunnelWatch {
        let shared: Shared = Arc::default();
        let out = shared.clone();
        let thread = Background::spawn(move |stopped| {
            let ended = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(async {
                    tokio::select! {
                        r = stream(istiod_grpc, &out) => r,
                        _ = stopped => Ok(()),
                    }
                }),
                Err(e) => Err(format!("runtime: {e}")),
            };
            let mut s = lock(&out);
            s.ended = Some(match ended {
                Ok(()) => "closed".to_string(),
                Err(e) => e,
            });
            out.1.notify_all();
        });
        ZtunnelWatch {
            shared,
            _thread: thread,
        }
    }

    /// The view now (empty before the first response).
    pub fn view(&self) -> ZtunnelView {
        lock(&self.shared).view.clone()
    }

    /// How many responses were applied so far.
    pub fn responses(&self) -> u64 {
        lock(&self.shared).responses
    }

    /// Waits until istiod has answered at least once and `pred` holds for the view; that view.
    /// Panics with the view when `timeout` passes, when the stream ends or when a resource did
    /// not decode.
    pub fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        mut pred: impl FnMut(&ZtunnelView) -> bool,
    ) -> ZtunnelView {
        let end = Instant::now() + timeout;
        let mut s = lock(&self.shared);
        loop {
            assert!(
                s.undecodable.is_empty(),
                "ztunnel view: istiod sent Addresses that do not decode: {:?}",
                s.undecodable
            );
            if s.responses > 0 && pred(&s.view) {
                return s.view.clone();
            }
            if let Some(why) = &s.ended {
                panic!(
                    "ztunnel view: the stream to istiod ended ({why}) while waiting for {what}; view: {:#?}",
                    s.view
                );
            }
            let now = Instant::now();
            assert!(
                now < end,
                "ztunnel view: timed out after {timeout:?} waiting for {what} ({} responses); view: {:#?}",
                s.responses,
                s.view
            );
            s = self
                .shared
                .1
                .wait_timeout(s, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The stream: subscribe, then apply and ACK (or NACK) each response until istiod closes it.
async fn stream(addr: SocketAddr, shared: &Shared) -> Result<(), String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // Wildcard: nothing named in `resource_names_subscribe`.
    tx.send(DeltaDiscoveryRequest {
        node: Some(node()),
        type_url: ADDRESS_TYPE.into(),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let mut responses = client
        .delta_aggregated_resources(UnboundedReceiverStream::new(rx))
        .await
        .map_err(|e| format!("DeltaAggregatedResources: {e}"))?
        .into_inner();
    while let Some(resp) = responses
        .message()
        .await
        .map_err(|e| format!("receive: {e}"))?
    {
        let bad = if resp.type_url == ADDRESS_TYPE {
            let mut s = lock(shared);
            let bad = s.view.apply(&resp);
            s.undecodable.extend(bad.iter().cloned());
            s.responses += 1;
            shared.1.notify_all();
            bad
        } else {
            vec![format!("unexpected type {}", resp.type_url)]
        };
        let error_detail = (!bad.is_empty()).then(|| Status {
            message: bad.join("; "),
            ..Default::default()
        });
        tx.send(DeltaDiscoveryRequest {
            type_url: resp.type_url,
            response_nonce: resp.nonce,
            error_detail,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What ztunnel would get from istiod (`istiod_grpc`: its plaintext gRPC address) now: opens
/// the stream, reads (and ACKs) the first response, which holds the whole ambient index, and
/// closes it. Panics when istiod does not answer within `timeout`.
pub fn workload_addresses(istiod_grpc: SocketAddr, timeout: Duration) -> ZtunnelView {
    ZtunnelWatch::connect(istiod_grpc).wait_until(timeout, "istiod's first response", |_| true)
}
