//! istiod's endpoint shard as a proxy sees it, cheaply: an Envoy-like sidecar node on istiod's
//! plaintext xDS port that subscribes (SotW ADS) to the EDS of one cluster only, and records
//! when each response arrived and which addresses it held. istiod answers it from its endpoint
//! index, so a change is seen as soon as istiod has updated the shard and pushed (debounce
//! included); nothing else (no CDS, LDS, RDS) is asked for, so the watcher costs istiod one
//! small EDS response per change.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{address, Node};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::protobuf::{value, Struct, Value};
use prost::Message;
use tokio_stream::wrappers::UnboundedReceiverStream;

const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// (when, the cluster's endpoint addresses) per EDS response.
type Seen = Arc<Mutex<Vec<(Instant, Vec<String>)>>>;

pub struct EdsWatch {
    seen: Seen,
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(value::Kind::StringValue(s.into())),
    }
}

fn node() -> Node {
    let fields = [
        ("NAMESPACE", string("default")),
        ("INTERCEPTION_MODE", string("NONE")),
        ("CLUSTER_ID", string("Kubernetes")),
        ("WORKLOAD_NAME", string("watcher")),
        (
            "LABELS",
            Value {
                kind: Some(value::Kind::StructValue(Struct {
                    fields: [("app".to_string(), string("watcher"))].into(),
                })),
            },
        ),
    ];
    Node {
        id: "sidecar~10.99.0.1~watcher-1.default~default.svc.cluster.local".into(),
        cluster: "watcher.default".into(),
        metadata: Some(Struct {
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }),
        ..Default::default()
    }
}

fn addresses(cla: &ClusterLoadAssignment) -> Vec<String> {
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                match ep.address.as_ref()?.address.as_ref()? {
                    address::Address::SocketAddress(s) => Some(s.address.clone()),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect()
}

impl EdsWatch {
    /// Connects to istiod's plaintext xDS port and watches `cluster`'s EDS on a thread of its
    /// own; it ends when istiod closes the stream.
    pub fn start(istiod: SocketAddr, cluster: String) -> EdsWatch {
        let seen: Seen = Arc::default();
        let out = seen.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let Ok(channel) =
                    tonic::transport::Endpoint::from_shared(format!("http://{istiod}"))
                        .expect("endpoint")
                        .connect()
                        .await
                else {
                    return;
                };
                let mut client = AggregatedDiscoveryServiceClient::new(channel)
                    .max_decoding_message_size(usize::MAX);
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let request = |version: String, nonce: String| DiscoveryRequest {
                    node: Some(node()),
                    type_url: EDS.into(),
                    resource_names: vec![cluster.clone()],
                    version_info: version,
                    response_nonce: nonce,
                    ..Default::default()
                };
                let _ = tx.send(request(String::new(), String::new()));
                let Ok(stream) = client
                    .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
                    .await
                else {
                    return;
                };
                let mut stream = stream.into_inner();
                while let Ok(Some(resp)) = stream.message().await {
                    let at = Instant::now();
                    let addrs = resp
                        .resources
                        .iter()
                        .filter_map(|r| ClusterLoadAssignment::decode(r.value.as_slice()).ok())
                        .filter(|c| c.cluster_name == cluster)
                        .flat_map(|c| addresses(&c))
                        .collect();
                    out.lock().expect("seen").push((at, addrs));
                    let _ = tx.send(request(resp.version_info, resp.nonce));
                }
            });
        });
        EdsWatch { seen }
    }

    /// The first time at or after `since` that a response held `address`, waiting up to
    /// `timeout`.
    pub fn wait_for(&self, address: &str, since: Instant, timeout: Duration) -> Option<Instant> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(t) = self
                .seen
                .lock()
                .expect("seen")
                .iter()
                .find(|(t, a)| *t >= since && a.iter().any(|x| x == address))
                .map(|(t, _)| *t)
            {
                return Some(t);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// How many responses so far.
    pub fn responses(&self) -> usize {
        self.seen.lock().expect("seen").len()
    }

    /// The addresses of the last response.
    pub fn last(&self) -> Vec<String> {
        self.seen
            .lock()
            .expect("seen")
            .last()
            .map(|(_, a)| a.clone())
            .unwrap_or_default()
    }
}
