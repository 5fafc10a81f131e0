//! Why a request to Consul failed, and what that means for the watch: a refused token is
//! `Unauthorized`, an answer that cannot be read is `BadResponse`, anything else leaves Consul
//! unavailable for now (the last good state is served meanwhile).

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
    /// A blocking query's connection was lost after it was sent and before its answer, not by
    /// its own timeout: something between (a proxy's or load balancer's idle timeout) or the
    /// agent shutting down closed it. Asked again from the same index, this loses nothing
    /// ([`crate::watch`]).
    #[error(
        "consul at {addr}: a blocking query's connection was closed while it waited: {message}"
    )]
    Cut {
        /// Base address.
        addr: String,
        /// What was seen.
        message: String,
    },
    /// Consul's agent refused a connection: more than its `limits.http_max_conns_per_client`
    /// from this address. It answers such a connection with HTTP 429 and closes it, often
    /// before the request is sent, so the client sees a response it did not ask for. Consul
    /// is up: this is not the registry failing.
    #[error("consul at {addr} refused a connection: too many connections from this address (its limits.http_max_conns_per_client; several clients behind one address share it): {message}")]
    Refused {
        /// Base address.
        addr: String,
        /// What was seen.
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
    /// An answer over `--max-response-size` (the message names the URL and the limit).
    #[error("{0}")]
    TooLarge(String),
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
            ConsulError::Decode { .. } | ConsulError::TooLarge(_) => {
                Self::BadResponse(e.to_string())
            }
            _ => Self::Unavailable(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
