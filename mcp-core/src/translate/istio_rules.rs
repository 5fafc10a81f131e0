//! Istio's own admission rules for a ServiceEntry, mirrored in Rust: what
//! `ValidateServiceEntry` (istio.io/istio `pkg/config/validation/validation.go`) calls an
//! *error*. Warnings (partial wildcards, TCP ports without addresses, an empty workload
//! selector, ...) are not reported: istiod and the webhook accept a resource that only warns.
//!
//! Why a mirror: istiod drops an invalid ServiceEntry without telling the source, so the adapters
//! must never serve one. `translate` applies stricter rules of its own (lower-case hosts, label
//! values of at most 63 bytes, ...); this module is the yardstick that says whether what it built
//! is acceptable to Istio, and the differential test `tests/tests/istio_validation.rs` holds it to
//! Istio's Go code. It follows Istio's rules even where they look odd (upper-case DNS labels are
//! accepted, a one-label host may be all digits, label values have no length limit): a stricter
//! mirror would call valid entries invalid, a looser one would let invalid entries through.
//!
//! Not mirrored, because the adapters never set them: the `istio.io/use-waypoint` resource label
//! (which makes `MESH_INTERNAL` + `DYNAMIC_DNS` an error) and the annotations checked by
//! `validateMetadata`.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};

use proto::istio::networking::v1alpha3::{service_entry, ServiceEntry, WorkloadEntry};

use super::naming::{
    canonical_protocol, distinguishes_hosts, MAX_LABEL, MAX_SUBDOMAIN, UNIX_PREFIX,
};

/// Longest host Istio accepts (`CheckDNS1123Preconditions`: 255, not DNS's 253).
const MAX_HOST: usize = 255;

/// Istio's errors for `spec` as a ServiceEntry in `namespace` (what the admission webhook would
/// refuse it for), or `Ok` when it would admit it, possibly with warnings.
pub fn check(spec: &ServiceEntry, namespace: &str) -> Result<(), Vec<String>> {
    let errors = errors(spec, namespace);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn errors(se: &ServiceEntry, namespace: &str) -> Vec<String> {
    // `ValidateAlphaWorkloadSelector`: its errors end the validation before anything else.
    let selector = workload_selector(se);
    if !selector.is_empty() {
        return selector;
    }
    let mut errs = Vec::new();
    if se.workload_selector.is_some() && !se.endpoints.is_empty() {
        errs.push("only one of WorkloadSelector or Endpoints is allowed in Service Entry".into());
    }
    hosts(se, &mut errs);
    addresses(se, &mut errs);
    let port_names = ports(se, &mut errs);

    use service_entry::Resolution as R;
    match R::try_from(se.resolution) {
        Ok(R::None) => {
            if !se.endpoints.is_empty() {
                errs.push("no endpoints should be provided for resolution type none".into());
            }
        }
        Ok(R::Static) => {
            for ep in &se.endpoints {
                static_endpoint(ep, &port_names, &mut errs);
            }
        }
        Ok(r @ (R::Dns | R::DnsRoundRobin)) => dns(se, r, &port_names, &mut errs),
        Ok(R::DynamicDns) => dynamic_dns(se, &mut errs),
        Err(_) => errs.push(format!("unsupported resolution type {}", se.resolution)),
    }
    multiple_hosts(se, &mut errs);
    export_to(namespace, &se.export_to, &mut errs);
    errs
}

/// `ValidateAlphaWorkloadSelector`: no empty key, no `*` in a key or value. (An empty selector
/// only warns.)
fn workload_selector(se: &ServiceEntry) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(sel) = &se.workload_selector else {
        return errs;
    };
    for (k, v) in &sel.labels {
        if k.is_empty() {
            errs.push(format!(
                "empty key is not supported in selector: \"{k}={v}\""
            ));
        }
        if k.contains('*') || v.contains('*') {
            errs.push(format!(
                "wildcard is not supported in selector: \"{k}={v}\""
            ));
        }
    }
    errs
}

/// The host rules of `ValidateServiceEntry`: at least one host, never `"*"`, each one
/// `agent.ValidateWildcardDomain`.
fn hosts(se: &ServiceEntry, errs: &mut Vec<String>) {
    if se.hosts.is_empty() {
        errs.push("service entry must have at least one host".into());
    }
    for h in &se.hosts {
        if h == "*" {
            errs.push(format!("invalid host {h}"));
        } else if let Err(e) = wildcard_domain(h) {
            errs.push(e);
        }
    }
}

/// `agent.CheckDNS1123Preconditions`: 1..=255 bytes.
fn dns_preconditions(name: &str) -> Result<(), String> {
    if name.len() > MAX_HOST {
        Err(format!("domain name {name:?} too long (max 255)"))
    } else if name.is_empty() {
        Err("empty domain name not allowed".into())
    } else {
        Ok(())
    }
}

/// `agent.ValidateWildcardDomain`: the first label may be `*`, `*label`, `*-label` or a label;
/// the rest is `ValidateDNS1123Labels`.
fn wildcard_domain(domain: &str) -> Result<(), String> {
    dns_preconditions(domain)?;
    let (first, rest) = match domain.split_once('.') {
        Some((f, r)) => (f, Some(r)),
        None => (domain, None),
    };
    if !is_wildcard_label(first) {
        return Err(format!(
            "domain name {domain:?} invalid (label {first:?} invalid)"
        ));
    }
    match rest {
        Some(rest) => dns1123_labels(rest),
        None => Ok(()),
    }
}

/// `agent.ValidateFQDN`.
fn fqdn(name: &str) -> Result<(), String> {
    dns_preconditions(name)?;
    dns1123_labels(name)
}

/// `agent.ValidateDNS1123Labels`: the last label must not be a number (Go's `strconv.Atoi`:
/// an optional sign and digits that fit 64 bits), every label is `labels.IsDNS1123Label`, and
/// the last one may be empty (`istio.io.`).
fn dns1123_labels(domain: &str) -> Result<(), String> {
    let parts: Vec<&str> = domain.split('.').collect();
    let last = parts.len() - 1;
    if parts[last].parse::<i64>().is_ok() {
        return Err(format!(
            "domain name {domain:?} invalid (top level domain {:?} cannot be all-numeric)",
            parts[last]
        ));
    }
    for (i, label) in parts.iter().enumerate() {
        if i == last && label.is_empty() {
            return Ok(());
        }
        if !is_dns1123_label(label) {
            return Err(format!(
                "domain name {domain:?} invalid (label {label:?} invalid)"
            ));
        }
    }
    Ok(())
}

/// `[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?` with no length limit: a label of Istio's label
/// regexps (`dns1123LabelFmt`). Unlike `naming::is_dns_label`, upper case is allowed.
fn matches_label_fmt(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// `labels.IsDNS1123Label`: [`matches_label_fmt`] in at most 63 bytes. Also what
/// `ValidatePortName` asks of a port name.
fn is_dns1123_label(s: &str) -> bool {
    s.len() <= MAX_LABEL && matches_label_fmt(s)
}

/// `labels.IsWildcardDNS1123Label`: `*`, or a label optionally after `*` or `*-`, in at most 63
/// bytes.
fn is_wildcard_label(s: &str) -> bool {
    if s.len() > MAX_LABEL {
        return false;
    }
    if s == "*" {
        return true;
    }
    let rest = s.strip_prefix('*').unwrap_or(s);
    // `*-foo` is `*-` then `foo`; `matches_label_fmt` already refuses a leading `-` in the
    // plain form, so only the wildcard form may drop one.
    let rest = if s.starts_with('*') {
        rest.strip_prefix('-').unwrap_or(rest)
    } else {
        rest
    };
    matches_label_fmt(rest)
}

/// `netutil.IsValidIPAddress` (Go's `netip.ParseAddr`): IPv4 in dotted decimal, or IPv6 with an
/// optional non-empty zone (`fe80::1%eth0`).
pub(crate) fn is_ip(s: &str) -> bool {
    match s.split_once('%') {
        Some((addr, zone)) => !zone.is_empty() && addr.parse::<Ipv6Addr>().is_ok(),
        None => s.parse::<IpAddr>().is_ok(),
    }
}

/// `agent.ValidateIPSubnet`: with exactly one `/`, Go's `netip.ParsePrefix` (no zone, prefix
/// length in decimal without sign or leading zero, at most 32 or 128); otherwise an address.
fn ip_subnet(s: &str) -> bool {
    if s.matches('/').count() != 1 {
        return is_ip(s);
    }
    let Some((addr, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(ip) = addr.parse::<IpAddr>() else {
        return false;
    };
    let canonical = bits.len() == 1
        || bits
            .as_bytes()
            .first()
            .is_some_and(|b| (b'1'..=b'9').contains(b));
    let max = if ip.is_ipv4() { 32 } else { 128 };
    canonical
        && bits.bytes().all(|b| b.is_ascii_digit())
        && bits.parse::<u32>().is_ok_and(|n| n <= max)
}

/// The address rules of `ValidateServiceEntry`: each `agent.ValidateIPSubnet`, and a CIDR
/// (anything with a `/`) only with NONE or STATIC resolution.
fn addresses(se: &ServiceEntry, errs: &mut Vec<String>) {
    let mut cidr = false;
    for a in &se.addresses {
        cidr |= a.contains('/');
        if !ip_subnet(a) {
            errs.push(if a.matches('/').count() == 1 {
                format!("{a} is not a valid CIDR block")
            } else {
                format!("{a} is not a valid IP")
            });
        }
    }
    use service_entry::Resolution as R;
    if cidr && se.resolution != R::None as i32 && se.resolution != R::Static as i32 {
        errs.push("CIDR addresses are allowed only for NONE/STATIC resolution types".into());
    }
}

/// `agent.ValidatePort`: 1..=65535.
fn port(n: u32) -> Result<(), String> {
    if (1..=65535).contains(&n) {
        Ok(())
    } else {
        Err(format!("port number {n} must be in the range 1..65535"))
    }
}

/// `ValidatePortName`: a DNS-1123 label (upper case allowed, never empty).
fn port_name(name: &str) -> Result<(), String> {
    if is_dns1123_label(name) {
        Ok(())
    } else {
        Err(format!("invalid port name: {name}"))
    }
}

/// The port rules of `ValidateServiceEntry`: names and numbers unique, a set target port in
/// range, `ValidatePortName`, `ValidateProtocol` (empty, or a name `protocol.Parse` knows) and
/// the number in range. Returns the set of port names, which endpoints' port maps must use.
fn ports<'a>(se: &'a ServiceEntry, errs: &mut Vec<String>) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for p in &se.ports {
        if !names.insert(p.name.as_str()) {
            errs.push(format!(
                "service entry port name {:?} already defined",
                p.name
            ));
        }
        if !numbers.insert(p.number) {
            errs.push(format!("service entry port {} already defined", p.number));
        }
        if p.target_port != 0 {
            errs.extend(port(p.target_port).err());
        }
        errs.extend(port_name(&p.name).err());
        if !p.protocol.is_empty() && canonical_protocol(&p.protocol).is_none() {
            errs.push(format!("unsupported protocol: {}", p.protocol));
        }
        errs.extend(port(p.number).err());
    }
    names
}

/// `ValidateUnixAddress` (after `unix://`): an abstract socket (`@name`) or an absolute path
/// that does not end in `/`.
fn unix_address(addr: &str) -> Result<(), String> {
    if addr.is_empty() {
        Err("unix address must not be empty".into())
    } else if addr.starts_with('@') || (addr.starts_with('/') && !addr.ends_with('/')) {
        Ok(())
    } else {
        Err(format!("{addr} is not an absolute path to a file"))
    }
}

/// `validateWorkloadEntry(endpoint, servicePorts, allowFQDNAddresses=false)`, as STATIC
/// resolution calls it: an IP or `unix://` address (a missing address only warns when a
/// network is set), port mappings naming defined ports, labels, and a Unix socket only with
/// exactly one service port name and no port mapping.
fn static_endpoint(ep: &WorkloadEntry, port_names: &BTreeSet<&str>, errs: &mut Vec<String>) {
    let addr = ep.address.as_str();
    if addr.is_empty() && ep.network.is_empty() {
        errs.push("address is required".into());
        return;
    }
    let unix = addr.strip_prefix(UNIX_PREFIX);
    if let Some(path) = unix {
        errs.extend(unix_address(path).err());
        if !ep.ports.is_empty() {
            errs.push(format!("unix endpoint {addr} must not include ports"));
        }
    } else if !addr.is_empty() && !is_ip(addr) {
        errs.push(format!(
            "endpoint address {addr:?} is not a valid IP address"
        ));
    }
    endpoint_ports(ep, port_names, errs);
    errs.extend(label_errors(ep.labels.iter()));
    if unix.is_some() && port_names.len() != 1 {
        errs.push("exactly 1 service port required for unix endpoints".into());
    }
}

/// An endpoint's port map: each name a defined service port and a valid port name, each number
/// `agent.ValidatePort`.
fn endpoint_ports(ep: &WorkloadEntry, port_names: &BTreeSet<&str>, errs: &mut Vec<String>) {
    for (name, &number) in &ep.ports {
        if !port_names.contains(name.as_str()) {
            errs.push(format!(
                "endpoint port {number} is not defined by the service entry"
            ));
        }
        errs.extend(port_name(name).err());
        errs.extend(port(number).err());
    }
}

/// The DNS and DNS_ROUND_ROBIN rules of `ValidateServiceEntry`: without endpoints every host must
/// be an FQDN (`agent.ValidateFQDN`, so no wildcard); DNS_ROUND_ROBIN takes at most one
/// endpoint; each endpoint address is an IP or an FQDN, with valid labels and port mappings.
fn dns(
    se: &ServiceEntry,
    r: service_entry::Resolution,
    port_names: &BTreeSet<&str>,
    errs: &mut Vec<String>,
) {
    if se.endpoints.is_empty() {
        if let Some(e) = se.hosts.iter().find_map(|h| fqdn(h).err()) {
            errs.push(format!(
                "hosts must be FQDN or contain only prefix wildcards if no endpoints are provided for resolution mode {}, {e}",
                r.as_str_name()
            ));
        }
    }
    if r == service_entry::Resolution::DnsRoundRobin && se.endpoints.len() > 1 {
        errs.push(format!(
            "there must only be 0 or 1 endpoint for resolution mode {}",
            r.as_str_name()
        ));
    }
    for ep in &se.endpoints {
        if !is_ip(&ep.address) && fqdn(&ep.address).is_err() {
            errs.push(format!(
                "endpoint address {:?} is not a valid FQDN or an IP address",
                ep.address
            ));
        }
        errs.extend(label_errors(ep.labels.iter()));
        endpoint_ports(ep, port_names, errs);
    }
}

/// The DYNAMIC_DNS rules of `ValidateServiceEntry`: wildcard hosts only (`host.Name.IsWildCarded`:
/// starts with `*`), no addresses, no endpoints, ports of HTTP, TLS, GRPC or HTTP2 only, and a
/// known location.
fn dynamic_dns(se: &ServiceEntry, errs: &mut Vec<String>) {
    const MODE: &str = "DYNAMIC_DNS";
    if se.hosts.is_empty() {
        errs.push(format!(
            "at least one wildcard host must be provided for resolution type {MODE}"
        ));
    }
    for h in &se.hosts {
        if !h.starts_with('*') {
            errs.push(format!(
                "host must be wildcarded for resolution mode {MODE}"
            ));
        }
    }
    if !se.addresses.is_empty() {
        errs.push(format!(
            "addresses cannot be set for resolution type {MODE}"
        ));
    }
    if !se.endpoints.is_empty() {
        errs.push(format!(
            "endpoints cannot be set for resolution type {MODE}"
        ));
    }
    for p in &se.ports {
        if !matches!(
            canonical_protocol(&p.protocol),
            Some("HTTP" | "TLS" | "GRPC" | "HTTP2")
        ) {
            errs.push(format!(
                "only HTTP, TLS, GRPC, and HTTP2 protocols are supported for resolution type {MODE}"
            ));
        }
    }
    if service_entry::Location::try_from(se.location).is_err() {
        errs.push(format!(
            "location must be MESH_EXTERNAL or MESH_INTERNAL for resolution type {MODE}"
        ));
    }
}

/// The last port rule of `ValidateServiceEntry`: with more than one host and any resolution but
/// NONE, every port must be HTTP-like or TLS (`protocol.IsHTTP() || IsTLS()`: the proxy tells the
/// hosts apart by Host header or SNI). An empty protocol counts as neither.
fn multiple_hosts(se: &ServiceEntry, errs: &mut Vec<String>) {
    if se.resolution == service_entry::Resolution::None as i32 || se.hosts.len() <= 1 {
        return;
    }
    if se
        .ports
        .iter()
        .any(|p| !distinguishes_hosts(canonical_protocol(&p.protocol)))
    {
        errs.push("multiple hosts provided with non-HTTP, non-TLS ports".into());
    }
}

/// `validateExportTo(namespace, exportTo, isServiceEntry=true, false)`: no duplicates (`.` counts
/// as the namespace itself), each entry `.`, `*`, `~` or a DNS-1123 label, `*` and `~` only
/// alone.
fn export_to(namespace: &str, export_to: &[String], errs: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for e in export_to {
        let key = if e == "." { namespace } else { e.as_str() };
        if seen.contains(key) {
            errs.push(if key != e {
                format!("duplicate entries in exportTo: . and current namespace {namespace}")
            } else {
                format!("duplicate entries in exportTo for entry {e}")
            });
        } else if e == "~" {
            seen.insert(key);
        } else {
            // `visibility.Instance.Validate` of the key (the namespace for `.`).
            match key {
                "." | "*" => {
                    seen.insert(key);
                }
                "~" => errs.push(
                    "exportTo ~ (none) is not allowed for Istio configuration objects".into(),
                ),
                k if is_dns1123_label(k) => {
                    seen.insert(key);
                }
                _ => errs.push(
                    "only .,*, or a valid DNS 1123 label is allowed as exportTo entry".into(),
                ),
            }
        }
    }
    if seen.contains("*") && export_to.len() > 1 {
        errs.push(
            "cannot have both public (*) and non-public exportTo values for a resource".into(),
        );
    }
    if seen.contains("~") && export_to.len() > 1 {
        errs.push("cannot export service entry to no one (~) and someone".into());
    }
}

/// `qualifiedNameFmt` of Istio's label regexps: `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, no
/// length limit.
fn is_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// `labels.Instance.Validate`: each key `[prefix/]name` (prefix: dot-separated
/// [`matches_label_fmt`] labels, at most 253 bytes; name: a qualified name of at most 63 bytes),
/// each value empty or a qualified name of any length. Unlike Kubernetes (and
/// `naming::check_label_value`), Istio sets no limit on a value's length.
fn label_errors<'a>(labels: impl Iterator<Item = (&'a String, &'a String)>) -> Vec<String> {
    let mut errs = Vec::new();
    for (k, v) in labels {
        if let Err(e) = label_key(k) {
            errs.push(e);
        }
        if !v.is_empty() && !is_qualified_name(v) {
            errs.push(format!("invalid tag value: {v:?}"));
        }
    }
    errs
}

/// `validateTagKey`.
fn label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| p.split('.').all(matches_label_fmt));
    if !prefix_ok || !is_qualified_name(name) {
        return Err(format!("invalid tag key: {k:?}"));
    }
    if prefix.is_some_and(|p| p.len() > MAX_SUBDOMAIN) {
        return Err(format!("invalid tag key: {k:?} (DNS prefix is too long)"));
    }
    if name.len() > MAX_LABEL {
        return Err(format!("invalid tag key: {k:?} (name is too long)"));
    }
    Ok(())
}

#[cfg(test)]
#[path = "istio_rules_tests.rs"]
mod tests;
