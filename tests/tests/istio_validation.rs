//! The Rust mirror of Istio's ServiceEntry rules (`mcp_core::translate::istio_rules`) against
//! Istio's own Go code (`tests/istio-validate`, `validation.ValidateServiceEntry`): the same
//! valid/invalid verdict for tens of thousands of generated entries biased to the edges of every
//! rule, and for hand-written cases.

use std::collections::BTreeMap;

use e2e::istio_validate;
use mcp_core::testing::{se_endpoint as ep, se_port as port, splitmix64};
use mcp_core::translate::istio_rules;
use proto::istio::networking::v1alpha3::{
    ServiceEntry, ServicePort, WorkloadEntry, WorkloadSelector,
};

/// splitmix64: a small seeded generator, so that a failure can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a>(&mut self, items: &'a [String]) -> &'a str {
        &items[self.below(items.len())]
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The pools the generator draws from: values on both sides of each rule's edges.
struct Pools {
    hosts: Vec<String>,
    addresses: Vec<String>,
    port_names: Vec<String>,
    protocols: Vec<String>,
    numbers: Vec<u32>,
    endpoint_addresses: Vec<String>,
    label_keys: Vec<String>,
    label_values: Vec<String>,
    export_to: Vec<String>,
    namespaces: Vec<String>,
}

fn pools() -> Pools {
    let l63 = "a".repeat(63);
    let l64 = "a".repeat(64);
    // 255 and 256 bytes (Istio's host limit is 255), 253 and 254.
    let n255 = format!("{l63}.{l63}.{l63}.{}", "b".repeat(63));
    let n256 = format!("c{n255}");
    let n253 = format!("{l63}.{l63}.{l63}.{}", "b".repeat(61));
    let n254 = format!("c{n253}");
    let mut hosts = strings(&[
        "svc.example",
        "svc.ns.svc.cluster.local",
        "*.example.com",
        "*",
        "",
        "Foo.Example.COM",
        "svc.example.",
        "svc.example..",
        ".svc.example",
        "a..b",
        "*foo.example",
        "*-foo.example",
        "*--foo.example",
        "**.example",
        "a.*.example",
        "*.",
        "*",
        "*.*",
        "123",
        "a.123",
        "a.+1",
        "a.0x1",
        "a.99999999999999999999",
        "a.-1",
        "a_b.example",
        "-a.example",
        "a-.example",
        "a b.example",
        "é.example",
        "localhost",
        "svc",
        "1.2.3.4",
        "x.y.z.w.v",
    ]);
    hosts.extend([
        format!("{l63}.example"),
        format!("{l64}.example"),
        format!("*{}.example", "a".repeat(62)),
        format!("*{l63}.example"),
        n253.clone(),
        n254.clone(),
        n255.clone(),
        n256.clone(),
        format!("*.{n253}"),
    ]);
    let addresses = strings(&[
        "10.0.0.1",
        "10.0.0.0/8",
        "10.0.0.0/32",
        "10.0.0.0/33",
        "10.0.0.0/08",
        "10.0.0.0/0",
        "10.0.0.0/",
        "10.0.0.0/+8",
        "/8",
        "a/b/c",
        "10.0.0.0/8/8",
        "2001:db8::1",
        "2001:db8::/64",
        "2001:db8::/128",
        "2001:db8::/129",
        "::",
        "::/0",
        "::ffff:1.2.3.4",
        "::ffff:1.2.3.4/104",
        "fe80::1%eth0",
        "fe80::1%",
        "fe80::1%eth0/64",
        "1.2.3.4%eth0",
        "1.2.3",
        "1.2.3.4.5",
        "01.2.3.4",
        "256.1.1.1",
        "1:2:3:4:5:6:7:8:9",
        "1:2:3:4:5:6:7:8",
        "1::2::3",
        "12345::1",
        "[::1]",
        " 1.2.3.4",
        "svc.example",
        "",
    ]);
    let mut port_names = strings(&[
        "http", "http", "tcp", "grpc", "web", "HTTP", "tcp-1", "1", "", "a_b", "-a", "a-", "a.b",
        "é",
    ]);
    port_names.extend([l63.clone(), l64.clone()]);
    let protocols = strings(&[
        "",
        "",
        "HTTP",
        "http",
        "TCP",
        "tcp",
        "TLS",
        "HTTPS",
        "GRPC",
        "grpc-web",
        "GRPC-Web",
        "HTTP2",
        "HTTP_PROXY",
        "UDP",
        "Mongo",
        "Redis",
        "MySQL",
        "mysql",
        "dubbo",
        "HBONE",
        "DoubleHBONE",
        "h2",
        "Http ",
    ]);
    let numbers = vec![0, 1, 80, 80, 443, 8080, 65535, 65536, 4_294_967_295];
    let mut endpoint_addresses = strings(&[
        "10.0.0.1",
        "10.0.0.2",
        "2001:db8::1",
        "fe80::1%eth0",
        "::ffff:1.2.3.4",
        "host.example",
        "Host.Example",
        "host.example.",
        "*.example",
        "unix:///var/run/a.sock",
        "unix://@abstract",
        "unix://relative.sock",
        "unix://",
        "unix:///var/run/",
        "",
        "a_b.example",
        "999.1.1.1",
        "1.2.3.4:80",
        "10.0.0.0/8",
        "123",
        "a.123",
    ]);
    endpoint_addresses.push(format!("{l64}.example"));
    let prefix253 = n253.clone();
    let mut label_keys = strings(&[
        "app",
        "version",
        "",
        "Example.com/app",
        "example.com/app_v1.2",
        "a/b/c",
        "/c",
        "c/",
        "a_b/c",
        "-a",
        "a-",
        "a.b_c-d",
        "a b",
        "é",
        "*",
    ]);
    label_keys.extend([
        "k".repeat(63),
        "k".repeat(64),
        format!("{prefix253}/k"),
        format!("c{prefix253}/k"),
        format!("{}.io/k", "p".repeat(70)),
    ]);
    let mut label_values = strings(&[
        "", "v1", "v1.0_a-b", "-v", "v-", "a,b", "a b", "ä", "*", "a*",
    ]);
    label_values.extend(["v".repeat(63), "v".repeat(64), "v".repeat(300)]);
    let mut export_to = strings(&[".", "*", "~", "ns", "other", "", "Bad_ns", "UPPER", "a.b"]);
    export_to.extend([l63.clone(), l64.clone()]);
    let namespaces = strings(&["ns", "ns", "ns", "other", "Bad_ns", "*", "~", "."]);
    Pools {
        hosts,
        addresses,
        port_names,
        protocols,
        numbers,
        endpoint_addresses,
        label_keys,
        label_values,
        export_to,
        namespaces,
    }
}

fn labels(rng: &mut Rng, p: &Pools, max: usize) -> BTreeMap<String, String> {
    (0..rng.below(max + 1))
        .map(|_| {
            (
                rng.pick(&p.label_keys).to_string(),
                rng.pick(&p.label_values).to_string(),
            )
        })
        .collect()
}

/// One entry: mostly close to valid (one or two fields from the edge pools), so that each rule is
/// what decides, not a pile of unrelated errors.
fn generate(rng: &mut Rng, p: &Pools) -> (ServiceEntry, String) {
    let edgy = |rng: &mut Rng| rng.chance(25);
    let hosts = if edgy(rng) {
        (0..rng.below(4))
            .map(|_| rng.pick(&p.hosts).to_string())
            .collect()
    } else {
        vec![format!("svc{}.example", rng.below(5))]
    };
    let addresses = if edgy(rng) {
        (0..rng.below(3))
            .map(|_| rng.pick(&p.addresses).to_string())
            .collect()
    } else if rng.chance(50) {
        vec!["240.240.0.1".to_string()]
    } else {
        vec![]
    };
    let ports: Vec<ServicePort> = (0..rng.below(4))
        .map(|i| {
            if edgy(rng) {
                ServicePort {
                    number: p.numbers[rng.below(p.numbers.len())],
                    protocol: rng.pick(&p.protocols).to_string(),
                    name: rng.pick(&p.port_names).to_string(),
                    target_port: if rng.chance(30) {
                        p.numbers[rng.below(p.numbers.len())]
                    } else {
                        0
                    },
                }
            } else {
                ServicePort {
                    number: 8000 + i as u32,
                    protocol: ["HTTP", "TCP", "GRPC", ""][rng.below(4)].to_string(),
                    name: format!("p{i}"),
                    target_port: 0,
                }
            }
        })
        .collect();
    let port_names: Vec<String> = ports.iter().map(|p| p.name.clone()).collect();
    let resolution = match rng.below(20) {
        0 => -1,
        1 => 5,
        n => (n % 5) as i32,
    };
    let location = if rng.chance(10) {
        2
    } else {
        rng.below(2) as i32
    };
    let endpoints: Vec<WorkloadEntry> = (0..rng.below(4))
        .map(|i| {
            let address = if edgy(rng) {
                rng.pick(&p.endpoint_addresses).to_string()
            } else {
                format!("10.1.0.{i}")
            };
            let ports = (0..rng.below(3))
                .map(|_| {
                    let name = if !port_names.is_empty() && rng.chance(70) {
                        port_names[rng.below(port_names.len())].clone()
                    } else {
                        rng.pick(&p.port_names).to_string()
                    };
                    let number = if rng.chance(70) {
                        9000
                    } else {
                        p.numbers[rng.below(p.numbers.len())]
                    };
                    (name, number)
                })
                .collect();
            WorkloadEntry {
                address,
                ports,
                labels: if edgy(rng) {
                    labels(rng, p, 3)
                } else {
                    BTreeMap::new()
                },
                network: if rng.chance(10) {
                    "n1".into()
                } else {
                    String::new()
                },
                locality: String::new(),
                weight: 0,
                service_account: String::new(),
            }
        })
        .collect();
    let workload_selector = rng.chance(10).then(|| WorkloadSelector {
        labels: labels(rng, p, 2),
    });
    let export_to = if edgy(rng) {
        (0..rng.below(4))
            .map(|_| rng.pick(&p.export_to).to_string())
            .collect()
    } else {
        vec![]
    };
    let namespace = if rng.chance(15) {
        rng.pick(&p.namespaces).to_string()
    } else {
        "ns".to_string()
    };
    let mut se = ServiceEntry {
        hosts,
        addresses,
        ports,
        location,
        resolution,
        endpoints,
        export_to,
        subject_alt_names: vec![],
        workload_selector,
    };
    // Most entries are made to fit their resolution, so that the rules on the other fields
    // decide as often as the resolution's own.
    if rng.chance(60) {
        fit_resolution(&mut se);
    }
    (se, namespace)
}

/// Drops what the resolution forbids outright.
fn fit_resolution(se: &mut ServiceEntry) {
    match se.resolution {
        0 => se.endpoints.clear(),
        3 => se.endpoints.truncate(1),
        4 => {
            for h in &mut se.hosts {
                if !h.starts_with('*') {
                    *h = format!("*.{h}");
                }
            }
            se.addresses.clear();
            se.endpoints.clear();
            for p in &mut se.ports {
                p.protocol = "HTTP".into();
            }
        }
        _ => {}
    }
    if se.workload_selector.is_some() {
        se.endpoints.clear();
    }
    if se.hosts.len() > 1 {
        for p in &mut se.ports {
            if !["HTTP", "TLS", "GRPC", "HTTPS"].contains(&p.protocol.as_str()) {
                p.protocol = "TLS".into();
            }
        }
    }
}

/// Asks Istio about every entry and compares with the mirror; panics listing the first
/// disagreements with both sides' errors.
fn compare(what: &str, cases: &[(String, ServiceEntry, String)]) {
    let asks: Vec<(&str, &str, &ServiceEntry)> = cases
        .iter()
        .map(|(name, se, ns)| (name.as_str(), ns.as_str(), se))
        .collect();
    let verdicts = istio_validate::verdicts(&asks);
    let mut disagreements = Vec::new();
    let (mut valid, mut invalid, mut counts_differ) = (0, 0, 0);
    for ((name, se, ns), istio) in cases.iter().zip(&verdicts) {
        let ours = istio_rules::check(se, ns);
        if istio.valid {
            valid += 1;
        } else {
            invalid += 1;
        }
        // The verdict is what matters, but most generated entries break several rules at once:
        // the same number of errors on both sides also catches a rule that only agrees because
        // another one fired too.
        let counts_differ_here = ours.as_ref().err().map_or(0, Vec::len) != istio.errors.len();
        counts_differ += usize::from(counts_differ_here);
        if ours.is_ok() != istio.valid || counts_differ_here {
            disagreements.push(format!(
                "{name} in {ns:?}: Istio says valid={} {:?}; istio_rules says {ours:?}\n  {se:?}",
                istio.valid, istio.errors
            ));
        }
    }
    eprintln!(
        "{what}: {} entries, {valid} valid and {invalid} invalid for Istio, {} disagreements, \
         {counts_differ} with different error counts",
        cases.len(),
        disagreements.len()
    );
    assert!(
        disagreements.is_empty(),
        "{what}: istio_rules disagrees with Istio (verdict or number of errors) on {} of {} \
         entries; the first:\n{}",
        disagreements.len(),
        cases.len(),
        disagreements
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
#[ignore = "needs the istio-validate peer (tests/go-peers/build.sh target)"]
fn generated_entries_get_istios_verdict() {
    let seed = std::env::var("ISTIO_VALIDATION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(46);
    let count = std::env::var("ISTIO_VALIDATION_COUNT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25_000);
    let mut rng = Rng(seed);
    let p = pools();
    let cases: Vec<(String, ServiceEntry, String)> = (0..count)
        .map(|i| {
            let (se, ns) = generate(&mut rng, &p);
            (format!("gen-{i}"), se, ns)
        })
        .collect();
    compare(&format!("seed {seed}"), &cases);
}

/// What the adapters typically serve: STATIC, a VIP, HTTP and TCP ports.
fn served() -> ServiceEntry {
    ServiceEntry {
        hosts: vec!["orders.ns.svc.consul".into()],
        addresses: vec!["240.240.0.7".into()],
        ports: vec![
            port(8080, "http-8080", "HTTP"),
            port(9090, "tcp-9090", "TCP"),
        ],
        resolution: 1,
        endpoints: vec![
            WorkloadEntry {
                address: "10.0.0.1".into(),
                ports: [("http-8080".to_string(), 31080)].into(),
                labels: [("app".to_string(), "orders".to_string())].into(),
                ..Default::default()
            },
            ep("2001:db8::5"),
        ],
        export_to: vec!["*".into()],
        ..Default::default()
    }
}

#[test]
#[ignore = "needs the istio-validate peer (tests/go-peers/build.sh target)"]
fn hand_written_cases_get_istios_verdict() {
    type Edit = fn(&mut ServiceEntry);
    let edits: &[(&str, Edit)] = &[
        ("served", |_| {}),
        ("uppercase host", |se| {
            se.hosts = vec!["Orders.NS.svc".into()]
        }),
        ("trailing dot", |se| se.hosts = vec!["orders.ns.".into()]),
        ("numeric one-label host", |se| {
            se.hosts = vec!["8080".into()]
        }),
        ("numeric tld", |se| se.hosts = vec!["orders.8080".into()]),
        ("tld over 64 bits", |se| {
            se.hosts = vec!["orders.18446744073709551616".into()]
        }),
        ("signed tld", |se| se.hosts = vec!["orders.+5".into()]),
        ("dns wildcard no endpoints", |se| {
            se.resolution = 2;
            se.endpoints.clear();
            se.hosts = vec!["*.ns.svc".into()];
        }),
        ("dns numeric one label no endpoints", |se| {
            se.resolution = 2;
            se.endpoints.clear();
            se.hosts = vec!["8080".into()];
        }),
        ("dns round robin two endpoints", |se| se.resolution = 3),
        ("dns hostname endpoints", |se| {
            se.resolution = 2;
            se.endpoints = vec![ep("db.internal"), ep("db.internal.")];
        }),
        ("static hostname endpoint", |se| {
            se.endpoints = vec![ep("db.internal")]
        }),
        ("zone endpoint", |se| {
            se.endpoints = vec![ep("fe80::1%eth0")]
        }),
        ("mapped v4 address", |se| {
            se.addresses = vec!["::ffff:10.0.0.1".into()]
        }),
        ("cidr with dns", |se| {
            se.addresses = vec!["10.0.0.0/24".into()];
            se.resolution = 2;
        }),
        ("cidr host bits set", |se| {
            se.addresses = vec!["10.0.0.1/24".into()]
        }),
        ("two hosts with tcp", |se| se.hosts.push("b.ns.svc".into())),
        ("two hosts, http only", |se| {
            se.hosts.push("b.ns.svc".into());
            se.ports.truncate(1);
            se.endpoints[0].ports.clear();
        }),
        ("two hosts none", |se| {
            se.hosts.push("b.ns.svc".into());
            se.resolution = 0;
            se.endpoints.clear();
        }),
        ("unix with two ports", |se| {
            se.endpoints = vec![ep("unix:///run/a.sock")]
        }),
        ("unix with one port", |se| {
            se.ports.truncate(1);
            se.endpoints = vec![ep("unix:///run/a.sock")];
        }),
        ("label value 64", |se| {
            se.endpoints[0].labels.insert("k".into(), "v".repeat(64));
        }),
        ("label key 64", |se| {
            se.endpoints[0].labels.insert("k".repeat(64), "v".into());
        }),
        ("endpoint port to undefined name", |se| {
            se.endpoints[0].ports.insert("grpc".into(), 1);
        }),
        ("endpoint port 0", |se| {
            se.endpoints[0].ports.insert("tcp-9090".into(), 0);
        }),
        ("target port 65536", |se| se.ports[0].target_port = 65536),
        ("duplicate port number", |se| se.ports[1].number = 8080),
        ("empty port name", |se| se.ports[0].name.clear()),
        ("export to dot and own namespace", |se| {
            se.export_to = vec![".".into(), "ns".into()]
        }),
        ("export to none", |se| se.export_to = vec!["~".into()]),
        ("selector and endpoints", |se| {
            se.workload_selector = Some(WorkloadSelector::default())
        }),
        ("selector alone", |se| {
            se.endpoints.clear();
            se.workload_selector = Some(WorkloadSelector {
                labels: [("app".to_string(), "orders".to_string())].into(),
            });
        }),
        ("dynamic dns", |se| {
            se.resolution = 4;
            se.hosts = vec!["*.ns.svc".into()];
            se.addresses.clear();
            se.endpoints.clear();
            se.ports = vec![port(80, "http", "HTTP")];
        }),
        ("unknown resolution", |se| se.resolution = 9),
    ];
    let cases: Vec<(String, ServiceEntry, String)> = edits
        .iter()
        .map(|(name, edit)| {
            let mut se = served();
            edit(&mut se);
            (name.to_string(), se, "ns".to_string())
        })
        .collect();
    compare("hand-written", &cases);
}

/// One ServiceEntry file for adapter-file.
fn entry(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n{spec}"
    )
}

#[test]
#[ignore = "needs the istio-validate peer (tests/go-peers/build.sh target) and the workspace binaries"]
fn adapter_file_serves_only_what_istio_accepts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = "  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n";
    let files = [
        (
            "orders",
            format!("  hosts: [orders.shop.example]\n{base}  endpoints: [{{address: 10.0.0.1}}]\n"),
        ),
        // Each of these is one of the gaps the oracle found in translate: Istio refuses it.
        (
            "none-and-someone",
            format!("  hosts: [a.shop.example]\n{base}  exportTo: ['~', other]\n"),
        ),
        (
            "dot-and-own-namespace",
            format!("  hosts: [b.shop.example]\n{base}  exportTo: ['.', shop]\n"),
        ),
        ("numeric-tld", format!("  hosts: [c.shop.123]\n{base}")),
        (
            "cidr-leading-zero",
            format!("  hosts: [d.shop.example]\n  addresses: [10.0.0.0/08]\n{base}"),
        ),
        // Served, without the Unix socket endpoint DNS resolution cannot take.
        (
            "dns-socket",
            "  hosts: [e.shop.example]\n  resolution: DNS\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  endpoints: [{address: 'unix:///run/e.sock'}, {address: e.backend.example}]\n".to_string(),
        ),
    ];
    for (name, spec) in &files {
        std::fs::write(dir.path().join(format!("{name}.yaml")), entry(name, spec)).expect("write");
    }
    let path = dir.path().display().to_string();
    let a = e2e::Adapter::start("adapter-file", &["--path", &path]);
    a.wait_ready();
    // The sinks pass every ServiceEntry they receive through Istio's validation and fail the
    // test on one it refuses.
    let sinks = e2e::xds_sinks::XdsSinks::start(
        a.grpc,
        &[e2e::xds_sinks::SinkSpec::acking(
            e2e::xds_sinks::Flavour::Delta,
        )],
    );
    let want: Vec<String> = vec!["shop/dns-socket".into(), "shop/orders".into()];
    e2e::wait_for(
        std::time::Duration::from_secs(30),
        "the valid entries",
        || {
            let names: Vec<String> = sinks.state(0).names.into_iter().collect();
            (names == want).then_some(())
        },
    );
    drop(sinks);
}

#[test]
#[ignore = "needs the istio-validate peer (tests/go-peers/build.sh target)"]
fn the_hooks_fail_on_an_entry_istio_refuses() {
    let mut bad = served();
    bad.export_to = vec!["~".into(), "other".into()];
    let verdict = istio_validate::verdict("bad", "shop", &bad);
    assert!(!verdict.valid, "{verdict:?}");
    // The check every sink makes.
    let panicked = std::panic::catch_unwind(|| {
        istio_validate::assert_valid("a test", "bad", "shop", &bad);
    });
    assert!(panicked.is_err());
    // istiod's configz, read as the istiod tests read it: an adapter's entry (labelled with its
    // registry) is checked, one a test applied itself is not.
    let configz = |labels: serde_json::Value| {
        serde_json::json!([{
            "kind": "ServiceEntry",
            "metadata": {"name": "bad", "namespace": "shop", "labels": labels},
            "spec": {"hosts": ["bad.example"], "exportTo": ["~", "other"], "resolution": "NONE"},
        }])
    };
    let adapters = configz(serde_json::json!({"mcp-adapter/registry": "file"}));
    let panicked = std::panic::catch_unwind(|| e2e::istiod::configz_entries(&adapters).count());
    assert!(
        panicked.is_err(),
        "configz_entries let an invalid adapter entry through"
    );
    let applied = configz(serde_json::json!({}));
    assert_eq!(e2e::istiod::configz_entries(&applied).count(), 1);
}
