//! The MCP sink: one subscription to ServiceEntries over one of three protocols.
//!
//! [`Sink::connect`] opens the stream and sends the subscription; [`Sink::next`] waits for one
//! response, applies it to the held state (see [`state`]) and ACKs it, so a test can step
//! through exactly what a server sends. A response holding a resource that cannot be decoded is
//! NACKed (as Istio does) and reported as [`SinkError::Decode`]; the state is left as it was and
//! the stream stays usable.
//!
//! This file ties the parts together and holds what they share: the [`Sink`] and its
//! [`SinkError`]. Each part has its own job and file, so the wire rules of a protocol and the
//! state rules can be read (and tested) apart: `sink/options.rs` (what to connect to and how),
//! `sink/transport.rs` (the gRPC stream of each protocol, connecting, ACK and NACK on the wire)
//! and [`state`] (decoding resources and applying responses to the state).

mod options;
pub mod state;
mod transport;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

pub use options::{parse_server, ApiVersion, Protocol, SinkOptions, TlsOptions};
pub use state::{Applied, Change, DecodeError, Received, Update};
pub use transport::{MCP_COLLECTION, NODE_ID, SINK_NODE_ID};

use transport::{Payload, Stream};

/// Why the sink failed. Messages name the server or resource concerned.
#[derive(thiserror::Error, Debug)]
pub enum SinkError {
    /// `server` is not `SCHEME://HOST:PORT` with a known scheme.
    #[error("invalid server {server:?}: {reason}")]
    InvalidServer {
        /// As given.
        server: String,
        /// What is wrong.
        reason: String,
    },
    /// Options that contradict each other.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// A TLS file could not be read.
    #[error("cannot read {what} {path}: {source}", path = path.display())]
    TlsFile {
        /// Which file (`CA bundle`, `client certificate`, ...).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TLS settings were rejected.
    #[error("invalid TLS configuration: {0}")]
    Tls(String),
    /// No stream could be opened before the connect timeout.
    #[error("server {server} unreachable within {timeout:?}: {last_error}")]
    Unreachable {
        /// As given.
        server: String,
        /// [`SinkOptions::connect_timeout`].
        timeout: Duration,
        /// Why the last attempt failed.
        last_error: String,
    },
    /// The server rejected or broke the stream.
    #[error("stream from {server} failed: {code:?}: {message}")]
    Stream {
        /// As given.
        server: String,
        /// gRPC status code.
        code: tonic::Code,
        /// gRPC status message.
        message: String,
    },
    /// The server ended the stream.
    #[error("server {server} closed the stream")]
    Closed {
        /// As given.
        server: String,
    },
    /// A response held a resource that could not be decoded; it was NACKed.
    #[error("response from {server} rejected: {source}")]
    Decode {
        /// As given.
        server: String,
        /// Which resource and why.
        source: DecodeError,
    },
}

/// A connected MCP sink. Requests go through an unbounded channel so ACKing never awaits, which
/// makes [`Sink::next`] cancel-safe (and so [`Sink::next_within`] never loses a response).
pub struct Sink {
    server: String,
    protocol: Protocol,
    stream: Stream,
    state: BTreeMap<String, Received>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("server", &self.server)
            .field("protocol", &self.protocol)
            .field("resources", &self.state.len())
            .finish()
    }
}

impl Sink {
    /// Connects and subscribes, retrying with backoff until `opts.connect_timeout` so tests can
    /// start the server and the sink at the same time.
    pub async fn connect(opts: SinkOptions) -> Result<Sink, SinkError> {
        let (protocol, authority) = parse_server(&opts.server)?;
        if opts.incremental && protocol != Protocol::Mcp {
            return Err(SinkError::InvalidOptions(format!(
                "incremental applies only to mcp:// servers, not {}",
                opts.server
            )));
        }
        let stream = Stream::connect(&opts, protocol, &authority).await?;
        Ok(Sink {
            server: opts.server,
            protocol,
            stream,
            state: BTreeMap::new(),
        })
    }

    /// The server as given in the options.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The protocol in use.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The state after the last applied response.
    pub fn state(&self) -> &BTreeMap<String, Received> {
        &self.state
    }

    /// Waits for the next response, applies it and ACKs it. Cancel-safe.
    pub async fn next(&mut self) -> Result<Update, SinkError> {
        let (receipt, payload) = self.stream.recv(&self.server).await?;
        let at = SystemTime::now();
        let decoded = match payload {
            Payload::Sotw(resp) => state::change_from_sotw(&resp),
            Payload::Delta(resp) => state::change_from_delta(&resp),
            Payload::Mcp(resp) => state::change_from_mcp(resp),
        };
        match decoded {
            Ok(change) => {
                self.stream.ack(&self.server, &receipt)?;
                let applied = state::apply(&mut self.state, change);
                Ok(Update {
                    at,
                    version_info: receipt.version_info,
                    nonce: receipt.nonce,
                    state: self.state.clone(),
                    upserted: applied.upserted,
                    removed: applied.removed,
                    incremental: receipt.incremental,
                })
            }
            Err(source) => {
                self.stream.nack(&self.server, &receipt, &source)?;
                Err(SinkError::Decode {
                    server: self.server.clone(),
                    source,
                })
            }
        }
    }

    /// Like [`Sink::next`], but gives up after `d` and returns `None` (the stream stays usable).
    pub async fn next_within(&mut self, d: Duration) -> Result<Option<Update>, SinkError> {
        match tokio::time::timeout(d, self.next()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn incremental_only_for_mcp() {
        let mut opts = SinkOptions::new("xds://127.0.0.1:1");
        opts.incremental = true;
        let err = Sink::connect(opts).await.unwrap_err();
        assert!(matches!(err, SinkError::InvalidOptions(_)), "{err}");
    }
}
