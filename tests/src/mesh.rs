//! A mesh's control and data plane as production runs them, on loopback: the mesh cluster's API
//! server with Istio's CRDs, istiod reading `k8s://` first and then every adapter, and a stock
//! Envoy sidecar fed by istiod. Istio configuration (DestinationRules, VirtualServices,
//! ServiceEntries, PeerAuthentication) is written to the API server, as `kubectl apply` would.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use crate::envoy::{Envoy, Interception};
use crate::istiod::{apply_istio_crds, Istiod, IstiodConfig};
use crate::kube::{collection_of, KubeApiServer};
use crate::netns::pod_ip;

/// The mesh cluster's API server, ready for istiod: namespace `istio-system`, Istio's CRDs, and
/// mTLS off mesh-wide ([`mtls_disabled`]: a stock Envoy has no istio-agent to get certificates
/// from).
pub fn mesh_api_server() -> KubeApiServer {
    let kube = KubeApiServer::start();
    kube.namespace("istio-system");
    kube.namespace("default");
    apply_istio_crds(&kube);
    apply(&kube, &mtls_disabled());
    kube
}

/// Creates or replaces Istio config (or any object) `obj` in `kube`, creating its namespace.
pub fn apply(kube: &KubeApiServer, obj: &Value) -> Value {
    if let Some(ns) = obj["metadata"]["namespace"].as_str() {
        kube.namespace(ns);
    }
    kube.apply(&collection_of(obj), obj)
}

/// istiod in production's shape (`k8s://` first, then `sources`) for a stock Envoy, and that
/// Envoy as the sidecar of pod `client-1` (10.77.0.1) in `default`, without capture
/// (interception `NONE`).
pub struct Mesh {
    /// istiod.
    pub istiod: Istiod,
    /// The sidecar.
    pub envoy: Envoy,
}

impl Mesh {
    /// Starts istiod on `kube` (from [`mesh_api_server`]) with `sources` after `k8s://`, then
    /// Envoy. The adapters must be ready: a source that is down makes istiod exit.
    pub fn start(kube: &KubeApiServer, sources: &[SocketAddr]) -> Mesh {
        Self::start_with(kube, sources, IstiodConfig::production())
    }

    /// [`Mesh::start`] with another istiod configuration (more environment, say).
    pub fn start_with(kube: &KubeApiServer, sources: &[SocketAddr], config: IstiodConfig) -> Mesh {
        let istiod = Istiod::start_with(sources, &kube.kubeconfig(), &config);
        let envoy = Envoy::start(istiod.grpc, Interception::None, "client-1", pod_ip(0, 1));
        Mesh { istiod, envoy }
    }

    /// Another sidecar (pod `pod` with IP `10.77.0.<n>` in `default`) of the same istiod, with
    /// `mode` capture.
    pub fn sidecar(&self, pod: &str, n: u8, mode: Interception) -> Envoy {
        Envoy::start(self.istiod.grpc, mode, pod, pod_ip(0, n))
    }

    /// `127.0.0.1:port`: the sidecar's outbound listener for a service port (interception
    /// `NONE`).
    pub fn outbound(&self, port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// istiod's `pilot_xds_pushes` (every push to every proxy, all types).
    pub fn pushes(&self) -> f64 {
        self.istiod.metric("pilot_xds_pushes")
    }
}

/// A DestinationRule for `host` in `namespace` with one subset per `(name, version label)`.
pub fn destination_rule(
    namespace: &str,
    name: &str,
    host: &str,
    subsets: &[(&str, &str)],
) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"host": host, "subsets": subsets.iter().map(|(s, v)| {
            json!({"name": s, "labels": {"version": v}})
        }).collect::<Vec<_>>()},
    })
}

/// A VirtualService for HTTP `host`: requests with header `x-subset: <pinned>` go to subset
/// `pinned`; the rest is split by `weights` (`(subset, percent)`).
pub fn http_split(
    namespace: &str,
    name: &str,
    host: &str,
    pinned: &str,
    weights: &[(&str, u32)],
) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hosts": [host], "http": [
            {"match": [{"headers": {"x-subset": {"exact": pinned}}}],
             "route": [{"destination": {"host": host, "subset": pinned}}]},
            {"route": weights.iter().map(|(s, w)| {
                json!({"destination": {"host": host, "subset": s}, "weight": w})
            }).collect::<Vec<_>>()},
        ]},
    })
}

/// A VirtualService for TCP `host`: connections split by `weights` (`(subset, percent)`).
pub fn tcp_split(namespace: &str, name: &str, host: &str, weights: &[(&str, u32)]) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hosts": [host], "tcp": [
            {"route": weights.iter().map(|(s, w)| {
                json!({"destination": {"host": host, "subset": s}, "weight": w})
            }).collect::<Vec<_>>()},
        ]},
    })
}

/// Mesh-wide `PeerAuthentication {mtls: DISABLE}` in `istio-system`: with iptables capture a
/// stock Envoy's inbound listener otherwise waits for istio-agent's SDS certificates (PERMISSIVE
/// mTLS chains) and keeps every listener warming.
pub fn mtls_disabled() -> Value {
    json!({
        "apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": "istio-system"},
        "spec": {"mtls": {"mode": "DISABLE"}},
    })
}

/// A `Sidecar` for namespace `default` (where the test's sidecars run) that imports only the
/// services of `namespaces`, as production scopes sidecars. Needed here, not only good
/// practice: without capture a sidecar binds 127.0.0.1:<port> for every service it knows, and the
/// mesh cluster's own `kubernetes` Service has the API server's port, which the API server
/// already holds on this loopback (Envoy would reject the whole listener update).
pub fn sidecar_scope<S: AsRef<str>>(namespaces: &[S]) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": "default"},
        "spec": {"egress": [{"hosts": namespaces.iter().map(|n| format!("{}/*", n.as_ref())).collect::<Vec<_>>()}]},
    })
}

/// How long istiod and Envoy get to act on a configuration change before a test gives up.
pub const CONFIG_TIMEOUT: Duration = Duration::from_secs(60);

/// The ServiceEntry objects in namespace `ns` of `kube`, as stored.
pub fn service_entries(kube: &KubeApiServer, ns: &str) -> Vec<Value> {
    kube.get(&format!(
        "/apis/networking.istio.io/v1/namespaces/{ns}/serviceentries"
    ))
    .and_then(|list| list["items"].as_array().cloned())
    .unwrap_or_default()
}

/// The ServiceEntry objects of `kube` that adapter source `source` owns (its ownership labels),
/// by `namespace/name`.
pub fn owned_service_entries(
    kube: &KubeApiServer,
    source: &str,
) -> std::collections::BTreeMap<String, Value> {
    let selector =
        format!("app.kubernetes.io/managed-by%3Dmcp-adapter,mcp-adapter/source%3D{source}");
    kube.get(&format!(
        "/apis/networking.istio.io/v1/serviceentries?labelSelector={selector}"
    ))
    .and_then(|list| list["items"].as_array().cloned())
    .unwrap_or_default()
    .into_iter()
    .map(|o| (crate::ns_name(&o), o))
    .collect()
}

/// `metadata.resourceVersion` of each object, by name.
pub fn resource_versions(
    objects: &std::collections::BTreeMap<String, Value>,
) -> std::collections::BTreeMap<String, String> {
    objects
        .iter()
        .map(|(k, o)| {
            (
                k.clone(),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}
