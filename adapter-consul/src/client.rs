//! The few Consul HTTP endpoints the adapter needs, as blocking queries.
//!
//! Consul's blocking-query rules (api-docs/features/blocking): send the last `X-Consul-Index`
//! with `wait`; a return does not mean a change; an index that goes backwards means reset; an
//! index is never 0 (a missing or 0 header counts as 1, so the next query still blocks). This
//! module makes the requests (at most `--consul-concurrency` + [`WATCHES`] in flight), applies
//! the index sanity rule and classifies failures; [`crate::watch`] applies the others.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mcp_core::clip::error_chain;
use mcp_core::clip::quoted_body;
use reqwest::StatusCode;
use serde::de::{DeserializeOwned, IgnoredAny};
use tokio::sync::Semaphore;

use crate::config::{ConsulConfig, MAX_CONCURRENCY};
use crate::convert::HealthEntry;
use crate::error::ConsulError;
use crate::stats::ConsulStats;
use mcp_runtime::http_client::{BodyError, ReloadingClient};
use mcp_runtime::secret::{Secret, SecretSource};

/// A blocking-query answer.
#[derive(Debug)]
pub struct Indexed<T> {
    /// `X-Consul-Index`, never 0 (see [`index_of`]).
    pub index: u64,
    /// The body.
    pub value: T,
}

/// The three change watches each hold one request open besides the bounded ones.
pub const WATCHES: usize = 3;

/// How long an idle connection to Consul is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The endpoint label of a fetch of one service's instances.
pub const HEALTH: &str = "/v1/health/service/:name";
/// The endpoint label of a look at one service's index alone (an empty answer).
pub const HEALTH_INDEX: &str = "/v1/health/service/:name?index-only";

/// The endpoint label of a list of one node's services.
pub const NODE_SERVICES: &str = "/v1/catalog/node-services/:node";

/// A Consul HTTP API client. Cheap to clone (the clones share the connection pool and the cap
/// on requests in flight).
#[derive(Clone, Debug)]
pub struct ConsulClient {
    inner: Arc<ClientInner>,
}

#[derive(Debug)]
struct ClientInner {
    http: ReloadingClient,
    base: String,
    token: SecretSource,
    datacenter: Option<String>,
    namespace: Option<String>,
    partition: Option<String>,
    wait: Duration,
    /// Requests in flight: at most `--consul-concurrency` + [`WATCHES`].
    in_flight: Semaphore,
    /// A missing `X-Consul-Index` was already warned about.
    warned_no_index: AtomicBool,
    /// `?stale` with this `max_stale` (milliseconds), or leader reads.
    stale: Option<u128>,
    /// The last answer said there was no known leader (warned once per loss).
    no_leader: AtomicBool,
    /// Requests and staleness, as metrics.
    stats: ConsulStats,
}

/// The base URL from the address and `CONSUL_HTTP_SSL`, as the consul CLI derives it: a bare
/// `host:port` is HTTP, and `CONSUL_HTTP_SSL=true` makes it HTTPS whatever the scheme said.
fn base_url(addr: &str, ssl: Option<bool>) -> Result<reqwest::Url, ConsulError> {
    let addr = addr.trim_end_matches('/');
    let rest = addr
        .strip_prefix("https://")
        .or_else(|| addr.strip_prefix("http://"));
    let scheme = match (ssl, rest) {
        (Some(true), _) => "https",
        (_, Some(_)) if addr.starts_with("https://") => "https",
        _ => "http",
    };
    let url = format!("{scheme}://{}", rest.unwrap_or(addr));
    reqwest::Url::parse(&url)
        .map_err(|e| ConsulError::Config(format!("--consul-addr {addr:?}: {e}")))
}

impl ConsulClient {
    /// Builds a client; the token comes from the token file, else `token` (the environment).
    pub fn new(cfg: &ConsulConfig, token: Option<String>) -> Result<Self, ConsulError> {
        let url = base_url(&cfg.addr, cfg.ssl)?;
        let mut base = url.as_str().trim_end_matches('/').to_string();
        let token = SecretSource::new("token", cfg.token_file.as_deref(), token)
            .map_err(|e| ConsulError::Config(e.to_string()))?;
        let wait = cfg
            .wait
            .clamp(Duration::from_millis(10), Duration::from_secs(600));
        let concurrency = cfg.concurrency.clamp(1, MAX_CONCURRENCY);
        let mut settings = cfg.tls.settings();
        settings.capath = cfg.capath.clone();
        settings.verify = cfg.ssl_verify;
        settings.max_idle = concurrency + WATCHES + cfg.service_watches;
        // A burst of fetches (a list, a sweep) leaves its connections idle, and the agent counts
        // them against its per-address limit: they close soon.
        settings.idle_timeout = IDLE_TIMEOUT;
        settings.max_response = cfg.response.max_response_size;
        if let Some(name) = &cfg.tls_server_name {
            // Verify `name` while connecting to the configured address: ask for `name` and
            // resolve it to where the address points.
            let host = url.host_str().unwrap_or_default().to_string();
            let port = url.port_or_known_default().unwrap_or(8501);
            let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| ConsulError::Config(format!("cannot resolve {host}")))?;
            settings.resolve = Some((name.clone(), addr));
            let mut u = url.clone();
            u.set_host(Some(name)).map_err(|e| {
                ConsulError::Config(format!("--consul-tls-server-name {name:?}: {e}"))
            })?;
            base = u.as_str().trim_end_matches('/').to_string();
        }
        let http =
            ReloadingClient::new(settings).map_err(|e| ConsulError::Config(e.to_string()))?;
        Ok(Self {
            inner: Arc::new(ClientInner {
                http,
                base,
                token,
                datacenter: cfg.datacenter.clone(),
                namespace: cfg.consul_namespace.clone(),
                partition: cfg.consul_partition.clone(),
                wait,
                in_flight: Semaphore::new(concurrency + WATCHES),
                warned_no_index: AtomicBool::new(false),
                stale: cfg.stale.then(|| cfg.max_stale.as_millis().max(1)),
                no_leader: AtomicBool::new(false),
                stats: ConsulStats::new()
                    .map_err(|e| ConsulError::Config(format!("metrics: {e}")))?,
            }),
        })
    }

    /// Requests and staleness, as metrics.
    pub fn stats(&self) -> &ConsulStats {
        &self.inner.stats
    }

    /// Base address (for messages).
    pub fn addr(&self) -> &str {
        &self.inner.base
    }

    /// The index of an answer by Consul's rules: never 0 (blocking on 0 returns at once, so a
    /// watch would spin), and a missing or unparsable header counts as 1 (warned about once).
    fn index_of(&self, headers: &reqwest::header::HeaderMap, path: &str) -> u64 {
        match headers
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i128>().ok())
        {
            Some(i) => index_of(Some(i)),
            None => {
                if !self.inner.warned_no_index.swap(true, Ordering::Relaxed) {
                    tracing::warn!(addr = %self.inner.base, path, "Consul answered without an X-Consul-Index header (a proxy in between?); treating it as index 1, so changes are still waited for.");
                }
                index_of(None)
            }
        }
    }

    /// One GET of `path` (counted under `endpoint`, the path without the service name).
    async fn get<T: DeserializeOwned>(
        &self,
        endpoint: &str,
        path: &str,
        filter: Option<&str>,
        index: Option<u64>,
        read: Read,
    ) -> Result<Indexed<T>, ConsulError> {
        let c = &self.inner;
        let mut query: Vec<(&str, String)> = Vec::new();
        if let (Some(ms), Read::Stale | Read::OwnQuery) = (c.stale, read) {
            // Any server answers; one that lost the leader for longer than this asks the
            // leader itself.
            query.push(("stale", String::new()));
            query.push(("max_stale", format!("{ms}ms")));
        }
        if let Some(dc) = &c.datacenter {
            query.push(("dc", dc.clone()));
        }
        if let Some(ns) = &c.namespace {
            query.push(("ns", ns.clone()));
        }
        if let Some(p) = &c.partition {
            query.push(("partition", p.clone()));
        }
        if let Some(f) = filter {
            query.push(("filter", f.to_string()));
        }
        let timeout = match index {
            Some(i) => {
                // Index 0 would not block: Consul's rule is to use 1 instead.
                query.push(("index", i.max(1).to_string()));
                query.push(("wait", format!("{}ms", c.wait.as_millis())));
                // Consul adds up to wait/16 of jitter; give the answer time to arrive.
                c.wait + c.wait / 16 + Duration::from_secs(15)
            }
            None => Duration::from_secs(30),
        };
        // A 403 for a token the file no longer holds (rotated meanwhile, the old one deleted)
        // is retried once with the new token instead of failing the watch.
        let mut attempt = 0;
        let (status, index, body) = loop {
            attempt += 1;
            let token = c
                .token
                .current()
                .map_err(|e| ConsulError::Config(e.to_string()))?;
            c.stats.request(endpoint, index.is_some());
            let (status, index, body) = self
                .send(path, &query, timeout, token.as_ref(), read)
                .await?;
            if status == StatusCode::FORBIDDEN && attempt == 1 {
                let now = c
                    .token
                    .current()
                    .map_err(|e| ConsulError::Config(e.to_string()))?;
                if now != token {
                    tracing::info!(
                        path,
                        "Consul refused the previous token; retrying with the rotated one."
                    );
                    continue;
                }
            }
            break (status, index, body);
        };
        if status == StatusCode::FORBIDDEN {
            return Err(ConsulError::AccessDenied {
                path: path.to_string(),
                body: quoted_body(&body),
            });
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Err(ConsulError::Refused {
                addr: c.base.clone(),
                message: format!("HTTP 429: {}", quoted_body(&body)),
            });
        }
        if !status.is_success() {
            return Err(ConsulError::Status {
                path: path.to_string(),
                status: status.as_u16(),
                body: quoted_body(&body),
            });
        }
        let value = decode(path, &body)?;
        Ok(Indexed { index, value })
    }

    /// One request, within the cap on requests in flight: status, index and body.
    async fn send(
        &self,
        path: &str,
        query: &[(&str, String)],
        timeout: Duration,
        token: Option<&Secret>,
        read: Read,
    ) -> Result<(StatusCode, u64, bytes::Bytes), ConsulError> {
        let c = &self.inner;
        let mut req = c
            .http
            .get()
            .get(format!("{}{path}", c.base))
            .query(query)
            .timeout(timeout);
        if let Some(t) = token {
            req = req.header("X-Consul-Token", t.expose());
        }
        let _permit = match read {
            Read::OwnQuery => None,
            Read::Stale | Read::Leader => Some(
                c.in_flight
                    .acquire()
                    .await
                    .map_err(|_| ConsulError::Config("client closed".into()))?,
            ),
        };
        let blocking = query.iter().any(|(k, _)| *k == "index");
        let resp = req.send().await.map_err(|e| {
            let message = error_chain(&e);
            // hyper's words for bytes that arrived on a connection with no request on it:
            // the agent's 429 for a connection over its limit.
            if message.contains("unexpected message") {
                ConsulError::Refused {
                    addr: c.base.clone(),
                    message,
                }
            } else if blocking && !e.is_connect() && !e.is_timeout() {
                ConsulError::Cut {
                    addr: c.base.clone(),
                    message,
                }
            } else {
                ConsulError::Unreachable {
                    addr: c.base.clone(),
                    message,
                }
            }
        })?;
        let status = resp.status();
        let index = self.index_of(resp.headers(), path);
        if status.is_success() {
            self.freshness(resp.headers(), path);
        }
        let body = c.http.body(resp).await.map_err(|e| match e {
            BodyError::TooLarge { .. } => ConsulError::TooLarge(e.to_string()),
            BodyError::Read { .. } => ConsulError::Unreachable {
                addr: c.base.clone(),
                message: e.to_string(),
            },
        })?;
        Ok((status, index, body))
    }

    /// Records how far behind the leader the answering server was, and warns once when it
    /// knows no leader (its answers may then be arbitrarily old).
    fn freshness(&self, headers: &reqwest::header::HeaderMap, path: &str) {
        let c = &self.inner;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(ms) = header("X-Consul-LastContact").and_then(|v| v.trim().parse::<u64>().ok())
        {
            c.stats.last_contact(ms as f64 / 1000.0);
        }
        let leader = header("X-Consul-KnownLeader").is_none_or(|v| v.trim() != "false");
        if !leader && !c.no_leader.swap(true, Ordering::Relaxed) {
            tracing::warn!(addr = %c.base, path, "The Consul server that answered knows no leader: its answers may be old until the cluster elects one.");
        } else if leader {
            c.no_leader.store(false, Ordering::Relaxed);
        }
    }

    /// `/v1/catalog/services`: service name -> tags; blocking when `index` is set.
    pub async fn services(
        &self,
        index: Option<u64>,
    ) -> Result<Indexed<BTreeMap<String, Vec<String>>>, ConsulError> {
        self.get(
            "/v1/catalog/services",
            "/v1/catalog/services",
            None,
            index,
            Read::Stale,
        )
        .await
    }

    /// `/v1/health/service/:name`: instances with node and checks, from the leader.
    pub async fn health(&self, name: &str) -> Result<Indexed<Vec<HealthEntry>>, ConsulError> {
        let path = format!("/v1/health/service/{}", encode_path(name));
        self.get(HEALTH, &path, None, None, Read::Leader).await
    }

    /// The same after a change at index `min` was seen on this service: from any server
    /// (`--consul-stale`), and again from the leader when the server that answered had not
    /// applied that change yet (its answer's index is below `min`), so a lagging follower
    /// never hides a change.
    pub async fn health_since(
        &self,
        name: &str,
        min: u64,
    ) -> Result<Indexed<Vec<HealthEntry>>, ConsulError> {
        if self.inner.stale.is_none() {
            return self.health(name).await;
        }
        let path = format!("/v1/health/service/{}", encode_path(name));
        let r = self.get(HEALTH, &path, None, None, Read::Stale).await?;
        if r.index >= min {
            return Ok(r);
        }
        tracing::debug!(
            service = name,
            index = r.index,
            min,
            "A Consul server answered from before the change; reading from the leader."
        );
        self.health(name).await
    }

    /// `/v1/health/service/:name` as a blocking query from `index`: one service's own query
    /// (`--consul-service-watches`, [`Read::OwnQuery`]), answered by any server under
    /// `--consul-stale` (a lagging one waits until it passes `index`).
    pub async fn health_watch(
        &self,
        name: &str,
        index: u64,
    ) -> Result<Indexed<Vec<HealthEntry>>, ConsulError> {
        let path = format!("/v1/health/service/{}", encode_path(name));
        self.get(HEALTH, &path, None, Some(index), Read::OwnQuery)
            .await
    }

    /// The index of `/v1/health/service/:name` alone: it moves when anything of that service
    /// changes (an instance, a check, its node), so comparing it says whether to fetch it.
    pub async fn health_index(&self, name: &str) -> Result<u64, ConsulError> {
        let path = format!("/v1/health/service/{}", encode_path(name));
        let r: Indexed<Vec<IgnoredAny>> = self
            .get(
                HEALTH_INDEX,
                &path,
                Some(r#"Service.ID == "" and Service.ID != """#),
                None,
                Read::Leader,
            )
            .await?;
        Ok(r.index)
    }

    /// The checks that are not passing (`/v1/health/state/any` filtered by Consul), blocking
    /// when `index` is set. Usually a short list, and it changes exactly when an instance's
    /// health does: comparing two answers names the services to fetch.
    pub async fn unhealthy_checks(
        &self,
        index: Option<u64>,
    ) -> Result<Indexed<Vec<CheckState>>, ConsulError> {
        self.get(
            "/v1/health/state/any",
            "/v1/health/state/any",
            Some(r#"Status != "passing""#),
            index,
            Read::Stale,
        )
        .await
    }

    /// Every node with the index of its last change (`/v1/catalog/nodes`), blocking when
    /// `index` is set: comparing two answers names the nodes that changed.
    pub async fn nodes(&self, index: Option<u64>) -> Result<Indexed<Vec<NodeState>>, ConsulError> {
        self.get(
            "/v1/catalog/nodes",
            "/v1/catalog/nodes",
            None,
            index,
            Read::Stale,
        )
        .await
    }

    /// The names of the services with an instance on `node`
    /// (`/v1/catalog/node-services/:node`): what a change of that node or of its node checks
    /// touches.
    pub async fn node_services(&self, node: &str) -> Result<Vec<String>, ConsulError> {
        let path = format!("/v1/catalog/node-services/{}", encode_path(node));
        let r: Indexed<NodeServices> = self
            .get(NODE_SERVICES, &path, None, None, Read::Stale)
            .await?;
        Ok(r.value.names())
    }
}

/// Where a read may be answered, and which cap on connections it counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    /// Any server when `--consul-stale` (blocking queries, which wait on a lagging server
    /// until it passes the index sent, and reads checked against the index of the change).
    Stale,
    /// The leader (full lists and sweeps: what they read must not be older than what
    /// caused them).
    Leader,
    /// As [`Read::Stale`], for one service's own blocking query: outside the cap on requests
    /// in flight (`--consul-concurrency` + the change watches), since the registry bounds
    /// those queries itself (`--consul-service-watches`) and one must never wait behind a
    /// sweep.
    OwnQuery,
}

/// One node of `/v1/catalog/nodes`, as far as changes go.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeState {
    /// Node name.
    pub node: String,
    /// Index of the node's last change (address, meta, tagged addresses).
    #[serde(default)]
    pub modify_index: u64,
}

/// The answer of `/v1/catalog/node-services/:node` (`null` fields for an unknown node).
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeServices {
    #[serde(default)]
    services: Option<Vec<NodeService>>,
}

impl NodeServices {
    /// The service of each instance (none for an unknown node).
    pub fn names(self) -> Vec<String> {
        self.services
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.service)
            .collect()
    }
}

/// One instance of [`NodeServices`], as far as its service goes.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct NodeService {
    service: String,
}

/// One check of `/v1/health/state/any`, as far as health goes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CheckState {
    /// Node of the check.
    pub node: String,
    /// Check id (unique per node).
    #[serde(rename = "CheckID")]
    pub check_id: String,
    /// `warning` or `critical`.
    pub status: String,
    /// The service it checks; empty for a node check (it affects every service of the node).
    #[serde(default)]
    pub service_name: String,
}

/// Reads the body of a successful answer to `path` as `T`: the one place Consul's JSON is
/// decoded, public so that the fuzz targets feed it exactly what the watch does.
pub fn decode<T: DeserializeOwned>(path: &str, body: &[u8]) -> Result<T, ConsulError> {
    serde_json::from_slice(body).map_err(|e| ConsulError::Decode {
        path: path.to_string(),
        message: e.to_string(),
    })
}

/// Consul's index sanity rule: an index is at least 1; a missing one counts as 1.
pub fn index_of(header: Option<i128>) -> u64 {
    match header {
        Some(i) if i >= 1 => u64::try_from(i).unwrap_or(u64::MAX),
        _ => 1,
    }
}

/// Percent-encodes a path segment (service names may hold any character).
fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_path_segments() {
        assert_eq!(encode_path("web-1.x_y"), "web-1.x_y");
        assert_eq!(encode_path("a b/c"), "a%20b%2Fc");
    }
}
