//! The Kubernetes manifests in deploy/kubernetes, applied unchanged to a real kube-apiserver
//! (1.35 with an embedded etcd, from tests/kube-apiserver/build.sh): the API server validates
//! every field of every object. No kubelet, scheduler or controller manager runs, so no pod is
//! ever created: what is checked is that the objects are accepted and stored as written (replicas,
//! probes, security context, Service port, NetworkPolicy peers), not that the pods start.

use std::path::{Path, PathBuf};

use serde_json::Value;

use e2e::kube::{collection_of, KubeApiServer, ADMIN_TOKEN};

const NS: &str = "mcp-adapters";
const ADAPTERS: [&str; 5] = ["file", "consul", "zookeeper", "eureka", "kube"];
const MCP_PORT: u64 = 15051;

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
    serde_yaml::Deserializer::from_str(&text)
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
    let values: Value = serde_yaml::from_str(&text).expect("istiod-meshconfig.yaml is YAML");
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
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn deploy_manifests_are_accepted_by_the_api_server_and_stored_as_meant() {
    let files = manifests();
    for a in ADAPTERS {
        assert!(
            files
                .iter()
                .any(|p| file_name(p) == format!("adapter-{a}.yaml")),
            "deploy/kubernetes/adapter-{a}.yaml missing"
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

    // The namespaced RBAC example is written for namespace team-a (one copy per watched
    // namespace): it has to exist first.
    kube.namespace("team-a");

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
        "adapter-kube-remote-kubeconfig",
    ] {
        get(&kube, &secrets, s);
    }
    let cm = get(
        &kube,
        &format!("/api/v1/namespaces/{NS}/configmaps"),
        "adapter-file-inventory",
    );
    let inventory: Value = serde_yaml::from_str(
        cm["data"]["inventory.yaml"]
            .as_str()
            .expect("inventory.yaml key"),
    )
    .expect("the example inventory is YAML");
    assert_eq!(inventory["kind"], "Inventory");
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
}
