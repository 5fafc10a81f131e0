//! ServiceEntry specs as Istio JSON: what `mcpctl` prints and what the Kubernetes output applies,
//! so both show a sink exactly what MCP sends.
//!
//! The JSON follows protojson (what `istioctl`, Istio's config store and the `adsc-watch` test
//! peer print): lowerCamelCase field names, enum names as strings, and fields at their zero
//! value omitted. That includes the zero enum values, so `location: MESH_EXTERNAL` and
//! `resolution: NONE` do not appear, exactly as protojson renders them; spec JSON can therefore be
//! compared directly with what a Go client prints, and a spec applied to the API server comes back
//! unchanged (Istio's CRDs default nothing).

use std::collections::BTreeMap;

use proto::istio::networking::v1alpha3::service_entry::{Location, Resolution};
use proto::istio::networking::v1alpha3::{ServiceEntry, WorkloadEntry};
use serde_json::{json, Map, Value};

/// `apiVersion` of rendered objects.
pub const API_VERSION: &str = "networking.istio.io/v1";

/// The name of a `location` value; unknown numbers print as numbers, as protojson does.
pub fn location_name(v: i32) -> String {
    Location::try_from(v)
        .map(|l| l.as_str_name().to_string())
        .unwrap_or_else(|_| v.to_string())
}

/// The name of a `resolution` value; unknown numbers print as numbers, as protojson does.
pub fn resolution_name(v: i32) -> String {
    Resolution::try_from(v)
        .map(|r| r.as_str_name().to_string())
        .unwrap_or_else(|_| v.to_string())
}

/// protojson prints an unknown enum number as a JSON number, a known one as its name.
fn enum_json(name: String, v: i32) -> Value {
    if name == v.to_string() {
        Value::from(v)
    } else {
        Value::String(name)
    }
}

fn put_strings(m: &mut Map<String, Value>, key: &str, v: &[String]) {
    if !v.is_empty() {
        m.insert(key.to_string(), json!(v));
    }
}

fn put_str(m: &mut Map<String, Value>, key: &str, v: &str) {
    if !v.is_empty() {
        m.insert(key.to_string(), Value::String(v.to_string()));
    }
}

fn put_u32(m: &mut Map<String, Value>, key: &str, v: u32) {
    if v != 0 {
        m.insert(key.to_string(), Value::from(v));
    }
}

/// A protobuf map as a JSON object with sorted keys (sorting keeps output stable whichever map
/// type the generated code uses).
fn put_map<'a, V, I>(m: &mut Map<String, Value>, key: &str, v: I)
where
    V: Clone + Into<Value> + 'a,
    I: IntoIterator<Item = (&'a String, &'a V)>,
{
    let sorted: BTreeMap<&String, &V> = v.into_iter().collect();
    if !sorted.is_empty() {
        let obj: Map<String, Value> = sorted
            .into_iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        m.insert(key.to_string(), Value::Object(obj));
    }
}

fn endpoint_json(e: &WorkloadEntry) -> Value {
    let mut m = Map::new();
    put_str(&mut m, "address", &e.address);
    put_map(&mut m, "ports", &e.ports);
    put_map(&mut m, "labels", &e.labels);
    put_str(&mut m, "network", &e.network);
    put_str(&mut m, "locality", &e.locality);
    put_u32(&mut m, "weight", e.weight);
    put_str(&mut m, "serviceAccount", &e.service_account);
    Value::Object(m)
}

/// The spec as Istio JSON (see the module docs for the protojson conventions).
pub fn spec_json(spec: &ServiceEntry) -> Value {
    let mut m = Map::new();
    put_strings(&mut m, "hosts", &spec.hosts);
    put_strings(&mut m, "addresses", &spec.addresses);
    if !spec.ports.is_empty() {
        let ports = spec
            .ports
            .iter()
            .map(|p| {
                let mut pm = Map::new();
                put_u32(&mut pm, "number", p.number);
                put_str(&mut pm, "protocol", &p.protocol);
                put_str(&mut pm, "name", &p.name);
                put_u32(&mut pm, "targetPort", p.target_port);
                Value::Object(pm)
            })
            .collect();
        m.insert("ports".to_string(), Value::Array(ports));
    }
    if spec.location != 0 {
        let v = enum_json(location_name(spec.location), spec.location);
        m.insert("location".to_string(), v);
    }
    if spec.resolution != 0 {
        let v = enum_json(resolution_name(spec.resolution), spec.resolution);
        m.insert("resolution".to_string(), v);
    }
    if !spec.endpoints.is_empty() {
        let eps = spec.endpoints.iter().map(endpoint_json).collect();
        m.insert("endpoints".to_string(), Value::Array(eps));
    }
    put_strings(&mut m, "exportTo", &spec.export_to);
    put_strings(&mut m, "subjectAltNames", &spec.subject_alt_names);
    if let Some(ws) = &spec.workload_selector {
        // protojson prints a present message even when empty.
        let mut wm = Map::new();
        put_map(&mut wm, "labels", &ws.labels);
        m.insert("workloadSelector".to_string(), Value::Object(wm));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::filled_service_entry as filled;

    #[test]
    fn spec_json_of_filled_entry() {
        let want = json!({
            "hosts": ["api.example.com", "api2.example.com"],
            "addresses": ["10.0.0.1/32"],
            "ports": [
                {"number": 443, "protocol": "TLS", "name": "tls", "targetPort": 8443},
                {"number": 80, "protocol": "HTTP", "name": "http"}
            ],
            "location": "MESH_INTERNAL",
            "resolution": "DNS_ROUND_ROBIN",
            "endpoints": [
                {
                    "address": "1.2.3.4",
                    "ports": {"http": 8080, "tls": 9443},
                    "labels": {"zone": "a"},
                    "network": "net1",
                    "locality": "us/east",
                    "weight": 7,
                    "serviceAccount": "sa"
                },
                {"address": "5.6.7.8"}
            ],
            "exportTo": ["."],
            "subjectAltNames": ["spiffe://x"],
            "workloadSelector": {"labels": {"app": "db"}}
        });
        assert_eq!(spec_json(&filled()), want);
    }

    #[test]
    fn spec_json_omits_zero_values() {
        assert_eq!(spec_json(&ServiceEntry::default()), json!({}));
        let se = ServiceEntry {
            hosts: vec!["h".into()],
            location: Location::MeshExternal as i32,
            resolution: Resolution::None as i32,
            ..Default::default()
        };
        assert_eq!(spec_json(&se), json!({"hosts": ["h"]}));
    }

    #[test]
    fn enum_names() {
        let names: Vec<String> = (0..5).map(resolution_name).collect();
        assert_eq!(
            names,
            ["NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN", "DYNAMIC_DNS"]
        );
        assert_eq!(location_name(0), "MESH_EXTERNAL");
        assert_eq!(location_name(1), "MESH_INTERNAL");
        assert_eq!(resolution_name(42), "42");
        let se = ServiceEntry {
            resolution: 42,
            location: 1,
            ..Default::default()
        };
        assert_eq!(
            spec_json(&se),
            json!({"location": "MESH_INTERNAL", "resolution": 42})
        );
    }
}
