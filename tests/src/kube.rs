//! A real Kubernetes API server (kube-apiserver 1.35 with an embedded etcd, one process) on a
//! free loopback port, built by `tests/kube-apiserver/build.sh` into `$KUBE_BIN_DIR` (default
//! `target/kube`).
//!
//! HTTPS with a self-signed certificate the server makes at start (its CA is in
//! [`KubeApiServer::ca`]), static bearer tokens ([`ADMIN_TOKEN`] in `system:masters`,
//! [`NOBODY_TOKEN`] with no role bindings, plus any given to [`KubeApiServer::start_with`]),
//! authorization `Node,RBAC`. No controller manager runs: tests write EndpointSlices
//! themselves. Requests go through `curl` (the test crate has no TLS client).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::{free_addr, peer_binary, Process};

/// Token of `admin` (group `system:masters`: everything allowed).
pub const ADMIN_TOKEN: &str = "test-token";
/// Token of `nobody`: authenticated, no role bindings (everything but discovery is 403).
pub const NOBODY_TOKEN: &str = "nobody-token";

/// The kube-apiserver-test binary.
pub fn kube_bin() -> PathBuf {
    peer_binary(
        "KUBE_BIN_DIR",
        "kube",
        "kube-apiserver-test",
        "tests/go-peers/build.sh target",
    )
}

/// A static-token user for [`KubeApiServer::start_with`].
#[derive(Clone, Debug)]
pub struct TokenUser {
    /// Bearer token.
    pub token: String,
    /// User name (what RBAC subjects of kind `User` name).
    pub user: String,
    /// Groups.
    pub groups: Vec<String>,
}

impl TokenUser {
    /// A user without groups.
    pub fn new(token: &str, user: &str) -> TokenUser {
        TokenUser {
            token: token.to_string(),
            user: user.to_string(),
            groups: Vec::new(),
        }
    }
}

/// A running API server, killed on drop (its data goes with the temporary directory).
pub struct KubeApiServer {
    process: Process,
    /// HTTPS address.
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

/// An API answer: status and body (JSON when the server sent JSON, else `Value::String`).
#[derive(Clone, Debug)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: Value,
}

impl KubeApiServer {
    /// Starts a server with the admin and nobody tokens and waits until `/readyz` is 200.
    pub fn start() -> KubeApiServer {
        Self::start_with(&[], &[])
    }

    /// [`KubeApiServer::start`] with more token users and extra kube-apiserver flags (a later
    /// flag wins over the harness's own).
    pub fn start_with(users: &[TokenUser], extra_args: &[&str]) -> KubeApiServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut tokens =
            format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n{NOBODY_TOKEN},nobody,nobody\n");
        for u in users {
            tokens.push_str(&format!(
                "{},{},{},\"{}\"\n",
                u.token,
                u.user,
                u.user,
                u.groups.join(",")
            ));
        }
        std::fs::write(dir.path().join("tokens.csv"), tokens).expect("write tokens.csv");
        let k = KubeApiServer {
            process: Process::new(
                "kube-apiserver-test",
                dir.path(),
                Duration::from_millis(200),
            ),
            addr: free_addr(),
            dir,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
        };
        k.spawn();
        k.write_kubeconfig(&k.kubeconfig(), ADMIN_TOKEN);
        k
    }

    fn spawn(&self) {
        self.process.spawn(
            Command::new(kube_bin())
                .arg("-port")
                .arg(self.addr.port().to_string())
                .arg("-data-dir")
                .arg(self.dir.path().join("data"))
                .arg("-token-file")
                .arg(self.dir.path().join("tokens.csv"))
                .arg("--")
                .args(&self.extra_args),
        );
        // The serving certificate is written before the port opens; until then curl cannot even
        // load the CA file.
        self.process
            .wait_until(Duration::from_secs(120), "/readyz 200", || {
                self.ca().exists()
                    && self
                        .try_request(ADMIN_TOKEN, "GET", "/readyz", None)
                        .is_ok_and(|r| r.status == 200)
            });
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The serving certificate file (certificate and the self-signed CA that issued it): what
    /// clients trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("data/certs/apiserver.crt")
    }

    /// The admin kubeconfig (server, CA, [`ADMIN_TOKEN`]).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Writes a kubeconfig for `token` (context `test`, namespace `default`) to `path`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        // JSON is YAML: no YAML writer needed.
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url(),
                "certificate-authority": self.ca().display().to_string(),
            }}],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {
                "cluster": "test", "user": "test", "namespace": "default",
            }}],
            "current-context": "test",
        });
        std::fs::write(path, serde_json::to_string_pretty(&config).expect("json"))
            .expect("write kubeconfig");
    }

    /// A kubeconfig for `token` in the server's temporary directory.
    pub fn kubeconfig_for(&self, token: &str) -> PathBuf {
        // Named by a counter: a service-account token is too long for a file name.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.path().join(format!("kubeconfig-{n}"));
        self.write_kubeconfig(&path, token);
        path
    }

    /// One request with `token`; `Err` when curl could not talk to the server at all.
    pub fn try_request(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Response, String> {
        let mut cmd = Command::new("curl");
        cmd.args(["--silent", "--show-error", "--max-time", "30"])
            .arg("--cacert")
            .arg(self.ca())
            .arg("--header")
            .arg(format!("Authorization: Bearer {token}"))
            .args(["--header", "Accept: application/json"])
            .args(["--request", method])
            .args(["--write-out", "\n%{http_code}"]);
        if body.is_some() {
            cmd.args([
                "--header",
                "Content-Type: application/json",
                "--data-binary",
                "@-",
            ]);
        }
        let mut child = cmd
            .arg(format!("{}{path}", self.url()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("run curl: {e}"))?;
        let mut stdin = child.stdin.take().expect("stdin");
        if let Some(b) = body {
            stdin
                .write_all(b.to_string().as_bytes())
                .map_err(|e| format!("curl stdin: {e}"))?;
        }
        drop(stdin);
        let out = child.wait_with_output().map_err(|e| format!("curl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "curl {method} {path}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let status = code
            .trim()
            .parse()
            .map_err(|_| format!("no status: {text}"))?;
        let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string()));
        Ok(Response { status, body })
    }

    /// One request; panics when the server cannot be reached.
    pub fn request(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> Response {
        self.try_request(token, method, path, body)
            .unwrap_or_else(|e| panic!("{e}; server log:\n{}", self.process.log_tail(30)))
    }

    /// GET as admin: the object, or `None` on 404.
    pub fn get(&self, path: &str) -> Option<Value> {
        let r = self.request(ADMIN_TOKEN, "GET", path, None);
        match r.status {
            200 => Some(r.body),
            404 => None,
            s => panic!("GET {path}: {s} {}", r.body),
        }
    }

    /// Creates or replaces `obj` as admin in the collection at `collection` (e.g.
    /// `/api/v1/namespaces/default/services`): a PUT to `collection/name` carrying the current
    /// resourceVersion when the object exists, else a POST (a POST of an existing Service with
    /// its ClusterIP would fail on the IP, not as a conflict). The stored object.
    pub fn apply(&self, collection: &str, obj: &Value) -> Value {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("apply: metadata.name missing in {obj}"));
        let path = format!("{collection}/{name}");
        for _ in 0..10 {
            let r = match self.get(&path) {
                Some(current) => {
                    let mut next = obj.clone();
                    next["metadata"]["resourceVersion"] =
                        current["metadata"]["resourceVersion"].clone();
                    self.request(ADMIN_TOKEN, "PUT", &path, Some(&next))
                }
                None => self.request(ADMIN_TOKEN, "POST", collection, Some(obj)),
            };
            match r.status {
                200 | 201 => return r.body,
                // Created or changed in between: again, against what is there now.
                409 => continue,
                s => panic!("apply {path}: {s} {}", r.body),
            }
        }
        panic!("apply {path}: conflict after 10 attempts");
    }

    /// POSTs every `(collection, object)` as admin, `threads` requests at a time (for bulk
    /// inventories: each request is a curl process).
    pub fn create_all(&self, objects: &[(String, Value)], threads: usize) {
        let chunk = objects.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|s| {
            for part in objects.chunks(chunk) {
                s.spawn(move || {
                    for (collection, obj) in part {
                        let r = self.request(ADMIN_TOKEN, "POST", collection, Some(obj));
                        assert!(
                            r.status == 201,
                            "POST {collection}: {} {}",
                            r.status,
                            r.body
                        );
                    }
                });
            }
        });
    }

    /// Applies every document of a YAML manifest file as admin (the API server validates each
    /// field); the stored objects. `edit` may change each document first.
    pub fn apply_manifest(&self, path: &Path, edit: impl Fn(&mut Value)) -> Vec<Value> {
        use serde::Deserialize;
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut stored = Vec::new();
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let mut obj = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
            if obj.is_null() {
                continue;
            }
            edit(&mut obj);
            stored.push(self.apply(&collection_of(&obj), &obj));
        }
        stored
    }

    /// A token for ServiceAccount `ns/name` (TokenRequest API, one hour).
    pub fn service_account_token(&self, ns: &str, name: &str) -> String {
        let r = self.request(
            ADMIN_TOKEN,
            "POST",
            &format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token"),
            Some(
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}}),
            ),
        );
        assert_eq!(r.status, 201, "TokenRequest {ns}/{name}: {}", r.body);
        r.body["status"]["token"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Creates namespace `ns` unless it exists.
    pub fn namespace(&self, ns: &str) {
        if self.get(&format!("/api/v1/namespaces/{ns}")).is_none() {
            self.apply(
                "/api/v1/namespaces",
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            );
        }
    }

    /// Creates or replaces a Service (keeping its ClusterIP, which cannot change).
    pub fn apply_service(&self, svc: &Value) -> Value {
        let ns = svc["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = svc["metadata"]["name"].as_str().unwrap_or_default();
        let mut svc = svc.clone();
        if let Some(current) = self.get(&format!("/api/v1/namespaces/{ns}/services/{name}")) {
            if svc["spec"]["clusterIP"].is_null() {
                svc["spec"]["clusterIP"] = current["spec"]["clusterIP"].clone();
                svc["spec"]["clusterIPs"] = current["spec"]["clusterIPs"].clone();
            }
        }
        self.apply(&services_path(ns), &svc)
    }

    /// Creates or replaces an EndpointSlice.
    pub fn apply_slice(&self, slice: &Value) -> Value {
        let ns = slice["metadata"]["namespace"].as_str().unwrap_or("default");
        self.apply(&slices_path(ns), slice)
    }

    /// DELETE as admin; `false` when it was not there.
    pub fn delete(&self, path: &str) -> bool {
        let r = self.request(ADMIN_TOKEN, "DELETE", path, None);
        match r.status {
            200 | 202 => true,
            404 => false,
            s => panic!("DELETE {path}: {s} {}", r.body),
        }
    }

    /// What `token` may do in `ns` (a SelfSubjectRulesReview: the RBAC authorizer's own
    /// answer) as `(apiGroup, resource, verb, resourceName or "*")`, without what every
    /// authenticated user has (system:basic-user's self reviews in authorization.k8s.io and
    /// authentication.k8s.io).
    pub fn rules_in(&self, token: &str, ns: &str) -> BTreeSet<(String, String, String, String)> {
        let review = json!({"apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectRulesReview", "spec": {"namespace": ns}});
        let r = self.request(
            token,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            Some(&review),
        );
        assert_eq!(r.status, 201, "SelfSubjectRulesReview in {ns}: {}", r.body);
        let mut rules = BTreeSet::new();
        for rule in r.body["status"]["resourceRules"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let mut names = strings(&rule["resourceNames"]);
            if names.is_empty() {
                names.push("*".into());
            }
            for group in strings(&rule["apiGroups"]) {
                if group == "authorization.k8s.io" || group == "authentication.k8s.io" {
                    continue;
                }
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        for name in &names {
                            rules.insert((
                                group.clone(),
                                resource.clone(),
                                verb.clone(),
                                name.clone(),
                            ));
                        }
                    }
                }
            }
        }
        rules
    }

    /// Kills the server (data kept: a [`KubeApiServer::restart`] comes back with it).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again on the same port and data, waiting for `/readyz`.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// The Services collection of a namespace.
pub fn services_path(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/services")
}

/// The EndpointSlices collection of a namespace.
pub fn slices_path(ns: &str) -> String {
    format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices")
}

/// A selector-less Service with `ports` as `(name, port, targetPort)`.
pub fn service(ns: &str, name: &str, ports: &[(&str, u16, u16)]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": ports.iter().map(|(n, p, t)| {
            json!({"name": n, "port": p, "targetPort": t, "protocol": "TCP"})
        }).collect::<Vec<_>>()},
    })
}

/// An EndpointSlice of Service `svc`, as the EndpointSlice controller writes it: `ports` as
/// `(name, port)`, `endpoints` from [`ready`], [`not_ready`], [`terminating`].
pub fn slice(
    ns: &str,
    name: &str,
    svc: &str,
    family: &str,
    ports: &[(&str, u16)],
    endpoints: Vec<Value>,
) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {
            "kubernetes.io/service-name": svc,
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
        }},
        "addressType": family,
        "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"}))
            .collect::<Vec<_>>(),
        "endpoints": endpoints,
    })
}

/// A ready endpoint.
pub fn ready(ip: &str) -> Value {
    json!({"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false}})
}

/// An endpoint whose readiness probe fails.
pub fn not_ready(ip: &str) -> Value {
    json!({"addresses": [ip], "conditions": {"ready": false, "serving": false, "terminating": false}})
}

/// An endpoint of a pod that is shutting down (still serving its last requests).
pub fn terminating(ip: &str) -> Value {
    json!({"addresses": [ip], "conditions": {"ready": false, "serving": true, "terminating": true}})
}

/// The collection an object is created in, from its apiVersion, kind and namespace (plural as
/// Kubernetes forms it for the kinds our manifests use).
pub fn collection_of(obj: &Value) -> String {
    let api = obj["apiVersion"].as_str().unwrap_or("v1");
    let kind = obj["kind"].as_str().unwrap_or_default().to_lowercase();
    let plural = match kind.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None if kind.ends_with('s') => format!("{kind}es"),
        None => format!("{kind}s"),
    };
    let prefix = if api == "v1" {
        "/api/v1".to_string()
    } else {
        format!("/apis/{api}")
    };
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{prefix}/namespaces/{ns}/{plural}"),
        None => format!("{prefix}/{plural}"),
    }
}

/// The strings of a JSON array (none for anything else).
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// kube-apiserver flags for an audit log of the requests on `resources` (API group, resource),
/// metadata only, each event written before the request is answered (the tests read the file
/// while the server runs); the policy and the log go in `dir`. The flags and the log's path.
pub fn audit_args(dir: &Path, resources: &[(&str, &str)]) -> (Vec<String>, PathBuf) {
    let (policy, log) = (dir.join("audit-policy.yaml"), dir.join("audit.log"));
    let watched: Vec<Value> = resources
        .iter()
        .map(|(group, resource)| json!({"group": group, "resources": [resource]}))
        .collect();
    let text = json!({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "resources": watched}, {"level": "None"}],
    });
    std::fs::write(&policy, text.to_string()).expect("write the audit policy");
    let args = vec![
        format!("--audit-log-path={}", log.display()),
        format!("--audit-policy-file={}", policy.display()),
        "--audit-log-mode=blocking".to_string(),
    ];
    (args, log)
}

/// A request on a resource as the audit log recorded it once answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    /// Who asked.
    pub user: String,
    /// `list`, `patch`, `delete`, ...
    pub verb: String,
    /// The object's namespace (empty for a cluster-wide request).
    pub namespace: String,
    /// The object's name (empty for a list).
    pub name: String,
    /// The answer's HTTP status.
    pub code: i64,
    /// `requestReceivedTimestamp` (RFC 3339 with microseconds: ordered as text).
    pub received: String,
}

/// The answered requests on `resource` (e.g. `serviceentries`) in the log [`audit_args`]
/// names, in the order the API server received them.
pub fn audited(log: &Path, resource: &str) -> Vec<Audited> {
    let text = std::fs::read_to_string(log).expect("read the audit log");
    let mut all: Vec<Audited> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && e["objectRef"]["resource"] == resource)
        .map(|e| {
            let text = |v: &Value| v.as_str().unwrap_or("").to_string();
            Audited {
                user: text(&e["user"]["username"]),
                verb: text(&e["verb"]),
                namespace: text(&e["objectRef"]["namespace"]),
                name: text(&e["objectRef"]["name"]),
                code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
                received: text(&e["requestReceivedTimestamp"]),
            }
        })
        .collect();
    all.sort_by(|a, b| a.received.cmp(&b.received));
    all
}
