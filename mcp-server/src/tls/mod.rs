//! TLS on the gRPC port, done by the adapter rather than by tonic so that the certificate, key
//! and client CAs can change on disk (cert-manager renews them; a Kubernetes secret mount swaps
//! its `..data` link) without a restart and without ending open streams, and so that client
//! certificates can be held to `--tls-client-san`.
//!
//! [`Tls::start`] reads the files (an unusable one stops the adapter, naming it), `reload`
//! polls them, [`incoming`] does the handshakes for tonic, and [`authorize`] refuses the requests
//! of a client whose certificate carries no allowed name.

mod authorize;
pub mod cert;
mod incoming;
mod live;
mod reload;
pub mod san;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::metrics::ServerMetrics;
pub use authorize::authorize;
pub use incoming::incoming;
use live::{Live, LiveCert, LiveClientCa};
use san::SanAllowList;

/// How long a client has to finish its handshake before the connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS flags.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    /// `--tls-cert`: PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// `--tls-key`: its PEM private key.
    pub key: PathBuf,
    /// `--tls-client-ca`: CAs client certificates must chain to (then required).
    pub client_ca: Option<PathBuf>,
    /// `--tls-client-san`: names a client certificate must carry one of (empty: any).
    pub client_sans: SanAllowList,
    /// `--tls-reload-interval`: how often the files are looked at for a change.
    pub reload_every: Duration,
}

/// Errors setting TLS up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is unreadable or unusable.
    #[error(transparent)]
    File(#[from] cert::CertError),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] tokio_rustls::rustls::Error),
}

/// The gRPC port's TLS: one per adapter, shared by every shard's port.
pub struct Tls {
    acceptor: TlsAcceptor,
    live: Arc<Live>,
    provider: Arc<CryptoProvider>,
    settings: TlsSettings,
    metrics: ServerMetrics,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads the files and, unless `shutdown` is cancelled, keeps looking at them for changes.
    pub fn start(
        settings: TlsSettings,
        metrics: ServerMetrics,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(ring::default_provider());
        let files = reload::Files::read(&settings);
        let pair = cert::served_pair(
            (&settings.cert, files.cert()?),
            (&settings.key, files.key()?),
            &provider,
        )?;
        let client_ca = match (&settings.client_ca, files.client_ca()?) {
            (Some(path), Some(pem)) => Some(cert::client_verifier(path, pem, &provider)?),
            _ => None,
        };
        metrics.tls_not_after.set(pair.not_after);
        tracing::info!(cert = %settings.cert.display(), serial = %pair.serial, not_after = pair.not_after, client_ca = client_ca.is_some(), client_sans = %settings.client_sans, "TLS certificate loaded.");
        let mutual = client_ca.is_some();
        let live = Arc::new(Live::new(pair.key, client_ca));
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(tokio_rustls::rustls::DEFAULT_VERSIONS)?;
        let builder = if mutual {
            builder.with_client_cert_verifier(Arc::new(LiveClientCa(live.clone())))
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_cert_resolver(Arc::new(LiveCert(live.clone())));
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tls = Arc::new(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            live,
            provider,
            settings,
            metrics,
        });
        tokio::spawn(reload::run(tls.clone(), files, shutdown));
        Ok(tls)
    }

    /// `--tls-client-san`.
    pub fn client_sans(&self) -> &SanAllowList {
        &self.settings.client_sans
    }
}
