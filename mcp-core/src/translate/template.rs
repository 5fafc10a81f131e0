//! Naming controls shared by every adapter, for one service fed by several registries
//! (`--host-template`, `--name-template`, `--port-name`, `--endpoint-source-labels`).
//!
//! istiod merges the endpoints of ServiceEntries that have one host in one namespace and ports
//! of one name, but two sources' entries with one `namespace/name` are not merged: the first
//! source listed wins wholly (tests/tests/istiod_merge_rules.rs). So two adapters that serve
//! one service during a move need one host, distinct names, and matching port names; and, to
//! shift traffic by weight, endpoints that say which registry they came from.
//!
//! A template is text with `{part}`s: each part is one of the registry's own parts of a service's
//! name (`service` everywhere; Nacos' `group` and `namespace`, ...), mapped to DNS labels when
//! rendered. What can be decided at start is: a part the registry does not have, text that cannot
//! be in a host or name, and a template without the part that tells services apart (every
//! service of the source would get one host, or one name); such a template is refused then,
//! naming the flag. What depends on the registry's content (a value that maps to nothing) is
//! reported per service, like any invalid service.

use std::collections::BTreeMap;

use super::naming::{map_dns_name, map_resource_name};

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    text: String,
    pieces: Vec<Piece>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Part(String),
}

/// What a template or a port name flag cannot be.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// A `{` without its `}`, or a `}` alone.
    #[error("{flag} {text:?}: unbalanced braces")]
    Braces {
        /// The flag.
        flag: &'static str,
        /// The template.
        text: String,
    },
    /// A part the registry does not have.
    #[error("{flag} {text:?}: unknown part {{{part}}}; this registry has {known}")]
    UnknownPart {
        /// The flag.
        flag: &'static str,
        /// The template.
        text: String,
        /// The part.
        part: String,
        /// The parts it has, spelled as in a template.
        known: String,
    },
    /// Text that cannot be part of the result.
    #[error("{flag} {text:?}: {what:?} cannot be in a {target} (lower-case letters, digits, '-' and '.' only)")]
    Text {
        /// The flag.
        flag: &'static str,
        /// The template.
        text: String,
        /// The offending text.
        what: String,
        /// A host or a resource name.
        target: &'static str,
    },
    /// Without the part that tells services apart, every service gets one result.
    #[error("{flag} {text:?}: needs {{{part}}}: without it every service of this source would get the same {target}")]
    Missing {
        /// The flag.
        flag: &'static str,
        /// The template.
        text: String,
        /// The part it needs.
        part: &'static str,
        /// A host or a resource name.
        target: &'static str,
    },
    /// `--port-name` is not `NUMBER=NAME`.
    #[error("--port-name {0:?}: expected NUMBER=NAME or NUMBER=NAME/PROTOCOL, e.g. 8080=http/HTTP (NAME a DNS label, NUMBER 1-65535, PROTOCOL one of Istio's)")]
    PortName(String),
    /// One port number given two names.
    #[error("--port-name: port {0} is named twice")]
    PortTwice(u32),
}

impl Template {
    /// Parses `text` for `flag`: parts from `known`, `required` among them, the text between
    /// parts allowed in a host (`dots`) or a resource name.
    fn parse(
        flag: &'static str,
        text: &str,
        known: &[&str],
        required: &'static str,
        target: &'static str,
    ) -> Result<Self, TemplateError> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                Some(i) if rest.as_bytes()[i] == b'{' => {
                    if i > 0 {
                        pieces.push(Piece::Text(rest[..i].to_string()));
                    }
                    let close = rest[i..].find('}').ok_or_else(|| TemplateError::Braces {
                        flag,
                        text: text.to_string(),
                    })?;
                    let part = &rest[i + 1..i + close];
                    if part.contains('{') {
                        return Err(TemplateError::Braces {
                            flag,
                            text: text.to_string(),
                        });
                    }
                    if !known.contains(&part) {
                        return Err(TemplateError::UnknownPart {
                            flag,
                            text: text.to_string(),
                            part: part.to_string(),
                            known: known
                                .iter()
                                .map(|k| format!("{{{k}}}"))
                                .collect::<Vec<_>>()
                                .join(", "),
                        });
                    }
                    pieces.push(Piece::Part(part.to_string()));
                    rest = &rest[i + close + 1..];
                }
                Some(_) => {
                    return Err(TemplateError::Braces {
                        flag,
                        text: text.to_string(),
                    })
                }
                None => {
                    pieces.push(Piece::Text(rest.to_string()));
                    rest = "";
                }
            }
        }
        for p in &pieces {
            if let Piece::Text(t) = p {
                let ok =
                    |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
                if !t.chars().all(ok) {
                    return Err(TemplateError::Text {
                        flag,
                        text: text.to_string(),
                        what: t.clone(),
                        target,
                    });
                }
            }
        }
        if !pieces.contains(&Piece::Part(required.to_string())) {
            return Err(TemplateError::Missing {
                flag,
                text: text.to_string(),
                part: required,
                target,
            });
        }
        Ok(Self {
            text: text.to_string(),
            pieces,
        })
    }

    /// `--host-template`: parts from `known` (the registry's), `{service}` required.
    pub fn host(text: &str, known: &[&str]) -> Result<Self, TemplateError> {
        Self::parse("--host-template", text, known, "service", "host")
    }

    /// `--name-template`: `{name}` (the name the adapter would give), `{registry}`, `{source}`.
    pub fn name(text: &str) -> Result<Self, TemplateError> {
        Self::parse(
            "--name-template",
            text,
            &["name", "registry", "source"],
            "name",
            "resource name",
        )
    }

    /// The template as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The result with each part's value from `value`, mapped by `map` (a part without a value
    /// renders empty, which the caller's validation then reports).
    fn render<'a>(
        &self,
        value: impl Fn(&str) -> Option<&'a str>,
        map: fn(&str) -> String,
    ) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Part(name) => out.push_str(&map(value(name).unwrap_or_default())),
            }
        }
        out
    }

    /// A host: each part's value mapped to a dotted DNS name.
    pub fn render_host<'a>(&self, value: impl Fn(&str) -> Option<&'a str>) -> String {
        self.render(value, map_dns_name)
    }

    /// A resource name: each part's value mapped to a resource name (DNS labels and dots).
    pub fn render_name<'a>(&self, value: impl Fn(&str) -> Option<&'a str>) -> String {
        self.render(value, map_resource_name)
    }
}

/// What `--port-name` makes of one service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortRename {
    /// Its name.
    pub name: String,
    /// Its protocol, when given (`8080=http/HTTP`); else the registry's stays.
    pub protocol: Option<&'static str>,
}

/// Parses `--port-name NUMBER=NAME[/PROTOCOL]` values into a map.
pub fn port_names(values: &[String]) -> Result<BTreeMap<u32, PortRename>, TemplateError> {
    let mut out = BTreeMap::new();
    for v in values {
        let bad = || TemplateError::PortName(v.clone());
        let (number, rest) = v.split_once('=').ok_or_else(bad)?;
        let number: u32 = number.trim().parse().map_err(|_| bad())?;
        let (name, protocol) = match rest.split_once('/') {
            Some((name, p)) => (
                name.trim(),
                Some(super::naming::canonical_protocol(p.trim()).ok_or_else(bad)?),
            ),
            None => (rest.trim(), None),
        };
        if number == 0 || number > 65535 || !super::naming::is_dns_label(name) {
            return Err(bad());
        }
        let rename = PortRename {
            name: name.to_string(),
            protocol,
        };
        if out.insert(number, rename).is_some() {
            return Err(TemplateError::PortTwice(number));
        }
    }
    Ok(out)
}

/// The naming controls of one adapter; the default changes nothing.
#[derive(Clone, Debug, Default)]
pub struct Naming {
    /// `--host-template`: replaces every relative host (a registry name) of a service.
    pub host: Option<Template>,
    /// `--name-template`: the resource name.
    pub name: Option<Template>,
    /// `--port-name`: service port number -> name (and protocol).
    pub port_names: BTreeMap<u32, PortRename>,
    /// `--endpoint-source-labels`: every endpoint labelled with the registry type and source.
    pub endpoint_source_labels: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, Host, Port, Service, ServiceKey};
    use crate::translate::{test_config, translate, OnEmpty, LABEL_REGISTRY, LABEL_SOURCE};
    use crate::vip::VipCidr;

    fn nacos_orders(group: &str) -> Service {
        let mut s = Service::new(
            ServiceKey::new(format!("orders.{group}.public")),
            "nacos orders",
        );
        s.hosts = vec![Host::Relative(format!("orders.{group}.public"))];
        s.name_parts = vec![
            ("service", "orders".into()),
            ("group", group.into()),
            ("namespace", "public".into()),
        ];
        s.ports.push(Port {
            number: 8080,
            name: "http-8080".into(),
            protocol: Some("HTTP".into()),
            target_port: None,
        });
        let mut ep = Endpoint {
            address: "10.0.0.1".into(),
            labels: [("zone", "a")].into_iter().collect(),
            ..Default::default()
        };
        ep.ports.insert("http-8080".into(), 18080);
        s.endpoints.push(ep);
        s
    }

    #[test]
    fn one_host_distinct_names_one_port_name_and_labelled_endpoints() {
        let mut cfg = test_config(OnEmpty::Keep, VipCidr::Off);
        cfg.registry = "nacos".into();
        cfg.source = "nacos-prod".into();
        cfg.naming = Naming {
            host: Some(Template::host("{service}.shop.svc.cluster.local", NACOS).expect("t")),
            name: Some(Template::name("{name}-{registry}").expect("t")),
            port_names: port_names(&["8080=http/TCP".into()]).expect("ports"),
            endpoint_source_labels: true,
        };
        let t = translate(nacos_orders("DEFAULT_GROUP"), &cfg).expect("valid");
        assert_eq!(t.spec.hosts, ["orders.shop.svc.cluster.local"]);
        assert_eq!(t.name, "ns/orders.default-group.public-nacos");
        assert_eq!(t.spec.ports[0].name, "http");
        assert_eq!(t.spec.ports[0].protocol, "TCP", "the protocol given");
        let ep = &t.endpoints[0];
        assert_eq!(
            ep.ports.get("http"),
            Some(&18080),
            "the endpoint's port follows the rename"
        );
        assert_eq!(ep.labels.get(LABEL_REGISTRY), Some("nacos"));
        assert_eq!(ep.labels.get(LABEL_SOURCE), Some("nacos-prod"));
        assert_eq!(ep.labels.get("zone"), Some("a"), "its own labels stay");
        // Without the controls: today's host, name, port name and labels.
        let plain = test_config(OnEmpty::Keep, VipCidr::Off);
        let t = translate(nacos_orders("DEFAULT_GROUP"), &plain).expect("valid");
        assert_eq!(t.spec.hosts, ["orders.default-group.public.example"]);
        assert_eq!(t.name, "ns/orders.default-group.public");
        assert_eq!(t.spec.ports[0].name, "http-8080");
        assert!(t.endpoints[0].labels.get(LABEL_REGISTRY).is_none());
    }

    #[test]
    fn what_depends_on_the_registry_is_reported_per_service() {
        let mut cfg = test_config(OnEmpty::Keep, VipCidr::Off);
        cfg.naming.host = Some(Template::host("{group}-{service}.mesh", NACOS).expect("t"));
        // A group that maps to nothing leaves a host starting with '-'.
        let err = translate(nacos_orders("__"), &cfg).expect_err("invalid host");
        assert!(
            err.errors[0]
                .contains("--host-template \"{group}-{service}.mesh\" gives \"-orders.mesh\""),
            "{:?}",
            err.errors
        );
        // Two ports renamed to one name.
        let mut cfg = test_config(OnEmpty::Keep, VipCidr::Off);
        cfg.naming.port_names = port_names(&["8080=http".into(), "9090=http".into()]).expect("p");
        let mut s = nacos_orders("g");
        s.ports.push(Port {
            number: 9090,
            name: "grpc".into(),
            protocol: Some("GRPC".into()),
            target_port: None,
        });
        let err = translate(s, &cfg).expect_err("two ports named http");
        assert!(
            err.errors
                .iter()
                .any(|e| e.contains("\"http\" is used twice (after --port-name)")),
            "{:?}",
            err.errors
        );
    }

    const NACOS: &[&str] = &["service", "group", "namespace"];

    #[test]
    fn hosts_render_the_registrys_parts_mapped() {
        let t = Template::host("{service}.{group}.mesh", NACOS).expect("valid");
        let parts = [("service", "Orders_API"), ("group", "DEFAULT_GROUP")];
        let get = |k: &str| parts.iter().find(|(p, _)| *p == k).map(|(_, v)| *v);
        assert_eq!(t.render_host(get), "orders-api.default-group.mesh");
        assert_eq!(t.as_str(), "{service}.{group}.mesh");
    }

    #[test]
    fn names_take_name_registry_and_source() {
        let t = Template::name("{name}-{registry}").expect("valid");
        let get = |k: &str| match k {
            "name" => Some("orders"),
            "registry" => Some("consul"),
            _ => None,
        };
        assert_eq!(t.render_name(get), "orders-consul");
    }

    #[test]
    fn what_can_be_decided_at_start_is_refused_naming_the_flag() {
        let cases = [
            (
                Template::host("{service}.{dc}.mesh", NACOS),
                "--host-template \"{service}.{dc}.mesh\": unknown part {dc}; this registry has {service}, {group}, {namespace}",
            ),
            (
                Template::host("{group}.mesh", NACOS),
                "needs {service}: without it every service of this source would get the same host",
            ),
            (Template::host("{service.mesh", NACOS), "unbalanced braces"),
            (Template::host("{service}}.mesh", NACOS), "unbalanced braces"),
            (
                Template::host("{service}.Mesh_X", NACOS),
                "\".Mesh_X\" cannot be in a host",
            ),
            (
                Template::name("{name}_x"),
                "\"_x\" cannot be in a resource name",
            ),
            (Template::name("{source}"), "needs {name}"),
        ];
        for (got, want) in cases {
            let err = got.expect_err(want).to_string();
            assert!(err.contains(want), "{err}\nwanted: {want}");
        }
    }

    #[test]
    fn port_names_are_number_equals_label() {
        let m =
            port_names(&["8080=http/http".into(), " 9090 = grpc-admin ".into()]).expect("valid");
        assert_eq!(m[&8080].name, "http");
        assert_eq!(m[&8080].protocol, Some("HTTP"));
        assert_eq!(m[&9090].name, "grpc-admin");
        assert_eq!(m[&9090].protocol, None);
        for bad in [
            "http",
            "0=http",
            "70000=http",
            "80=Http_x",
            "x=http",
            "80=http/FTP",
        ] {
            let err = port_names(&[bad.into()]).expect_err(bad).to_string();
            assert!(err.contains("expected NUMBER=NAME"), "{bad}: {err}");
        }
        let err = port_names(&["80=a".into(), "80=b".into()]).expect_err("twice");
        assert_eq!(err, TemplateError::PortTwice(80));
    }
}
