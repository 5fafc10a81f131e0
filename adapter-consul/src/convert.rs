//! Consul health entries -> one model service, following what Consul users already know from
//! Istio's old in-tree registry: host `<service>.service.consul`, labels from `ServiceMeta` and
//! `key|value` tags, protocol from `ServiceMeta["protocol"]`, `ServiceMeta["external"]` for
//! MESH_EXTERNAL, locality from the datacenter. A plain tag (`v1`, `canary`) becomes the label
//! [`TAG_LABEL_PREFIX`]`<tag>: "true"`, so a DestinationRule subset can select it; a tag that
//! makes no valid label key is reported by the core's label check, not served.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use mcp_core::parse::truthy;
use mcp_core::translate::naming::{canonical_protocol, map_dns_name};
use mcp_core::{
    CreationOrder, Endpoint, Host, Labels, Location, Port, Service, ServiceKey, SharedStr,
};
use serde::Deserialize;

use crate::config::ConsulConfig;

/// One element of `/v1/health/service/:name`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HealthEntry {
    /// The node the instance runs on.
    pub node: Node,
    /// The instance.
    pub service: Instance,
    /// Node and service checks.
    #[serde(default)]
    pub checks: Vec<Check>,
}

/// A Consul node.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Node {
    /// Node name.
    pub node: String,
    /// Node address (the instance address when the service has none).
    pub address: String,
    /// Datacenter.
    #[serde(default)]
    pub datacenter: String,
}

/// A service instance as the health endpoint nests it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Instance {
    /// Instance id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Service name.
    pub service: String,
    /// Tags.
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    /// Instance address (empty = the node's).
    #[serde(default)]
    pub address: String,
    /// Meta.
    #[serde(default)]
    pub meta: Option<HashMap<String, String>>,
    /// Port.
    #[serde(default)]
    pub port: u32,
    /// DNS weights.
    #[serde(default)]
    pub weights: Option<Weights>,
    /// `""` for a normal service; `connect-proxy`, `mesh-gateway`, ... otherwise.
    #[serde(default)]
    pub kind: Option<String>,
    /// The Raft index that registered this instance (kept by re-registrations of its ID).
    #[serde(default)]
    pub create_index: Option<u64>,
}

/// Weights by health state.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Weights {
    /// Weight while passing.
    pub passing: i64,
    /// Weight while warning.
    pub warning: i64,
}

/// A health check.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Check {
    /// `passing`, `warning` or `critical`.
    pub status: String,
}

/// What the conversion needs from the settings.
#[derive(Clone, Debug)]
pub struct ConvertSettings {
    /// Serve warning instances too.
    pub include_warning: bool,
    /// Instances must carry all these tags.
    pub tags: Vec<String>,
    /// Protocol for instances without `protocol` meta (Istio spelling).
    pub default_protocol: Option<&'static str>,
    /// Hosts `<svc>.service.<dc>.consul`.
    pub host_datacenter: bool,
}

impl ConvertSettings {
    /// From the command line; fails on an unknown `--default-protocol`.
    pub fn new(cfg: &ConsulConfig) -> Result<Self, String> {
        let default_protocol = match &cfg.default_protocol {
            None => None,
            Some(p) => Some(canonical_protocol(p).ok_or_else(|| {
                format!("--default-protocol {p:?} is not an Istio protocol (http, http2, grpc, tcp, tls, ...)")
            })?),
        };
        Ok(Self {
            include_warning: cfg.include_warning,
            tags: cfg.tags.clone(),
            default_protocol,
            host_datacenter: cfg.host_datacenter,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Health {
    Passing,
    Warning,
    Critical,
}

fn health(checks: &[Check]) -> Health {
    checks
        .iter()
        .map(|c| match c.status.as_str() {
            "passing" => Health::Passing,
            "warning" => Health::Warning,
            _ => Health::Critical,
        })
        .max()
        .unwrap_or(Health::Passing)
}

/// The label a plain tag becomes, before the tag: `consul.hashicorp.com/tag-canary: "true"`.
/// Consul's own domain as the prefix (like the `consul.hashicorp.com/service-name` annotation)
/// keeps tags apart from `key|value` labels and meta; a tag of up to 59 characters that starts
/// and ends with a letter or digit (and holds only those, `-`, `_` and `.`) is a valid key.
pub const TAG_LABEL_PREFIX: &str = "consul.hashicorp.com/tag-";

/// Labels of one instance: `key|value` and `key=value` tags, plain tags as
/// [`TAG_LABEL_PREFIX`]`<tag>: "true"`, then meta (meta wins).
fn labels(inst: &Instance) -> Labels {
    let mut out = Labels::new();
    for tag in inst.tags.iter().flatten() {
        match tag.split_once('|').or_else(|| tag.split_once('=')) {
            Some((k, v)) => out.insert(k.to_string(), v.to_string()),
            None if tag.is_empty() => continue,
            None => out.insert(format!("{TAG_LABEL_PREFIX}{tag}"), "true".to_string()),
        };
    }
    for (k, v) in inst.meta.iter().flatten() {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// The result of converting one Consul service.
#[derive(Debug, PartialEq)]
pub struct Converted {
    /// The service, or `None` when it should not be served (no instances left after filtering).
    pub service: Option<Service>,
    /// Instances skipped as bad data, each naming the instance.
    pub problems: Vec<String>,
}

/// Converts the health entries of service `name` into one model service.
pub fn convert(name: &str, entries: &[HealthEntry], s: &ConvertSettings) -> Converted {
    let mut problems = Vec::new();
    // Connect proxies and gateways are not the service; tag filters narrow the instances.
    let instances: Vec<&HealthEntry> = entries
        .iter()
        .filter(|e| e.service.kind.as_deref().unwrap_or("").is_empty())
        .filter(|e| {
            s.tags
                .iter()
                .all(|t| e.service.tags.iter().flatten().any(|have| have == t))
        })
        .collect();
    if instances.is_empty() {
        return Converted {
            service: None,
            problems,
        };
    }

    // Ports: every distinct port among the instances (healthy or not, so ports do not flap
    // with health), protocol from the instances' meta; a port claimed with two protocols takes
    // the alphabetically first and reports the conflict.
    let mut port_protocols: BTreeMap<u32, BTreeSet<Option<&'static str>>> = BTreeMap::new();
    let mut usable = Vec::new();
    for e in &instances {
        let inst = &e.service;
        let what = format!(
            "consul service {name} instance {} on node {}",
            inst.id, e.node.node
        );
        if inst.port == 0 || inst.port > 65535 {
            problems.push(format!(
                "{what}: port {} is not in 1-65535; instance skipped",
                inst.port
            ));
            continue;
        }
        let address = if inst.address.is_empty() {
            &e.node.address
        } else {
            &inst.address
        };
        if address.parse::<IpAddr>().is_err() {
            problems.push(format!(
                "{what}: address {address:?} is not an IP address; instance skipped"
            ));
            continue;
        }
        let meta_protocol = inst.meta.as_ref().and_then(|m| m.get("protocol"));
        let protocol = match meta_protocol {
            None => s.default_protocol,
            Some(p) => match canonical_protocol(p) {
                Some(c) => Some(c),
                None => {
                    problems.push(format!(
                        "{what}: meta protocol {p:?} is not an Istio protocol; using {}",
                        s.default_protocol.unwrap_or("protocol detection")
                    ));
                    s.default_protocol
                }
            },
        };
        port_protocols
            .entry(inst.port)
            .or_default()
            .insert(protocol);
        usable.push((*e, address.clone()));
    }
    let mut ports = Vec::new();
    for (number, protos) in &port_protocols {
        let protocol = protos.iter().flatten().next().copied();
        if protos.len() > 1 {
            problems.push(format!(
                "consul service {name}: port {number} has instances with different protocols ({}); using {}",
                protos.iter().map(|p| p.unwrap_or("none")).collect::<Vec<_>>().join(", "),
                protocol.unwrap_or("protocol detection")
            ));
        }
        let prefix = protocol.map_or_else(|| "port".to_string(), |p| p.to_ascii_lowercase());
        ports.push(Port {
            number: *number,
            name: format!("{prefix}-{number}"),
            protocol: protocol.map(str::to_string),
            target_port: None,
        });
    }

    let mut endpoints = Vec::new();
    let mut external = false;
    let mut datacenter = String::new();
    for (e, address) in &usable {
        let inst = &e.service;
        external |= inst
            .meta
            .as_ref()
            .and_then(|m| m.get("external"))
            .is_some_and(|v| truthy(v).unwrap_or(!v.is_empty()));
        if datacenter.is_empty() {
            datacenter.clone_from(&e.node.datacenter);
        }
        let state = health(&e.checks);
        let weight = match state {
            Health::Passing => inst.weights.map(|w| w.passing),
            Health::Warning if s.include_warning => inst.weights.map(|w| w.warning),
            _ => continue,
        };
        // Every service port reaches the instance on its own port (instances may listen on
        // different ports, e.g. ports assigned by a scheduler).
        let port_map = ports
            .iter()
            .filter(|p| p.number != inst.port)
            .map(|p| (p.name.clone(), inst.port))
            .collect();
        endpoints.push(Endpoint {
            address: address.clone(),
            ports: port_map,
            labels: labels(inst).into(),
            network: None,
            locality: (!e.node.datacenter.is_empty()).then(|| SharedStr::from(&e.node.datacenter)),
            weight: weight
                .filter(|w| *w > 0)
                .and_then(|w| u32::try_from(w).ok()),
            service_account: None,
        });
    }
    // A service with no healthy instance is still emitted (with no endpoints): whether to
    // keep or remove it is the core's `--on-empty` policy, the same for every registry.

    let mut service = Service::new(ServiceKey::new(name), format!("consul service {name}"));
    if s.host_datacenter && !datacenter.is_empty() {
        service.hosts = vec![Host::Absolute(format!(
            "{}.service.{}.consul",
            map_dns_name(name),
            map_dns_name(&datacenter)
        ))];
    }
    service.ports = ports;
    service.endpoints = endpoints;
    // Consul has no service object: the service is as old as its oldest registration still
    // there (any kind, filtered or not, so health and tag filters do not re-date it).
    service.creation_order = entries
        .iter()
        .filter_map(|e| e.service.create_index)
        .min()
        .map(CreationOrder::new);
    service.location = if external {
        Location::External
    } else {
        Location::Internal
    };
    service
        .annotations
        .insert("consul.hashicorp.com/service-name".into(), name.to_string());
    if !datacenter.is_empty() {
        service
            .annotations
            .insert("consul.hashicorp.com/datacenter".into(), datacenter);
    }
    Converted {
        service: Some(service),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ConvertSettings {
        ConvertSettings {
            include_warning: false,
            tags: vec![],
            default_protocol: None,
            host_datacenter: false,
        }
    }

    fn mk_entry(id: &str, addr: &str, port: u32, status: &str) -> HealthEntry {
        HealthEntry {
            node: Node {
                node: "n1".into(),
                address: "10.9.9.9".into(),
                datacenter: "dc1".into(),
            },
            service: Instance {
                id: id.into(),
                service: "web".into(),
                tags: Some(vec!["version|v1".into(), "env=prod".into(), "plain".into()]),
                address: addr.into(),
                meta: Some([("protocol".to_string(), "http".to_string())].into()),
                port,
                weights: Some(Weights {
                    passing: 3,
                    warning: 1,
                }),
                kind: None,
                create_index: None,
            },
            checks: vec![
                Check {
                    status: "passing".into(),
                },
                Check {
                    status: status.into(),
                },
            ],
        }
    }

    #[test]
    fn converts_like_istio_did() {
        let c = convert(
            "web",
            &[
                mk_entry("w1", "10.0.0.1", 8080, "passing"),
                mk_entry("w2", "", 8080, "passing"),
            ],
            &settings(),
        );
        let s = c.service.expect("served");
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!(s.hosts, vec![Host::Relative("web".into())]);
        assert_eq!(s.ports.len(), 1);
        assert_eq!(s.ports[0].name, "http-8080");
        assert_eq!(s.ports[0].protocol.as_deref(), Some("HTTP"));
        let addrs: Vec<_> = s.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(
            addrs,
            vec!["10.0.0.1", "10.9.9.9"],
            "node address when the service has none"
        );
        let ep = &s.endpoints[0];
        assert_eq!(ep.labels.get("version"), Some("v1"));
        assert_eq!(ep.labels.get("env"), Some("prod"));
        assert_eq!(ep.labels.get("protocol"), Some("http"));
        assert!(!ep.labels.contains_key("plain"));
        assert_eq!(
            ep.labels.get("consul.hashicorp.com/tag-plain"),
            Some("true"),
            "a plain tag is a label a subset can select"
        );
        assert_eq!(ep.locality.as_deref(), Some("dc1"));
        assert_eq!(ep.weight, Some(3));
        assert_eq!(s.location, Location::Internal);
    }

    #[test]
    fn health_filter_and_warning_flag() {
        let entries = [
            mk_entry("ok", "10.0.0.1", 80, "passing"),
            mk_entry("warn", "10.0.0.2", 80, "warning"),
            mk_entry("bad", "10.0.0.3", 80, "critical"),
        ];
        let s = convert("web", &entries, &settings())
            .service
            .expect("served");
        assert_eq!(s.endpoints.len(), 1);
        let mut with_warning = settings();
        with_warning.include_warning = true;
        let s = convert("web", &entries, &with_warning)
            .service
            .expect("served");
        assert_eq!(s.endpoints.len(), 2);
        assert_eq!(s.endpoints[1].weight, Some(1), "warning weight");
    }

    #[test]
    fn all_unhealthy_is_emitted_without_endpoints() {
        let entries = [mk_entry("bad", "10.0.0.3", 80, "critical")];
        let kept = convert("web", &entries, &settings()).service.expect("kept");
        assert!(kept.endpoints.is_empty());
        assert_eq!(kept.ports.len(), 1, "ports stay so the host does not flap");
    }

    #[test]
    fn ports_are_all_distinct_ports_deterministically() {
        let mut a = mk_entry("a", "10.0.0.1", 9090, "passing");
        a.service.meta = Some([("protocol".to_string(), "grpc".to_string())].into());
        let b = mk_entry("b", "10.0.0.2", 8080, "passing");
        let one = convert("web", &[a.clone(), b.clone()], &settings())
            .service
            .expect("served");
        let two = convert("web", &[b, a], &settings())
            .service
            .expect("served");
        assert_eq!(one.ports, two.ports);
        let names: Vec<_> = one.ports.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, vec!["http-8080", "grpc-9090"]);
        // Each instance is reached on its own port whatever service port is used.
        let ep_b = one
            .endpoints
            .iter()
            .find(|e| e.address == "10.0.0.2")
            .expect("b");
        assert_eq!(ep_b.ports.get("grpc-9090"), Some(&8080));
        assert!(!ep_b.ports.contains_key("http-8080"));
    }

    #[test]
    fn skips_proxies_bad_instances_and_applies_tag_filter() {
        let mut proxy = mk_entry("p", "10.0.0.5", 21000, "passing");
        proxy.service.kind = Some("connect-proxy".into());
        let bad_addr = mk_entry("h", "web.local", 80, "passing");
        let mut bad_proto = mk_entry("x", "10.0.0.6", 80, "passing");
        bad_proto.service.meta = Some([("protocol".to_string(), "dubbo".to_string())].into());
        let c = convert("web", &[proxy.clone(), bad_addr, bad_proto], &settings());
        let s = c.service.expect("served");
        assert_eq!(s.endpoints.len(), 1);
        assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
        assert!(c.problems[0].contains("instance h on node n1"));
        assert!(
            convert("web", &[proxy], &settings()).service.is_none(),
            "only proxies: not a service"
        );

        let mut tagged = settings();
        tagged.tags = vec!["env=prod".into()];
        assert!(
            convert("web", &[mk_entry("a", "10.0.0.1", 80, "passing")], &tagged)
                .service
                .is_some()
        );
        tagged.tags = vec!["canary".into()];
        assert!(
            convert("web", &[mk_entry("a", "10.0.0.1", 80, "passing")], &tagged)
                .service
                .is_none()
        );
    }

    #[test]
    fn external_and_datacenter_hosts() {
        let mut e = mk_entry("a", "10.0.0.1", 80, "passing");
        e.service.meta = Some([("external".to_string(), "true".to_string())].into());
        let mut s = settings();
        s.host_datacenter = true;
        let svc = convert("My_Web", &[e], &s).service.expect("served");
        assert_eq!(svc.location, Location::External);
        assert_eq!(
            svc.hosts,
            vec![Host::Absolute("my-web.service.dc1.consul".into())]
        );
        assert_eq!(svc.ports[0].name, "port-80");
        assert_eq!(svc.ports[0].protocol, None);
    }

    #[test]
    fn decodes_consul_json() {
        let json = r#"[{"Node":{"ID":"x","Node":"n1","Address":"127.0.0.1","Datacenter":"dc1","TaggedAddresses":{"lan":"127.0.0.1"},"Meta":{},"CreateIndex":5,"ModifyIndex":5},
          "Service":{"ID":"web-1","Service":"web","Tags":null,"Address":"","Meta":null,"Port":8080,"Weights":{"Passing":1,"Warning":1},"EnableTagOverride":false,"Proxy":{},"Connect":{},"CreateIndex":9,"ModifyIndex":9},
          "Checks":[{"Node":"n1","CheckID":"serfHealth","Name":"Serf","Status":"passing","Notes":"","Output":"","ServiceID":"","ServiceName":"","ServiceTags":[]}]}]"#;
        let entries: Vec<HealthEntry> = serde_json::from_str(json).expect("decodes");
        let s = convert("web", &entries, &settings())
            .service
            .expect("served");
        assert_eq!(s.endpoints[0].address, "127.0.0.1");
        assert_eq!(s.endpoints[0].weight, Some(1));
        assert_eq!(
            s.creation_order,
            Some(CreationOrder::new(9)),
            "the instance's CreateIndex"
        );
    }
}
