//! Service -> ServiceEntry, with Istio's validation rules applied on our side (istiod drops an
//! invalid ServiceEntry silently, so the source must not send one).

use std::collections::BTreeSet;
use std::net::IpAddr;

use proto::istio::networking::v1alpha3::{
    service_entry, ServiceEntry, ServicePort, WorkloadSelector,
};

use super::labels::{clean_labels, label_safe, CheckedLabels};
use super::naming::{
    canonical_protocol, check_host, distinguishes_hosts, is_dns_label, map_dns_name,
    map_resource_name, UNIX_PREFIX,
};
use super::{
    Invalid, TranslateConfig, Translated, WarningKind, FIXED_CREATE_TIME, LABEL_REGISTRY,
    LABEL_SOURCE,
};
use crate::model::{Endpoint, Host, Location, Port, Resolution, Service};

/// Builds the ServiceEntry for `service`, or says every reason it cannot be served. Takes the
/// service by value: its strings move into the ServiceEntry instead of being copied (the
/// writer owns every service it translates).
pub fn translate(service: Service, cfg: &TranslateConfig) -> Result<Translated, Invalid> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let Service {
        key,
        origin,
        hosts: model_hosts,
        addresses: model_addresses,
        ports: model_ports,
        location,
        resolution,
        endpoints: model_endpoints,
        export_to: model_export_to,
        subject_alt_names,
        workload_selector,
        labels: model_labels,
        annotations,
        create_time,
        name_parts,
        // Decides who keeps a contested virtual IP (`vip`), not part of the resource.
        creation_order: _,
    } = service;

    let namespace = key.namespace.unwrap_or_else(|| cfg.namespace.clone());
    if !is_dns_label(&namespace) {
        errors.push(format!(
            "metadata.namespace: {namespace:?} is not a valid namespace (DNS label)"
        ));
    }
    let mut short = map_resource_name(&key.name);
    if short.is_empty() {
        errors.push(format!(
            "metadata.name: {:?} maps to an empty name",
            key.name
        ));
    } else if let Some(t) = &cfg.naming.name {
        let named = t.render_name(|part| match part {
            "name" => Some(short.as_str()),
            "registry" => Some(cfg.registry.as_str()),
            "source" => Some(cfg.source.as_str()),
            _ => None,
        });
        let mapped = map_resource_name(&named);
        if mapped != named || mapped.is_empty() {
            errors.push(format!(
                "metadata.name: --name-template {:?} gives {named:?}, not a valid name",
                t.as_str()
            ));
        }
        short = mapped;
    }

    let hosts = hosts(&model_hosts, &name_parts, cfg, &mut errors);
    let mut ports = ports(model_ports, &mut errors);
    let mut model_endpoints = model_endpoints;
    rename_ports(&mut ports, &mut model_endpoints, &cfg.naming.port_names);
    let mut port_names = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        if !port_names.insert(p.name.as_str()) {
            errors.push(format!(
                "spec.ports[{i}].name: {:?} is used twice (after --port-name)",
                p.name
            ));
        }
    }
    let addresses = addresses(model_addresses, resolution, &mut errors);
    let export_to = export_to(model_export_to, cfg, &namespace, &mut errors);

    if workload_selector.is_some() && !model_endpoints.is_empty() {
        errors.push("spec: workloadSelector and endpoints are mutually exclusive".into());
    }
    let endpoints = endpoints(
        model_endpoints,
        resolution,
        &ports,
        (
            cfg.max_labels,
            cfg.naming.endpoint_source_labels.then(|| {
                [
                    (LABEL_REGISTRY.to_string(), label_safe(&cfg.registry)),
                    (LABEL_SOURCE.to_string(), label_safe(&cfg.source)),
                ]
            }),
        ),
        &mut errors,
        &mut warnings,
    );
    if resolution != Resolution::None
        && hosts.len() > 1
        && ports
            .iter()
            .any(|p| !distinguishes_hosts(canonical_protocol(&p.protocol)))
    {
        errors.push(
            "spec.hosts: several hosts need HTTP or TLS ports (Istio cannot tell them apart on other protocols) or resolution NONE"
                .into(),
        );
    }
    // Istio asks this whether or not a workload selector picks the endpoints.
    if matches!(resolution, Resolution::Dns | Resolution::DnsRoundRobin)
        && endpoints.is_empty()
        && hosts.iter().any(|h| h.starts_with("*."))
    {
        errors.push(
            "spec.hosts: DNS resolution without endpoints needs hosts without wildcards".into(),
        );
    }

    // A selector is never cut short: fewer labels would select more workloads.
    let workload_selector = workload_selector.map(|sel| WorkloadSelector {
        labels: clean_labels(
            sel,
            usize::MAX,
            || "spec.workloadSelector.labels".into(),
            &mut warnings,
        ),
    });

    let mut labels = clean_labels(
        model_labels,
        cfg.max_labels,
        || "metadata.labels".into(),
        &mut warnings,
    );
    labels.insert(LABEL_REGISTRY.into(), label_safe(&cfg.registry));
    labels.insert(LABEL_SOURCE.into(), label_safe(&cfg.source));

    if !errors.is_empty() {
        return Err(Invalid { origin, errors });
    }
    let spec = ServiceEntry {
        hosts,
        addresses,
        ports,
        location: match location {
            Location::External => service_entry::Location::MeshExternal,
            Location::Internal => service_entry::Location::MeshInternal,
        } as i32,
        resolution: match resolution {
            Resolution::None => service_entry::Resolution::None,
            Resolution::Static => service_entry::Resolution::Static,
            Resolution::Dns => service_entry::Resolution::Dns,
            Resolution::DnsRoundRobin => service_entry::Resolution::DnsRoundRobin,
        } as i32,
        endpoints: Vec::new(),
        export_to,
        subject_alt_names,
        workload_selector,
    };
    Ok(Translated {
        name: format!("{namespace}/{short}"),
        create_time: create_time.unwrap_or(FIXED_CREATE_TIME),
        labels,
        annotations,
        spec,
        endpoints,
        warnings,
    })
}

/// `--port-name`: each service port whose number is named gets that name (and protocol, when
/// given), and endpoints' port mappings follow it (they are keyed by port name).
fn rename_ports(
    ports: &mut [ServicePort],
    endpoints: &mut [Endpoint],
    names: &std::collections::BTreeMap<u32, super::template::PortRename>,
) {
    let renamed: Vec<(String, &String)> = ports
        .iter_mut()
        .filter_map(|p| {
            let rename = names.get(&p.number)?;
            if let Some(protocol) = rename.protocol {
                p.protocol = protocol.to_string();
            }
            let name = Some(&rename.name).filter(|n| **n != p.name)?;
            Some((std::mem::replace(&mut p.name, name.clone()), name))
        })
        .collect();
    if renamed.is_empty() {
        return;
    }
    for ep in endpoints.iter_mut().filter(|ep| !ep.ports.is_empty()) {
        for (old, new) in &renamed {
            if let Some(n) = ep.ports.remove(old) {
                ep.ports.insert((*new).clone(), n);
            }
        }
    }
}

fn hosts(
    model: &[Host],
    parts: &[(&'static str, String)],
    cfg: &TranslateConfig,
    errors: &mut Vec<String>,
) -> Vec<String> {
    let mut out = Vec::with_capacity(model.len());
    if model.is_empty() {
        errors.push("spec.hosts: at least one host is required".into());
    }
    for (i, host) in model.iter().enumerate() {
        let h = match host {
            Host::Absolute(h) => match check_host(h) {
                Ok(h) => h,
                Err(e) => {
                    errors.push(format!("spec.hosts[{i}]: {e}"));
                    continue;
                }
            },
            Host::Relative(name) if cfg.naming.host.is_some() => {
                let Some(t) = &cfg.naming.host else { continue };
                let full = t.render_host(|part| {
                    parts
                        .iter()
                        .find(|(p, _)| *p == part)
                        .map(|(_, v)| v.as_str())
                        .or((part == "service").then_some(name.as_str()))
                });
                match check_host(&full) {
                    Ok(h) => h,
                    Err(e) => {
                        errors.push(format!(
                            "spec.hosts[{i}]: --host-template {:?} gives {full:?} for {name:?}: {e}",
                            t.as_str()
                        ));
                        continue;
                    }
                }
            }
            Host::Relative(name) => {
                let base = map_dns_name(name);
                let suffix = cfg.host_suffix.trim_matches('.');
                let full = match (base.is_empty(), suffix.is_empty()) {
                    (true, _) => String::new(),
                    (false, true) => base,
                    (false, false) => format!("{base}.{suffix}"),
                };
                match check_host(&full) {
                    Ok(h) => h,
                    Err(_) => {
                        errors.push(format!(
                            "spec.hosts[{i}]: registry name {name:?} does not map to a valid DNS name (got {full:?})"
                        ));
                        continue;
                    }
                }
            }
        };
        if !out.contains(&h) {
            out.push(h);
        }
    }
    out
}

fn ports(model: Vec<Port>, errors: &mut Vec<String>) -> Vec<ServicePort> {
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    let mut out = Vec::with_capacity(model.len());
    for (i, p) in model.into_iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        if p.number == 0 || p.number > 65535 {
            errors.push(format!("{field}.number: {} is not in 1-65535", p.number));
        } else if !numbers.insert(p.number) {
            errors.push(format!("{field}.number: {} is used twice", p.number));
        }
        if !is_dns_label(&p.name) {
            errors.push(format!(
                "{field}.name: {:?} is not a DNS label (lower-case letters, digits, '-')",
                p.name
            ));
        } else if !names.insert(p.name.clone()) {
            errors.push(format!("{field}.name: {:?} is used twice", p.name));
        }
        let protocol = match p.protocol.as_deref() {
            None | Some("") => String::new(),
            Some(proto) => match canonical_protocol(proto) {
                Some(c) => c.to_string(),
                None => {
                    errors.push(format!(
                        "{field}.protocol: {proto:?} is not an Istio protocol (HTTP, HTTP2, HTTPS, GRPC, GRPC-Web, TCP, TLS, UDP, Mongo, Redis, MySQL, HTTP_PROXY)"
                    ));
                    String::new()
                }
            },
        };
        if let Some(t) = p.target_port {
            if t == 0 || t > 65535 {
                errors.push(format!("{field}.targetPort: {t} is not in 1-65535"));
            }
        }
        out.push(ServicePort {
            number: p.number,
            protocol,
            name: p.name,
            target_port: p.target_port.unwrap_or(0),
        });
    }
    out
}

fn addresses(model: Vec<String>, resolution: Resolution, errors: &mut Vec<String>) -> Vec<String> {
    for (i, a) in model.iter().enumerate() {
        let (ip, prefix) = match a.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (a.as_str(), None),
        };
        let ok = match (ip.parse::<IpAddr>(), prefix) {
            (Ok(_), None) => true,
            (Ok(addr), Some(p)) => {
                let max = if addr.is_ipv4() { 32 } else { 128 };
                // Digits only, no leading zero: Go's netip.ParsePrefix, which Istio uses,
                // refuses `/08` and `/+8` that `parse` takes.
                let canonical =
                    p.bytes().all(|b| b.is_ascii_digit()) && (p.len() == 1 || !p.starts_with('0'));
                canonical
                    && p.parse::<u8>().is_ok_and(|p| p <= max)
                    && matches!(resolution, Resolution::None | Resolution::Static)
            }
            (Err(_), _) => false,
        };
        if !ok {
            errors.push(format!(
                "spec.addresses[{i}]: {a:?} is not an IP address (or a CIDR with resolution NONE/STATIC)"
            ));
        }
    }
    model
}

fn export_to(
    model: Vec<String>,
    cfg: &TranslateConfig,
    namespace: &str,
    errors: &mut Vec<String>,
) -> Vec<String> {
    let list = if model.is_empty() {
        cfg.export_to.clone()
    } else {
        model
    };
    // Istio's validateExportTo: `.` is the entry's own namespace, so `.` and that namespace
    // are a duplicate too.
    let mut seen = BTreeSet::new();
    for (i, e) in list.iter().enumerate() {
        if !(e == "*" || e == "." || e == "~" || is_dns_label(e)) {
            errors.push(format!(
                "spec.exportTo[{i}]: {e:?} is not '*', '.', '~' or a namespace"
            ));
        } else if !seen.insert(if e == "." { namespace } else { e.as_str() }) {
            errors.push(format!(
                "spec.exportTo[{i}]: {e:?} is listed twice (`.` is namespace {namespace:?})"
            ));
        }
    }
    for alone in ["*", "~"] {
        if list.len() > 1 && list.iter().any(|e| e == alone) {
            errors.push(format!(
                "spec.exportTo: '{alone}' cannot be combined with other entries"
            ));
        }
    }
    list
}

fn endpoints(
    model: Vec<Endpoint>,
    resolution: Resolution,
    ports: &[ServicePort],
    (max_labels, source): (usize, Option<[(String, String); 2]>),
    errors: &mut Vec<String>,
    warnings: &mut Vec<(WarningKind, String)>,
) -> Vec<Endpoint> {
    if resolution == Resolution::None {
        if !model.is_empty() {
            errors.push("spec.endpoints: resolution NONE cannot have endpoints".into());
        }
        return Vec::new();
    }
    let mut out = Vec::with_capacity(model.len());
    let mut checked = CheckedLabels::new(max_labels, source);
    for (i, mut ep) in model.into_iter().enumerate() {
        // Field paths are only formatted when something is wrong (this loop is the hot path).
        let field = || format!("spec.endpoints[{i}]");
        if let Err(e) = check_endpoint_address(&ep, resolution, ports.len()) {
            let field = field();
            warnings.push((
                WarningKind::Endpoint,
                format!("{field}.address: {e}; endpoint dropped"),
            ));
            continue;
        }
        if ep.address.starts_with(UNIX_PREFIX) && !ep.ports.is_empty() {
            // A socket has no port to map to, and Istio refuses the mapping.
            let field = field();
            warnings.push((
                WarningKind::EndpointPort,
                format!("{field}.ports: a Unix socket endpoint maps no ports; mappings dropped"),
            ));
            ep.ports.clear();
        }
        ep.ports.retain(|name, number| {
            let number = *number;
            if !ports.iter().any(|p| &p.name == name) {
                let field = field();
                warnings.push((
                    WarningKind::EndpointPort,
                    format!(
                        "{field}.ports: port name {name:?} is not a service port; mapping dropped"
                    ),
                ));
            } else if number == 0 || number > 65535 {
                let field = field();
                warnings.push((
                    WarningKind::EndpointPort,
                    format!("{field}.ports.{name}: {number} is not in 1-65535; mapping dropped"),
                ));
            } else {
                return true;
            }
            false
        });
        ep.labels = checked.clean(ep.labels, || format!("{}.labels", field()), warnings);
        out.push(ep);
    }
    // Registries list instances in no particular order; sorted output keeps versions stable.
    // (A missing weight sorts as the 0 it is encoded as.)
    out.sort_by(|a, b| {
        (&a.address, &a.ports, &a.labels, a.weight.unwrap_or(0)).cmp(&(
            &b.address,
            &b.ports,
            &b.labels,
            b.weight.unwrap_or(0),
        ))
    });
    if resolution == Resolution::DnsRoundRobin && out.len() > 1 {
        errors.push(format!(
            "spec.endpoints: DNS_ROUND_ROBIN allows at most one endpoint, got {}",
            out.len()
        ));
    }
    out
}

/// Whether Istio takes `ep`'s address under `resolution` (`validateWorkloadEntry` for STATIC,
/// the DNS branch of `ValidateServiceEntry` otherwise).
fn check_endpoint_address(
    ep: &Endpoint,
    resolution: Resolution,
    service_ports: usize,
) -> Result<(), String> {
    let a = ep.address.as_str();
    if a.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    if let Some(path) = a.strip_prefix(UNIX_PREFIX) {
        // `ValidateUnixAddress`: an abstract socket or an absolute path to a file; only STATIC
        // resolution takes sockets, and only for a service of exactly one port.
        let path_ok = path.starts_with('@') || (path.starts_with('/') && !path.ends_with('/'));
        return match resolution {
            Resolution::Static if !path_ok => Err(format!(
                "{a:?} is not an abstract socket (@name) or an absolute path to a file"
            )),
            Resolution::Static if service_ports != 1 => Err(format!(
                "{a:?}: a Unix socket endpoint needs exactly one service port, not {service_ports}"
            )),
            Resolution::Static => Ok(()),
            _ => Err(format!("{a:?}: only STATIC resolution takes Unix sockets")),
        };
    }
    match resolution {
        Resolution::Static => Err(format!(
            "{a:?} is not an IP address (STATIC resolution needs IPs)"
        )),
        // `check_host` trims, but the address is served as it is: no spaces around it.
        _ if a.trim() == a && check_host(a).is_ok() && !a.starts_with('*') => Ok(()),
        _ => Err(format!("{a:?} is neither an IP address nor a DNS name")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LabelSet, Port, ServiceKey};

    fn cfg() -> TranslateConfig {
        TranslateConfig {
            namespace: "consul".into(),
            host_suffix: "service.consul".into(),
            export_to: vec![],
            registry: "consul".into(),
            source: "dc1".into(),
            on_empty: crate::translate::OnEmpty::Keep,
            vip_cidr: crate::vip::VipCidr::Off,
            max_labels: crate::translate::DEFAULT_MAX_LABELS,
            naming: Default::default(),
        }
    }

    fn mk_service(name: &str) -> Service {
        let mut s = Service::new(ServiceKey::new(name), format!("test service {name}"));
        s.ports.push(Port {
            number: 8080,
            name: "http".into(),
            protocol: Some("http".into()),
            target_port: None,
        });
        s
    }

    fn mk_endpoint(addr: &str) -> Endpoint {
        Endpoint {
            address: addr.into(),
            ..Default::default()
        }
    }

    #[test]
    fn builds_a_valid_service_entry() {
        let mut s = mk_service("Web_Front");
        s.endpoints = vec![mk_endpoint("10.0.0.2"), mk_endpoint("10.0.0.1")];
        s.labels.insert("team".into(), "a".into());
        let t = translate(s.clone(), &cfg()).expect("valid");
        assert_eq!(t.name, "consul/web-front");
        assert_eq!(t.spec.hosts, vec!["web-front.service.consul"]);
        assert_eq!(t.spec.ports[0].protocol, "HTTP");
        assert_eq!(t.spec.resolution, service_entry::Resolution::Static as i32);
        assert_eq!(
            t.spec.location,
            service_entry::Location::MeshInternal as i32
        );
        // Sorted, whatever order the registry listed them in.
        assert_eq!(t.endpoints[0].address, "10.0.0.1");
        assert_eq!(t.service_entry().endpoints[0].address, "10.0.0.1");
        assert_eq!(
            t.labels.get(LABEL_REGISTRY).map(String::as_str),
            Some("consul")
        );
        assert_eq!(t.labels.get(LABEL_SOURCE).map(String::as_str), Some("dc1"));
        assert_eq!(t.labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(t.create_time, FIXED_CREATE_TIME);
        assert!(t.warnings.is_empty());
    }

    #[test]
    fn drops_bad_endpoints_labels_and_port_mappings_but_keeps_the_service() {
        let mut s = mk_service("web");
        let mut good = mk_endpoint("10.0.0.1");
        good.labels = [("ok", "v1"), ("bad key", "v"), ("k", "bad,value")]
            .into_iter()
            .collect();
        good.ports.insert("http".into(), 9090);
        good.ports.insert("nope".into(), 1);
        s.endpoints = vec![good, mk_endpoint("host.example.com")];
        let t = translate(s.clone(), &cfg()).expect("valid");
        assert_eq!(t.endpoints.len(), 1);
        let ep = &t.endpoints[0];
        assert_eq!(ep.labels.len(), 1);
        assert_eq!(ep.ports.get("http"), Some(&9090));
        assert!(!ep.ports.contains_key("nope"));
        assert_eq!(t.warnings.len(), 4, "{:?}", t.warnings);
        assert!(t
            .warnings
            .iter()
            .any(|(k, w)| *k == WarningKind::Endpoint && w.contains("spec.endpoints[1].address")));
    }

    /// Endpoints sharing a label set: checked once, warned about per endpoint, and the cleaned
    /// set is shared again.
    #[test]
    fn shared_label_sets_are_checked_once_and_warned_per_endpoint() {
        let mut s = mk_service("web");
        let bad: LabelSet = [("ok", "v1"), ("bad key", "v")].into_iter().collect();
        let good: LabelSet = [("ok", "v1")].into_iter().collect();
        s.endpoints = (1..=3)
            .map(|i| Endpoint {
                labels: if i == 2 { good.clone() } else { bad.clone() },
                ..mk_endpoint(&format!("10.0.0.{i}"))
            })
            .collect();
        let t = translate(s, &cfg()).expect("valid");
        let warned: Vec<&str> = t.warnings.iter().map(|(_, w)| w.as_str()).collect();
        assert_eq!(warned.len(), 2, "{warned:?}");
        assert!(
            warned[0].starts_with("spec.endpoints[0].labels: "),
            "{warned:?}"
        );
        assert!(
            warned[1].starts_with("spec.endpoints[2].labels: "),
            "{warned:?}"
        );
        assert!(t.endpoints.iter().all(|e| e.labels == good));
        assert!(t.endpoints[0].labels.ptr_eq(&t.endpoints[2].labels));
    }

    /// Registry metadata can carry any number of labels: each endpoint and the resource keep
    /// the first `--max-labels` valid ones by key, one `label_limit` warning per cut set; the
    /// selector is never cut (it would select more).
    #[test]
    fn labels_over_the_limit_are_cut_to_the_first_by_key_with_one_warning() {
        let many: LabelSet = (0..200)
            .map(|i| (format!("k{i:03}"), format!("v{i}")))
            .chain([("bad key".to_string(), "v".to_string())])
            .collect();
        let mut s = mk_service("web");
        s.labels = (0..70).map(|i| (format!("r{i:02}"), "x".into())).collect();
        s.workload_selector = Some((0..70).map(|i| (format!("s{i:02}"), "x".into())).collect());
        let mut c = cfg();
        c.max_labels = 64;
        let t = translate(s.clone(), &c).expect("valid");
        // The resource: 64 of its own plus registry and source.
        assert_eq!(t.labels.len(), 66);
        assert!(t.labels.contains_key("r63") && !t.labels.contains_key("r64"));
        assert_eq!(
            t.spec.workload_selector.as_ref().map(|w| w.labels.len()),
            Some(70)
        );
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert_eq!(t.warnings[0].0, WarningKind::LabelLimit);
        assert_eq!(
            t.warnings[0].1,
            "metadata.labels: 70 labels, more than --max-labels 64; kept the first 64 by key, \
             dropped 6: \"r64\", \"r65\", \"r66\", \"r67\", \"r68\" and 1 more"
        );

        s.workload_selector = None;
        s.labels.clear();
        s.endpoints = (1..=3)
            .map(|i| Endpoint {
                labels: many.clone(),
                ..mk_endpoint(&format!("10.0.0.{i}"))
            })
            .collect();
        let t = translate(s, &c).expect("valid");
        for ep in &t.endpoints {
            assert_eq!(ep.labels.len(), 64);
            assert_eq!(ep.labels.get("k063"), Some("v63"));
            assert_eq!(ep.labels.get("k064"), None);
        }
        // The cut set is computed once and shared by the endpoints that shared the given one.
        assert!(t.endpoints[0].labels.ptr_eq(&t.endpoints[2].labels));
        let kinds = |k| t.warnings.iter().filter(|(w, _)| *w == k).count();
        assert_eq!(
            kinds(WarningKind::Label),
            3,
            "the invalid one, per endpoint"
        );
        assert_eq!(kinds(WarningKind::LabelLimit), 3, "one per endpoint");
        assert!(t.warnings.iter().any(|(k, w)| *k == WarningKind::LabelLimit
            && w.starts_with("spec.endpoints[1].labels: 200 labels, more than --max-labels 64")
            && w.contains("dropped 136: \"k064\"")));

        // At the limit: nothing cut, the given set kept as is.
        let mut s = mk_service("web");
        let exact: LabelSet = (0..64).map(|i| (format!("k{i:03}"), "v")).collect();
        s.endpoints = vec![Endpoint {
            labels: exact.clone(),
            ..mk_endpoint("10.0.0.1")
        }];
        let t = translate(s, &c).expect("valid");
        assert!(t.warnings.is_empty());
        assert!(t.endpoints[0].labels.ptr_eq(&exact));
    }

    #[test]
    fn rejects_with_every_reason_and_the_field() {
        let mut s = mk_service("web");
        s.ports.push(Port {
            number: 8080,
            name: "HTTP".into(),
            protocol: Some("dubbo".into()),
            target_port: None,
        });
        s.hosts.push(Host::Absolute("bad_host".into()));
        let err = translate(s.clone(), &cfg()).expect_err("invalid");
        assert_eq!(err.origin, "test service web");
        let all = err.errors.join("\n");
        assert!(
            all.contains("spec.ports[1].number: 8080 is used twice"),
            "{all}"
        );
        assert!(all.contains("spec.ports[1].name"), "{all}");
        assert!(all.contains("spec.ports[1].protocol"), "{all}");
        assert!(all.contains("spec.hosts[1]"), "{all}");
    }

    #[test]
    fn resolution_rules() {
        let mut s = mk_service("web");
        s.resolution = Resolution::None;
        s.endpoints = vec![mk_endpoint("10.0.0.1")];
        assert!(translate(s.clone(), &cfg()).is_err());

        let mut s = mk_service("web");
        s.resolution = Resolution::DnsRoundRobin;
        s.endpoints = vec![mk_endpoint("a.example.com"), mk_endpoint("b.example.com")];
        assert!(translate(s.clone(), &cfg()).is_err());

        let mut s = mk_service("web");
        s.resolution = Resolution::Dns;
        s.endpoints = vec![mk_endpoint("a.example.com")];
        assert!(translate(s.clone(), &cfg()).is_ok());

        // Several hosts on a TCP port cannot be told apart.
        let mut s = mk_service("web");
        s.ports[0].protocol = Some("TCP".into());
        s.hosts.push(Host::Absolute("other.example.com".into()));
        assert!(translate(s.clone(), &cfg()).is_err());
    }

    #[test]
    fn namespace_export_to_and_addresses() {
        let mut s = mk_service("web");
        s.key = ServiceKey::namespaced("Bad_NS", "web");
        s.export_to = vec!["*".into(), "ns1".into()];
        s.addresses = vec!["10.0.0.0/33".into(), "nope".into()];
        let all = translate(s.clone(), &cfg())
            .expect_err("invalid")
            .errors
            .join("\n");
        assert!(all.contains("metadata.namespace"), "{all}");
        assert!(all.contains("spec.exportTo"), "{all}");
        assert!(all.contains("spec.addresses[0]"), "{all}");
        assert!(all.contains("spec.addresses[1]"), "{all}");

        let mut s = mk_service("web");
        s.addresses = vec!["240.0.0.1".into(), "10.1.0.0/16".into()];
        let mut c = cfg();
        c.export_to = vec![".".into()];
        let t = translate(s.clone(), &c).expect("valid");
        assert_eq!(t.spec.export_to, vec!["."]);
    }
}
