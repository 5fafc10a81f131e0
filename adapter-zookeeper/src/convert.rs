//! ZooKeeper znodes -> model services, for the three layouts found in ZooKeeper registries:
//!
//! * Dubbo 2 interface level: `/{root}/{interface}/providers/{URL-encoded provider URL}`, one
//!   service per (interface, group, version);
//! * Curator x-discovery / Spring Cloud Zookeeper: `/{root}/{name}/{id}` with ServiceInstance
//!   JSON, one service per name;
//! * Dubbo 3 application level: the Curator layout with `dubbo.endpoints` in the payload
//!   metadata (the ports and protocols the application serves).
//!
//! Names and hosts are documented in the crate README ("Names and hosts"); they are stable and
//! collision-free: a name is the registry's own name only when that is already a valid DNS name
//! that nothing else can map to, otherwise a readable mapping plus a hash of the original.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mcp_core::translate::naming::{
    canonical_protocol, check_label_key, check_label_value, is_dns_subdomain, map_dns_label,
    map_dns_name, MAX_LABEL,
};
use mcp_core::{Endpoint, Host, Labels, Port, Service, ServiceKey};
use serde::Deserialize;

/// FNV-1a, 32 bits: a short stable hash for names (not security relevant).
pub fn fnv1a32(parts: &[&str]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            // A separator byte that cannot occur in UTF-8 text keeps ("a","bc") != ("ab","c").
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0193);
        }
        for b in p.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// Decodes `application/x-www-form-urlencoded` text once (`+` = space, `%XX` = byte).
pub fn form_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent escape at byte {i}"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "decoded text is not UTF-8".to_string())
}

/// A parsed provider URL `scheme://host:port/path?k=v&...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderUrl {
    /// RPC protocol (`dubbo`, `tri`, `rest`, ...), lower-cased.
    pub scheme: String,
    /// Host as written (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u32,
    /// Path (usually the interface), without the leading `/`.
    pub path: String,
    /// Query parameters (values percent-decoded once more when they still carry escapes).
    pub params: BTreeMap<String, String>,
}

/// Parses a decoded provider URL.
pub fn parse_url(url: &str) -> Result<ProviderUrl, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "no scheme (expected protocol://host:port/path?query)".to_string())?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        return Err(format!("bad scheme {scheme:?}"));
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, q),
        None => (rest, ""),
    };
    let (authority, path) = match before_query.split_once('/') {
        Some((a, p)) => (a, p),
        None => (before_query, ""),
    };
    // user:password@ is legal in Dubbo URLs; never keep it.
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, p) = v6
            .split_once("]:")
            .ok_or_else(|| format!("bad address {authority:?}"))?;
        (h, p)
    } else {
        authority
            .rsplit_once(':')
            .ok_or_else(|| format!("no port in {authority:?}"))?
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    let port: u32 = port.parse().map_err(|_| format!("bad port {port:?}"))?;
    let mut params = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        // Dubbo encodes the whole URL once; values like `ipv6` or `methods` need no second pass,
        // but a value that still holds escapes (double-encoded by some clients) is decoded again.
        let v = if v.contains('%') {
            form_decode(v).unwrap_or_else(|_| v.to_string())
        } else {
            v.to_string()
        };
        params.insert(k.to_string(), v);
    }
    Ok(ProviderUrl {
        scheme: scheme.to_ascii_lowercase(),
        host: host.to_string(),
        port,
        path: path.to_string(),
        params,
    })
}

/// Istio protocol of a Dubbo/Curator protocol name.
pub fn istio_protocol(p: &str) -> &'static str {
    match p.to_ascii_lowercase().as_str() {
        "dubbo" => "TCP",
        "tri" | "triple" | "grpc" => "GRPC",
        "http" | "rest" => "HTTP",
        other => canonical_protocol(other).unwrap_or("TCP"),
    }
}

fn is_plain_dns_name(s: &str) -> bool {
    s.len() <= 200 && is_dns_subdomain(s)
}

/// Appends `-{hash}` to the last label of a mapped dotted name, keeping it <= 63 bytes.
fn with_hash(mapped: &str, hash: u32) -> String {
    let suffix = format!("{hash:08x}");
    let mut labels: Vec<String> = mapped
        .split('.')
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    // Keep the whole name well under 253 with the host suffix added later.
    while labels.iter().map(|l| l.len() + 1).sum::<usize>() > 180 && labels.len() > 1 {
        labels.remove(0);
    }
    match labels.last_mut() {
        Some(last) => {
            last.truncate(MAX_LABEL - suffix.len() - 1);
            let trimmed = last.trim_end_matches('-').to_string();
            *last = if trimmed.is_empty() {
                suffix
            } else {
                format!("{trimmed}-{suffix}")
            };
        }
        None => labels.push(format!("z-{suffix}")),
    }
    labels.join(".")
}

/// Name (resource name and relative host) of a Dubbo service.
///
/// `interface` alone when it is already a lower-case DNS name without `-` and there is no group
/// or version (such names never carry a hash, and hashed names always contain `-`, so the two
/// never meet); otherwise the mapped interface with `-{version}` and `-{group}` appended to its
/// last label, then `-{8 hex of FNV-1a(interface, group, version)}`.
pub fn dubbo_name(interface: &str, group: &str, version: &str) -> String {
    let plain = group.is_empty()
        && version.is_empty()
        && is_plain_dns_name(interface)
        && !interface.contains('-');
    if plain {
        return interface.to_string();
    }
    let mut mapped = map_dns_name(interface);
    for extra in [version, group] {
        let l = map_dns_label(extra);
        if !l.is_empty() {
            if mapped.is_empty() {
                mapped = l;
            } else {
                mapped = format!("{mapped}-{l}");
            }
        }
    }
    with_hash(&mapped, fnv1a32(&["dubbo", interface, group, version]))
}

/// Name of a Curator / Spring Cloud / Dubbo 3 application service: the name itself when it is
/// a lower-case DNS name, else the mapped name plus a hash of the original.
pub fn curator_name(name: &str) -> String {
    if is_plain_dns_name(name) && name.len() <= 120 {
        name.to_string()
    } else {
        with_hash(&map_dns_name(name), fnv1a32(&["curator", name]))
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

/// What one ZooKeeper service directory converts to.
#[derive(Debug, Default, PartialEq)]
pub struct Converted {
    /// Services to serve (Dubbo: one per group/version; Curator: at most one).
    pub services: Vec<Service>,
    /// Skipped objects, each naming its znode.
    pub problems: Vec<String>,
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

fn truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes")
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

/// Builds one service from its usable instances (none -> `None`).
fn build(
    name: String,
    origin: String,
    insts: &[Inst],
    problems: &mut Vec<String>,
) -> Option<Service> {
    if insts.is_empty() {
        return None;
    }
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
            labels: i.labels.clone(),
            network: None,
            locality: None,
            weight: i.weight,
            service_account: None,
        });
    }
    endpoints.sort_by(|a, b| (&a.address, &a.ports).cmp(&(&b.address, &b.ports)));
    let mut service = Service::new(ServiceKey::new(name.clone()), origin);
    service.hosts = vec![Host::Relative(name)];
    service.ports = ports;
    service.endpoints = endpoints;
    service.create_time = insts.iter().filter_map(|i| i.created).min();
    Some(service)
}

/// Converts the providers of Dubbo interface `interface` (znode names under
/// `{root}/{interface}/providers`) into one service per (group, version).
pub fn convert_dubbo(root: &str, interface: &str, providers: &[String]) -> Converted {
    let dir = format!("{}/{interface}/providers", root.trim_end_matches('/'));
    let mut problems = Vec::new();
    let mut groups: BTreeMap<(String, String), Vec<Inst>> = BTreeMap::new();
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
            || url.params.get("disabled").is_some_and(|v| truthy(v))
        {
            continue;
        }
        if url.params.get("side").is_some_and(|s| s != "provider")
            || url.params.get("category").is_some_and(|c| c != "providers")
        {
            continue;
        }
        let Some(port) = check_port(&what, i64::from(url.port), &mut problems) else {
            continue;
        };
        if !check_ip(&what, &url.host, &mut problems) {
            continue;
        }
        let group = url.params.get("group").cloned().unwrap_or_default();
        let version = url.params.get("version").cloned().unwrap_or_default();
        let mut labels = valid_labels(url.params.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels.insert("protocol".into(), url.scheme.clone());
        groups.entry((group, version)).or_default().push(Inst {
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
    let mut services = Vec::new();
    for ((group, version), insts) in groups {
        let name = dubbo_name(interface, &group, &version);
        let mut origin = format!("zookeeper {dir}");
        if !group.is_empty() {
            origin.push_str(&format!(" group {group}"));
        }
        if !version.is_empty() {
            origin.push_str(&format!(" version {version}"));
        }
        let mut service = build(name, origin, &insts, &mut problems);
        if let Some(s) = service.as_mut() {
            s.annotations
                .insert("dubbo.apache.org/interface".into(), interface.to_string());
            if !group.is_empty() {
                s.annotations
                    .insert("dubbo.apache.org/group".into(), group.clone());
            }
            if !version.is_empty() {
                s.annotations
                    .insert("dubbo.apache.org/version".into(), version.clone());
            }
            debug_assert!(insts.iter().all(|i| !i.what.is_empty()));
        }
        services.extend(service);
    }
    Converted { services, problems }
}

/// Curator ServiceInstance JSON (curator-x-discovery `ServiceInstance`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CuratorInstance {
    /// Service name.
    #[serde(default)]
    pub name: Option<String>,
    /// Instance id.
    #[serde(default)]
    pub id: Option<String>,
    /// Address (IP expected).
    #[serde(default)]
    pub address: Option<String>,
    /// Port.
    #[serde(default)]
    pub port: Option<i64>,
    /// TLS port.
    #[serde(default)]
    pub ssl_port: Option<i64>,
    /// Payload: Spring/Dubbo put `metadata` here.
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
    /// Registration time, ms since the epoch.
    #[serde(default, rename = "registrationTimeUTC")]
    pub registration_time_utc: Option<i64>,
    /// `DYNAMIC`, `STATIC`, ...
    #[serde(default)]
    pub service_type: Option<String>,
    /// Curator 4+: false = disabled.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// `dubbo.endpoints` element.
#[derive(Clone, Debug, Deserialize)]
struct DubboEndpoint {
    port: i64,
    #[serde(default)]
    protocol: Option<String>,
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
pub fn convert_curator(root: &str, name: &str, instances: &[(String, Vec<u8>)]) -> Converted {
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
    if let Some(s) = service.as_mut() {
        let key = if dubbo3 {
            "dubbo.apache.org/application"
        } else {
            "zookeeper.apache.org/service"
        };
        s.annotations.insert(key.into(), name.to_string());
    }
    Converted {
        services: service.into_iter().collect(),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_core::translate::naming::is_dns_subdomain;

    const REAL: &str = "dubbo%3A%2F%2F30.221.146.35%3A20880%2Forg.apache.dubbo.samples.api.GreetingsService%3Fanyhost%3Dtrue%26application%3Dfirst-dubbo-provider%26background%3Dfalse%26deprecated%3Dfalse%26dubbo%3D2.0.2%26dynamic%3Dtrue%26environment%3Dproduct%26generic%3Dfalse%26interface%3Dorg.apache.dubbo.samples.api.GreetingsService%26ipv6%3Dfd00%3A1%3A5%3A5200%3A3218%3A774a%3A4f67%3A2341%26methods%3DsayHi%26pid%3D85639%26release%3D3.1.4%26service-name-mapping%3Dtrue%26side%3Dprovider%26timestamp%3D1674960780647";

    fn encode(s: &str) -> String {
        let mut out = String::new();
        for b in s.bytes() {
            match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'*' => {
                    out.push(b as char)
                }
                b' ' => out.push('+'),
                _ => out.push_str(&format!("%{b:02X}")),
            }
        }
        out
    }

    #[test]
    fn decodes_and_parses_a_real_provider_url() {
        let url = parse_url(&form_decode(REAL).expect("decodes")).expect("parses");
        assert_eq!(url.scheme, "dubbo");
        assert_eq!(url.host, "30.221.146.35");
        assert_eq!(url.port, 20880);
        assert_eq!(url.path, "org.apache.dubbo.samples.api.GreetingsService");
        assert_eq!(url.params["ipv6"], "fd00:1:5:5200:3218:774a:4f67:2341");
        assert_eq!(url.params["methods"], "sayHi");
        assert_eq!(url.params.len(), 16);
        assert_eq!(form_decode("a+b%2Bc").as_deref(), Ok("a b+c"));
        assert!(form_decode("%zz").is_err());
        assert!(form_decode("%4").is_err());
        let v6 = parse_url("tri://[fd00::1]:50051/x?a=1").expect("v6");
        assert_eq!((v6.host.as_str(), v6.port), ("fd00::1", 50051));
        assert!(parse_url("no-scheme").is_err());
        assert!(parse_url("dubbo://10.0.0.1/x").is_err(), "no port");
        assert!(parse_url("dubbo://10.0.0.1:x/x").is_err());
    }

    #[test]
    fn converts_providers_by_group_and_version() {
        let p = |ip: &str, q: &str| encode(&format!("dubbo://{ip}:20880/com.foo.Api?{q}"));
        let providers = vec![
            p(
                "10.0.0.1",
                "side=provider&weight=50&application=a&methods=a,b",
            ),
            p("10.0.0.2", "side=provider&version=1.0.0&group=g1"),
            p("10.0.0.3", "side=provider&enabled=false"),
            p("10.0.0.4", "side=provider&disabled=true"),
            encode("tri://10.0.0.5:50051/com.foo.Api?side=provider"),
            "garbage%zz".to_string(),
            p("db.example.com", "side=provider"),
            encode("dubbo://10.0.0.6:0/com.foo.Api?side=provider"),
        ];
        let c = convert_dubbo("/dubbo", "com.foo.Api", &providers);
        assert_eq!(c.services.len(), 2, "{:?}", c.services);
        assert_eq!(c.problems.len(), 3, "{:?}", c.problems);
        assert!(c.problems[0].contains("zookeeper /dubbo/com.foo.Api/providers/garbage%zz"));
        assert!(c.problems[1].contains("not an IP"));
        assert!(c.problems[2].contains("port 0"));
        let plain = &c.services[0];
        assert_eq!(plain.key.name, dubbo_name("com.foo.Api", "", ""));
        assert_eq!(plain.endpoints.len(), 2);
        assert_eq!(
            plain
                .ports
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["tcp-20880", "grpc-50051"]
        );
        assert_eq!(plain.endpoints[0].weight, Some(50));
        assert_eq!(plain.endpoints[0].labels["application"], "a");
        assert_eq!(plain.endpoints[0].labels["protocol"], "dubbo");
        assert!(!plain.endpoints[0].labels.contains_key("methods"));
        assert_eq!(
            plain.endpoints[0].ports,
            [("grpc-50051".to_string(), 20880)].into()
        );
        assert_eq!(
            plain.endpoints[1].ports,
            [("tcp-20880".to_string(), 50051)].into()
        );
        let g1 = &c.services[1];
        assert_eq!(g1.key.name, dubbo_name("com.foo.Api", "g1", "1.0.0"));
        assert_eq!(g1.annotations["dubbo.apache.org/group"], "g1");
    }

    #[test]
    fn dubbo_names_are_valid_and_collision_free() {
        assert_eq!(dubbo_name("com.foo.api", "", ""), "com.foo.api");
        let n = dubbo_name("org.apache.dubbo.samples.api.GreetingsService", "", "1.0.0");
        assert!(n.starts_with("org.apache.dubbo.samples.api.greetingsservice-1-0-0-"));
        let triples = [
            ("com.foo.Api", "", ""),
            ("com.foo.api", "x", ""),
            ("com.foo.API", "", ""),
            ("com.foo.Api", "g", "1.0"),
            ("com.foo.Api", "1.0", "g"),
            ("com.foo.Api", "", "1.0"),
            ("com.foo.Api", "1.0", ""),
            ("com.foo.Api", "g", "1-0"),
            ("com.foo.Api", "g-1", "0"),
            ("com.foo.Api", "g", ""),
            ("com.foo.Api", "G", ""),
            ("com.foo.Api_V", "", ""),
            ("com.foo.Api$V", "", ""),
            ("com.foo.api-v", "", ""),
            ("com.foo.api", "", ""),
            (&"x".repeat(300), "", ""),
            (&"x".repeat(301), "", ""),
            ("ÄÖ", "", ""),
            ("", "", ""),
        ];
        let mut seen = BTreeMap::new();
        for t in &triples {
            let n = dubbo_name(t.0, t.1, t.2);
            assert!(is_dns_subdomain(&n), "{t:?} -> {n:?}");
            assert!(n.len() <= 200, "{n}");
            assert!(n.split('.').all(|l| l.len() <= 63), "{n}");
            if let Some(other) = seen.insert(n.clone(), *t) {
                panic!("{t:?} and {other:?} both map to {n}");
            }
        }
        assert_eq!(curator_name("waiter-service"), "waiter-service");
        let m = curator_name("My_Service");
        assert!(m.starts_with("my-service-") && is_dns_subdomain(&m), "{m}");
        assert_ne!(curator_name("My_Service"), curator_name("my_service"));
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
            &[
                ("1".into(), spring.to_vec()),
                ("2".into(), down.to_vec()),
                ("3".into(), disabled.to_vec()),
                ("4".into(), tls.to_vec()),
                ("5".into(), host.to_vec()),
                ("6".into(), zero.to_vec()),
                ("7".into(), bad.to_vec()),
            ],
        );
        assert_eq!(c.problems.len(), 3, "{:?}", c.problems);
        assert!(c.problems[2].starts_with("zookeeper /services/waiter-service/7:"));
        let s = &c.services[0];
        assert_eq!(s.key.name, "waiter-service");
        assert_eq!(s.hosts, vec![Host::Relative("waiter-service".into())]);
        assert_eq!(s.endpoints.len(), 2);
        assert_eq!(
            s.ports.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["https-8443", "http-53598"]
        );
        assert_eq!(s.endpoints[1].labels["zone"], "z1");
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
            &[
                ("30.221.146.35:20880".into(), data.to_vec()),
                ("10.0.0.9:1".into(), bad.to_vec()),
            ],
        );
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
        assert!(c.problems[0].contains("/services/first-dubbo-provider/10.0.0.9:1"));
        let s = &c.services[0];
        assert_eq!(
            s.ports
                .iter()
                .map(|p| (p.name.as_str(), p.protocol.as_deref()))
                .collect::<Vec<_>>(),
            [("tcp-20880", Some("TCP")), ("grpc-50051", Some("GRPC"))]
        );
        assert!(s.endpoints[0].ports.is_empty());
        assert_eq!(
            s.endpoints[0].labels["dubbo.metadata.revision"],
            "871fbc9cb2730caea9b0d858852d5ede"
        );
        assert!(!s.endpoints[0].labels.contains_key("dubbo.endpoints"));
        assert_eq!(
            s.annotations["dubbo.apache.org/application"],
            "first-dubbo-provider"
        );
    }

    #[test]
    fn empty_or_all_disabled_is_not_served() {
        assert!(convert_dubbo("/dubbo", "a.B", &[]).services.is_empty());
        let off = encode("dubbo://10.0.0.1:1/a.B?enabled=false");
        assert!(convert_dubbo("/dubbo", "a.B", &[off]).services.is_empty());
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(fnv1a32(&[""]), 0x811c_9dc5);
        assert_eq!(fnv1a32(&["a"]), 0xe40c_292c);
        assert_ne!(fnv1a32(&["a", "bc"]), fnv1a32(&["ab", "c"]));
    }
}
