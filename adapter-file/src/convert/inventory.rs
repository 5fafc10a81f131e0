//! Inventory document -> [`Service`]s, including the `address:port` endpoint shorthand and
//! protocols derived from port names.

use mcp_core::model::{Endpoint, Host, Location, Port, Resolution, Service, ServiceKey};
use yaml_serde::Value;

use super::address::split_host_port;
use super::de::{str_field, typed};
use super::inventory_format::{InventoryDoc, InventoryService, INVENTORY_API_VERSION};
use super::istio::EndpointSpec;
use super::protocol::protocol_from_name;
use super::stream::Converted;
use super::{ConvertError, DocRef};

pub(super) fn inventory(doc: DocRef<'_>, value: Value) -> Result<Vec<Service>, ConvertError> {
    let inv = inventory_doc(doc, value)?;
    inv.services
        .into_iter()
        .enumerate()
        .map(|(i, value)| inventory_service(doc, inv.namespace.as_deref(), i, value))
        .collect()
}

/// The document's own fields, checked.
fn inventory_doc(doc: DocRef<'_>, value: Value) -> Result<InventoryDoc, ConvertError> {
    let at = doc.to_string();
    let inv: InventoryDoc = typed(doc, &at, "", value)?;
    if let Some(v) = inv.api_version.as_deref() {
        if v != INVENTORY_API_VERSION {
            return Err(doc.invalid(
                at,
                "apiVersion",
                format!(
                    "unsupported apiVersion `{v}` for Inventory (expected {INVENTORY_API_VERSION})"
                ),
            ));
        }
    }
    Ok(inv)
}

/// An inventory whose `services` were converted as they were read (without a namespace, which
/// may come after them): checks the document's other fields, then puts the services in its
/// namespace, or reports the first service's error as [`inventory`] would have.
pub(super) fn inventory_streamed(
    doc: DocRef<'_>,
    value: Value,
    converted: Converted,
) -> Result<Vec<Service>, ConvertError> {
    let inv = inventory_doc(doc, value)?;
    let namespace = inv.namespace.as_deref();
    if let Some((mut e, name)) = converted.error {
        if let (ConvertError::Invalid { at, .. }, Some(ns)) = (&mut e, namespace) {
            // Every error of a service names it as `namespace/name` once its name is known.
            *at = doc.describe("Inventory", name.map(|n| format!("{ns}/{n}")).as_deref());
        }
        return Err(e);
    }
    let mut services = converted.services;
    if let Some(ns) = namespace {
        for service in &mut services {
            service.key.namespace = Some(ns.to_owned());
            service.origin = doc.describe("Inventory", Some(&service.key.to_string()));
        }
    }
    Ok(services)
}

/// One element of `services`, named in errors as `namespace/name` when it has a string `name`.
pub(super) fn inventory_service(
    doc: DocRef<'_>,
    namespace: Option<&str>,
    index: usize,
    value: Value,
) -> Result<Service, ConvertError> {
    let prefix = format!("services[{index}]");
    let key_text = |name: &str| match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    };
    let named = str_field(&value, &["name"]).map(key_text);
    let at = doc.describe("Inventory", named.as_deref());
    let inv: InventoryService = typed(doc, &at, &prefix, value)?;
    let key = match namespace {
        Some(ns) => ServiceKey::namespaced(ns, inv.name),
        None => ServiceKey::new(inv.name),
    };
    let at = doc.describe("Inventory", Some(&key.to_string()));
    let mut service = Service::new(key, at.clone());
    if !inv.hosts.is_empty() {
        service.hosts = inv.hosts.into_iter().map(Host::Absolute).collect();
    }
    service.addresses = inv.addresses;
    service.ports = inv
        .ports
        .into_iter()
        .map(|(name, number)| Port {
            number,
            protocol: protocol_from_name(&name).map(str::to_owned),
            name,
            target_port: None,
        })
        .collect();
    service.labels = inv.labels;
    service.annotations = inv.annotations;
    service.location = inv.location.map_or(Location::Internal, Location::from);
    service.resolution = inv.resolution.map_or(Resolution::Static, Resolution::from);
    service.export_to = inv.export_to;
    for (j, value) in inv.endpoints.into_iter().enumerate() {
        let path = format!("{prefix}.endpoints[{j}]");
        let endpoint = match value {
            Value::String(address) => inventory_endpoint(
                doc,
                &at,
                &path,
                &service.ports,
                EndpointSpec {
                    address,
                    ..EndpointSpec::default()
                },
            )?,
            Value::Mapping(_) => {
                let e: EndpointSpec = typed(doc, &at, &path, value)?;
                inventory_endpoint(doc, &at, &path, &service.ports, e)?
            }
            _ => {
                return Err(doc.invalid(
                    at,
                    &path,
                    "expected `address`, `address:port` or a mapping with `address`",
                ))
            }
        };
        service.endpoints.push(endpoint);
    }
    Ok(service)
}

/// Applies the `address:port` shorthand: the port belongs to the service's only port, and is
/// recorded on the endpoint only when it differs from the service port (as Istio expects).
fn inventory_endpoint(
    doc: DocRef<'_>,
    at: &str,
    path: &str,
    ports: &[Port],
    mut e: EndpointSpec,
) -> Result<Endpoint, ConvertError> {
    let (address, port) = split_host_port(&e.address)
        .map_err(|m| doc.invalid(at.to_owned(), &format!("{path}.address"), m))?;
    if let Some(port) = port {
        if !e.ports.is_empty() {
            return Err(doc.invalid(
                at.to_owned(),
                path,
                "give the port either in `address` or in `ports`, not both",
            ));
        }
        match ports {
            [only] => {
                if only.number != port {
                    e.ports.insert(only.name.clone(), port);
                }
            }
            _ => {
                return Err(doc.invalid(
                    at.to_owned(),
                    path,
                    format!(
                        "`{}` uses the address:port shorthand, which needs exactly one service \
                         port (this service has {}); write `address:` and `ports: {{name: number}}`",
                        e.address,
                        ports.len()
                    ),
                ))
            }
        }
    }
    e.address = address;
    Ok(e.into())
}

#[cfg(test)]
mod tests {
    use mcp_core::model::{Host, Location, Resolution, ServiceKey};

    use crate::convert::test_support::{err, labels};
    use crate::convert::{parse, Format};

    #[test]
    fn inventory_shorthand_and_protocols() {
        let yaml = r#"
apiVersion: mcp-adapter/v1
kind: Inventory
namespace: shop
services:
  - name: payments
    ports: {http: 8080}
    labels: {team: pay}
    endpoints:
      - 10.0.0.1:8081
      - 10.0.0.2:8080
      - 10.0.0.3
      - address: "[fd00::1]:9000"
        labels: {version: v2}
        weight: 10
        locality: eu/west-1
  - name: api
    hosts: [api.shop.internal]
    location: MESH_EXTERNAL
    resolution: DNS
    ports: {grpc-api: 9090, grpc-web: 9091, http2-x: 1, tcp: 2, mongo: 3, metrics: 4}
    endpoints:
      - address: api.backend.internal
        ports: {grpc-api: 19090}
"#;
        let services = parse("inv.yaml", yaml, Format::Yaml).expect("parses");
        assert_eq!(services.len(), 2);
        let pay = &services[0];
        assert_eq!(pay.key, ServiceKey::namespaced("shop", "payments"));
        assert_eq!(
            pay.origin,
            "file inv.yaml, document 1 (Inventory shop/payments)"
        );
        assert_eq!(pay.hosts, vec![Host::Relative("payments".into())]);
        assert_eq!(pay.location, Location::Internal);
        assert_eq!(pay.resolution, Resolution::Static);
        assert_eq!(pay.labels, labels(&[("team", "pay")]));
        assert_eq!(pay.ports[0].protocol.as_deref(), Some("HTTP"));
        let eps: Vec<_> = pay
            .endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.ports.get("http").copied()))
            .collect();
        assert_eq!(
            eps,
            vec![
                ("10.0.0.1", Some(8081)),
                ("10.0.0.2", None),
                ("10.0.0.3", None),
                ("fd00::1", Some(9000)),
            ]
        );
        assert_eq!(pay.endpoints[3].labels, labels(&[("version", "v2")]));
        assert_eq!(pay.endpoints[3].weight, Some(10));
        assert_eq!(pay.endpoints[3].locality.as_deref(), Some("eu/west-1"));

        let api = &services[1];
        assert_eq!(api.hosts, vec![Host::Absolute("api.shop.internal".into())]);
        assert_eq!(api.location, Location::External);
        assert_eq!(api.resolution, Resolution::Dns);
        let protocols: Vec<_> = api
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.protocol.as_deref()))
            .collect();
        assert_eq!(
            protocols,
            vec![
                ("grpc-api", Some("GRPC")),
                ("grpc-web", Some("GRPC-Web")),
                ("http2-x", Some("HTTP2")),
                ("metrics", None),
                ("mongo", Some("Mongo")),
                ("tcp", Some("TCP")),
            ]
        );
        assert_eq!(api.endpoints[0].ports.get("grpc-api"), Some(&19090));
    }

    #[test]
    fn inventory_ip_port_on_multi_port_service_is_an_error() {
        let yaml = r#"
kind: Inventory
services:
  - name: ok
  - name: multi
    ports: {http: 8080, grpc: 9090}
    endpoints: [10.0.0.1, "10.0.0.2:8080"]
"#;
        let e = err("inv.yaml", yaml, Format::Yaml);
        assert!(e.contains("(Inventory multi)"), "{e}");
        assert!(e.contains("services[1].endpoints[1]"), "{e}");
        assert!(
            e.contains("exactly one service port (this service has 2)"),
            "{e}"
        );
    }

    #[test]
    fn inventory_errors_name_the_service_and_field() {
        let yaml = r#"
kind: Inventory
namespace: shop
services:
  - name: web
    ports: {http: 8080}
    endpoints:
      - address: 10.0.0.1
        weigth: 3
"#;
        let e = err("inv.yaml", yaml, Format::Yaml);
        assert!(e.contains("(Inventory shop/web)"), "{e}");
        assert!(e.contains("services[0].endpoints[0]"), "{e}");
        assert!(e.contains("unknown field `weigth`"), "{e}");

        let yaml = "kind: Inventory\nservices:\n  - name: web\n    ports: {http: 8080}\n    endpoints: [\"10.0.0.1:99999\"]\n";
        let e = err("inv.yaml", yaml, Format::Yaml);
        assert!(e.contains("services[0].endpoints[0].address"), "{e}");
        assert!(e.contains("not a port number"), "{e}");
    }
}
