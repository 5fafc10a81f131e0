//! The chart's monitoring (deploy/helm/mcp-adapters/templates/monitoring.yaml), with the real
//! helm (`HELM_BIN`) and, for the second test, the test kube-apiserver and the Prometheus
//! Operator's own CRDs (`PROMETHEUS_OPERATOR_CRDS`, default target/helm/prometheus-operator-crds,
//! which tests/helm/build.sh takes from the operator's module):
//!
//! - `helm template`: with the default values, and with monitoring on but its CRDs unknown, not
//!   one object more than without it; with `--api-versions` for a CRD, the object of that CRD
//!   only: a PodMonitor (or ServiceMonitor with one metrics Service per adapter) whose selector
//!   matches every rendered adapter pod and nothing else, scraping `http-admin` at `/metrics`
//!   with the values' interval and timeout under `job="mcp-adapters"`, and a PrometheusRule whose
//!   `spec.groups` is the chart's monitoring/alerts.yaml exactly (Prometheus' `{{ $labels.x }}`
//!   untouched); the labels asked for on each; nothing else of the chart changed;
//! - on the API server: a release with monitoring on where the CRDs are missing installs, creates
//!   none of them and its notes say so; once the CRDs are established, helm sees them through
//!   discovery (no `--api-versions`): the upgrade and a new install create the objects, which the
//!   CRDs' schemas accept with `fieldValidation=Strict`, stored with their labels; `helm
//!   uninstall` removes them.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use e2e::helm::{chart, ci, documents, Helm, RELEASE};
use e2e::kube::{collection_of, KubeApiServer, ADMIN_TOKEN};
use e2e::{peer_file, wait_for};

const NS: &str = "mcp-adapters";
/// The three CRDs, as helm's `--api-versions` names them.
const API_VERSIONS: [&str; 3] = [
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
];
/// What the alerts select (monitoring/alerts.yaml); the scrape must give exactly this job.
const JOB: &str = "mcp-adapters";
/// The adapters ci/monitoring-values.yaml turns on.
const MONITORED: [&str; 3] = ["adapter-consul", "adapter-zookeeper", "adapter-eureka"];
/// The labels ci/monitoring-values.yaml asks for.
const KPS: (&str, &str) = ("release", "kube-prometheus-stack");

/// Switches ci/monitoring-values.yaml's ServiceMonitor on instead of its PodMonitor.
const SERVICE_MONITOR: [&str; 2] = [
    "monitoring.podMonitor.enabled=false",
    "monitoring.serviceMonitor.enabled=true",
];
/// Everything of monitoring off (what the release would be without it).
const MONITORING_OFF: [&str; 3] = [
    "monitoring.podMonitor.enabled=false",
    "monitoring.serviceMonitor.enabled=false",
    "monitoring.prometheusRule.enabled=false",
];

fn api_version_args(which: &[&str]) -> Vec<&'static str> {
    API_VERSIONS
        .iter()
        .filter(|a| which.iter().any(|w| a.ends_with(&format!("/{w}"))))
        .flat_map(|a| ["--api-versions", a])
        .collect()
}

fn crds_dir() -> PathBuf {
    peer_file(
        "PROMETHEUS_OPERATOR_CRDS",
        "helm/prometheus-operator-crds",
        "tests/helm/build.sh target/helm",
    )
}

/// The chart's rule file, parsed.
fn alerts_file() -> (String, Value) {
    let path = chart().join("monitoring/alerts.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let parsed =
        yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    (text, parsed)
}

fn is_monitoring(o: &Value) -> bool {
    o["apiVersion"]
        .as_str()
        .is_some_and(|a| a.starts_with("monitoring.coreos.com/"))
        || (o["kind"] == "Service"
            && o["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-metrics")))
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| is_monitoring(o))
        .map(|o| {
            format!(
                "{} {}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let all: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(all.len(), 1, "one {kind}: {all:?}");
    all[0]
}

/// Whether a Kubernetes label selector (matchLabels, matchExpressions) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let label = |k: &str| labels[k].as_str();
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| label(k) == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().expect("key");
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str() {
                Some("In") => label(key).is_some_and(|v| values.contains(&v)),
                Some("NotIn") => !label(key).is_some_and(|v| values.contains(&v)),
                Some("Exists") => label(key).is_some(),
                Some("DoesNotExist") => label(key).is_none(),
                other => panic!("operator {other:?}"),
            }
        });
    by_labels && by_expressions
}

/// The objects' metadata labels carry `want` and the chart's own.
fn check_labels(o: &Value, want: &[(&str, &str)]) {
    let labels = &o["metadata"]["labels"];
    for (k, v) in want.iter().chain(&[
        ("app.kubernetes.io/part-of", "mcp-adapters"),
        ("app.kubernetes.io/instance", RELEASE),
        ("app.kubernetes.io/managed-by", "Helm"),
    ]) {
        assert_eq!(labels[*k], *v, "{} label {k}: {labels}", o["kind"]);
    }
}

/// The one scrape endpoint of a PodMonitor or ServiceMonitor: http-admin, /metrics, the values'
/// interval and timeout, and job set to [`JOB`] (what the alerts select).
fn check_endpoint(monitor: &Value, list: &str) {
    let endpoints = monitor["spec"][list].as_array().expect(list);
    assert_eq!(endpoints.len(), 1, "{monitor}");
    let e = &endpoints[0];
    assert_eq!(e["port"], "http-admin", "{e}");
    assert_eq!(e["path"], "/metrics", "{e}");
    assert_eq!(e["interval"], "15s", "{e}");
    assert_eq!(e["scrapeTimeout"], "5s", "{e}");
    // The last relabeling that writes `job` (Prometheus applies them in order) sets JOB.
    let job = e["relabelings"]
        .as_array()
        .into_iter()
        .flatten()
        .rfind(|r| r["targetLabel"] == "job")
        .unwrap_or_else(|| panic!("no relabeling sets job: {e}"));
    assert_eq!(
        job["action"].as_str().unwrap_or("replace").to_lowercase(),
        "replace",
        "{job}"
    );
    assert_eq!(job["replacement"], JOB, "{job}");
    assert!(
        job["sourceLabels"].as_array().is_none_or(Vec::is_empty),
        "{job}: a constant, not taken from a label"
    );
    assert_eq!(
        monitor["spec"]["namespaceSelector"],
        json!({"matchNames": [monitor["metadata"]["namespace"]]}),
        "{monitor}"
    );
}

/// The pod template labels of each rendered Deployment, by name.
fn pod_labels(objects: &[Value]) -> Vec<(String, Value)> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .map(|d| {
            let ports = &d["spec"]["template"]["spec"]["containers"][0]["ports"];
            assert!(
                ports
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == "http-admin"),
                "{}: no http-admin port",
                d["metadata"]["name"]
            );
            (
                d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                d["spec"]["template"]["metadata"]["labels"].clone(),
            )
        })
        .collect()
}

/// The PrometheusRule is alerts.yaml: `spec` holds its `groups`, exactly.
fn check_rule(rule: &Value) {
    let (text, alerts) = alerts_file();
    assert!(
        alerts["groups"].as_array().is_some_and(|g| !g.is_empty()),
        "alerts.yaml: no groups"
    );
    assert_eq!(
        rule["spec"],
        json!({"groups": alerts["groups"]}),
        "PrometheusRule spec"
    );
    // Prometheus' own templates reach the object as they are (never rendered by helm).
    if text.contains("{{ $labels.") {
        assert!(
            rule["spec"].to_string().contains("{{ $labels."),
            "{{ $labels.x }} lost: {}",
            rule["spec"]
        );
    }
}

#[test]
#[ignore = "needs the real helm: tests/helm/build.sh target/helm (the README's test command builds it)"]
fn monitoring_objects_render_only_with_their_flag_and_crd() {
    let helm = Helm::new();
    let values = ci("monitoring-values.yaml");
    let all_crds = api_version_args(&["PodMonitor", "ServiceMonitor", "PrometheusRule"]);

    // Default values, CRDs or not: nothing at all (no adapter, no monitoring).
    let none = helm.template_with(NS, &[], &[], &all_crds);
    assert!(none.is_empty(), "default values render {none:?}");
    // Monitoring off (the default) with every adapter on and the CRDs there: nothing of it.
    let manifests = helm.template(NS, &[&ci("manifests-values.yaml")], &[]);
    assert_eq!(
        helm.template_with(NS, &[&ci("manifests-values.yaml")], &[], &all_crds),
        manifests,
        "monitoring off: the CRDs change nothing"
    );
    assert!(kinds(&manifests).is_empty());

    let without = helm.template(NS, &[&values], &MONITORING_OFF);
    assert_eq!(
        pod_labels(&without).len(),
        MONITORED.len(),
        "ci/monitoring-values.yaml's adapters"
    );
    // Monitoring on, the CRDs unknown (no --api-versions): exactly the release without it.
    assert_eq!(
        helm.template(NS, &[&values], &[]),
        without,
        "PodMonitor and PrometheusRule on without their CRDs"
    );
    assert_eq!(
        helm.template(NS, &[&values], &SERVICE_MONITOR),
        without,
        "ServiceMonitor on without its CRD"
    );
    // Each object needs its own CRD: the other two CRDs do not bring it.
    let partial = helm.template_with(
        NS,
        &[&values],
        &[],
        &api_version_args(&["ServiceMonitor", "PrometheusRule"]),
    );
    assert_eq!(kinds(&partial), set(&["PrometheusRule mcp-adapters"]));
    let partial = helm.template_with(
        NS,
        &[&values],
        &[],
        &api_version_args(&["PodMonitor", "ServiceMonitor"]),
    );
    assert_eq!(kinds(&partial), set(&["PodMonitor mcp-adapters"]));

    // The PodMonitor and the PrometheusRule, with their CRDs.
    let objects = helm.template_with(NS, &[&values], &[], &all_crds);
    assert_eq!(
        kinds(&objects),
        set(&["PodMonitor mcp-adapters", "PrometheusRule mcp-adapters"])
    );
    let rest: Vec<Value> = objects
        .iter()
        .filter(|o| !is_monitoring(o))
        .cloned()
        .collect();
    assert_eq!(rest, without, "monitoring changes no other object");
    for o in objects.iter().filter(|o| is_monitoring(o)) {
        assert_eq!(o["metadata"]["namespace"], NS, "{o}");
    }
    let pm = one(&objects, "PodMonitor");
    check_labels(pm, &[KPS]);
    check_endpoint(pm, "podMetricsEndpoints");
    let selector = &pm["spec"]["selector"];
    let pods = pod_labels(&objects);
    for (name, labels) in &pods {
        assert!(
            selects(selector, labels),
            "PodMonitor misses {name}'s pods ({labels}): {selector}"
        );
    }
    // ... and no pod of an adapter this release does not run.
    for other in ["adapter-file", "adapter-nacos", "adapter-kube"] {
        let labels =
            json!({"app.kubernetes.io/name": other, "app.kubernetes.io/part-of": "mcp-adapters"});
        assert!(
            !selects(selector, &labels),
            "PodMonitor selects {other}: {selector}"
        );
    }
    let rule = one(&objects, "PrometheusRule");
    check_labels(rule, &[KPS, ("role", "alert-rules")]);
    check_rule(rule);

    // The ServiceMonitor instead: a headless metrics Service per adapter on its admin port (other
    // ports for eureka, and one for zookeeper, which has no MCP Service), selected by the
    // ServiceMonitor, which selects no other Service.
    let objects = helm.template_with(NS, &[&values], &SERVICE_MONITOR, &all_crds);
    let mut want = vec![
        "ServiceMonitor mcp-adapters".to_string(),
        "PrometheusRule mcp-adapters".to_string(),
    ];
    want.extend(MONITORED.iter().map(|a| format!("Service {a}-metrics")));
    assert_eq!(kinds(&objects), want.into_iter().collect());
    let rest: Vec<Value> = objects
        .iter()
        .filter(|o| !is_monitoring(o))
        .cloned()
        .collect();
    assert_eq!(rest, without, "monitoring changes no other object");
    let sm = one(&objects, "ServiceMonitor");
    check_labels(sm, &[KPS]);
    check_endpoint(sm, "endpoints");
    let selector = &sm["spec"]["selector"];
    for s in objects.iter().filter(|o| o["kind"] == "Service") {
        let name = s["metadata"]["name"].as_str().unwrap_or_default();
        let Some(adapter) = name.strip_suffix("-metrics") else {
            assert!(
                !selects(selector, &s["metadata"]["labels"]),
                "ServiceMonitor selects the MCP Service {name}"
            );
            continue;
        };
        assert!(
            selects(selector, &s["metadata"]["labels"]),
            "ServiceMonitor misses {name}: {selector}"
        );
        assert_eq!(s["metadata"]["namespace"], NS);
        assert_eq!(s["spec"]["clusterIP"], "None", "{name}: headless");
        let (_, labels) = pods
            .iter()
            .find(|(d, _)| d == adapter)
            .unwrap_or_else(|| panic!("{name}: no Deployment {adapter}"));
        assert!(
            selects(&json!({"matchLabels": s["spec"]["selector"]}), labels),
            "{name} misses {adapter}'s pods"
        );
        let d = objects
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == adapter)
            .expect("Deployment");
        let admin = d["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == "http-admin")
            .expect("http-admin")["containerPort"]
            .clone();
        assert_eq!(
            s["spec"]["ports"],
            json!([{"name": "http-admin", "port": admin, "targetPort": "http-admin",
                "protocol": "TCP", "appProtocol": "http"}]),
            "{name}"
        );
    }
    check_rule(one(&objects, "PrometheusRule"));

    // Both monitors at once would scrape every pod twice: refused.
    let chart_dir = chart().display().to_string();
    let out = helm.run(&[
        "template",
        RELEASE,
        &chart_dir,
        "--values",
        &values,
        "--set",
        "monitoring.serviceMonitor.enabled=true",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("podMonitor and serviceMonitor"),
        "both monitors: {err}"
    );
}

/// Applies the three CRDs and waits until the API server serves them (established, and listed in
/// discovery, which is what helm reads).
fn install_crds(kube: &KubeApiServer) {
    let dir = crds_dir();
    for crd in ["podmonitors", "servicemonitors", "prometheusrules"] {
        let path = dir.join(format!("monitoring.coreos.com_{crd}.yaml"));
        let stored = kube.apply_manifest(&path, |_| ());
        assert_eq!(stored.len(), 1, "{}", path.display());
        let name = stored[0]["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        wait_for(
            Duration::from_secs(60),
            &format!("{name} established"),
            || {
                kube.get(&format!(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                ))?["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
                    .then_some(())
            },
        );
    }
    wait_for(
        Duration::from_secs(60),
        "monitoring.coreos.com/v1 in discovery",
        || {
            let served: BTreeSet<String> = kube.get("/apis/monitoring.coreos.com/v1")?["resources"]
                .as_array()?
                .iter()
                .filter_map(|r| r["kind"].as_str().map(str::to_string))
                .collect();
            ["PodMonitor", "ServiceMonitor", "PrometheusRule"]
                .iter()
                .all(|k| served.contains(*k))
                .then_some(())
        },
    );
}

/// A dry-run create with strict field validation (an unknown or duplicate field is an error).
fn strict_dry_run(kube: &KubeApiServer, obj: &Value) -> Result<(), String> {
    let path = format!("{}?dryRun=All&fieldValidation=Strict", collection_of(obj));
    let r = kube.request(ADMIN_TOKEN, "POST", &path, Some(obj));
    match r.status {
        200 | 201 => Ok(()),
        s => Err(format!("{s} {}", r.body["message"])),
    }
}

fn path_of(o: &Value) -> String {
    format!(
        "{}/{}",
        collection_of(o),
        o["metadata"]["name"].as_str().expect("name")
    )
}

/// The monitoring objects of a release's manifest (`helm get manifest`).
fn release_monitoring(helm: &Helm, ns: &str, kubeconfig: &str) -> Vec<Value> {
    let manifest = helm.ok(&[
        "get",
        "manifest",
        RELEASE,
        "--namespace",
        ns,
        "--kubeconfig",
        kubeconfig,
    ]);
    documents(&manifest, "helm get manifest")
        .into_iter()
        .filter(is_monitoring)
        .collect()
}

fn notes(helm: &Helm, ns: &str, kubeconfig: &str) -> String {
    helm.ok(&[
        "get",
        "notes",
        RELEASE,
        "--namespace",
        ns,
        "--kubeconfig",
        kubeconfig,
    ])
}

/// Whether NOTES.txt says `kind` was turned on but not created for want of its CRD.
fn says_missing(notes: &str, kind: &str) -> bool {
    notes.contains(&format!("Monitoring: no {kind} was created."))
        && notes.contains(&format!("no {kind} CRD (monitoring.coreos.com/v1"))
}

/// Each stored object is the rendered one (labels, spec) in the API server.
fn check_stored(kube: &KubeApiServer, objects: &[Value]) {
    for o in objects {
        let stored = kube
            .get(&path_of(o))
            .unwrap_or_else(|| panic!("{} {} not created", o["kind"], o["metadata"]["name"]));
        assert_eq!(
            stored["metadata"]["labels"], o["metadata"]["labels"],
            "{}",
            o["kind"]
        );
        if o["kind"] != "Service" {
            assert_eq!(stored["spec"], o["spec"], "{} stored", o["kind"]);
        }
        if o["kind"] == "PrometheusRule" {
            check_rule(&stored);
        }
    }
}

#[test]
#[ignore = "needs the real helm, kube-apiserver and the Prometheus Operator's CRDs: tests/helm/build.sh target/helm, tests/go-peers/build.sh target (the README's test command builds them)"]
fn monitoring_objects_on_the_api_server_with_and_without_their_crds() {
    let helm = Helm::new();
    let kube = KubeApiServer::start();
    let kubeconfig = kube.kubeconfig().display().to_string();
    let kc = kubeconfig.as_str();
    let chart_dir = chart().display().to_string();
    let values = ci("monitoring-values.yaml");
    let install = |verb: &str, ns: &str, sets: &[&str]| {
        let mut args = vec![
            verb,
            RELEASE,
            chart_dir.as_str(),
            "--namespace",
            ns,
            "--kubeconfig",
            kc,
            "--values",
            values.as_str(),
        ];
        for s in sets {
            args.extend(["--set", s]);
        }
        helm.ok(&args)
    };

    // 1. No CRDs: monitoring on installs all the same, creates none of it, and says why.
    let early = "mon-early";
    kube.namespace(early);
    // adapter-zookeeper's output namespace (its Role goes there; the chart creates none).
    kube.namespace("dubbo");
    assert!(
        kube.get("/apis/monitoring.coreos.com/v1").is_none(),
        "no CRD yet"
    );
    let dry: Value = serde_json::from_str(&helm.ok(&[
        "install",
        RELEASE,
        &chart_dir,
        "--namespace",
        early,
        "--kubeconfig",
        kc,
        "--values",
        &values,
        "--dry-run=client",
        "--output",
        "json",
    ]))
    .expect("release JSON");
    let dry_notes = dry["info"]["notes"].as_str().expect("notes");
    for kind in ["PodMonitor", "PrometheusRule"] {
        assert!(
            says_missing(dry_notes, kind),
            "notes without the {kind} CRD:\n{dry_notes}"
        );
    }
    assert!(!says_missing(dry_notes, "ServiceMonitor"), "{dry_notes}");
    install("install", early, &[]);
    assert!(release_monitoring(&helm, early, kc).is_empty());
    let installed = notes(&helm, early, kc);
    assert!(
        says_missing(&installed, "PodMonitor") && says_missing(&installed, "PrometheusRule"),
        "{installed}"
    );
    assert!(
        kube.get(&format!(
            "/apis/apps/v1/namespaces/{early}/deployments/adapter-consul"
        ))
        .is_some(),
        "the adapters themselves are installed"
    );
    // The ServiceMonitor's metrics Services come only with it.
    install("upgrade", early, &SERVICE_MONITOR);
    assert!(release_monitoring(&helm, early, kc).is_empty());
    assert!(kube
        .get(&format!(
            "/api/v1/namespaces/{early}/services/adapter-consul-metrics"
        ))
        .is_none());
    assert!(says_missing(&notes(&helm, early, kc), "ServiceMonitor"));

    // 2. The CRDs, as the operator ships them; their schemas hold (a misspelt field is refused).
    install_crds(&kube);
    let typo = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {"name": "typo", "namespace": early},
        "spec": {"selector": {}, "podMetricEndpoints": [{"port": "http-admin"}]}});
    let err = strict_dry_run(&kube, &typo).expect_err("strict validation refuses a misspelt field");
    assert!(err.contains("podMetricEndpoints"), "{err}");
    let all_crds = api_version_args(&["PodMonitor", "ServiceMonitor", "PrometheusRule"]);
    for sets in [&[][..], &SERVICE_MONITOR[..]] {
        for o in helm
            .template_with(early, &[&values], sets, &all_crds)
            .iter()
            .filter(|o| is_monitoring(o))
        {
            strict_dry_run(&kube, o)
                .unwrap_or_else(|e| panic!("{} {} refused: {e}", o["kind"], o["metadata"]["name"]));
        }
    }

    // 3. The same release upgraded now: helm discovers the CRDs and creates the objects.
    install("upgrade", early, &[]);
    let made = release_monitoring(&helm, early, kc);
    assert_eq!(
        kinds(&made),
        set(&["PodMonitor mcp-adapters", "PrometheusRule mcp-adapters"]),
        "upgrade once the CRDs are there"
    );
    check_stored(&kube, &made);
    check_labels(
        &kube
            .get(&path_of(one(&made, "PodMonitor")))
            .expect("stored"),
        &[KPS],
    );
    let upgraded = notes(&helm, early, kc);
    for kind in ["PodMonitor", "ServiceMonitor", "PrometheusRule"] {
        assert!(!says_missing(&upgraded, kind), "{upgraded}");
    }
    // What Prometheus will see, and the NetworkPolicy in its way (networkPolicy.admin).
    assert!(
        upgraded.contains("job=\"mcp-adapters\"") && upgraded.contains("networkPolicy.admin"),
        "{upgraded}"
    );

    // 4. helm uninstall removes them; then a new release (the Role in `dubbo` is free again)
    // with the ServiceMonitor and its metrics Services, uninstalled too.
    let uninstall = |ns: &str, objects: &[Value]| {
        helm.ok(&["uninstall", RELEASE, "--namespace", ns, "--kubeconfig", kc]);
        for o in objects {
            assert!(
                kube.get(&path_of(o)).is_none(),
                "{} {} left after helm uninstall",
                o["kind"],
                o["metadata"]["name"]
            );
        }
    };
    uninstall(early, &made);
    let late = "mon-late";
    kube.namespace(late);
    install("install", late, &SERVICE_MONITOR);
    let made_late = release_monitoring(&helm, late, kc);
    let mut want = set(&["ServiceMonitor mcp-adapters", "PrometheusRule mcp-adapters"]);
    want.extend(MONITORED.iter().map(|a| format!("Service {a}-metrics")));
    assert_eq!(kinds(&made_late), want);
    check_stored(&kube, &made_late);
    check_labels(
        &kube
            .get(&path_of(one(&made_late, "ServiceMonitor")))
            .expect("stored"),
        &[KPS],
    );
    uninstall(late, &made_late);
}
