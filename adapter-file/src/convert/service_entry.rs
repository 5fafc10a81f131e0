//! Istio ServiceEntry document -> [`Service`].

use mcp_core::model::{Endpoint, Host, Location, Port, Resolution, Service, ServiceKey};
use yaml_serde::Value;

use super::de::{str_field, typed};
use super::istio::{ServiceEntryDoc, ISTIO_API_VERSIONS};
use super::time::parse_rfc3339;
use super::{ConvertError, DocRef};

pub(super) fn service_entry(doc: DocRef<'_>, value: Value) -> Result<Service, ConvertError> {
    // Name the resource in every error, even about fields deserialized before `metadata`.
    let resource = str_field(&value, &["metadata", "name"]).map(|name| {
        match str_field(&value, &["metadata", "namespace"]) {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_owned(),
        }
    });
    let at = doc.describe("ServiceEntry", resource.as_deref());
    match str_field(&value, &["apiVersion"]) {
        Some(v) if ISTIO_API_VERSIONS.contains(&v) => {}
        Some(v) => {
            return Err(doc.invalid(
                at,
                "apiVersion",
                format!(
                    "unsupported apiVersion `{v}` for ServiceEntry (expected one of {})",
                    ISTIO_API_VERSIONS.join(", ")
                ),
            ))
        }
        None => return Err(doc.invalid(at, "apiVersion", "missing field `apiVersion`")),
    }
    let se: ServiceEntryDoc = typed(doc, &at, "", value)?;
    let key = match se.metadata.namespace {
        Some(ns) => ServiceKey::namespaced(ns, se.metadata.name),
        None => ServiceKey::new(se.metadata.name),
    };
    let at = doc.describe("ServiceEntry", Some(&key.to_string()));
    let spec = se.spec;
    if spec.hosts.is_empty() {
        return Err(doc.invalid(at, "spec.hosts", "must list at least one host"));
    }
    let create_time = match se.metadata.creation_timestamp {
        None => None,
        Some(ts) => Some(parse_rfc3339(&ts).ok_or_else(|| {
            doc.invalid(
                at.clone(),
                "metadata.creationTimestamp",
                format!("`{ts}` is not an RFC 3339 time (e.g. 2024-05-01T12:00:00Z)"),
            )
        })?),
    };
    let mut service = Service::new(key, at);
    service.hosts = spec.hosts.into_iter().map(Host::Absolute).collect();
    service.addresses = spec.addresses;
    service.ports = spec
        .ports
        .into_iter()
        .map(|p| Port {
            number: p.number,
            name: p.name,
            protocol: p.protocol,
            target_port: p.target_port,
        })
        .collect();
    service.location = spec.location.map_or(Location::Internal, Location::from);
    service.resolution = spec.resolution.map_or(Resolution::None, Resolution::from);
    service.endpoints = spec.endpoints.into_iter().map(Endpoint::from).collect();
    service.export_to = spec.export_to;
    service.subject_alt_names = spec.subject_alt_names;
    service.workload_selector = spec.workload_selector.map(|w| w.labels);
    service.labels = se.metadata.labels;
    service.annotations = se.metadata.annotations;
    service.create_time = create_time;
    // Who keeps a contested virtual IP: the document's creationTimestamp when it has one, else
    // key order. Not its file or position: moving a document would move its address.
    service.creation_order = create_time.map(mcp_core::CreationOrder::of_time);
    Ok(service)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use mcp_core::model::{Endpoint, Host, Location, Port, Resolution, Service, ServiceKey};

    use crate::convert::test_support::{err, labels};
    use crate::convert::{parse, Format};

    const FULL_SE_YAML: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: payments
  namespace: shop
  labels: {team: pay}
  annotations: {note: hi}
  creationTimestamp: "2024-01-02T03:04:05Z"
  uid: ignored-metadata-field
spec:
  hosts: [payments.shop.internal]
  addresses: [10.1.0.0/24]
  ports:
    - {number: 8080, protocol: HTTP, name: http, targetPort: 18080}
    - {number: 9090, protocol: GRPC, name: grpc-api}
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints:
    - address: 10.0.0.1
      ports: {http: 8081}
      labels: {version: v1}
      network: net1
      locality: eu/west-1
      weight: 10
      serviceAccount: payments
  exportTo: ["."]
  subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/payments"]
  workloadSelector:
    labels: {app: payments}
status: {}
"#;

    fn expected_full(origin: &str) -> Service {
        let mut s = Service::new(ServiceKey::namespaced("shop", "payments"), origin);
        s.hosts = vec![Host::Absolute("payments.shop.internal".into())];
        s.addresses = vec!["10.1.0.0/24".into()];
        s.ports = vec![
            Port {
                number: 8080,
                name: "http".into(),
                protocol: Some("HTTP".into()),
                target_port: Some(18080),
            },
            Port {
                number: 9090,
                name: "grpc-api".into(),
                protocol: Some("GRPC".into()),
                target_port: None,
            },
        ];
        s.location = Location::External;
        s.resolution = Resolution::Static;
        s.endpoints = vec![Endpoint {
            address: "10.0.0.1".into(),
            ports: [("http".to_owned(), 8081)].into_iter().collect(),
            labels: labels(&[("version", "v1")]).into(),
            network: Some("net1".into()),
            locality: Some("eu/west-1".into()),
            weight: Some(10),
            service_account: Some("payments".into()),
        }];
        s.export_to = vec![".".into()];
        s.subject_alt_names = vec!["spiffe://cluster.local/ns/shop/sa/payments".into()];
        s.workload_selector = Some(labels(&[("app", "payments")]));
        s.labels = labels(&[("team", "pay")]);
        s.annotations = labels(&[("note", "hi")]);
        s.create_time = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_164_645));
        s.creation_order = Some(mcp_core::CreationOrder::new(1_704_164_645_000));
        s
    }

    #[test]
    fn full_service_entry_yaml() {
        let services = parse("a.yaml", FULL_SE_YAML, Format::Yaml).expect("parses");
        let want = expected_full("file a.yaml, document 1 (ServiceEntry shop/payments)");
        assert_eq!(services, vec![want]);
    }

    #[test]
    fn full_service_entry_json_matches_yaml() {
        let value: yaml_serde::Value = yaml_serde::from_str(FULL_SE_YAML).expect("yaml");
        let json = serde_json::to_string_pretty(&value).expect("json");
        let services = parse("a.json", &json, Format::Json).expect("parses");
        let want = expected_full("file a.json, document 1 (ServiceEntry shop/payments)");
        assert_eq!(services, vec![want]);
    }

    #[test]
    fn error_names_document_resource_and_field() {
        let yaml = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ok}
spec: {hosts: [ok.example.com]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: payments, namespace: default}
spec:
  hosts: [payments.example.com]
  ports: [{number: eighty, name: http}]
"#;
        let e = err("shop.yaml", yaml, Format::Yaml);
        assert!(e.contains("file shop.yaml"), "{e}");
        assert!(e.contains("document 2"), "{e}");
        assert!(e.contains("ServiceEntry default/payments"), "{e}");
        assert!(e.contains("spec.ports[0].number"), "{e}");
    }

    #[test]
    fn unknown_field_is_an_error() {
        let yaml = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web}
spec:
  hosts: [web.example.com]
  prots: []
"#;
        let e = err("u.yaml", yaml, Format::Yaml);
        assert!(e.contains("unknown field `prots`"), "{e}");
        assert!(e.contains("spec"), "{e}");
    }

    #[test]
    fn missing_and_empty_hosts_are_errors() {
        let yaml = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: a}\nspec: {}\n";
        let e = err("h.yaml", yaml, Format::Yaml);
        assert!(e.contains("missing field `hosts`"), "{e}");
        let yaml = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: a}\nspec: {hosts: []}\n";
        let e = err("h.yaml", yaml, Format::Yaml);
        assert!(e.contains("spec.hosts: must list at least one host"), "{e}");
    }
}
