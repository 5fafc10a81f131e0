//! `mcpctl health`: is an adapter ready? (And the plain HTTP GET `mcpctl status` shares.) Asked the way Kubernetes asks it, `GET /readyz` on the
//! adapter's admin port, for a container `HEALTHCHECK` (the images are distroless: no curl).
//!
//! Why the admin port's `/readyz` rather than `grpc.health.v1` on the MCP port:
//! - the admin port is plain HTTP whether or not the MCP port has TLS; a gRPC check would need
//!   the CA, and with `--tls-client-ca` a client certificate and its key in every container;
//! - `/readyz` is what the manifests' `readinessProbe` asks, so `docker ps` and `kubectl get pods`
//!   say the same thing (ready once the first sync is done or a state file restored; still ready
//!   through a registry outage, serving the last good state);
//! - it reads a few fields, whatever the size of the served set (`mcpctl get serviceentries`,
//!   the check before, pulled the whole set every 5 s).
//!
//! The request is HTTP/1.0 (the answer has no chunked encoding and ends when the connection
//! closes), the answer is read up to [`MAX_ANSWER`], and the whole exchange is bounded by a
//! timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most bytes of an answer read (`/readyz` answers a line or two).
pub const MAX_ANSWER: u64 = 64 * 1024;

/// What `/readyz` answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// The HTTP status (200 ready, 503 not yet).
    pub status: u16,
    /// The body, a line for people (`ready`, or why not).
    pub body: String,
}

impl Readiness {
    /// Ready: the adapter has a state worth serving.
    pub fn ready(&self) -> bool {
        self.status == 200
    }
}

/// Why the adapter could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// `--admin` is not `HOST:PORT`.
    #[error("--admin {0:?}: expected HOST:PORT (e.g. 127.0.0.1:15052), optionally with http://")]
    Address(String),
    /// Connecting, sending or reading failed.
    #[error("admin port {addr}: {source}")]
    Io {
        /// Where.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No answer within the timeout.
    #[error("admin port {addr}: no answer within {timeout:?}")]
    Timeout {
        /// Where.
        addr: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The answer is not HTTP.
    #[error("admin port {addr}: not an HTTP answer: {first_line:?}")]
    NotHttp {
        /// Where.
        addr: String,
        /// What came back first.
        first_line: String,
    },
}

/// The address to dial for `--admin`: `HOST:PORT` or `http://HOST:PORT`; an unspecified address
/// (`0.0.0.0`, `[::]`, what an adapter in a container listens on) is dialed on loopback, so the
/// adapter's own `MCP_ADMIN_LISTEN` can be given as it is.
pub fn dial_address(admin: &str) -> Result<String, HealthError> {
    let bad = || HealthError::Address(admin.to_string());
    let rest = admin.strip_prefix("http://").unwrap_or(admin);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if let Ok(mut addr) = rest.parse::<SocketAddr>() {
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        return Ok(addr.to_string());
    }
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(rest.to_string())
}

/// `GET /readyz` on `admin` (see [`dial_address`]) within `timeout`.
pub async fn readyz(admin: &str, timeout: Duration) -> Result<Readiness, HealthError> {
    get(admin, "/readyz", MAX_ANSWER, timeout).await
}

/// `GET path` on `admin` (see [`dial_address`]) within `timeout`, reading at most `max` bytes
/// of the answer.
pub async fn get(
    admin: &str,
    path: &str,
    max: u64,
    timeout: Duration,
) -> Result<Readiness, HealthError> {
    let addr = dial_address(admin)?;
    match tokio::time::timeout(timeout, ask(&addr, path, max)).await {
        Ok(result) => result,
        Err(_) => Err(HealthError::Timeout { addr, timeout }),
    }
}

async fn ask(addr: &str, path: &str, max: u64) -> Result<Readiness, HealthError> {
    let io = |source| HealthError::Io {
        addr: addr.to_string(),
        source,
    };
    let mut stream = TcpStream::connect(addr).await.map_err(io)?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: mcpctl\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    let mut answer = Vec::new();
    stream
        .take(max)
        .read_to_end(&mut answer)
        .await
        .map_err(io)?;
    parse(addr, &answer)
}

/// The status and body of an HTTP/1.x answer.
fn parse(addr: &str, answer: &[u8]) -> Result<Readiness, HealthError> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let first_line = head.lines().next().unwrap_or_default();
    let status = first_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| HealthError::NotHttp {
            addr: addr.to_string(),
            first_line: first_line.chars().take(80).collect(),
        })?;
    Ok(Readiness {
        status,
        body: body.trim_end().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses() {
        assert_eq!(
            dial_address("127.0.0.1:15052").ok(),
            Some("127.0.0.1:15052".into())
        );
        assert_eq!(
            dial_address("0.0.0.0:15052").ok(),
            Some("127.0.0.1:15052".into())
        );
        assert_eq!(dial_address("[::]:9000").ok(), Some("[::1]:9000".into()));
        assert_eq!(
            dial_address("http://adapter:15052/").ok(),
            Some("adapter:15052".into())
        );
        for bad in ["15052", "host", "host:port", ":15052", "http://h:1/readyz"] {
            let err = dial_address(bad).expect_err(bad).to_string();
            assert!(err.contains("expected HOST:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn answers() {
        let r = parse(
            "a",
            b"HTTP/1.0 503 Service Unavailable\r\ncontent-length: 9\r\n\r\nnot yet\n",
        )
        .expect("parsed");
        assert_eq!(r.status, 503);
        assert_eq!(r.body, "not yet");
        assert!(!r.ready());
        let err = parse("a", b"SSH-2.0-OpenSSH_9.6\r\n").expect_err("not HTTP");
        assert!(err.to_string().contains("not an HTTP answer"), "{err}");
    }
}
