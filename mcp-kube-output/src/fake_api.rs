//! An API server in memory for the output's unit tests: a `tower::Service` that a
//! `kube::Client` talks to (`Client::new`), holding namespaced objects of any resource by path
//! (`/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>`, or `/api/v1/...`) with the
//! API server's optimistic concurrency: every write gets a new resourceVersion, a PUT carrying
//! an old one is a 409, a POST of an existing name is a 409, a GET of a missing one is a 404.
//!
//! Server-side apply (`PATCH` of the whole object: stored as sent, keeping the uid, refused with a
//! 409 when the body names another uid), deletes with a uid precondition, and lists of a
//! namespace's objects are enough for the output's writer.
//!
//! Faults: [`FakeApi::stall`] makes every request from then on hang unanswered (as an API server
//! or a network that stopped answering, with the connection still open) until
//! [`FakeApi::resume`]; [`FakeApi::fail`] answers every write of one object with a status, and
//! [`FakeApi::fail_writes`] every write of a kind of resource (an admission webhook that is
//! down), dry runs included. A dry-run write (`?dryRun=All`) is answered and stores nothing.
//! Every request is logged with when it arrived and how it ended, so a test can show that a
//! call was still pending at some instant.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;

/// One request as the fake saw it.
#[derive(Clone, Debug)]
pub struct Logged {
    /// Its method.
    pub method: Method,
    /// Its path (no query).
    pub path: String,
    /// Its JSON body, if it had one.
    pub body: Option<Value>,
    /// When it arrived.
    pub arrived: Instant,
    /// The status it was answered with, and when (`None`: not answered).
    pub answered: Option<(u16, Instant)>,
    /// When the client gave up on it unanswered (its future was dropped).
    pub abandoned: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    /// Objects by path.
    objects: BTreeMap<String, Value>,
    /// The last resourceVersion handed out (one counter for every resource, as etcd's).
    version: u64,
    log: Vec<Logged>,
    /// Writes of these object names answered with this status.
    failing: BTreeMap<String, u16>,
    /// Writes of this resource (plural) answered with this status.
    failing_writes: BTreeMap<String, u16>,
}

/// The fake API server; clones share it.
#[derive(Clone, Debug)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    stalled: Arc<watch::Sender<bool>>,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeApi {
    /// An empty API server that answers.
    pub fn new() -> Self {
        FakeApi {
            state: Arc::default(),
            stalled: Arc::new(watch::channel(false).0),
        }
    }

    /// A client over it (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// From now on no request is answered (those already answered stay so); they wait.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Answers again, the waiting requests too.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }

    /// Every write (PATCH, PUT, DELETE) of an object named `name` is answered with `code`.
    pub fn fail(&self, name: &str, code: u16) {
        self.lock().failing.insert(name.to_string(), code);
    }

    /// Every write (POST, PATCH, PUT, DELETE) of resource `plural` (`serviceentries`) is
    /// answered with `code`; `None` ends that.
    pub fn fail_writes(&self, plural: &str, code: Option<u16>) {
        let mut s = self.lock();
        match code {
            Some(c) => s.failing_writes.insert(plural.to_string(), c),
            None => s.failing_writes.remove(plural),
        };
    }

    /// The names of the objects of a collection (`/apis/.../namespaces/<ns>/<plural>`).
    pub fn names(&self, collection: &str) -> Vec<String> {
        let prefix = format!("{}/", collection.trim_end_matches('/'));
        self.lock()
            .objects
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|n| !n.contains('/'))
            .map(str::to_string)
            .collect()
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// The object at `path`, as stored.
    pub fn object(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(path).cloned()
    }

    /// Stores `obj` at `path` as if someone had written it (a new resourceVersion).
    pub fn put_object(&self, path: &str, mut obj: Value) {
        let mut s = self.lock();
        s.version += 1;
        obj["metadata"]["resourceVersion"] = json!(s.version.to_string());
        s.objects.insert(path.to_string(), obj);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn handle(self, req: Request<Body>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let dry_run = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "dryRun=All"));
        let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
        let body = serde_json::from_slice::<Value>(&bytes).ok();
        let index = {
            let mut s = self.lock();
            s.log.push(Logged {
                method: method.clone(),
                path: path.clone(),
                body: body.clone(),
                arrived: Instant::now(),
                answered: None,
                abandoned: None,
            });
            s.log.len() - 1
        };
        // Notes the drop of an unanswered request: the client timed out on it.
        let mut guard = Abandon {
            state: self.state.clone(),
            index,
            answered: false,
        };
        let mut stalled = self.stalled.subscribe();
        // The sender lives in `self`: the channel cannot close while this waits.
        let _ = stalled.wait_for(|s| !*s).await;
        let (status, answer) = self.answer(&method, &path, body, dry_run);
        guard.answered = true;
        self.lock().log[index].answered = Some((status.as_u16(), Instant::now()));
        let mut resp = Response::new(Body::from(answer.to_string().into_bytes()));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }

    fn answer(
        &self,
        method: &Method,
        path: &str,
        body: Option<Value>,
        dry_run: bool,
    ) -> (StatusCode, Value) {
        let Some(target) = Target::parse(path) else {
            return failure(StatusCode::NOT_FOUND, "NotFound", path);
        };
        let mut s = self.lock();
        if let Some(code) = s
            .failing_writes
            .get(target.plural)
            .filter(|_| method != Method::GET)
        {
            let code = StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return failure(code, "InternalError", "injected failure of every write");
        }
        if let Some(code) = target
            .name
            .filter(|_| method != Method::GET)
            .and_then(|n| s.failing.get(n))
        {
            let code = StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return failure(code, "InternalError", "injected failure");
        }
        match (method, target.name) {
            (&Method::GET, None) => {
                let prefix = format!("{}/", path.trim_end_matches('/'));
                let items: Vec<Value> = s
                    .objects
                    .iter()
                    .filter(|(k, _)| k.strip_prefix(&prefix).is_some_and(|n| !n.contains('/')))
                    .map(|(_, o)| json!({"metadata": o["metadata"].clone()}))
                    .collect();
                (
                    StatusCode::OK,
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                           "metadata": {"resourceVersion": s.version.to_string()}, "items": items}),
                )
            }
            (&Method::PATCH, Some(_)) => {
                let Some(mut obj) = body else {
                    return failure(StatusCode::BAD_REQUEST, "BadRequest", "no body");
                };
                let uid = match (s.objects.get(path), obj["metadata"]["uid"].as_str()) {
                    (Some(current), Some(sent)) if current["metadata"]["uid"] != sent => {
                        // The API server's own words.
                        let message = format!(
                            "Precondition failed: UID in precondition: {sent}, UID in object meta: {}",
                            current["metadata"]["uid"].as_str().unwrap_or_default()
                        );
                        return failure(StatusCode::CONFLICT, "Conflict", &message);
                    }
                    (Some(current), _) => current["metadata"]["uid"].clone(),
                    (None, _) => json!(format!("uid-{}", s.version + 1)),
                };
                let generation = s
                    .objects
                    .get(path)
                    .and_then(|c| c["metadata"]["generation"].as_i64())
                    .unwrap_or(0)
                    + 1;
                s.version += 1;
                obj["metadata"]["uid"] = uid;
                obj["metadata"]["generation"] = json!(generation);
                obj["metadata"]["resourceVersion"] = json!(s.version.to_string());
                s.objects.insert(path.to_string(), obj.clone());
                (StatusCode::OK, obj)
            }
            (&Method::GET, Some(_)) => match s.objects.get(path) {
                Some(obj) => (StatusCode::OK, obj.clone()),
                None => failure(StatusCode::NOT_FOUND, "NotFound", path),
            },
            (&Method::PUT, Some(_)) => {
                let Some(mut obj) = body else {
                    return failure(StatusCode::BAD_REQUEST, "BadRequest", "no body");
                };
                let Some(current) = s.objects.get(path) else {
                    return failure(StatusCode::NOT_FOUND, "NotFound", path);
                };
                if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                    return failure(
                        StatusCode::CONFLICT,
                        "Conflict",
                        "the object has been modified",
                    );
                }
                s.version += 1;
                obj["metadata"]["resourceVersion"] = json!(s.version.to_string());
                s.objects.insert(path.to_string(), obj.clone());
                (StatusCode::OK, obj)
            }
            (&Method::POST, None) => {
                let Some(mut obj) = body else {
                    return failure(StatusCode::BAD_REQUEST, "BadRequest", "no body");
                };
                let Some(name) = obj["metadata"]["name"].as_str().map(str::to_string) else {
                    return failure(StatusCode::BAD_REQUEST, "BadRequest", "no name");
                };
                let key = format!("{}/{name}", path.trim_end_matches('/'));
                if s.objects.contains_key(&key) {
                    return failure(StatusCode::CONFLICT, "AlreadyExists", &key);
                }
                if dry_run {
                    return (StatusCode::CREATED, obj);
                }
                s.version += 1;
                obj["metadata"]["resourceVersion"] = json!(s.version.to_string());
                obj["metadata"]["namespace"] = json!(target.namespace);
                s.objects.insert(key, obj.clone());
                (StatusCode::CREATED, obj)
            }
            (&Method::DELETE, Some(_)) => {
                let Some(current) = s.objects.get(path) else {
                    return failure(StatusCode::NOT_FOUND, "NotFound", path);
                };
                let want = body.as_ref().map(|b| &b["preconditions"]["uid"]);
                if want.is_some_and(|u| u.is_string() && *u != current["metadata"]["uid"]) {
                    let message = format!(
                        "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                        want.and_then(|u| u.as_str()).unwrap_or_default(),
                        current["metadata"]["uid"].as_str().unwrap_or_default()
                    );
                    return failure(StatusCode::CONFLICT, "Conflict", &message);
                }
                s.objects.remove(path);
                (
                    StatusCode::OK,
                    json!({"kind": "Status", "status": "Success"}),
                )
            }
            _ => failure(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", path),
        }
    }
}

/// A namespaced resource path: its namespace and, for one object, its name.
struct Target<'a> {
    namespace: &'a str,
    plural: &'a str,
    name: Option<&'a str>,
}

impl<'a> Target<'a> {
    fn parse(path: &'a str) -> Option<Self> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        // Core resources have no group: /api/v1/...; the rest /apis/<group>/<version>/...
        let rest = match parts.as_slice() {
            ["api", _version, rest @ ..] => rest,
            ["apis", _group, _version, rest @ ..] => rest,
            _ => return None,
        };
        match rest {
            ["namespaces", ns, plural] => Some(Target {
                namespace: ns,
                plural,
                name: None,
            }),
            ["namespaces", ns, plural, name] => Some(Target {
                namespace: ns,
                plural,
                name: Some(name),
            }),
            _ => None,
        }
    }
}

/// A `Status` as the API server sends with an error (kube reads its code and reason).
fn failure(code: StatusCode, reason: &str, message: &str) -> (StatusCode, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// Marks a request abandoned when its future is dropped before it was answered.
struct Abandon {
    state: Arc<Mutex<State>>,
    index: usize,
    answered: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.log[self.index].abandoned = Some(Instant::now());
    }
}

impl tower_service::Service<Request<Body>> for FakeApi {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}
