//! ZooKeeper znodes -> model services, for the three layouts found in ZooKeeper registries:
//!
//! * Dubbo 2 interface level: `/{root}/{interface}/providers/{URL-encoded provider URL}`, one
//!   service per interface (group and version are endpoint labels);
//! * Curator x-discovery / Spring Cloud Zookeeper: `/{root}/{name}/{id}` with ServiceInstance
//!   JSON, one service per name;
//! * Dubbo 3 application level: the Curator layout with `dubbo.endpoints` in the payload
//!   metadata (the ports and protocols the application serves).
//!
//! Every directory converts on its own; what needs the whole registry (two interfaces mapping
//! to one name, a Dubbo 3 provider registered at both levels) is [`crate::assemble`]'s job.
//! Names are [`crate::naming`]'s; parsing the provider URLs and the instance JSON is
//! [`crate::dto`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mcp_core::parse::truthy;
use mcp_core::translate::naming::{canonical_protocol, check_label_key, check_label_value};
use mcp_core::{Endpoint, Host, LabelSet, Labels, Port, Service, ServiceKey};

use crate::dto::{form_decode, parse_url, CuratorInstance, DubboEndpoint};
use crate::filter::Filters;
use crate::naming::{curator_name, dubbo_name};

/// Istio protocol of a Dubbo/Curator protocol name.
pub fn istio_protocol(p: &str) -> &'static str {
    match p.to_ascii_lowercase().as_str() {
        "dubbo" => "TCP",
        "tri" | "triple" | "grpc" => "GRPC",
        "http" | "rest" => "HTTP",
        other => canonical_protocol(other).unwrap_or("TCP"),
    }
}

/// One usable instance, whatever the layout.
#[derive(Clone, Debug)]
struct Inst {
    what: String,
    address: String,
    /// (Istio protocol, port), first = primary.
    ports: Vec<(&'static str, u32)>,
    labels: Labels,
    weight: Option<u32>,
    created: Option<SystemTime>,
}

/// Annotation naming the Dubbo interface of a service.
pub const INTERFACE_ANNOTATION: &str = "dubbo.apache.org/interface";
/// Annotation naming the Dubbo 3 application of a service.
pub const APPLICATION_ANNOTATION: &str = "dubbo.apache.org/application";

/// What a service directory holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    /// Nothing to serve (a Dubbo interface with consumers only, Dubbo 3 bookkeeping).
    #[default]
    None,
    /// A Dubbo interface with a `providers` directory.
    DubboInterface,
    /// Curator x-discovery / Spring Cloud Zookeeper instances.
    Curator,
    /// Dubbo 3 application-level instances.
    Dubbo3Application,
}

/// What one ZooKeeper service directory converts to.
#[derive(Debug, Default, PartialEq)]
pub struct Converted {
    /// The service to serve, possibly with no endpoints; `None` = not served.
    pub service: Option<Service>,
    /// Skipped objects, each naming its znode.
    pub problems: Vec<String>,
    /// What the directory holds.
    pub kind: Kind,
}

fn check_ip(what: &str, host: &str, problems: &mut Vec<String>) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        true
    } else {
        problems.push(format!(
            "{what}: address {host:?} is not an IP address; instance skipped"
        ));
        false
    }
}

fn check_port(what: &str, port: i64, problems: &mut Vec<String>) -> Option<u32> {
    match u32::try_from(port) {
        Ok(p) if (1..=65535).contains(&p) => Some(p),
        _ => {
            problems.push(format!(
                "{what}: port {port} is not in 1-65535; instance skipped"
            ));
            None
        }
    }
}

fn falsy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "false" | "0" | "no")
}

fn parse_weight(v: Option<&String>) -> Option<u32> {
    v.and_then(|w| w.trim().parse::<u32>().ok())
        .filter(|w| *w > 0)
}

fn millis(ms: i64) -> Option<SystemTime> {
    u64::try_from(ms)
        .ok()
        .filter(|m| *m > 0)
        .map(|m| UNIX_EPOCH + Duration::from_millis(m))
}

/// Keeps the labels Kubernetes accepts. Dubbo URLs and Curator metadata routinely carry values
/// that are not label values (`methods=a,b`, `ipv6=fd00::1`, JSON): they are expected, so they are
/// left out quietly here instead of being reported on every change.
fn valid_labels(labels: impl IntoIterator<Item = (String, String)>) -> Labels {
    labels
        .into_iter()
        .filter(|(k, v)| check_label_key(k).is_ok() && check_label_value(k, v).is_ok())
        .collect()
}

/// Builds one service from its usable instances (none: no ports and no endpoints).
fn build(name: String, origin: String, insts: &[Inst], problems: &mut Vec<String>) -> Service {
    // Ports: every distinct port number among the instances; a number claimed with two
    // protocols takes the alphabetically first and reports the conflict.
    let mut by_number: BTreeMap<u32, BTreeSet<&'static str>> = BTreeMap::new();
    for i in insts {
        for (proto, port) in &i.ports {
            by_number.entry(*port).or_default().insert(proto);
        }
    }
    let mut ports = Vec::new();
    for (number, protos) in &by_number {
        let Some(proto) = protos.iter().next().copied() else {
            continue;
        };
        if protos.len() > 1 {
            problems.push(format!(
                "{origin}: port {number} is served with different protocols ({}); using {proto}",
                protos.iter().copied().collect::<Vec<_>>().join(", ")
            ));
        }
        ports.push(Port {
            number: *number,
            name: format!("{}-{number}", proto.to_ascii_lowercase()),
            protocol: Some(proto.to_string()),
            target_port: None,
        });
    }
    let mut endpoints = Vec::with_capacity(insts.len());
    for i in insts {
        let primary = i.ports.first().map(|p| p.1);
        // Every service port reaches this instance on its own port of the same protocol (or its
        // primary port): instances of one service may listen on different ports.
        let mut map = BTreeMap::new();
        for p in &ports {
            let own = i
                .ports
                .iter()
                .find(|(proto, n)| *n == p.number || Some(*proto) == p.protocol.as_deref())
                .map(|(_, n)| *n)
                .or(primary);
            if let Some(own) = own {
                if own != p.number {
                    map.insert(p.name.clone(), own);
                }
            }
        }
        endpoints.push(Endpoint {
            address: i.address.clone(),
            ports: map,
            labels: LabelSet::from(&i.labels),
            network: None,
            locality: None,
            weight: i.weight,
            service_account: None,
        });
    }
    // One provider process often exports several versions on one port: same address and
    // ports, told apart by their labels.
    endpoints
        .sort_by(|a, b| (&a.address, &a.ports, &a.labels).cmp(&(&b.address, &b.ports, &b.labels)));
    let mut service = Service::new(ServiceKey::new(name.clone()), origin);
    service.hosts = vec![Host::Relative(name)];
    service.ports = ports;
    service.endpoints = endpoints;
    service.create_time = insts.iter().filter_map(|i| i.created).min();
    service
}

/// Converts the providers of Dubbo interface `interface` (znode names under
/// `{root}/{interface}/providers`, which exists) into its one service.
///
/// One service per interface, whatever the providers' groups and versions: Dubbo consumers
/// address an interface, and `group`/`version` select among its providers the way Istio subsets
/// select among endpoints, so they are endpoint labels (for DestinationRule subsets and Aeraki's
/// routing on the Dubbo attachment) and a version bump never renames the service.
///
/// The service has no endpoints when no provider is left (the `providers` directory is
/// persistent and outlives them): whether it stays served is the core's `--on-empty` decision.
/// It is `None` only when providers exist but `--dubbo-group`/`--dubbo-version` exclude them
/// all: a filtered-out interface is not served at all.
pub fn convert_dubbo(
    root: &str,
    interface: &str,
    providers: &[String],
    filters: &Filters,
) -> Converted {
    let dir = format!("{}/{interface}/providers", root.trim_end_matches('/'));
    let mut problems = Vec::new();
    let mut insts = Vec::new();
    let mut filtered_out = 0usize;
    for znode in providers {
        let what = format!("zookeeper {dir}/{znode}");
        let url = match form_decode(znode).and_then(|u| parse_url(&u)) {
            Ok(u) => u,
            Err(e) => {
                problems.push(format!(
                    "{what}: not a provider URL ({e}); instance skipped"
                ));
                continue;
            }
        };
        if url.params.get("enabled").is_some_and(|v| falsy(v))
            || url
                .params
                .get("disabled")
                .is_some_and(|v| truthy(v) == Some(true))
        {
            continue;
        }
        if url.params.get("side").is_some_and(|s| s != "provider")
            || url.params.get("category").is_some_and(|c| c != "providers")
        {
            continue;
        }
        let group = url.params.get("group").map_or("", String::as_str);
        let version = url.params.get("version").map_or("", String::as_str);
        if !filters.allows_provider(group, version) {
            filtered_out += 1;
            continue;
        }
        let Some(port) = check_port(&what, i64::from(url.port), &mut problems) else {
            continue;
        };
        if !check_ip(&what, &url.host, &mut problems) {
            continue;
        }
        // Subsets select on these two: a value Kubernetes rejects is worth a problem line
        // (unlike `methods=a,b`, which nobody selects on).
        for (key, value) in [("group", group), ("version", version)] {
            if !value.is_empty() && check_label_value(key, value).is_err() {
                problems.push(format!(
                    "{what}: {key} {value:?} is not a valid label value; the endpoint has no {key} label"
                ));
            }
        }
        let mut labels = valid_labels(url.params.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels.insert("protocol".into(), url.scheme.clone());
        insts.push(Inst {
            what,
            address: url.host.clone(),
            ports: vec![(istio_protocol(&url.scheme), port)],
            weight: parse_weight(url.params.get("weight")),
            created: url
                .params
                .get("timestamp")
                .and_then(|t| t.parse::<i64>().ok())
                .and_then(millis),
            labels,
        });
    }
    if insts.is_empty() && filtered_out > 0 {
        return Converted {
            service: None,
            problems,
            kind: Kind::DubboInterface,
        };
    }
    let origin = format!("zookeeper {dir}");
    let mut service = build(dubbo_name(interface), origin, &insts, &mut problems);
    service
        .annotations
        .insert(INTERFACE_ANNOTATION.into(), interface.to_string());
    debug_assert!(insts.iter().all(|i| !i.what.is_empty()));
    Converted {
        service: Some(service),
        problems,
        kind: Kind::DubboInterface,
    }
}

/// Is this instance metadata from Dubbo 3 application-level discovery?
pub fn is_dubbo3(metadata: &BTreeMap<String, String>) -> bool {
    metadata.contains_key("dubbo.endpoints") || metadata.contains_key("dubbo.metadata.revision")
}

fn metadata(inst: &CuratorInstance) -> BTreeMap<String, String> {
    let Some(m) = inst
        .payload
        .as_ref()
        .and_then(|p| p.get("metadata"))
        .and_then(|m| m.as_object())
    else {
        return BTreeMap::new();
    };
    m.iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// Converts the instances of Curator/Spring/Dubbo 3 service `name` (`(id, data)` of each child
/// of `{root}/{name}`) into at most one service.
///
/// Borrows the data: the watcher keeps each instance's data to convert the directory again
/// when one instance changes, without reading the others again.
pub fn convert_curator<'d>(
    root: &str,
    name: &str,
    instances: impl IntoIterator<Item = (&'d str, &'d [u8])>,
) -> Converted {
    let dir = format!("{}/{name}", root.trim_end_matches('/'));
    let mut problems = Vec::new();
    let mut insts = Vec::new();
    let mut dubbo3 = false;
    for (id, data) in instances {
        let what = format!("zookeeper {dir}/{id}");
        let inst: CuratorInstance = match serde_json::from_slice(data) {
            Ok(i) => i,
            Err(e) => {
                problems.push(format!(
                    "{what}: not a Curator ServiceInstance JSON ({e}); instance skipped"
                ));
                continue;
            }
        };
        if inst.enabled == Some(false) {
            continue;
        }
        let meta = metadata(&inst);
        if meta
            .get("instance_status")
            .is_some_and(|s| !s.eq_ignore_ascii_case("UP"))
        {
            continue;
        }
        let Some(address) = inst.address.as_deref().filter(|a| !a.is_empty()) else {
            problems.push(format!("{what}: no address; instance skipped"));
            continue;
        };
        if !check_ip(&what, address, &mut problems) {
            continue;
        }
        let mut ports = Vec::new();
        let mut bad = false;
        if is_dubbo3(&meta) {
            dubbo3 = true;
            let eps: Vec<DubboEndpoint> = match meta.get("dubbo.endpoints") {
                Some(s) => match serde_json::from_str(s) {
                    Ok(v) => v,
                    Err(e) => {
                        problems.push(format!(
                            "{what}: metadata dubbo.endpoints is not a JSON list of {{port, protocol}} ({e}); instance skipped"
                        ));
                        continue;
                    }
                },
                None => Vec::new(),
            };
            for ep in eps {
                match check_port(&what, ep.port, &mut problems) {
                    Some(p) => {
                        ports.push((istio_protocol(ep.protocol.as_deref().unwrap_or("dubbo")), p))
                    }
                    None => bad = true,
                }
            }
            if ports.is_empty() && !bad {
                match inst.port {
                    Some(p) => match check_port(&what, p, &mut problems) {
                        Some(p) => ports.push(("TCP", p)),
                        None => bad = true,
                    },
                    None => {
                        problems.push(format!("{what}: no port; instance skipped"));
                        bad = true;
                    }
                }
            }
        } else {
            let proto = meta.get("protocol").map_or("HTTP", |p| istio_protocol(p));
            if let Some(p) = inst.port {
                match check_port(&what, p, &mut problems) {
                    Some(p) => ports.push((proto, p)),
                    None => bad = true,
                }
            }
            if let Some(p) = inst.ssl_port {
                match check_port(&what, p, &mut problems) {
                    Some(p) => ports.push(("HTTPS", p)),
                    None => bad = true,
                }
            }
            if ports.is_empty() && !bad {
                problems.push(format!(
                    "{what}: neither port nor sslPort; instance skipped"
                ));
                bad = true;
            }
        }
        if bad {
            continue;
        }
        let weight = parse_weight(meta.get("weight"));
        let labels = valid_labels(meta);
        insts.push(Inst {
            what,
            address: address.to_string(),
            ports,
            labels,
            weight,
            created: inst.registration_time_utc.and_then(millis),
        });
    }
    let origin = format!("zookeeper {dir}");
    let mut service = build(curator_name(name), origin, &insts, &mut problems);
    let key = if dubbo3 {
        APPLICATION_ANNOTATION
    } else {
        "zookeeper.apache.org/service"
    };
    service.annotations.insert(key.into(), name.to_string());
    Converted {
        service: Some(service),
        problems,
        kind: if dubbo3 {
            Kind::Dubbo3Application
        } else {
            Kind::Curator
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Patterns;

    use crate::dto::form_encode as encode;

    #[test]
    fn converts_all_providers_of_an_interface_into_one_service() {
        let p = |ip: &str, q: &str| encode(&format!("dubbo://{ip}:20880/com.foo.Api?{q}"));
        let providers = vec![
            p(
                "10.0.0.1",
                "side=provider&weight=50&application=a&methods=a,b",
            ),
            p("10.0.0.2", "side=provider&version=1.0.0&group=g1"),
            p("10.0.0.2", "side=provider&version=2.0.0&group=g1"),
            p("10.0.0.3", "side=provider&enabled=false"),
            p("10.0.0.4", "side=provider&disabled=true"),
            encode("tri://10.0.0.5:50051/com.foo.Api?side=provider"),
            "garbage%zz".to_string(),
            p("db.example.com", "side=provider"),
            encode("dubbo://10.0.0.6:0/com.foo.Api?side=provider"),
            p("10.0.0.7", "side=provider&version=1.0.0%2Bbuild%2F7"),
        ];
        let c = convert_dubbo("/dubbo", "com.foo.Api", &providers, &Filters::default());
        assert_eq!(c.kind, Kind::DubboInterface);
        assert_eq!(c.problems.len(), 4, "{:?}", c.problems);
        assert!(c.problems[0].contains("zookeeper /dubbo/com.foo.Api/providers/garbage%zz"));
        assert!(c.problems[1].contains("not an IP"));
        assert!(c.problems[2].contains("port 0"));
        assert!(
            c.problems[3].contains("version \"1.0.0+build/7\" is not a valid label value"),
            "{}",
            c.problems[3]
        );
        let s = c.service.expect("served");
        assert_eq!(s.key.name, "com.foo.api");
        assert_eq!(s.hosts, vec![Host::Relative("com.foo.api".into())]);
        assert_eq!(s.annotations[INTERFACE_ANNOTATION], "com.foo.Api");
        assert_eq!(s.endpoints.len(), 5);
        assert_eq!(
            s.ports.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["tcp-20880", "grpc-50051"]
        );
        let e1 = &s.endpoints[0];
        assert_eq!(e1.weight, Some(50));
        assert_eq!(e1.labels.get("application"), Some("a"));
        assert_eq!(e1.labels.get("protocol"), Some("dubbo"));
        assert!(!e1.labels.contains_key("methods"));
        assert_eq!(e1.ports, [("grpc-50051".to_string(), 20880)].into());
        // One process exporting two versions on one port: two endpoints, told apart by labels.
        let versions: Vec<(&str, &str)> = s
            .endpoints
            .iter()
            .filter(|e| e.address == "10.0.0.2")
            .map(|e| {
                (
                    e.labels.get("group").unwrap_or_default(),
                    e.labels.get("version").unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(versions, [("g1", "1.0.0"), ("g1", "2.0.0")]);
        assert_eq!(
            s.endpoints[3].ports,
            [("tcp-20880".to_string(), 50051)].into()
        );
        assert!(!s.endpoints[4].labels.contains_key("version"));
    }

    #[test]
    fn group_and_version_filters_select_providers() {
        let p = |ip: &str, q: &str| encode(&format!("dubbo://{ip}:20880/a.B?side=provider{q}"));
        let providers = vec![
            p("10.0.0.1", "&group=blue&version=1.0.0"),
            p("10.0.0.2", "&group=green&version=1.0.0"),
            p("10.0.0.3", "&group=blue&version=0.9.0"),
            p("10.0.0.4", ""),
        ];
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_string()).collect::<Vec<_>>();
        let filters = Filters {
            groups: Patterns::new(&s(&["blue"]), &[]),
            versions: Patterns::new(&[], &s(&["0.*"])),
            ..Filters::default()
        };
        let c = convert_dubbo("/dubbo", "a.B", &providers, &filters);
        let addrs: Vec<&str> = c
            .service
            .as_ref()
            .expect("served")
            .endpoints
            .iter()
            .map(|e| e.address.as_str())
            .collect();
        assert_eq!(addrs, ["10.0.0.1"]);
        // Every provider filtered out: not served at all (not "empty").
        let none = Filters {
            groups: Patterns::new(&s(&["red"]), &[]),
            ..Filters::default()
        };
        assert!(convert_dubbo("/dubbo", "a.B", &providers, &none)
            .service
            .is_none());
    }

    #[test]
    fn converts_spring_and_curator_instances() {
        let spring = br#"{"name":"waiter-service","id":"b1fdcb1e","address":"10.133.11.150","port":53598,"sslPort":null,"payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"waiter-service","name":"waiter-service","metadata":{"instance_status":"UP","zone":"z1","weight":"7"}},"registrationTimeUTC":1618899361271,"serviceType":"DYNAMIC","uriSpec":null}"#;
        let down = br#"{"name":"waiter-service","id":"2","address":"10.0.0.2","port":80,"payload":{"metadata":{"instance_status":"OUT_OF_SERVICE"}}}"#;
        let disabled =
            br#"{"name":"waiter-service","id":"3","address":"10.0.0.3","port":80,"enabled":false}"#;
        let tls = br#"{"name":"waiter-service","id":"4","address":"10.0.0.4","port":null,"sslPort":8443,"registrationTimeUTC":1000}"#;
        let host = br#"{"name":"waiter-service","id":"5","address":"db.local","port":80}"#;
        let zero = br#"{"name":"waiter-service","id":"6","address":"10.0.0.6","port":0}"#;
        let bad = b"{not json";
        let c = convert_curator(
            "/services",
            "waiter-service",
            [
                ("1", &spring[..]),
                ("2", &down[..]),
                ("3", &disabled[..]),
                ("4", &tls[..]),
                ("5", &host[..]),
                ("6", &zero[..]),
                ("7", &bad[..]),
            ],
        );
        assert_eq!(c.problems.len(), 3, "{:?}", c.problems);
        assert!(c.problems[2].starts_with("zookeeper /services/waiter-service/7:"));
        assert_eq!(c.kind, Kind::Curator);
        let s = c.service.as_ref().expect("served");
        assert_eq!(s.key.name, "waiter-service");
        assert_eq!(s.hosts, vec![Host::Relative("waiter-service".into())]);
        assert_eq!(s.endpoints.len(), 2);
        assert_eq!(
            s.ports.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["https-8443", "http-53598"]
        );
        assert_eq!(s.endpoints[1].labels.get("zone"), Some("z1"));
        assert_eq!(s.endpoints[1].weight, Some(7));
        assert_eq!(s.create_time, millis(1000));
    }

    #[test]
    fn converts_dubbo3_nested_json() {
        let data = br#"{"name":"first-dubbo-provider","id":"30.221.146.35:20880","address":"30.221.146.35","port":20880,"sslPort":null,
 "payload":{"@class":"org.apache.dubbo.registry.zookeeper.ZookeeperInstance","id":"30.221.146.35:20880","name":"first-dubbo-provider",
   "metadata":{"dubbo.endpoints":"[{\"port\":20880,\"protocol\":\"dubbo\"},{\"port\":50051,\"protocol\":\"tri\"}]",
               "dubbo.metadata-service.url-params":"{\"connections\":\"1\",\"version\":\"1.0.0\"}",
               "dubbo.metadata.revision":"871fbc9cb2730caea9b0d858852d5ede","dubbo.metadata.storage-type":"local",
               "timestamp":"1674960780647"}},
 "registrationTimeUTC":1674960781893,"serviceType":"DYNAMIC","uriSpec":null}"#;
        let bad = br#"{"name":"first-dubbo-provider","address":"10.0.0.9","port":1,"payload":{"metadata":{"dubbo.endpoints":"[{\"port\":"}}}"#;
        let c = convert_curator(
            "/services",
            "first-dubbo-provider",
            [("30.221.146.35:20880", &data[..]), ("10.0.0.9:1", &bad[..])],
        );
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
        assert!(c.problems[0].contains("/services/first-dubbo-provider/10.0.0.9:1"));
        assert_eq!(c.kind, Kind::Dubbo3Application);
        let s = c.service.as_ref().expect("served");
        assert_eq!(
            s.ports
                .iter()
                .map(|p| (p.name.as_str(), p.protocol.as_deref()))
                .collect::<Vec<_>>(),
            [("tcp-20880", Some("TCP")), ("grpc-50051", Some("GRPC"))]
        );
        assert!(s.endpoints[0].ports.is_empty());
        assert_eq!(
            s.endpoints[0].labels.get("dubbo.metadata.revision"),
            Some("871fbc9cb2730caea9b0d858852d5ede")
        );
        assert!(!s.endpoints[0].labels.contains_key("dubbo.endpoints"));
        assert_eq!(
            s.annotations["dubbo.apache.org/application"],
            "first-dubbo-provider"
        );
    }

    #[test]
    fn empty_or_all_disabled_is_served_with_no_endpoints() {
        let none = Filters::default();
        for providers in [vec![], vec![encode("dubbo://10.0.0.1:1/a.B?enabled=false")]] {
            let s = convert_dubbo("/dubbo", "a.B", &providers, &none)
                .service
                .expect("kept for the core's --on-empty");
            assert!(s.endpoints.is_empty() && s.ports.is_empty());
            assert_eq!(s.key.name, "a.b");
        }
        let c = convert_curator("/services", "web", std::iter::empty());
        assert!(c.service.expect("kept").endpoints.is_empty());
        assert_eq!(c.kind, Kind::Curator);
    }
}
