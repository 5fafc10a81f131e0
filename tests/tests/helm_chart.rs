//! The Helm chart `deploy/helm/mcp-adapters`, with the real `helm` (helm.sh/helm/v3, built from
//! the Go module proxy by tests/helm/build.sh; `HELM_BIN`, default `target/helm/helm`):
//!
//! - `helm lint --strict` with the default values and every `ci/*-values.yaml`;
//! - `helm template` of each: what each values file asks for is what is rendered (ports, shards,
//!   output mode and its RBAC, TLS, Secrets, state volume), and the chart refuses values the
//!   adapters would refuse;
//! - one source of truth: `ci/manifests-values.yaml` renders exactly the objects of
//!   deploy/kubernetes (object by object, Helm's own labels aside), with the Kubernetes output
//!   turned on exactly what the README's patch and `adapter-<name>-kube-output.yaml` make, and
//!   `watchedCluster` exactly adapter-kube's RBAC files;
//! - on the test kube-apiserver (1.35): every rendered object accepted with
//!   `fieldValidation=Strict` and stored; NOTES.txt's `configSources` lines are the rendered
//!   Services' ports, one per shard, `k8s://` first (and for the manifests' values, exactly
//!   deploy/kubernetes/istiod-meshconfig.yaml); the output RBAC seen through the adapters'
//!   ServiceAccount tokens (SelfSubjectRulesReview); and a real `helm install`, `upgrade` and
//!   `uninstall` of the chart.
//!
//! The chart is checked against the plain manifests rather than generating them: those files
//! carry the comments that explain every field, are applied unchanged by `kubectl apply -f` and
//! GitOps tools, and are what tests/tests/deploy_manifests.rs checks in depth (RBAC through the
//! real authorizer); a change to either side that the other does not get fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use e2e::helm::{chart, ci, documents, Helm, RELEASE};
use e2e::kube::{collection_of, strings, KubeApiServer, ADMIN_TOKEN};

const NS: &str = "mcp-adapters";
/// In the chart's order (`mcp-adapters.names`: NOTES.txt and istiod-meshconfig.yaml list them so).
const ADAPTERS: [&str; 6] = ["file", "consul", "zookeeper", "eureka", "nacos", "kube"];
/// Labels the chart adds to every object's metadata that deploy/kubernetes does not have.
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn file_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read manifest");
    documents(&text, &path.display().to_string())
}

type Key = (String, String, String, String);

/// apiVersion, kind, namespace, name.
fn key(o: &Value) -> Key {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&o["apiVersion"]),
        s(&o["kind"]),
        s(&o["metadata"]["namespace"]),
        s(&o["metadata"]["name"]),
    )
}

/// `o` without the labels only the chart sets (and without a labels map left empty by that).
fn without_helm_labels(mut o: Value) -> Value {
    if let Some(labels) = o["metadata"]["labels"].as_object_mut() {
        for l in HELM_LABELS {
            labels.remove(l);
        }
        if labels.is_empty() {
            o["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("labels");
        }
    }
    o
}

fn by_key(objects: Vec<Value>) -> BTreeMap<Key, Value> {
    let mut map = BTreeMap::new();
    for o in objects {
        let k = key(&o);
        assert!(map.insert(k.clone(), o).is_none(), "{k:?} twice");
    }
    map
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn must<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    find(objects, kind, name).unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// The differences between two object sets, key by key (none: the same objects).
fn differences(
    what: &str,
    chart: BTreeMap<Key, Value>,
    files: BTreeMap<Key, Value>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for k in chart.keys().chain(files.keys()).collect::<BTreeSet<_>>() {
        match (chart.get(k), files.get(k)) {
            (Some(_), None) => problems.push(format!("{what}: only the chart renders {k:?}")),
            (None, Some(_)) => problems.push(format!("{what}: only deploy/kubernetes has {k:?}")),
            (Some(c), Some(f)) if c != f => problems.push(format!(
                "{what}: {k:?} differs:\n  chart:    {c}\n  manifest: {f}"
            )),
            _ => {}
        }
    }
    assert!(!files.is_empty(), "{what}: nothing to compare");
    problems
}

/// What a values file asks of one adapter, to find in its rendering.
struct Expect {
    file: &'static str,
    adapter: &'static str,
    shards: u64,
    mcp_port: u64,
    admin_port: u64,
    replicas: u64,
    /// `--output`: mcp, both or kube.
    mode: &'static str,
    output_namespaces: &'static [&'static str],
    /// `None`: the release namespace.
    lease_namespace: Option<&'static str>,
    lease: &'static str,
    tls: bool,
    /// (Secret, key) the pod reads.
    secrets: &'static [(&'static str, &'static str)],
    /// The state file's volume source, if any.
    state_volume: Option<&'static str>,
}

const EXPECT: [Expect; 6] = [
    Expect {
        file: "file-values.yaml",
        adapter: "file",
        shards: 1,
        mcp_port: 15051,
        admin_port: 15050,
        replicas: 2,
        mode: "mcp",
        output_namespaces: &[],
        lease_namespace: None,
        lease: "mcp-adapter-file",
        tls: false,
        secrets: &[],
        state_volume: None,
    },
    Expect {
        file: "consul-values.yaml",
        adapter: "consul",
        shards: 4,
        mcp_port: 15051,
        admin_port: 15050,
        replicas: 3,
        mode: "both",
        output_namespaces: &["consul"],
        lease_namespace: None,
        lease: "mcp-adapter-consul",
        tls: false,
        secrets: &[("consul-acl-token", "acl-token")],
        state_volume: Some("emptyDir"),
    },
    Expect {
        file: "zookeeper-values.yaml",
        adapter: "zookeeper",
        shards: 8,
        mcp_port: 15051,
        admin_port: 15050,
        replicas: 2,
        mode: "kube",
        output_namespaces: &["dubbo"],
        lease_namespace: None,
        lease: "mcp-adapter-zookeeper",
        tls: false,
        secrets: &[("zk-digest", "digest")],
        state_volume: Some("emptyDir"),
    },
    Expect {
        file: "eureka-values.yaml",
        adapter: "eureka",
        shards: 2,
        mcp_port: 16001,
        admin_port: 16000,
        replicas: 2,
        mode: "mcp",
        output_namespaces: &[],
        lease_namespace: None,
        lease: "mcp-adapter-eureka",
        tls: true,
        secrets: &[
            ("eureka-basic-auth", "user"),
            ("eureka-basic-auth", "pass"),
            ("adapter-eureka-tls", "tls.crt"),
        ],
        state_volume: Some("emptyDir"),
    },
    Expect {
        file: "nacos-values.yaml",
        adapter: "nacos",
        shards: 2,
        mcp_port: 15051,
        admin_port: 15050,
        replicas: 2,
        mode: "both",
        output_namespaces: &["nacos"],
        lease_namespace: None,
        lease: "mcp-adapter-nacos",
        tls: false,
        // The auth file, mounted from the Secret (NACOS_AUTH_FILE).
        secrets: &[("nacos-login", "user-pass")],
        state_volume: Some("emptyDir"),
    },
    Expect {
        file: "kube-values.yaml",
        adapter: "kube",
        shards: 4,
        mcp_port: 15051,
        admin_port: 15050,
        replicas: 2,
        mode: "both",
        output_namespaces: &["team-a", "team-b"],
        lease_namespace: Some("mcp-leases"),
        // --source-name=west
        lease: "mcp-adapter-west",
        tls: false,
        secrets: &[("west-kubeconfig", "config")],
        state_volume: None,
    },
];

/// The args of a Deployment's container.
fn args_of(d: &Value) -> Vec<String> {
    strings(&d["spec"]["template"]["spec"]["containers"][0]["args"])
}

fn arg<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
}

/// Secrets a pod spec reads: (name, key) from secretKeyRefs, and (name, file) for a mounted
/// Secret's file named in an arg or env value.
fn secret_refs(d: &Value) -> BTreeSet<(String, String)> {
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mut refs = BTreeSet::new();
    let mut paths: Vec<String> = args_of(d);
    for e in c["env"].as_array().into_iter().flatten() {
        if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
            refs.insert((
                r["name"].as_str().unwrap_or_default().to_string(),
                r["key"].as_str().unwrap_or_default().to_string(),
            ));
        }
        if let Some(v) = e["value"].as_str() {
            paths.push(v.to_string());
        }
    }
    for v in pod["volumes"].as_array().into_iter().flatten() {
        let Some(secret) = v["secret"]["secretName"].as_str() else {
            continue;
        };
        let mount = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == v["name"])
            .and_then(|m| m["mountPath"].as_str())
            .unwrap_or_else(|| panic!("Secret volume {} not mounted", v["name"]));
        for p in &paths {
            let file = p.rsplit('=').next().unwrap_or(p);
            if let Some(name) = file.strip_prefix(mount).and_then(|f| f.strip_prefix('/')) {
                refs.insert((secret.to_string(), name.to_string()));
            }
        }
    }
    refs
}

/// The rendering of one adapter, checked for what `e` asks and for its own consistency: the
/// Deployment's args, ports, probes and token; the Service and NetworkPolicy on exactly the shard
/// ports; the output's RBAC in exactly its namespaces.
fn check_adapter(objects: &[Value], ns: &str, e: &Expect) {
    let name = format!("adapter-{}", e.adapter);
    let what = format!("{} ({name})", e.file);
    let selector = json!({"app.kubernetes.io/name": name});
    for o in objects {
        let labels = &o["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/name"],
            name.as_str(),
            "{what}: {o}"
        );
        assert_eq!(
            labels["app.kubernetes.io/part-of"], "mcp-adapters",
            "{what}"
        );
        assert_eq!(labels["app.kubernetes.io/instance"], RELEASE, "{what}");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{what}");
    }
    let output_on = e.mode != "mcp";
    let serves_mcp = e.mode != "kube";
    let shard_ports: Vec<u64> = (0..e.shards).map(|i| e.mcp_port + i).collect();

    let d = must(objects, "Deployment", &name);
    assert_eq!(d["metadata"]["namespace"], ns, "{what}");
    assert_eq!(d["spec"]["replicas"], e.replicas, "{what}: replicas");
    assert_eq!(d["spec"]["selector"]["matchLabels"], selector, "{what}");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], name.as_str(), "{what}");
    assert_eq!(
        pod["automountServiceAccountToken"], output_on,
        "{what}: token"
    );
    let sa = must(objects, "ServiceAccount", &name);
    assert_eq!(sa["automountServiceAccountToken"], false, "{what}");
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"],
        format!("ghcr.io/example/mcp-adapter-{}:0.1.0", e.adapter),
        "{what}"
    );
    let args = args_of(d);
    assert_eq!(
        arg(&args, "--listen"),
        Some(format!("0.0.0.0:{}", e.mcp_port).as_str()),
        "{what}: {args:?}"
    );
    assert_eq!(
        arg(&args, "--shards"),
        Some(e.shards.to_string().as_str()),
        "{what}"
    );
    assert_eq!(
        arg(&args, "--admin-listen"),
        Some(format!("0.0.0.0:{}", e.admin_port).as_str()),
        "{what}"
    );
    let lease_ns = e.lease_namespace.unwrap_or(ns);
    if output_on {
        assert_eq!(arg(&args, "--output"), Some(e.mode), "{what}: {args:?}");
        assert_eq!(
            arg(&args, "--output-namespaces"),
            Some(e.output_namespaces.join(",").as_str()),
            "{what}"
        );
        assert_eq!(
            arg(&args, "--output-lease-namespace"),
            Some(lease_ns),
            "{what}"
        );
    } else {
        assert!(
            !args.iter().any(|a| a.starts_with("--output")),
            "{what}: {args:?}"
        );
    }
    assert_eq!(
        arg(&args, "--tls-cert").is_some() && arg(&args, "--tls-key").is_some(),
        e.tls,
        "{what}: {args:?}"
    );
    // The one TLS values file holds its client certificates to two names (tls.clientSANs).
    assert_eq!(
        arg(&args, "--tls-client-san"),
        e.tls
            .then_some("spiffe://cluster.local/ns/monitoring/*,mcp-auditor.tools.svc"),
        "{what}: {args:?}"
    );
    // Container ports: one per shard from --listen (none with --output=kube), and the admin
    // port, which both probes use and the shard ports do not include.
    let mut want_ports: Vec<Value> = Vec::new();
    if serves_mcp {
        for (i, p) in shard_ports.iter().enumerate() {
            want_ports.push(json!({"name": format!("grpc-mcp-{i}"), "containerPort": p,
                "protocol": "TCP"}));
        }
    }
    want_ports.push(json!({"name": "http-admin", "containerPort": e.admin_port,
        "protocol": "TCP"}));
    assert_eq!(c["ports"], Value::Array(want_ports), "{what}: ports");
    assert!(!shard_ports.contains(&e.admin_port), "{what}");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{what}");
        assert_eq!(c[probe]["httpGet"]["port"], "http-admin", "{what}");
    }
    assert_eq!(
        d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"],
        e.admin_port.to_string(),
        "{what}"
    );
    // The Secrets it reads, which the chart does not create.
    let refs = secret_refs(d);
    for (s, k) in e.secrets {
        assert!(
            refs.contains(&(s.to_string(), k.to_string())),
            "{what}: reads {s}/{k}? {refs:?}"
        );
    }
    assert!(
        !objects.iter().any(|o| o["kind"] == "Secret"),
        "{what}: the chart creates no Secret"
    );
    // The state file, on a per-pod volume of the kind asked for.
    let state = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "MCP_STATE_FILE");
    match e.state_volume {
        None => assert!(state.is_none(), "{what}: no state file"),
        Some(kind) => {
            let file = state.expect("MCP_STATE_FILE")["value"]
                .as_str()
                .expect("a path");
            let dir = Path::new(file).parent().expect("dir");
            let mount = c["volumeMounts"]
                .as_array()
                .expect("mounts")
                .iter()
                .find(|m| m["mountPath"].as_str() == dir.to_str())
                .unwrap_or_else(|| panic!("{what}: {dir:?} not mounted"));
            let volume = pod["volumes"]
                .as_array()
                .expect("volumes")
                .iter()
                .find(|v| v["name"] == mount["name"])
                .expect("state volume");
            assert!(volume[kind].is_object(), "{what}: {volume}");
        }
    }

    // The Service: exactly the shard ports, or none with --output=kube.
    match find(objects, "Service", &name) {
        Some(s) => {
            assert!(serves_mcp, "{what}: a Service with --output=kube");
            assert_eq!(s["spec"]["selector"], selector, "{what}");
            let want: Vec<Value> = shard_ports
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    json!({"name": format!("grpc-mcp-{i}"), "port": p,
                        "targetPort": format!("grpc-mcp-{i}"), "protocol": "TCP",
                        "appProtocol": "grpc"})
                })
                .collect();
            assert_eq!(
                s["spec"]["ports"],
                Value::Array(want),
                "{what}: Service ports"
            );
        }
        None => assert!(!serves_mcp, "{what}: no Service"),
    }
    // The NetworkPolicy: istiod to the shard ports (none with kube), the namespace to admin.
    let np = must(objects, "NetworkPolicy", &name);
    let rules = np["spec"]["ingress"].as_array().expect("ingress");
    let mut ports: Vec<Value> = rules.iter().map(|r| r["ports"][0].clone()).collect();
    let mut want = Vec::new();
    if serves_mcp {
        let mut p = json!({"port": e.mcp_port, "protocol": "TCP"});
        if e.shards > 1 {
            p["endPort"] = json!(e.mcp_port + e.shards - 1);
        }
        want.push(p);
        assert_eq!(
            rules[0]["from"][0]["podSelector"]["matchLabels"]["app"], "istiod",
            "{what}"
        );
    }
    want.push(json!({"port": e.admin_port, "protocol": "TCP"}));
    ports.sort_by_key(|p| p["port"].as_u64());
    want.sort_by_key(|p| p["port"].as_u64());
    assert_eq!(ports, want, "{what}: NetworkPolicy ports");

    // The output's RBAC: a Role and RoleBinding per output namespace, the Lease Role where the
    // Lease is, bound to this ServiceAccount; nothing when the output is off.
    let roles: BTreeSet<(String, String)> = objects
        .iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "RoleBinding")
        .map(|o| {
            (
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["namespace"].as_str().unwrap_or_default()
                ),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    let mut want_roles = BTreeSet::new();
    if output_on {
        for kind in ["Role", "RoleBinding"] {
            for out_ns in e.output_namespaces {
                want_roles.insert((format!("{kind}/{out_ns}"), format!("{name}-kube-output")));
            }
            want_roles.insert((
                format!("{kind}/{lease_ns}"),
                format!("{name}-kube-output-lease"),
            ));
        }
    }
    assert_eq!(roles, want_roles, "{what}: RBAC");
    for o in objects.iter().filter(|o| o["kind"] == "RoleBinding") {
        assert_eq!(
            o["subjects"],
            json!([{"kind": "ServiceAccount", "name": name, "namespace": ns}]),
            "{what}"
        );
    }
    for o in objects.iter().filter(|o| o["kind"] == "Role") {
        let rules = &o["rules"];
        if o["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-lease"))
        {
            assert_eq!(rules[0]["resourceNames"], json!([e.lease]), "{what}: Lease");
            assert_eq!(rules[0]["verbs"], json!(["get", "update"]), "{what}");
            assert_eq!(rules[1]["verbs"], json!(["create"]), "{what}");
        } else {
            assert_eq!(
                rules,
                &json!([{"apiGroups": ["networking.istio.io"], "resources": ["serviceentries"],
                    "verbs": ["list", "patch", "create", "delete"]}]),
                "{what}"
            );
        }
    }
    // Everything but the output's Roles in the release namespace.
    for o in objects {
        let kind = o["kind"].as_str().unwrap_or_default();
        if kind != "Role" && kind != "RoleBinding" {
            assert_eq!(o["metadata"]["namespace"], ns, "{what}: {kind}");
        }
    }
}

#[test]
#[ignore = "needs the real helm: tests/helm/build.sh target/helm (the README's test command builds it)"]
fn helm_lint_passes_with_every_values_file() {
    let helm = Helm::new();
    let chart_dir = chart().display().to_string();
    let mut runs: Vec<Vec<String>> = vec![vec![]];
    let mut files: Vec<String> = std::fs::read_dir(chart().join("ci"))
        .expect("ci/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with("-values.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "ci/: {files:?}");
    for f in &files {
        if f == "manifests-kube-output-values.yaml" {
            // Meant on top of manifests-values.yaml.
            runs.push(vec![ci("manifests-values.yaml"), ci(f)]);
        } else {
            runs.push(vec![ci(f)]);
        }
    }
    for values in runs {
        let mut args = vec!["lint", "--strict", chart_dir.as_str()];
        for v in &values {
            args.extend(["--values", v.as_str()]);
        }
        let out = helm.ok(&args);
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed") && !out.contains("[WARNING]"),
            "helm lint {values:?}:\n{out}"
        );
    }
}

#[test]
#[ignore = "needs the real helm: tests/helm/build.sh target/helm (the README's test command builds it)"]
fn helm_template_renders_what_each_values_file_asks_for() {
    let helm = Helm::new();
    // Default values: no adapter is on (each needs its registry), so nothing is rendered.
    let none = helm.template(NS, &[], &[]);
    assert!(none.is_empty(), "default values render {none:?}");

    for e in &EXPECT {
        let objects = helm.template("adapters", &[&ci(e.file)], &[]);
        check_adapter(&objects, "adapters", e);
    }
    // adapter-nacos' registry settings: the address, the Nacos namespaces to watch, and the auth
    // file where its Secret is mounted (never the credentials themselves in the pod spec).
    let nacos = helm.template("adapters", &[&ci("nacos-values.yaml")], &[]);
    let env: BTreeMap<String, Value> = must(&nacos, "Deployment", "adapter-nacos")["spec"]
        ["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                e.clone(),
            )
        })
        .collect();
    for (name, value) in [
        ("NACOS_ADDR", "https://nacos.example.internal:8848"),
        ("MCP_NACOS_NAMESPACES", "public,dev"),
        ("NACOS_AUTH_FILE", "/etc/mcp-adapter/nacos/user-pass"),
    ] {
        assert_eq!(
            env.get(name).map(|e| &e["value"]),
            Some(&json!(value)),
            "nacos-values.yaml: {name} in {env:?}"
        );
    }
    assert!(
        !env.keys()
            .any(|k| k == "NACOS_USERNAME" || k == "NACOS_PASSWORD"),
        "nacos-values.yaml: {env:?}"
    );
    // The same checks hold for every adapter of the manifests' values, with and without the
    // Kubernetes output.
    let manifests = helm.template(NS, &[&ci("manifests-values.yaml")], &[]);
    let output = helm.template(
        NS,
        &[
            &ci("manifests-values.yaml"),
            &ci("manifests-kube-output-values.yaml"),
        ],
        &[],
    );
    for a in ADAPTERS {
        let (out_ns, lease): (&'static [&'static str], &'static str) = match a {
            "file" => (&["legacy"], "mcp-adapter-file"),
            "consul" => (&["consul"], "mcp-adapter-consul"),
            "zookeeper" => (&["zookeeper"], "mcp-adapter-zookeeper"),
            "eureka" => (&["eureka"], "mcp-adapter-eureka"),
            "nacos" => (&["nacos"], "mcp-adapter-nacos"),
            // adapter-kube's registry name is `kubernetes`: its default --source-name, hence
            // its Lease.
            _ => (&["team-a"], "mcp-adapter-kubernetes"),
        };
        let own = |objects: &[Value]| -> Vec<Value> {
            objects
                .iter()
                .filter(|o| {
                    o["metadata"]["labels"]["app.kubernetes.io/name"] == format!("adapter-{a}")
                })
                .cloned()
                .collect()
        };
        for (objects, mode) in [(&manifests, "mcp"), (&output, "both")] {
            let e = Expect {
                file: if mode == "mcp" {
                    "manifests-values.yaml"
                } else {
                    "manifests-kube-output-values.yaml"
                },
                adapter: a,
                shards: 4,
                mcp_port: 15051,
                admin_port: 15050,
                replicas: 2,
                mode,
                output_namespaces: if mode == "mcp" { &[] } else { out_ns },
                lease_namespace: None,
                lease,
                tls: false,
                secrets: &[],
                state_volume: if a == "file" { None } else { Some("emptyDir") },
            };
            check_adapter(&own(objects), NS, &e);
        }
    }

    // adapter-kube's RBAC for the cluster it watches: a Role per namespace, nodes and pods.
    let watched = helm.template("mcp-adapters", &[&ci("watched-cluster-values.yaml")], &[]);
    let names: BTreeSet<String> = watched
        .iter()
        .map(|o| {
            format!(
                "{} {}/{}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["namespace"].as_str().unwrap_or("-"),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let want: BTreeSet<String> = [
        "ServiceAccount mcp-adapters/mcp-adapter-kube",
        "Role team-a/mcp-adapter-kube",
        "RoleBinding team-a/mcp-adapter-kube",
        "Role team-b/mcp-adapter-kube",
        "RoleBinding team-b/mcp-adapter-kube",
        "ClusterRole -/mcp-adapter-kube-nodes-pods",
        "ClusterRoleBinding -/mcp-adapter-kube-nodes-pods",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    assert_eq!(names, want, "watched-cluster-values.yaml");
    for o in watched
        .iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
    {
        assert_eq!(
            o["subjects"],
            json!([{"kind": "ServiceAccount", "name": "mcp-adapter-kube", "namespace": "mcp-adapters"}]),
            "{o}"
        );
    }

    // Values the adapters would refuse (or that would leave them without a registry) are refused
    // when rendering, with a message naming the setting.
    let on = "adapters.consul.enabled=true";
    for (sets, message) in [
        (vec![on, "defaults.shards=0"], "shards must be 1 to 64"),
        (vec![on, "defaults.shards=65"], "shards must be 1 to 64"),
        (
            vec![on, "defaults.ports.admin=15053"],
            "is among the shard ports 15051-15054",
        ),
        (
            vec![on, "defaults.output.mode=ambient"],
            "output.mode must be mcp, both or kube",
        ),
        (
            vec![
                "adapters.file.enabled=true",
                "adapters.file.files.a\\.yaml=x",
                "defaults.output.mode=both",
            ],
            "needs adapters.file.output.namespaces",
        ),
        (
            vec!["adapters.file.enabled=true"],
            "set adapters.file.files",
        ),
        (
            vec!["adapters.kube.enabled=true"],
            "kubeconfig.existingSecret is required",
        ),
        (
            vec![on, "defaults.tls.enabled=true"],
            "tls.enabled needs tls.existingSecret",
        ),
    ] {
        let chart = chart().display().to_string();
        let mut args = vec!["template", RELEASE, chart.as_str()];
        for s in &sets {
            args.extend(["--set", s]);
        }
        let out = helm.run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(message),
            "--set {sets:?}: want an error with {message:?}, got {}: {err}",
            out.status
        );
    }
    // An admin port among the shard ports is fine with --output=kube (no MCP port is opened).
    let kube_only = helm.template(
        NS,
        &[],
        &[
            on,
            "defaults.ports.admin=15052",
            "defaults.output.mode=kube",
        ],
    );
    assert!(find(&kube_only, "Service", "adapter-consul").is_none());
}

/// deploy/kubernetes/adapter-<a>.yaml's objects, its placeholder Secrets left out (the chart
/// reads existing Secrets: checked below), each with `edit` applied.
fn manifest_objects(files: &[String], edit: impl Fn(&mut Value)) -> BTreeMap<Key, Value> {
    let mut objects = Vec::new();
    for f in files {
        for mut o in file_documents(&manifests_dir().join(f)) {
            // The chart installs into its release namespace and declares none (a Namespace in a
            // release would be deleted with it); the Secrets are the user's.
            if o["kind"] == "Namespace" || o["kind"] == "Secret" {
                continue;
            }
            edit(&mut o);
            objects.push(o);
        }
    }
    by_key(objects)
}

#[test]
#[ignore = "needs the real helm: tests/helm/build.sh target/helm (the README's test command builds it)"]
fn chart_renders_exactly_the_plain_manifests() {
    let helm = Helm::new();
    let strip =
        |objects: Vec<Value>| by_key(objects.into_iter().map(without_helm_labels).collect());

    // Every file of deploy/kubernetes is in one of these comparisons, but namespace.yaml (the
    // chart installs into its release namespace and declares none) and istiod-meshconfig.yaml
    // (compared with NOTES.txt in rendered_chart_on_the_api_server_and_notes_list_every_shard):
    // a new file fails here until the chart has it too.
    let adapter_files: Vec<String> = ADAPTERS
        .iter()
        .map(|a| format!("adapter-{a}.yaml"))
        .collect();
    let output_files: Vec<String> = ADAPTERS
        .iter()
        .map(|a| format!("adapter-{a}-kube-output.yaml"))
        .collect();
    let rbac_files = [
        "adapter-kube-rbac.yaml",
        "adapter-kube-rbac-namespaced.yaml",
        "adapter-kube-rbac-nodes-pods.yaml",
    ];
    let accounted: BTreeSet<String> = adapter_files
        .iter()
        .chain(&output_files)
        .cloned()
        .chain(rbac_files.iter().map(|s| s.to_string()))
        .chain([
            "namespace.yaml".to_string(),
            "istiod-meshconfig.yaml".to_string(),
        ])
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(manifests_dir())
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml") || f.ends_with(".yml"))
        .collect();
    assert_eq!(
        present, accounted,
        "files of deploy/kubernetes the chart is checked against"
    );

    // 1. The adapters as shipped (--output=mcp).
    let values = ci("manifests-values.yaml");
    let rendered = helm.template(NS, &[&values], &[]);
    let mut problems = Vec::new();
    problems.extend(differences(
        "manifests-values.yaml",
        strip(rendered.clone()),
        manifest_objects(&adapter_files, |_| ()),
    ));
    // The placeholder Secrets of the manifests are the existing Secrets the chart reads, with
    // the keys it reads.
    let mut read: BTreeSet<(String, String)> = BTreeSet::new();
    for d in rendered.iter().filter(|o| o["kind"] == "Deployment") {
        read.extend(secret_refs(d));
    }
    let mut shipped: BTreeSet<(String, String)> = BTreeSet::new();
    for f in &adapter_files {
        for o in file_documents(&manifests_dir().join(f)) {
            if o["kind"] == "Secret" {
                for k in o["stringData"].as_object().expect("stringData").keys() {
                    shipped.insert((
                        o["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        k.clone(),
                    ));
                }
            }
        }
    }
    if read != shipped {
        problems.push(format!(
            "Secrets (name, key) the chart's pods read {read:?}, deploy/kubernetes ships {shipped:?}"
        ));
    }

    // 2. The Kubernetes output turned on as deploy/kubernetes/README.md says: the Deployment
    // patched (token mounted, three args appended), plus each adapter's -kube-output.yaml.
    let output_ns = |a: &str| -> String {
        match a {
            "file" => "legacy",
            "kube" => "team-a",
            other => other,
        }
        .to_string()
    };
    let mut files = adapter_files.clone();
    files.extend(output_files.iter().cloned());
    let patched = manifest_objects(&files, |o| {
        if o["kind"] != "Deployment" {
            return;
        }
        let a = o["metadata"]["name"]
            .as_str()
            .and_then(|n| n.strip_prefix("adapter-"))
            .expect("adapter-<name>")
            .to_string();
        let pod = &mut o["spec"]["template"]["spec"];
        pod["automountServiceAccountToken"] = json!(true);
        let args = pod["containers"][0]["args"].as_array_mut().expect("args");
        args.push(json!("--output=both"));
        args.push(json!(format!("--output-namespaces={}", output_ns(&a))));
        args.push(json!(format!("--output-lease-namespace={NS}")));
    });
    problems.extend(differences(
        "manifests-values.yaml + manifests-kube-output-values.yaml",
        strip(helm.template(
            NS,
            &[&values, &ci("manifests-kube-output-values.yaml")],
            &[],
        )),
        patched,
    ));

    // 3. adapter-kube's RBAC in the watched cluster: all namespaces, then one namespace (the
    // namespaced file holds no ServiceAccount: it uses adapter-kube-rbac.yaml's), and nodes/pods.
    let cluster_wide = manifest_objects(&["adapter-kube-rbac.yaml".to_string()], |_| ());
    problems.extend(differences(
        "watchedCluster.rbac",
        strip(helm.template(NS, &[], &["watchedCluster.rbac.enabled=true"])),
        cluster_wide.clone(),
    ));
    let mut namespaced =
        manifest_objects(&["adapter-kube-rbac-namespaced.yaml".to_string()], |_| ());
    let (sa_key, sa) = cluster_wide
        .iter()
        .find(|(k, _)| k.1 == "ServiceAccount")
        .expect("ServiceAccount in adapter-kube-rbac.yaml");
    namespaced.insert(sa_key.clone(), sa.clone());
    namespaced.extend(manifest_objects(
        &["adapter-kube-rbac-nodes-pods.yaml".to_string()],
        |_| (),
    ));
    problems.extend(differences(
        "watchedCluster.rbac with namespaces and nodesAndPods",
        strip(helm.template(
            NS,
            &[],
            &[
                "watchedCluster.rbac.enabled=true",
                "watchedCluster.rbac.namespaces={team-a}",
                "watchedCluster.rbac.nodesAndPods=true",
            ],
        )),
        namespaced,
    ));
    assert!(
        problems.is_empty(),
        "the chart and deploy/kubernetes differ:\n{}",
        problems.join("\n")
    );
}

/// The YAML block NOTES.txt prints for istiod (from its `meshConfig:` line to the next blank
/// line), or `None` when it prints none.
fn notes_mesh_config(notes: &str) -> Option<Value> {
    let start = notes.find("\nmeshConfig:")? + 1;
    let block = notes[start..].split("\n\n").next().unwrap_or_default();
    Some(yaml_serde::from_str(block).unwrap_or_else(|e| panic!("NOTES.txt block: {e}\n{block}")))
}

/// A dry-run create with strict field validation (an unknown or duplicate field is an error).
fn strict_dry_run(kube: &KubeApiServer, obj: &Value) -> Result<(), String> {
    let path = format!("{}?dryRun=All&fieldValidation=Strict", collection_of(obj));
    let r = kube.request(ADMIN_TOKEN, "POST", &path, Some(obj));
    match r.status {
        200 | 201 | 409 => Ok(()),
        s => Err(format!("{s} {}", r.body["message"])),
    }
}

#[test]
#[ignore = "needs the real helm and kube-apiserver: tests/helm/build.sh target/helm, tests/go-peers/build.sh target (the README's test command builds them)"]
fn rendered_chart_on_the_api_server_and_notes_list_every_shard() {
    let helm = Helm::new();
    let kube = KubeApiServer::start();
    let kubeconfig = kube.kubeconfig().display().to_string();
    let chart_dir = chart().display().to_string();

    // The strict check catches a typo (else the passes below would prove nothing).
    let typo = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "typo", "namespace": "default"}, "dataa": {}});
    let err = strict_dry_run(&kube, &typo).expect_err("strict validation rejects `dataa`");
    assert!(err.contains("dataa"), "{err}");

    // Each values file into a release namespace of its own.
    let mut renders: Vec<(String, Vec<String>)> = EXPECT
        .iter()
        .map(|e| (format!("helm-{}", e.adapter), vec![ci(e.file)]))
        .collect();
    renders.push(("helm-manifests".into(), vec![ci("manifests-values.yaml")]));
    renders.push((
        "helm-manifests-output".into(),
        vec![
            ci("manifests-values.yaml"),
            ci("manifests-kube-output-values.yaml"),
        ],
    ));
    renders.push((
        "helm-watched".into(),
        vec![ci("watched-cluster-values.yaml")],
    ));
    let adapter_order = |name: &str| {
        ADAPTERS
            .iter()
            .position(|a| name == format!("adapter-{a}"))
            .unwrap_or(usize::MAX)
    };

    // NOTES.txt, as `helm install` prints it (helm template does not render it): a dry run
    // against this API server, which creates nothing; before anything is applied (helm refuses
    // to render over objects that exist but are not its release's).
    let mut notes_of = Vec::new();
    for (ns, values) in &renders {
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        let mut args = vec![
            "install",
            RELEASE,
            chart_dir.as_str(),
            "--namespace",
            ns.as_str(),
            "--kubeconfig",
            kubeconfig.as_str(),
            "--dry-run=client",
            "--output",
            "json",
        ];
        for v in &refs {
            args.extend(["--values", v]);
        }
        let release: Value = serde_json::from_str(&helm.ok(&args)).expect("release JSON");
        let manifest = documents(release["manifest"].as_str().expect("manifest"), "manifest");
        assert_eq!(
            by_key(manifest),
            by_key(helm.template(ns, &refs, &[])),
            "{values:?}: install renders what template renders"
        );
        notes_of.push(
            release["info"]["notes"]
                .as_str()
                .expect("NOTES.txt rendered")
                .to_string(),
        );
    }

    type Rule = (String, String, String, String);
    let rule =
        |g: &str, r: &str, v: &str, n: &str| -> Rule { (g.into(), r.into(), v.into(), n.into()) };
    for (i, (ns, values)) in renders.iter().enumerate() {
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        let objects = helm.template(ns, &refs, &[]);
        // The namespaces must exist first (the chart declares none): the release's, and those of
        // the output's and the watched cluster's Roles.
        kube.namespace(ns);
        for o in &objects {
            if let Some(other) = o["metadata"]["namespace"].as_str() {
                kube.namespace(other);
            }
        }
        for o in &objects {
            strict_dry_run(&kube, o).unwrap_or_else(|e| {
                panic!(
                    "{values:?}: {} {} rejected: {e}",
                    o["kind"], o["metadata"]["name"]
                )
            });
        }
        for o in &objects {
            let stored = kube.apply(&collection_of(o), o);
            assert_eq!(stored["metadata"]["name"], o["metadata"]["name"]);
            assert_eq!(
                stored["metadata"]["labels"], o["metadata"]["labels"],
                "{values:?}"
            );
        }

        // The output's RBAC, through the adapter's ServiceAccount token and the real authorizer:
        // exactly what the output needs, where the values put it (checked before a later
        // values file replaces the Roles of the same name in a shared output namespace).
        if let Some(e) = EXPECT.get(i).filter(|e| e.mode != "mcp") {
            let token = kube.service_account_token(ns, &format!("adapter-{}", e.adapter));
            let lease_ns = e.lease_namespace.unwrap_or(ns).to_string();
            let mut places: BTreeSet<String> =
                e.output_namespaces.iter().map(|s| s.to_string()).collect();
            places.extend([lease_ns.clone(), ns.clone(), "default".into()]);
            for place in places {
                let mut want = BTreeSet::new();
                if e.output_namespaces.contains(&place.as_str()) {
                    for verb in ["list", "patch", "create", "delete"] {
                        want.insert(rule("networking.istio.io", "serviceentries", verb, "*"));
                    }
                }
                if place == lease_ns {
                    want.insert(rule("coordination.k8s.io", "leases", "get", e.lease));
                    want.insert(rule("coordination.k8s.io", "leases", "update", e.lease));
                    want.insert(rule("coordination.k8s.io", "leases", "create", "*"));
                }
                assert_eq!(
                    kube.rules_in(&token, &place),
                    want,
                    "{}: rights in {place}",
                    e.file
                );
            }
        }

        let notes = notes_of[i].as_str();
        let mut services: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "Service").collect();
        services.sort_by_key(|s| adapter_order(s["metadata"]["name"].as_str().unwrap_or_default()));
        let mut want = vec!["k8s://".to_string()];
        for s in &services {
            let stored = kube
                .get(&format!(
                    "/api/v1/namespaces/{ns}/services/{}",
                    s["metadata"]["name"].as_str().unwrap_or_default()
                ))
                .expect("stored Service");
            for p in stored["spec"]["ports"].as_array().expect("ports") {
                want.push(format!(
                    "xds://{}.{ns}.svc:{}",
                    s["metadata"]["name"].as_str().unwrap_or_default(),
                    p["port"]
                ));
            }
        }
        // An adapter with --output=kube has no MCP source: NOTES.txt says so instead.
        for d in objects
            .iter()
            .filter(|o| o["kind"] == "Deployment")
            .filter(|d| args_of(d).contains(&"--output=kube".to_string()))
        {
            let name = d["metadata"]["name"].as_str().unwrap_or_default();
            assert!(
                notes
                    .lines()
                    .any(|l| l.contains(name) && l.contains("--output=kube")),
                "{values:?}: {name} not listed as --output=kube:\n{notes}"
            );
        }
        let block = notes_mesh_config(notes);
        if services.is_empty() {
            assert!(
                block.is_none(),
                "{values:?}: no MCP source, no configSources:\n{notes}"
            );
            continue;
        }
        let block = block.unwrap_or_else(|| panic!("{values:?}: no meshConfig block:\n{notes}"));
        let sources = block["meshConfig"]["configSources"]
            .as_array()
            .expect("configSources");
        let got: Vec<String> = sources
            .iter()
            .map(|s| s["address"].as_str().expect("address").to_string())
            .collect();
        assert_eq!(got, want, "{values:?}: NOTES.txt's configSources:\n{notes}");
        for (s, addr) in sources.iter().zip(&got).skip(1) {
            let tls = addr.contains("adapter-eureka") && values[0].ends_with("eureka-values.yaml");
            if tls {
                assert_eq!(
                    s["tlsSettings"],
                    json!({"mode": "SIMPLE", "caCertificates": "/etc/istio/mcp-adapters/ca.crt"}),
                    "{addr}"
                );
            } else {
                assert!(s.get("tlsSettings").is_none(), "{addr}: {s}");
            }
        }
        if ns == "helm-manifests" {
            // The manifests' values print exactly deploy/kubernetes/istiod-meshconfig.yaml's
            // fragment, for the manifests' namespace.
            let fragment: Value = yaml_serde::from_str(
                &std::fs::read_to_string(manifests_dir().join("istiod-meshconfig.yaml"))
                    .expect("istiod-meshconfig.yaml"),
            )
            .expect("YAML");
            let in_ns = serde_json::to_string(&block)
                .expect("json")
                .replace(".helm-manifests.svc:", &format!(".{NS}.svc:"));
            assert_eq!(
                serde_json::from_str::<Value>(&in_ns).expect("json"),
                fragment,
                "NOTES.txt vs istiod-meshconfig.yaml"
            );
        }
    }

    // A real install, upgrade and uninstall through helm's own client.
    let ns = "helm-release";
    kube.namespace(ns);
    let values = ci("manifests-values.yaml");
    let base = ["--namespace", ns, "--kubeconfig", kubeconfig.as_str()];
    let mut install = vec![
        "install",
        RELEASE,
        chart_dir.as_str(),
        "--values",
        values.as_str(),
    ];
    install.extend(base);
    helm.ok(&install);
    let mut status = vec!["status", RELEASE, "--output", "json"];
    status.extend(base);
    let release: Value = serde_json::from_str(&helm.ok(&status)).expect("status JSON");
    assert_eq!(release["info"]["status"], "deployed", "{release}");
    assert_eq!(release["version"], 1);
    for a in ADAPTERS {
        let d = kube
            .get(&format!(
                "/apis/apps/v1/namespaces/{ns}/deployments/adapter-{a}"
            ))
            .unwrap_or_else(|| panic!("helm install: no adapter-{a}"));
        assert_eq!(
            d["metadata"]["annotations"]["meta.helm.sh/release-name"],
            RELEASE
        );
    }
    let mut notes = vec!["get", "notes", RELEASE];
    notes.extend(base);
    let installed = helm.ok(&notes);
    assert_eq!(
        notes_mesh_config(&installed).expect("meshConfig")["meshConfig"]["configSources"]
            .as_array()
            .map(Vec::len),
        Some(1 + 6 * 4),
        "{installed}"
    );
    // Two shards instead of four: the Services, the args and NOTES.txt follow.
    let mut upgrade = vec![
        "upgrade",
        RELEASE,
        chart_dir.as_str(),
        "--values",
        values.as_str(),
        "--set",
        "defaults.shards=2",
    ];
    upgrade.extend(base);
    helm.ok(&upgrade);
    for a in ADAPTERS {
        let s = kube
            .get(&format!("/api/v1/namespaces/{ns}/services/adapter-{a}"))
            .expect("Service");
        let ports: Vec<u64> = s["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .filter_map(|p| p["port"].as_u64())
            .collect();
        assert_eq!(ports, [15051, 15052], "adapter-{a} after the upgrade");
        let d = kube
            .get(&format!(
                "/apis/apps/v1/namespaces/{ns}/deployments/adapter-{a}"
            ))
            .expect("Deployment");
        assert!(
            args_of(&d).contains(&"--shards=2".to_string()),
            "adapter-{a}"
        );
    }
    let upgraded = helm.ok(&notes);
    let sources =
        notes_mesh_config(&upgraded).expect("meshConfig")["meshConfig"]["configSources"].clone();
    assert_eq!(
        sources.as_array().map(Vec::len),
        Some(1 + 6 * 2),
        "{upgraded}"
    );
    assert_eq!(
        sources[2]["address"],
        format!("xds://adapter-file.{ns}.svc:15052")
    );
    let mut uninstall = vec!["uninstall", RELEASE];
    uninstall.extend(base);
    helm.ok(&uninstall);
    for a in ADAPTERS {
        assert!(
            kube.get(&format!(
                "/apis/apps/v1/namespaces/{ns}/deployments/adapter-{a}"
            ))
            .is_none(),
            "adapter-{a} left after helm uninstall"
        );
        assert!(kube
            .get(&format!("/api/v1/namespaces/{ns}/services/adapter-{a}"))
            .is_none());
    }
}
