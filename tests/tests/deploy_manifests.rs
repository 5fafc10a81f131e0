//! The Kubernetes manifests in deploy/kubernetes, applied unchanged to a real kube-apiserver
//! (1.35 with an embedded etcd, from tests/kube-apiserver/build.sh): the API server validates
//! every field of every object. No kubelet, scheduler or controller manager runs, so no pod is
//! ever created: what is checked is that the objects are accepted and stored as written (replicas,
//! probes, security context, Service port, NetworkPolicy peers), not that the pods start.
//!
//! The Kubernetes output's RBAC (`adapter-<name>-kube-output.yaml`) is checked with the real RBAC
//! authorizer: through a token of each adapter's ServiceAccount (TokenRequest), the adapter can do
//! exactly what `--output kube` does (server-side apply, list, delete ServiceEntries in its output
//! namespace; get, create, update its Lease) and is refused everything else.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use e2e::istiod::apply_istio_crds;
use e2e::kube::{collection_of, KubeApiServer, Response, ADMIN_TOKEN};

const NS: &str = "mcp-adapters";
const ADAPTERS: [&str; 6] = ["file", "consul", "zookeeper", "eureka", "nacos", "kube"];
const MCP_PORT: u64 = 15051;
/// `--output-lease-namespace` in deploy/kubernetes/README.md ("Kubernetes output").
const LEASE_NS: &str = NS;
const JSON: &str = "application/json";
const NETWORKING: &str = "/apis/networking.istio.io/v1";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/mcp-adapters/leases";

/// The namespace adapter `a`'s ServiceEntries land in with the shipped manifests, which its
/// `adapter-<a>-kube-output.yaml` grants and `--output-namespaces` names. Checked against the
/// manifests in the test: no Deployment sets `--namespace`, so the registry's default applies.
fn output_namespace(a: &str) -> &'static str {
    match a {
        // The example inventory's `namespace: legacy` (asserted below).
        "file" => "legacy",
        // adapter-kube keeps each watched Service's namespace: the file's example one.
        "kube" => "team-a",
        "consul" => "consul",
        "zookeeper" => "zookeeper",
        "eureka" => "eureka",
        "nacos" => "nacos",
        other => panic!("no output namespace for adapter {other}"),
    }
}

/// The args deploy/kubernetes/README.md ("Kubernetes output") adds to adapter `a`'s Deployment.
fn output_args(a: &str) -> Vec<String> {
    vec![
        "--output=both".to_string(),
        format!("--output-namespaces={}", output_namespace(a)),
        format!("--output-lease-namespace={LEASE_NS}"),
    ]
}

/// The README's `kubectl patch deployment adapter-<a> --type=json` document.
fn output_patch(a: &str) -> Value {
    let mut ops = vec![serde_json::json!({"op": "replace",
        "path": "/spec/template/spec/automountServiceAccountToken", "value": true})];
    for arg in output_args(a) {
        ops.push(serde_json::json!({"op": "add",
            "path": "/spec/template/spec/containers/0/args/-", "value": arg}));
    }
    Value::Array(ops)
}

/// One request with the content type and Accept given: `KubeApiServer::request` sends JSON only,
/// and server-side apply is `application/apply-patch+yaml`. Through curl, as the harness does.
fn send(
    kube: &KubeApiServer,
    token: &str,
    method: &str,
    path: &str,
    content_type: &str,
    accept: &str,
    body: Option<&Value>,
) -> Response {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new("curl");
    cmd.args(["--silent", "--show-error", "--max-time", "30"])
        .arg("--cacert")
        .arg(kube.ca())
        .arg("--header")
        .arg(format!("Authorization: Bearer {token}"))
        .arg("--header")
        .arg(format!("Accept: {accept}"))
        .args(["--request", method])
        .args(["--write-out", "\n%{http_code}"]);
    if body.is_some() {
        cmd.arg("--header")
            .arg(format!("Content-Type: {content_type}"))
            .args(["--data-binary", "@-"]);
    }
    let mut child = cmd
        .arg(format!("{}{path}", kube.url()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run curl");
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(b) = body {
        stdin
            .write_all(b.to_string().as_bytes())
            .expect("curl stdin");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("curl");
    assert!(
        out.status.success(),
        "curl {method} {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Response {
        status: code.trim().parse().expect("HTTP status"),
        body: serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string())),
    }
}

/// A JSON request with `token` (what the adapter's client sends for everything but the apply).
fn call(
    kube: &KubeApiServer,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Response {
    send(kube, token, method, path, JSON, JSON, body)
}

/// A ServiceEntry as the output applies it: the ownership labels, one static endpoint.
fn service_entry(a: &str, ns: &str, name: &str, ip: &str) -> Value {
    serde_json::json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": ns, "labels": {
            "app.kubernetes.io/managed-by": "mcp-adapter",
            "mcp-adapter/registry": a,
            "mcp-adapter/source": a,
        }},
        "spec": {
            "hosts": [format!("{name}.{ns}.example")],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}],
            "endpoints": [{"address": ip}],
        },
    })
}

fn service_entries(ns: &str) -> String {
    format!("{NETWORKING}/namespaces/{ns}/serviceentries")
}

/// Server-side apply of `obj` with field manager `mcp-adapter`, as the output sends it.
fn server_side_apply(kube: &KubeApiServer, token: &str, obj: &Value, force: bool) -> Response {
    let ns = obj["metadata"]["namespace"].as_str().expect("namespace");
    let name = obj["metadata"]["name"].as_str().expect("name");
    let force = if force { "&force=true" } else { "" };
    send(
        kube,
        token,
        "PATCH",
        &format!(
            "{}/{name}?fieldManager=mcp-adapter{force}",
            service_entries(ns)
        ),
        "application/apply-patch+yaml",
        JSON,
        Some(obj),
    )
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// Every `*.yaml` in deploy/kubernetes, sorted.
fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("read deploy/kubernetes")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

fn file_name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or_default()
}

fn get(kube: &KubeApiServer, kind_path: &str, name: &str) -> Value {
    let path = format!("{kind_path}/{name}");
    kube.get(&path)
        .unwrap_or_else(|| panic!("{path} was not stored"))
}

/// The documents of a YAML file.
fn documents(path: &Path) -> Vec<Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(path).expect("read manifest");
    yaml_serde::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// A dry-run create with strict field validation: an unknown or duplicate field (a typo such as
/// `readinesProbe`) is an error, where a plain create (what apply_manifest sends) only warns and
/// drops it. `Err` with the server's message when rejected; an object that exists already (409)
/// passed decoding, which is where strict validation happens.
fn strict_dry_run(kube: &KubeApiServer, obj: &Value) -> Result<(), String> {
    let path = format!("{}?dryRun=All&fieldValidation=Strict", collection_of(obj));
    let r = kube.request(ADMIN_TOKEN, "POST", &path, Some(obj));
    match r.status {
        200 | 201 | 409 => Ok(()),
        s => Err(format!("{s} {}", r.body["message"])),
    }
}

/// The `--shards=N` of adapter `a`'s Deployment (1 without the flag), read from its file.
fn shards_of(a: &str) -> u64 {
    let path = dir().join(format!("adapter-{a}.yaml"));
    let deployment = documents(&path)
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap_or_else(|| panic!("{}: no Deployment", path.display()));
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--shards="))
        .map_or(1, |n| n.parse().expect("--shards=N"))
}

/// istiod-meshconfig.yaml is a Helm values fragment (no apiVersion/kind): `k8s://` first, then
/// every shard of every adapter's Service (one source per port of its `--shards`).
fn check_meshconfig(path: &Path) {
    let text = std::fs::read_to_string(path).expect("read istiod-meshconfig.yaml");
    let values: Value = yaml_serde::from_str(&text).expect("istiod-meshconfig.yaml is YAML");
    let sources: Vec<&str> = values["meshConfig"]["configSources"]
        .as_array()
        .expect("meshConfig.configSources is a list")
        .iter()
        .map(|s| s["address"].as_str().expect("configSources[].address"))
        .collect();
    assert_eq!(
        sources.first(),
        Some(&"k8s://"),
        "k8s:// first: {sources:?}"
    );
    let mut listed = 1;
    for a in ADAPTERS {
        for shard in 0..shards_of(a) {
            let want = format!("xds://adapter-{a}.{NS}.svc:{}", MCP_PORT + shard);
            let at = sources
                .iter()
                .position(|s| *s == want)
                .unwrap_or_else(|| panic!("{want} missing from configSources {sources:?}"));
            assert!(at > 0, "{want} before k8s://");
            listed += 1;
        }
    }
    assert_eq!(
        sources.len(),
        listed,
        "only k8s:// and the adapters' shards: {sources:?}"
    );
}

#[test]
#[ignore = "needs kube-apiserver and Istio's CRDs: tests/go-peers/build.sh target (the README's test command builds them)"]
fn deploy_manifests_are_accepted_by_the_api_server_and_stored_as_meant() {
    let files = manifests();
    for a in ADAPTERS {
        assert!(
            files
                .iter()
                .any(|p| file_name(p) == format!("adapter-{a}.yaml")),
            "deploy/kubernetes/adapter-{a}.yaml missing"
        );
        assert!(
            files
                .iter()
                .any(|p| file_name(p) == format!("adapter-{a}-kube-output.yaml")),
            "deploy/kubernetes/adapter-{a}-kube-output.yaml missing"
        );
    }

    let kube = KubeApiServer::start();
    // The strict check itself catches a typo (else the pass below would prove nothing).
    let typo = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "typo", "namespace": "default"}, "dataa": {}});
    let err = strict_dry_run(&kube, &typo).expect_err("strict validation rejects `dataa`");
    assert!(err.contains("dataa"), "{err}");

    let namespace = dir().join("namespace.yaml");
    for obj in documents(&namespace) {
        strict_dry_run(&kube, &obj).unwrap_or_else(|e| panic!("namespace.yaml rejected: {e}"));
    }
    let stored = kube.apply_manifest(&namespace, |_| ());
    assert_eq!(stored[0]["metadata"]["name"], NS);

    let mut kinds_seen = Vec::new();
    for path in &files {
        let name = file_name(path);
        if name == "namespace.yaml" {
            continue;
        }
        if name == "istiod-meshconfig.yaml" {
            check_meshconfig(path);
            continue;
        }
        if name == "adapter-kube-rbac-namespaced.yaml" {
            // The namespaced RBAC example is written for namespace team-a (one copy per watched
            // namespace): it has to exist first.
            kube.namespace("team-a");
        }
        let output_of = name
            .strip_prefix("adapter-")
            .and_then(|n| n.strip_suffix("-kube-output.yaml"));
        if let Some(a) = output_of {
            // The output namespace is not declared in the file (deleting the file must not delete
            // it): the README says to create it first, because a Role in a missing namespace is
            // refused. Shown here before it is created.
            let ns = output_namespace(a);
            let docs = documents(path);
            assert!(
                docs.iter().all(|d| d["kind"] != "Namespace"),
                "{name}: declares a Namespace, which `kubectl delete -f` would delete"
            );
            assert!(
                kube.get(&format!("/api/v1/namespaces/{ns}")).is_none(),
                "{name}: namespace {ns} exists already"
            );
            let role = docs
                .iter()
                .find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == ns)
                .unwrap_or_else(|| panic!("{name}: no Role in namespace {ns}"));
            let err = strict_dry_run(&kube, role)
                .expect_err("a Role in a namespace that does not exist is refused");
            assert!(err.starts_with("404"), "{name}: {err}");
            kube.namespace(ns);
        }
        for obj in documents(path) {
            if let Err(e) = strict_dry_run(&kube, &obj) {
                panic!(
                    "{name}: {} {} rejected: {e}",
                    obj["kind"], obj["metadata"]["name"]
                );
            }
        }
        for obj in kube.apply_manifest(path, |_| ()) {
            // apply_manifest stored each at collection_of(obj): read it back from there.
            let kind = obj["kind"].as_str().unwrap_or_default().to_string();
            let stored_name = obj["metadata"]["name"].as_str().unwrap_or_default();
            assert!(
                kube.get(&format!("{}/{stored_name}", collection_of(&obj)))
                    .is_some(),
                "{name}: {kind} {stored_name} not readable after apply"
            );
            kinds_seen.push(format!("{name}: {kind}/{stored_name}"));
        }
    }
    eprintln!("applied:\n  {}", kinds_seen.join("\n  "));

    let deployments = format!("/apis/apps/v1/namespaces/{NS}/deployments");
    let services = format!("/api/v1/namespaces/{NS}/services");
    let policies = format!("/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies");
    let pdbs = format!("/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets");
    for a in ADAPTERS {
        let name = format!("adapter-{a}");
        let selector = serde_json::json!({"app.kubernetes.io/name": name});

        let d = get(&kube, &deployments, &name);
        let spec = &d["spec"];
        assert_eq!(spec["replicas"], 2, "{name}: replicas");
        assert_eq!(
            spec["selector"]["matchLabels"], selector,
            "{name}: selector"
        );
        let pod = &spec["template"]["spec"];
        assert_eq!(
            pod["securityContext"]["runAsNonRoot"], true,
            "{name}: {pod}"
        );
        // Its own ServiceAccount (what adapter-<a>-kube-output.yaml binds), without a token:
        // with --output=mcp it never calls this cluster's API server.
        assert_eq!(
            pod["serviceAccountName"], name,
            "{name}: serviceAccountName"
        );
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        let sa = get(
            &kube,
            &format!("/api/v1/namespaces/{NS}/serviceaccounts"),
            &name,
        );
        assert_eq!(sa["automountServiceAccountToken"], false, "{name}: {sa}");
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "{name}: one container");
        let c = &containers[0];
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        // Both probes on the admin port, which --admin-listen puts on the pod network.
        let admin_port = c["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == "http-admin")
            .unwrap_or_else(|| panic!("{name}: no http-admin port"))["containerPort"]
            .as_u64()
            .expect("containerPort");
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(c[probe]["httpGet"]["port"], "http-admin", "{name}: {probe}");
        }
        let args: Vec<&str> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            args.contains(&"--listen=0.0.0.0:15051"),
            "{name}: args {args:?}"
        );
        // The default output: MCP only (the README's patch adds the Kubernetes output), and the
        // registry's default --namespace, which output_namespace() and the kube-output file
        // count on.
        assert!(
            !args.iter().any(|arg| arg.starts_with("--output")
                || arg.starts_with("--namespace=")
                || *arg == "--namespace"),
            "{name}: args {args:?}"
        );
        assert!(
            c["env"].as_array().into_iter().flatten().all(|e| {
                let n = e["name"].as_str().unwrap_or_default();
                n != "MCP_NAMESPACE" && !n.starts_with("MCP_OUTPUT")
            }),
            "{name}: env {}",
            c["env"]
        );
        // Registry credentials never as literal values in the Deployment (readable by anyone
        // who can read Deployments, and in every `kubectl get -o yaml`): a password or token
        // comes from a Secret, by secretKeyRef or as a mounted file (`*_FILE`).
        for e in c["env"].as_array().into_iter().flatten() {
            let n = e["name"].as_str().unwrap_or_default();
            if n.contains("PASSWORD") || n.ends_with("_TOKEN") || n.ends_with("_DIGEST") {
                assert!(
                    e.get("value").is_none() && e["valueFrom"]["secretKeyRef"].is_object(),
                    "{name}: {n} must come from a Secret: {e}"
                );
            }
            // A credential file (CONSUL_HTTP_TOKEN_FILE, ZK_DIGEST_FILE, NACOS_AUTH_FILE) is a key
            // of a Secret stored here, mounted read-only where the variable points.
            if n.ends_with("_FILE") && n != "MCP_STATE_FILE" {
                let file = Path::new(e["value"].as_str().unwrap_or_default());
                let mount = c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["mountPath"].as_str().map(Path::new) == file.parent())
                    .unwrap_or_else(|| panic!("{name}: {n}={file:?} is on no volume mount"));
                assert_eq!(mount["readOnly"], true, "{name}: {mount}");
                let volume = pod["volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|v| v["name"] == mount["name"])
                    .unwrap_or_else(|| panic!("{name}: no volume {}", mount["name"]));
                let secret_name = volume["secret"]["secretName"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: {n} is not on a Secret volume: {volume}"));
                let key = file
                    .file_name()
                    .and_then(|f| f.to_str())
                    .unwrap_or_default();
                let secret = get(
                    &kube,
                    &format!("/api/v1/namespaces/{NS}/secrets"),
                    secret_name,
                );
                assert!(
                    secret["data"][key].is_string(),
                    "{name}: {n} reads key {key} of Secret {secret_name}, which has none"
                );
            }
        }
        // `--shards`: one gRPC port per shard from 15051 up, named, and the admin port not
        // among them (the adapter refuses to start otherwise).
        let shards = shards_of(a);
        let mcp_ports: Vec<u64> = (0..shards).map(|i| MCP_PORT + i).collect();
        assert!(
            !mcp_ports.contains(&admin_port),
            "{name}: admin port {admin_port} among the shard ports {mcp_ports:?}"
        );
        for (i, port) in mcp_ports.iter().enumerate() {
            let named = c["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .find(|p| p["name"] == format!("grpc-mcp-{i}"))
                .unwrap_or_else(|| panic!("{name}: no container port grpc-mcp-{i}"));
            assert_eq!(named["containerPort"], *port, "{name}: grpc-mcp-{i}");
        }
        assert!(
            args.contains(&format!("--admin-listen=0.0.0.0:{admin_port}").as_str()),
            "{name}: args {args:?}"
        );
        assert_eq!(
            c["securityContext"]["readOnlyRootFilesystem"], true,
            "{name}"
        );
        assert_eq!(
            c["securityContext"]["allowPrivilegeEscalation"], false,
            "{name}"
        );
        for r in ["requests", "limits"] {
            assert!(
                c["resources"][r]["memory"].is_string() && c["resources"][r]["cpu"].is_string(),
                "{name}: resources.{r}: {}",
                c["resources"]
            );
        }
        // A state file, if any, is on a per-pod volume: never shared between the replicas.
        let state_dir = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "MCP_STATE_FILE")
            .and_then(|e| e["value"].as_str())
            .map(|f| Path::new(f).parent().expect("state dir").to_owned());
        if let Some(state_dir) = state_dir {
            let mount = c["volumeMounts"]
                .as_array()
                .expect("volumeMounts")
                .iter()
                .find(|m| m["mountPath"].as_str() == state_dir.to_str())
                .unwrap_or_else(|| panic!("{name}: state dir {state_dir:?} not mounted"));
            let volume = pod["volumes"]
                .as_array()
                .expect("volumes")
                .iter()
                .find(|v| v["name"] == mount["name"])
                .expect("state volume");
            assert!(
                volume["emptyDir"].is_object(),
                "{name}: state volume must be per pod: {volume}"
            );
        }

        let s = get(&kube, &services, &name);
        assert_eq!(s["spec"]["type"], "ClusterIP", "{name}");
        assert_eq!(s["spec"]["selector"], selector, "{name}: service selector");
        let ports = s["spec"]["ports"].as_array().expect("service ports");
        assert_eq!(
            ports.len(),
            mcp_ports.len(),
            "{name}: only the MCP ports, one per shard: {ports:?}"
        );
        for (i, (p, want)) in ports.iter().zip(&mcp_ports).enumerate() {
            assert_eq!(p["port"], *want, "{name}: {p}");
            assert_eq!(p["name"], format!("grpc-mcp-{i}"), "{name}: {p}");
            assert_eq!(p["targetPort"], format!("grpc-mcp-{i}"), "{name}: {p}");
            assert_eq!(p["appProtocol"], "grpc", "{name}: {p}");
        }

        let np = get(&kube, &policies, &name);
        let spec = &np["spec"];
        assert_eq!(
            spec["podSelector"]["matchLabels"], selector,
            "{name}: policy"
        );
        let rules = spec["ingress"].as_array().expect("ingress rules");
        let mcp_rules: Vec<&Value> = rules
            .iter()
            .filter(|r| {
                r["ports"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["port"] == MCP_PORT))
            })
            .collect();
        assert_eq!(mcp_rules.len(), 1, "{name}: one rule for 15051: {rules:?}");
        let mcp_port_rule = mcp_rules[0]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["port"] == MCP_PORT)
            .expect("the 15051 entry");
        let last = mcp_ports.last().copied().unwrap_or(MCP_PORT);
        assert_eq!(
            mcp_port_rule["endPort"].as_u64().unwrap_or(MCP_PORT),
            last,
            "{name}: the rule covers every shard port: {mcp_port_rule}"
        );
        let peers = mcp_rules[0]["from"].as_array().expect("from");
        assert_eq!(peers.len(), 1, "{name}: istiod only: {peers:?}");
        assert_eq!(
            peers[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "istio-system",
            "{name}: {peers:?}"
        );
        assert_eq!(
            peers[0]["podSelector"]["matchLabels"]["app"], "istiod",
            "{name}: {peers:?}"
        );
        assert!(
            rules.iter().any(|r| r["ports"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["port"] == admin_port))),
            "{name}: admin port {admin_port} not allowed: {rules:?}"
        );

        let pdb = get(&kube, &pdbs, &name);
        assert_eq!(pdb["spec"]["minAvailable"], 1, "{name}: pdb");
    }

    // Credentials: a Secret (or, for adapter-file, the ConfigMap of files) per adapter.
    let secrets = format!("/api/v1/namespaces/{NS}/secrets");
    for s in [
        "adapter-consul",
        "adapter-zookeeper",
        "adapter-eureka",
        "adapter-nacos",
        "adapter-kube-remote-kubeconfig",
    ] {
        get(&kube, &secrets, s);
    }
    let cm = get(
        &kube,
        &format!("/api/v1/namespaces/{NS}/configmaps"),
        "adapter-file-inventory",
    );
    let inventory: Value = yaml_serde::from_str(
        cm["data"]["inventory.yaml"]
            .as_str()
            .expect("inventory.yaml key"),
    )
    .expect("the example inventory is YAML");
    assert_eq!(inventory["kind"], "Inventory");
    // adapter-file's ServiceEntries go to the inventory's namespace: its output namespace.
    assert_eq!(inventory["namespace"], output_namespace("file"));
    let kubeconfig = get(&kube, &secrets, "adapter-kube-remote-kubeconfig");
    assert!(
        kubeconfig["data"]["kubeconfig"].is_string(),
        "kubeconfig key: {kubeconfig}"
    );

    // The remote side of adapter-kube (its RBAC files) was applied above too.
    get(
        &kube,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "mcp-adapter-kube",
    );

    check_kube_output(&kube);
}

/// The Lease adapter-`a`'s output holds: `mcp-adapter-<source name>`, whose default is the
/// registry's name (`kubernetes` for adapter-kube).
fn lease_of(a: &str) -> String {
    let source = if a == "kube" { "kubernetes" } else { a };
    format!("mcp-adapter-{source}")
}

/// The Kubernetes output, turned on as deploy/kubernetes/README.md says, against the real RBAC
/// authorizer: each adapter's ServiceAccount can do what the output does in its own namespace and
/// Lease, and nothing else.
fn check_kube_output(kube: &KubeApiServer) {
    apply_istio_crds(kube);

    // The README's patch is accepted (strictly) by every Deployment: the args appended, the
    // token mounted, the ServiceAccount the kube-output file binds.
    let deployments = format!("/apis/apps/v1/namespaces/{NS}/deployments");
    for a in ADAPTERS {
        let path = format!("{deployments}/adapter-{a}");
        let before = get(kube, &deployments, &format!("adapter-{a}"));
        let r = send(
            kube,
            ADMIN_TOKEN,
            "PATCH",
            &format!("{path}?fieldValidation=Strict"),
            "application/json-patch+json",
            JSON,
            Some(&output_patch(a)),
        );
        assert_eq!(r.status, 200, "adapter-{a}: the README's patch: {}", r.body);
        let pod = &r.body["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], format!("adapter-{a}"));
        assert_eq!(pod["automountServiceAccountToken"], true, "adapter-{a}");
        let mut want = before["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .clone();
        want.extend(output_args(a).into_iter().map(Value::String));
        assert_eq!(
            pod["containers"][0]["args"],
            Value::Array(want),
            "adapter-{a}: args"
        );
    }

    // A real token of each adapter's ServiceAccount: the RBAC authorizer sees
    // system:serviceaccount:mcp-adapters:adapter-<a> in system:serviceaccounts(:mcp-adapters).
    let tokens: Vec<(&str, String)> = ADAPTERS
        .iter()
        .map(|a| (*a, kube.service_account_token(NS, &format!("adapter-{a}"))))
        .collect();
    let elsewhere = |a: &str| -> Vec<&'static str> {
        let mut ns: Vec<&str> = ADAPTERS
            .iter()
            .filter(|b| **b != a)
            .map(|b| output_namespace(b))
            .collect();
        ns.extend(["default", NS]);
        ns
    };

    // Somebody else's ServiceEntry in every namespace, for the refusals below.
    let mut namespaces: Vec<&str> = ADAPTERS.iter().map(|a| output_namespace(a)).collect();
    namespaces.extend(["default", NS]);
    for ns in &namespaces {
        let mut obj = service_entry("user", ns, "by-hand", "10.9.9.9");
        obj["metadata"]["labels"] = serde_json::json!({"team": "ops"});
        kube.apply(&service_entries(ns), &obj);
    }

    // Allowed: exactly what the output does.
    for (a, token) in &tokens {
        let ns = output_namespace(a);
        let collection = service_entries(ns);

        // Server-side apply that creates (patch + create), then one that changes the object
        // (patch alone), forced as the output forces on its own objects.
        let created = server_side_apply(
            kube,
            token,
            &service_entry(a, ns, "probe", "10.0.0.1"),
            false,
        );
        assert_eq!(
            created.status, 201,
            "adapter-{a}: apply (create) in {ns}: {}",
            created.body
        );
        let changed = server_side_apply(
            kube,
            token,
            &service_entry(a, ns, "probe", "10.0.0.2"),
            true,
        );
        assert_eq!(
            changed.status, 200,
            "adapter-{a}: apply (change) in {ns}: {}",
            changed.body
        );
        assert_eq!(
            changed.body["spec"]["endpoints"][0]["address"], "10.0.0.2",
            "adapter-{a}"
        );
        let managers: Vec<&str> = changed.body["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["manager"].as_str())
            .collect();
        assert_eq!(managers, ["mcp-adapter"], "adapter-{a}: field managers");

        // The metadata-only list the output sends (PartialObjectMetadataList).
        let listed = send(
            kube,
            token,
            "GET",
            &format!("{collection}?limit=500"),
            JSON,
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            None,
        );
        assert_eq!(
            listed.status, 200,
            "adapter-{a}: list in {ns}: {}",
            listed.body
        );
        assert_eq!(
            listed.body["kind"], "PartialObjectMetadataList",
            "adapter-{a}"
        );
        let mut names: Vec<&str> = listed.body["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .collect();
        names.sort_unstable();
        assert_eq!(names, ["by-hand", "probe"], "adapter-{a}: listed in {ns}");

        // Delete with a uid precondition, as the output deletes what left the set.
        let uid = created.body["metadata"]["uid"].clone();
        let options = serde_json::json!({"apiVersion": "v1", "kind": "DeleteOptions",
            "preconditions": {"uid": uid}});
        let deleted = call(
            kube,
            token,
            "DELETE",
            &format!("{collection}/probe"),
            Some(&options),
        );
        assert_eq!(
            deleted.status, 200,
            "adapter-{a}: delete in {ns}: {}",
            deleted.body
        );

        // Its Lease: absent (404, not 403), created, read, renewed (a compare-and-swap on the
        // resourceVersion).
        let lease_name = lease_of(a);
        let lease_path = format!("{LEASES}/{lease_name}");
        let r = call(kube, token, "GET", &lease_path, None);
        assert_eq!(
            r.status, 404,
            "adapter-{a}: get its Lease before it exists: {}",
            r.body
        );
        let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name, "namespace": LEASE_NS},
            "spec": {"holderIdentity": format!("adapter-{a}-0"), "leaseDurationSeconds": 15,
                     "leaseTransitions": 0}});
        let r = call(kube, token, "POST", LEASES, Some(&lease));
        assert_eq!(r.status, 201, "adapter-{a}: create its Lease: {}", r.body);
        let r = call(kube, token, "GET", &lease_path, None);
        assert_eq!(r.status, 200, "adapter-{a}: get its Lease: {}", r.body);
        let mut renewed = r.body.clone();
        renewed["spec"]["holderIdentity"] = Value::String(format!("adapter-{a}-1"));
        renewed["spec"]["leaseTransitions"] = 1.into();
        let r = call(kube, token, "PUT", &lease_path, Some(&renewed));
        assert_eq!(r.status, 200, "adapter-{a}: update its Lease: {}", r.body);
        let stale = call(kube, token, "PUT", &lease_path, Some(&renewed));
        assert_eq!(
            stale.status, 409,
            "adapter-{a}: a stale update conflicts: {}",
            stale.body
        );
    }

    // Refused (403): ServiceEntries elsewhere, other verbs and resources, other Leases.
    for (a, token) in &tokens {
        let ns = output_namespace(a);
        let refused = |method: &str, path: &str, body: Option<&Value>| {
            let r = call(kube, token, method, path, body);
            assert_eq!(
                r.status, 403,
                "adapter-{a}: {method} {path} allowed: {}",
                r.body
            );
        };
        for other in elsewhere(a) {
            let r = server_side_apply(
                kube,
                token,
                &service_entry(a, other, "probe", "10.0.0.1"),
                false,
            );
            assert_eq!(r.status, 403, "adapter-{a}: apply in {other}: {}", r.body);
            let r = server_side_apply(
                kube,
                token,
                &service_entry(a, other, "by-hand", "10.0.0.1"),
                true,
            );
            assert_eq!(
                r.status, 403,
                "adapter-{a}: forced apply in {other}: {}",
                r.body
            );
            refused("GET", &service_entries(other), None);
            refused(
                "DELETE",
                &format!("{}/by-hand", service_entries(other)),
                None,
            );
        }
        refused("GET", &format!("{NETWORKING}/serviceentries"), None);
        // In its own namespace, only list, patch, create and delete.
        let own = service_entries(ns);
        refused("GET", &format!("{own}/by-hand"), None);
        refused("GET", &format!("{own}?watch=true&timeoutSeconds=1"), None);
        refused("DELETE", &own, None);
        let by_hand = kube.get(&format!("{own}/by-hand")).expect("by-hand");
        refused("PUT", &format!("{own}/by-hand"), Some(&by_hand));
        // (A plain POST is allowed too: it is a create, which server-side apply needs.)
        // Other resources, in its namespace and its own.
        for where_ in [ns, NS] {
            refused(
                "GET",
                &format!("/api/v1/namespaces/{where_}/services"),
                None,
            );
            refused("GET", &format!("/api/v1/namespaces/{where_}/secrets"), None);
            refused(
                "GET",
                &format!("/api/v1/namespaces/{where_}/configmaps"),
                None,
            );
            refused(
                "GET",
                &format!("{NETWORKING}/namespaces/{where_}/destinationrules"),
                None,
            );
            refused(
                "GET",
                &format!("{NETWORKING}/namespaces/{where_}/workloadentries"),
                None,
            );
        }
        refused(
            "GET",
            &format!("/api/v1/namespaces/{NS}/secrets/adapter-{a}"),
            None,
        );
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": ns}});
        refused(
            "POST",
            &format!("/api/v1/namespaces/{ns}/configmaps"),
            Some(&cm),
        );
        // Leases: no list or watch, no delete of its own, nothing on another adapter's.
        refused("GET", LEASES, None);
        refused("DELETE", &format!("{LEASES}/{}", lease_of(a)), None);
        for b in ADAPTERS.iter().filter(|b| *b != a) {
            let path = format!("{LEASES}/{}", lease_of(b));
            refused("GET", &path, None);
            let mut theirs = kube.get(&path).expect("the other adapter's Lease");
            theirs["spec"]["holderIdentity"] = Value::String(format!("adapter-{a}-0"));
            refused("PUT", &path, Some(&theirs));
            refused("DELETE", &path, None);
        }
        refused(
            "GET",
            &format!(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{}",
                lease_of(a)
            ),
            None,
        );
    }

    // And nothing more: what the RBAC authorizer itself says each may do, namespace by namespace.
    for (a, token) in &tokens {
        let rule = |group: &str, resource: &str, verb: &str, name: &str| {
            (
                group.to_string(),
                resource.to_string(),
                verb.to_string(),
                name.to_string(),
            )
        };
        for ns in namespaces
            .iter()
            .copied()
            .chain(["kube-system", "istio-system"])
        {
            let mut want = BTreeSet::new();
            if ns == output_namespace(a) {
                for verb in ["list", "patch", "create", "delete"] {
                    want.insert(rule("networking.istio.io", "serviceentries", verb, "*"));
                }
            }
            if ns == LEASE_NS {
                let lease = lease_of(a);
                want.insert(rule("coordination.k8s.io", "leases", "get", &lease));
                want.insert(rule("coordination.k8s.io", "leases", "update", &lease));
                want.insert(rule("coordination.k8s.io", "leases", "create", "*"));
            }
            assert_eq!(
                kube.rules_in(token, ns),
                want,
                "adapter-{a}: its rights in {ns}"
            );
        }
    }

    real_adapters_write_with_the_shipped_rbac(kube);
}

/// The real adapter-file and adapter-kube binaries, with nothing but their ServiceAccount's token
/// and the shipped RBAC, write their ServiceEntries and hold their Leases (adapter-kube's Lease
/// is `mcp-adapter-kubernetes`: its source name is its registry's).
fn real_adapters_write_with_the_shipped_rbac(kube: &KubeApiServer) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("orders.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: orders, namespace: legacy}\nspec:\n  hosts: [orders.legacy.example]\n  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  endpoints: [{address: 10.1.2.3}]\n",
    )
    .expect("write");
    // adapter-kube watches this same API server (as admin) in team-a.
    kube.apply_service(&e2e::kube::service(
        "team-a",
        "catalog",
        &[("http", 80, 8080)],
    ));
    kube.apply_slice(&e2e::kube::slice(
        "team-a",
        "catalog-1",
        "catalog",
        "IPv4",
        &[("http", 8080)],
        vec![e2e::kube::ready("10.1.2.4")],
    ));
    let path = dir.path().display().to_string();
    let admin = kube.kubeconfig().display().to_string();
    let runs = [
        (
            "file",
            "legacy/orders",
            vec!["--path", path.as_str(), "--poll-interval", "100ms"],
        ),
        (
            "kube",
            "team-a/catalog",
            vec!["--kubeconfig", admin.as_str(), "--namespaces", "team-a"],
        ),
    ];
    let mut adapters = Vec::new();
    for (a, want, mut args) in runs {
        let token = kube.service_account_token(NS, &format!("adapter-{a}"));
        let kubeconfig = kube.kubeconfig_for(&token).display().to_string();
        // The identity that holds its Lease after the checks above: it takes it back at once.
        let identity = format!("adapter-{a}-1");
        args.extend([
            "--output",
            "kube",
            "--output-kubeconfig",
            kubeconfig.as_str(),
        ]);
        args.extend(["--output-namespaces", output_namespace(a)]);
        args.extend([
            "--output-lease-namespace",
            LEASE_NS,
            "--output-identity",
            identity.as_str(),
        ]);
        let adapter = e2e::Adapter::start(&format!("adapter-{a}"), &args);
        adapters.push((a, want, adapter));
    }
    for (a, want, adapter) in &adapters {
        let (ns, name) = want.split_once('/').expect("ns/name");
        e2e::wait_for(
            std::time::Duration::from_secs(60),
            &format!("adapter-{a} writes {want} with its ServiceAccount"),
            || {
                let o = adapter.debug()["kubeOutput"].clone();
                let written = kube
                    .get(&format!("{}/{name}", service_entries(ns)))
                    .is_some_and(|se| {
                        se["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mcp-adapter"
                    });
                (written && o["leader"] == true && o["inStep"] == true).then_some(o)
            },
        );
        let o = adapter.debug()["kubeOutput"].clone();
        assert_eq!(
            o["lastError"],
            Value::Null,
            "adapter-{a}: {o}\n{}",
            adapter.log_tail()
        );
        assert_eq!(o["leaseError"], Value::Null, "adapter-{a}: {o}");
        assert_eq!(o["rejected"], serde_json::json!({}), "adapter-{a}: {o}");
        assert_eq!(
            o["lease"],
            format!("{LEASE_NS}/{}", lease_of(a)),
            "adapter-{a}"
        );
    }
}

/// `384Mi` and the like, in bytes.
fn quantity_bytes(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("quantity {q:?}"));
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => panic!("quantity {q:?}: unit {unit:?}"),
    }
}

/// Every state emptyDir holds the rule its comment states: the state file and the new one
/// written beside it (2 x the file) at 100k services x 10 endpoints, plus 50%. The file is
/// measured here with the adapter's own encoder and `state_file::save` at 10k services shaped as
/// in the bench, and scaled by 10 (the size is linear in endpoints: 127.1, 127.8 and 128.2 bytes
/// per endpoint at 1k, 10k and 100k, BENCHMARKS.md "State file size"). A change that makes the
/// file larger makes this fail instead of evicting pods. The chart renders the same volumes
/// (tests/tests/helm_chart.rs).
#[test]
fn state_volumes_hold_two_state_files_of_100k_services() {
    use mcp_core::cache::state_file;
    use mcp_core::index::Index;
    use mcp_core::metrics::Metrics;
    use mcp_core::testing::shaped::model;
    use mcp_core::translate::TranslateConfig;
    use mcp_core::RegistryEvent;

    let mut index = Index::new(
        TranslateConfig {
            namespace: "consul".into(),
            host_suffix: "service.consul".into(),
            export_to: vec![],
            registry: "consul".into(),
            source: "consul".into(),
            on_empty: mcp_core::OnEmpty::Keep,
            max_labels: mcp_core::translate::DEFAULT_MAX_LABELS,
            naming: Default::default(),
            vip_cidr: mcp_core::vip::VipCidr::Off,
        },
        Metrics::new("consul").expect("metrics"),
    );
    index.apply(RegistryEvent::Reset(model(10_000)));
    let snapshot = index.flush().expect("a snapshot");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("last-served.pb");
    state_file::save(&path, &snapshot, &[]).expect("saved");
    let file_100k = std::fs::metadata(&path).expect("written").len() * 10;
    let needed = file_100k * 2 * 3 / 2;

    let mut checked = Vec::new();
    for m in manifests() {
        for doc in documents(&m) {
            let volumes = doc["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .cloned();
            for v in volumes
                .into_iter()
                .flatten()
                .filter(|v| v["name"] == "state")
            {
                let limit = v["emptyDir"]["sizeLimit"].as_str().unwrap_or_else(|| {
                    panic!("{}: state emptyDir without a sizeLimit", file_name(&m))
                });
                let bytes = quantity_bytes(limit);
                assert!(
                    bytes >= needed,
                    "{}: sizeLimit {limit} < 2 x {:.1} MiB (100k services) + 50% = {:.1} MiB",
                    file_name(&m),
                    file_100k as f64 / 1048576.0,
                    needed as f64 / 1048576.0
                );
                // Not wildly more either: the rule is what sizes it.
                assert!(bytes < needed * 2, "{}: sizeLimit {limit}", file_name(&m));
                checked.push(file_name(&m).to_string());
            }
        }
    }
    assert_eq!(
        checked,
        [
            "adapter-consul.yaml",
            "adapter-eureka.yaml",
            "adapter-kube.yaml",
            "adapter-nacos.yaml",
            "adapter-zookeeper.yaml"
        ],
        "every adapter with a state file"
    );
}
