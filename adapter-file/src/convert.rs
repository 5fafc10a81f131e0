//! Parsing: the text of one file -> the [`Service`]s it defines, or one error naming the file,
//! the document, the resource and the field.
//!
//! Only shape is checked here (required fields, types, enum values, unknown fields). Semantic
//! validation (DNS host names, label syntax, port name rules, STATIC endpoints being IPs) is the
//! core's job, which is why every [`Service`] carries an `origin` naming the file and document.
//!
//! Every document is first parsed into a [`serde_yaml::Value`] (JSON is converted into one), then
//! deserialized into typed structs through `serde_path_to_error`, so that a type error says
//! `spec.ports[0].number` rather than just "invalid type".

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use mcp_core::model::{Endpoint, Host, Labels, Location, Port, Resolution, Service, ServiceKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_yaml::Value;

/// `apiVersion`s accepted for `kind: ServiceEntry` (the versions Istio serves).
pub const ISTIO_API_VERSIONS: [&str; 3] = [
    "networking.istio.io/v1",
    "networking.istio.io/v1beta1",
    "networking.istio.io/v1alpha3",
];

/// The only `apiVersion` accepted for `kind: Inventory` (it may also be left out).
pub const INVENTORY_API_VERSION: &str = "mcp-adapter/v1";

/// How a file's text is parsed; chosen by extension so a `.json` file gets JSON error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One or more YAML documents separated by `---`.
    Yaml,
    /// One JSON value (an object or a `kind: List`).
    Json,
}

impl Format {
    /// `.json` (any case) is JSON; everything else, including files named explicitly without a
    /// known extension, is YAML (which also reads most JSON).
    pub fn for_path(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("json") => Self::Json,
            _ => Self::Yaml,
        }
    }
}

/// Why a file could not be converted. The whole file is rejected (the caller keeps its last good
/// services), so one error is enough; its text names where to look.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The text is not valid YAML/JSON.
    #[error("{at}: {format} syntax error: {message}")]
    Syntax {
        /// `file x.yaml, document 2`.
        at: String,
        /// `YAML` or `JSON`.
        format: &'static str,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The document parsed but does not have the expected shape.
    #[error("{at}: {}{message}", field_prefix(.field))]
    Invalid {
        /// `file x.yaml, document 2 (ServiceEntry default/payments)`.
        at: String,
        /// Path of the offending field (`spec.ports[0].number`), empty for the document itself.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}

/// Where a document (or an item of a `kind: List`) is, for origins and error messages.
#[derive(Clone, Copy)]
struct DocRef<'a> {
    file: &'a str,
    /// 1-based document number in the file.
    document: usize,
    /// 0-based index in a `kind: List`'s `items`.
    item: Option<usize>,
}

impl fmt::Display for DocRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file {}, document {}", self.file, self.document)?;
        if let Some(i) = self.item {
            write!(f, ", items[{i}]")?;
        }
        Ok(())
    }
}

impl DocRef<'_> {
    /// `file x, document n (Kind ns/name)`: the origin of a service, or the location of an error
    /// once the resource name is known.
    fn describe(&self, kind: &str, resource: Option<&str>) -> String {
        match resource {
            Some(r) => format!("{self} ({kind} {r})"),
            None => self.to_string(),
        }
    }

    /// Field path relative to the document: inside a List, paths start at `items[i]`.
    fn field(&self, path: &str) -> String {
        let path = path.trim_start_matches('.');
        match (self.item, path.is_empty()) {
            (Some(i), true) => format!("items[{i}]"),
            (Some(i), false) => format!("items[{i}].{path}"),
            (None, _) => path.to_owned(),
        }
    }

    fn invalid(&self, at: String, path: &str, message: impl Into<String>) -> ConvertError {
        ConvertError::Invalid {
            at,
            field: self.field(path),
            message: message.into(),
        }
    }
}

/// Parses one file. `file` is how the file is named in origins and errors (the path as
/// configured, so operators recognise it).
pub fn parse(file: &str, text: &str, format: Format) -> Result<Vec<Service>, ConvertError> {
    let documents = match format {
        Format::Json => vec![parse_json(file, text)?],
        Format::Yaml => parse_yaml(file, text)?,
    };
    let mut services = Vec::new();
    for (index, value) in documents.into_iter().enumerate() {
        // Empty documents (a trailing `---`, a file of comments) define nothing.
        if value.is_null() {
            continue;
        }
        let doc = DocRef {
            file,
            document: index + 1,
            item: None,
        };
        convert_document(doc, value, &mut services)?;
    }
    Ok(services)
}

fn parse_json(file: &str, text: &str) -> Result<Value, ConvertError> {
    let syntax = |message: String| ConvertError::Syntax {
        at: format!("file {file}"),
        format: "JSON",
        message,
    };
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| syntax(e.to_string()))?;
    serde_yaml::to_value(json).map_err(|e| syntax(e.to_string()))
}

fn parse_yaml(file: &str, text: &str) -> Result<Vec<Value>, ConvertError> {
    serde_yaml::Deserializer::from_str(text)
        .enumerate()
        .map(|(index, document)| {
            Value::deserialize(document).map_err(|e| ConvertError::Syntax {
                at: format!("file {file}, document {}", index + 1),
                format: "YAML",
                message: e.to_string(),
            })
        })
        .collect()
}

/// Reads a string field of a mapping without deserializing the rest, to dispatch on `kind` and
/// to name the resource in errors about other fields.
fn str_field<'v>(value: &'v Value, path: &[&str]) -> Option<&'v str> {
    let mut v = value;
    for key in path {
        v = v.get(key)?;
    }
    v.as_str()
}

fn convert_document(
    doc: DocRef<'_>,
    value: Value,
    out: &mut Vec<Service>,
) -> Result<(), ConvertError> {
    if !value.is_mapping() {
        return Err(doc.invalid(
            doc.to_string(),
            "",
            "expected a mapping with `kind` (ServiceEntry, Inventory or List)",
        ));
    }
    let kind = match value.get("kind") {
        None | Some(Value::Null) => {
            return Err(doc.invalid(doc.to_string(), "kind", "missing field `kind`"))
        }
        Some(Value::String(kind)) => kind.clone(),
        Some(_) => return Err(doc.invalid(doc.to_string(), "kind", "expected a string")),
    };
    match kind.as_str() {
        "ServiceEntry" => out.push(service_entry(doc, value)?),
        "Inventory" => out.extend(inventory(doc, value)?),
        "List" if doc.item.is_none() => list(doc, value, out)?,
        "List" => {
            return Err(doc.invalid(doc.to_string(), "kind", "a List cannot contain a List"));
        }
        other => {
            return Err(doc.invalid(
                doc.to_string(),
                "kind",
                format!("unsupported kind `{other}` (expected ServiceEntry, Inventory or List)"),
            ));
        }
    }
    Ok(())
}

/// `kind: List` (what `kubectl get -o yaml|json` writes): each item is converted as if it were
/// its own document; its `apiVersion` is not checked because Kubernetes writes `v1`.
fn list(doc: DocRef<'_>, value: Value, out: &mut Vec<Service>) -> Result<(), ConvertError> {
    let items = match value.get("items") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Sequence(items)) => items.clone(),
        Some(_) => return Err(doc.invalid(doc.to_string(), "items", "expected a sequence")),
    };
    for (i, item) in items.into_iter().enumerate() {
        let item_doc = DocRef {
            item: Some(i),
            ..doc
        };
        convert_document(item_doc, item, out)?;
    }
    Ok(())
}

/// Deserializes `value` into `T`, naming the failing field (prefixed with `prefix`) on error.
fn typed<T: DeserializeOwned>(
    doc: DocRef<'_>,
    at: &str,
    prefix: &str,
    value: Value,
) -> Result<T, ConvertError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        let inner = inner.trim_start_matches('.');
        let path = match (prefix.is_empty(), inner.is_empty()) {
            (_, true) => prefix.to_owned(),
            (true, false) => inner.to_owned(),
            (false, false) => format!("{prefix}.{inner}"),
        };
        doc.invalid(at.to_owned(), &path, e.into_inner().to_string())
    })
}

/// Accepts `null` (a YAML key with no value) as the default: `ports:` with nothing under it
/// means "no ports", not a type error.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

// ---------------------------------------------------------------------------------------------
// Istio ServiceEntry
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceEntryDoc {
    #[allow(dead_code)] // checked before deserializing, kept so it is not an unknown field
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: Metadata,
    spec: ServiceEntrySpec,
    /// Written by `kubectl get`; ignored.
    #[serde(default)]
    #[allow(dead_code)]
    status: Option<Value>,
}

/// Kubernetes object metadata. Unknown fields are allowed here (unlike in `spec`) because
/// `kubectl get -o yaml` writes many (`uid`, `resourceVersion`, `managedFields`) that mean
/// nothing to this adapter.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    labels: Labels,
    #[serde(default, deserialize_with = "nullable")]
    annotations: Labels,
    #[serde(default)]
    creation_timestamp: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceEntrySpec {
    hosts: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    addresses: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    ports: Vec<PortSpec>,
    #[serde(default)]
    location: Option<LocationSpec>,
    #[serde(default)]
    resolution: Option<ResolutionSpec>,
    #[serde(default, deserialize_with = "nullable")]
    endpoints: Vec<EndpointSpec>,
    #[serde(default, deserialize_with = "nullable")]
    export_to: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    subject_alt_names: Vec<String>,
    #[serde(default)]
    workload_selector: Option<WorkloadSelector>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PortSpec {
    number: u32,
    #[serde(default)]
    protocol: Option<String>,
    name: String,
    #[serde(default)]
    target_port: Option<u32>,
}

#[derive(Clone, Copy, Deserialize)]
enum LocationSpec {
    #[serde(rename = "MESH_EXTERNAL")]
    External,
    #[serde(rename = "MESH_INTERNAL")]
    Internal,
}

impl From<LocationSpec> for Location {
    fn from(l: LocationSpec) -> Self {
        match l {
            LocationSpec::External => Location::External,
            LocationSpec::Internal => Location::Internal,
        }
    }
}

#[derive(Clone, Copy, Deserialize)]
enum ResolutionSpec {
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "STATIC")]
    Static,
    #[serde(rename = "DNS")]
    Dns,
    #[serde(rename = "DNS_ROUND_ROBIN")]
    DnsRoundRobin,
}

impl From<ResolutionSpec> for Resolution {
    fn from(r: ResolutionSpec) -> Self {
        match r {
            ResolutionSpec::None => Resolution::None,
            ResolutionSpec::Static => Resolution::Static,
            ResolutionSpec::Dns => Resolution::Dns,
            ResolutionSpec::DnsRoundRobin => Resolution::DnsRoundRobin,
        }
    }
}

/// A WorkloadEntry inside a ServiceEntry. `address` is required because the model has no
/// address-less (network gateway only) endpoints.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EndpointSpec {
    address: String,
    #[serde(default, deserialize_with = "nullable")]
    ports: BTreeMap<String, u32>,
    #[serde(default, deserialize_with = "nullable")]
    labels: Labels,
    #[serde(default)]
    network: Option<String>,
    #[serde(default)]
    locality: Option<String>,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    service_account: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WorkloadSelector {
    #[serde(default, deserialize_with = "nullable")]
    labels: Labels,
}

fn service_entry(doc: DocRef<'_>, value: Value) -> Result<Service, ConvertError> {
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
    service.endpoints = spec
        .endpoints
        .into_iter()
        .map(|e| Endpoint {
            address: e.address,
            ports: e.ports,
            labels: e.labels,
            network: e.network,
            locality: e.locality,
            weight: e.weight,
            service_account: e.service_account,
        })
        .collect();
    service.export_to = spec.export_to;
    service.subject_alt_names = spec.subject_alt_names;
    service.workload_selector = spec.workload_selector.map(|w| w.labels);
    service.labels = se.metadata.labels;
    service.annotations = se.metadata.annotations;
    service.create_time = create_time;
    Ok(service)
}

// ---------------------------------------------------------------------------------------------
// Inventory (see README.md)
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct InventoryDoc {
    #[serde(default)]
    api_version: Option<String>,
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    namespace: Option<String>,
    /// Kept as values so each service is deserialized on its own and errors can name it.
    #[serde(default, deserialize_with = "nullable")]
    services: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct InventoryService {
    name: String,
    #[serde(default, deserialize_with = "nullable")]
    hosts: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    addresses: Vec<String>,
    /// Name -> number; a map so that names are unique by construction.
    #[serde(default, deserialize_with = "nullable")]
    ports: BTreeMap<String, u32>,
    #[serde(default, deserialize_with = "nullable")]
    labels: Labels,
    #[serde(default, deserialize_with = "nullable")]
    annotations: Labels,
    #[serde(default)]
    location: Option<LocationSpec>,
    #[serde(default)]
    resolution: Option<ResolutionSpec>,
    /// Strings (`ip`, `ip:port`) or mappings; dispatched by hand so errors keep their path.
    #[serde(default, deserialize_with = "nullable")]
    endpoints: Vec<Value>,
    #[serde(default, deserialize_with = "nullable")]
    export_to: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct InventoryEndpoint {
    address: String,
    #[serde(default, deserialize_with = "nullable")]
    ports: BTreeMap<String, u32>,
    #[serde(default, deserialize_with = "nullable")]
    labels: Labels,
    #[serde(default)]
    network: Option<String>,
    #[serde(default)]
    locality: Option<String>,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    service_account: Option<String>,
}

fn inventory(doc: DocRef<'_>, value: Value) -> Result<Vec<Service>, ConvertError> {
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
    inv.services
        .into_iter()
        .enumerate()
        .map(|(i, value)| inventory_service(doc, inv.namespace.as_deref(), i, value))
        .collect()
}

fn inventory_service(
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
                InventoryEndpoint {
                    address,
                    ports: BTreeMap::new(),
                    labels: Labels::new(),
                    network: None,
                    locality: None,
                    weight: None,
                    service_account: None,
                },
            )?,
            Value::Mapping(_) => {
                let e: InventoryEndpoint = typed(doc, &at, &path, value)?;
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
    e: InventoryEndpoint,
) -> Result<Endpoint, ConvertError> {
    let (address, port) = split_host_port(&e.address)
        .map_err(|m| doc.invalid(at.to_owned(), &format!("{path}.address"), m))?;
    let mut endpoint_ports = e.ports;
    if let Some(port) = port {
        if !endpoint_ports.is_empty() {
            return Err(doc.invalid(
                at.to_owned(),
                path,
                "give the port either in `address` or in `ports`, not both",
            ));
        }
        match ports {
            [only] => {
                if only.number != port {
                    endpoint_ports.insert(only.name.clone(), port);
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
    Ok(Endpoint {
        address,
        ports: endpoint_ports,
        labels: e.labels,
        network: e.network,
        locality: e.locality,
        weight: e.weight,
        service_account: e.service_account,
    })
}

/// Splits `host:port`, `[v6]:port`, `[v6]`, a bare IPv6 address or a bare host.
fn split_host_port(s: &str) -> Result<(String, Option<u32>), String> {
    let parse_port = |p: &str| match p.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(n),
        _ => Err(format!("`{p}` in `{s}` is not a port number (1-65535)")),
    };
    if let Some(rest) = s.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(format!("`{s}` has `[` without `]`"));
        };
        return match after {
            "" => Ok((host.to_owned(), None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((host.to_owned(), Some(parse_port(p)?))),
                None => Err(format!("unexpected `{after}` after `]` in `{s}`")),
            },
        };
    }
    match s.split_once(':') {
        // Two or more colons without brackets: a bare IPv6 address.
        Some((host, port)) if !port.contains(':') => Ok((host.to_owned(), Some(parse_port(port)?))),
        _ => Ok((s.to_owned(), None)),
    }
}

/// Istio protocol for a port name, the way Istio reads Kubernetes port names: the prefix before
/// the first `-` (case-insensitive), with `grpc-web` checked first because it contains a `-`.
pub fn protocol_from_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if lower == "grpc-web" || lower.starts_with("grpc-web-") {
        return Some("GRPC-Web");
    }
    let prefix = lower.split('-').next().unwrap_or_default();
    Some(match prefix {
        "http" => "HTTP",
        "http2" => "HTTP2",
        "https" => "HTTPS",
        "grpc" => "GRPC",
        "tcp" => "TCP",
        "tls" => "TLS",
        "udp" => "UDP",
        "mongo" => "Mongo",
        "mysql" => "MySQL",
        "redis" => "Redis",
        _ => return None,
    })
}

/// Parses an RFC 3339 time (`2024-05-01T12:00:00Z`, `...12:00:00.5+02:00`) without a date
/// library: Kubernetes' `creationTimestamp` is the only time this adapter reads.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    let digits = |from: usize, to: usize| -> Option<i64> {
        let part = b.get(from..to)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let sep = |at: usize, allowed: &[u8]| b.get(at).is_some_and(|c| allowed.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 7)?, digits(8, 10)?);
    let (hour, minute, second) = (digits(11, 13)?, digits(14, 16)?, digits(17, 19)?);
    let mut rest = s.get(19..)?;
    let mut nanos: u32 = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let len = frac.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 {
            return None;
        }
        let mut padded: String = frac[..len].chars().take(9).collect();
        while padded.len() < 9 {
            padded.push('0');
        }
        nanos = padded.parse().ok()?;
        rest = &frac[len..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let o = rest.as_bytes();
            if o.len() != 6 || o[3] != b':' {
                return None;
            }
            let hh: i64 = rest.get(1..3)?.parse().ok()?;
            let mm: i64 = rest.get(4..6)?.parse().ok()?;
            if hh > 23 || mm > 59 {
                return None;
            }
            sign * (hh * 3600 + mm * 60)
        }
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let max_day = *month_days.get(usize::try_from(month - 1).ok()?)?;
    if day < 1 || day > max_day || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second.min(59)
            - offset;
    let epoch = SystemTime::UNIX_EPOCH;
    if secs >= 0 {
        epoch.checked_add(Duration::new(u64::try_from(secs).ok()?, nanos))
    } else {
        epoch
            .checked_sub(Duration::from_secs(secs.unsigned_abs()))?
            .checked_add(Duration::from_nanos(u64::from(nanos)))
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn err(file: &str, text: &str, format: Format) -> String {
        match parse(file, text, format) {
            Ok(services) => panic!("expected an error, got {services:?}"),
            Err(e) => e.to_string(),
        }
    }

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
            labels: labels(&[("version", "v1")]),
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
        let value: serde_yaml::Value = serde_yaml::from_str(FULL_SE_YAML).expect("yaml");
        let json = serde_json::to_string_pretty(&value).expect("json");
        let services = parse("a.json", &json, Format::Json).expect("parses");
        let want = expected_full("file a.json, document 1 (ServiceEntry shop/payments)");
        assert_eq!(services, vec![want]);
    }

    #[test]
    fn json_list() {
        let json = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "networking.istio.io/v1beta1", "kind": "ServiceEntry",
             "metadata": {"name": "a"}, "spec": {"hosts": ["a.example.com"]}},
            {"apiVersion": "networking.istio.io/v1alpha3", "kind": "ServiceEntry",
             "metadata": {"name": "b", "namespace": "x"},
             "spec": {"hosts": ["b.example.com"], "resolution": "DNS"}}
        ]}"#;
        let services = parse("l.json", json, Format::Json).expect("parses");
        let keys: Vec<_> = services.iter().map(|s| s.key.clone()).collect();
        assert_eq!(
            keys,
            vec![ServiceKey::new("a"), ServiceKey::namespaced("x", "b")]
        );
        assert_eq!(
            services[1].origin,
            "file l.json, document 1, items[1] (ServiceEntry x/b)"
        );
        assert_eq!(services[1].resolution, Resolution::Dns);
        // Istio's default resolution is NONE.
        assert_eq!(services[0].resolution, Resolution::None);
    }

    #[test]
    fn yaml_list_error_paths_start_at_the_item() {
        let yaml = r#"
kind: List
items:
  - apiVersion: networking.istio.io/v1
    kind: ServiceEntry
    metadata: {name: a}
    spec: {hosts: [a.example.com], ports: [{number: x, name: http}]}
"#;
        let e = err("l.yaml", yaml, Format::Yaml);
        assert!(e.contains("document 1, items[0] (ServiceEntry a)"), "{e}");
        assert!(e.contains("items[0].spec.ports[0].number"), "{e}");
    }

    #[test]
    fn multi_document_yaml_skips_empty_documents() {
        let yaml = r#"
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: one}
spec: {hosts: [one.example.com]}
---
# only a comment
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: two}
spec: {hosts: [two.example.com]}
---
"#;
        let services = parse("m.yaml", yaml, Format::Yaml).expect("parses");
        let origins: Vec<_> = services.iter().map(|s| s.origin.as_str()).collect();
        assert_eq!(
            origins,
            vec![
                "file m.yaml, document 1 (ServiceEntry one)",
                "file m.yaml, document 3 (ServiceEntry two)"
            ]
        );
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
    fn unknown_kind_and_api_version_are_errors() {
        let e = err(
            "k.yaml",
            "kind: Deployment\napiVersion: apps/v1\n",
            Format::Yaml,
        );
        assert!(e.contains("unsupported kind `Deployment`"), "{e}");
        assert!(e.contains("document 1"), "{e}");

        let yaml = "apiVersion: networking.istio.io/v2\nkind: ServiceEntry\nmetadata: {name: a}\nspec: {hosts: [a.example.com]}\n";
        let e = err("k.yaml", yaml, Format::Yaml);
        assert!(e.contains("apiVersion: unsupported apiVersion"), "{e}");
        assert!(e.contains("(ServiceEntry a)"), "{e}");

        let e = err(
            "k.yaml",
            "apiVersion: mcp-adapter/v2\nkind: Inventory\n",
            Format::Yaml,
        );
        assert!(e.contains("unsupported apiVersion `mcp-adapter/v2`"), "{e}");
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

    #[test]
    fn syntax_errors_name_the_document() {
        let yaml = "kind: Inventory\n---\nkind: [unclosed\n";
        let e = err("s.yaml", yaml, Format::Yaml);
        assert!(
            e.contains("file s.yaml, document 2: YAML syntax error"),
            "{e}"
        );
        let e = err("s.json", "{\"kind\": ", Format::Json);
        assert!(e.contains("file s.json: JSON syntax error"), "{e}");
    }

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
    fn protocol_names() {
        assert_eq!(protocol_from_name("HTTPS-admin"), Some("HTTPS"));
        assert_eq!(protocol_from_name("grpc-web-ui"), Some("GRPC-Web"));
        assert_eq!(protocol_from_name("grpc-webx"), Some("GRPC"));
        assert_eq!(protocol_from_name("tls"), Some("TLS"));
        assert_eq!(protocol_from_name("udp-dns"), Some("UDP"));
        assert_eq!(protocol_from_name("mysql"), Some("MySQL"));
        assert_eq!(protocol_from_name("redis-cache"), Some("Redis"));
        assert_eq!(protocol_from_name("web"), None);
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

    #[test]
    fn host_port_splitting() {
        assert_eq!(split_host_port("10.0.0.1"), Ok(("10.0.0.1".into(), None)));
        assert_eq!(
            split_host_port("host.example:80"),
            Ok(("host.example".into(), Some(80)))
        );
        assert_eq!(split_host_port("fd00::1"), Ok(("fd00::1".into(), None)));
        assert_eq!(split_host_port("[fd00::1]"), Ok(("fd00::1".into(), None)));
        assert!(split_host_port("10.0.0.1:0").is_err());
        assert!(split_host_port("[fd00::1]x").is_err());
    }

    #[test]
    fn rfc3339() {
        let t = |s| parse_rfc3339(s).and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(Duration::ZERO));
        assert_eq!(
            t("2024-01-02T03:04:05Z"),
            Some(Duration::from_secs(1_704_164_645))
        );
        assert_eq!(
            t("2024-01-02T05:04:05.25+02:00"),
            Some(Duration::new(1_704_164_645, 250_000_000))
        );
        assert_eq!(
            t("2024-02-29T00:00:00-01:30"),
            Some(Duration::from_secs(1_709_170_200))
        );
        assert_eq!(t("2023-02-29T00:00:00Z"), None);
        assert_eq!(t("2024-01-02 03:04:05"), None);
        assert_eq!(t("yesterday"), None);
    }

    /// The repository's examples must keep parsing (their Istio validity was checked against
    /// the core's translation when they were written).
    #[test]
    fn repository_examples_parse() {
        let read = |name: &str| {
            let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).expect("example exists");
            parse(name, &text, Format::Yaml).expect("example parses")
        };
        let shop = read("shop.yaml");
        let keys: Vec<_> = shop.iter().map(|s| s.key.to_string()).collect();
        assert_eq!(
            keys,
            vec!["shop/payments", "shop/catalog", "shop/stripe-api"]
        );
        assert_eq!(shop[2].location, Location::External);
        assert_eq!(shop[2].resolution, Resolution::Dns);
        let inventory = read("inventory.yaml");
        let keys: Vec<_> = inventory.iter().map(|s| s.key.to_string()).collect();
        assert_eq!(keys, vec!["legacy/billing", "legacy/ledger-db"]);
        assert_eq!(inventory[0].hosts, vec![Host::Relative("billing".into())]);
        assert_eq!(inventory[0].endpoints[1].ports.get("http"), Some(&8081));
    }
}
