use std::collections::BTreeMap;

use proto::istio::networking::v1alpha3::{
    service_entry::{Location, Resolution},
    ServiceEntry, WorkloadEntry, WorkloadSelector,
};

use super::*;
use crate::testing::{se_endpoint as ep, se_port as port};

/// A valid STATIC entry: one HTTP port, one endpoint.
fn base() -> ServiceEntry {
    ServiceEntry {
        hosts: vec!["svc.example".into()],
        ports: vec![port(80, "http", "HTTP")],
        resolution: Resolution::Static as i32,
        endpoints: vec![ep("10.0.0.1")],
        ..Default::default()
    }
}

fn ok(se: &ServiceEntry) -> bool {
    check(se, "ns").is_ok()
}

/// Asserts `edit` applied to [`base`] gives `valid`.
#[track_caller]
fn case(valid: bool, edit: impl FnOnce(&mut ServiceEntry)) {
    let mut se = base();
    edit(&mut se);
    assert_eq!(
        check(&se, "ns").is_ok(),
        valid,
        "{se:?}: {:?}",
        check(&se, "ns")
    );
}

#[test]
fn base_is_valid() {
    assert_eq!(check(&base(), "ns"), Ok(()));
}

#[test]
fn hosts() {
    case(false, |se| se.hosts.clear());
    case(false, |se| se.hosts = vec!["*".into()]);
    case(false, |se| se.hosts = vec!["".into()]);
    case(true, |se| se.hosts = vec!["*.example.com".into()]);
    // Partial wildcards and upper case only warn, or are fine.
    case(true, |se| se.hosts = vec!["*foo.example.com".into()]);
    case(true, |se| se.hosts = vec!["*-foo.example.com".into()]);
    case(true, |se| se.hosts = vec!["Foo.Example.COM".into()]);
    case(false, |se| se.hosts = vec!["a.*.example".into()]);
    case(false, |se| se.hosts = vec!["**.example".into()]);
    case(false, |se| se.hosts = vec!["a_b.example".into()]);
    case(false, |se| se.hosts = vec!["-a.example".into()]);
    // A trailing dot is fine, two are not.
    case(true, |se| se.hosts = vec!["svc.example.".into()]);
    case(false, |se| se.hosts = vec!["svc.example..".into()]);
    // A numeric top-level domain is refused, a one-label number is not (Istio splits the
    // first label off before that test), nor a number too big for 64 bits.
    case(false, |se| se.hosts = vec!["a.123".into()]);
    case(true, |se| se.hosts = vec!["123".into()]);
    case(true, |se| se.hosts = vec!["a.99999999999999999999".into()]);
    // Labels of 63 bytes, names of 255.
    let l63 = "a".repeat(63);
    case(true, |se| se.hosts = vec![format!("{l63}.example")]);
    case(false, |se| se.hosts = vec![format!("a{l63}.example")]);
    let name255 = format!("{l63}.{l63}.{l63}.{}", "b".repeat(63));
    assert_eq!(name255.len(), 255);
    case(true, |se| se.hosts = vec![name255.clone()]);
    case(false, |se| se.hosts = vec![format!("c{name255}")]);
}

#[test]
fn addresses() {
    case(true, |se| {
        se.addresses = vec!["10.0.0.1".into(), "2001:db8::1".into()]
    });
    case(true, |se| {
        se.addresses = vec!["10.0.0.0/8".into(), "2001:db8::/128".into()]
    });
    case(true, |se| se.addresses = vec!["fe80::1%eth0".into()]);
    case(false, |se| se.addresses = vec!["fe80::1%".into()]);
    case(false, |se| se.addresses = vec!["fe80::/64%eth0".into()]);
    case(false, |se| se.addresses = vec!["10.0.0.0/33".into()]);
    case(false, |se| se.addresses = vec!["10.0.0.0/08".into()]);
    case(false, |se| se.addresses = vec!["10.0.0.0/".into()]);
    case(false, |se| se.addresses = vec!["10.0.0.0/8/8".into()]);
    case(false, |se| se.addresses = vec!["010.0.0.1".into()]);
    case(false, |se| se.addresses = vec!["svc.example".into()]);
    // CIDRs only with NONE or STATIC.
    case(false, |se| {
        se.addresses = vec!["10.0.0.0/8".into()];
        se.resolution = Resolution::Dns as i32;
    });
    case(true, |se| {
        se.addresses = vec!["10.0.0.0/8".into()];
        se.resolution = Resolution::None as i32;
        se.endpoints.clear();
    });
}

#[test]
fn ports() {
    case(true, |se| se.ports = vec![]);
    case(true, |se| se.ports = vec![port(65535, "http", "")]);
    case(false, |se| se.ports = vec![port(0, "http", "HTTP")]);
    case(false, |se| se.ports = vec![port(65536, "http", "HTTP")]);
    case(false, |se| se.ports[0].target_port = 65536);
    case(true, |se| se.ports[0].target_port = 8080);
    case(false, |se| se.ports.push(port(81, "http", "HTTP")));
    case(false, |se| se.ports.push(port(80, "web", "HTTP")));
    case(false, |se| se.ports = vec![port(80, "", "HTTP")]);
    case(false, |se| se.ports = vec![port(80, "http_1", "HTTP")]);
    case(true, |se| se.ports = vec![port(80, "HTTP-1", "HTTP")]);
    case(false, |se| {
        se.ports = vec![port(80, &"p".repeat(64), "HTTP")]
    });
    // Protocols as `protocol.Parse`: any case, Istio's list only.
    case(true, |se| se.ports[0].protocol = "grpc-web".into());
    case(true, |se| se.ports[0].protocol = "mysql".into());
    case(false, |se| se.ports[0].protocol = "dubbo".into());
    case(false, |se| se.ports[0].protocol = "HBONE".into());
}

#[test]
fn resolution_none() {
    case(false, |se| se.resolution = Resolution::None as i32);
    case(true, |se| {
        se.resolution = Resolution::None as i32;
        se.endpoints.clear();
    });
    // The multiple-hosts rule does not apply to NONE.
    case(true, |se| {
        se.resolution = Resolution::None as i32;
        se.endpoints.clear();
        se.hosts.push("other.example".into());
        se.ports = vec![port(5432, "tcp", "TCP")];
    });
    case(false, |se| se.resolution = 7);
}

#[test]
fn static_endpoints() {
    case(true, |se| {
        se.endpoints = vec![ep("2001:db8::1"), ep("fe80::1%eth0")]
    });
    case(false, |se| se.endpoints = vec![ep("host.example")]);
    case(false, |se| se.endpoints = vec![ep("")]);
    // A missing address only warns when a network is named.
    case(true, |se| {
        se.endpoints = vec![WorkloadEntry {
            network: "n1".into(),
            ..Default::default()
        }]
    });
    case(true, |se| {
        se.endpoints = vec![ep("unix:///var/run/a.sock"), ep("unix://@abstract")]
    });
    case(false, |se| se.endpoints = vec![ep("unix://relative.sock")]);
    case(false, |se| se.endpoints = vec![ep("unix:///var/run/")]);
    case(false, |se| se.endpoints = vec![ep("unix://")]);
    case(false, |se| {
        let mut e = ep("unix:///a.sock");
        e.ports.insert("http".into(), 8080);
        se.endpoints = vec![e];
    });
    // A Unix endpoint needs exactly one service port name.
    case(false, |se| {
        se.endpoints = vec![ep("unix:///a.sock")];
        se.ports.push(port(81, "web", "HTTP"));
    });
    case(false, |se| {
        se.endpoints = vec![ep("unix:///a.sock")];
        se.ports.clear();
    });
    case(true, |se| {
        se.endpoints[0].ports.insert("http".into(), 8080);
    });
    case(false, |se| {
        se.endpoints[0].ports.insert("web".into(), 8080);
    });
    case(false, |se| {
        se.endpoints[0].ports.insert("http".into(), 0);
    });
    case(false, |se| {
        se.endpoints[0].ports.insert("http".into(), 65536);
    });
}

#[test]
fn dns_resolutions() {
    let dns = |se: &mut ServiceEntry| se.resolution = Resolution::Dns as i32;
    case(true, dns);
    case(true, |se| {
        dns(se);
        se.endpoints = vec![ep("backend.example"), ep("10.0.0.2")];
    });
    case(false, |se| {
        dns(se);
        se.endpoints = vec![ep("backend_1.example")];
    });
    case(false, |se| {
        dns(se);
        se.endpoints = vec![ep("unix:///a.sock")];
    });
    // Without endpoints every host must be an FQDN: no wildcard.
    case(false, |se| {
        dns(se);
        se.endpoints.clear();
        se.hosts = vec!["*.example".into()];
    });
    case(true, |se| {
        dns(se);
        se.hosts = vec!["*.example".into()];
    });
    case(false, |se| {
        dns(se);
        se.endpoints.clear();
        se.hosts = vec!["123".into()];
    });
    case(false, |se| {
        dns(se);
        se.endpoints[0].ports.insert("web".into(), 8080);
    });
    case(false, |se| {
        dns(se);
        se.endpoints[0].labels.insert("bad key".into(), "v".into());
    });
    let rr = |se: &mut ServiceEntry| se.resolution = Resolution::DnsRoundRobin as i32;
    case(true, rr);
    case(false, |se| {
        rr(se);
        se.endpoints.push(ep("10.0.0.2"));
    });
}

#[test]
fn dynamic_dns() {
    let dyn_dns = |se: &mut ServiceEntry| {
        se.resolution = Resolution::DynamicDns as i32;
        se.hosts = vec!["*.example".into()];
        se.endpoints.clear();
    };
    case(true, dyn_dns);
    case(true, |se| {
        dyn_dns(se);
        se.location = Location::MeshInternal as i32;
        se.hosts = vec!["*foo.example".into()];
    });
    case(false, |se| {
        dyn_dns(se);
        se.location = 2;
    });
    case(false, |se| {
        dyn_dns(se);
        se.hosts = vec!["svc.example".into()];
    });
    case(false, |se| {
        dyn_dns(se);
        se.addresses = vec!["10.0.0.1".into()];
    });
    case(false, |se| {
        dyn_dns(se);
        se.endpoints = vec![ep("10.0.0.1")];
    });
    case(false, |se| {
        dyn_dns(se);
        se.ports = vec![port(443, "https", "HTTPS")];
    });
    case(true, |se| {
        dyn_dns(se);
        se.ports = vec![port(443, "tls", "tls"), port(81, "grpc", "GRPC")];
    });
}

#[test]
fn multiple_hosts_need_http_or_tls_ports() {
    let two = |se: &mut ServiceEntry| se.hosts.push("other.example".into());
    case(true, two);
    case(true, |se| {
        two(se);
        se.ports = vec![port(443, "https", "HTTPS"), port(8443, "tls", "TLS")];
    });
    case(false, |se| {
        two(se);
        se.ports.push(port(5432, "tcp", "TCP"));
    });
    case(false, |se| {
        two(se);
        se.ports = vec![port(80, "http", "")];
    });
}

#[test]
fn export_to() {
    let set = |v: &[&str]| {
        let v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        move |se: &mut ServiceEntry| se.export_to = v
    };
    case(true, set(&["."]));
    case(true, set(&["*"]));
    case(true, set(&["~"]));
    case(true, set(&[".", "other"]));
    case(false, set(&[".", "ns"]));
    case(false, set(&["a", "a"]));
    case(false, set(&["*", "a"]));
    case(false, set(&["~", "a"]));
    case(false, set(&["Bad_ns"]));
    case(true, set(&["UPPER"]));
    case(false, set(&[""]));
    assert!(check(
        &ServiceEntry {
            export_to: vec![".".into()],
            ..base()
        },
        "bad_ns"
    )
    .is_err());
}

#[test]
fn workload_selector() {
    let sel = |labels: &[(&str, &str)]| WorkloadSelector {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    };
    // With endpoints: refused; alone: fine, even empty (a warning).
    case(false, |se| {
        se.workload_selector = Some(sel(&[("app", "a")]))
    });
    case(true, |se| {
        se.endpoints.clear();
        se.workload_selector = Some(sel(&[("app", "a")]));
    });
    case(true, |se| {
        se.endpoints.clear();
        se.workload_selector = Some(sel(&[]));
    });
    case(false, |se| {
        se.endpoints.clear();
        se.workload_selector = Some(sel(&[("", "a")]));
    });
    case(false, |se| {
        se.endpoints.clear();
        se.workload_selector = Some(sel(&[("app", "a*")]));
    });
    // Selector errors are all that is reported.
    let mut se = base();
    se.hosts.clear();
    se.workload_selector = Some(sel(&[("a*", "b")]));
    assert_eq!(check(&se, "ns").map_err(|e| e.len()), Err(1));
}

#[test]
fn endpoint_labels() {
    let with = |k: &str, v: &str| {
        let mut se = base();
        se.endpoints[0].labels.insert(k.into(), v.into());
        ok(&se)
    };
    assert!(with("app", ""));
    assert!(with("app", "v1.0_a-b"));
    assert!(with("Example.COM/app", "x"));
    assert!(with(&"k".repeat(63), "x"));
    assert!(!with(&"k".repeat(64), "x"));
    // Istio sets no length limit on a value (Kubernetes does).
    assert!(with("app", &"v".repeat(100)));
    assert!(!with("app", "a,b"));
    assert!(!with("app", "-a"));
    assert!(!with("a/b/c", "x"));
    assert!(!with("/c", "x"));
    assert!(!with("", "x"));
    assert!(!with("a_b/c", "x"));
    let prefix = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "a".repeat(63),
        "a".repeat(63),
        "a".repeat(61)
    );
    assert_eq!(prefix.len(), 253);
    assert!(with(&format!("{prefix}/k"), "x"));
    assert!(!with(&format!("a{prefix}/k"), "x"));
    // Prefix labels have no length limit of their own in Istio's regexp.
    assert!(with(&format!("{}.io/k", "p".repeat(70)), "x"));
}

#[test]
fn reports_every_error() {
    let mut se = base();
    se.hosts = vec!["*".into()];
    se.ports.push(port(80, "http", "dubbo"));
    let errs = check(&se, "ns").expect_err("invalid");
    assert_eq!(errs.len(), 4, "{errs:?}");
}
