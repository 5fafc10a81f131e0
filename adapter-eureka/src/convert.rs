//! One Eureka app (its instances as the local registry holds them) -> one model service.
//!
//! Host from the first `vipAddress` (extra VIPs are extra hosts), else the app name with
//! `--host-suffix`; a VIP with a dot is a complete host name, one without is a registry name the
//! suffix completes. Only instances whose effective status is UP become endpoints; the service
//! is still emitted when none is, so that the core's `--on-empty` policy decides.
//!
//! Creation time: the earliest [`Instance::known_since`] among the app's instances (every status,
//! so that an instance going DOWN moves nothing). Eureka has no time for an app itself, and an
//! app exists exactly while it has instances: it is as old as its oldest instance. Every replica
//! reading the same server computes the same time, a restart computes it again, and it changes
//! only when the oldest instance leaves (the same rule as adapter-zookeeper's). The times are the
//! serving server's clock: replicas reading different servers of a Eureka cluster may differ by
//! the replication delay.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use mcp_core::translate::naming::canonical_protocol;
use mcp_core::{Endpoint, Host, Port, Service, ServiceKey, SharedStr};

use crate::dto::Instance;

/// Port names when metadata names none.
const HTTP: &str = "http";
const HTTPS: &str = "https";

/// What converting one app gave: the service (none when the app has no instance) and one line
/// per skipped instance.
#[derive(Debug, Default)]
pub struct Converted {
    /// The service.
    pub service: Option<Service>,
    /// Skipped instances, naming app and instance id.
    pub problems: Vec<String>,
}

/// Converts app `name` with `instances` (all statuses).
pub fn convert_app(name: &str, instances: &BTreeMap<String, Instance>) -> Converted {
    let mut out = Converted::default();
    if instances.is_empty() {
        return out;
    }
    let key_name = name.to_lowercase();
    let mut svc = Service::new(
        ServiceKey::new(key_name.clone()),
        format!("eureka app {name}"),
    );
    svc.hosts = hosts(&key_name, instances);
    svc.create_time = instances.values().filter_map(Instance::known_since).min();
    // Who keeps a contested virtual IP: the app known longest (its oldest instance's time).
    svc.creation_order = svc.create_time.map(mcp_core::CreationOrder::of_time);

    let up: Vec<(&String, &Instance)> = instances
        .iter()
        .filter(|(_, i)| i.effective_status() == "UP")
        .collect();
    // Service ports come from the UP instances (or, with none UP, from every instance, so the
    // entry keeps its shape while it scales through zero); the first one seen fixes a number.
    let port_source: Vec<&Instance> = if up.is_empty() {
        instances.values().collect()
    } else {
        up.iter().map(|(_, i)| *i).collect()
    };
    let mut ports: BTreeMap<String, Port> = BTreeMap::new();
    for inst in &port_source {
        for (pname, number, protocol) in instance_ports(inst) {
            ports.entry(pname.clone()).or_insert(Port {
                number,
                name: pname,
                protocol,
                target_port: None,
            });
        }
    }

    for (id, inst) in up {
        let address = match inst.ip_addr.trim().parse::<IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => {
                out.problems.push(format!(
                    "app {name} instance {id}: ipAddr {:?} is not an IP address",
                    inst.ip_addr
                ));
                continue;
            }
        };
        let meta = inst.metadata_strings();
        let mut ep = Endpoint {
            address,
            ..Endpoint::default()
        };
        for (pname, number, _) in instance_ports(inst) {
            if ports.get(&pname).is_some_and(|p| p.number != number) {
                ep.ports.insert(pname, number);
            }
        }
        ep.weight = meta
            .get("weight")
            .and_then(|w| w.trim().parse::<u32>().ok());
        ep.locality = locality(inst, &meta).map(SharedStr::from);
        ep.labels = meta.into();
        svc.endpoints.push(ep);
    }
    svc.endpoints
        .sort_by(|a, b| a.address.cmp(&b.address).then(a.ports.cmp(&b.ports)));
    svc.ports = ports.into_values().collect();
    svc.ports.sort_by_key(|p| p.number);
    out.service = Some(svc);
    out
}

/// Hosts of an app: the VIPs of the first instance (by id) that has any, else the app name.
fn hosts(key_name: &str, instances: &BTreeMap<String, Instance>) -> Vec<Host> {
    let vips = instances
        .values()
        .filter_map(|i| i.vip_address.as_deref())
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_lowercase())
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
        })
        .find(|v| !v.is_empty());
    match vips {
        None => vec![Host::Relative(key_name.to_string())],
        Some(vips) => {
            let mut seen = BTreeSet::new();
            vips.into_iter()
                .filter(|v| seen.insert(v.clone()))
                .map(|v| {
                    if v.contains('.') {
                        Host::Absolute(v)
                    } else {
                        Host::Relative(v)
                    }
                })
                .collect()
        }
    }
}

/// (name, number, protocol) of an instance's enabled ports. Names `http`/`https` unless
/// metadata `port.name` / `securePort.name` says otherwise; protocol from metadata `protocol`
/// (or `istio.protocol`) for the plain port, default HTTP; TLS for the secure port unless
/// `securePort.protocol` says otherwise.
fn instance_ports(inst: &Instance) -> Vec<(String, u32, Option<String>)> {
    let meta = inst.metadata_strings();
    let proto = |key: &str| {
        meta.get(key)
            .and_then(|p| canonical_protocol(p))
            .map(str::to_string)
    };
    let mut out = Vec::new();
    if let Some(n) = enabled_port(inst.port.as_ref()) {
        let name = meta
            .get("port.name")
            .cloned()
            .unwrap_or_else(|| HTTP.into());
        let protocol = proto("protocol")
            .or_else(|| proto("istio.protocol"))
            .or_else(|| Some("HTTP".into()));
        out.push((name, n, protocol));
    }
    if let Some(n) = enabled_port(inst.secure_port.as_ref()) {
        let name = meta
            .get("securePort.name")
            .cloned()
            .unwrap_or_else(|| HTTPS.into());
        let protocol = proto("securePort.protocol").or_else(|| Some("TLS".into()));
        out.push((name, n, protocol));
    }
    out
}

fn enabled_port(p: Option<&crate::dto::PortInfo>) -> Option<u32> {
    p.filter(|p| p.enabled)
        .and_then(|p| p.port)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| (1..=65535).contains(n))
}

/// `region/zone` from Amazon data-center info (`us-east-1a` is in region `us-east-1`), else
/// metadata `zone` as given.
fn locality(inst: &Instance, meta: &BTreeMap<String, String>) -> Option<String> {
    let amazon_zone = inst
        .data_center_info
        .as_ref()
        .filter(|d| d.name == "Amazon")
        .and_then(|d| d.metadata.get("availability-zone"))
        .map(crate::dto::value_string)
        .filter(|z| !z.is_empty());
    if let Some(zone) = amazon_zone {
        let region = zone.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        return Some(if region.is_empty() || region == zone {
            zone
        } else {
            format!("{region}/{zone}")
        });
    }
    meta.get("zone").filter(|z| !z.is_empty()).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dto::{DataCenterInfo, PortInfo};

    fn inst(id: &str, ip: &str, status: &str, port: u64) -> Instance {
        Instance {
            instance_id: Some(id.into()),
            host_name: id.into(),
            app: "ORDERS".into(),
            ip_addr: ip.into(),
            status: status.into(),
            port: Some(PortInfo {
                port: Some(port),
                enabled: true,
            }),
            vip_address: Some("orders".into()),
            ..Instance::default()
        }
    }

    fn map(list: Vec<Instance>) -> BTreeMap<String, Instance> {
        list.into_iter().map(|i| (i.id(), i)).collect()
    }

    #[test]
    fn up_only_with_problems_for_bad_ips() {
        let mut down = inst("d", "10.0.0.3", "UP", 8080);
        down.overridden_status = Some("OUT_OF_SERVICE".into());
        let c = convert_app(
            "ORDERS",
            &map(vec![
                inst("a", "10.0.0.1", "UP", 8080),
                inst("b", "10.0.0.2", "UP", 9090),
                inst("bad", "not-an-ip", "UP", 8080),
                inst("c", "10.0.0.4", "DOWN", 8080),
                down,
            ]),
        );
        let svc = c.service.expect("service");
        assert_eq!(svc.key.name, "orders");
        assert_eq!(svc.hosts, vec![Host::Relative("orders".into())]);
        let addrs: Vec<_> = svc.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addrs, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(svc.ports.len(), 1);
        assert_eq!(svc.ports[0].number, 8080);
        assert_eq!(svc.ports[0].protocol.as_deref(), Some("HTTP"));
        assert_eq!(svc.endpoints[1].ports.get("http"), Some(&9090));
        assert_eq!(c.problems.len(), 1);
        assert!(c.problems[0].contains("ORDERS") && c.problems[0].contains("bad"));
    }

    #[test]
    fn metadata_vips_and_locality() {
        let mut i = inst("a", "10.0.0.1", "UP", 8080);
        i.vip_address = Some("Orders.example.com, orders-v2".into());
        i.secure_port = Some(PortInfo {
            port: Some(8443),
            enabled: true,
        });
        i.metadata = [
            ("protocol".to_string(), serde_json::json!("grpc")),
            ("weight".to_string(), serde_json::json!("7")),
        ]
        .into();
        i.data_center_info = Some(DataCenterInfo {
            name: "Amazon".into(),
            metadata: [(
                "availability-zone".to_string(),
                serde_json::json!("us-east-1a"),
            )]
            .into(),
        });
        let svc = convert_app("ORDERS", &map(vec![i])).service.expect("svc");
        assert_eq!(
            svc.hosts,
            vec![
                Host::Absolute("orders.example.com".into()),
                Host::Relative("orders-v2".into())
            ]
        );
        assert_eq!(svc.ports[0].protocol.as_deref(), Some("GRPC"));
        assert_eq!(svc.ports[1].protocol.as_deref(), Some("TLS"));
        assert_eq!(svc.endpoints[0].weight, Some(7));
        assert_eq!(
            svc.endpoints[0].locality.as_deref(),
            Some("us-east-1/us-east-1a")
        );
        assert_eq!(svc.endpoints[0].labels.get("protocol"), Some("grpc"));
    }

    #[test]
    fn created_when_its_oldest_instance_was_first_known() {
        let leased = |id: &str, status: &str, registered: u64, up: u64| {
            let mut i = inst(id, "10.0.0.1", status, 8080);
            i.lease_info = Some(crate::dto::LeaseInfo {
                registration_timestamp: Some(registered),
                service_up_timestamp: Some(up),
            });
            i
        };
        let ms = |s: &Service| {
            s.create_time.map(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .expect("after")
                    .as_millis()
            })
        };
        let mut all = map(vec![
            leased("a", "UP", 5_000, 5_001),
            // Re-registered at 9000, UP since 2000: known since 2000.
            leased("b", "UP", 9_000, 2_000),
            // Oldest, DOWN and never UP: its registration; still counts (health does not
            // move the time).
            leased("c", "DOWN", 1_000, 0),
        ]);
        let svc = convert_app("ORDERS", &all).service.expect("svc");
        assert_eq!(ms(&svc), Some(1_000));
        // A new instance or another's re-registration changes nothing.
        all.insert("d".into(), leased("d", "UP", 20_000, 20_000));
        all.insert("b".into(), leased("b", "UP", 30_000, 2_000));
        assert_eq!(
            ms(&convert_app("ORDERS", &all).service.expect("svc")),
            Some(1_000)
        );
        // The oldest leaves: the next oldest.
        all.remove("c");
        assert_eq!(
            ms(&convert_app("ORDERS", &all).service.expect("svc")),
            Some(2_000)
        );
        // No lease info (an old server): none, the core's fixed time.
        let none = convert_app("ORDERS", &map(vec![inst("x", "10.0.0.1", "UP", 80)]));
        assert_eq!(none.service.expect("svc").create_time, None);
    }

    #[test]
    fn no_up_instance_keeps_an_empty_service() {
        let c = convert_app("ORDERS", &map(vec![inst("c", "10.0.0.4", "DOWN", 8080)]));
        let svc = c.service.expect("emitted; the core applies --on-empty");
        assert!(svc.endpoints.is_empty());
        assert_eq!(svc.ports.len(), 1);
    }
}
