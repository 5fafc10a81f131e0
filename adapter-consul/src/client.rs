//! The few Consul HTTP endpoints the adapter needs, as blocking queries.
//!
//! Consul's blocking-query rules (api-docs/features/blocking): send the last `X-Consul-Index`
//! with `wait`; a return does not mean a change; an index that goes backwards means reset to 0;
//! never block on index 0. The caller ([`crate::registry`]) applies them; this module only makes
//! the requests and classifies failures.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde::de::DeserializeOwned;

use crate::config::ConsulConfig;
use crate::convert::HealthEntry;

/// Why a request to Consul failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsulError {
    /// Settings cannot be used (bad address, unreadable TLS or token file).
    #[error("consul settings: {0}")]
    Config(String),
    /// Consul could not be reached.
    #[error("consul at {addr} unreachable: {message}")]
    Unreachable {
        /// Base address.
        addr: String,
        /// What failed.
        message: String,
    },
    /// Consul refused the token.
    #[error("consul refused {path} (HTTP 403): the ACL token is missing, unknown or lacks service:read/node:read; consul said: {body}")]
    AccessDenied {
        /// Request path.
        path: String,
        /// Consul's message.
        body: String,
    },
    /// Any other HTTP error.
    #[error("consul answered {path} with HTTP {status}: {body}")]
    Status {
        /// Request path.
        path: String,
        /// HTTP status.
        status: u16,
        /// Consul's message.
        body: String,
    },
    /// The body was not what the API documents.
    #[error("cannot decode consul's answer to {path}: {message}")]
    Decode {
        /// Request path.
        path: String,
        /// Parser message.
        message: String,
    },
}

impl From<ConsulError> for mcp_core::RegistryError {
    fn from(e: ConsulError) -> Self {
        match e {
            ConsulError::AccessDenied { .. } => Self::Unauthorized(e.to_string()),
            ConsulError::Decode { .. } => Self::BadResponse(e.to_string()),
            _ => Self::Unavailable(e.to_string()),
        }
    }
}

/// A blocking-query answer.
#[derive(Debug)]
pub struct Indexed<T> {
    /// `X-Consul-Index`.
    pub index: u64,
    /// The body.
    pub value: T,
}

/// A Consul HTTP API client.
#[derive(Clone, Debug)]
pub struct ConsulClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    datacenter: Option<String>,
    namespace: Option<String>,
    partition: Option<String>,
    wait: Duration,
}

fn read(path: &std::path::Path, what: &str) -> Result<Vec<u8>, ConsulError> {
    std::fs::read(path)
        .map_err(|e| ConsulError::Config(format!("reading {what} {}: {e}", path.display())))
}

impl ConsulClient {
    /// Builds a client; the token comes from `token` (the environment) or the token file.
    pub fn new(cfg: &ConsulConfig, token: Option<String>) -> Result<Self, ConsulError> {
        let mut base = cfg.addr.trim_end_matches('/').to_string();
        if !base.starts_with("http://") && !base.starts_with("https://") {
            base = format!("http://{base}");
        }
        let url = reqwest::Url::parse(&base)
            .map_err(|e| ConsulError::Config(format!("--consul-addr {:?}: {e}", cfg.addr)))?;
        let token = match (&cfg.token_file, token) {
            (Some(f), _) => Some(
                String::from_utf8_lossy(&read(f, "token file")?)
                    .trim()
                    .to_string(),
            ),
            (None, t) => t.filter(|t| !t.is_empty()),
        };
        let wait = cfg.wait.min(Duration::from_secs(600));
        // Consul adds up to wait/16 of jitter; give the answer time to arrive.
        let timeout = wait + wait / 16 + Duration::from_secs(15);
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(usize::MAX);
        if let Some(ca) = &cfg.ca {
            let cert = reqwest::Certificate::from_pem(&read(ca, "CA")?)
                .map_err(|e| ConsulError::Config(format!("CA {}: {e}", ca.display())))?;
            builder = builder.add_root_certificate(cert);
        }
        if let (Some(cert), Some(key)) = (&cfg.client_cert, &cfg.client_key) {
            let mut pem = read(cert, "client certificate")?;
            pem.push(b'\n');
            pem.extend(read(key, "client key")?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                ConsulError::Config(format!("client certificate {}: {e}", cert.display()))
            })?;
            builder = builder.identity(id);
        }
        if let Some(name) = &cfg.tls_server_name {
            // Verify `name` while connecting to the configured address: ask for `name` and
            // resolve it to where the address points.
            let host = url.host_str().unwrap_or_default().to_string();
            let port = url.port_or_known_default().unwrap_or(8501);
            let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| ConsulError::Config(format!("cannot resolve {host}")))?;
            builder = builder.resolve(name, addr);
            let mut u = url.clone();
            u.set_host(Some(name)).map_err(|e| {
                ConsulError::Config(format!("--consul-tls-server-name {name:?}: {e}"))
            })?;
            base = u.as_str().trim_end_matches('/').to_string();
        }
        let http = builder
            .build()
            .map_err(|e| ConsulError::Config(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            base,
            token,
            datacenter: cfg.datacenter.clone(),
            namespace: cfg.consul_namespace.clone(),
            partition: cfg.consul_partition.clone(),
            wait,
        })
    }

    /// Base address (for messages).
    pub fn addr(&self) -> &str {
        &self.base
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        index: Option<u64>,
    ) -> Result<Indexed<T>, ConsulError> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(dc) = &self.datacenter {
            query.push(("dc", dc.clone()));
        }
        if let Some(ns) = &self.namespace {
            query.push(("ns", ns.clone()));
        }
        if let Some(p) = &self.partition {
            query.push(("partition", p.clone()));
        }
        // Never block on index 0 (it would return at once, forever).
        if let Some(i) = index.filter(|i| *i > 0) {
            query.push(("index", i.to_string()));
            query.push(("wait", format!("{}s", self.wait.as_secs().max(1))));
        }
        let mut req = self.http.get(format!("{}{path}", self.base)).query(&query);
        if let Some(t) = &self.token {
            req = req.header("X-Consul-Token", t);
        }
        let resp = req.send().await.map_err(|e| ConsulError::Unreachable {
            addr: self.base.clone(),
            message: error_chain(&e),
        })?;
        let status = resp.status();
        let index = resp
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let body = resp.bytes().await.map_err(|e| ConsulError::Unreachable {
            addr: self.base.clone(),
            message: error_chain(&e),
        })?;
        if status == StatusCode::FORBIDDEN {
            return Err(ConsulError::AccessDenied {
                path: path.to_string(),
                body: String::from_utf8_lossy(&body).trim().to_string(),
            });
        }
        if !status.is_success() {
            return Err(ConsulError::Status {
                path: path.to_string(),
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body).trim().to_string(),
            });
        }
        let value = serde_json::from_slice(&body).map_err(|e| ConsulError::Decode {
            path: path.to_string(),
            message: e.to_string(),
        })?;
        Ok(Indexed { index, value })
    }

    /// `/v1/catalog/services`: service name -> tags.
    pub async fn services(
        &self,
        index: Option<u64>,
    ) -> Result<Indexed<BTreeMap<String, Vec<String>>>, ConsulError> {
        self.get("/v1/catalog/services", index).await
    }

    /// `/v1/health/service/:name`: instances with node and checks.
    pub async fn health(
        &self,
        name: &str,
        index: Option<u64>,
    ) -> Result<Indexed<Vec<HealthEntry>>, ConsulError> {
        let path = format!("/v1/health/service/{}", encode_path(name));
        self.get(&path, index).await
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
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

    #[test]
    fn access_denied_is_an_acl_error() {
        let e: mcp_core::RegistryError = ConsulError::AccessDenied {
            path: "/v1/catalog/services".into(),
            body: "ACL not found".into(),
        }
        .into();
        assert!(matches!(e, mcp_core::RegistryError::Unauthorized(_)));
        assert!(e.to_string().contains("ACL token"));
    }
}
