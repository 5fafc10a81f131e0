//! The certificate and client CAs the next handshake uses, swappable while connections are open.
//!
//! rustls asks the resolver and the verifier once per handshake, so swapping what they hand out
//! changes only new connections: an established one keeps the session it negotiated, and its
//! streams go on.

use std::sync::{Arc, PoisonError, RwLock};

use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::pki_types::{CertificateDer, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

/// What every handshake reads; written only by the reloader.
#[derive(Debug)]
pub struct Live {
    cert: RwLock<Arc<CertifiedKey>>,
    client_ca: RwLock<Option<Arc<dyn ClientCertVerifier>>>,
}

impl Live {
    /// Starts with `cert` and, for mutual TLS, `client_ca`.
    pub fn new(cert: Arc<CertifiedKey>, client_ca: Option<Arc<dyn ClientCertVerifier>>) -> Self {
        Self {
            cert: RwLock::new(cert),
            client_ca: RwLock::new(client_ca),
        }
    }

    /// New handshakes serve `cert` from now on.
    pub fn set_cert(&self, cert: Arc<CertifiedKey>) {
        *self.cert.write().unwrap_or_else(PoisonError::into_inner) = cert;
    }

    /// New handshakes verify client certificates with `verifier` from now on.
    pub fn set_client_ca(&self, verifier: Arc<dyn ClientCertVerifier>) {
        *self
            .client_ca
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(verifier);
    }

    fn verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, Error> {
        self.client_ca
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| Error::General("no client CA configured".into()))
    }
}

/// [`ResolvesServerCert`] over [`Live`].
#[derive(Debug)]
pub struct LiveCert(pub Arc<Live>);

impl ResolvesServerCert for LiveCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .cert
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// [`ClientCertVerifier`] over [`Live`]'s current client CAs.
#[derive(Debug)]
pub struct LiveClientCa(pub Arc<Live>);

impl ClientCertVerifier for LiveClientCa {
    /// No CA names are hinted: the hint would have to borrow from a verifier a reload may
    /// replace. Clients then send the certificate they have (Go's and rustls's send theirs when
    /// the server names no CA; OpenSSL's always does).
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.0
            .verifier()?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0
            .verifier()?
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0
            .verifier()?
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0
            .verifier()
            .map(|v| v.supported_verify_schemes())
            .unwrap_or_default()
    }
}
