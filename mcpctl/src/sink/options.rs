//! What a sink connects to and how: the server URL and its protocol, the type URL generation,
//! TLS and the connect timeout.
//!
//! Kept apart from the transport that acts on them so callers (the CLI, tests) can build and
//! check options without pulling in any gRPC machinery.

use std::path::PathBuf;
use std::time::Duration;

use super::SinkError;

/// Which protocol the server speaks, chosen by the `--server` URL scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `xds://`: MCP-over-xDS, state of the world (Istio 1.8+ `configSources`).
    Xds,
    /// `delta://`: MCP-over-xDS, delta (incremental) ADS.
    Delta,
    /// `mcp://`: legacy `istio.mcp.v1alpha1.ResourceSource` (Istio 1.1-1.7).
    Mcp,
}

/// Which xDS type URL to subscribe to. Istio up to 1.23 asks for v1alpha3, 1.24+ for v1; a
/// server should answer both with the same resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApiVersion {
    /// `networking.istio.io/v1/ServiceEntry`.
    #[default]
    V1,
    /// `networking.istio.io/v1alpha3/ServiceEntry`.
    V1alpha3,
}

impl ApiVersion {
    /// The xDS `type_url` to subscribe to.
    pub fn type_url(self) -> &'static str {
        match self {
            ApiVersion::V1 => "networking.istio.io/v1/ServiceEntry",
            ApiVersion::V1alpha3 => "networking.istio.io/v1alpha3/ServiceEntry",
        }
    }
}

/// TLS settings. Present means TLS is on and the server certificate is verified against `ca`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM CA bundle that must have signed the server certificate.
    pub ca: PathBuf,
    /// Name to verify the server certificate against, when it differs from the host in
    /// `server` (e.g. connecting by IP to a certificate issued for a DNS name).
    pub server_name: Option<String>,
    /// PEM client certificate, for servers that require mutual TLS (needs `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

/// What to connect to and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkOptions {
    /// `xds://HOST:PORT`, `delta://HOST:PORT` or `mcp://HOST:PORT` (no scheme means `xds://`).
    pub server: String,
    /// Type URL generation to subscribe to (xds and delta only).
    pub api_version: ApiVersion,
    /// Ask a legacy MCP server for incremental responses (mcp only).
    pub incremental: bool,
    /// TLS, off when `None`.
    pub tls: Option<TlsOptions>,
    /// How long [`Sink::connect`](super::Sink::connect) keeps retrying until the stream is open.
    pub connect_timeout: Duration,
}

impl SinkOptions {
    /// Options for `server` with defaults: v1, not incremental, plaintext, 10 s to connect.
    pub fn new(server: impl Into<String>) -> Self {
        SinkOptions {
            server: server.into(),
            api_version: ApiVersion::V1,
            incremental: false,
            tls: None,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Splits `server` into the protocol and `HOST:PORT`.
pub fn parse_server(server: &str) -> Result<(Protocol, String), SinkError> {
    let invalid = |reason: &str| SinkError::InvalidServer {
        server: server.to_string(),
        reason: reason.to_string(),
    };
    let (protocol, rest) = match server.split_once("://") {
        Some(("xds", rest)) => (Protocol::Xds, rest),
        Some(("delta", rest)) => (Protocol::Delta, rest),
        Some(("mcp", rest)) => (Protocol::Mcp, rest),
        Some(_) => return Err(invalid("scheme must be xds://, delta:// or mcp://")),
        None => (Protocol::Xds, server),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains('/') {
        return Err(invalid("expected SCHEME://HOST:PORT"));
    }
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !has_port {
        return Err(invalid("expected HOST:PORT with a numeric port"));
    }
    Ok((protocol, authority.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_servers() {
        assert_eq!(
            parse_server("xds://127.0.0.1:15010").unwrap(),
            (Protocol::Xds, "127.0.0.1:15010".to_string())
        );
        assert_eq!(
            parse_server("delta://localhost:1/").unwrap(),
            (Protocol::Delta, "localhost:1".to_string())
        );
        assert_eq!(
            parse_server("mcp://[::1]:9901").unwrap(),
            (Protocol::Mcp, "[::1]:9901".to_string())
        );
        assert_eq!(parse_server("h:2").unwrap().0, Protocol::Xds);
        for bad in [
            "http://h:1",
            "xds://",
            "xds://h",
            "xds://h:port",
            "xds://h:1/x",
        ] {
            let err = parse_server(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
