//! Eureka's read API over HTTP: JSON only, basic auth, failover across the configured servers.
//!
//! A request goes to the current server; when it is unreachable or answers 5xx the next one is
//! tried, in order, and becomes current. After `--failback-after` on a fallback server the first
//! (preferred) one is tried again. Callers see which server answered, because a delta from a
//! different server than the last one is meaningless (each server has its own delta queue).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mcp_runtime::http_client::{BodyError, HttpError, ReloadingClient};
#[cfg(test)]
use mcp_runtime::secret::SecretSource;
use mcp_runtime::secret::{CredentialsError, Secret, UserPassword};
use reqwest::StatusCode;

use crate::config::EurekaConfig;
use crate::dto::Applications;

/// Why a request (to every server) failed, or why the client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No server could be reached or every one answered 5xx.
    #[error("no Eureka server answered ({0})")]
    Unavailable(String),
    /// A server refused our credentials.
    #[error("Eureka at {url} refused access: HTTP {status}")]
    Unauthorized {
        /// The server.
        url: String,
        /// 401 or 403.
        status: u16,
    },
    /// A server answered something we could not use.
    #[error("unexpected answer from Eureka at {url}: {message}")]
    BadResponse {
        /// The server.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// A `--eureka-url` is not usable.
    #[error("--eureka-url {0:?}: {1}")]
    BadUrl(String, String),
    /// A credentials or TLS file could not be read or parsed.
    #[error("{what} {path}: {message}")]
    File {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A TLS file could not be read or parsed.
    #[error("{0}")]
    Tls(String),
    /// reqwest refused the settings.
    #[error("HTTP client: {0}")]
    Build(String),
}

impl From<ClientError> for mcp_core::RegistryError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Unauthorized { .. } => Self::Unauthorized(e.to_string()),
            ClientError::BadResponse { .. } => Self::BadResponse(e.to_string()),
            _ => Self::Unavailable(e.to_string()),
        }
    }
}

/// Basic-auth credentials: `user:password` from `--eureka-auth-file` (re-read when it changes),
/// else `EUREKA_USERNAME` + `EUREKA_PASSWORD`.
#[derive(Debug)]
pub struct Credentials(UserPassword);

const AUTH_FLAG: &str = "--eureka-auth-file";
const AUTH_VARS: &str = "EUREKA_USERNAME/EUREKA_PASSWORD";

impl From<CredentialsError> for ClientError {
    fn from(e: CredentialsError) -> Self {
        ClientError::File {
            what: e.flag,
            path: e.path,
            message: e.message,
        }
    }
}

impl Credentials {
    /// From the file or the environment; none when neither is set. A file that cannot be read
    /// or does not hold `user:password` fails now.
    pub fn load(file: Option<&Path>) -> Result<Self, ClientError> {
        let vars = ("EUREKA_USERNAME", "EUREKA_PASSWORD");
        Ok(Self(UserPassword::load(AUTH_FLAG, file, vars, AUTH_VARS)?))
    }

    /// The user and password to send now.
    pub fn current(&self) -> Result<Option<(String, Secret)>, ClientError> {
        Ok(self.0.current()?)
    }
}

/// Which server is current, and since when.
#[derive(Debug)]
struct Current {
    index: usize,
    since: Instant,
}

/// The Eureka client.
#[derive(Debug)]
pub struct Client {
    http: ReloadingClient,
    /// Base URLs without a trailing slash.
    bases: Vec<String>,
    creds: Credentials,
    current: Mutex<Current>,
    /// How long a fallback server is kept before the preferred one is tried again.
    failback_after: Duration,
}

/// A parsed answer and the index of the server that gave it.
#[derive(Debug)]
pub struct Answer {
    /// The registry or delta.
    pub apps: Applications,
    /// Which `--eureka-url` answered.
    pub server: usize,
}

impl Client {
    /// A client for the configured servers.
    pub fn new(cfg: &EurekaConfig) -> Result<Self, ClientError> {
        let mut bases = Vec::new();
        for raw in cfg.urls.iter().map(|u| u.trim()).filter(|u| !u.is_empty()) {
            let url = reqwest::Url::parse(raw)
                .map_err(|e| ClientError::BadUrl(raw.to_string(), e.to_string()))?;
            if !url.username().is_empty() || url.password().is_some() {
                return Err(ClientError::BadUrl(
                    "<with credentials>".into(),
                    "credentials in the URL are refused (they would show in `ps`); use \
                     EUREKA_USERNAME/EUREKA_PASSWORD or --eureka-auth-file"
                        .into(),
                ));
            }
            if !matches!(url.scheme(), "http" | "https") {
                return Err(ClientError::BadUrl(raw.to_string(), "not http(s)".into()));
            }
            bases.push(raw.trim_end_matches('/').to_string());
        }
        if bases.is_empty() {
            return Err(ClientError::BadUrl(String::new(), "no URL given".into()));
        }
        let mut settings = cfg.tls.settings();
        settings.timeout = Some(cfg.timeout);
        settings.connect_timeout = cfg.timeout.min(Duration::from_secs(5));
        settings.max_idle = 2;
        settings.max_response = cfg.response.max_response_size;
        let http = ReloadingClient::new(settings).map_err(|e| match e {
            HttpError::Build(m) => ClientError::Build(m),
            other => ClientError::Tls(other.to_string()),
        })?;
        Ok(Self {
            http,
            bases,
            creds: Credentials::load(cfg.auth_file.as_deref())?,
            current: Mutex::new(Current {
                index: 0,
                since: Instant::now(),
            }),
            failback_after: cfg.failback_after,
        })
    }

    /// `GET {base}/apps`.
    pub async fn full(&self) -> Result<Answer, ClientError> {
        self.get("/apps").await
    }

    /// `GET {base}/apps/delta`.
    pub async fn delta(&self) -> Result<Answer, ClientError> {
        self.get("/apps/delta").await
    }

    /// The base URL of server `index` (for logs).
    pub fn base(&self, index: usize) -> &str {
        self.bases.get(index).map_or("", String::as_str)
    }

    fn start_index(&self) -> usize {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if cur.index != 0 && cur.since.elapsed() >= self.failback_after {
            cur.index = 0;
            cur.since = Instant::now();
        }
        cur.index
    }

    fn set_current(&self, index: usize) {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if cur.index != index {
            cur.index = index;
            cur.since = Instant::now();
        }
    }

    async fn get(&self, path: &str) -> Result<Answer, ClientError> {
        let start = self.start_index();
        let mut failures = Vec::new();
        for step in 0..self.bases.len() {
            let index = (start + step) % self.bases.len();
            let base = &self.bases[index];
            match self.get_one(base, path).await {
                Ok(apps) => {
                    if index != start {
                        tracing::warn!(server = %base, previous = %self.bases[start], "switched Eureka server");
                    }
                    self.set_current(index);
                    return Ok(Answer {
                        apps,
                        server: index,
                    });
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Next(why)) => {
                    tracing::debug!(server = %base, path, error = %why, "Eureka server failed; trying the next");
                    failures.push(format!("{base}: {why}"));
                }
            }
        }
        Err(ClientError::Unavailable(failures.join("; ")))
    }

    async fn get_one(&self, base: &str, path: &str) -> Result<Applications, Attempt> {
        let url = format!("{base}{path}");
        let mut req = self
            .http
            .get()
            .get(&url)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some((user, password)) = self.creds.current().map_err(Attempt::Fatal)? {
            req = req.basic_auth(user, Some(password.expose()));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Attempt::Next(without_url(e).to_string()))?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(Attempt::Fatal(ClientError::Unauthorized {
                url: base.to_string(),
                status: status.as_u16(),
            }));
        }
        if status.is_server_error() {
            return Err(Attempt::Next(format!("HTTP {status}")));
        }
        if !status.is_success() {
            return Err(Attempt::Fatal(ClientError::BadResponse {
                url: base.to_string(),
                message: format!("{path}: HTTP {status}"),
            }));
        }
        let body = self.http.body(resp).await.map_err(|e| match e {
            // Another server holds the same registry: its answer would be as large.
            BodyError::TooLarge { .. } => Attempt::Fatal(ClientError::BadResponse {
                url: base.to_string(),
                message: e.to_string(),
            }),
            BodyError::Read { .. } => Attempt::Next(e.to_string()),
        })?;
        crate::dto::decode(&body).map_err(|e| {
            Attempt::Fatal(ClientError::BadResponse {
                url: base.to_string(),
                message: format!("{path}: {e}"),
            })
        })
    }
}

/// One server's failure: try the next one, or give up (the answer would not differ).
enum Attempt {
    Next(String),
    Fatal(ClientError),
}

/// reqwest errors print their URL; ours never carry credentials, but keep messages short.
fn without_url(e: reqwest::Error) -> reqwest::Error {
    e.without_url()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::parse as cfg;

    #[test]
    fn credentials_in_urls_are_refused_and_never_printed() {
        let err = Client::new(&cfg(&["--eureka-url", "http://u:secret@a:8761/eureka"]))
            .expect_err("refused");
        assert!(!err.to_string().contains("secret"), "{err}");
        let c = Credentials(
            UserPassword::from_source(
                SecretSource::Fixed(Secret::new("u:secret")),
                AUTH_FLAG,
                AUTH_VARS,
            )
            .expect("credentials"),
        );
        assert!(!format!("{c:?}").contains("secret"));
        let (_, password) = c.current().expect("current").expect("some");
        assert!(!format!("{password:?}").contains("secret"));
    }

    #[test]
    fn auth_file_is_user_colon_password() {
        let dir = std::env::temp_dir().join(format!("eureka-auth-{}", std::process::id()));
        std::fs::write(&dir, "mesh:p@ss:word\n").expect("write");
        let c = Credentials::load(Some(&dir)).expect("load");
        let (user, password) = c.current().expect("current").expect("some");
        assert_eq!((user.as_str(), password.expose()), ("mesh", "p@ss:word"));
        // Rotated: the next request sends the new password.
        std::fs::write(&dir, "mesh:rotated-password-2\n").expect("write");
        let (_, password) = c.current().expect("current").expect("some");
        std::fs::remove_file(&dir).expect("rm");
        assert_eq!(password.expose(), "rotated-password-2");
    }

    #[tokio::test]
    async fn fails_over_in_order_and_reports_every_server() {
        // Two closed loopback ports: both fail, the error names both.
        let dead = |_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr")
        };
        let (a, b) = (dead(0), dead(1));
        let (ua, ub) = (format!("http://{a}/eureka"), format!("http://{b}/eureka/"));
        let client =
            Client::new(&cfg(&["--eureka-url", &ua, "--eureka-url", &ub])).expect("client");
        let err = client.full().await.expect_err("no server");
        let msg = err.to_string();
        assert!(
            msg.contains(&ua) && msg.contains(&format!("http://{b}/eureka")),
            "{msg}"
        );
    }
}
