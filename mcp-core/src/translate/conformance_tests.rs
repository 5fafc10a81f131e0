//! `translate` never builds a ServiceEntry that Istio refuses: every service it accepts passes
//! [`istio_rules::check`] (Istio's `ValidateServiceEntry`, mirrored and held to Istio's Go code by
//! `tests/tests/istio_validation.rs`). Seeded services with registry data at the edges of
//! Istio's rules, and one regression test for each gap this found.

use std::collections::BTreeMap;

use super::istio_rules;
use super::{test_config, translate, OnEmpty, TranslateConfig};
use crate::model::{Endpoint, Host, Labels, Port, Resolution, Service, ServiceKey};
use crate::testing::{mk_http_service, splitmix64};
use crate::vip::VipCidr;

/// splitmix64, seeded: a failure names the case number to replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `usual` two times in three, else one of the edge cases: most services then break one
    /// rule or none, and each rule is what decides.
    fn edge<'a>(&mut self, usual: &'a str, edges: &[&'a str]) -> &'a str {
        if self.below(3) == 0 {
            self.pick(edges)
        } else {
            usual
        }
    }
}

const NAMES: &[&str] = &[
    "web",
    "Web_Front",
    "1.2.3.4",
    "svc-1.2",
    "v1.0",
    "a.123",
    "123",
    "*",
    "*.x",
    "",
    "-",
    "é",
    "providers:com.foo.Api:1.0:grp",
    "a..b",
    "x.",
    " web ",
    "a b",
];
const ABSOLUTE: &[&str] = &[
    "web.example",
    "Web.Example",
    "*.example",
    "*",
    "a.123",
    "123",
    "web.example.",
    " web.x ",
    "*.123",
    "9.9.9.9",
];
const SUFFIXES: &[&str] = &["", "example", "svc.cluster.local", "123", "consul.", "."];
const ADDRESSES: &[&str] = &[
    "10.0.0.1",
    "10.0.0.0/8",
    "10.0.0.0/08",
    "10.0.0.0/+8",
    "10.0.0.0/33",
    "2001:db8::/64",
    "fe80::1%eth0",
    "::ffff:1.2.3.4",
    "01.2.3.4",
    "x",
    "",
];
const EP_ADDRESSES: &[&str] = &[
    "10.0.0.1",
    "10.0.0.2",
    "2001:db8::1",
    "fe80::1%eth0",
    "host.example",
    "Host.Example",
    " host.example",
    "host.example ",
    "10.0.0",
    "host.123",
    "123",
    "*.example",
    "unix:///var/run/a.sock",
    "unix://@abs",
    "unix://rel",
    "unix://",
    "unix:///dir/",
    "",
    "a_b.example",
    "1.2.3.4:80",
];
const PORT_NAMES: &[&str] = &["http", "tcp", "grpc", "HTTP", "", "a_b", "p-1"];
const PROTOCOLS: &[&str] = &["", "http", "TCP", "tls", "grpc", "https", "dubbo", "UDP"];
const LABEL_KEYS: &[&str] = &[
    "app",
    "",
    "a/b/c",
    "Example.com/app",
    "k*",
    "-a",
    "ex.com/app",
];
const LABEL_VALUES: &[&str] = &["", "v1", "a,b", "-v", "*", "x.y_z"];
const EXPORT_TO: &[&str] = &[".", "*", "~", "ns", "other", "Bad", "", "a"];

fn service(rng: &mut Rng) -> (Service, TranslateConfig) {
    let mut cfg = test_config(OnEmpty::Keep, VipCidr::Off);
    cfg.host_suffix = rng.edge("example", SUFFIXES).into();
    if rng.below(5) == 0 {
        cfg.export_to = (0..rng.below(3))
            .map(|_| rng.pick(EXPORT_TO).into())
            .collect();
    }
    let mut s = Service::new(ServiceKey::new(rng.edge("web", NAMES)), "generated");
    s.hosts = (0..1 + rng.below(2))
        .map(|_| {
            if rng.below(3) == 0 {
                Host::Absolute(rng.edge("web.example", ABSOLUTE).into())
            } else {
                Host::Relative(rng.edge("web", NAMES).into())
            }
        })
        .collect();
    s.addresses = (0..rng.below(2))
        .map(|_| rng.edge("10.0.0.1", ADDRESSES).into())
        .collect();
    s.ports = (0..rng.below(3))
        .map(|i| Port {
            number: [80, 443, 8080, 80, 443, 0, 65536][rng.below(7) as usize] + i as u32,
            name: rng.pick(PORT_NAMES).into(),
            protocol: Some(rng.edge("http", PROTOCOLS).into()).filter(|p: &String| !p.is_empty()),
            target_port: [None, None, None, Some(8080), Some(0), Some(70000)]
                [rng.below(6) as usize],
        })
        .collect();
    s.resolution = [
        Resolution::None,
        Resolution::Static,
        Resolution::Dns,
        Resolution::DnsRoundRobin,
    ][rng.below(4) as usize];
    s.endpoints = (0..rng.below(4))
        .map(|_| {
            let labels: Labels = (0..rng.below(3))
                .map(|_| (rng.pick(LABEL_KEYS).into(), rng.pick(LABEL_VALUES).into()))
                .collect();
            let ports: BTreeMap<String, u32> = (0..rng.below(3))
                .map(|_| {
                    (
                        rng.pick(PORT_NAMES).into(),
                        [9090, 0, 70000][rng.below(3) as usize],
                    )
                })
                .collect();
            Endpoint {
                address: rng.edge("10.0.0.1", EP_ADDRESSES).into(),
                ports,
                labels: (&labels).into(),
                ..Default::default()
            }
        })
        .collect();
    if rng.below(3) == 0 {
        s.export_to = (0..rng.below(3))
            .map(|_| rng.pick(EXPORT_TO).into())
            .collect();
    }
    if rng.below(6) == 0 {
        s.workload_selector = Some(
            (0..rng.below(3))
                .map(|_| (rng.pick(LABEL_KEYS).into(), rng.pick(LABEL_VALUES).into()))
                .collect(),
        );
    }
    (s, cfg)
}

/// Translates `s`; if that succeeds, returns Istio's errors for the result.
fn istio_errors(s: Service, cfg: &TranslateConfig) -> Option<Vec<String>> {
    let t = translate(s, cfg).ok()?;
    let namespace = t.name.split_once('/').map_or("", |(ns, _)| ns).to_string();
    istio_rules::check(&t.service_entry(), &namespace).err()
}

#[test]
fn translate_never_builds_what_istio_refuses() {
    let mut rng = Rng(46);
    let mut accepted = 0;
    // One example for each first error Istio gives (up to the digits in it), so that one run
    // shows every kind of gap.
    let mut found = BTreeMap::new();
    for case in 0..50_000 {
        let (s, cfg) = service(&mut rng);
        let shown = format!("{s:?} with suffix {:?}", cfg.host_suffix);
        if translate(s.clone(), &cfg).is_ok() {
            accepted += 1;
        }
        if let Some(errors) = istio_errors(s, &cfg) {
            let kind: String = errors[0].chars().filter(|c| !c.is_ascii_digit()).collect();
            found
                .entry(kind)
                .or_insert_with(|| format!("case {case}: {errors:?}\n  {shown}"));
        }
    }
    assert!(
        found.is_empty(),
        "translate accepted {} kinds of ServiceEntry that Istio refuses:\n{}",
        found.len(),
        found.into_values().collect::<Vec<_>>().join("\n")
    );
    // The generator must reach valid services often enough for this to mean something.
    assert!(accepted > 5_000, "only {accepted} of 50000 accepted");
}

/// A service with one relative host, one HTTP port and one endpoint, edited by `edit`, then
/// translated with the test settings (namespace `ns`, suffix `example`).
fn one(edit: impl FnOnce(&mut Service, &mut TranslateConfig)) -> Result<super::Translated, String> {
    let mut cfg = test_config(OnEmpty::Keep, VipCidr::Off);
    let mut s = mk_http_service("web", "10.0.0.1");
    edit(&mut s, &mut cfg);
    let t = translate(s, &cfg).map_err(|e| e.to_string())?;
    istio_rules::check(&t.service_entry(), "ns").map_err(|e| format!("served invalid: {e:?}"))?;
    Ok(t)
}

#[test]
fn numeric_top_level_labels_are_refused() {
    // A registry name ending in a number (`svc-1.2`, an IP used as a name) with no suffix.
    assert!(one(|s, c| {
        c.host_suffix.clear();
        s.hosts = vec![Host::Relative("svc-1.2".into())];
    })
    .is_err());
    assert!(one(|_, c| c.host_suffix = "123".into()).is_err());
    assert!(one(|s, _| s.hosts = vec![Host::Absolute("9.9.9.9".into())]).is_err());
    // As a DNS endpoint's name it is dropped, as other bad names are.
    let t = one(|s, _| {
        s.resolution = Resolution::Dns;
        s.endpoints = vec![
            Endpoint {
                address: "10.0.0".into(),
                ..Default::default()
            },
            Endpoint {
                address: "db.example".into(),
                ..Default::default()
            },
        ];
    })
    .expect("valid");
    assert_eq!(t.endpoints.len(), 1);
    assert_eq!(t.endpoints[0].address, "db.example");
}

#[test]
fn dns_endpoint_names_with_spaces_are_dropped() {
    let t = one(|s, _| {
        s.resolution = Resolution::Dns;
        s.endpoints[0].address = " db.example".into();
    })
    .expect("valid");
    assert!(t.endpoints.is_empty(), "{:?}", t.endpoints);
}

#[test]
fn cidr_prefix_lengths_are_plain_decimal() {
    for bad in ["10.0.0.0/08", "10.0.0.0/+8", "10.0.0.0/"] {
        assert!(one(|s, _| s.addresses = vec![bad.into()]).is_err(), "{bad}");
    }
    for good in ["10.0.0.0/8", "10.0.0.0/0", "2001:db8::/64"] {
        one(|s, _| s.addresses = vec![good.into()]).expect(good);
    }
}

#[test]
fn export_to_has_no_duplicates_and_none_stands_alone() {
    let with = |list: &[&str]| {
        let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        one(move |s, _| s.export_to = list)
    };
    assert!(with(&["a", "a"]).is_err());
    assert!(with(&[".", "ns"]).is_err());
    assert!(with(&["~", "a"]).is_err());
    assert!(with(&["*", "a"]).is_err());
    with(&[".", "a"]).expect("valid");
    with(&["~"]).expect("valid");
}

#[test]
fn unix_socket_endpoints_follow_istio() {
    let unix = |address: &str, edit: fn(&mut Service)| {
        let address = address.to_string();
        one(move |s, _| {
            s.endpoints[0].address = address;
            edit(s);
        })
        .expect("the service stays")
        .endpoints
    };
    // Kept: an absolute path or an abstract socket, with STATIC and one service port; its port
    // mappings are dropped.
    let kept = unix("unix:///run/a.sock", |s| {
        s.endpoints[0].ports.insert("http".into(), 8080);
    });
    assert_eq!(kept.len(), 1);
    assert!(kept[0].ports.is_empty());
    assert_eq!(unix("unix://@abstract", |_| {}).len(), 1);
    // Dropped: a relative or empty path, a directory, DNS resolution, two service ports.
    assert!(unix("unix://run/a.sock", |_| {}).is_empty());
    assert!(unix("unix://", |_| {}).is_empty());
    assert!(unix("unix:///run/", |_| {}).is_empty());
    assert!(unix("unix:///run/a.sock", |s| s.resolution = Resolution::Dns).is_empty());
    assert!(unix("unix:///run/a.sock", |s| s.ports.push(Port {
        number: 81,
        name: "web".into(),
        protocol: None,
        target_port: None,
    }))
    .is_empty());
}

#[test]
fn dns_without_endpoints_needs_plain_hosts_even_with_a_selector() {
    let r = one(|s, _| {
        s.resolution = Resolution::Dns;
        s.endpoints.clear();
        s.hosts = vec![Host::Absolute("*.example".into())];
        s.workload_selector = Some([("app".to_string(), "web".to_string())].into());
    });
    assert!(r.is_err_and(|e| e.contains("without wildcards")));
}
