//! One Kubernetes Service (with its EndpointSlices) -> one model service, by Galley's mapping.
//!
//! - host `<name>.<namespace>.svc.<--cluster-domain>`, in the Service's own namespace;
//! - ClusterIP(s) -> `addresses`, STATIC, endpoints from the slices; headless -> NONE (or STATIC
//!   with the pod IPs); ExternalName -> DNS + MESH_EXTERNAL with the external name as endpoint;
//! - endpoints: ready ones only (all with `publishNotReadyAddresses`), one per address even when
//!   it appears in two slices, ports by port *name* (a slice's numbers are the pods' ports);
//! - locality from the slice's zone, region and subzone from the node when nodes are read;
//!   labels and service accounts from the pod when pods are read.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service as KubeService, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint as SliceEndpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use mcp_core::{Endpoint, Host, Location, Port, Resolution, Service, ServiceKey, SharedStr};

use crate::config::{Headless, KubeConfig};
use crate::protocol::port_protocol;
use crate::state::{Cluster, ObjKey};

/// Istio's annotation for the namespaces a Service is visible in.
pub const EXPORT_TO: &str = "networking.istio.io/exportTo";

/// The conversion settings (from the flags).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--cluster-domain`.
    pub cluster_domain: String,
    /// ClusterIPs go into `addresses`.
    pub cluster_ip: bool,
    /// `--headless`.
    pub headless: Headless,
    /// `--network`, shared by every endpoint.
    pub network: Option<SharedStr>,
    /// `--trust-domain`, for subjectAltNames of pods' service accounts.
    pub trust_domain: String,
}

impl From<&KubeConfig> for Settings {
    fn from(cfg: &KubeConfig) -> Self {
        Self {
            cluster_domain: cfg.cluster_domain.trim_matches('.').to_lowercase(),
            cluster_ip: !cfg.no_cluster_ip,
            headless: cfg.headless,
            network: cfg.network.as_deref().map(SharedStr::from),
            trust_domain: cfg.trust_domain.clone(),
        }
    }
}

/// What converting one Service gave: the service (none when it cannot be served) and one line per
/// skipped part, each naming the Kubernetes object.
#[derive(Debug, Default)]
pub struct Converted {
    /// The service.
    pub service: Option<Service>,
    /// Skipped ports, slices and addresses, or why the Service is not served.
    pub problems: Vec<String>,
}

/// A Service port as served: the Kubernetes name (slices refer to it) and the model port.
struct ServedPort {
    kube_name: String,
    port: Port,
}

impl ServedPort {
    /// The port endpoints listen on unless a slice says otherwise.
    fn default_target(&self) -> u32 {
        self.port.target_port.unwrap_or(self.port.number)
    }
}

/// Converts the Service `key` as the cluster holds it now.
pub fn convert_service(cluster: &Cluster, key: &ObjKey, s: &Settings) -> Converted {
    let mut out = Converted::default();
    let Some(svc) = cluster.service(key) else {
        return out;
    };
    let (ns, name) = key;
    let origin = format!("kubernetes service {ns}/{name}");
    let no_spec = ServiceSpec::default();
    let spec = svc.spec.as_ref().unwrap_or(&no_spec);

    let ports = served_ports(svc, &origin, &mut out.problems);
    if ports.is_empty() {
        out.problems.push(format!(
            "{origin}: no TCP or UDP port to serve (a ServiceEntry needs at least one)"
        ));
        return out;
    }

    let mut m = Service::new(ServiceKey::namespaced(ns, name), origin.clone());
    m.hosts = vec![Host::Absolute(format!(
        "{name}.{ns}.svc.{}",
        s.cluster_domain
    ))];
    m.ports = ports.iter().map(|p| p.port.clone()).collect();
    m.labels = svc.labels().clone().into_iter().collect();
    m.export_to = svc
        .annotations()
        .get(EXPORT_TO)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    m.create_time = svc.metadata.creation_timestamp.as_ref().map(|t| t.0.into());
    // Who keeps a contested virtual IP: the older Service (to the second; then the key).
    m.creation_order = m.create_time.map(mcp_core::CreationOrder::of_time);

    let headless = spec.cluster_ip.as_deref() == Some("None");
    if spec.type_.as_deref() == Some("ExternalName") {
        let Some(target) = spec
            .external_name
            .as_deref()
            .map(|n| n.trim_end_matches('.'))
            .filter(|n| !n.is_empty())
        else {
            out.problems.push(format!(
                "{origin}: type ExternalName without spec.externalName"
            ));
            return out;
        };
        m.location = Location::External;
        m.resolution = Resolution::Dns;
        m.endpoints = vec![Endpoint {
            address: target.to_lowercase(),
            network: s.network.clone(),
            ..Endpoint::default()
        }];
    } else if headless && s.headless == Headless::None {
        m.resolution = Resolution::None;
    } else {
        m.resolution = Resolution::Static;
        if !headless && s.cluster_ip {
            m.addresses = cluster_ips(&spec.cluster_ips, &spec.cluster_ip);
        }
        let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
        m.endpoints = endpoints(
            cluster,
            key,
            &ports,
            publish_not_ready,
            s,
            &mut out.problems,
        );
        m.subject_alt_names = service_accounts(&m.endpoints, ns, &s.trust_domain);
    }
    out.service = Some(m);
    out
}

/// The Service's ports; SCTP ones (which no sidecar proxies) are skipped with a problem.
fn served_ports(svc: &KubeService, origin: &str, problems: &mut Vec<String>) -> Vec<ServedPort> {
    let spec_ports = svc.spec.as_ref().and_then(|s| s.ports.as_deref());
    let mut out = Vec::new();
    for (i, p) in spec_ports.unwrap_or_default().iter().enumerate() {
        let transport = p.protocol.as_deref().unwrap_or("TCP");
        if transport != "TCP" && transport != "UDP" {
            problems.push(format!(
                "{origin}: spec.ports[{i}] ({}): protocol {transport} is not served",
                p.port
            ));
            continue;
        }
        let Ok(number) = u32::try_from(p.port) else {
            continue;
        };
        let kube_name = p.name.clone().unwrap_or_default();
        let name = if kube_name.is_empty() {
            // Kubernetes allows one unnamed port; a ServiceEntry port needs a name.
            format!("port-{number}")
        } else {
            kube_name.clone()
        };
        let target_port = match &p.target_port {
            Some(IntOrString::Int(t)) => u32::try_from(*t).ok().filter(|t| *t != number),
            _ => None,
        };
        out.push(ServedPort {
            kube_name,
            port: Port {
                number,
                protocol: port_protocol(Some(transport), p.app_protocol.as_deref(), &name, p.port)
                    .map(String::from),
                name,
                target_port,
            },
        });
    }
    out
}

/// `spec.clusterIPs` (dual-stack: one per family), else `spec.clusterIP`; never `None`.
fn cluster_ips(ips: &Option<Vec<String>>, ip: &Option<String>) -> Vec<String> {
    let all = match ips {
        Some(v) if !v.is_empty() => v.clone(),
        _ => ip.iter().cloned().collect(),
    };
    all.into_iter()
        .filter(|a| a.parse::<IpAddr>().is_ok())
        .collect()
}

/// Is this endpoint served? Ready (or unknown, which Kubernetes says to read as ready), or any
/// state when the Service publishes not-ready addresses. Terminating endpoints are never ready.
fn serves(e: &SliceEndpoint, publish_not_ready: bool) -> bool {
    publish_not_ready || e.conditions.as_ref().and_then(|c| c.ready) != Some(false)
}

fn endpoints(
    cluster: &Cluster,
    key: &ObjKey,
    ports: &[ServedPort],
    publish_not_ready: bool,
    s: &Settings,
    problems: &mut Vec<String>,
) -> Vec<Endpoint> {
    let mut by_address: BTreeMap<String, Endpoint> = BTreeMap::new();
    for slice in cluster.slices_of(key) {
        let slice_name = slice.name_any();
        let where_ = format!("EndpointSlice {}/{slice_name}", key.0);
        if slice.address_type == "FQDN" {
            problems.push(format!(
                "{where_}: addressType FQDN is not served (Istio skips FQDN slices too)"
            ));
            continue;
        }
        let slice_ports = slice_ports(slice, ports);
        for e in slice
            .endpoints
            .iter()
            .filter(|e| serves(e, publish_not_ready))
        {
            for address in &e.addresses {
                let Ok(ip) = address.parse::<IpAddr>() else {
                    problems.push(format!(
                        "{where_}: address {address:?} is not an IP address"
                    ));
                    continue;
                };
                let ep = by_address
                    .entry(ip.to_string())
                    .or_insert_with(|| new_endpoint(cluster, e, ip, key, s));
                for (name, number) in &slice_ports {
                    ep.ports.insert(name.clone(), *number);
                }
            }
        }
    }
    by_address.into_values().collect()
}

/// The slice's ports as (model port name, number) where they differ from the default target; a
/// slice port is matched to the Service port of the same name.
fn slice_ports(slice: &EndpointSlice, ports: &[ServedPort]) -> Vec<(String, u32)> {
    slice
        .ports
        .iter()
        .flatten()
        .filter_map(|sp| {
            let name = sp.name.as_deref().unwrap_or_default();
            let served = ports.iter().find(|p| p.kube_name == name)?;
            let number = u32::try_from(sp.port?).ok()?;
            (number != served.default_target()).then(|| (served.port.name.clone(), number))
        })
        .collect()
}

fn new_endpoint(
    cluster: &Cluster,
    e: &SliceEndpoint,
    ip: IpAddr,
    key: &ObjKey,
    s: &Settings,
) -> Endpoint {
    let node = e.node_name.as_deref().and_then(|n| cluster.node(n));
    let zone = e.zone.clone().or_else(|| node.and_then(|n| n.zone.clone()));
    let region = node.and_then(|n| n.region.clone());
    let subzone = node.and_then(|n| n.subzone.clone());
    let locality = match (region, zone, subzone) {
        (None, None, _) => None,
        (r, z, sub) => {
            let mut l = format!("{}/{}", r.unwrap_or_default(), z.unwrap_or_default());
            if let Some(sub) = sub {
                l.push('/');
                l.push_str(&sub);
            }
            Some(l)
        }
    };
    let pod = e
        .target_ref
        .as_ref()
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .and_then(|r| {
            let ns = r.namespace.as_deref().unwrap_or(&key.0);
            cluster.pod(ns, r.name.as_deref()?)
        });
    Endpoint {
        address: ip.to_string(),
        labels: pod.map(|p| p.labels.clone()).unwrap_or_default(),
        service_account: pod.and_then(|p| p.service_account.clone()),
        network: s.network.clone(),
        locality: locality.map(SharedStr::from),
        ..Endpoint::default()
    }
}

/// SPIFFE identities of the endpoints' service accounts, sorted.
fn service_accounts(endpoints: &[Endpoint], ns: &str, trust_domain: &str) -> Vec<String> {
    let mut sans: Vec<String> = endpoints
        .iter()
        .filter_map(|e| e.service_account.as_deref())
        .map(|sa| format!("spiffe://{trust_domain}/ns/{ns}/sa/{sa}"))
        .collect();
    sans.sort();
    sans.dedup();
    sans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Item, PodInfo, Topology, SERVICE_NAME_LABEL};
    use k8s_openapi::api::core::v1::{ObjectReference, ServicePort};
    use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointPort};
    use kube::api::ObjectMeta;

    fn settings() -> Settings {
        Settings {
            cluster_domain: "remote.local".into(),
            cluster_ip: true,
            headless: Headless::None,
            network: Some("net2".into()),
            trust_domain: "td".into(),
        }
    }

    fn service(spec: ServiceSpec) -> Item {
        Item::Service(Box::new(KubeService {
            metadata: ObjectMeta {
                namespace: Some("shop".into()),
                name: Some("web".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                annotations: Some([(EXPORT_TO.to_string(), "., istio-system".to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: None,
        }))
    }

    fn port(name: &str, number: i32, target: i32) -> ServicePort {
        ServicePort {
            name: Some(name.into()),
            port: number,
            target_port: Some(IntOrString::Int(target)),
            ..ServicePort::default()
        }
    }

    fn ep(ip: &str, ready: Option<bool>, zone: Option<&str>) -> SliceEndpoint {
        SliceEndpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready,
                ..EndpointConditions::default()
            }),
            zone: zone.map(String::from),
            node_name: Some("n1".into()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(format!("pod-{ip}")),
                ..ObjectReference::default()
            }),
            ..SliceEndpoint::default()
        }
    }

    fn slice(name: &str, family: &str, eps: Vec<SliceEndpoint>, ports: &[(&str, i32)]) -> Item {
        Item::Slice(Box::new(EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("shop".into()),
                name: Some(name.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), "web".to_string())].into()),
                ..ObjectMeta::default()
            },
            address_type: family.into(),
            endpoints: eps,
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| EndpointPort {
                        name: Some((*n).into()),
                        port: Some(*p),
                        ..EndpointPort::default()
                    })
                    .collect(),
            ),
        }))
    }

    fn key() -> ObjKey {
        ("shop".into(), "web".into())
    }

    #[test]
    fn cluster_ip_service_with_dual_stack_slices() {
        let mut c = Cluster::default();
        c.apply(service(ServiceSpec {
            cluster_ip: Some("10.96.0.10".into()),
            cluster_ips: Some(vec!["10.96.0.10".into(), "fd00::10".into()]),
            ports: Some(vec![port("http", 80, 8080), port("grpc-api", 9090, 9090)]),
            ..ServiceSpec::default()
        }));
        c.apply(slice(
            "web-v4",
            "IPv4",
            vec![
                ep("10.0.0.1", Some(true), Some("z1")),
                ep("10.0.0.2", None, None),
                ep("10.0.0.3", Some(false), None),
            ],
            &[("http", 8080), ("grpc-api", 9191)],
        ));
        c.apply(slice(
            "web-v6",
            "IPv6",
            vec![ep("fd00::1", Some(true), None)],
            &[("http", 8080)],
        ));
        // The same address in a second slice (during a controller's rewrite) is one endpoint.
        c.apply(slice(
            "web-dup",
            "IPv4",
            vec![ep("10.0.0.1", Some(true), Some("z1"))],
            &[("http", 8080)],
        ));
        c.apply(Item::Pod(
            ("shop".into(), "pod-10.0.0.1".into()),
            PodInfo {
                labels: [("version", "v1")].into_iter().collect(),
                service_account: Some("web-sa".into()),
            },
        ));
        c.apply(Item::Node(
            "n1".into(),
            Topology {
                region: Some("eu".into()),
                zone: Some("node-zone".into()),
                subzone: None,
            },
        ));

        let out = convert_service(&c, &key(), &settings());
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        let m = out.service.expect("served");
        assert_eq!(
            m.hosts,
            vec![Host::Absolute("web.shop.svc.remote.local".into())]
        );
        assert_eq!(m.addresses, vec!["10.96.0.10", "fd00::10"]);
        assert_eq!(m.export_to, vec![".", "istio-system"]);
        assert_eq!(m.ports[0].target_port, Some(8080));
        assert_eq!(m.ports[0].protocol.as_deref(), Some("HTTP"));
        assert_eq!(m.ports[1].protocol.as_deref(), Some("GRPC"));
        let addrs: Vec<&str> = m.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addrs, vec!["10.0.0.1", "10.0.0.2", "fd00::1"]);
        let first = &m.endpoints[0];
        // 8080 is the Service's targetPort: only the differing gRPC port is spelled out.
        assert_eq!(first.ports, [("grpc-api".to_string(), 9191)].into());
        assert_eq!(first.locality.as_deref(), Some("eu/z1"));
        assert_eq!(first.labels.get("version"), Some("v1"));
        assert_eq!(first.network.as_deref(), Some("net2"));
        assert_eq!(m.endpoints[1].locality.as_deref(), Some("eu/node-zone"));
        assert_eq!(m.subject_alt_names, vec!["spiffe://td/ns/shop/sa/web-sa"]);
    }

    #[test]
    fn not_ready_published_fqdn_skipped_sctp_skipped() {
        let mut c = Cluster::default();
        c.apply(service(ServiceSpec {
            cluster_ip: Some("10.96.0.11".into()),
            ports: Some(vec![
                port("http", 80, 80),
                ServicePort {
                    protocol: Some("SCTP".into()),
                    ..port("sig", 3868, 3868)
                },
            ]),
            publish_not_ready_addresses: Some(true),
            ..ServiceSpec::default()
        }));
        c.apply(slice(
            "web-a",
            "IPv4",
            vec![ep("10.0.0.3", Some(false), None)],
            &[("http", 80)],
        ));
        c.apply(slice(
            "web-f",
            "FQDN",
            vec![ep("db.example.com", Some(true), None)],
            &[("http", 80)],
        ));
        let out = convert_service(&c, &key(), &settings());
        let m = out.service.expect("served");
        assert_eq!(m.ports.len(), 1);
        assert_eq!(m.endpoints.len(), 1, "not-ready published");
        assert_eq!(out.problems.len(), 2, "{:?}", out.problems);
        assert!(out.problems[0].contains("spec.ports[1]") && out.problems[0].contains("SCTP"));
        assert!(
            out.problems[1].contains("EndpointSlice shop/web-f")
                && out.problems[1].contains("FQDN")
        );
    }

    #[test]
    fn headless_and_external_name() {
        let mut c = Cluster::default();
        c.apply(service(ServiceSpec {
            cluster_ip: Some("None".into()),
            ports: Some(vec![port("", 5432, 5432)]),
            ..ServiceSpec::default()
        }));
        c.apply(slice(
            "web-a",
            "IPv4",
            vec![ep("10.0.0.4", None, None)],
            &[("", 5432)],
        ));
        let none = convert_service(&c, &key(), &settings())
            .service
            .expect("served");
        assert_eq!(none.resolution, Resolution::None);
        assert!(none.endpoints.is_empty() && none.addresses.is_empty());
        assert_eq!(none.ports[0].name, "port-5432");

        let stat = Settings {
            headless: Headless::Static,
            ..settings()
        };
        let m = convert_service(&c, &key(), &stat).service.expect("served");
        assert_eq!(m.resolution, Resolution::Static);
        assert_eq!(m.endpoints.len(), 1);
        assert!(m.addresses.is_empty());

        c.apply(service(ServiceSpec {
            type_: Some("ExternalName".into()),
            external_name: Some("DB.Example.com.".into()),
            ports: Some(vec![port("tcp-pg", 5432, 5432)]),
            ..ServiceSpec::default()
        }));
        let m = convert_service(&c, &key(), &settings())
            .service
            .expect("served");
        assert_eq!(m.location, Location::External);
        assert_eq!(m.resolution, Resolution::Dns);
        assert_eq!(m.endpoints[0].address, "db.example.com");

        // ExternalName without ports cannot be a ServiceEntry.
        c.apply(service(ServiceSpec {
            type_: Some("ExternalName".into()),
            external_name: Some("db.example.com".into()),
            ..ServiceSpec::default()
        }));
        let out = convert_service(&c, &key(), &settings());
        assert!(out.service.is_none());
        assert!(
            out.problems[0].contains("kubernetes service shop/web"),
            "{:?}",
            out.problems
        );
    }
}
