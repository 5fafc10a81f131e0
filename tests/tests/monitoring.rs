//! The chart's alert rules and dashboard (deploy/helm/mcp-adapters/monitoring) against the real
//! Prometheus and Alertmanager scraping real adapters: each fault made for real (the registry
//! stopped, the sink gone, a sink NACKing, the output's API server refusing writes, the adapter
//! killed) is notified firing by Alertmanager to a webhook receiver, then resolved once the
//! fault ends; a healthy adapter (every output, TLS, shards, sinks) raises nothing, not even a
//! pending alert, over twice the longest `for:`, and every dashboard panel has data on it.
//!
//! The rules run 30 times faster than written ([`e2e::prometheus::Rules`]); promtool's unit
//! tests (alerts_test.yaml) test them at their real durations.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use e2e::consul::{Consul, Registration};
use e2e::istiod::apply_istio_crds;
use e2e::kube::{KubeApiServer, ADMIN_TOKEN};
use e2e::kube_output::{leads_in_step, output, write_entry};
use e2e::prometheus::{dashboard_path, Monitoring, Notified, Rules, JOB};
use e2e::xds_sinks::{Flavour, SinkSpec, XdsSinks};
use e2e::{free_addrs, wait_for, workspace_bin, Adapter, Adsc, IstioVersion, Process};

/// How long past its `for:` an alert may take to be notified firing: a scrape, an evaluation,
/// Prometheus' send, Alertmanager's group wait, and room for a loaded machine.
const NOTIFY_SLACK: Duration = Duration::from_secs(30);

/// How long an alert may take to be notified resolved once its fault ended, beyond what the
/// fault's own recovery takes (given by the caller).
const RESOLVE_SLACK: Duration = Duration::from_secs(30);

/// One test's view of the monitoring stack and the adapter it watches. Each test's Prometheus
/// scrapes that one adapter, so its alerts are told by name (and job); each is checked to be
/// about that adapter by the labels it has of `instance` and `registry`.
struct Watch<'a> {
    m: &'a Monitoring,
    rules: &'a Rules,
    registry: &'static str,
    instance: String,
    /// When each alert waited for was notified firing.
    fired: std::collections::BTreeMap<String, Instant>,
    /// What was seen, for the summary.
    seen: Vec<String>,
}

impl<'a> Watch<'a> {
    fn new(
        m: &'a Monitoring,
        rules: &'a Rules,
        registry: &'static str,
        admin: SocketAddr,
    ) -> Watch<'a> {
        Watch {
            m,
            rules,
            registry,
            instance: admin.to_string(),
            fired: Default::default(),
            seen: Vec::new(),
        }
    }

    /// Asserts that `n` is about this adapter: its `instance` and `registry`, where it has
    /// them (MCPAdapterDown, from `up`, has no `registry`; alerts about all replicas together
    /// have no `instance`).
    fn check_ours(&self, n: &Notified) {
        for (label, ours) in [
            ("instance", self.instance.as_str()),
            ("registry", self.registry),
        ] {
            if let Some(v) = n.labels.get(label) {
                assert_eq!(v, ours, "an alert about another adapter: {n}");
            }
        }
    }

    /// Waits for `name` to be notified firing, at least its `for:` after `fault` (the
    /// condition cannot have held longer) and within its `for:`, `extra` and slack.
    fn fires(&mut self, name: &str, fault: Instant, extra: Duration) -> Notified {
        let wait = self.rules.for_of(name) + extra + NOTIFY_SLACK;
        let n = self
            .m
            .wait_alert(name, &[("job", JOB)], "firing", fault, wait);
        self.check_ours(&n);
        let after = n.when.duration_since(fault);
        assert!(
            after >= self.rules.for_of(name),
            "{name} notified {after:?} after the fault, before its for: {:?}; {}",
            self.rules.for_of(name),
            self.m.report()
        );
        self.fired.insert(name.to_string(), n.when);
        self.seen.push(format!(
            "{name} firing {:.1}s after the fault (for: {:?})",
            after.as_secs_f64(),
            self.rules.for_of(name)
        ));
        n
    }

    /// Waits for `name` to be notified resolved after `fixed` (when the fault was ended),
    /// within `extra` plus slack; it must not have been resolved while the fault lasted.
    fn resolves(&mut self, name: &str, fixed: Instant, extra: Duration) -> Notified {
        if let Some(fired) = self.fired.get(name) {
            let early: Vec<String> = self
                .m
                .notifications()
                .iter()
                .filter(|n| {
                    n.labels.get("alertname").map(String::as_str) == Some(name)
                        && n.status == "resolved"
                        && n.when >= *fired
                        && n.when < fixed
                })
                .map(|n| n.to_string())
                .collect();
            assert!(
                early.is_empty(),
                "{name} resolved while the fault lasted: {early:?}; {}",
                self.m.report()
            );
        }
        let n = self.m.wait_alert(
            name,
            &[("job", JOB)],
            "resolved",
            fixed,
            extra + RESOLVE_SLACK,
        );
        self.check_ours(&n);
        self.seen.push(format!(
            "{name} resolved {:.1}s after the fix",
            n.when.duration_since(fixed).as_secs_f64()
        ));
        n
    }

    /// Asserts that `name` has not been notified (so far).
    fn not_fired(&self, name: &str) {
        let fired: Vec<String> = self
            .m
            .notifications()
            .iter()
            .filter(|n| n.labels.get("alertname").map(String::as_str) == Some(name))
            .map(|n| n.to_string())
            .collect();
        assert!(fired.is_empty(), "{name} notified: {fired:?}");
    }

    /// Prints what was seen: every alert waited for with its times, and every notification.
    fn summary(&self, scenario: &str) {
        let all: Vec<String> = self
            .m
            .notifications()
            .iter()
            .map(|n| n.to_string())
            .collect();
        eprintln!(
            "[{scenario}] {}\n[{scenario}] every notification:\n  {}",
            self.seen.join("; "),
            all.join("\n  ")
        );
    }
}

/// Polls `f` every 100 ms until it holds or `timeout` passes; whether it held.
fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// adapter-file over `dir` (with one entry written), polled every 100 ms, `extra` flags.
fn file_adapter(dir: &Path, extra: &[&str]) -> Adapter {
    write_entry(dir, "payments", "10.0.0.1");
    let path = dir.display().to_string();
    let mut args = vec!["--path", path.as_str(), "--poll-interval", "100ms"];
    args.extend_from_slice(extra);
    let a = Adapter::start("adapter-file", &args);
    a.wait_ready();
    a
}

/// A well-behaved sink (SotW, ACKs at once) on `a`, waited for.
fn good_sink(a: &Adapter) -> XdsSinks {
    let sinks = XdsSinks::start(a.grpc, &[SinkSpec::acking(Flavour::Sotw)]);
    wait_for(Duration::from_secs(30), "the sink connected", || {
        (a.metric("mcp_adapter_connected_sinks") >= 1.0).then_some(())
    });
    sinks
}

#[test]
#[ignore = "needs prometheus and alertmanager (scripts/install-prometheus.sh) and consul (tests/consul/build.sh target/consul)"]
fn a_stopped_registry_is_alerted_and_resolved_when_it_is_back() {
    let rules = Rules::real();
    let web = Registration::new("n1", "web", "web-1", "10.0.0.1", 8080).protocol("http");
    let mut consul = Consul::start(None);
    consul.register(&web);
    let addr = consul.addr();
    let a = Adapter::start("adapter-consul", &["--consul-addr", &addr]);
    a.wait_ready();
    let _sink = good_sink(&a);
    let m = Monitoring::start(&rules, &[a.admin]);
    m.wait_up(a.admin, Duration::from_secs(30));
    let mut w = Watch::new(&m, &rules, "consul", a.admin);

    let fault = Instant::now();
    consul.kill();
    w.fires("MCPAdapterRegistryNotInSync", fault, Duration::ZERO);
    // The age of the last good sync passes the (compressed) threshold some seconds later.
    w.fires(
        "MCPAdapterLastGoodSyncTooOld",
        fault,
        Duration::from_secs(60),
    );

    let fixed = Instant::now();
    consul.restart();
    consul.register(&web);
    // The adapter's watch is retried with a back-off of up to 30 s.
    w.resolves(
        "MCPAdapterRegistryNotInSync",
        fixed,
        Duration::from_secs(35),
    );
    w.resolves(
        "MCPAdapterLastGoodSyncTooOld",
        fixed,
        Duration::from_secs(35),
    );
    w.summary("registry stopped");
}

#[test]
#[ignore = "needs prometheus and alertmanager (scripts/install-prometheus.sh) and Istio's adsc-watch (tests/istio-adsc/build.sh target/adsc)"]
fn a_gone_sink_is_alerted_and_resolved_when_one_is_back() {
    let rules = Rules::real();
    let dir = tempfile::tempdir().expect("tempdir");
    let a = file_adapter(dir.path(), &[]);
    let adsc = Adsc::start_synced(IstioVersion::Current, &a);
    let m = Monitoring::start(&rules, &[a.admin]);
    m.wait_up(a.admin, Duration::from_secs(30));
    let mut w = Watch::new(&m, &rules, "file", a.admin);

    // Istio's client killed (SIGKILL: no goodbye, as when istiod's node dies).
    let fault = Instant::now();
    drop(adsc);
    w.fires("MCPAdapterNoSinkConnected", fault, Duration::ZERO);

    let fixed = Instant::now();
    let _adsc = Adsc::start_synced(IstioVersion::Current, &a);
    w.resolves("MCPAdapterNoSinkConnected", fixed, Duration::ZERO);
    w.summary("sink gone");
}

#[test]
#[ignore = "needs prometheus and alertmanager (scripts/install-prometheus.sh)"]
fn a_nacking_sink_is_alerted_and_resolved_when_it_leaves() {
    let rules = Rules::real();
    let dir = tempfile::tempdir().expect("tempdir");
    let a = file_adapter(dir.path(), &[]);
    // A well-behaved sink stays throughout: only the NACKs are the fault.
    let _good = good_sink(&a);
    let m = Monitoring::start(&rules, &[a.admin]);
    m.wait_up(a.admin, Duration::from_secs(30));
    let mut w = Watch::new(&m, &rules, "file", a.admin);

    // A sink (as istiod with a config it cannot apply) NACKs every response and keeps its
    // stream open.
    let fault = Instant::now();
    let nacking = XdsSinks::start(
        a.grpc,
        &[SinkSpec {
            nack: Some("test sink: every response refused"),
            ..SinkSpec::acking(Flavour::Sotw)
        }],
    );
    wait_for(Duration::from_secs(30), "the first NACK counted", || {
        (a.metric("mcp_adapter_nacks_total") >= 1.0).then_some(())
    });
    w.fires("MCPAdapterSinkNacking", fault, Duration::from_secs(5));
    assert!(nacking.state(0).ended.is_none(), "{:?}", nacking.state(0));

    let fixed = Instant::now();
    drop(nacking);
    w.resolves("MCPAdapterSinkNacking", fixed, Duration::ZERO);
    w.not_fired("MCPAdapterNoSinkConnected");
    w.summary("NACKing sink");
}

/// A ValidatingAdmissionPolicy (and its binding) refusing every create and update of a
/// ServiceEntry: what an admission policy that turned against the adapter's objects does.
fn freeze_service_entries(kube: &KubeApiServer) {
    kube.apply(
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "freeze-serviceentries"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["networking.istio.io"], "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["serviceentries"]
                }]},
                "validations": [{"expression": "false", "message": "ServiceEntries are frozen"}]
            }
        }),
    );
    kube.apply(
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "freeze-serviceentries"},
            "spec": {"policyName": "freeze-serviceentries", "validationActions": ["Deny"]}
        }),
    );
    // The API server applies a new policy a moment after storing it: until a dry-run create
    // is refused.
    let probe = json!({
        "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": "probe", "namespace": "ns"},
        "spec": {"hosts": ["probe.example.com"], "resolution": "STATIC",
                 "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                 "endpoints": [{"address": "10.9.9.9"}]}
    });
    wait_for(Duration::from_secs(30), "the policy in force", || {
        let r = kube.request(
            ADMIN_TOKEN,
            "POST",
            "/apis/networking.istio.io/v1/namespaces/ns/serviceentries?dryRun=All",
            Some(&probe),
        );
        (r.status == 422).then_some(())
    });
}

#[test]
#[ignore = "needs prometheus and alertmanager (scripts/install-prometheus.sh) and kube-apiserver (tests/go-peers/build.sh target)"]
fn an_api_server_refusing_the_outputs_writes_is_alerted_and_resolved_when_it_takes_them() {
    let rules = Rules::real();
    let kube = KubeApiServer::start();
    kube.namespace("ns");
    apply_istio_crds(&kube);
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = kube.kubeconfig().display().to_string();
    // A re-list every 5 s: a refused object is tried again at each.
    let a = file_adapter(
        dir.path(),
        &[
            "--output",
            "kube",
            "--output-kubeconfig",
            &kubeconfig,
            "--output-namespaces",
            "ns",
            "--output-resync",
            "5s",
        ],
    );
    wait_for(Duration::from_secs(60), "the output in step", || {
        leads_in_step(&a).then_some(())
    });
    let m = Monitoring::start(&rules, &[a.admin]);
    m.wait_up(a.admin, Duration::from_secs(30));
    let mut w = Watch::new(&m, &rules, "file", a.admin);

    // Writes refused from now on; then the registry changes, which must be written.
    let fault = Instant::now();
    freeze_service_entries(&kube);
    write_entry(dir.path(), "payments", "10.0.0.2");
    write_entry(dir.path(), "orders", "10.0.0.3");
    let refused = wait_until(Duration::from_secs(30), || {
        output(&a)["rejected"]
            .as_object()
            .is_some_and(|r| r.len() == 2)
    });
    assert!(
        refused,
        "the writes were not refused: {}\n{}",
        output(&a),
        a.log_tail()
    );
    w.fires(
        "MCPAdapterKubeOutputRejecting",
        fault,
        Duration::from_secs(5),
    );
    w.fires(
        "MCPAdapterKubeOutputWritesFailing",
        fault,
        Duration::from_secs(5),
    );

    let fixed = Instant::now();
    assert!(kube.delete(
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/freeze-serviceentries"
    ));
    wait_for(Duration::from_secs(30), "the output in step again", || {
        (leads_in_step(&a) && output(&a)["rejected"] == json!({})).then_some(())
    });
    w.resolves(
        "MCPAdapterKubeOutputRejecting",
        fixed,
        Duration::from_secs(5),
    );
    w.resolves(
        "MCPAdapterKubeOutputWritesFailing",
        fixed,
        Duration::from_secs(5),
    );
    w.summary("API server refusing writes");
}

#[test]
#[ignore = "needs prometheus and alertmanager (scripts/install-prometheus.sh)"]
fn a_killed_adapter_is_alerted_and_resolved_when_it_is_back() {
    let rules = Rules::real();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = file_adapter(dir.path(), &[]);
    let _sink = good_sink(&a);
    let m = Monitoring::start(&rules, &[a.admin]);
    m.wait_up(a.admin, Duration::from_secs(30));
    let mut w = Watch::new(&m, &rules, "file", a.admin);

    let fault = Instant::now();
    a.kill();
    w.fires("MCPAdapterDown", fault, Duration::ZERO);

    let fixed = Instant::now();
    a.restart();
    w.resolves("MCPAdapterDown", fixed, Duration::ZERO);
    w.summary("adapter killed");
}

/// A CA and a server certificate for 127.0.0.1 valid 400 days (beyond any expiry warning),
/// in `dir`.
fn long_lived_pki(dir: &Path) {
    e2e::pki::openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "400",
            "-subj",
            "/CN=test-ca",
        ],
    );
    e2e::pki::issue(
        dir,
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        400,
    );
}

/// `mcpctl get se --watch` over TLS against `addr`: a sink that stays connected and ACKs.
fn tls_sink(dir: &Path, name: &str, addr: SocketAddr) -> Process {
    let p = Process::new(name, dir, Duration::from_millis(50));
    p.spawn(Command::new(workspace_bin("mcpctl")).args([
        "get",
        "serviceentries",
        "--server",
        &format!("xds://{addr}"),
        "--tls-ca",
        &dir.join("ca.crt").display().to_string(),
        "-o",
        "json",
        "--watch",
        "--timeout",
        "30s",
    ]));
    p
}

/// How long a healthy adapter is watched: twice the longest compressed `for:`, so that any
/// alert whose condition came to hold in the window would be seen pending, and firing. An
/// alert that compares with data an `offset` ago (MCPAdapterHeapGrowing: the heap 6 h before,
/// 12 min compressed) has no result at all until the series are that old, longer than the
/// window and `setup` (what ran before it) together: its `for:` does not lengthen the window
/// (it could only go pending after it). The window, and those alerts with their offsets.
fn healthy_window(rules: &Rules, setup: Duration) -> (Duration, Vec<(String, Duration)>) {
    let no_offset = rules
        .fors
        .iter()
        .filter(|(name, _)| rules.offsets[*name] == Duration::ZERO)
        .map(|(_, f)| *f * 2)
        .max()
        .unwrap_or_default();
    let mut window = no_offset.max(Duration::from_secs(30));
    // An alert taken in lengthens the window, which may take in another: until none does.
    loop {
        let longer = rules
            .offsets
            .iter()
            .filter(|(_, offset)| **offset > Duration::ZERO && **offset <= window + setup)
            .map(|(name, _)| rules.fors[name] * 2)
            .fold(window, Duration::max);
        if longer == window {
            break;
        }
        window = longer;
    }
    let beyond = rules
        .offsets
        .iter()
        .filter(|(_, offset)| **offset > window + setup)
        .map(|(name, offset)| (name.clone(), *offset))
        .collect();
    (window, beyond)
}

#[test]
fn the_healthy_window_leaves_out_only_alerts_offset_beyond_it() {
    let yaml = "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x > 0\n    for: 10m\n  - alert: H\n    expr: x > x offset 6h\n    for: 1h\n  - alert: N\n    expr: x > x offset 10m\n    for: 30m\n";
    let rules = Rules::compress(yaml, 30).expect("compress");
    // A: for 20 s, a 40 s window; N's offset (20 s) is within it, so N's for (60 s) counts:
    // 120 s; H's offset (720 s) is beyond 120 s and the 60 s before.
    assert_eq!(
        healthy_window(&rules, Duration::from_secs(60)),
        (
            Duration::from_secs(120),
            vec![("H".to_string(), Duration::from_secs(720))]
        )
    );
}

/// Every panel of a dashboard, rows' nested panels included.
fn panels(v: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in v["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(panels(p));
    }
    out
}

/// A Grafana expression with its variables replaced: the dashboard's own (`$registry`,
/// `$instance`, `$shard`, used with `=~`) by `.*`, Grafana's intervals by `window`; the
/// variables it does not know, listed.
fn substitute(expr: &str, window: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut unknown = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        // `$name` or `${name}` / `${name:format}`.
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').unwrap_or(braced.len());
            let name = braced[..end].split(':').next().unwrap_or("");
            (name, end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        match name {
            "registry" | "instance" | "shard" | "job" => out.push_str(".*"),
            "__rate_interval" | "__interval" | "__range" => out.push_str(window),
            other => {
                unknown.push(format!("${other}"));
                out.push('$');
                out.push_str(&after[..len]);
            }
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    (out, unknown)
}

#[test]
fn grafana_variables_are_substituted() {
    assert_eq!(
        substitute(
            "sum by (instance) (rate(x{registry=~\"$registry\",instance=~\"${instance}\"}[$__rate_interval]))",
            "30s"
        ),
        (
            "sum by (instance) (rate(x{registry=~\".*\",instance=~\".*\"}[30s]))".to_string(),
            vec![]
        )
    );
    assert_eq!(
        substitute("x{shard=~\"${shard:regex}\"} offset $__range $other", "1m"),
        (
            "x{shard=~\".*\"} offset 1m $other".to_string(),
            vec!["$other".to_string()]
        )
    );
}

#[test]
#[ignore = "needs prometheus and alertmanager (scripts/install-prometheus.sh), consul (tests/consul/build.sh target/consul) and kube-apiserver (tests/go-peers/build.sh target)"]
fn a_healthy_adapter_raises_nothing_and_fills_every_dashboard_panel() {
    let rules = Rules::real();
    let pki = tempfile::tempdir().expect("tempdir");
    long_lived_pki(pki.path());
    let consul = Consul::start(None);
    for (i, svc) in ["web", "api", "db", "cache"].iter().enumerate() {
        consul.register(
            &Registration::new(
                "n1",
                svc,
                &format!("{svc}-1"),
                &format!("10.0.0.{}", i + 1),
                8080,
            )
            .protocol("http"),
        );
    }
    let kube = KubeApiServer::start();
    kube.namespace("consul");
    apply_istio_crds(&kube);
    let (addr, kubeconfig) = (consul.addr(), kube.kubeconfig().display().to_string());
    let (cert, key) = (
        pki.path().join("server.crt").display().to_string(),
        pki.path().join("server.key").display().to_string(),
    );
    let a = Adapter::start_on(
        "adapter-consul",
        free_addrs(2),
        &[
            "--consul-addr",
            &addr,
            "--exclude-service",
            "consul",
            "--shards",
            "2",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--output",
            "both",
            "--output-kubeconfig",
            &kubeconfig,
            "--output-namespaces",
            "consul",
        ],
        &[],
    );
    a.wait_ready();
    // A sink on each shard's port, over TLS.
    let shard1 = SocketAddr::new(a.grpc.ip(), a.grpc.port() + 1);
    let _sinks = [
        tls_sink(pki.path(), "sink-0", a.grpc),
        tls_sink(pki.path(), "sink-1", shard1),
    ];
    wait_for(
        Duration::from_secs(60),
        "both sinks connected, the output in step",
        || (a.metric("mcp_adapter_connected_sinks") == 2.0 && leads_in_step(&a)).then_some(()),
    );
    let m = Monitoring::start(&rules, &[a.admin]);
    m.wait_up(a.admin, Duration::from_secs(30));
    let instance = a.admin.to_string();
    // Rules evaluated before Prometheus' first scrape find no `up` at all: MCPAdapterAbsent is
    // pending then (Prometheus starting, not the adapter), until the next evaluation. Nothing
    // else may be.
    wait_for(
        Duration::from_secs(10),
        "an evaluation after the first scrape",
        || {
            let alerts = m.alerts_now();
            assert!(
                alerts
                    .iter()
                    .all(|a| a.contains("alertname=\"MCPAdapterAbsent\"")),
                "alerts before the healthy window: {alerts:?}"
            );
            alerts.is_empty().then_some(())
        },
    );

    let (window, beyond) = healthy_window(&rules, Duration::from_secs(60));
    let errors = a.metric("mcp_adapter_registry_errors_total");
    let snapshots = a.metric("mcp_adapter_snapshots_total");
    let started = Instant::now();
    let mut polls = 0;
    while started.elapsed() < window {
        let alerts = m.alerts_now();
        assert!(
            alerts.is_empty(),
            "ALERTS not empty {:.1}s into the healthy window: {alerts:?}; {}",
            started.elapsed().as_secs_f64(),
            m.report()
        );
        let own: Vec<String> = m
            .notifications()
            .iter()
            .filter(|n| n.labels.get("instance") == Some(&instance))
            .map(|n| n.to_string())
            .collect();
        assert!(own.is_empty(), "notified for a healthy adapter: {own:?}");
        assert_eq!(
            a.metric("mcp_adapter_registry_errors_total"),
            errors,
            "registry errors on a healthy adapter; log:\n{}",
            a.log_tail()
        );
        polls += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(polls > 10);
    assert!(
        m.notifications().is_empty(),
        "notifications with a healthy adapter: {}",
        m.report()
    );
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots,
        "a snapshot was built while nothing changed"
    );
    assert_eq!(a.metric("mcp_adapter_connected_sinks"), 2.0);
    eprintln!(
        "[healthy] {window:?} without an alert, not even a pending one (longest compressed \
         for: {:?}; left out of the window, as their expressions have no result before the \
         series they offset are that old: {beyond:?})",
        rules.longest_for
    );

    // The dashboard: every panel's every query has data on this adapter, once it has done its
    // job once more: a service registered is served, pushed to its shard's sink and ACKed (in a
    // steady state there is no ACK to measure, and the ACK latency panels are NaN).
    let acks = a.metric("mcp_adapter_acks_total");
    consul
        .register(&Registration::new("n1", "extra", "extra-1", "10.0.0.9", 8080).protocol("http"));
    wait_for(Duration::from_secs(30), "the new set ACKed", || {
        (a.metric("mcp_adapter_acks_total") > acks).then_some(())
    });
    wait_for(
        Duration::from_secs(30),
        "Prometheus to have scraped the ACK",
        || {
            m.value("sum(increase(mcp_adapter_ack_latency_seconds_count[30s]))")
                .filter(|v| *v > 0.0)
        },
    );
    let path = dashboard_path();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut empty = Vec::new();
    let mut checked = 0;
    for p in panels(&dashboard) {
        let title = p["title"].as_str().unwrap_or("(untitled)");
        for t in p["targets"].as_array().into_iter().flatten() {
            let Some(expr) = t["expr"].as_str() else {
                continue;
            };
            checked += 1;
            let (q, unknown) = substitute(expr, "30s");
            if !unknown.is_empty() {
                empty.push(format!(
                    "{title:?}: unknown variables {unknown:?} in {expr}"
                ));
                continue;
            }
            match m.query(&q) {
                Ok(r) if r.is_empty() => empty.push(format!("{title:?}: no data for {q}")),
                // What Grafana draws nothing for either (a quantile of no observations).
                Ok(r) if r.iter().all(|s| s["value"][1] == "NaN") => {
                    empty.push(format!("{title:?}: only NaN for {q}"))
                }
                Ok(_) => {}
                Err(e) => empty.push(format!("{title:?}: {e} for {q}")),
            }
        }
    }
    // Template variables' values (`label_values(selector, label)`).
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let query = match &v["query"] {
            Value::String(s) => s.clone(),
            Value::Object(o) => o
                .get("query")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            _ => continue,
        };
        let Some(args) = query
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
        else {
            continue;
        };
        checked += 1;
        let (selector, label) = match args.rsplit_once(',') {
            Some((s, l)) => (s.trim().to_string(), l.trim().to_string()),
            None => (
                format!("{{{}!=\"\"}}", args.trim()),
                args.trim().to_string(),
            ),
        };
        let (q, _) = substitute(&format!("count by ({label}) ({selector})"), "30s");
        match m.query(&q) {
            Ok(r) if r.is_empty() => empty.push(format!(
                "variable {:?}: no values for {query}",
                v["name"].as_str().unwrap_or("")
            )),
            Ok(_) => {}
            Err(e) => empty.push(format!("variable {:?}: {e} for {q}", v["name"])),
        }
    }
    assert!(checked > 0, "no query found in {}", path.display());
    assert!(
        empty.is_empty(),
        "{} of {checked} dashboard queries without data on a healthy adapter:\n  {}",
        empty.len(),
        empty.join("\n  ")
    );
    eprintln!("[dashboard] {checked} queries, each with data");
}

#[test]
fn the_rule_file_has_every_alert_the_tests_name() {
    let rules = Rules::real();
    for name in [
        "MCPAdapterDown",
        "MCPAdapterAbsent",
        "MCPAdapterRegistryNotInSync",
        "MCPAdapterLastGoodSyncTooOld",
        "MCPAdapterRegistryErrors",
        "MCPAdapterRegistryRetrying",
        "MCPAdapterNoSinkConnected",
        "MCPAdapterSinkNotAcknowledging",
        "MCPAdapterSinkNacking",
        "MCPAdapterKubeOutputNoLeader",
        "MCPAdapterKubeOutputBehind",
        "MCPAdapterKubeOutputRejecting",
        "MCPAdapterKubeOutputWritesFailing",
        "MCPAdapterKubeOutputConflict",
        "MCPAdapterKubeOutputNamespaceUnreadable",
        "MCPAdapterTLSCertificateExpiringSoon",
        "MCPAdapterTLSReloadFailing",
        "MCPAdapterRefusingStreams",
        "MCPAdapterRefusingConnections",
        "MCPAdapterHeapGrowing",
    ] {
        assert!(
            rules.alerts.iter().any(|a| a == name),
            "{name} missing from the rules: {:?}",
            rules.alerts
        );
    }
}
