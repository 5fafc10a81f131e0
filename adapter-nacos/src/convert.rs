//! One Nacos service (its instances as last pushed) -> one model service. The mapping is
//! written out, beside Higress', in adapter-nacos/README.md ("Mapping").
//!
//! - Name and host: given by [`crate::names`] (`{service}.{group}.{namespace}` mapped to DNS,
//!   told apart when two services map alike); `--host-suffix` (default `nacos`) completes the
//!   host.
//! - Endpoints: instances that are healthy, enabled and of weight above 0 (Nacos' own clients
//!   skip the others); the service is emitted with none, and `--on-empty` decides. An instance
//!   that cannot be read is a problem naming it; the others are served.
//! - Ports by name, from each instance: its `port` (protocol from metadata `protocol`, else
//!   HTTPS when `secure=true`, else HTTP), `management.port` (Spring Boot's management port,
//!   HTTP), and each entry of `dubbo.endpoints` (Dubbo 3's ports per protocol). The first
//!   instance (by address) fixes a port's number; an instance with another number for the same
//!   name gets an endpoint port override.
//! - Instances on one address whose ports have different names are one endpoint with all their
//!   ports: a Dubbo provider registered at interface level has one instance per protocol
//!   (`dubbo` on 20880, `tri` on 50051), and in Istio every endpoint serves every port of its
//!   service, so two endpoints would each be sent the other's traffic on the other's port.
//!   Instances on one address with a port name in common (two processes on one host) stay
//!   apart. A merged endpoint keeps the labels its instances agree on.
//! - Weight: Nacos' (a float, 1.0 by default) times 100, so 0.5 and 1.5 keep their ratio.
//! - Labels: the instance's metadata (the core drops keys and values Kubernetes refuses, with a
//!   warning), and `nacos-cluster` (Nacos' cluster name) unless the metadata has it.
//! - Locality: metadata `region` and `zone` (`region/zone`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use mcp_core::model::Labels;
use mcp_core::translate::naming::{canonical_protocol, map_dns_label};
use mcp_core::{Endpoint, Host, Port, Service, ServiceKey, SharedStr};

use crate::dto::{Instance, ServiceInfo};

/// The label that carries Nacos' cluster name.
pub const CLUSTER_LABEL: &str = "nacos-cluster";

/// Which service: namespace id (`public` for the default one), group, name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId {
    /// Namespace id.
    pub namespace: String,
    /// Group.
    pub group: String,
    /// Service name.
    pub name: String,
}

impl ServiceId {
    /// The id; an empty namespace is `public`.
    pub fn new(namespace: &str, group: &str, name: &str) -> Self {
        Self {
            namespace: crate::dto::namespace_id(namespace),
            group: group.to_string(),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Display for ServiceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.group, self.name)
    }
}

/// What converting one service gave: the service and one line per skipped instance.
#[derive(Debug, Default)]
pub struct Converted {
    /// The service.
    pub service: Option<Service>,
    /// Skipped instances, naming the service and the instance.
    pub problems: Vec<String>,
}

/// The problem scope of a service's conversion.
pub fn scope(id: &ServiceId) -> String {
    format!("nacos service {id}")
}

/// Converts `info` (every instance, any health) of service `id`, named `name` (its key and
/// host before the suffix).
pub fn convert_service(id: &ServiceId, name: &str, info: &ServiceInfo) -> Converted {
    let mut out = Converted::default();
    let mut svc = Service::new(ServiceKey::new(name), scope(id));
    svc.hosts = vec![Host::Relative(name.to_string())];
    // `--host-template`'s parts: the registry's own, not the name above (which is all three
    // joined, and told apart from names that map alike).
    svc.name_parts = vec![
        ("service", id.name.clone()),
        ("group", id.group.clone()),
        ("namespace", id.namespace.clone()),
    ];

    let mut live: Vec<(IpAddr, &Instance)> = Vec::new();
    for host in &info.hosts {
        let inst = match host {
            Ok(i) => i,
            Err(e) => {
                out.problems.push(format!("nacos service {id}: {e}"));
                continue;
            }
        };
        if !(inst.healthy && inst.enabled && inst.weight > 0.0) {
            continue;
        }
        match inst.ip.trim().parse::<IpAddr>() {
            Ok(ip) => live.push((ip, inst)),
            Err(_) => out.problems.push(format!(
                "nacos service {id} instance {}:{}: ip {:?} is not an IP address",
                inst.ip, inst.port, inst.ip
            )),
        }
    }
    live.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.port.cmp(&b.1.port)));

    let mut ports: BTreeMap<String, Port> = BTreeMap::new();
    let mut merged: Vec<Merged> = Vec::new();
    for (ip, inst) in &live {
        let found = ports_of(inst);
        if found.is_empty() {
            out.problems.push(format!(
                "nacos service {id} instance {ip}:{}: no port in 1-65535",
                inst.port
            ));
            continue;
        }
        for p in &found {
            ports.entry(p.name.clone()).or_insert_with(|| p.clone());
        }
        // Into an endpoint of this address (the latest made) that has none of these port names.
        let joins = merged
            .iter_mut()
            .rev()
            .take_while(|m| m.ip == *ip)
            .find(|m| {
                !found
                    .iter()
                    .any(|p| m.ports.iter().any(|q| q.name == p.name))
            });
        match joins {
            Some(m) => m.add(inst, found),
            None => merged.push(Merged::new(*ip, inst, found)),
        }
    }
    for m in merged {
        let mut ep = Endpoint {
            address: m.ip.to_string(),
            ..Endpoint::default()
        };
        for p in m.ports {
            if ports.get(&p.name).is_some_and(|s| s.number != p.number) {
                ep.ports.insert(p.name, p.number);
            }
        }
        // Nacos' weights are floats (1.0 by default); Istio's are integers.
        ep.weight = Some(((m.weight * 100.0).round() as u32).max(1));
        ep.locality = locality(&m.labels).map(SharedStr::from);
        ep.labels = m.labels.into();
        svc.endpoints.push(ep);
    }
    svc.ports = ports.into_values().collect();
    svc.ports
        .sort_by(|a, b| a.number.cmp(&b.number).then(a.name.cmp(&b.name)));
    out.service = Some(svc);
    out
}

/// The instances of one address that make one endpoint.
struct Merged {
    ip: IpAddr,
    ports: Vec<Port>,
    /// The first instance's.
    weight: f64,
    /// What every instance agrees on.
    labels: Labels,
}

impl Merged {
    fn new(ip: IpAddr, inst: &Instance, ports: Vec<Port>) -> Self {
        Self {
            ip,
            ports,
            weight: inst.weight,
            labels: labels_of(inst),
        }
    }

    fn add(&mut self, inst: &Instance, ports: Vec<Port>) {
        self.ports.extend(ports);
        let theirs = labels_of(inst);
        self.labels.retain(|k, v| theirs.get(k) == Some(v));
    }
}

/// The endpoint labels of `inst`: its metadata and its cluster.
fn labels_of(inst: &Instance) -> Labels {
    let mut labels = inst.metadata.clone();
    if let Some(c) = inst.cluster_name.as_deref().filter(|c| !c.is_empty()) {
        labels
            .entry(CLUSTER_LABEL.to_string())
            .or_insert_with(|| c.to_string());
    }
    labels
}

/// The ports instance `inst` offers, by name.
fn ports_of(inst: &Instance) -> Vec<Port> {
    let meta = &inst.metadata;
    let mut out: Vec<Port> = Vec::new();
    let mut add = |name: String, number: i64, protocol: &str| {
        let Ok(number) = u32::try_from(number) else {
            return;
        };
        if !(1..=65535).contains(&number)
            || out.iter().any(|p| p.name == name || p.number == number)
        {
            return;
        }
        out.push(Port {
            number,
            name,
            protocol: Some(protocol.to_string()),
            target_port: None,
        });
    };
    // Dubbo 3's ports first: an application-level instance's own `port` is one of them (the
    // preferred protocol's) and carries no `protocol` of its own.
    if let Some(endpoints) = meta.get("dubbo.endpoints") {
        for e in dubbo_endpoints(endpoints) {
            add(map_dns_label(&e.1), e.0, istio_protocol(&e.1));
        }
    }
    let (name, protocol) = match meta
        .get("protocol")
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
    {
        Some(p) => (map_dns_label(p), istio_protocol(p)),
        None if meta
            .get("secure")
            .is_some_and(|s| s.eq_ignore_ascii_case("true")) =>
        {
            ("https".to_string(), "HTTPS")
        }
        None => ("http".to_string(), "HTTP"),
    };
    add(name, inst.port, protocol);
    if let Some(n) = meta
        .get("management.port")
        .and_then(|p| p.trim().parse::<i64>().ok())
    {
        add("http-management".into(), n, "HTTP");
    }
    out
}

/// `[{"port":20880,"protocol":"dubbo"},{"port":50051,"protocol":"tri"}]`: (port, protocol).
fn dubbo_endpoints(raw: &str) -> Vec<(i64, String)> {
    let Ok(serde_json::Value::Array(items)) = serde_json::from_str::<serde_json::Value>(raw) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|i| {
            let port = i.get("port")?.as_i64()?;
            let protocol = i.get("protocol")?.as_str()?.to_string();
            Some((port, protocol))
        })
        .collect()
}

/// Istio's protocol for a registry's protocol name: Istio's own names as they are, Dubbo's
/// Triple (gRPC-compatible) as GRPC, `rest` as HTTP, anything else (`dubbo`, `hessian`) TCP.
pub fn istio_protocol(p: &str) -> &'static str {
    if let Some(c) = canonical_protocol(p) {
        return c;
    }
    match p.to_ascii_lowercase().as_str() {
        "tri" | "triple" => "GRPC",
        "rest" => "HTTP",
        _ => "TCP",
    }
}

/// `region/zone` from metadata, or whichever of the two is there.
fn locality(meta: &BTreeMap<String, String>) -> Option<String> {
    let get = |k: &str| meta.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    match (get("region"), get("zone")) {
        (Some(r), Some(z)) => Some(format!("{r}/{z}")),
        (Some(r), None) => Some(r.to_string()),
        (None, Some(z)) => Some(z.to_string()),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(ip: &str, port: i64, meta: &[(&str, &str)]) -> Instance {
        Instance {
            ip: ip.into(),
            port,
            weight: 1.0,
            healthy: true,
            enabled: true,
            cluster_name: Some("DEFAULT".into()),
            metadata: meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Instance::default()
        }
    }

    fn info(hosts: Vec<Instance>) -> ServiceInfo {
        ServiceInfo {
            name: Some("orders".into()),
            group_name: Some("DEFAULT_GROUP".into()),
            hosts: hosts.into_iter().map(Ok).collect(),
        }
    }

    /// Converted under its readable name.
    fn convert(id: &ServiceId, info: &ServiceInfo) -> Converted {
        let names = crate::names::Names::assign([id]);
        convert_service(id, names.get(id).expect("named"), info)
    }

    #[test]
    fn names_hosts_ports_weights_labels_and_locality() {
        let id = ServiceId::new("", "DEFAULT_GROUP", "Orders_API");
        let mut a = inst(
            "10.0.0.2",
            8080,
            &[("version", "v1"), ("region", "eu"), ("zone", "eu-1a")],
        );
        a.weight = 0.5;
        let b = inst("10.0.0.1", 9090, &[("version", "v2")]);
        let c = convert(&id, &info(vec![a, b]));
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        let s = c.service.expect("service");
        assert_eq!(s.key.name, "orders-api.default-group.public");
        assert_eq!(
            s.hosts,
            vec![Host::Relative("orders-api.default-group.public".into())]
        );
        assert_eq!(s.ports.len(), 1);
        assert_eq!(
            (s.ports[0].name.as_str(), s.ports[0].number),
            ("http", 9090)
        );
        assert_eq!(s.ports[0].protocol.as_deref(), Some("HTTP"));
        let e1 = &s.endpoints[0];
        assert_eq!(e1.address, "10.0.0.1");
        assert!(e1.ports.is_empty());
        assert_eq!(e1.weight, Some(100));
        let e2 = &s.endpoints[1];
        assert_eq!(e2.address, "10.0.0.2");
        assert_eq!(e2.ports.get("http"), Some(&8080));
        assert_eq!(e2.weight, Some(50));
        assert_eq!(e2.locality.as_deref(), Some("eu/eu-1a"));
        let labels: BTreeMap<String, String> = e2
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(labels.get("version").map(String::as_str), Some("v1"));
        assert_eq!(
            labels.get(CLUSTER_LABEL).map(String::as_str),
            Some("DEFAULT")
        );
    }

    /// What rnacos cannot stage (it ignores `healthy=false`): an answer as Nacos 2.x sends it
    /// for a service with an unhealthy, a disabled, a weight-0 and a healthy instance.
    #[test]
    fn only_healthy_enabled_weighted_instances_are_endpoints() {
        let recorded = r#"{"name":"DEFAULT_GROUP@@orders","groupName":"DEFAULT_GROUP","clusters":"",
          "cacheMillis":10000,"hosts":[
            {"instanceId":"10.0.0.1#8080#DEFAULT#DEFAULT_GROUP@@orders","ip":"10.0.0.1","port":8080,
             "weight":1.0,"healthy":false,"enabled":true,"ephemeral":true,"clusterName":"DEFAULT",
             "serviceName":"DEFAULT_GROUP@@orders","metadata":{}},
            {"instanceId":"10.0.0.2#8080#DEFAULT#DEFAULT_GROUP@@orders","ip":"10.0.0.2","port":8080,
             "weight":1.0,"healthy":true,"enabled":false,"ephemeral":true,"clusterName":"DEFAULT",
             "serviceName":"DEFAULT_GROUP@@orders","metadata":{}},
            {"instanceId":"10.0.0.3#8080#DEFAULT#DEFAULT_GROUP@@orders","ip":"10.0.0.3","port":8080,
             "weight":0.0,"healthy":true,"enabled":true,"ephemeral":true,"clusterName":"DEFAULT",
             "serviceName":"DEFAULT_GROUP@@orders","metadata":{}},
            {"instanceId":"10.0.0.4#8080#DEFAULT#DEFAULT_GROUP@@orders","ip":"10.0.0.4","port":8080,
             "weight":1.0,"healthy":true,"enabled":true,"ephemeral":true,"clusterName":"DEFAULT",
             "serviceName":"DEFAULT_GROUP@@orders","metadata":{}}],
          "lastRefTime":1700000000000,"checksum":"","allIPs":false,"reachProtectionThreshold":false,
          "valid":true}"#;
        let info: ServiceInfo = serde_json::from_str(recorded).expect("recorded answer");
        let id = ServiceId::new("", "DEFAULT_GROUP", "orders");
        let s = convert(&id, &info).service.expect("service");
        let addrs: Vec<&str> = s.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addrs, ["10.0.0.4"]);

        // All unhealthy: the service stays (no endpoints), so `--on-empty` decides.
        let mut none = info.clone();
        none.hosts.retain(|h| h.as_ref().is_ok_and(|h| !h.healthy));
        let s = convert(&id, &none).service.expect("service");
        assert!(s.endpoints.is_empty());
        assert!(s.ports.is_empty());
    }

    #[test]
    fn dubbo_and_spring_cloud_alibaba_ports() {
        // A Dubbo 3 application-level instance as Dubbo 3.3 registers it: its `port` is the
        // preferred protocol's, and it has no `protocol` key.
        let id = ServiceId::new("dev", "DUBBO", "providers:com.example.Greeter:1.0.0:");
        let dubbo = inst(
            "10.0.0.1",
            20880,
            &[(
                "dubbo.endpoints",
                r#"[{"port":20880,"protocol":"dubbo"},{"port":50051,"protocol":"tri"}]"#,
            )],
        );
        let s = convert(&id, &info(vec![dubbo])).service.expect("service");
        assert_eq!(s.key.name, "providers-com.example.greeter-1.0.0.dubbo.dev");
        let ports: Vec<(&str, u32, Option<&str>)> = s
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.number, p.protocol.as_deref()))
            .collect();
        assert_eq!(
            ports,
            [("dubbo", 20880, Some("TCP")), ("tri", 50051, Some("GRPC"))]
        );

        let id = ServiceId::new("", "DEFAULT_GROUP", "cart");
        let sca = inst(
            "10.0.0.2",
            8443,
            &[
                ("secure", "true"),
                ("management.port", "8081"),
                ("preserved.register.source", "SPRING_CLOUD"),
            ],
        );
        let s = convert(&id, &info(vec![sca])).service.expect("service");
        let ports: Vec<(&str, u32, Option<&str>)> = s
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.number, p.protocol.as_deref()))
            .collect();
        assert_eq!(
            ports,
            [
                ("http-management", 8081, Some("HTTP")),
                ("https", 8443, Some("HTTPS"))
            ]
        );
    }

    #[test]
    fn a_bad_address_is_a_problem_naming_the_instance_and_the_rest_is_served() {
        let id = ServiceId::new("", "DEFAULT_GROUP", "orders");
        let c = convert(
            &id,
            &info(vec![inst("not-an-ip", 80, &[]), inst("10.0.0.9", 80, &[])]),
        );
        assert_eq!(c.problems.len(), 1);
        assert!(
            c.problems[0].contains("public/DEFAULT_GROUP/orders")
                && c.problems[0].contains("not-an-ip"),
            "{}",
            c.problems[0]
        );
        assert_eq!(c.service.expect("service").endpoints.len(), 1);
    }

    /// A Dubbo provider registered at interface level: one instance per protocol on one
    /// address. One endpoint with both ports, labels those the two agree on; two processes on
    /// one host (the same port name) stay two endpoints.
    #[test]
    fn instances_of_one_address_with_other_port_names_are_one_endpoint() {
        let id = ServiceId::new("", "DEFAULT_GROUP", "providers:com.example.Greeter::");
        let dubbo = inst(
            "10.0.0.1",
            20880,
            &[("protocol", "dubbo"), ("version", "1.0.0")],
        );
        let tri = inst(
            "10.0.0.1",
            50051,
            &[("protocol", "tri"), ("version", "1.0.0")],
        );
        let other = inst(
            "10.0.0.2",
            20880,
            &[("protocol", "dubbo"), ("version", "1.0.0")],
        );
        let s = convert(&id, &info(vec![tri, dubbo, other]))
            .service
            .expect("service");
        let eps: Vec<(&str, usize)> = s
            .endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.ports.len()))
            .collect();
        assert_eq!(eps, [("10.0.0.1", 0), ("10.0.0.2", 0)]);
        let labels = &s.endpoints[0].labels;
        assert!(
            labels
                == &Labels::from([
                    ("nacos-cluster".to_string(), "DEFAULT".to_string()),
                    ("version".to_string(), "1.0.0".to_string()),
                ]),
            "{labels:?}"
        );
        assert_eq!(s.ports.len(), 2);

        let id = ServiceId::new("", "DEFAULT_GROUP", "cart");
        let a = inst("10.0.0.5", 8080, &[]);
        let b = inst("10.0.0.5", 8081, &[]);
        let s = convert(&id, &info(vec![b, a])).service.expect("service");
        let eps: Vec<(&str, Option<&u32>)> = s
            .endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.ports.get("http")))
            .collect();
        assert_eq!(eps, [("10.0.0.5", None), ("10.0.0.5", Some(&8081))]);
    }

    #[test]
    fn an_instance_that_cannot_be_read_is_a_problem_and_the_rest_is_served() {
        let id = ServiceId::new("public", "DEFAULT_GROUP", "orders");
        let mut i = info(vec![inst("10.0.0.9", 80, &[])]);
        i.hosts.push(Err(
            "instance \"10.0.0.8\":\"x\" cannot be read: bad port".into()
        ));
        let c = convert(&id, &i);
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
        assert!(c.problems[0].contains("10.0.0.8"), "{}", c.problems[0]);
        assert_eq!(c.service.expect("service").endpoints.len(), 1);
    }
}
