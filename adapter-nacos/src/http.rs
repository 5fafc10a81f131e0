//! Nacos' HTTP API: login (the access token the gRPC requests carry too), the namespace list
//! and pages of each namespace's services (names only, every group), as 2.x serves them (its
//! console API: `/nacos/v1/console/namespaces`, `/nacos/v1/ns/catalog/services`) and as 3.x does
//! (the same answer `410 Gone` there by default; its admin API, `/nacos/v3/admin/...`, wants a
//! user with the right to read). [`crate::catalog`] decides which a server gets.
//!
//! Instances are never read here: they come from the gRPC subscriptions ([`crate::session`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mcp_runtime::http_client::{HttpError, ReloadingClient};
use mcp_runtime::secret::{CredentialsError, Secret, UserPassword};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;

use crate::config::NacosConfig;
use crate::dto::{namespace_id, AdminServicePage, CatalogPage, CatalogService, Login, Namespaces};
use crate::stats::NacosStats;

/// Nacos 2.x's login (3.x serves it too, by default).
const V2_LOGIN: &str = "/nacos/v1/auth/login";
/// Nacos 3.x's own login.
const V3_LOGIN: &str = "/nacos/v3/auth/user/login";

/// How long to wait before asking again with a new token after a refusal.
pub const RELOGIN_PAUSE: Duration = Duration::from_millis(200);

/// Which HTTP API lists a server's namespaces and services.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListingApi {
    /// Nacos 2.x's console API (and 3.x's with `nacos.core.api.compatibility.console.enabled`).
    Console,
    /// Nacos 3.x's admin API.
    Admin,
}

impl ListingApi {
    /// The path of the service list.
    pub fn services_path(self) -> &'static str {
        match self {
            Self::Console => "/nacos/v1/ns/catalog/services",
            Self::Admin => "/nacos/v3/admin/ns/service/list",
        }
    }

    /// The path of the namespace list.
    pub fn namespaces_path(self) -> &'static str {
        match self {
            Self::Console => "/nacos/v1/console/namespaces",
            Self::Admin => "/nacos/v3/admin/core/namespace/list",
        }
    }
}

/// One page of a namespace's services: the total the server counts, and this page's
/// `(group, name)`s.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Page {
    /// How many services the server says there are in all.
    pub count: u64,
    /// This page.
    pub names: Vec<(String, String)>,
}

impl Page {
    /// The page of 2.x's console catalog.
    pub fn console(page: &CatalogPage) -> Self {
        Self {
            count: page.count,
            names: page
                .service_list
                .iter()
                .map(CatalogService::group_and_name)
                .collect(),
        }
    }

    /// The page of 3.x's admin API, or what its failure code says.
    pub fn admin(page: AdminServicePage) -> Result<Self, String> {
        if page.code != 0 {
            return Err(format!(
                "code {}: {}",
                page.code,
                page.message.unwrap_or_default()
            ));
        }
        Ok(Self {
            count: page.data.total_count,
            names: page
                .data
                .page_items
                .iter()
                .map(CatalogService::group_and_name)
                .collect(),
        })
    }
}

/// The ids of the namespaces of a namespace list (`public` for the default one, which 2.x lists
/// as the empty id), sorted and without repeats.
pub fn namespace_ids(ns: Namespaces) -> Vec<String> {
    let mut ids: Vec<String> = ns
        .data
        .into_iter()
        .map(|n| namespace_id(&n.namespace))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Reads the body of a successful answer as `T`: the one place Nacos' HTTP JSON is decoded,
/// public so that the fuzz targets feed it exactly what the client does.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(body)
}

/// Why a request failed, or why the client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// The server could not be reached or answered 5xx.
    #[error("Nacos at {server} is unavailable: {message}")]
    Unavailable {
        /// The server.
        server: String,
        /// What happened.
        message: String,
    },
    /// The server refused our credentials (or wants some).
    #[error("Nacos at {server} refused access to {what}: HTTP {status}{}", detail(.message))]
    Unauthorized {
        /// The server.
        server: String,
        /// The request.
        what: String,
        /// 401 or 403.
        status: u16,
        /// What the server said (clipped).
        message: String,
    },
    /// The server does not offer this API (404, or 410 Gone: Nacos 3.x's answer to the 2.x
    /// console API).
    #[error("Nacos at {server} does not serve {what}: HTTP {status}{}", detail(.message))]
    NotServed {
        /// The server.
        server: String,
        /// The request.
        what: String,
        /// 404 or 410.
        status: u16,
        /// What the server said (clipped).
        message: String,
    },
    /// The server answered something we could not use.
    #[error("unexpected answer from Nacos at {server} to {what}: {message}")]
    BadResponse {
        /// The server.
        server: String,
        /// The request.
        what: String,
        /// What was wrong.
        message: String,
    },
    /// A `--nacos-addr` is not usable.
    #[error("--nacos-addr {0:?}: {1}")]
    BadAddress(String, String),
    /// The credentials file could not be read or does not hold `user:password`.
    #[error("--nacos-auth-file {path}: {message}")]
    Credentials {
        /// The file (or the variables' names).
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The TLS files or the HTTP client settings are unusable.
    #[error("{0}")]
    Client(String),
}

fn detail(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(" ({message})")
    }
}

impl From<HttpClientError> for mcp_core::RegistryError {
    fn from(e: HttpClientError) -> Self {
        match e {
            HttpClientError::Unauthorized { .. } => Self::Unauthorized(e.to_string()),
            HttpClientError::BadResponse { .. } => Self::BadResponse(e.to_string()),
            _ => Self::Unavailable(e.to_string()),
        }
    }
}

/// One configured server.
#[derive(Clone, Debug, PartialEq)]
pub struct Server {
    /// `http(s)://host:port` of its HTTP port.
    pub http: String,
    /// `http(s)://host:port` of its gRPC port.
    pub grpc: String,
    /// TLS on both ports.
    pub tls: bool,
    /// The host, for TLS server names.
    pub host: String,
    /// The gRPC port.
    pub grpc_port: u16,
}

/// Parses `host:port`, `http://host:port` or `https://host:port`.
pub fn parse_server(raw: &str, grpc_offset: u16) -> Result<Server, HttpClientError> {
    let bad = |m: &str| HttpClientError::BadAddress(raw.to_string(), m.to_string());
    let with_scheme = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("http://{raw}")
    };
    let url = reqwest::Url::parse(&with_scheme).map_err(|e| bad(&e.to_string()))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(HttpClientError::BadAddress(
            "<with credentials>".into(),
            "credentials in the address are refused (they would show in `ps`); use \
             NACOS_USERNAME/NACOS_PASSWORD or --nacos-auth-file"
                .into(),
        ));
    }
    let tls = match url.scheme() {
        "http" => false,
        "https" => true,
        _ => return Err(bad("not http(s)")),
    };
    // `host_str` keeps an IPv6 address in brackets, as a URL needs it.
    let host_part = url.host_str().ok_or_else(|| bad("no host"))?.to_string();
    let port = url.port_or_known_default().ok_or_else(|| bad("no port"))?;
    let grpc_port = port
        .checked_add(grpc_offset)
        .ok_or_else(|| bad("the gRPC port (HTTP port + offset) is above 65535"))?;
    let scheme = url.scheme();
    let host = host_part
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok(Server {
        http: format!("{scheme}://{host_part}:{port}"),
        grpc: format!("{scheme}://{host_part}:{grpc_port}"),
        tls,
        host,
        grpc_port,
    })
}

impl From<CredentialsError> for HttpClientError {
    fn from(e: CredentialsError) -> Self {
        HttpClientError::Credentials {
            path: e.path,
            message: e.message,
        }
    }
}

/// Nacos credentials: `user:password` from `--nacos-auth-file` (re-read when it changes), else
/// `NACOS_USERNAME` + `NACOS_PASSWORD`.
fn credentials(file: Option<&Path>) -> Result<UserPassword, HttpClientError> {
    Ok(UserPassword::load(
        "--nacos-auth-file",
        file,
        ("NACOS_USERNAME", "NACOS_PASSWORD"),
        "NACOS_USERNAME/NACOS_PASSWORD",
    )?)
}

/// A token and when to log in again.
#[derive(Debug)]
struct Token {
    value: Secret,
    renew_at: Instant,
    /// For which server (a token is only good where it was issued, unless the cluster shares
    /// its secret key).
    server: usize,
}

/// The HTTP side of the client.
#[derive(Debug)]
pub struct HttpClient {
    http: ReloadingClient,
    servers: Vec<Server>,
    current: AtomicUsize,
    creds: UserPassword,
    token: Mutex<Option<Token>>,
    /// The servers (by index) whose login is 3.x's own.
    v3_login: Mutex<Vec<usize>>,
    stats: NacosStats,
}

impl HttpClient {
    /// A client for the configured servers.
    pub fn new(cfg: &NacosConfig, stats: NacosStats) -> Result<Self, HttpClientError> {
        let servers = cfg
            .addrs
            .iter()
            .map(|a| a.trim())
            .filter(|a| !a.is_empty())
            .map(|a| parse_server(a, cfg.grpc_port_offset))
            .collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Err(HttpClientError::BadAddress(
                String::new(),
                "no address given".into(),
            ));
        }
        let mut settings = cfg.tls.settings();
        settings.timeout = Some(cfg.timeout);
        settings.connect_timeout = cfg.timeout.min(Duration::from_secs(5));
        settings.max_idle = 2;
        settings.max_response = cfg.response.max_response_size;
        let http = ReloadingClient::new(settings)
            .map_err(|e: HttpError| HttpClientError::Client(e.to_string()))?;
        Ok(Self {
            http,
            servers,
            current: AtomicUsize::new(0),
            creds: credentials(cfg.auth_file.as_deref())?,
            token: Mutex::new(None),
            v3_login: Mutex::new(Vec::new()),
            stats,
        })
    }

    /// The server in use.
    pub fn server(&self) -> &Server {
        &self.servers[self.current.load(Ordering::Relaxed) % self.servers.len()]
    }

    /// Moves to the next server (after the current one failed a watch).
    pub fn next_server(&self) {
        if self.servers.len() > 1 {
            let next = (self.current.load(Ordering::Relaxed) + 1) % self.servers.len();
            self.current.store(next, Ordering::Relaxed);
            tracing::info!(server = %self.server().http, "Trying the next Nacos server.");
        }
    }

    /// The access token to send now, logging in first when there is none for this server or it
    /// is near its end; none when no credentials are configured.
    pub async fn token(&self) -> Result<Option<Secret>, HttpClientError> {
        let server = self.current.load(Ordering::Relaxed);
        {
            let t = self.token.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(t) = t.as_ref() {
                if t.server == server && Instant::now() < t.renew_at {
                    return Ok(Some(t.value.clone()));
                }
            }
        }
        let Some((user, password)) = self.creds.current()? else {
            return Ok(None);
        };
        let base = &self.server().http;
        let login = self.log_in(server, base, &user, &password).await?;
        // Renew at 80% of the lifetime (Nacos' tokens last 5 hours by default), so a token
        // never expires between a check and the request that carries it.
        let ttl = Duration::from_secs(login.token_ttl.unwrap_or(18_000).max(1));
        let value = Secret::new(login.access_token);
        tracing::info!(
            server = %base,
            user = %user,
            ttl_s = ttl.as_secs(),
            "Logged in to Nacos."
        );
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(Token {
            value: value.clone(),
            renew_at: Instant::now() + ttl.mul_f64(0.8),
            server,
        });
        Ok(Some(value))
    }

    /// Logs in to server `server` (at `base`): with 2.x's login, which 3.x serves too unless
    /// its client API compatibility is off (then `410 Gone`: with 3.x's own login, remembered
    /// for the server).
    async fn log_in(
        &self,
        server: usize,
        base: &str,
        user: &str,
        password: &Secret,
    ) -> Result<Login, HttpClientError> {
        let v3_known = self
            .v3_login
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&server);
        if !v3_known {
            match self.login(base, V2_LOGIN, user, password).await {
                Err(HttpClientError::NotServed { .. }) => {
                    self.v3_login
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(server);
                }
                other => return other,
            }
        }
        self.login(base, V3_LOGIN, user, password).await
    }

    async fn login(
        &self,
        base: &str,
        path: &str,
        user: &str,
        password: &Secret,
    ) -> Result<Login, HttpClientError> {
        self.stats.request("login");
        let resp = self
            .http
            .get()
            .post(format!("{base}{path}"))
            .form(&[("username", user), ("password", password.expose())])
            .send()
            .await
            .map_err(|e| self.unavailable(e))?;
        let what = format!("POST {path}");
        if resp.status().is_server_error() {
            // Nacos 3.0 answers a wrong password with 500 on both its logins (its refusal is
            // not mapped to 403), and a login answered 500 by a healthy server is nothing
            // else: reported as refused, saying so.
            let status = resp.status().as_u16();
            let body = self.http.body(resp).await.unwrap_or_default();
            return Err(HttpClientError::Unauthorized {
                server: self.server().http.clone(),
                what,
                status,
                message: format!(
                    "{}; Nacos 3.0 answers a wrong user or password this way",
                    error_message(&body)
                ),
            });
        }
        self.parse(resp, &what).await
    }

    /// Forgets the token (the server refused it: log in again at the next request).
    pub fn drop_token(&self) {
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The ids of every namespace the server lists through `api` (`public` for the default
    /// one, which 2.x lists as the empty id), sorted.
    pub async fn namespaces(&self, api: ListingApi) -> Result<Vec<String>, HttpClientError> {
        self.stats.request("namespaces");
        let ns: Namespaces = self.get(api.namespaces_path(), &[]).await?;
        Ok(namespace_ids(ns))
    }

    /// Page `page_no` (from 1) of `page_size` of namespace `ns`'s services, every group,
    /// through `api`.
    pub async fn services_page(
        &self,
        api: ListingApi,
        ns: &str,
        page_no: u64,
        page_size: u64,
    ) -> Result<Page, HttpClientError> {
        self.stats.request("catalog");
        let mut query = vec![
            ("namespaceId", ns.to_string()),
            ("pageNo", page_no.to_string()),
            ("pageSize", page_size.to_string()),
            ("withInstances", "false".into()),
        ];
        match api {
            ListingApi::Console => {
                query.push(("hasIpCount", "false".into()));
                let page: CatalogPage = self.get(api.services_path(), &query).await?;
                Ok(Page::console(&page))
            }
            ListingApi::Admin => {
                query.push(("ignoreEmptyService", "false".into()));
                let page: AdminServicePage = self.get(api.services_path(), &query).await?;
                Page::admin(page).map_err(|message| HttpClientError::BadResponse {
                    server: self.server().http.clone(),
                    what: format!("GET {}", api.services_path()),
                    message,
                })
            }
        }
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, HttpClientError> {
        let what = format!("GET {path}");
        let mut resp = self.send_get(path, query).await?;
        if matches!(
            resp.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) && self.creds.current()?.is_some()
        {
            // An expired or revoked token, or one the server has not taken in yet (a login
            // that a Nacos cluster is still replicating): log in again and ask once more.
            self.drop_token();
            tokio::time::sleep(RELOGIN_PAUSE).await;
            resp = self.send_get(path, query).await?;
            if matches!(
                resp.status(),
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
            ) {
                self.drop_token();
            }
        }
        self.parse(resp, &what).await
    }

    async fn send_get(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<reqwest::Response, HttpClientError> {
        let mut query: Vec<(&str, String)> = query.to_vec();
        if let Some(token) = self.token().await? {
            query.push(("accessToken", token.expose().to_string()));
        }
        let base = &self.server().http;
        self.http
            .get()
            .get(format!("{base}{path}"))
            .query(&query)
            .send()
            .await
            .map_err(|e| self.unavailable(e))
    }

    async fn parse<T: DeserializeOwned>(
        &self,
        resp: reqwest::Response,
        what: &str,
    ) -> Result<T, HttpClientError> {
        let server = self.server().http.clone();
        let status = resp.status();
        if matches!(
            status,
            StatusCode::UNAUTHORIZED
                | StatusCode::FORBIDDEN
                | StatusCode::NOT_FOUND
                | StatusCode::GONE
        ) {
            // What the server says: Nacos names the reason (token expired, user not found) or
            // the API that replaces a gone one.
            let body = self.http.body(resp).await.unwrap_or_default();
            let message = error_message(&body);
            let what = what.to_string();
            let status = status.as_u16();
            return Err(if matches!(status, 401 | 403) {
                HttpClientError::Unauthorized {
                    server,
                    what,
                    status,
                    message,
                }
            } else {
                HttpClientError::NotServed {
                    server,
                    what,
                    status,
                    message,
                }
            });
        }
        if status.is_server_error() {
            return Err(HttpClientError::Unavailable {
                server,
                message: format!("{what}: HTTP {status}"),
            });
        }
        let body = self
            .http
            .body(resp)
            .await
            .map_err(|e| HttpClientError::BadResponse {
                server: server.clone(),
                what: what.to_string(),
                message: e.to_string(),
            })?;
        if !status.is_success() {
            return Err(HttpClientError::BadResponse {
                server,
                what: what.to_string(),
                message: format!(
                    "HTTP {status}: {}",
                    mcp_core::clip::clip(&String::from_utf8_lossy(&body), 200)
                ),
            });
        }
        decode(&body).map_err(|e| HttpClientError::BadResponse {
            server,
            what: what.to_string(),
            message: e.to_string(),
        })
    }

    fn unavailable(&self, e: reqwest::Error) -> HttpClientError {
        // Without the URL: its query carries the access token.
        HttpClientError::Unavailable {
            server: self.server().http.clone(),
            message: mcp_core::clip::error_chain(&e.without_url()),
        }
    }
}

/// The message of an error answer: Spring's `message` field when the body is its JSON (Nacos
/// nests its own JSON in it: that one's `message`), else the body; clipped.
pub fn error_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let message = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .map(|m| {
            serde_json::from_str::<serde_json::Value>(&m)
                .ok()
                .and_then(|v| {
                    v.get("message")
                        .and_then(|m| m.as_str())
                        .map(str::to_string)
                })
                .unwrap_or(m)
        })
        .unwrap_or_else(|| text.trim().to_string());
    mcp_core::clip::clip(&message, 200).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_as_nacos_writes_them() {
        let gone = br#"{"timestamp":"2026-11-29T04:20:06.308+00:00","status":410,"error":"Gone","message":"{\"code\":40000,\"message\":\"Current API will be deprecated, please use API(s) `GET ${contextPath:nacos}/v3/console/ns/service/list` instead\"}","path":"/nacos/v1/ns/catalog/services"}"#;
        assert!(
            error_message(gone).starts_with("Current API will be deprecated"),
            "{}",
            error_message(gone)
        );
        let refused = br#"{"status":403,"error":"Forbidden","message":"Code: 401, Message: User not found!"}"#;
        assert_eq!(
            error_message(refused),
            "Code: 401, Message: User not found!"
        );
        assert_eq!(error_message(b"token expired!"), "token expired!");
    }

    #[test]
    fn addresses_with_and_without_scheme() {
        let s = parse_server("10.0.0.1:8848", 1000).expect("plain");
        assert_eq!(s.http, "http://10.0.0.1:8848");
        assert_eq!(s.grpc, "http://10.0.0.1:9848");
        assert!(!s.tls);
        let s = parse_server("https://nacos.example:8443", 1000).expect("tls");
        assert_eq!(
            (s.http.as_str(), s.grpc.as_str(), s.tls, s.host.as_str()),
            (
                "https://nacos.example:8443",
                "https://nacos.example:9443",
                true,
                "nacos.example"
            )
        );
        let s = parse_server("[::1]:8848", 1000).expect("v6");
        assert_eq!(s.grpc, "http://[::1]:9848");
        for bad in ["ftp://a:1", "http://u:p@a:1", "a:65000"] {
            assert!(parse_server(bad, 1000).is_err(), "{bad}");
        }
    }
}
